"""scripts/small_kernel_bench.py (what is left of gpu_check.py: our GEMV and q/k norm+RoPE kernels against what
they replace) end to end on the CPU (--dry-run: Triton's interpreter); its exit code follows its checks."""
from __future__ import annotations

import json

import pytest

from .helpers import load_script

pytest.importorskip("triton")

def _load():
    return load_script("small_kernel_bench")


def test_dry_run_checks_and_reports(tmp_path):
    out = tmp_path / "sk.json"
    assert _load().main(["--dry-run", "--out", str(out)]) == 0
    log = json.loads(out.read_text())
    assert log["passed"] is True and log["dry_run"] is True
    shapes = {(r["shape"], r["M"]) for r in log["gemm"]["rows"]}
    assert shapes == {("o_proj", 1), ("o_proj", 3), ("lm_head", 1)}
    assert all(r["ok"] and r["ours_us"] > 0 and r["cublas_us"] > 0 for r in log["gemm"]["rows"])
    assert all(r["ok"] and r["equal_frac"] > 0 for r in log["qk"]["rows"])
    assert "Checks: PASS" in out.with_suffix(".md").read_text()


def test_a_wrong_gemm_fails_the_check(tmp_path, monkeypatch):
    from engine.kernels import small_gemm

    real = small_gemm.small_matmul
    monkeypatch.setattr(small_gemm, "small_matmul", lambda x, w, *a, **kw: real(x, w, *a, **kw) * 1.01)
    assert _load().main(["--dry-run", "--out", str(tmp_path / "sk.json")]) == 1
