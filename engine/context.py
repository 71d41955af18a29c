"""Per-step attention metadata, set by the runner before a forward pass and read by the attention layers.

A module-level slot (as in nano-vLLM) keeps the model's forward signature plain (input_ids, positions).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class Context:
    is_prefill: bool = False
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    slot_mapping: torch.Tensor | None = None
    context_lens: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None
    # Host copies for backends that loop per sequence (the torch reference), so they need no device sync.
    cu_seqlens_q_host: list[int] | None = None
    cu_seqlens_k_host: list[int] | None = None
    context_lens_host: list[int] | None = None
    # Decode split count fixed by the runner when a CUDA graph is captured (None: the backend chooses).
    num_splits: int | None = None


_CONTEXT = Context()


def get_context() -> Context:
    return _CONTEXT


def set_context(ctx: Context) -> None:
    global _CONTEXT
    _CONTEXT = ctx


def reset_context() -> None:
    global _CONTEXT
    _CONTEXT = Context()
