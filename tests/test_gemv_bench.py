"""scripts/gemv_bench.py (batch 1's weight stream kernel by kernel) on the CPU (--dry-run: Triton's interpreter):
every launch is the engine's and is checked against a float32 reference; the exit code follows the checks."""
from __future__ import annotations

import json

import pytest

from .helpers import load_script

pytest.importorskip("triton")


def _load():
    return load_script("gemv_bench")


def test_dry_run_checks_every_stream_the_layer_and_the_sweep(tmp_path):
    out = tmp_path / "g.json"
    assert _load().main(["--dry-run", "--sweep", "--out", str(out)]) == 0
    log = json.loads(out.read_text())
    assert [s["projections"] for s in log["streams"]] == [["qkv"], ["o_proj"], ["gate_up"], ["down"]]
    assert log["layer"]["projections"] == ["qkv", "o_proj", "gate_up", "down"] and log["layer"]["launches"] == 8
    assert log["sweep"] and {r["rows"] for r in log["sweep"]} == {16, 32}
    # the layer's chain under the other PDL modes (the default's is "layer"; on the CPU PDL is off)
    chains = [r for r in log["sweep"] if len(r["projections"]) == 4]
    assert [r["pdl"] for r in chains] == ["first", "early"] and all(r["launches"] == 8 for r in chains)
    for r in log["streams"] + [log["layer"]] + log["sweep"]:
        assert r["ok"] and max(r["rel_err"].values()) < 1e-4 and r["us_per_launch"] > 0, r
    # o_proj and down hand partials on (the engine's split), the norm-GEMVs read them
    assert set(log["layer"]["splits"]) == {"qkv", "o_proj", "gate_up", "down"}
    assert log["layer"]["splits"]["qkv"] is None and log["layer"]["splits"]["down"] >= 1
    md = out.with_suffix(".md").read_text()
    assert "| qkv + o_proj + gate_up + down |" in md and "A layer's four GEMVs chained" in md


@pytest.mark.parametrize("planted", ["residual", "norm", "silu"])
def test_a_wrong_launch_fails_the_check(tmp_path, monkeypatch, planted):
    """A GEMV that leaves out the residual, the norm weight or the SiLU (launched as the engine launches it
    otherwise) is a failed check and exit 1."""
    from engine.kernels import decode_layer

    real = decode_layer.gemv

    def wrong(w, **kw):
        if planted == "residual" and kw.get("residual") is not None:
            kw["residual"] = kw["residual"] * 0
        if planted == "norm" and kw.get("norm_weight") is not None:
            kw["norm_weight"] = kw["norm_weight"] * 0 + 1
        if planted == "silu" and kw.get("silu"):
            y, r = real(w[: w.shape[0] // 2].contiguous().repeat(2, 1), **kw)   # gate for up as well
            return y, r
        return real(w, **kw)

    monkeypatch.setattr(decode_layer, "gemv", wrong)
    out = tmp_path / "g.json"
    assert _load().main(["--dry-run", "--out", str(out)]) == 1
    log = json.loads(out.read_text())
    bad = {p for r in log["streams"] if not r["ok"] for p in r["projections"]}
    assert bad == ({"gate_up"} if planted == "silu" else {"qkv", "gate_up"})


def test_prologue_streams_are_checked_and_left_out_of_the_layer_sum(tmp_path):
    """--prologue: q/k/v and gate/up from one row, with and without the norm, each checked against its own
    float32 arithmetic; the layer's sum of streams stays the engine's four."""
    out = tmp_path / "g.json"
    assert _load().main(["--dry-run", "--prologue", "--out", str(out)]) == 0
    log = json.loads(out.read_text())
    names = [s["projections"][0] for s in log["streams"]]
    assert names == ["qkv", "o_proj", "gate_up", "down", "qkv:x", "qkv:xn", "gate_up:x", "gate_up:xn"]
    assert all(s["ok"] and s["rel_err"][s["projections"][0]] < 1e-4 for s in log["streams"])
    four = sum(s["us_per_launch"] for s in log["streams"][:4])
    assert log["layer"]["sum_of_streams_us"] == pytest.approx(four)


def test_a_prologue_stream_that_keeps_the_norm_fails_its_check(tmp_path, monkeypatch):
    """":x" means no norm: a launch given the norm anyway is a failed check (the reference is not the launch's)."""
    from engine.kernels import decode_layer

    real = decode_layer.gemv
    nw = {}

    def wrong(w, **kw):
        if kw.get("norm_weight") is not None:
            nw[w.shape[1]] = kw["norm_weight"]
        elif kw.get("x") is not None and kw.get("split") is None and w.shape[1] in nw:
            kw["norm_weight"] = nw[w.shape[1]]
        return real(w, **kw)

    monkeypatch.setattr(decode_layer, "gemv", wrong)
    out = tmp_path / "g.json"
    assert _load().main(["--dry-run", "--prologue", "--out", str(out)]) == 1
    log = json.loads(out.read_text())
    assert {s["projections"][0] for s in log["streams"] if not s["ok"]} == {"qkv:x", "gate_up:x"}
