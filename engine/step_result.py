"""What one engine step did, as `LLMEngine.step()` returns it: the one thing callers read of a step.

Tracers, servers, benches and the logits lab read this rather than the scheduler's or runner's insides.
It is built from the step's BatchPlan, what its commit returned and the scheduler's snapshot, nothing else.
It is columnar (one list per field, in batch order) because it is built on every step of the hot loop:
a few list comprehensions cost far less than an object per sequence. `seqs` gives the per-sequence view.
Token ids are plain ints and nothing but `inputs` (the runner's host-side StepInputs) is an engine object,
so a server can ship the rest across a process boundary as it is.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple


class SeqStep(NamedTuple):
    """One scheduled sequence after the step."""
    seq_id: int
    request_id: str
    num_scheduled_tokens: int     # tokens this step computed for it
    num_cached_tokens: int        # tokens whose KV is now written
    num_tokens: int               # prompt + completion tokens so far
    token_id: int | None          # the completion token this step added; None for a chunk (candidate dropped)
    finish_reason: str | None     # "stop" | "length" once finished, else None


@dataclasses.dataclass(frozen=True, slots=True)
class StepResult:
    step: int                         # engine step number, from 1
    phase: str                        # "prefill" | "decode" | "mixed" (decode rows first, then prefill chunks)
    # One entry per scheduled sequence, in batch order.
    seq_ids: list[int]
    request_ids: list[str]
    num_scheduled_tokens: list[int]
    num_cached_tokens: list[int]
    num_tokens: list[int]
    token_ids: list[int | None]       # None for a chunk (it samples nothing), or a row discarded because its
                                      # sequence stopped or was aborted after the step was launched
    finish_reasons: list[str | None]
    preempted: list[int]              # seq ids this step's scheduling preempted
    inputs: object                    # the runner's StepInputs (host lists: ids, positions, slots, ...)
    # Engine state once the step is done (with async scheduling: when the next step began scheduling).
    num_waiting: int
    num_running: int
    num_free_blocks: int
    num_blocks: int
    # Prefix cache over this step's first-time block allocations, in tokens (vLLM's queries / hits).
    prefix_cache_queries: int
    prefix_cache_hits: int
    # Rows [0, num_decodes) are decodes (one token each), the rest prefill rows (a chunk or a whole prompt);
    # starts: each row's first position computed now, i.e. the KV tokens it read that earlier steps (or the
    # prefix cache) wrote. What a per-step record (ForwardPassMetrics) reports of the batch.
    num_decodes: int
    starts: list[int]

    @classmethod
    def of(cls, n: int, plan, inputs, tokens: list, reasons: list, after, prefix: tuple[int, int]) -> "StepResult":
        """From the plan, its inputs, what its commit returned, the scheduler's snapshot once the step was done
        (`after`) and the prefix-cache queries and hits its scheduling added."""
        cached = [0 if r is not None else (s + k if t is not None or not ok else s)
                  for s, k, t, r, ok in zip(plan.starts, plan.num_new, tokens, reasons, plan.samples)]
        return cls(n, plan.phase, plan.seq_ids, plan.request_ids, plan.num_new, cached,
                   [t + (tok is not None) for t, tok in zip(plan.num_tokens, tokens)], tokens, reasons,
                   plan.preempted, inputs, *after.queues, after.num_blocks, *prefix, plan.num_decodes, plan.starts)

    @property
    def batch_size(self) -> int:
        return len(self.seq_ids)

    @property
    def num_computed_tokens(self) -> int:
        return sum(self.num_scheduled_tokens)

    @property
    def num_new_tokens(self) -> int:
        return sum(t is not None for t in self.token_ids)

    @property
    def seqs(self) -> list[SeqStep]:
        return [SeqStep(*row) for row in zip(self.seq_ids, self.request_ids, self.num_scheduled_tokens,
                                             self.num_cached_tokens, self.num_tokens, self.token_ids,
                                             self.finish_reasons)]

    @property
    def finished(self) -> list[SeqStep]:
        return [s for s in self.seqs if s.finish_reason is not None]

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of the KV pool's blocks in use (vLLM's kv_cache_usage_perc, 0..1)."""
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0


class StepFailed(RuntimeError):
    """A step raised. The engine took the step's sequences out (their KV blocks are back in the pool,
    finish_reason "error") and is usable again unless `fatal` (its tensor-parallel workers are gone)."""

    def __init__(self, message: str, seq_ids: list[int], request_ids: list[str], fatal: bool):
        super().__init__(message)
        self.seq_ids = seq_ids
        self.request_ids = request_ids
        self.fatal = fatal
