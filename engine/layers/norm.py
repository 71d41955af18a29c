from __future__ import annotations

import torch
from torch import nn

from . import fused


class RMSNorm(nn.Module):
    """RMSNorm; with `residual` it first adds it (the fused add used between sublayers) and returns both.
    `kernels`: the engine's KernelChoice (compiled or plain elementwise functions)."""

    def __init__(self, hidden_size: int, eps: float, kernels):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self._norm = kernels.elementwise(fused.rms_norm)
        self._add_norm = kernels.elementwise(fused.add_rms_norm)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return self._norm(x, self.weight, self.eps)
        return self._add_norm(x, residual, self.weight, self.eps)
