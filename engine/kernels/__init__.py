"""Our Triton kernels. Shared here: how tl.dot must treat the inputs' dtype."""
from __future__ import annotations

import torch


def dot_precision(dtype: torch.dtype) -> str:
    # float32 inputs must not silently drop to TF32 on tensor cores: the reference is exact float32.
    return "ieee" if dtype == torch.float32 else "tf32"
