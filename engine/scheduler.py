"""Which sequences run in the next step, and in which phase.

`prefill_first` is nano-vLLM bb823b3: any prefill work wins, and a step never mixes phases; only the
first sequence of a prefill batch may be chunked; decode preempts from the tail of `running`.
`balanced` alternates the phases when both can run, rotates served decode sequences to the tail of
`running` so every sequence gets its turn, and takes the other phase when the chosen one cannot run.
"""
from __future__ import annotations

from collections import deque

from .block_manager import BlockManager
from .config import Config
from .profiling import phase
from .sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, config: Config):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len
        self.policy = config.scheduling_policy
        self.eos = config.eos
        self.block_manager = BlockManager(config.num_kvcache_blocks, config.kvcache_block_size)
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.last_phase_prefill: bool | None = None
        # Sequences preempted by the last schedule() call, for the tracer.
        self.preempted: list[Sequence] = []

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: Sequence):
        self.waiting.append(seq)

    @phase("engine::schedule")
    def schedule(self) -> tuple[list[Sequence], bool]:
        self.preempted = []
        if self.policy == "balanced" and self.last_phase_prefill and self.running:
            order = (False, True)
        else:
            order = (True, False)
        for is_prefill in order:
            seqs = self._schedule_prefill() if is_prefill else self._schedule_decode()
            if seqs:
                self.last_phase_prefill = is_prefill
                return seqs, is_prefill
        raise RuntimeError("scheduler: nothing can run (the KV pool cannot hold the first waiting request)")

    def _schedule_prefill(self) -> list[Sequence]:
        scheduled: list[Sequence] = []
        num_batched_tokens = 0
        while self.waiting and len(scheduled) < self.max_num_seqs:
            seq = self.waiting[0]
            remaining = self.max_num_batched_tokens - num_batched_tokens
            if remaining == 0:
                break
            if not seq.block_table:
                num_cached_blocks = self.block_manager.can_allocate(seq)
                if num_cached_blocks == -1:
                    break
                num_tokens = seq.num_tokens - num_cached_blocks * self.block_manager.block_size
            else:  # the rest of a chunked prompt
                num_tokens = seq.num_tokens - seq.num_cached_tokens
            if remaining < num_tokens and scheduled:
                break  # only the first sequence of a batch may be chunked
            if not seq.block_table:
                self.block_manager.allocate(seq, num_cached_blocks)
            seq.num_scheduled_tokens = min(num_tokens, remaining)
            num_batched_tokens += seq.num_scheduled_tokens
            scheduled.append(seq)
            if seq.num_scheduled_tokens < num_tokens:
                break  # a chunk: it stays first in `waiting` and continues next step
            seq.status = SequenceStatus.RUNNING
            self.waiting.popleft()
            self.running.append(seq)
        return scheduled

    def _schedule_decode(self) -> list[Sequence]:
        scheduled: list[Sequence] = []
        while self.running and len(scheduled) < self.max_num_seqs:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                if self.running:
                    self.preempt(self.running.pop())
                else:
                    self.preempt(seq)
                    break
            else:
                seq.num_scheduled_tokens = 1
                self.block_manager.may_append(seq)
                scheduled.append(seq)
        if self.policy == "balanced":
            self.running.extend(scheduled)
        else:
            self.running.extendleft(reversed(scheduled))
        return scheduled

    def plan_next_decode(self, seqs: list[Sequence]) -> list[tuple[Sequence, int, list[int], int]] | None:
        """What the next schedule() will most likely return, worked out before this step's tokens are known
        (async scheduling: the runner launches that step while this one runs; the engine keeps it only if
        the real schedule() after postprocess matches it exactly). Assumes no sequence of `seqs` (this
        step's batch) samples EOS; every other outcome of postprocess is known now.

        Rows (seq, num_tokens, block_table, row in `seqs` or -1) of a decode step, or None when the next
        step is not a plain decode of the running sequences: a chunk or a waiting request (prefill next), a
        preemption, or a new block that still holds a prefix-cache entry. (The launched step writes one KV
        slot per row: into a block only that sequence holds, or into the new block the plan gives it, which
        must hold nothing anyone could read if the plan turns out wrong.)"""
        if self.waiting:
            return None
        row_of = {}
        finishing = set()
        for i, seq in enumerate(seqs):
            if seq.num_cached_tokens + seq.num_scheduled_tokens < seq.num_tokens:
                return None  # a chunk: its prompt goes on next step
            row_of[seq.seq_id] = i
            if seq.num_completion_tokens + 1 == seq.max_tokens or seq.num_tokens + 1 >= self.max_model_len:
                finishing.add(seq.seq_id)
        running = [seq for seq in self.running if seq.seq_id not in finishing][:self.max_num_seqs]
        if not running:
            return None
        bm = self.block_manager
        free = bm.free_block_ids
        rows, taken = [], 0
        for seq in running:
            row = row_of.get(seq.seq_id, -1)
            num_tokens = seq.num_tokens + (row >= 0)
            need = (num_tokens + bm.block_size - 1) // bm.block_size - len(seq.block_table)
            table = seq.block_table
            if need > 0:
                if taken + need > len(free):
                    return None  # someone would be preempted
                new = [free[taken + k] for k in range(need)]
                if any(bm.blocks[b].hash != -1 for b in new):
                    return None
                table = table + new
                taken += need
            rows.append((seq, num_tokens, table, row))
        return rows

    def preempt(self, seq: Sequence):
        seq.status = SequenceStatus.WAITING
        self.block_manager.deallocate(seq)
        if self.waiting and self.waiting[0].block_table:
            # A prompt is mid-chunk (possible only under `balanced`): it keeps its place, or the
            # preempted sequence could wait forever for the blocks that chunk holds.
            self.waiting.insert(1, seq)
        else:
            self.waiting.appendleft(seq)
        self.preempted.append(seq)

    def abort(self, seq: Sequence) -> bool:
        """Take a sequence out between steps (a cancelled request): its blocks go back to the pool
        (hashed blocks keep their prefix-cache entries). Returns False if it had already finished."""
        if seq.is_finished:
            return False
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.running.remove(seq)
        if seq.block_table:  # running, or waiting mid-chunk
            self.block_manager.deallocate(seq)
        seq.num_scheduled_tokens = 0
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = "abort"
        return True

    @phase("engine::postprocess")
    def postprocess(self, seqs: list[Sequence], token_ids: list[int]) -> list[bool]:
        """Fold the step's computed tokens into each sequence; accept its sampled token only when the
        whole known sequence is now computed (a chunk's candidate is discarded). Returns accepted flags."""
        accepted = []
        for seq, token_id in zip(seqs, token_ids):
            self.block_manager.hash_blocks(seq)
            seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            if seq.num_cached_tokens < seq.num_tokens:
                accepted.append(False)
                continue
            seq.append_token(token_id)
            accepted.append(True)
            if not seq.ignore_eos and token_id == self.eos:
                seq.finish_reason = "stop"
            elif seq.num_completion_tokens == seq.max_tokens:
                seq.finish_reason = "length"
            elif seq.num_tokens >= self.max_model_len:
                # Not in nano (it would run past its RoPE table); vLLM stops at the context limit too.
                seq.finish_reason = "length"
            if seq.finish_reason is not None:
                seq.status = SequenceStatus.FINISHED
                self.block_manager.deallocate(seq)
                self.running.remove(seq)
        return accepted
