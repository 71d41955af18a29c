"""Qwen3's q/k head RMSNorm + neox RoPE straight from the merged qkv rows: one kernel per layer instead of
torch's split/index/norm/rope chain. Numerics follow fused.qk_norm_rope exactly, rounding to the
model dtype wherever eager torch does; only the norm's float32 sum order differs, which now and then
moves a value by 1 ulp."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import unaligned


@triton.jit
def _rnd(x, DT: tl.constexpr):
    # Round a float32 value to the model dtype and back: where eager torch stores a 16-bit tensor.
    # A no-op for float32.
    return x.to(DT).to(tl.float32)


@triton.jit
def _norm_rope_heads(src, dst, w_ptr, cos, sin, eps, H: tl.constexpr, BLOCK_H: tl.constexpr,
                     D: tl.constexpr, DT: tl.constexpr):
    """Norm + rotate H heads of one token. src/dst point at head 0; cos/sin are [1, D/2] float32 already
    rounded to the model dtype."""
    HALF: tl.constexpr = D // 2
    h = tl.arange(0, BLOCK_H)[:, None]
    c = tl.arange(0, HALF)[None, :]
    mask = (h < H) & (c < HALF)  # the second term only broadcasts the mask to the tile
    offs = h * D + c
    # The weights are loaded with x, before the reduction's barrier (elementwise.py's norm says why).
    w1 = tl.load(w_ptr + c).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + c).to(tl.float32)
    x1 = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + offs + HALF, mask=mask, other=0.0).to(tl.float32)
    # rms_norm: float32 statistics, round to the dtype, then the dtype product with the weight.
    ms = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) * (1.0 / D)  # D is a power of two: exact
    r = tl.math.rsqrt(ms + eps)[:, None]  # what torch.rsqrt lowers to on CUDA, eager and compiled
    y1 = _rnd(_rnd(x1 * r, DT) * w1, DT)
    y2 = _rnd(_rnd(x2 * r, DT) * w2, DT)
    # rope: each product rounded, then the difference/sum rounded (the explicit casts also keep the
    # compiler from contracting into an FMA in 16-bit dtypes).
    o1 = _rnd(y1 * cos, DT) - _rnd(y2 * sin, DT)
    o2 = _rnd(y2 * cos, DT) + _rnd(y1 * sin, DT)
    tl.store(dst + offs, o1.to(DT), mask=mask)
    tl.store(dst + offs + HALF, o2.to(DT), mask=mask)


# (positions not specialised on their alignment: decode_attention.py says why)
@triton.jit(**unaligned("pos_ptr"))
def _qk_norm_rope_kernel(qkv_ptr, qkv_stride, pos_ptr, cache_ptr, cache_stride, qw_ptr, kw_ptr,
                         q_ptr, k_ptr, eps, NQ: tl.constexpr, NK: tl.constexpr, BLOCK_Q: tl.constexpr,
                         BLOCK_K: tl.constexpr, D: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    which = tl.program_id(1)  # 0: the q heads, 1: the k heads; two programs per token so decode gets 2 SMs
    DT: tl.constexpr = qkv_ptr.dtype.element_ty
    HALF: tl.constexpr = D // 2
    pos = tl.load(pos_ptr + token).to(tl.int64)
    c = tl.arange(0, HALF)[None, :]
    # fused.rope casts the float32 table to the model dtype before multiplying.
    cos = _rnd(tl.load(cache_ptr + pos * cache_stride + c), DT)
    sin = _rnd(tl.load(cache_ptr + pos * cache_stride + HALF + c), DT)
    row = qkv_ptr + token * qkv_stride
    if which == 0:
        _norm_rope_heads(row, q_ptr + token * (NQ * D), qw_ptr, cos, sin, eps, NQ, BLOCK_Q, D, DT)
    else:
        _norm_rope_heads(row + NQ * D, k_ptr + token * (NK * D), kw_ptr, cos, sin, eps, NK, BLOCK_K, D, DT)


def qk_norm_rope(qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                 q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float, num_heads: int,
                 num_kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv: [T, (num_heads + 2 * num_kv_heads) * head_dim], unit column stride (rows may be strided);
    positions: [T] int32/int64; cos_sin_cache: [max_pos, head_dim] float32, cos then sin per row.
    Returns contiguous q [T, num_heads, head_dim] and k [T, num_kv_heads, head_dim] in qkv.dtype, equal
    to fused.qk_norm_rope(q, k, q_weight, k_weight, eps, cos_sin_cache[positions])."""
    tokens = qkv.shape[0]
    assert head_dim >= 2 and head_dim & (head_dim - 1) == 0, "head_dim must be a power of two"
    assert qkv.dim() == 2 and qkv.stride(-1) == 1
    assert qkv.shape[1] == (num_heads + 2 * num_kv_heads) * head_dim
    assert positions.shape == (tokens,) and positions.dtype in (torch.int32, torch.int64)
    assert cos_sin_cache.dtype == torch.float32 and cos_sin_cache.shape[1] == head_dim
    assert cos_sin_cache.stride(-1) == 1
    assert q_weight.shape == (head_dim,) and k_weight.shape == (head_dim,)
    assert q_weight.is_contiguous() and k_weight.is_contiguous()
    assert q_weight.dtype == k_weight.dtype == qkv.dtype, "the reference's rounding assumes one dtype"
    q = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(tokens, num_kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if tokens == 0:
        return q, k
    block_q, block_k = triton.next_power_of_2(num_heads), triton.next_power_of_2(num_kv_heads)
    # Each program holds its heads in registers (two [heads, head_dim / 2] float32 tiles); more warps
    # only where that would spill.
    num_warps = 8 if block_q * head_dim >= 8192 else 4
    _qk_norm_rope_kernel[(tokens, 2)](
        qkv, qkv.stride(0), positions.contiguous(), cos_sin_cache, cos_sin_cache.stride(0),
        q_weight, k_weight, q, k, float(eps), NQ=num_heads, NK=num_kv_heads, BLOCK_Q=block_q,
        BLOCK_K=block_k, D=head_dim, num_warps=num_warps,
        # Triton contracts a product and the following add into an FMA by default, skipping the rounding
        # eager torch does in between (measured on an H200: 20% of bf16 outputs off by 1-2 ulp).
        enable_fp_fusion=False)
    return q, k
