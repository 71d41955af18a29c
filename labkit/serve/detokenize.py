"""Incremental detokenisation: each new token costs O(1), not a re-decode of the whole output.

tokenizers' DecodeStream keeps the few trailing ids a partial UTF-8 character needs and returns text as
soon as it is complete (None meanwhile), so a streamed reply never shows half a character. At the end of a
request `flush()` lets out what it still holds back, rendered as a full decode renders it (U+FFFD for a
character the output stopped in the middle of): the streamed text then equals the non-streamed text.
"""
from __future__ import annotations

from tokenizers.decoders import DecodeStream


def backend(tokenizer):
    """The Rust tokenizer behind a transformers "fast" tokenizer (the tokenizer itself otherwise)."""
    return getattr(tokenizer, "backend_tokenizer", tokenizer)


def decode(tokenizer, token_ids, skip_special_tokens: bool = True) -> str:
    """A whole output at once, with the same decoder the stream uses (no transformers-side clean-up), so
    both paths give the same text."""
    return backend(tokenizer).decode(list(token_ids), skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self._tokenizer = backend(tokenizer)
        self._skip = skip_special_tokens
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._held: list[int] = []   # ids DecodeStream has taken but not yet turned into text
        self._last: list[int] = []   # the ids of the last piece it let out: the context `flush` decodes after

    def add(self, token_ids) -> str:
        step, tok = self._stream.step, self._tokenizer
        parts = []
        for t in token_ids:
            self._held.append(t)
            piece = step(tok, t)
            if piece:
                parts.append(piece)
                self._last, self._held = self._held, []
        return "".join(parts)

    def flush(self) -> str:
        """The text of the ids still held back. Decoded after the last piece's ids, so that what a decoder
        does at a boundary (a byte sequence completed, a leading space) comes out as in a full decode."""
        if not self._held:
            return ""
        held, self._held = self._held, []
        dec = self._tokenizer.decode
        head = dec(self._last, skip_special_tokens=self._skip)
        whole = dec(self._last + held, skip_special_tokens=self._skip)
        return whole[len(head):] if whole.startswith(head) else dec(held, skip_special_tokens=self._skip)
