"""scripts/sampler_bench.py on the CPU (--dry-run: Triton's interpreter, a small vocabulary): every variant must
draw the default's ids, and one that does not is named and fails the run."""
from __future__ import annotations

import json

import pytest

from .helpers import load_script

pytest.importorskip("triton")


def _load():
    return load_script("sampler_bench")


def test_every_variant_draws_the_defaults_ids(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert _load().main(["--dry-run", "--rows", "1", "3", "--variants", "2,1024,4 8,256,4 16,64,2",
                         "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert len(res["variants"]) == 6 and all(v["same_ids"] for v in res["variants"]) and not res["ids_differ"]
    chunks = {v["per_sm"]: v["chunks"] for v in res["variants"] if v["rows"] == 1}
    assert chunks[2] < chunks[8] < chunks[16]  # more programs an SM: more chunks a row


def test_a_variant_that_draws_other_ids_is_named(monkeypatch, capsys):
    from engine.kernels import gumbel_sampler

    real = gumbel_sampler.gumbel_argmax

    def chunk_dependent(logits, temps, seeds, block=1024, num_chunks=None, num_warps=4, noise=None):
        ids = real(logits, temps, seeds, block=block, num_chunks=num_chunks, num_warps=num_warps, noise=noise)
        return ids if block == 1024 else (ids + 1) % logits.shape[1]  # a draw that moves with the chunking

    monkeypatch.setattr(gumbel_sampler, "gumbel_argmax", chunk_dependent)
    assert _load().main(["--dry-run", "--rows", "2", "--variants", "2,1024,4 8,256,4"]) == 1
    captured = capsys.readouterr()
    assert "8,256,4 at 2 rows" in captured.err and " NO " in captured.out


def test_each_noise_is_timed_and_checked_against_its_own_default(tmp_path):
    out = tmp_path / "s.json"
    assert _load().main(["--dry-run", "--rows", "2", "--variants", "2,1024,4 8,256,4", "--noises", "philox", "hash",
                         "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert sorted((v["noise"], v["per_sm"]) for v in res["variants"]) == [("hash", 2), ("hash", 8), ("philox", 2),
                                                                           ("philox", 8)]
    assert all(v["same_ids"] for v in res["variants"])


def test_a_bad_variant_is_refused(capsys):
    assert _load().main(["--dry-run", "--variants", "8,1000,4"]) == 2
    assert "block a power of two" in capsys.readouterr().err
