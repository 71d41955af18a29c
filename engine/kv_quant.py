"""The KV cache's storage dtype: the model's own (kv_cache_dtype="auto") or FP8 E4M3 with fp32 scales ("fp8",
vLLM's flag and Config field name).

What attention computes with FP8, on every path (the Triton kernels, the torch reference, prefill and decode):
a K or V row x is stored as q = e4m3(clamp(x * (1 / scale), -448, 448)), rounded to nearest even, a NaN as 0 (so
the pool never holds a NaN: a finite stale row times a zero probability is zero, which the keys-contiguous V
layout's unmasked tiles rely on, engine/kv_layout.py; the token's own output still carries the NaN through its
residual stream); attention
reads q exactly (every e4m3 value is exact in fp16 and fp32), multiplies the scale into the scores (K) and into
the output (V), and takes the softmax probabilities into the value product in float16 for a 16-bit model (float32
for a float32 one): e4m3 -> float16 is one Hopper instruction for two values, where bfloat16 needs a second
conversion a value, which bounded the decode kernel at half the FP8 bytes' speed (docs/perf.md). So a prefix-cache
hit, a chunk's earlier part and this step's own tokens are all seen
as stored: chunking and caching never change what a token attends to, as with the model dtype.

The scales are per tensor (one K and one V scale per layer), 1.0 by default as in vLLM when no calibrated
scales are given: E4M3 is a float format, so the scale only moves where saturation (448) and the subnormal
floor (2^-9) sit, and Qwen3's normed keys and its values sit well inside that range."""
from __future__ import annotations

import torch

from .config import KV_CACHE_DTYPES  # noqa: F401 - the choices, declared with the other Config choices

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def fp8_compute_dtype(model_dtype: torch.dtype) -> torch.dtype:
    """The dtype attention computes in over an FP8 pool: float16 for a 16-bit model, else the model's."""
    return torch.float16 if model_dtype in (torch.bfloat16, torch.float16) else model_dtype


def is_fp8(kv_cache_dtype: str) -> bool:
    return kv_cache_dtype in ("fp8", "fp8_e4m3")


def cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The pool's element type."""
    return FP8 if is_fp8(kv_cache_dtype) else model_dtype


def quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x (any float dtype) -> e4m3, as the KV-write kernel stores it."""
    inv = torch.tensor(1.0 / scale, dtype=torch.float32)
    y = x.float() * inv
    return torch.where(y.isnan(), 0.0, y).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def as_stored(x: torch.Tensor, cache: torch.Tensor, scale: float) -> torch.Tensor:
    """x as attention sees it once written to `cache`: unchanged for a model-dtype cache, else its e4m3 values
    (in float32, the scale not applied: the caller multiplies it in where the kernels do)."""
    if cache.dtype != FP8:
        return x
    return quantize(x, scale).float()
