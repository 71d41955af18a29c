"""scripts/persistent_chain.py (batch 1's four GEMVs a layer, one kernel a phase against one persistent kernel) on
the CPU (--dry-run: Triton's interpreter): both launch forms checked against a float32 reference of the chain,
the persistent kernel as one program (its phases in order, its count of arrivals); a wrong phase fails the check."""
from __future__ import annotations

import json

import pytest

from .helpers import load_script

pytest.importorskip("triton")


def test_dry_run_checks_both_launch_forms(tmp_path):
    mod = load_script("persistent_chain")
    out = tmp_path / "c.json"
    assert mod.main(["--dry-run", "--out", str(out)]) == 0
    log = json.loads(out.read_text())
    sep, persist = log["variants"]
    assert sep["mode"] == "sep" and persist["mode"] == "persist" and persist["ahead"] == 7
    assert sep["ok"] and sep["rel_err"] < 1e-4 and persist["ok"] and persist["rel_err"] < 1e-4
    # two layers of four phases, one program: eight arrivals; the same arithmetic as sep's, bit for bit
    assert persist["count"] == 8 and persist["count_ok"] and persist["bit_equal_sep"] is True
    assert persist["flag"] == 0
    assert "| persist_a7_p1 |" in out.with_suffix(".md").read_text()


def _mutated(tmp_path, old: str, new: str):
    """The script with one line changed, imported from a copy."""
    import importlib.util
    import sys
    from pathlib import Path

    src = (Path(__file__).resolve().parent.parent / "scripts" / "persistent_chain.py").read_text()
    assert src.count(old) == 1, old
    path = tmp_path / "persistent_chain_mutant.py"
    path.write_text(src.replace(old, new))
    spec = importlib.util.spec_from_file_location("persistent_chain_mutant", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("old, new, bad", [
    # o_proj without the residual: both launch forms wrong
    ("tl.store(out_ptr + rows, tl.load(h_ptr + rows, cache_modifier=\".cg\") + y)\n\n\n@triton.jit\ndef _gu_part",
     "tl.store(out_ptr + rows, y)\n\n\n@triton.jit\ndef _gu_part", {"sep", "persist_a7_p1"}),
    # the persistent loop reading layer 0's o weights in every layer: only it is wrong
    ("w2 = _tile(wo_ptr + lay * H * Q, pid * R_O, R_O, Q, live)\n            if lay > 0",
     "w2 = _tile(wo_ptr, pid * R_O, R_O, Q, live)\n            if lay > 0", {"persist_a7_p1"}),
    # the persistent loop waiting for one phase too few (a barrier that never stops anyone): its count is wrong
    ("_arrive(cnt_ptr)\n            _stamp(probe_ptr, slot + 7, PROBE)", "_stamp(probe_ptr, slot + 7, PROBE)",
     {"persist_a7_p1"}),
])
def test_a_wrong_phase_fails_the_check(tmp_path, old, new, bad):
    mod = _mutated(tmp_path, old, new)
    out = tmp_path / "c.json"
    assert mod.main(["--dry-run", "--out", str(out)]) == 1
    log = json.loads(out.read_text())
    assert {v["name"] for v in log["variants"] if not v["ok"]} == bad


def test_probe_summary_reads_work_barrier_and_span():
    """Synthetic stamps (2 programs, 6 layers; ns): each phase's work is pass -> arrive, its barrier the last
    arrive -> the next phase's passes, its span the previous phase's last arrive -> its own."""
    mod = load_script("persistent_chain")
    programs, layers = 2, 6
    stamps = [0] * (programs * layers * 8)
    t = 0
    for lay in range(layers):
        for f in range(4):
            for p in range(programs):
                # program 1 passes 100 ns later and works 1000 ns longer than program 0
                passed = t + 100 * p
                stamps[(p * layers + lay) * 8 + 2 * f] = passed
                stamps[(p * layers + lay) * 8 + 2 * f + 1] = passed + 2000 + 1000 * p
            t += 4000  # the next phase's passes: 900 and 1000 ns after this one's last arrive
    s = mod.probe_summary(stamps, programs, layers)
    assert set(s) == {"qkv", "o", "gu", "down"}
    for ph in s.values():
        # the work's median averages the two programs; the passes' median is the upper of two, as their last
        assert ph["work"] == pytest.approx(2.5) and ph["work_slowest"] == pytest.approx(3.0)
        assert ph["opened_median"] == pytest.approx(1.0) and ph["opened_last"] == pytest.approx(1.0)
        assert ph["span"] == pytest.approx(4.0)
