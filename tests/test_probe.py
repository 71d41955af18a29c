"""The in-kernel probe (engine/kernels/probe.py, LABKIT_DECODE_PROBE) and scripts/layer_probe.py's reading of it:
regions handed out per launch and pass, the summary's times and SMs, the labels a fused step gives its launches,
the per-layer view; on CUDA, that a probed step's numbers are the unprobed step's and that its stamps keep the
order the PDL chain promises (no program past its wait before the previous kernel's last program ended)."""
from __future__ import annotations

import pytest
import torch

from engine import fused_decode
from engine.context import Context, DecodeMeta, reset_context, set_context
from engine.kernels import decode_layer, probe
from tests.helpers import load_script

CUDA = torch.cuda.is_available()


def _slots(start, loaded, released, inp, summed, end, sm, new_kv=0, v_loaded=0, tiles=0):
    s = [start, loaded, released, inp, new_kv, v_loaded, tiles, summed, end] + [0] * (probe.SLOTS - 9)
    s[probe.SM_SLOT] = sm
    return s


def test_each_launch_gets_its_own_zeroed_region_in_its_pass():
    p = probe.Probe()
    p.begin_pass()
    a = p.region("L0 qkv", 3, torch.device("cpu"))
    b = p.region("L0 attention", 2, torch.device("cpu"))
    p.begin_pass()
    c = p.region("L0 qkv", 3, torch.device("cpu"))
    assert a.numel() == 3 * probe.SLOTS and b.numel() == 2 * probe.SLOTS and not a.any()
    a.fill_(1)
    b.fill_(2)
    c.fill_(3)
    read0 = p.read(0)
    assert [(r.label, r.programs) for r, _ in read0] == [("L0 qkv", 3), ("L0 attention", 2)]
    assert read0[0][1] == [[1] * probe.SLOTS] * 3 and read0[1][1] == [[2] * probe.SLOTS] * 2
    assert [r.label for r, _ in p.read(1)] == ["L0 qkv"] and p.read(1)[0][1][2] == [3] * probe.SLOTS


def test_a_full_buffer_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(probe, "_CAPACITY", 5 * probe.SLOTS)
    p = probe.Probe()
    p.region("a", 4, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="LABKIT_DECODE_PROBE"):
        p.region("b", 2, torch.device("cpu"))


def test_the_summary_gives_each_points_first_median_and_last_from_the_pass_start():
    r0, r1 = probe.Region("L0 qkv", 0, 0, 3), probe.Region("L0 attention", 0, 48, 2)
    regions = [(r0, [_slots(1000, 2000, 3000, 3500, 4000, 5000, 7), _slots(1200, 2100, 3100, 3600, 4100, 5200, 8),
                     _slots(2000, 2500, 3000, 3900, 4200, 6000, 7)]),
               (r1, [_slots(4000, 0, 6500, 7000, 0, 9000, 1, new_kv=7400, tiles=8000), [0] * probe.SLOTS])]
    # (the second attention program never ran: zeros)
    rows = probe.summarize(regions)
    assert rows[0]["label"] == "L0 qkv" and rows[0]["ran"] == 3 and rows[0]["sms"] == 2
    assert rows[0]["start"] == (0.0, 0.2, 1.0) and rows[0]["end"] == (4.0, 4.2, 5.0)
    assert rows[0]["input"] == (2.5, 2.6, 2.9)
    # a point not stamped repeats the one before it: loaded = start, summed = input
    assert rows[1]["ran"] == 1 and rows[1]["loaded"] == (3.0, 3.0, 3.0) and rows[1]["summed"] == (7.0, 7.0, 7.0)
    assert rows[1]["v_loaded"] == (6.4, 6.4, 6.4)  # (not stamped: new_kv's)
    # phases: each program's own durations, the median over the programs (qkv: inputs after the wait 0.5 each)
    assert rows[0]["phases"]["released>input"] == 0.5 and rows[0]["phases"]["input>new_kv"] == 0.0
    assert rows[0]["phases"]["start>loaded"] == 0.9 and rows[0]["phases"]["summed>end"] == 1.1
    assert rows[1]["phases"]["input>new_kv"] == 0.4 and rows[1]["phases"]["v_loaded>tiles"] == 0.6
    with pytest.raises(ValueError, match="no timestamps"):
        probe.summarize([(r0, [[0] * probe.SLOTS])])


def test_off_or_off_cuda_a_launch_gets_its_fallback_and_no_probe(monkeypatch):
    w = torch.zeros(4)
    assert probe.launch_args("x", 4, torch.device("cpu"), w) == (w, 0)
    monkeypatch.setattr(probe, "ENABLED", "1")
    ptr, on = probe.launch_args("x", 4, torch.device("cpu"), w)  # (the interpreter runs no inline asm)
    assert ptr is w and on == 0


def test_a_fused_step_labels_its_launches_by_layer_and_kernel(tiny_model, monkeypatch):
    from tests.test_fused_decode import _prefilled

    llm, dec, _ = _prefilled(tiny_model, "float32")
    model = llm.model_runner.model.model
    labels = []
    real = decode_layer.launch_args
    monkeypatch.setattr(decode_layer, "launch_args", lambda label, *a: (labels.append(label), real(label, *a))[1])
    with torch.inference_mode():
        set_context(Context(dec["slots"][:1], DecodeMeta(1, dec["ctx"][:1], dec["tables"][:1], num_splits=2)))
        fused_decode.forward(model, dec["ids"][:1], dec["pos"][:1])
        reset_context()
    n = len(model.layers)
    assert labels == [f"L{i} {k}" for i in range(n) for k in ("qkv", "attention", "o_proj", "gate_up", "down")]
    llm.exit()


def _row(label, start, end, released=None, programs=4, sms=2):
    released = released if released is not None else start
    return {"label": label, "programs": programs, "ran": programs, "sms": sms,
            "start": (start, start + 0.5, start + 1), "loaded": (start + 1, start + 1, start + 2),
            "released": (released, released, released + 0.2), "input": (end - 2, end - 2, end - 1.5),
            "summed": (end - 1, end - 1, end - 0.5), "end": (end - 0.5, end - 0.2, end),
            "phases": {f"{a}>{b}": 0.1 * i for i, (a, b) in enumerate(zip(probe.POINTS, probe.POINTS[1:]))}}


def test_the_layer_view_measures_each_kernel_from_the_previous_kernels_last_end():
    lp = load_script("layer_probe")
    rows = [_row("L0 qkv", 0, 5), _row("L0 attention", 3, 11, released=5.5), _row("L1 qkv", 9, 16, released=11.4)]
    layers = lp.layer_rows(rows)
    assert sorted(layers) == [0, 1] and [r["kernel"] for r in layers[0]] == ["qkv", "attention"]
    assert layers[0][0]["after"]["end"] == (4.5, 4.8, 5.0)     # the pass's first launch: from its own start
    assert layers[0][1]["after"]["released"] == (0.5, 0.5, 0.7)  # attention: from qkv's last end (5)
    assert layers[0][1]["after"]["start"] == (-2.0, -1.5, -1.0)
    assert layers[1][0]["after"]["released"] == (0.4, 0.4, 0.6)  # the next layer's qkv: from attention's (11)
    chain, end = [], 0.0
    for i, d in enumerate([4, 5, 6, 9, 3]):  # each layer's one kernel ends d after the one before
        chain.append(_row(f"L{i} qkv", end - 1, end + d))
        end += d
    mid = lp.medians(lp.layer_rows(chain))
    # layers 1-3 (the first and last left out): 5, 6 and 9 after the previous end -> median 6
    assert mid[0]["layers"] == 3 and mid[0]["after"]["end"][2] == 6.0
    text = lp.table(mid, "t") + "\n" + lp.phase_table(mid)
    assert all(len(line) <= 80 for line in text.splitlines())
    # start>wait is start>loaded + loaded>released (0.0 + 0.1); then wait>in (released>input) 0.2, ...
    assert lp.phase_table(mid).splitlines()[-1].split()[2:5] == ["0.10", "0.20", "0.30"]


@pytest.mark.skipif(not CUDA, reason="the probe reads the GPU's timer")
def test_a_probed_step_keeps_its_numbers_and_its_stamps_keep_the_chains_order(tiny_model, monkeypatch):
    from tests.test_fused_decode import _prefilled

    llm, dec, pool = _prefilled(tiny_model, "bfloat16")
    runner = llm.model_runner
    model = runner.model.model
    ctx = Context(dec["slots"][:1], DecodeMeta(1, dec["ctx"][:1], dec["tables"][:1], num_splits=2))
    with torch.inference_mode():
        set_context(ctx)
        want = fused_decode.forward(model, dec["ids"][:1], dec["pos"][:1]).clone()
        runner.kv_cache.copy_(pool)
        monkeypatch.setattr(probe, "ENABLED", "1")
        monkeypatch.setattr(probe, "PROBE", probe.Probe())
        got = fused_decode.forward(model, dec["ids"][:1], dec["pos"][:1]).clone()
        torch.cuda.synchronize()
        reset_context()
    assert torch.equal(got, want)
    regions = probe.PROBE.read(probe.PROBE.pass_id)
    assert len(regions) == 5 * len(model.layers)
    prev_end = None
    n_points = len(probe.POINTS)
    for region, slots in regions:
        assert all(s[0] > 0 for s in slots), region.label  # every program ran and stamped
        for s in slots:
            points = [s[0]]
            for v in s[1:n_points]:  # (a point this kernel does not stamp: the one before)
                points.append(v or points[-1])
            assert points == sorted(points), (region.label, s)
        if prev_end is not None:  # PDL: past the wait only once the previous grid has ended
            assert min(s[2] for s in slots) >= prev_end, region.label
        prev_end = max(s[n_points - 1] for s in slots)
    llm.exit()
