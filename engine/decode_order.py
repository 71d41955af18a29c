"""The order in which a decode step's attention programs are launched (LABKIT_DECODE_ORDER).

A decode step's rows have contexts of mixed lengths; the attention kernel's time is set by its last programs to
finish. Launched in row order, a long context that starts late runs alone at the end; launched longest first,
the long ones end with the rest (list scheduling). The kernel takes the order as a permutation of its rows
(engine/kernels/decode_attention.py, `order`); only timing can see it: every row's output is its own.

  launch         the rows in their batch order (no permutation)
  longest-first  the rows by descending context length, ties in batch order, padding rows (context 0) last
"""
from __future__ import annotations

import os

import numpy as np

ORDERS = ("launch", "longest-first")
# Read once at import, like the kernels' knobs (labkit/output.py records it with them). longest-first since session
# 19: nano FP8 36,173 / 36,180 against 33,278 / 34,742 tok/s in launch order, bf16 27,053 against 26,639, on the
# H200 (docs/perf.md).
DECODE_ORDER = os.environ.get("LABKIT_DECODE_ORDER", "longest-first")
if DECODE_ORDER not in ORDERS:
    raise ValueError(f"LABKIT_DECODE_ORDER: one of {', '.join(ORDERS)}, got {DECODE_ORDER!r}")


def longest_first(context_lens: list[int], rows: int | None = None) -> np.ndarray:
    """int32 [rows]: the rows by descending context length (stable); rows beyond len(context_lens) (a graph
    bucket's padding) follow in their order."""
    n = len(context_lens)
    rows = n if rows is None else rows
    if rows < n:
        raise ValueError(f"rows ({rows}) must cover the {n} context lengths")
    order = np.argsort(-np.asarray(context_lens, dtype=np.int64), kind="stable").astype(np.int32)
    return np.concatenate([order, np.arange(n, rows, dtype=np.int32)])
