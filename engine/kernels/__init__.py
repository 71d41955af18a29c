"""Our Triton kernels. Shared here: how tl.dot must treat the inputs' dtype."""
from __future__ import annotations

import inspect

import torch
import triton


def unaligned(*names: str) -> dict:
    """triton.jit keywords that stop it specialising these pointer arguments on their 16-byte alignment (one
    compiled variant whatever the address); none where this Triton has no such keyword."""
    if "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters:
        return {"do_not_specialize_on_alignment": list(names)}
    return {}


def dot_precision(dtype: torch.dtype) -> str:
    # float32 inputs must not silently drop to TF32 on tensor cores: the reference is exact float32.
    return "ieee" if dtype == torch.float32 else "tf32"
