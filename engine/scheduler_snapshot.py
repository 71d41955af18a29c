"""What the scheduler's queues and KV pool hold at one moment, as a read-only value (Scheduler.snapshot()).

The engine's readers of scheduler state (the step events a tracer gets, LLMEngine.stats(), the queue and block
counts of a StepResult, the prefix-cache counts of a step) read this and nothing else of the scheduler, so the
scheduler may keep its queues and pool as it likes. Ids and counts only: no live Sequence or Block leaves it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SeqState:
    """One sequence of a plan's rows, as it is now."""
    seq_id: int
    request_id: str
    num_tokens: int
    num_cached_tokens: int
    num_completion_tokens: int
    status: str                          # WAITING | RUNNING | FINISHED
    finish_reason: str | None
    block_table: tuple[int, ...]
    ref_counts: tuple[int, ...]          # of its blocks
    held_ref_counts: tuple[int, ...]     # now, of the blocks its row held when the plan was made


@dataclass(frozen=True, slots=True)
class SchedulerSnapshot:
    waiting_ids: tuple[int, ...]         # the waiting queue's seq ids, in queue order
    running_ids: tuple[int, ...]
    free_blocks: int
    num_blocks: int
    prefix_queries: int                  # prefix-cache lookups so far, in tokens (vLLM's queries / hits)
    prefix_hits: int
    rows: tuple[SeqState, ...] = ()      # the sequences of the plan it was asked about, in row order

    @property
    def queues(self) -> tuple[int, int, int]:
        """(waiting, running, free blocks): what a StepResult reports."""
        return len(self.waiting_ids), len(self.running_ids), self.free_blocks
