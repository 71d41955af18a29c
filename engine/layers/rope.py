from __future__ import annotations

import torch
from torch import nn


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
        return _apply(q, cos, sin), _apply(k, cos, sin)


def _apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [tokens, heads, head_size]; cos/sin: [tokens, head_size / 2] in float32.
    # In the model's dtype, round where Transformers rounds (cos/sin first, then each product), so a bf16
    # comparison measures the engine's own error rather than a different rounding order.
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
