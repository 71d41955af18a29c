"""Which implementation each swappable piece of a step uses, decided once per runner from Config and the
device. The runner hands the choice to the model; each layer keeps what it needs when it is built, so no
module-level switch has to be set before (and reset after) the model is constructed."""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from .backends import load_backend
from .device import resolve_attention_backend
from .layers import fused

# The largest row count (tokens in a step) our Triton GEMV serves; above it cuBLAS's tiles fill the GPU.
SMALL_GEMM_MAX_ROWS = 16


@dataclass(frozen=True)
class KernelChoice:
    # The attention backend (engine/backends): "flash_attn" | "triton" | "torch".
    attention: str = "torch"
    # Our Triton kernels for the small elementwise ops (engine/kernels/elementwise.py: the norms and SiLU*up;
    # engine/kernels/qk_norm_rope.py: q/k norm + RoPE), in every step: eagerly each is 3-10 tiny torch kernels,
    # here one. Off with --eager, which keeps plain torch's numbers bit for bit.
    fused_elementwise: bool = False
    # Our Triton split-K GEMV inside decode graphs, where cuBLAS is slow at decode sizes: matmuls of
    # <= SMALL_GEMM_MAX_ROWS rows.
    custom_kernels: bool = False
    # The one-pass Triton Gumbel-max sampler (engine/kernels/gumbel_sampler.py) for batches without top-k/top-p
    # (measured faster than the torch sampler on the H200: docs/perf.md).
    gumbel_sampler: bool = False
    # Decode graphs of <= 16 rows through engine/fused_decode.py (five kernels a layer, PDL-chained).
    fused_decode: bool = False

    @property
    def backend(self) -> ModuleType:
        """The attention backend's module (store_kvcache, prefill, decode and its two flags below)."""
        return load_backend(self.attention)

    @property
    def graph_safe(self) -> bool:
        """The backend's decode can be captured in a CUDA graph."""
        return self.backend.GRAPH_SAFE

    @property
    def prefill_block_tables(self) -> bool:
        """The backend's prefill reads every key through the pool, so it needs block tables in every prefill
        (nano-vLLM passes them only when a sequence attends to a cached prefix)."""
        return self.backend.NEEDS_PREFILL_BLOCK_TABLES

    def elementwise(self, fn):
        """One of fused.py's functions as this engine runs it: our kernel for it, or the plain torch function.
        (Fused in eager steps too: at 30 ms a prefill step of 128 tokens on the H200 against 56 ms with the
        plain ops' extra launches, docs/serving.md.)"""
        if not self.fused_elementwise:
            return fn
        from .kernels import elementwise

        return {fused.rms_norm: elementwise.rms_norm, fused.add_rms_norm: elementwise.add_rms_norm,
                fused.silu_and_mul: elementwise.silu_and_mul}[fn]


def choose_kernels(config, device: torch.device) -> KernelChoice:
    """Config's asks (attention_backend, custom_kernels, enforce_eager) on this device."""
    cuda = device.type == "cuda"
    attention = resolve_attention_backend(config.attention_backend, device)
    backend = load_backend(attention)  # imported now, before the model is built under a default device and dtype
    if config.kv_cache_dtype != "auto" and not backend.FP8_KV:
        raise ValueError(f"kv_cache_dtype: {config.kv_cache_dtype} needs attention_backend triton or torch "
                         f"({attention}'s kernels read the pool in the model dtype)")
    custom = cuda and bool(config.custom_kernels)
    return KernelChoice(attention=attention,
                        fused_elementwise=cuda and not config.enforce_eager,
                        custom_kernels=custom,
                        gumbel_sampler=cuda,
                        fused_decode=custom and bool(config.fused_decode) and attention == "triton"
                        and config.tensor_parallel_size == 1)
