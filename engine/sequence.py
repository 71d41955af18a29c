"""One request's state: its tokens, how far its KV is computed, and where that KV lives."""
from __future__ import annotations

from copy import copy
from enum import Enum, auto

from .sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    def __init__(self, token_ids: list[int], sampling_params: SamplingParams, seq_id: int, block_size: int,
                 request_id: str | None = None):
        self.seq_id = seq_id
        self.request_id = request_id if request_id is not None else str(seq_id)
        self.status = SequenceStatus.WAITING
        self.token_ids = copy(token_ids)
        self.last_token = token_ids[-1]
        self.num_tokens = len(token_ids)
        self.num_prompt_tokens = len(token_ids)
        # Tokens whose KV is written (prefix-cache hits count as written).
        self.num_cached_tokens = 0
        # Tokens the current step computes; postprocess folds them into num_cached_tokens.
        self.num_scheduled_tokens = 0
        self.block_size = block_size
        self.block_table: list[int] = []
        self.temperature = sampling_params.temperature
        self.max_tokens = sampling_params.max_tokens
        self.ignore_eos = sampling_params.ignore_eos
        self.top_k = sampling_params.top_k
        self.top_p = sampling_params.top_p
        self.finish_reason: str | None = None

    def __len__(self):
        return self.num_tokens

    def __getitem__(self, key):
        return self.token_ids[key]

    @property
    def is_finished(self):
        return self.status == SequenceStatus.FINISHED

    @property
    def num_completion_tokens(self):
        return self.num_tokens - self.num_prompt_tokens

    @property
    def completion_token_ids(self):
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_cached_blocks(self):
        return self.num_cached_tokens // self.block_size

    @property
    def num_blocks(self):
        return (self.num_tokens + self.block_size - 1) // self.block_size

    @property
    def last_block_num_tokens(self):
        return self.num_tokens - (self.num_blocks - 1) * self.block_size

    def block(self, i: int) -> list[int]:
        assert 0 <= i < self.num_blocks
        return self.token_ids[i * self.block_size: (i + 1) * self.block_size]

    def append_token(self, token_id: int):
        self.token_ids.append(token_id)
        self.last_token = token_id
        self.num_tokens += 1

    # --- pickling: what a tensor-parallel worker needs, compactly ---------------------------------
    # Workers only build model inputs, from the first position whose KV is not written yet: the whole
    # prompt on a first prefill, the uncached rest after a prefix hit or a preemption, the last token in
    # decode. So only those tokens travel; nothing else (sampling settings, status, request id) does.
    # (copy.copy / pickle of a Sequence therefore give this worker view, never a full Sequence.)
    def __getstate__(self):
        start = min(self.num_cached_tokens, self.num_tokens - 1)
        tail = self.last_token if start == self.num_tokens - 1 else self.token_ids[start:]
        return (self.seq_id, self.num_tokens, self.num_prompt_tokens, self.num_cached_tokens,
                self.num_scheduled_tokens, self.block_size, self.block_table, start, tail)

    def __setstate__(self, state):
        (self.seq_id, self.num_tokens, self.num_prompt_tokens, self.num_cached_tokens,
         self.num_scheduled_tokens, self.block_size, self.block_table, start, tail) = state
        if isinstance(tail, int):
            tail = [tail]
        self.token_ids = TokenTail(start, tail)
        self.last_token = tail[-1]


class TokenTail:
    """A worker's view of a sequence's tokens: positions from `start` on, indexed as the full list."""

    __slots__ = ("start", "tail")

    def __init__(self, start: int, tail: list[int]):
        self.start, self.tail = start, tail

    def __len__(self):
        return self.start + len(self.tail)

    def __getitem__(self, key):
        if isinstance(key, slice):
            lo, hi, step = key.indices(len(self))
            if lo >= hi:
                return []
            if lo < self.start:
                raise IndexError(f"token positions before {self.start} were not sent to this rank")
            return self.tail[lo - self.start:hi - self.start:step]
        if key < 0:
            key += len(self)
        if not self.start <= key < len(self):
            raise IndexError(f"token position {key} was not sent to this rank")
        return self.tail[key - self.start]
