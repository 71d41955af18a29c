"""The small elementwise pieces of a decoder layer as plain functions, optionally torch.compile'd.

Eagerly each is 3-10 tiny kernels; at decode batch sizes a kernel costs a few microseconds however little
it does, so 28 layers of them dominate a step. torch.compile fuses each function into one kernel. Whether a
layer uses the compiled or the plain function is the engine's KernelChoice (engine/kernel_choice.py), which
layers consult when they are built."""
from __future__ import annotations

import torch
import torch.nn.functional as F

_compiled: dict = {}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return xf.to(dtype) * weight


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    # Sum in float32, keep the residual stream in the model dtype (as Transformers does).
    x = (x.float() + residual.float()).to(x.dtype)
    return rms_norm(x, weight, eps), x


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, -1)
    return F.silu(gate) * up


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [tokens, heads, head_size]; cos/sin: [tokens, head_size / 2] in float32. In the model's dtype,
    # round where Transformers rounds (cos/sin first, then each product), so a bf16 comparison
    # measures the engine's own error rather than a different rounding order.
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def qk_norm_rope(q, k, q_weight, k_weight, eps: float, cos_sin: torch.Tensor):
    cos, sin = cos_sin.chunk(2, dim=-1)
    return rope(rms_norm(q, q_weight, eps), cos, sin), rope(rms_norm(k, k_weight, eps), cos, sin)


def compiled(fn):
    """`fn` torch.compile'd (one compiled wrapper per function per process)."""
    if fn not in _compiled:
        import torch._inductor.config as inductor_config

        # Round bf16 intermediates where eager PyTorch rounds, so graph and eager runs (and
        # Transformers) see the same numbers; fusion still removes the extra kernels.
        inductor_config.emulate_precision_casts = True
        _compiled[fn] = torch.compile(fn, dynamic=True)
    return _compiled[fn]
