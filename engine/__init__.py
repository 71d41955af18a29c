"""labkit's inference engine (nano-vLLM lineage): `from engine import LLM, SamplingParams`.

The names load on first use (PEP 562 module __getattr__): importing a light module such as
engine.config (the CLI's choices) must not start torch and transformers.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["LLM", "LLMEngine", "SamplingParams"]

# public name -> the module that defines it
_HOME = {"LLM": ".llm", "LLMEngine": ".llm", "SamplingParams": ".sampling_params"}

if TYPE_CHECKING:  # for type checkers and readers; at run time __getattr__ loads them
    from .llm import LLM, LLMEngine
    from .sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name], __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
