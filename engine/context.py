"""Per-step attention metadata, set by the runner before a forward pass and read by the attention layers.

A module-level slot (as in nano-vLLM) keeps the model's forward signature plain (input_ids, positions).
A step's tokens are its decode rows' (one each, first) then its prefill rows' (see engine/batch_plan.py);
each part has its own metadata, and a mixed step has both.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class DecodeMeta:
    """The first `num_rows` tokens: one query per sequence over its whole context, read through the pool."""
    num_rows: int
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    context_lens_host: list[int] | None = None   # for backends that size work on the host (no device sync)
    num_splits: int | None = None                # fixed by the runner when a CUDA graph is captured
    order: torch.Tensor | None = None            # int32 [num_rows]: the programs' launch order (engine/decode_order.py)


@dataclass(slots=True)
class PrefillMeta:
    """The tokens after the decode rows: varlen causal attention, row i's queries being the positions
    [cu_k[i+1] - cu_k[i] - (cu_q[i+1] - cu_q[i]), ...) of a sequence whose keys are cu_k's lengths."""
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    # Each row's blocks when keys are read through the pool (a cached prefix, or a backend that always
    # does); None: the keys are this step's own k/v rows.
    block_tables: torch.Tensor | None = None
    cu_seqlens_q_host: list[int] | None = None
    cu_seqlens_k_host: list[int] | None = None


@dataclass(slots=True)
class Context:
    slot_mapping: torch.Tensor | None = None
    decode: DecodeMeta | None = None
    prefill: PrefillMeta | None = None
    # The hidden rows whose logits the step needs (its sampling rows' last tokens); None: every row.
    logits_indices: torch.Tensor | None = None


_CONTEXT = Context()


def get_context() -> Context:
    return _CONTEXT


def set_context(ctx: Context) -> None:
    global _CONTEXT
    _CONTEXT = ctx


def reset_context() -> None:
    global _CONTEXT
    _CONTEXT = Context()
