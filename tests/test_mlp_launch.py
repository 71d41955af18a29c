"""LABKIT_DECODE_MLP=one: a decode layer's MLP (gate/up, then down) in one launch whose down programs wait on
counts of the gate/up tiles done (engine/kernels/decode_layer.py: mlp, _mlp_kernel), against the two launches it
replaces. The same programs run either way, so the numbers are the same bit for bit; the counts are left zero
for the next launch. On a CPU the kernel runs in Triton's interpreter, one program after another in launch order
(gate/up's first, as the GPU dispatches them)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")

from engine import fused_decode  # noqa: E402
from engine.context import Context, DecodeMeta, reset_context, set_context  # noqa: E402
from engine.kernels import decode_layer  # noqa: E402
from engine.kernels.decode_layer import gemv, mlp, mlp_counts, mlp_in_one_launch  # noqa: E402

from .test_fused_decode import DEVICE, HALF, _launches, _prefilled, _rand  # noqa: E402


def _two_launches(w_gu, w_d, parts, res, nw, split):
    h, r = gemv(w_gu, partials=parts, residual=res, norm_weight=nw, eps=1e-6, silu=True)
    return gemv(w_d, x=h, split=split), r


# (1 row; 3 rows one at a time, LABKIT_DECODE_FMA_ROWS; 6 rows on the tensor-core tile. I = 256 in splits of
# 256, 128 or 64 rows of h: 1, 2 or 4 counts, each of 16, 8 or 4 gate/up tiles)
@pytest.mark.parametrize("M", [1, 3, 6])
@pytest.mark.parametrize("split", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, HALF])
@pytest.mark.parametrize("down_rows", [16, 32])
def test_one_launch_mlp_is_the_two_launches_bit_for_bit(monkeypatch, M, split, dtype, down_rows):
    """(LABKIT_DECODE_MLP_DOWN_ROWS 32: down's programs own twice the rows, its sums equal up to float32 order on
    a GPU; the interpreter's sums come out the same.)"""
    monkeypatch.setattr(decode_layer, "MLP_LAUNCHES", "one")
    monkeypatch.setattr(decode_layer, "MLP_DOWN_ROWS", down_rows)
    H, I, S = 96, 256, 3
    w_gu = _rand(2 * I, H, scale=H ** -0.5, dtype=dtype, seed=1)
    w_d = _rand(H, I, scale=I ** -0.5, dtype=dtype, seed=2)
    parts = _rand(S, M, H, seed=3)
    res = _rand(M, H, dtype=dtype, seed=4)
    nw = _rand(H, dtype=dtype, seed=5) + 1
    assert mlp_in_one_launch(I, H, split)
    counts = mlp_counts(torch.device(DEVICE))
    want, want_res = _two_launches(w_gu, w_d, parts, res, nw, split)
    for _ in range(2):  # (twice: the counts the first launch leaves must serve the second)
        got, got_res = mlp(w_gu, w_d, partials=parts, residual=res, norm_weight=nw, eps=1e-6, split=split,
                           counts=counts)
        assert got.shape == want.shape and torch.equal(got_res, want_res)
        if down_rows == 16 or DEVICE == "cpu":
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
        assert not counts.any(), counts  # every count reset by its range's last reader; no program gave up


def test_one_launch_is_taken_only_where_down_splits_into_whole_gate_up_tiles(monkeypatch):
    monkeypatch.setattr(decode_layer, "MLP_LAUNCHES", "one")
    assert mlp_in_one_launch(3072, 1024, 3)          # Qwen3-0.6B: 1024 rows of h a split, 64 gate/up tiles
    assert not mlp_in_one_launch(96, 64, 1)          # 96: not a power of two (down's K range is masked)
    assert not mlp_in_one_launch(3072, 1024, 2)      # 1536 a split
    assert not mlp_in_one_launch(64 * 32, 64, 32)    # more splits than counts
    monkeypatch.setattr(decode_layer, "MLP_LAUNCHES", "two")
    assert not mlp_in_one_launch(3072, 1024, 3)      # the default: two launches


@pytest.mark.parametrize("rows", [1, 3])
def test_a_fused_decode_step_with_one_launch_mlp_is_the_same_step(tiny_model, rows, monkeypatch):
    """The tiny model's decode step through the five fused kernels, its MLP in one launch or two: the same
    hidden states bit for bit (rows one at a time included), one launch fewer a layer."""
    llm, dec, pool = _prefilled(tiny_model, "float32")
    runner = llm.model_runner
    model = runner.model.model
    inter = model.layers[0].mlp.down_proj.weight.shape[1]
    hidden = model.layers[0].mlp.down_proj.weight.shape[0]
    launches = _launches(monkeypatch, "_mlp_kernel")

    def step(mode):
        monkeypatch.setattr(decode_layer, "MLP_LAUNCHES", mode)
        d = {k: v[:rows] for k, v in dec.items()}
        runner.kv_cache.copy_(pool)
        with torch.inference_mode():
            set_context(Context(d["slots"], DecodeMeta(rows, d["ctx"], d["tables"], num_splits=1)))
            out = fused_decode.forward(model, d["ids"], d["pos"]).clone()
            reset_context()
        return out
    two = step("two")
    assert not launches
    one = step("one")
    sms = 132 if DEVICE == "cpu" else torch.cuda.get_device_properties(0).multi_processor_count
    assert mlp_in_one_launch(inter, hidden, decode_layer.split_for(hidden, inter, sms)), (inter, hidden)
    assert len(launches) == len(model.layers) and torch.equal(one, two)
    assert not model._mlp_counts.any()
    llm.exit()


def test_a_down_program_whose_producers_never_came_raises_the_flag(monkeypatch):
    """A count that cannot reach its target (set far below zero before the launch, as if gate/up's tiles were never
    counted): each waiting down program gives up after its reads and says so in the counts' last slot, rather
    than hang; the other split's programs wait as usual."""
    monkeypatch.setattr(decode_layer, "MLP_LAUNCHES", "one")
    H, I, M, split = 64, 256, 1, 2
    w_gu = _rand(2 * I, H, scale=H ** -0.5, seed=1)
    w_d = _rand(H, I, scale=I ** -0.5, seed=2)
    parts, res, nw = _rand(2, M, H, seed=3), _rand(M, H, seed=4), _rand(H, seed=5) + 1
    counts = mlp_counts(torch.device(DEVICE))
    counts[1] = -1000
    mlp(w_gu, w_d, partials=parts, residual=res, norm_weight=nw, eps=1e-6, split=split, counts=counts)
    assert counts[-1].item() == 1 and not counts[:-1].any(), counts
    counts.zero_()
    mlp(w_gu, w_d, partials=parts, residual=res, norm_weight=nw, eps=1e-6, split=split, counts=counts)
    assert not counts.any()


def test_a_bad_mlp_knob_is_refused_with_its_name():
    env = {**os.environ, "LABKIT_DECODE_MLP": "three"}
    res = subprocess.run([sys.executable, "-c", "import engine.kernels.decode_layer"], env=env,
                         capture_output=True, text=True)
    assert res.returncode != 0 and "LABKIT_DECODE_MLP" in res.stderr
