"""The attention layer: write this step's K/V into the paged pool, then attend with the chosen backend."""
from __future__ import annotations

import torch
from torch import nn

from ..context import get_context
from ..kv_quant import FP8


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
        # An FP8 pool's per-tensor scales (engine/kv_quant.py); with a model-dtype pool they are 1 and unused.
        self.k_scale = self.v_scale = 1.0
        self.backend = backend  # a module of engine/backends (the engine's KernelChoice.backend)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_context()
        kc, vc = self.k_cache, self.v_cache
        # An FP8 pool's scales; a model-dtype pool's calls keep the backends' plain signature.
        scales = dict(k_scale=self.k_scale, v_scale=self.v_scale) if kc.dtype == FP8 else {}
        if kc.numel():
            self.backend.store_kvcache(k, v, kc, vc, ctx.slot_mapping, **scales)
        dec, pre = ctx.decode, ctx.prefill
        if pre is None:
            return self.backend.decode(q, kc, vc, dec, self.scale, **scales)
        if dec is None:
            return self.backend.prefill(q, k, v, kc, vc, pre, self.scale, **scales)
        # A mixed step: its decode rows come first, each part goes to its own kernel.
        n = dec.num_rows
        return torch.cat((self.backend.decode(q[:n], kc, vc, dec, self.scale, **scales),
                          self.backend.prefill(q[n:], k[n:], v[n:], kc, vc, pre, self.scale, **scales)))
