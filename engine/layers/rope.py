from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """The neox-style (rotate-halves) cos/sin table for every position, computed once in float32 on the CPU.
    The rotation itself is fused.rope, applied with the q/k norms in fused.qk_norm_rope."""

    def __init__(self, head_size: int, max_position: int, base: float):
        super().__init__()
        self.head_size = head_size
        inv_freq = 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=torch.float, device="cpu") / head_size))
        t = torch.arange(max_position, dtype=torch.float, device="cpu")
        freqs = torch.einsum("i,j->ij", t, inv_freq)
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
        self.register_buffer("cos_sin_cache", cache, persistent=False)
