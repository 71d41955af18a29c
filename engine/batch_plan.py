"""One engine step as the scheduler decided it: which sequences compute which tokens now.

The scheduler returns a BatchPlan for every step and every later stage reads the plan and nothing else:
the runner builds the model inputs from it (on every tensor-parallel rank: the plan is what travels to
the workers), the sampler draws for the rows that sample, the tracer records it and StepResult reports it.
It is a value: ids and counts, frozen once built; the scheduler keeps its own Sequence objects for it.
Prefill, decode and mixed are properties of a plan, not modes of the engine.

A row is one scheduled sequence. Decode rows come first (one token each: the sequence's last token, at
position len - 1), then prefill rows (a chunk of the prompt, or all of it, from its first uncached
position). A row samples when its tokens reach the end of the sequence; a chunk that stops short of the
end computes KV only. The columns are plain lists (the hot loop builds one plan per step).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(slots=True, eq=False, frozen=True)
class BatchPlan:
    seq_ids: list[int]
    request_ids: list[str]
    num_decodes: int              # rows [0, num_decodes) are decodes, the rest prefill chunks
    starts: list[int]             # each row's first position computed now (its tokens already cached)
    num_new: list[int]            # how many tokens each row computes now
    num_tokens: list[int]         # each row's sequence length when scheduled
    input_ids: list[int]          # the new tokens, row after row (a placeholder's entry is 0)
    block_tables: list[list[int]]
    # Async scheduling: the input of decode row i is the token the step before sampled in its row
    # from_previous[i] (still on the device when this plan was made); -1 where the token is known.
    # None when every input is known.
    from_previous: list[int] | None = None
    preempted: list[int] = field(default_factory=list)    # seq ids preempted while this plan was made
    # Rank 0 only (never sent to tensor-parallel workers): the sampling settings of each sampling row.
    sampling: list | None = None
    step: int = 0                 # the scheduler's number for it (its own sequences for the plan go by it)

    def __len__(self) -> int:
        return len(self.seq_ids)

    @property
    def phase(self) -> str:
        if self.num_decodes == len(self.seq_ids):
            return "decode"
        return "prefill" if self.num_decodes == 0 else "mixed"

    @property
    def samples(self) -> list[bool]:
        """Per row: does the step sample a token for it (its tokens reach the end of the sequence)?"""
        return [s + n == t for s, n, t in zip(self.starts, self.num_new, self.num_tokens)]

    @property
    def sample_rows(self) -> list[int]:
        return [i for i, ok in enumerate(self.samples) if ok]

    @property
    def num_computed_tokens(self) -> int:
        return len(self.input_ids)

    def for_workers(self) -> "BatchPlan":
        """What a tensor-parallel worker needs (everything but the sampling settings and names)."""
        return BatchPlan(self.seq_ids, [], self.num_decodes, self.starts, self.num_new, self.num_tokens,
                         self.input_ids, self.block_tables, self.from_previous, step=self.step)

    # A plan crosses to the workers every step: as a bare tuple, not a dict of field names.
    def __getstate__(self):
        return tuple(getattr(self, f) for f in _FIELDS)

    def __setstate__(self, state):
        for f, value in zip(_FIELDS, state):
            object.__setattr__(self, f, value)  # (frozen: a plan is a value once built)


_FIELDS = tuple(f.name for f in fields(BatchPlan))
