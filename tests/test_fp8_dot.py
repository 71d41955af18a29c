"""FP8 tensor-core dot products over an FP8 pool (decode_attention's fp8_dot knob, a device sweep's variant):
q quantised to e4m3 with a scale per query head ("qk"; "kq" the same products as K.q^T, "swap" also p.V as
V^T.p^T), and the softmax weights
p rounded to e4m3 too ("qkpv"),
each checked against a float64 reference doing the same rounding. Off CUDA the kernel runs in Triton's
interpreter (conftest.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

from engine.kernels import decode_attention as da  # noqa: E402
from engine.kv_quant import FP8, quantize  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REPO = Path(__file__).resolve().parent.parent
BLOCK_SIZE, HEADS, KV_HEADS, HEAD_DIM, BLOCK_N = 32, 4, 2, 32, 32
K_SCALE, V_SCALE = 0.5, 2.0


def _e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-448.0, 448.0).to(FP8).double()


def _case(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    blocks = sum(-(-n // BLOCK_SIZE) for n in lengths) + 2
    k = torch.randn(blocks, KV_HEADS, BLOCK_SIZE, HEAD_DIM, generator=g) * 3
    v = torch.randn(blocks, KV_HEADS, BLOCK_SIZE, HEAD_DIM, generator=g)
    kq, vq = quantize(k, K_SCALE), quantize(v, V_SCALE)
    perm = torch.randperm(blocks, generator=g).tolist()
    width = max(-(-n // BLOCK_SIZE) for n in lengths)
    tables = torch.full((len(lengths), width), -1, dtype=torch.int32)
    for b, n in enumerate(lengths):
        for i in range(-(-n // BLOCK_SIZE)):
            tables[b, i] = perm.pop()
    q = torch.randn(len(lengths), HEADS, HEAD_DIM, generator=g) * 2
    return q, kq, vq, tables


def _run(q, kq, vq, tables, lengths, splits, fp8_dot):
    return da.paged_decode(q.to(DEVICE), kq.to(DEVICE), vq.to(DEVICE), tables.to(DEVICE),
                           torch.tensor(lengths, dtype=torch.int32, device=DEVICE), HEAD_DIM ** -0.5, splits,
                           block_n=BLOCK_N, k_scale=K_SCALE, v_scale=V_SCALE, fp8_dot=fp8_dot).cpu().double()


def _reference(q, kq, vq, tables, lengths, splits, fp8_dot):
    """Each split (one tile here) as the kernel computes it, in float64: scores from q's e4m3 values times its
    per-head scale, p = exp(s - the split's max) (rounded to e4m3 for qkpv), then the splits merged."""
    group = HEADS // KV_HEADS
    out = torch.zeros(len(lengths), HEADS, HEAD_DIM, dtype=torch.float64)
    for b, n in enumerate(lengths):
        pos = torch.arange(n)
        blk = tables[b, pos // BLOCK_SIZE].long()
        keys = kq[blk, :, pos % BLOCK_SIZE].double().repeat_interleave(group, dim=1) * K_SCALE  # [n, H, D]
        vals = vq[blk, :, pos % BLOCK_SIZE].double().repeat_interleave(group, dim=1) * V_SCALE
        qs = q[b].double().abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / 448.0
        qq = _e4m3(q[b].double() / qs) * qs
        s = torch.einsum("hd,nhd->hn", qq, keys) * HEAD_DIM ** -0.5
        tiles = -(-n // BLOCK_N)
        per = -(-tiles // splits)
        num = torch.zeros(HEADS, HEAD_DIM, dtype=torch.float64)
        den = torch.zeros(HEADS, dtype=torch.float64)
        m_all = s.max(dim=1).values
        for sp in range(splits):
            lo, hi = sp * per * BLOCK_N, min((sp + 1) * per * BLOCK_N, n)
            if lo >= hi:
                continue
            m = s[:, lo:hi].max(dim=1).values
            p = torch.exp(s[:, lo:hi] - m[:, None])
            pw = _e4m3(p) if fp8_dot == "qkpv" else p
            w = torch.exp(m - m_all)
            num += torch.einsum("hn,nhd->hd", pw, vals[lo:hi]) * w[:, None]
            den += p.sum(dim=1) * w
        out[b] = num / den[:, None]
    return out


@pytest.mark.parametrize("fp8_dot", ["qk", "qkpv", "kq", "swap"])
@pytest.mark.parametrize("splits", [1, 2])
def test_fp8_dot_products_match_a_float_reference_of_the_same_rounding(fp8_dot, splits):
    lengths = [1, 17, 32, 33, 64] if splits == 2 else [1, 17, 32]  # (one tile a split: the reference's grain)
    q, kq, vq, tables = _case(lengths)
    got = _run(q, kq, vq, tables, lengths, splits, fp8_dot)
    want = _reference(q, kq, vq, tables, lengths, splits, fp8_dot)
    assert (got - want).abs().max().item() < 1e-3


def test_each_fp8_dot_rounds_what_it_says_and_stays_near_the_float16_path():
    """q in e4m3 moves the result; p in e4m3 moves it again; neither moves it far (several tiles a split)."""
    lengths = [150, 97]
    q, kq, vq, tables = _case(lengths, seed=1)
    outs = {d: _run(q, kq, vq, tables, lengths, 2, d) for d in da.FP8_DOTS}
    assert not torch.equal(outs["off"], outs["qk"]) and not torch.equal(outs["qk"], outs["qkpv"])
    for d in ("kq", "swap"):  # the same products, the MMA's roles swapped
        assert (outs[d] - outs["qk"]).abs().max().item() < 1e-5
    for d in ("qk", "qkpv", "kq", "swap"):
        assert (outs[d] - outs["off"]).abs().max().item() < 0.15


def test_fp8_dot_is_refused_on_a_model_dtype_pool_and_when_unknown():
    q, kq, vq, tables = _case([5])
    with pytest.raises(ValueError, match="fp8_dot"):
        da.paged_decode(q, kq.float(), vq.float(), tables, torch.tensor([5], dtype=torch.int32), 1.0, 1,
                        fp8_dot="qk")
    with pytest.raises(ValueError, match="fp8_dot"):
        _run(q, kq, vq, tables, [5], 1, "pv")


def test_the_fp8_knobs_are_read_once_from_the_environment():
    code = "from engine.kernels import decode_attention as d; print(d.FP8_KNOBS)"
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("LABKIT_FP8")}
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**env, "LABKIT_FP8_DECODE": "64,8,3", "LABKIT_FP8_DOT": "qkpv"})
    assert res.returncode == 0, res.stderr
    assert eval(res.stdout) == {"block_n": 64, "num_warps": 8, "num_stages": 3, "fp8_dot": "qkpv"}
    for var, bad in (("LABKIT_FP8_DOT", "pv"), ("LABKIT_FP8_DECODE", "64,8")):
        res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                             env={**env, var: bad})
        assert res.returncode != 0 and var in res.stderr
    assert da._fp8_knobs(None, None) == da.FP8_DEFAULTS == {**da.DEFAULTS, "fp8_dot": "off"}
