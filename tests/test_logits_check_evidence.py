"""`labkit logits-check compare`'s report says "gpu-measured" only when every collection it judged was measured on
a GPU: one CPU-executed side makes the whole check CPU-executed evidence."""
from __future__ import annotations

import json

import numpy as np
import pytest

from labkit.logits.collect import Collection, write_collection

from .helpers import run_cli

TRUTH = np.array([[4.0, 0, 0, 0]] * 4)


def _col(dtype: str, backend: str, evidence: str) -> Collection:
    rows = [{"index": i, "request_id": "R", "output_index": i, "case": "edge", "context_len": i + 1}
            for i in range(len(TRUTH))]
    return Collection({"kind": "logits-collection", "status": "COLLECTED", "suite": {"name": "edge"},
                       "model_files": {}, "token_path_sha256": "p", "rows": rows, "dtype": dtype, "backend": backend,
                       "evidence": evidence}, {"logits": TRUTH.astype(np.float32)})


@pytest.mark.parametrize("lhs, truth, want", [
    ("gpu-measured", "gpu-measured", "gpu-measured"),
    ("gpu-measured", "cpu-executed", "cpu-executed"),
    ("cpu-executed", "gpu-measured", "cpu-executed"),
])
def test_the_checks_evidence_is_gpu_measured_only_when_every_side_is(tmp_path, capsys, lhs, truth, want):
    write_collection(_col("float32", "engine", lhs), tmp_path / "lhs")
    write_collection(_col("float32", "hf", truth), tmp_path / "truth")
    out = tmp_path / "check.json"
    code, _, err = run_cli(["logits-check", "compare", "--lhs", str(tmp_path / "lhs"), "--rhs", str(tmp_path / "truth"),
                            "--out", str(out)], capsys)
    report = json.loads(out.read_text())
    assert code == 0 and report["verdict"] == "PASS", err
    assert report["evidence"] == want
