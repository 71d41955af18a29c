"""The small elementwise pieces of a decoder layer as plain torch functions: the reference for our Triton
kernels (engine/kernels/elementwise.py, engine/kernels/qk_norm_rope.py), which fuse each into one kernel,
and what runs on the CPU and with --eager. Which one a layer uses is the engine's KernelChoice
(engine/kernel_choice.py), consulted when the layer is built."""
from __future__ import annotations

import torch
import torch.nn.functional as F


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
