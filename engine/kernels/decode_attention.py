"""Paged decode attention (one query token per sequence), flash-decoding style.

Grid: (sequence, kv head, split). A program serves every query head of its KV head (GQA), so each KV
byte is read once per step; long contexts are split across programs and merged by a second kernel.
The number of splits is fixed by the caller (CUDA graphs need a fixed grid); each program works out
its share of the sequence's actual context length on the device, so nothing syncs with the host.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import dot_precision


@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    acc_ptr, ml_ptr,
    stride_qb, stride_qh, stride_bt, scale_log2,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PAGE_TILES: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + b)
    # Each split covers a whole number of BLOCK_N tiles.
    tiles = tl.cdiv(ctx, BLOCK_N)
    tiles_per_split = tl.cdiv(tiles, NUM_SPLITS)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, ctx)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kvh * GROUP + g
    gmask = g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    row_stride = NUM_KV_HEADS * HEAD_DIM
    for n in range(start, end, BLOCK_N):
        offs = n + tl.arange(0, BLOCK_N)
        nmask = offs < end
        if PAGE_TILES:
            # A tile never straddles a page (BLOCK_SIZE % BLOCK_N == 0): one table read, contiguous rows.
            page = tl.load(block_tables_ptr + b * stride_bt + n // BLOCK_SIZE).to(tl.int64)
            slot = page * BLOCK_SIZE + n % BLOCK_SIZE + tl.arange(0, BLOCK_N)
        else:
            page = tl.load(block_tables_ptr + b * stride_bt + offs // BLOCK_SIZE, mask=nmask, other=0).to(tl.int64)
            slot = page * BLOCK_SIZE + offs % BLOCK_SIZE
        kv_off = slot[:, None] * row_stride + kvh * HEAD_DIM + d[None, :]
        k = tl.load(k_cache_ptr + kv_off, mask=nmask[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + kv_off, mask=nmask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    base = (b * NUM_KV_HEADS * GROUP + heads) * NUM_SPLITS + split
    tl.store(acc_ptr + base[:, None] * HEAD_DIM + d[None, :], acc, mask=gmask[:, None])
    tl.store(ml_ptr + base * 2, m_i, mask=gmask)
    tl.store(ml_ptr + base * 2 + 1, l_i, mask=gmask)


@triton.jit
def _decode_merge_kernel(acc_ptr, ml_ptr, out_ptr, stride_ob, stride_oh,
                         NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
                         SPLITS_PAD: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, SPLITS_PAD)
    smask = s < NUM_SPLITS
    d = tl.arange(0, HEAD_DIM)
    base = (b * NUM_HEADS + h) * NUM_SPLITS
    m = tl.load(ml_ptr + (base + s) * 2, mask=smask, other=float("-inf"))
    l = tl.load(ml_ptr + (base + s) * 2 + 1, mask=smask, other=0.0)
    m_max = tl.max(m, axis=0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)  # a padded row (context 0) has no keys at all
    w = tl.where(smask & (m > float("-inf")), tl.exp2(m - m_safe), 0.0)
    acc = tl.load(acc_ptr + (base + s)[:, None] * HEAD_DIM + d[None, :], mask=smask[:, None], other=0.0)
    num = tl.sum(acc * w[:, None], axis=0)
    den = tl.sum(l * w, axis=0)
    out = num / tl.where(den > 0, den, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty))


def num_splits_for(batch: int, num_kv_heads: int, max_context: int, num_sms: int, block_n: int = 64) -> int:
    """Enough programs to fill the GPU about twice, but never more splits than tiles of the longest context."""
    want = -(-2 * num_sms // max(1, batch * num_kv_heads))
    return max(1, min(want, -(-max_context // block_n), 64))


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, scale: float, num_splits: int, out: torch.Tensor | None = None,
                 block_n: int = 64, page_tiles: bool = False, num_warps: int | None = None,
                 num_stages: int | None = None) -> torch.Tensor:
    """page_tiles, num_warps, num_stages: tuning knobs (page_tiles needs block_size % block_n == 0); the
    defaults are the configuration measured in docs/perf.md."""
    """q: [batch, heads, head_dim]; caches [num_blocks, block_size, kv_heads, head_dim];
    block_tables [batch, max_blocks] int32 (-1 padded); context_lens [batch] int32 (0 = padding row)."""
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    assert q.stride(-1) == 1 and block_tables.stride(-1) == 1
    acc = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    ml = torch.empty(batch, num_heads, num_splits, 2, dtype=torch.float32, device=q.device)
    if out is None:
        out = torch.empty_like(q)
    log2e = 1.4426950408889634
    if page_tiles and block_size % block_n:
        raise ValueError(f"page_tiles needs block_size ({block_size}) to be a multiple of block_n ({block_n})")
    launch = {k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None}
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, acc, ml,
        q.stride(0), q.stride(1), block_tables.stride(0), scale * log2e,
        NUM_KV_HEADS=num_kv_heads, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, NUM_SPLITS=num_splits, DOT_PRECISION=dot_precision(q.dtype),
        PAGE_TILES=page_tiles, **launch,
    )
    _decode_merge_kernel[(batch, num_heads)](
        acc, ml, out, out.stride(0), out.stride(1),
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, NUM_SPLITS=num_splits, SPLITS_PAD=triton.next_power_of_2(num_splits),
    )
    return out
