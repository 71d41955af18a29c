"""What one request may ask of an engine: the checks `add_request` makes, as a value a server can hold.

A server validates at its API boundary with the same object the engine uses, built from the engine's
real limits (`LLMEngine.limits`), so a request the frontend accepts is one the engine accepts.
"""
from __future__ import annotations

import dataclasses

from .sampling_params import SamplingParams


@dataclasses.dataclass(frozen=True)
class RequestLimits:
    max_model_len: int
    vocab_size: int
    block_size: int
    num_blocks: int
    # The longest text prompt read: max_model_len times the most characters one token stands for
    # (Tokenizer.max_chars_per_token). None: not bounded before tokenising.
    max_prompt_chars: int | None = None

    def check(self, token_ids: list[int], sp: SamplingParams, *, within_model_len: bool = False) -> None:
        """Raise ValueError naming the field a request breaks.

        within_model_len: also refuse prompt + max_tokens > max_model_len (vLLM's API rule). The engine
        itself is lenient there, as nano-vLLM is: a sequence that reaches max_model_len stops with "length".
        """
        n = len(token_ids)
        self.check_prompt_len(n)
        if within_model_len and n + sp.max_tokens > self.max_model_len:
            raise ValueError(f"max_tokens: prompt ({n} tokens) + max_tokens ({sp.max_tokens}) is more than "
                             f"max_model_len={self.max_model_len}; ask for at most {self.max_model_len - n}")
        if sp.top_k > self.vocab_size:
            raise ValueError(f"top_k: must be at most the vocabulary size {self.vocab_size} (or -1/0 for off), "
                             f"got {sp.top_k}")
        # The last sampled token never needs KV.
        longest = min(n + sp.max_tokens - 1, self.max_model_len)
        need = -(-longest // self.block_size)
        if need > self.num_blocks:
            raise ValueError(f"prompt: the request needs up to {need} KV blocks (prompt {n} + max_tokens "
                             f"{sp.max_tokens}) but the pool has {self.num_blocks}")

    def check_prompt_len(self, n: int) -> None:
        if n > self.max_model_len:
            raise ValueError(f"prompt: {n} tokens is longer than max_model_len={self.max_model_len}")

    def check_text(self, text: str, field: str = "prompt") -> str:
        """A text prompt no longer than max_model_len tokens could hold, checked on its length before it is
        tokenised (tokenising a long text costs seconds and memory), else ValueError naming `field`."""
        if self.max_prompt_chars is not None and len(text) > self.max_prompt_chars:
            raise ValueError(f"{field}: {len(text)} characters cannot fit in max_model_len={self.max_model_len} "
                             f"tokens (at most {self.max_prompt_chars} characters with this tokenizer)")
        return text

    def check_token_ids(self, token_ids) -> list[int]:
        """A non-empty list of ints in [0, vocab_size), else ValueError naming the prompt. Its length is
        looked at first: a list longer than max_model_len is refused without walking it."""
        if not isinstance(token_ids, (list, tuple)) or not token_ids:
            raise ValueError("prompt: expected a non-empty list of token ids"
                             + (" (empty)" if isinstance(token_ids, (list, tuple)) else ""))
        self.check_prompt_len(len(token_ids))
        for t in token_ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise ValueError(f"prompt: token id {t!r} is not an integer in [0, {self.vocab_size})")
        return list(token_ids)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
