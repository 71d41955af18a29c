"""The attention layer: write this step's K/V into the paged pool, then attend with the chosen backend."""
from __future__ import annotations

import torch
from torch import nn

from ..context import get_context


class Attention(nn.Module):
    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int, backend):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        # Views into the runner's KV pool, [num_blocks, num_kv_heads, block_size, head_dim] (engine/kv_layout.py);
        # empty during warm-up.
        self.k_cache = self.v_cache = torch.tensor([])
        self.backend = backend  # a module of engine/backends (the engine's KernelChoice.backend)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_context()
        if self.k_cache.numel():
            self.backend.store_kvcache(k, v, self.k_cache, self.v_cache, ctx.slot_mapping)
        dec, pre = ctx.decode, ctx.prefill
        if pre is None:
            return self.backend.decode(q, self.k_cache, self.v_cache, dec, self.scale)
        if dec is None:
            return self.backend.prefill(q, k, v, self.k_cache, self.v_cache, pre, self.scale)
        # A mixed step: its decode rows come first, each part goes to its own kernel.
        n = dec.num_rows
        return torch.cat((self.backend.decode(q[:n], self.k_cache, self.v_cache, dec, self.scale),
                          self.backend.prefill(q[n:], k[n:], v[n:], self.k_cache, self.v_cache, pre, self.scale)))
