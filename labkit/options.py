"""Choices shared by the commands' options, one definition each (their values are engine Config values)."""
from __future__ import annotations

import enum


class DType(str, enum.Enum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class Attention(str, enum.Enum):
    auto = "auto"
    flash_attn = "flash_attn"
    triton = "triton"
    torch = "torch"


class Policy(str, enum.Enum):
    prefill_first = "prefill_first"
    balanced = "balanced"


class Backend(str, enum.Enum):
    """Who computes: our engine, or Transformers as the reference / baseline."""

    engine = "engine"
    hf = "hf"
