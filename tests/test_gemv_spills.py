"""scripts/gemv_spills.py: the fused decode GEMV as the engine launches it, compiled for sm_90 here (no GPU), must
not spill. Session 15 moved one load in the kernel and the 16-row tiles spilled: batch 4 decoded 14x slower on the
H200, and no CPU test noticed (docs/perf.md, session 16)."""
from __future__ import annotations

import json

from .helpers import load_script, needs_sm90_tools


def _load():
    return load_script("gemv_spills")


def test_the_layer_gemvs_have_the_engines_shapes_and_splits():
    gs = _load()
    launches = {g["name"]: g for g in gs.layer_gemvs(gs.QWEN3_06B, 16)}
    assert [n for n in launches] == ["q/k/v", "o_proj", "gate/up", "down_proj", "o+merge"]
    # o_proj merging attention's parts: o_proj's shape, split and output, its input attention's split parts
    merged = launches["o+merge"]
    assert {k: merged[k] for k in ("N", "K", "split", "partials_out")} == \
        {k: launches["o_proj"][k] for k in ("N", "K", "split", "partials_out")}
    assert merged["attn"][0] > 1 and merged["attn"][1] == 128
    assert (launches["q/k/v"]["N"], launches["q/k/v"]["K"]) == (4096, 1024)
    assert (launches["gate/up"]["N"], launches["down_proj"]["K"]) == (3072, 3072)
    # what reaches q/k/v and gate/up is the split GEMV before them: its partials
    assert launches["q/k/v"]["s_in"] == launches["down_proj"]["split"] > 1
    assert launches["gate/up"]["s_in"] == launches["o_proj"]["split"] > 1


def test_bad_rows_or_config_are_refused(capsys, tmp_path):
    gs = _load()
    assert gs.main(["--rows", "0 17"]) == 2
    assert "--rows takes batch sizes 1-16" in capsys.readouterr().err
    (tmp_path / "c.json").write_text("{}")
    assert gs.main(["--config", str(tmp_path / "c.json")]) == 2
    assert "KeyError" in capsys.readouterr().err


def test_no_gemv_of_a_layer_spills_at_one_or_sixteen_rows(capsys):
    needs_sm90_tools()
    gs = _load()
    rc = gs.main(["--json"])
    out = json.loads(capsys.readouterr().out)
    assert [(g["gemv"], g["rows"]) for g in out["gemvs"]] == [
        (n, r) for r in (1, 16) for n in ("q/k/v", "o_proj", "gate/up", "down_proj", "o+merge", "attention")]
    assert rc == 0 and out["ok"], out["gemvs"]
    by = {(g["gemv"], g["rows"]): g for g in out["gemvs"]}
    # the launch's programs (grid) and what an SM holds: q/k/v 4096 rows / 16 a program; gate/up's one-row tile
    # holds both 16 x 1024 weight tiles in registers (the most a thread has), two programs an SM
    assert by[("q/k/v", 1)]["programs"] == 256 and by[("down_proj", 1)]["programs"] == 64 * 3
    assert all(1 <= g["per_sm"] <= 32 and 0 < g["registers"] <= 255 for g in out["gemvs"])
    assert by[("gate/up", 1)]["per_sm"] < by[("o_proj", 1)]["per_sm"]
    # attention as launched: one row's 8 KV heads in the short-context graph's 4 splits, sixteen rows' in one; its
    # K/V tiles loaded 16 bytes at a time (compiled without the launch's alignments it spills: session 31)
    assert by[("attention", 1)]["programs"] == 8 * 4 and by[("attention", 16)]["programs"] == 16 * 8
    assert all(by[("attention", r)]["loads"] < 64 and by[("attention", r)]["registers"] > 64 for r in (1, 16))


def test_a_sixteen_row_tile_over_its_whole_k_range_spills_and_is_named(capsys, monkeypatch):
    """The check sees a spilling launch: K in one range at 16 rows (LABKIT_DECODE_K_CHUNK=0) spills in the
    q/k/v and gate/up tiles."""
    needs_sm90_tools()
    monkeypatch.setenv("LABKIT_DECODE_K_CHUNK", "0")
    gs = _load()
    assert gs.main(["--rows", "16"]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("SPILLS: ") and "gate/up at 16 rows" in last
