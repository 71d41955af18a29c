"""Scatter this step's K/V rows into the paged pool: one program per token, slot -1 skipped."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k_ptr, k_stride, v_ptr, v_stride, k_cache_ptr, v_cache_ptr, slot_ptr,
                     D: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    offs = tl.arange(0, BLOCK)
    mask = offs < D
    k = tl.load(k_ptr + token * k_stride + offs, mask=mask)
    v = tl.load(v_ptr + token * v_stride + offs, mask=mask)
    tl.store(k_cache_ptr + slot * D + offs, k, mask=mask)
    tl.store(v_cache_ptr + slot * D + offs, v, mask=mask)


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """k, v: [tokens, kv_heads, head_dim] (rows may be strided views of the qkv output);
    k_cache, v_cache: [num_blocks, block_size, kv_heads, head_dim], contiguous."""
    tokens, heads, head_dim = k.shape
    d = heads * head_dim
    assert k.stride(-1) == 1 and k.stride(1) == head_dim and v.stride(-1) == 1 and v.stride(1) == head_dim
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and slot_mapping.numel() == tokens
    if tokens == 0:
        return
    _store_kv_kernel[(tokens,)](k, k.stride(0), v, v.stride(0), k_cache, v_cache, slot_mapping,
                                D=d, BLOCK=triton.next_power_of_2(d))
