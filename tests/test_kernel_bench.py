"""scripts/kernel_bench.py end to end on the CPU (--dry-run: tiny shapes in Triton's interpreter): it checks the
kernels, writes its JSON and Markdown, and its exit code follows its checks."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import load_script

pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "kernel_bench.py"


def _load():
    return load_script("kernel_bench")


def test_dry_run_checks_times_and_reports(tmp_path):
    out = tmp_path / "kb.json"
    assert _load().main(["--dry-run", "--out", str(out)]) == 0
    log = json.loads(out.read_text())
    assert log["passed"] is True and log["dry_run"] is True
    for shape in log["decode"]["shapes"].values():
        names = [r["config"] for r in shape["configs"]]
        assert names[0] == "default" and "layout=token-major" in names
        assert all(r["ok"] and r["ms"] > 0 for r in shape["configs"])
        assert shape["ceilings"]["copy_TBps"] > 0
    methods = log["prefill"]["methods"]
    assert methods["sdpa math (padded)"]["ok"] and methods["triton (ours, paged)"]["ms"] > 0
    table = out.with_suffix(".md").read_text()
    assert "| default |" in table and "Checks: PASS" in table


def test_a_wrong_kernel_fails_the_check(tmp_path, monkeypatch):
    """The exit code is the check's: a decode kernel that drops the last key must make it 1."""
    from engine.kernels import decode_attention

    real = decode_attention.paged_decode

    def short(q, k_cache, v_cache, block_tables, context_lens, *args, **kw):
        return real(q, k_cache, v_cache, block_tables, context_lens - 1, *args, **kw)

    monkeypatch.setattr(decode_attention, "paged_decode", short)
    out = tmp_path / "kb.json"
    assert _load().main(["--dry-run", "--skip-prefill", "--no-sweep", "--out", str(out)]) == 1
    assert "Checks: FAIL" in out.with_suffix(".md").read_text()


def test_the_script_run_as_a_user_runs_it_times_an_fp8_pool(tmp_path):
    """`python scripts/kernel_bench.py --dry-run` in a fresh process (no TRITON_INTERPRET in the environment: it
    failed every launch there, importing triton before --dry-run set the interpreter up), over an e4m3 pool."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "kb-fp8.json"
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--skip-prefill", "--kv-cache-dtype", "fp8",
                          "--out", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    log = json.loads(out.read_text())
    assert log["decode"]["kv_cache_dtype"] == "fp8" and "prefill" not in log
    for shape in log["decode"]["shapes"].values():
        assert all(r["ok"] for r in shape["configs"]), shape["configs"]


def test_fp8_layouts_times_v_keys_contiguous_against_the_default(tmp_path):
    """--fp8-layouts: the default, V keys-contiguous around it (whole-page tiles read unmasked past each context's
    end, where the pool holds other values), the default again; every launch within the check's tolerance."""
    kb = _load()
    out = tmp_path / "kb-layouts.json"
    assert kb.main(["--dry-run", "--skip-prefill", "--kv-cache-dtype", "fp8", "--fp8-layouts", "--out", str(out)]) == 0
    for shape in json.loads(out.read_text())["decode"]["shapes"].values():
        names = [r["config"] for r in shape["configs"]]
        assert names[0] == "default" and names[-1] == "default (again)"
        assert "layout=v-keys-contiguous block_n=32" in names and len(names) == 6
        assert "layout=v-keys-contiguous block_n=32 order=launch" in names
        assert all(r["ok"] for r in shape["configs"]), shape["configs"]
    with pytest.raises(SystemExit):
        kb.main(["--dry-run", "--fp8-layouts", "--out", str(out)])  # an FP8 pool's sweep


def test_decode_ncu_launches_each_pool_and_layout_and_checks_it(monkeypatch, capsys):
    """scripts/decode_ncu.py (the launch ncu profiles): exit 0 for a right kernel, 1 for one that drops a key."""
    ncu = load_script("decode_ncu")
    for pool, layout in (("bf16", "rows"), ("fp8", "rows"), ("fp8", "v-keys-contiguous")):
        assert ncu.main(["--dry-run", "--pool", pool, "--layout", layout]) == 0
        assert f"{pool} pool, {layout}" in capsys.readouterr().out
    from engine.kernels import decode_attention

    real = decode_attention.paged_decode
    monkeypatch.setattr(decode_attention, "paged_decode",
                        lambda q, k, v, t, lens, *a, **kw: real(q, k, v, t, lens - 1, *a, **kw))
    assert ncu.main(["--dry-run", "--layout", "v-keys-contiguous"]) == 1


def test_configs_times_only_the_named_launches(tmp_path, capsys):
    kb = _load()
    out = tmp_path / "kb-order.json"
    assert kb.main(["--dry-run", "--skip-prefill", "--configs", '[{"order": "launch"}, {"splits": 2}]',
                    "--out", str(out)]) == 0
    for shape in json.loads(out.read_text())["decode"]["shapes"].values():
        assert [r["config"] for r in shape["configs"]] == ["default", "order=launch", "splits=2",
                                                          "default (again)"]
        assert all(r["ok"] for r in shape["configs"])
    for bad in ('{"order": 1}', '[{"depth": 3}]', "not json", '[{"order": "shortest-first"}]'):
        with pytest.raises(SystemExit):
            kb.main(["--dry-run", "--configs", bad, "--out", str(out)])
        assert "--configs" in capsys.readouterr().err


@pytest.mark.parametrize("engine_order", ["longest-first", "launch"])
def test_the_default_row_launches_in_the_engines_order(tmp_path, monkeypatch, engine_order):
    """"default" is the launch the engine makes: the rows in LABKIT_DECODE_ORDER's order (longest-first unless
    set), so a row named order=... is the other one, and the JSON says which the default was."""
    kb = _load()
    from engine import decode_order
    from engine.kernels import decode_attention

    monkeypatch.setattr(decode_order, "DECODE_ORDER", engine_order)
    real, seen = decode_attention.paged_decode, []

    def spy(*a, **kw):
        seen.append(kw.get("order"))
        return real(*a, **kw)

    monkeypatch.setattr(decode_attention, "paged_decode", spy)
    out = tmp_path / "kb.json"
    assert kb.main(["--dry-run", "--skip-prefill", "--no-sweep", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["decode"]["order"] == engine_order
    assert seen and all((o is not None) == (engine_order == "longest-first") for o in seen)
