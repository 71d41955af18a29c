"""Incremental detokenisation: each new token costs O(1), not a re-decode of the whole output.

tokenizers' DecodeStream keeps the few trailing ids a partial UTF-8 character needs and returns text as
soon as it is complete (None meanwhile), so a streamed reply never shows half a character.
"""
from __future__ import annotations

from tokenizers.decoders import DecodeStream


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        # The Rust tokenizer behind a transformers "fast" tokenizer.
        self._tokenizer = getattr(tokenizer, "backend_tokenizer", tokenizer)
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def add(self, token_ids) -> str:
        step, tok = self._stream.step, self._tokenizer
        parts = [piece for piece in (step(tok, t) for t in token_ids) if piece]
        return "".join(parts)
