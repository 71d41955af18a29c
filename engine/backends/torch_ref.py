"""The reference attention backend: plain PyTorch over the paged KV pool. Runs on CPU and GPU; the fast
backends are checked against it. It gathers K/V through the block tables explicitly, so it is slow but
easy to read. The pool's layout (engine/kv_layout.py) is handled only through its token-major view."""
from __future__ import annotations

import torch

from ..context import DecodeMeta, PrefillMeta
from ..kv_layout import token_major
from ..kv_quant import FP8, as_stored, fp8_compute_dtype, quantize

NEEDS_PREFILL_BLOCK_TABLES = False
FP8_KV = True  # reads an FP8 pool (engine/kv_quant.py)
GRAPH_SAFE = False  # boolean indexing and host-side lengths: not capturable


def _to_cache(x: torch.Tensor, cache: torch.Tensor, scale: float) -> torch.Tensor:
    return quantize(x, scale) if cache.dtype == FP8 else x.to(cache.dtype)


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """k, v: [tokens, kv_heads, head_dim]; slot -1 marks a row that must not be written (graph padding). An FP8
    pool stores e4m3(x / scale) (engine/kv_quant.py)."""
    block_size = k_cache.shape[2]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    # Writing through the token-major view puts each row where the pool's layout wants it.
    token_major(k_cache)[slots // block_size, slots % block_size] = _to_cache(k[valid], k_cache, k_scale)
    token_major(v_cache)[slots // block_size, slots % block_size] = _to_cache(v[valid], v_cache, v_scale)


def _rows(cache: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows at (block, offset) pairs of any shape S: [*S, kv_heads, head_dim]."""
    return token_major(cache)[blocks.long(), offsets]


def _gather(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    block_size = cache.shape[2]
    pos = torch.arange(length, device=cache.device)
    return _rows(cache, block_table[pos // block_size], pos % block_size)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, v_scale: float | None = None
            ) -> torch.Tensor:
    """Causal attention of the last len(q) positions of a sequence over all len(k) of its keys. v_scale None:
    k and v are in the model dtype; else they are an FP8 pool's e4m3 values (the K scale already in `scale`)."""
    lq, num_heads, _ = q.shape
    lk, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    # Query i sits at position lk - lq + i and may see keys 0 .. lk - lq + i.
    allowed = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(diagonal=lk - lq)
    scores = scores.masked_fill(~allowed, float("-inf"))
    # Probabilities in the model's dtype before the value product, as Transformers' eager attention does; in
    # float16 over an FP8 pool (engine/kv_quant.py).
    if v_scale is not None:
        probs = scores.softmax(dim=-1).to(fp8_compute_dtype(q.dtype)).float()
        return (torch.einsum("hqk,khd->qhd", probs, v.float()) * v_scale).to(q.dtype)
    probs = scores.softmax(dim=-1).to(q.dtype)
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)


def prefill(q, k, v, k_cache, v_cache, ctx: PrefillMeta, scale: float, k_scale: float = 1.0,
            v_scale: float = 1.0) -> torch.Tensor:
    out = torch.empty_like(q)
    cu_q, cu_k = ctx.cu_seqlens_q_host, ctx.cu_seqlens_k_host
    fp8 = k_cache.dtype == FP8
    for i in range(len(cu_q) - 1):
        qs, qe = cu_q[i], cu_q[i + 1]
        lk = cu_k[i + 1] - cu_k[i]
        if ctx.block_tables is None:  # no cached prefix anywhere in the batch: keys are this step's own,
            ki = as_stored(k[qs:qe], k_cache, k_scale)  # as the pool holds them
            vi = as_stored(v[qs:qe], v_cache, v_scale)
        else:
            ki = _gather(k_cache, ctx.block_tables[i], lk)
            vi = _gather(v_cache, ctx.block_tables[i], lk)
        out[qs:qe] = _attend(q[qs:qe], ki, vi, scale * k_scale, v_scale=v_scale) if fp8 else \
            _attend(q[qs:qe], ki, vi, scale)
    return out


def decode(q, k_cache, v_cache, ctx: DecodeMeta, scale: float, k_scale: float = 1.0,
           v_scale: float = 1.0) -> torch.Tensor:
    """One query per sequence over its whole context, batched by padding to the longest context."""
    batch, num_heads, head_dim = q.shape
    _, num_kv_heads, block_size, _ = k_cache.shape
    max_len = max(ctx.context_lens_host) if ctx.context_lens_host else int(ctx.context_lens.max())
    max_len = max(max_len, 1)
    pos = torch.arange(max_len, device=q.device)
    block_idx = (pos // block_size).clamp(max=ctx.block_tables.shape[1] - 1)
    blocks = ctx.block_tables[:, block_idx]
    valid = (pos.unsqueeze(0) < ctx.context_lens.unsqueeze(1)) & (blocks >= 0)
    blocks = torch.where(valid, blocks, 0)
    offsets = (pos % block_size).expand(batch, max_len)
    k = _rows(k_cache, blocks, offsets).float()  # [B, L, KV, D]
    v = _rows(v_cache, blocks, offsets).float()
    qg = q.float().view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    fp8 = k_cache.dtype == FP8  # (e4m3 values, exact in float32; the scales multiply the scores and the output)
    scores = torch.einsum("bkgd,blkd->bkgl", qg, k) * (scale * k_scale if fp8 else scale)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = scores.softmax(dim=-1).nan_to_num(0.0)  # a padded row (context 0) attends to nothing
    out = torch.einsum("bkgl,blkd->bkgd", probs.to(fp8_compute_dtype(q.dtype) if fp8 else q.dtype).float(), v)
    if fp8:
        out = out * v_scale
    return out.reshape(batch, num_heads, head_dim).to(q.dtype)
