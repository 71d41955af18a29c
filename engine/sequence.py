"""One request's state: its tokens, how far its KV is computed, and where that KV lives."""
from __future__ import annotations

from copy import copy
from enum import Enum, auto

from .in_flight import InFlight
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
        # Tokens whose KV is written, or queued on the device by a step already launched (prefix-cache hits
        # count as written).
        self.num_cached_tokens = 0
        # Leading blocks whose prefix-cache hash is registered (BlockManager.hash_blocks).
        self.num_hashed_blocks = 0
        # Async scheduling: how many of the last tokens are placeholders for tokens that launched steps sample
        # (their values reach the host as those steps commit; until then token_ids holds -1 there).
        self.pending = 0
        # The rows of launched, uncommitted steps for this sequence, and how to take the latest back.
        self.flight = InFlight()
        self.block_size = block_size
        self.block_table: list[int] = []
        self.sampling_params = sampling_params
        self.max_tokens = sampling_params.max_tokens
        self.ignore_eos = sampling_params.ignore_eos
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
    def num_blocks(self):
        return (self.num_tokens + self.block_size - 1) // self.block_size

    def block(self, i: int) -> list[int]:
        assert 0 <= i < self.num_blocks
        return self.token_ids[i * self.block_size: (i + 1) * self.block_size]

    def append_token(self, token_id: int):
        self.token_ids.append(token_id)
        self.last_token = token_id
        self.num_tokens += 1

    def append_placeholder(self):
        """A token the step just scheduled will sample: its length counts now, its value comes at commit."""
        self.append_token(-1)
        self.pending += 1

    def fill_placeholder(self, token_id: int):
        """The oldest placeholder's value has arrived (steps commit in the order they were scheduled)."""
        self.token_ids[self.num_tokens - self.pending] = token_id
        self.pending -= 1
        self.last_token = self.token_ids[-1]

    def drop_placeholder(self):
        """Undo the newest append_placeholder (its row was discarded)."""
        self.token_ids.pop()
        self.num_tokens -= 1
        self.pending -= 1
        self.last_token = self.token_ids[-1]

    @property
    def num_known_tokens(self) -> int:
        """Tokens whose values are on the host (all but the placeholders at the end)."""
        return self.num_tokens - self.pending
