"""labkit's inference engine (nano-vLLM lineage): `from engine import LLM, SamplingParams`."""
from .llm import LLM, LLMEngine
from .sampling import SamplingParams

__all__ = ["LLM", "LLMEngine", "SamplingParams"]
