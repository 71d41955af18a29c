"""Varlen causal prefill attention over a paged KV pool (flash-attention style, online softmax).

Grid: (query tile, sequence, query head). Query rows of sequence i are this step's new positions
[k_len - q_len, k_len); their keys are positions [0, k_len) read through the block table, so a cached
prefix and a chunk's earlier part cost no recomputation. With PAGED false (warm-up, no pool yet) the keys
are this step's own k/v rows.

The pool is [num_blocks, kv_heads, block_size, head_dim] (engine/kv_layout.py); the kernel takes its strides, V's
row and head-dimension strides its own (a keys-contiguous V: then a tile that lies inside one block is read
unmasked, as the decode kernel reads it, and decode_attention.py says why)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kv_layout import v_transposed
from . import dot_precision, unaligned


# The block tables' width changes with the batch; specialised (== 1 when every prompt fits one block) it built
# a second variant on a bench's first timed repeat (scripts/first_use_compiles.py).
# (int inputs not specialised on their alignment: decode_attention.py says why)
@triton.jit(do_not_specialize=["stride_bt"], **unaligned("block_tables_ptr", "cu_q_ptr", "cu_k_ptr"))
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, cu_q_ptr, cu_k_ptr, out_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_bt,
    stride_block, stride_head, stride_row, stride_v_row, stride_v_d, scale_log2, v_scale,
    FP8: tl.constexpr, V_T: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    seq = tl.program_id(1)
    h = tl.program_id(2)
    kvh = h // GROUP
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    if tile * BLOCK_M >= q_len:
        return
    k_len = tl.load(cu_k_ptr + seq + 1) - tl.load(cu_k_ptr + seq)
    offset = k_len - q_len  # absolute position of the first query row

    m_idx = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m_idx < q_len
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + (q_start + m_idx)[:, None] * stride_qt + h * stride_qh + d[None, :], mask=m_mask[:, None],
                other=0.0)
    q_pos = offset + m_idx
    # An FP8 pool is read in float16 (decode_attention.py says why; engine/kv_quant.py the arithmetic).
    CD: tl.constexpr = tl.float16 if FP8 and q_ptr.dtype.element_ty != tl.float32 else q_ptr.dtype.element_ty
    q = q.to(CD)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # Keys beyond the tile's last query position are masked for every row: stop there.
    k_end = tl.minimum(k_len, offset + (tile + 1) * BLOCK_M)
    for n in range(0, k_end, BLOCK_N):
        n_idx = n + tl.arange(0, BLOCK_N)
        n_mask = n_idx < k_end
        # A tile inside one block (tiles start at multiples of BLOCK_N): with a keys-contiguous V, read unmasked.
        PAGE_TILE: tl.constexpr = V_T and BLOCK_SIZE % BLOCK_N == 0
        if PAGED:
            if PAGE_TILE:
                block = tl.load(block_tables_ptr + seq * stride_bt + n // BLOCK_SIZE).to(tl.int64)
                # (the H200's Triton 3.6 does not see this alignment: decode_attention.py)
                in_block = tl.multiple_of(n % BLOCK_SIZE, BLOCK_N) + tl.arange(0, BLOCK_N)
            else:
                block = tl.load(block_tables_ptr + seq * stride_bt + n_idx // BLOCK_SIZE, mask=n_mask,
                                other=0).to(tl.int64)
                in_block = n_idx % BLOCK_SIZE
            tile_base = block * stride_block + kvh * stride_head
            kv_off = (tile_base + in_block * stride_row)[:, None] + d[None, :]
            if V_T:
                v_off = (tile_base + in_block * stride_v_row)[:, None] + d[None, :] * stride_v_d
            else:  # (V's strides are K's)
                v_off = kv_off
            if PAGE_TILE:
                k = tl.load(k_cache_ptr + kv_off)
            else:
                k = tl.load(k_cache_ptr + kv_off, mask=n_mask[:, None], other=0.0)
            if FP8:  # e4m3 is exact in float16; the scale goes on the scores
                k = k.to(CD)
        else:
            k = tl.load(k_ptr + (q_start + n_idx)[:, None] * stride_kt + kvh * stride_kh + d[None, :],
                        mask=n_mask[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        causal = (n_idx[None, :] <= q_pos[:, None]) & n_mask[None, :]
        s = tl.where(causal, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if PAGED:
            if PAGE_TILE:
                v = tl.load(v_cache_ptr + v_off)
            else:
                v = tl.load(v_cache_ptr + v_off, mask=n_mask[:, None], other=0.0)
            if FP8:
                v = v.to(CD)
        else:
            v = tl.load(v_ptr + (q_start + n_idx)[:, None] * stride_vt + kvh * stride_vh + d[None, :],
                        mask=n_mask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    if FP8:
        acc = acc * v_scale
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + (q_start + m_idx)[:, None] * stride_ot + h * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None])


def varlen_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor | None,
                   v_cache: torch.Tensor | None, block_tables: torch.Tensor | None, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, max_seqlen_q: int, scale: float, block_m: int = 64,
                   block_n: int = 64, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """q: [tokens, heads, head_dim]; k, v: [tokens, kv_heads, head_dim]; with block_tables the keys come
    from the pool ([num_blocks, kv_heads, block_size, head_dim], already holding this step's rows; in q's dtype
    or float8_e4m3fn, read with k_scale / v_scale: engine/kv_quant.py), else from k/v directly."""
    tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    num_seqs = cu_seqlens_q.numel() - 1
    out = torch.empty_like(q)
    paged = block_tables is not None
    fp8 = paged and k_cache.dtype == torch.float8_e4m3fn  # (the K scale rides on the scores' scale)
    if paged:
        assert k_cache.stride()[:2] == v_cache.stride()[:2] and k_cache.stride(-1) == 1
        block_size = k_cache.shape[2]
        caches = (k_cache, v_cache, block_tables, block_tables.stride(0), *k_cache.stride()[:3],
                  *v_cache.stride()[2:])
    else:
        block_size = 1
        caches = (k, v, cu_seqlens_q, 0, 0, 0, 0, 0, 0)  # placeholders: never read when PAGED is false
    grid = (triton.cdiv(max_seqlen_q, block_m), num_seqs, num_heads)
    _prefill_kernel[grid](
        q, k, v, caches[0], caches[1], caches[2], cu_seqlens_q, cu_seqlens_k, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        *caches[3:], scale * 1.4426950408889634 * (k_scale if fp8 else 1.0), v_scale,
        FP8=fp8, V_T=paged and v_transposed(v_cache), GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_N=block_n, PAGED=paged, DOT_PRECISION=dot_precision(q.dtype),
    )
    return out
