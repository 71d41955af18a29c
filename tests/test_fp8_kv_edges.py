"""FP8 KV at its edges (engine/kv_quant.py): vLLM's other name for the format gives the same pool, and over an
FP8 pool a 16-bit model's attention weights are float16 (as the Triton kernels compute them), which a float
reference tells apart from bfloat16 on a softmax of exactly 1/3 and 2/3."""
from __future__ import annotations

import math

import pytest
import torch

from engine import LLM
from engine.backends import torch_ref
from engine.context import DecodeMeta
from engine.kv_quant import FP8

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_fp8_e4m3_is_the_fp8_pool_under_vllms_other_name(tiny_model):
    got = {}
    for kv in ("fp8", "fp8_e4m3", "auto"):
        llm = LLM(tiny_model, device="cpu", enforce_eager=True, kv_cache_dtype=kv, kvcache_memory_bytes=1 << 20)
        got[kv] = (llm.config.num_kvcache_blocks, llm.model_runner.kv_cache.dtype)
        llm.exit()
    assert got["fp8_e4m3"] == got["fp8"] and got["fp8"][1] == FP8 and got["fp8"][0] > got["auto"][0]


def _one_third_case():
    """One float16 query over two FP8 keys whose scores differ by ln 2 (weights 1/3, 2/3); values 1 and 0: the
    output is the first weight."""
    block_size, head_dim = 16, 16
    k = torch.zeros(1, 1, block_size, head_dim)
    v = torch.zeros(1, 1, block_size, head_dim)
    k[0, 0, 1, 0] = 1.0                 # key 1: q.k = q[0]; key 0: 0
    v[0, 0, 0, :] = 1.0                 # value 0: ones; value 1: zeros
    q = torch.zeros(1, 1, head_dim, dtype=torch.float16)
    q[0, 0, 0] = math.log(2)
    s = q[0, 0, 0].double()            # the score the float16 query gives key 1 (scale 1)
    want = (1 / (1 + torch.exp(s))).item()
    return q, k.to(FP8), v.to(FP8), torch.tensor([[0]], dtype=torch.int32), want


def test_fp8_decode_of_a_float16_model_weighs_values_in_float16():
    q, kq, vq, tables, want = _one_third_case()
    lengths = torch.tensor([2], dtype=torch.int32)
    ctx = DecodeMeta(1, lengths, tables, [2])
    ref = torch_ref.decode(q, kq, vq, ctx, 1.0, k_scale=1.0, v_scale=1.0)
    # float16 weights round 1/3 within 2^-13 of it, the output within 2^-12 more; bfloat16's 0.33398 is 6e-4 off
    assert abs(ref[0, 0, 0].item() - want) < 2.5e-4, (ref[0, 0, 0].item(), want)
    pytest.importorskip("triton")
    from engine.kernels.decode_attention import paged_decode

    out = paged_decode(q.to(DEVICE), kq.to(DEVICE), vq.to(DEVICE), tables.to(DEVICE), lengths.to(DEVICE), 1.0, 1,
                       block_n=16, k_scale=1.0, v_scale=1.0).cpu()
    assert abs(out[0, 0, 0].item() - want) < 2.5e-4, (out[0, 0, 0].item(), want)
