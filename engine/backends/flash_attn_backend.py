"""flash-attn's kernels, used when the package is installed (it needs block sizes that are multiples of 256).

Not exercised on the lent H200 (flash-attn is not installed there): the triton backend is the measured path.

flash-attn's paged API wants caches [num_blocks, block_size, kv_heads, head_dim]; the pool is head-major inside a
block (engine/kv_layout.py), so this backend hands it the token_major view: same memory, no copy. flash-attn takes
the row and head strides from the tensor, and only the last dimension must be contiguous."""
from __future__ import annotations

import torch
from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

from ..context import DecodeMeta, PrefillMeta
from ..kernels.kv_write import store_kvcache as _store
from ..kv_layout import token_major

NEEDS_PREFILL_BLOCK_TABLES = False
GRAPH_SAFE = True
# The pool in the model's dtype only: the KV scales below are always 1 here (engine/kernel_choice.py refuses
# kv_cache_dtype fp8 with this backend).
FP8_KV = False


def store_kvcache(k, v, k_cache, v_cache, slot_mapping, k_scale: float = 1.0, v_scale: float = 1.0):
    _store(k, v, k_cache, v_cache, slot_mapping)


def prefill(q, k, v, k_cache, v_cache, ctx: PrefillMeta, scale: float, k_scale: float = 1.0,
            v_scale: float = 1.0) -> torch.Tensor:
    if ctx.block_tables is not None:  # a cached prefix: read keys from the pool
        k, v = token_major(k_cache), token_major(v_cache)
    return flash_attn_varlen_func(q, k, v, max_seqlen_q=ctx.max_seqlen_q, cu_seqlens_q=ctx.cu_seqlens_q,
                                  max_seqlen_k=ctx.max_seqlen_k, cu_seqlens_k=ctx.cu_seqlens_k,
                                  softmax_scale=scale, causal=True, block_table=ctx.block_tables)


def decode(q, k_cache, v_cache, ctx: DecodeMeta, scale: float, k_scale: float = 1.0,
           v_scale: float = 1.0) -> torch.Tensor:
    out = flash_attn_with_kvcache(q.unsqueeze(1), token_major(k_cache), token_major(v_cache),
                                  cache_seqlens=ctx.context_lens, block_table=ctx.block_tables, softmax_scale=scale,
                                  causal=True)
    return out.squeeze(1)
