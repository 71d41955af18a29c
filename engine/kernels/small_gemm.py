"""Decode-sized matmul y = x @ w.T (+ bias) for few rows (M <= 16), with nn.Linear's [N, K] weight.

At batch 1 the op is a GEMV bound by reading w once; cuBLAS picks tiles that leave SMs idle. Here each
program owns a BLOCK_N slice of w's rows and one of SPLIT_K whole-tile ranges of K, so the grid holds
enough programs (~2 per SM) to stream w at full bandwidth. Tensor cores want the large dimension first,
so the roles are swapped: acc[BLOCK_N, BLOCK_M] += w_tile @ x_tile^T, with x's rows padded to BLOCK_M = 16.

Split-K is deterministic: programs write float32 partials and a second kernel sums them in a fixed order
(no atomics). Nothing syncs with the host and outputs come from torch.empty, so it is CUDA-graph safe.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..device import num_sms
from . import dot_precision

# The largest M the tiling is meant for (one BLOCK_M tile); larger M still works, one tile per 16 rows.
MAX_SMALL_M = 16
_BLOCK_M = 16
_REDUCE_BLOCK = 256
_DEFAULT_SMS = 132  # H200; used off-CUDA, where the heuristic is only exercised, not timed

@triton.jit
def _small_gemm_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, part_ptr,
    M, N, K, stride_xm, stride_wn, stride_ym, tiles_per_split,
    HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_mask = offs_n < N
    m_mask = offs_m < M
    # Each split covers whole BLOCK_K tiles; a trailing split may be empty and then writes zeros.
    k_start = pid_k * tiles_per_split * BLOCK_K
    k_end = tl.minimum(k_start + tiles_per_split * BLOCK_K, K)
    offs_k = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn  # int64: N * K can pass 2**31 (lm_head)
    x_cols = x_ptr + offs_m[None, :] * stride_xm  # x^T tile: [BLOCK_K, BLOCK_M]

    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        if EVEN_K:
            # No mask along K: a mask that varies along the contiguous dim would break the wide loads.
            w = tl.load(w_rows + (k + offs_k)[None, :], mask=n_mask[:, None], other=0.0)
            xt = tl.load(x_cols + (k + offs_k)[:, None], mask=m_mask[None, :], other=0.0)
        else:
            k_mask = (k + offs_k) < K
            w = tl.load(w_rows + (k + offs_k)[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            xt = tl.load(x_cols + (k + offs_k)[:, None], mask=k_mask[:, None] & m_mask[None, :], other=0.0)
        acc = tl.dot(w, xt, acc, input_precision=DOT_PRECISION)

    mask = n_mask[:, None] & m_mask[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        y = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None]
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        part = part_ptr + (pid_k * M + offs_m[None, :]).to(tl.int64) * N + offs_n[:, None]
        tl.store(part, acc, mask=mask)


@triton.jit
def _split_k_reduce_kernel(part_ptr, b_ptr, y_ptr, M, N, stride_ym,
                           HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    pid_n = tl.program_id(0)
    m = tl.program_id(1)
    offs = pid_n * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    # A fixed summation order makes every call bit-identical.
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + (s * M + m).to(tl.int64) * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_ym + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def small_gemm_config(M: int, N: int, K: int, num_sms: int) -> dict:
    """Default knobs for small_matmul, from an in-graph sweep on an H200 (docs/perf.md, Qwen3-0.6B shapes at
    M = 1 and 8): wide 64 x 128 weight tiles with 4 stages won everywhere; splitting K paid only where the
    row tiles alone leave most SMs idle (N = 1024: 16 tiles -> split 8, 3.5 us against cuBLAS's 12.5 us),
    and cost its extra reduce launch where they do not (N = 4096: 64 tiles, split 1 best).

    - block_k: 128, or the next power of two >= K (at least 16); block_n: 64, or less for a narrow N.
    - split_k: 1 when cdiv(N, block_n) >= num_sms // 4; else the largest power of two <= 8 with
      tiles * split_k <= num_sms, capped at the number of K tiles so no split is empty.
    M does not change the choice (every M <= MAX_SMALL_M is one BLOCK_M tile).
    """
    block_k = min(128, max(16, triton.next_power_of_2(K)))
    k_tiles = triton.cdiv(K, block_k)
    block_n = min(64, max(16, triton.next_power_of_2(N)))
    tiles = triton.cdiv(N, block_n)
    split_k = 1
    if tiles < num_sms // 4:
        while split_k < 8 and tiles * split_k * 2 <= num_sms and split_k * 2 <= k_tiles:
            split_k *= 2
    return dict(block_n=block_n, block_k=block_k, split_k=split_k, num_warps=4, num_stages=4)


def small_matmul(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *,
                 block_n: int | None = None, block_k: int | None = None, split_k: int | None = None,
                 num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """x [M, K], w [N, K], bias [N] or None -> y [M, N] in x.dtype (float32 accumulation).

    Knobs left as None come from small_gemm_config; rows of x and w may be strided, but each row must be
    contiguous.
    """
    assert x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[1], (tuple(x.shape), tuple(w.shape))
    assert x.dtype == w.dtype, (x.dtype, w.dtype)
    assert x.stride(-1) == 1 and w.stride(-1) == 1, "rows of x and w must be contiguous"
    M, K = x.shape
    N = w.shape[0]
    if bias is not None:
        assert bias.shape == (N,) and bias.stride(0) == 1
    cfg = small_gemm_config(M, N, K, num_sms(x.device, _DEFAULT_SMS))
    block_n = block_n or cfg["block_n"]
    block_k = block_k or cfg["block_k"]
    split_k = split_k or cfg["split_k"]
    num_warps = num_warps or cfg["num_warps"]
    num_stages = num_stages or cfg["num_stages"]
    if block_n < 16 or block_k < 16 or block_n & (block_n - 1) or block_k & (block_k - 1):
        raise ValueError(f"block_n ({block_n}) and block_k ({block_k}) must be powers of two >= 16 (tl.dot)")

    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y
    tiles_per_split = triton.cdiv(triton.cdiv(K, block_k), split_k)
    part = torch.empty(split_k, M, N, dtype=torch.float32, device=x.device) if split_k > 1 else y
    b = bias if bias is not None else w  # never read when HAS_BIAS is False
    grid = (triton.cdiv(N, block_n), split_k, triton.cdiv(M, _BLOCK_M))
    _small_gemm_kernel[grid](
        x, w, b, y, part, M, N, K, x.stride(0), w.stride(0), y.stride(0), tiles_per_split,
        HAS_BIAS=bias is not None, SPLIT_K=split_k, EVEN_K=K % block_k == 0,
        BLOCK_M=_BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, DOT_PRECISION=dot_precision(x.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )
    if split_k > 1:
        _split_k_reduce_kernel[(triton.cdiv(N, _REDUCE_BLOCK), M)](
            part, b, y, M, N, y.stride(0),
            HAS_BIAS=bias is not None, SPLIT_K=split_k, BLOCK=_REDUCE_BLOCK,
        )
    return y
