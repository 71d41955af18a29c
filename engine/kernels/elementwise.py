"""The small elementwise pieces of a decoder layer as one Triton kernel each: RMSNorm (with the residual add
before it) and SiLU(gate) * up. Eagerly each is 3-10 tiny torch kernels; at decode batch sizes a kernel costs
a few microseconds however little it does, so 28 layers of them dominate a step.

torch.compile fused them before; its import and per-process tracing cost 6-10 s of every start-up on an H200
(docs/perf.md, session 8), where these kernels compile once into Triton's on-disk cache. Numerics follow
engine/layers/fused.py: float32 arithmetic, rounded to the model dtype wherever eager torch stores a 16-bit
tensor; only the norm's float32 sum runs in another order, which now and then moves a value by 1 ulp.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, x_stride, res_stride, n, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    DT: tl.constexpr = out_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    # Every load first: a load after the reduction (its barrier) would wait another trip to memory, and the
    # weight, unlike x, is rarely in L2 (a step streams ~1 GB of weights through it).
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        # add_rms_norm: the sum in float32, kept in the model dtype (the residual stream).
        r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0).to(tl.float32)
        x = (x + r).to(DT)
        tl.store(res_out_ptr + row * n + cols, x, mask=mask)
        x = x.to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / n
    normed = (x * tl.math.rsqrt(mean_square + eps)).to(DT).to(tl.float32)
    tl.store(out_ptr + row * n + cols, (normed * w).to(DT), mask=mask)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_stride, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    DT: tl.constexpr = out_ptr.dtype.element_ty
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + n + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(DT).to(tl.float32)  # F.silu's result is a model-dtype tensor
    tl.store(out_ptr + row * n + cols, (silu * up).to(DT), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, last dim] without a copy where its rows are evenly strided (a column slice is)."""
    assert x.stride(-1) == 1, "the last dimension must be contiguous"
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def _norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
          num_warps: int | None = None):
    # (num_warps, and silu_and_mul's block: scripts/elementwise_bench.py times the choices; the defaults won.)
    n = x.shape[-1]
    assert weight.shape == (n,) and weight.is_contiguous() and weight.dtype == x.dtype
    x2 = _rows(x)
    res2 = _rows(residual) if residual is not None else x2
    assert res2.shape == x2.shape and res2.dtype == x.dtype
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else out
    if x2.shape[0]:
        block = triton.next_power_of_2(n)
        _rms_norm_kernel[(x2.shape[0],)](x2, res2, weight, out, res_out, x2.stride(0), res2.stride(0), n,
                                         float(eps), HAS_RESIDUAL=residual is not None, BLOCK=block,
                                         num_warps=num_warps or (8 if block >= 4096 else 4), enable_fp_fusion=False)
    return out, res_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, num_warps: int | None = None) -> torch.Tensor:
    """fused.rms_norm(x, weight, eps) over the last dimension."""
    return _norm(x, None, weight, eps, num_warps)[0]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 num_warps: int | None = None):
    """fused.add_rms_norm: (rms_norm(x + residual), x + residual), the sum rounded to the model dtype."""
    return _norm(x, residual, weight, eps, num_warps)


def silu_and_mul(x: torch.Tensor, num_warps: int | None = None, block: int | None = None) -> torch.Tensor:
    """fused.silu_and_mul: SiLU of the first half of the last dimension times the second half."""
    n = x.shape[-1] // 2
    assert x.shape[-1] == 2 * n
    x2 = _rows(x)
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = block or min(1024, triton.next_power_of_2(n))
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(n, block))](x2, out, x2.stride(0), n, BLOCK=block,
                                                                   num_warps=num_warps or 4, enable_fp_fusion=False)
    return out
