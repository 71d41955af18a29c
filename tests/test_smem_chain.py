"""scripts/smem_chain.py: batch 1's four GEMVs with their weight tiles copied into shared memory (Gluon) before the
PDL wait. Its arithmetic is checked here by running the kernel's own source in tests/gluon_emulator.py (and on the
device) against persistent_chain's float32 reference; and from its compiled SASS, what makes the design: every
weight asked for before the wait and none through a register, each chunk read only after its copy group landed,
and few enough registers that a successor's programs fit beside."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import load_script, needs_sm90_tools

REPO = Path(__file__).resolve().parent.parent


def _load():
    return load_script("smem_chain")


def test_each_phase_covers_its_rows_and_columns_with_the_engines_grids():
    sc = _load()
    for phase, (n, k, programs) in sc.SHAPES.items():
        m = sc.launch_args(phase)
        assert m["programs"] == programs and m["R"] * programs == n and m["KC"] * sc.CHUNK == k
        assert sc.PHASES[m["PHASE"]] == phase
    assert sc.launch_args("qkv")["programs"] == 256 and sc.launch_args("gu")["programs"] == 192


def test_a_shape_that_does_not_divide_is_refused(monkeypatch):
    sc = _load()
    monkeypatch.setitem(sc.SHAPES, "o", (1000, 2048, 128))
    with pytest.raises(ValueError, match="1000 rows over 128 programs"):
        sc.launch_args("o")
    monkeypatch.setitem(sc.SHAPES, "o", (1024, 2000, 128))
    with pytest.raises(ValueError, match="K 2000 in chunks of 256"):
        sc.launch_args("o")


def test_bad_arguments_and_no_gpu_exit_2(capsys, tmp_path):
    sc = _load()
    assert sc.main(["--rounds", "0", "--out", str(tmp_path / "x.json")]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err
    assert sc.main([]) == 2
    assert "--out is required" in capsys.readouterr().err
    assert sc.main(["--out", str(tmp_path / "x.json")]) == 2  # (this machine has no GPU)
    assert "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_every_weight_is_in_flight_before_the_wait_and_read_after_it_landed():
    needs_sm90_tools()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # (compiled, not interpreted)
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "smem_chain.py"), "--compile-only", "--json"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(res.stdout)
    sc = _load()
    assert list(report) == list(sc.PHASES)
    for phase, r in report.items():
        m = sc.launch_args(phase)
        tiles = 2 if phase == "gu" else 1
        # 16 bytes a copy a thread (4 warps): the whole tile, and all of it asked for before the PDL wait
        copies = tiles * m["R"] * m["K"] // (4 * 32 * 8)
        assert r["async_copies"] == copies and r["copies_before_wait"] == copies, (phase, r)
        assert r["pdl_waits"] == 1 and r["spill_loads"] == 0, (phase, r)
        # chunk c read once at most KC-1-c groups are still in flight: its own has landed
        assert r["group_waits"] == list(range(m["KC"] - 1, -1, -1)), (phase, r)
        # the tile lives in shared memory, not registers: a successor's programs fit beside
        assert tiles * m["R"] * m["K"] * 2 <= r["shared"] < tiles * m["R"] * m["K"] * 2 + 1024, (phase, r)
        assert r["registers"] <= 160, (phase, r)


def test_the_probe_summary_times_each_phase_from_the_previous_launchs_last_end():
    sc = _load()
    programs = {"qkv": 2, "o": 1, "gu": 3, "down": 2}
    layers, maxp = 6, sc.MAX_PROGRAMS.value
    stamps = [0] * (layers * 4 * maxp * 4)

    def base(launch):  # ns; every launch 10 us after the one before
        return launch * 10_000

    def put(launch, p, k, t):
        stamps[(launch * maxp + p) * 4 + k] = t

    for launch in range(layers * 4):
        for p in range(programs[sc.PHASES[launch % 4]]):
            # start p*300 ns apart, the wait passed 2 us in (+p*10), the last chunk 3 us (+p*50), the end 6 us
            # (+p*1,000): the last program ends last
            for k, t in enumerate((p * 300, 2_000 + p * 10, 3_000 + p * 50, 6_000 + p * 1_000)):
                put(launch, p, k, base(launch) + t)
    out = sc.probe_summary(stamps, programs, layers)
    assert list(out) == list(sc.PHASES)
    for f, name in enumerate(sc.PHASES):
        before = sc.PHASES[(f - 1) % 4]
        # the previous launch's last program ended 6 us + 1 us a later program into its 10 us
        prev_end = -10 + 6 + (programs[before] - 1)  # us, relative to this launch's base
        n = programs[name]
        mid = n // 2
        assert out[name]["started"] == pytest.approx(0 - prev_end)
        assert out[name]["started_last"] == pytest.approx((n - 1) * 0.3 - prev_end)
        assert out[name]["past_wait"] == pytest.approx(2 + mid * 0.01 - prev_end)
        assert out[name]["landed_last"] == pytest.approx(3 + (n - 1) * 0.05 - prev_end)
        assert out[name]["ended"] == pytest.approx(6 + mid * 1 - prev_end)
        assert out[name]["ended_last"] == pytest.approx(6 + (n - 1) * 1 - prev_end)


def test_the_probed_kernels_stamp_four_times_and_still_do_not_spill():
    needs_sm90_tools()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import sys, re, json; sys.path.insert(0, 'scripts'); import smem_chain as sc; "
            "from kernel_sass import cubin_sass; "
            "print(json.dumps({p: [len(re.findall('GLOBALTIMER', s)), len(re.findall(r'\\bLDL\\b', s))] "
            "for p in sc.PHASES for s in [cubin_sass(sc.compiled(p, probe=1))[1]]}))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == {p: [4, 0] for p in ("qkv", "o", "gu", "down")}


@pytest.mark.parametrize("pdl, scale", [(1, 1), (2, 2), (0, 1)])
def test_the_chain_run_by_the_emulator_matches_the_float32_reference(monkeypatch, pdl, scale):
    """The Gluon kernel's own source run on the CPU (tests/gluon_emulator.py): two layers at Qwen3-0.6B's shapes
    against persistent_chain's float32 chain with the kernels' rounding points, each program waiting (PDL) before
    it reads what the previous phase wrote, no chunk read before its copy group landed."""
    import torch

    from .gluon_emulator import emulate

    sc = _load()
    pc = load_script("persistent_chain")
    geo = dict(pc.geometry(False), layers=2)
    data = pc.make_data(torch, geo, torch.bfloat16, "cpu")
    em = emulate(sc._smem_gemv, dependent=("in_ptr", "res_ptr"))
    monkeypatch.setattr(sc, "_smem_gemv", em)
    chain = sc.SmemChain(torch, geo, data, "cpu", pdl, scale)
    chain.run()
    assert pc.rel_err(torch, chain.h, pc.reference(torch, geo, data)) < 2e-2
    assert all(p.events == {1: ["wait", "trigger"], 2: ["trigger", "wait"], 0: []}[pdl] for p in em.programs)
