"""Attention backends. Each module provides store_kvcache, prefill and decode with the same signatures."""
from __future__ import annotations

import importlib


def load_backend(name: str):
    modules = {"torch": "torch_ref", "triton": "triton_attn", "flash_attn": "flash_attn_backend"}
    return importlib.import_module(f"{__name__}.{modules[name]}")
