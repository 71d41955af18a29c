"""Tensor parallel rank state and the collectives the layers need.

`set_tp(rank, size)` before a model is built makes the shard-aware layers take their slice (ModelRunner
does it first thing); the runner sets the pair again around every forward, so a TP=1 engine can share a
process with a TP=N one. Size 1 makes every collective a no-op. The collectives run on torch.distributed's
default process group, which engine/rendezvous.py creates; the worker processes that make up the other
ranks are engine/tp_workers.py's. This module imports neither: layers import it, and it imports no
engine module, so no import circle can run through it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

_TP_RANK = 0
_TP_SIZE = 1


def set_tp(rank: int, size: int) -> None:
    global _TP_RANK, _TP_SIZE
    _TP_RANK, _TP_SIZE = rank, size


def tp_rank() -> int:
    return _TP_RANK


def tp_size() -> int:
    return _TP_SIZE


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if _TP_SIZE > 1:
        dist.all_reduce(x)
    return x


def broadcast_from_rank0(x: torch.Tensor) -> torch.Tensor:
    """Rank 0's `x` into every rank's `x` (same shape and dtype everywhere)."""
    if _TP_SIZE > 1:
        dist.broadcast(x, 0)
    return x


def gather_to_rank0(x: torch.Tensor, dim: int = -1) -> torch.Tensor | None:
    """Concatenate every rank's shard of `x` along `dim` on rank 0; other ranks get None."""
    if _TP_SIZE == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(_TP_SIZE)] if _TP_RANK == 0 else None
    dist.gather(x, parts, 0)
    return torch.cat(parts, dim) if _TP_RANK == 0 else None


def all_reduce_min(value: int, device: torch.device) -> int:
    """The smallest `value` over all ranks (every rank must call it)."""
    if _TP_SIZE == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())
