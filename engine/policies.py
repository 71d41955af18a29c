"""Scheduling policies: which sequences a step serves. One class per policy, and the registry of them.

A policy answers one question each step, `pick(scheduler)`: which running sequences get a decode row and
which waiting ones a prefill row (and how many of their prompt tokens). It answers with the scheduler's
mechanics, which keep the queues and the KV pool consistent whatever the policy asks:

    scheduler.take_decodes(preempted, limit, rotate)     running sequences that decode now, from the head of
                                                          `running`; preempts from its tail when the pool is short
    scheduler.take_prefills(max_seqs, budget, any_chunk, admit)
                                                          (sequence, tokens) from the head of `waiting`
    scheduler.order_waiting(key)                          reorder `waiting` (a prompt mid-chunk stays first)
    scheduler.head_can_prefill()                          could the head of `waiting` prefill now?

Everything else (the BatchPlan, what the step does to the sequences, commit, preemption's bookkeeping) is the
scheduler's and the same for every policy. The class attributes tell the rest of the engine and labkit what
they need to know of a policy, so nothing outside this file compares a policy's name:

    mixes_phases           a step may hold decode rows and prefill chunks together: the runner captures CUDA
                           graphs for such steps (engine/mixed_graphs.py), the trace validator accepts them
    chunked_row            which prefill row of a step may stop short of its prompt: "first" (nano-vLLM: only
                           the first of a batch) or "last" (the one the budget ran out on)
    default_token_budget   max_num_batched_tokens when the user gives none

Adding a policy (docs/architecture.md walks through one): a subclass here with a `name`, registered with
@register; its choices then reach Config, every command's --scheduling-policy and the trace validator. Prove
it with a case file in workloads/cases/ and `labkit trace --case NAME` (tests/test_policies.py shows a toy,
shortest-prompt-first, run through the engine and the validator).
"""
from __future__ import annotations

from typing import ClassVar, NamedTuple

# nano-vLLM's max_num_batched_tokens.
NANO_TOKEN_BUDGET = 16384
# scheduling_policy="mixed"'s token budget when max_num_batched_tokens is not given. A mixed step carries every
# running decode plus up to this many prompt tokens, so a stream's gap between tokens is one such step: on one
# H200 a 2,048-token chunk of Qwen3-0.6B adds a few milliseconds to a decode step (docs/serving.md), where
# nano's 16,384 would stall every stream for a whole long prefill, which mixing exists to avoid.
MIXED_TOKEN_BUDGET = 2048


class Pick(NamedTuple):
    """A step's rows as a policy picked them: decode rows first, then prefill rows (sequence, tokens)."""
    decodes: list
    prefills: list
    preempted: list      # sequences preempted on the way (their blocks went back to the pool)


class SchedulingPolicy:
    """The base of every policy. A scheduler makes one instance (it may keep state between steps)."""

    name: ClassVar[str] = ""
    mixes_phases: ClassVar[bool] = False
    chunked_row: ClassVar[str] = "first"
    default_token_budget: ClassVar[int] = NANO_TOKEN_BUDGET

    def pick(self, s) -> Pick:
        """The next step's rows. `s` is the Scheduler; an empty Pick means nothing can run."""
        raise NotImplementedError

    def prefill_alone_next(self, s) -> bool:
        """Would pick() now make a prefill-only step? Read without changing anything. The overlapped step loop
        asks it before planning a step ahead (engine/step_loop.py): a prefill planned early leaves out the
        requests that arrive while the step before it runs. A hint only: either answer gives the same states."""
        return not self.mixes_phases and s.head_can_prefill()


POLICIES: dict[str, type[SchedulingPolicy]] = {}


def register(cls: type[SchedulingPolicy]) -> type[SchedulingPolicy]:
    """Make a policy class a choice of Config.scheduling_policy (under its `name`)."""
    if not cls.name or cls.chunked_row not in ("first", "last"):
        raise ValueError(f"{cls.__name__}: a policy needs a name and chunked_row 'first' or 'last'")
    POLICIES[cls.name] = cls
    return cls


def policy_class(name: str) -> type[SchedulingPolicy]:
    if name not in POLICIES:
        raise ValueError(f"scheduling_policy: must be one of {', '.join(POLICIES)}, got {name!r}")
    return POLICIES[name]


@register
class PrefillFirst(SchedulingPolicy):
    """nano-vLLM bb823b3: any prefill work wins, and a step never mixes phases; only the first sequence of a
    prefill batch may be chunked; decode preempts from the tail of `running`."""

    name = "prefill_first"

    def pick(self, s) -> Pick:
        preempted: list = []
        prefills = s.take_prefills(s.max_num_seqs, s.max_num_batched_tokens)
        decodes = [] if prefills else s.take_decodes(preempted)
        return Pick(decodes, prefills, preempted)


@register
class Balanced(SchedulingPolicy):
    """Alternates the phases when both can run (after a prefill step the running decodes go first), rotates
    served decode sequences to the tail of `running` so every sequence gets its turn, and takes the other
    phase when the chosen one cannot run."""

    name = "balanced"

    def __init__(self):
        self.last_was_prefill: bool | None = None

    def pick(self, s) -> Pick:
        preempted: list = []
        decodes, prefills = [], []
        for prefill in ((False, True) if self._decode_turn(s) else (True, False)):
            if prefill:
                prefills = s.take_prefills(s.max_num_seqs, s.max_num_batched_tokens)
            else:
                decodes = s.take_decodes(preempted, rotate=True)
            if prefills or decodes:
                self.last_was_prefill = prefill
                break
        return Pick(decodes, prefills, preempted)

    def _decode_turn(self, s) -> bool:
        return bool(self.last_was_prefill and s.running)

    def prefill_alone_next(self, s) -> bool:
        return not self._decode_turn(s) and s.head_can_prefill()


@register
class Mixed(SchedulingPolicy):
    """vLLM v1's chunked prefill: every running decode first, then prefill chunks of the waiting sequences, any
    of which may be chunked, in one step under one token budget; no new prompt in a step that had to preempt."""

    name = "mixed"
    mixes_phases = True
    chunked_row = "last"
    default_token_budget = MIXED_TOKEN_BUDGET

    def pick(self, s) -> Pick:
        preempted: list = []
        budget = s.max_num_batched_tokens
        decodes = s.take_decodes(preempted, limit=budget)
        # After a preemption nothing new is admitted (it would take the blocks the preemption just freed); a
        # prompt mid-chunk still goes on, or it could hold its blocks while nothing runs.
        prefills = s.take_prefills(s.max_num_seqs - len(decodes), budget - len(decodes), any_chunk=True,
                                   admit=not preempted)
        return Pick(decodes, prefills, preempted)
