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
    # torch.compile the small elementwise ops (engine/layers/fused.py: norms, RoPE, SiLU*up). Eagerly each is
    # 3-10 tiny kernels; compiled, one. Only worth its start-up cost where decode runs in CUDA graphs.
    compile_fused: bool = False
    # Our Triton kernels inside decode graphs, where cuBLAS/inductor are slow at decode sizes: a split-K GEMV
    # for matmuls of <= SMALL_GEMM_MAX_ROWS rows and one fused q/k RMSNorm + RoPE kernel.
    custom_kernels: bool = False
    # The one-pass Triton Gumbel-max sampler (engine/kernels/gumbel_sampler.py) for batches without top-k/top-p
    # (measured faster than the torch sampler on the H200: docs/perf.md).
    gumbel_sampler: bool = False

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
        """One of fused.py's functions as this engine runs it: compiled or plain. (Compiled in eager steps too:
        at 30 ms a prefill step of 128 tokens on the H200 against 56 ms with the plain ops' extra launches,
        docs/serving.md.)"""
        return fused.compiled(fn) if self.compile_fused else fn


def choose_kernels(config, device: torch.device) -> KernelChoice:
    """Config's asks (attention_backend, custom_kernels, enforce_eager) on this device."""
    cuda = device.type == "cuda"
    attention = resolve_attention_backend(config.attention_backend, device)
    load_backend(attention)  # imported now, before the model is built under a default device and dtype
    return KernelChoice(attention=attention,
                        compile_fused=cuda and not config.enforce_eager,
                        custom_kernels=cuda and bool(config.custom_kernels),
                        gumbel_sampler=cuda)
