"""Scatter this step's K/V rows into the paged pool: one program per token, slot -1 skipped.

The pool is head-major inside a block (engine/kv_layout.py), so a token's kv_heads rows land block_size rows
apart; the kernel takes the cache strides and writes whatever layout it is given."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh, stride_block, stride_head, stride_row,
                     KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
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
    dst = (slot // BLOCK_SIZE) * stride_block + (slot % BLOCK_SIZE) * stride_row + h[:, None] * stride_head + d[None, :]
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """k, v: [tokens, kv_heads, head_dim] (rows may be strided views of the qkv output); k_cache, v_cache:
    [num_blocks, kv_heads, block_size, head_dim] with head_dim contiguous and equal strides."""
    tokens, heads, head_dim = k.shape
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and slot_mapping.numel() == tokens
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    if tokens == 0:
        return
    _store_kv_kernel[(tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        KV_HEADS=heads, HEADS_PAD=triton.next_power_of_2(heads), HEAD_DIM=head_dim,
        DIM_PAD=triton.next_power_of_2(head_dim), BLOCK_SIZE=k_cache.shape[2])
