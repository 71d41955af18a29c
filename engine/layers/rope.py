from __future__ import annotations

import torch
from torch import nn

from . import fused


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding (rotate halves), cos/sin precomputed for every position."""

    def __init__(self, head_size: int, max_position: int, base: float):
        super().__init__()
        self.head_size = head_size
        inv_freq = 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=torch.float, device="cpu") / head_size))
        t = torch.arange(max_position, dtype=torch.float, device="cpu")
        freqs = torch.einsum("i,j->ij", t, inv_freq)
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)
        return fused.rope(q, cos, sin), fused.rope(k, cos, sin)
