"""Attention on our own Triton kernels: the always-available fast GPU path."""
from __future__ import annotations

import torch

from ..context import DecodeMeta, PrefillMeta
from ..device import num_sms
from ..kernels.decode_attention import num_splits_for, paged_decode
from ..kernels.kv_write import store_kvcache as _store
from ..kernels.prefill_attention import varlen_prefill

# Prefill reads every key through the block table, so the runner passes tables even without a cached prefix.
NEEDS_PREFILL_BLOCK_TABLES = True
FP8_KV = True  # reads an FP8 pool (engine/kv_quant.py)
GRAPH_SAFE = True


def _sms(device: torch.device) -> int:
    return num_sms(device, 8)


def store_kvcache(k, v, k_cache, v_cache, slot_mapping, k_scale: float = 1.0, v_scale: float = 1.0):
    _store(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def prefill(q, k, v, k_cache, v_cache, ctx: PrefillMeta, scale: float, k_scale: float = 1.0,
            v_scale: float = 1.0) -> torch.Tensor:
    paged = ctx.block_tables is not None and k_cache.numel() > 0
    return varlen_prefill(q, k, v, k_cache if paged else None, v_cache if paged else None,
                          ctx.block_tables if paged else None, ctx.cu_seqlens_q, ctx.cu_seqlens_k,
                          ctx.max_seqlen_q, scale, k_scale=k_scale, v_scale=v_scale)


def decode(q, k_cache, v_cache, ctx: DecodeMeta, scale: float, k_scale: float = 1.0,
           v_scale: float = 1.0) -> torch.Tensor:
    splits = ctx.num_splits
    if splits is None:
        num_blocks, num_kv_heads, block_size, _ = k_cache.shape  # engine/kv_layout.py
        longest = max(ctx.context_lens_host) if ctx.context_lens_host else num_blocks * block_size
        splits = num_splits_for(q.shape[0], num_kv_heads, longest, _sms(q.device))
    return paged_decode(q, k_cache, v_cache, ctx.block_tables, ctx.context_lens, scale, splits, k_scale=k_scale,
                        v_scale=v_scale, order=ctx.order)
