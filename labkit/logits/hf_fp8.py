"""Transformers with an FP8 KV cache's arithmetic: the reference of the `fp8-kv` logits suite.

What the engine computes with kv_cache_dtype fp8 (engine/kv_quant.py): every K and V row x (after q/k norm and
RoPE) is stored as e4m3(clamp(x * (1 / scale), -448, 448)), rounded to nearest even, and attention reads the
stored values with the scale multiplied back in. An accepted implementation of the same arithmetic is
Transformers' own eager attention fed K and V that went through that round trip first:

    k' = e4m3(clamp(k * (1 / k_scale), +-448)) * k_scale,  v' likewise with v_scale,  then eager attention(q, k', v')

Every e4m3 value is exact in bf16, fp16 and fp32, and the scales are powers of two here (1.0, vLLM's default
without calibrated scales, as the engine's), so k' in the model dtype is exactly the value the engine's kernels
read: the two differ only in how each rounds the rest of its arithmetic, which is what the anchored gate measures
(labkit/logits/gates.py). The round trip is written here with torch's own cast, independently of the engine
(tests check it is bit-equal to engine.kv_quant.quantize), so a wrong engine quantiser does not hide in its
yardstick.

The attention function is registered with Transformers' AttentionInterface (and its mask builder with
AttentionMaskInterface, as "eager"'s), and a model loaded with attn_implementation=ATTENTION uses it.
"""
from __future__ import annotations

import functools

ATTENTION = "labkit_fp8_kv_eager"
FP8_MAX = 448.0          # the largest finite e4m3 (float8_e4m3fn) value
KV_SCALE = 1.0           # per-tensor K and V scale: the engine's default (engine/kv_quant.py), vLLM's uncalibrated one


def round_trip(x, scale: float = KV_SCALE):
    """x as an FP8 KV cache holds it, back in x's dtype: e4m3(clamp(x / scale, +-448)) * scale."""
    import torch

    inv = torch.tensor(1.0 / scale, dtype=torch.float32, device=x.device)
    q = (x.float() * inv).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).to(x.dtype)


@functools.lru_cache(maxsize=None)
def register(k_scale: float = KV_SCALE, v_scale: float = KV_SCALE) -> str:
    """Register the attention function (once per pair of scales); returns the attn_implementation name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward

    name = ATTENTION if (k_scale, v_scale) == (KV_SCALE, KV_SCALE) else f"{ATTENTION}_{k_scale:g}_{v_scale:g}"

    def fp8_kv_eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        return eager_attention_forward(module, query, round_trip(key, k_scale), round_trip(value, v_scale),
                                       attention_mask, scaling=scaling, dropout=dropout, **kwargs)

    AttentionInterface.register(name, fp8_kv_eager)
    AttentionMaskInterface.register(name, eager_mask)
    return name


def describe(k_scale: float = KV_SCALE, v_scale: float = KV_SCALE) -> dict:
    """What a collection records about the round trip."""
    return {"format": "float8_e4m3fn", "k_scale": k_scale, "v_scale": v_scale, "granularity": "per tensor",
            "how": "K and V after q/k norm and RoPE: e4m3(clamp(x * (1 / scale), +-448)) * scale, round to nearest "
                   "even, before Transformers' eager attention"}
