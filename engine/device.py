"""Every device choice in one place: compute device, dtype, attention backend, collective backend."""
from __future__ import annotations

import importlib.util
import os

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device: 'cuda' was asked for but no CUDA GPU is available")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(name)


def resolve_dtype(name: str, hf_config) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = _DTYPES.get(dtype, torch.float32)
    return dtype


def resolve_attention_backend(name: str, device: torch.device) -> str:
    """`auto` takes only the paths measured here: our Triton kernels on CUDA (the torch reference where Triton is
    missing), torch on the CPU. flash_attn stays a choice a user makes by name, installed or not: no GPU run of
    this project has measured it (docs/perf.md), so installing it must not change what `auto` runs."""
    if name == "auto":
        if device.type == "cuda" and importlib.util.find_spec("triton") is not None and _has_triton_backend():
            return "triton"
        return "torch"
    if name == "triton" and device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return name  # Triton's interpreter runs the kernels on the CPU (slowly): used to test them without a GPU
    if name in ("flash_attn", "triton") and device.type != "cuda":
        raise ValueError(f"attention_backend: {name!r} needs a CUDA device; use 'torch' on {device.type}")
    if name == "flash_attn" and importlib.util.find_spec("flash_attn") is None:
        raise ValueError("attention_backend: 'flash_attn' is not installed (pip install flash-attn, or use "
                         "'triton'/'torch')")
    if name == "triton" and not _has_triton_backend():
        raise ValueError("attention_backend: the 'triton' backend is not available in this build")
    return name


def _has_triton_backend() -> bool:
    return importlib.util.find_spec("engine.backends.triton_attn") is not None


def collective_backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


_SM_COUNTS: dict[int, int] = {}


def num_sms(device: torch.device, off_cuda: int) -> int:
    """Streaming multiprocessors of a CUDA device (cached: kernels size their grids from it every call);
    `off_cuda` where there is none (Triton's CPU interpreter, where grids are exercised, not timed)."""
    if device.type != "cuda":
        return off_cuda
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNTS:
        _SM_COUNTS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNTS[idx]
