"""Scatter this step's K/V rows into the paged pool: one program per token, slot -1 skipped. An FP8 pool gets
each row quantised on the way (engine/kv_quant.py: x * (1 / scale), NaN to 0, clamped to +-448, rounded to e4m3).

The pool is head-major inside a block (engine/kv_layout.py), so a token's kv_heads rows land block_size rows
apart; the kernel takes the cache strides (V's row and head-dimension strides its own: a keys-contiguous V puts a
row's values block_size bytes apart) and writes whatever layout it is given."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kv_layout import v_transposed
from . import unaligned


@triton.jit
def _e4m3(x):
    """float32 x, already clamped to [-448, 448], rounded to the nearest e4m3 value (ties to even) and stored
    as e4m3, an exact conversion then. The rounding is written out (as the hardware does it) because Triton's
    interpreter, which runs this kernel in CI, rounds a value just under a power of two down a whole binade."""
    bits = x.to(tl.int32, bitcast=True)
    # Normal range: keep 3 of float32's 23 mantissa bits; the carry of a round-up moves into the exponent.
    normal = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # -1048576: 0xFFF00000
    # Below 2^-6 e4m3 is subnormal: multiples of 2^-9. Adding 1.5 * 2^14 leaves float32 that spacing there; the
    # sign is put back by hand (a value that rounds to zero keeps it, as -0).
    magnitude = (tl.abs(x) + 24576.0) - 24576.0
    subnormal = magnitude.to(tl.int32, bitcast=True) | (bits & -2147483648)  # -2147483648: the sign bit
    rounded = tl.where(tl.abs(x) < 0.015625, subnormal, normal)
    return rounded.to(tl.float32, bitcast=True).to(tl.float8e4nv)


@triton.jit
def _quantize(x, inv_scale):
    """A row as an FP8 pool stores it (engine/kv_quant.py's quantize): NaN becomes 0, so the pool never holds one
    (a stale row read past a context's end is then a finite value times a zero probability)."""
    x = x.to(tl.float32) * inv_scale
    return _e4m3(tl.clamp(tl.where(x == x, x, 0.0), -448.0, 448.0))


# (slots not specialised on their alignment: decode_attention.py says why)
@triton.jit(**unaligned("slot_ptr"))
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh, stride_block, stride_head, stride_row,
                     stride_v_row, stride_v_d, k_inv_scale, v_inv_scale, QUANT: tl.constexpr, V_T: tl.constexpr,
                     KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr,
                     HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
                     BLOCK_SIZE: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, DIM_PAD)
    mask = (h < KV_HEADS)[:, None] & (d < HEAD_DIM)[None, :]
    k = tl.load(k_ptr + token * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    if QUANT:
        k = _quantize(k, k_inv_scale)
        v = _quantize(v, v_inv_scale)
    else:
        k = k.to(k_cache_ptr.dtype.element_ty)
        v = v.to(v_cache_ptr.dtype.element_ty)
    dst = (slot // BLOCK_SIZE) * stride_block + (slot % BLOCK_SIZE) * stride_row + h[:, None] * stride_head + d[None, :]
    tl.store(k_cache_ptr + dst, k, mask=mask)
    if V_T:
        v_dst = (slot // BLOCK_SIZE) * stride_block + (slot % BLOCK_SIZE) * stride_v_row + h[:, None] * stride_head \
            + d[None, :] * stride_v_d
        tl.store(v_cache_ptr + v_dst, v, mask=mask)
    else:  # (V's strides are K's)
        tl.store(v_cache_ptr + dst, v, mask=mask)


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """k, v: [tokens, kv_heads, head_dim] (rows may be strided views of the qkv output); k_cache, v_cache:
    [num_blocks, kv_heads, block_size, head_dim], K's head_dim contiguous, V's block and head strides K's (its
    rows may be keys-contiguous: engine/kv_layout.py); in the model's dtype, or float8_e4m3fn (then quantised with
    the per-tensor scales)."""
    tokens, heads, head_dim = k.shape
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and slot_mapping.numel() == tokens
    assert k_cache.stride()[:2] == v_cache.stride()[:2] and k_cache.stride(-1) == 1
    if tokens == 0:
        return
    _store_kv_kernel[(tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(2), v_cache.stride(3),
        1.0 / k_scale, 1.0 / v_scale, QUANT=k_cache.dtype == torch.float8_e4m3fn, V_T=v_transposed(v_cache),
        enable_fp_fusion=False, KV_HEADS=heads, HEADS_PAD=triton.next_power_of_2(heads), HEAD_DIM=head_dim,
        DIM_PAD=triton.next_power_of_2(head_dim), BLOCK_SIZE=k_cache.shape[2])
