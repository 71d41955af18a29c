"""The scheduler's mechanics: queues, KV blocks, the BatchPlan of a step, and what a step's tokens do.

Which sequences a step serves is its policy's choice (engine/policies.py: prefill_first, nano-vLLM's default;
balanced; mixed); the policy picks with the mechanics here (take_decodes, take_prefills, order_waiting), which
keep the queues and the pool consistent whatever it asks.

A step has two moments. `schedule()` picks the rows and at once folds in what the step will do whatever it
samples: the computed tokens count as cached, a sampling row gets a placeholder token, a sequence that
reaches max_tokens or max_model_len finishes. `commit(plan, token_ids)` fills the placeholders with the
sampled tokens and stops sequences on EOS. In the synchronous step loop the two follow each other. In the
overlapped one the next step is scheduled between them, while the device still runs this one
(engine/step_loop.py): it sees every state a synchronous engine would, except an EOS not yet known, which
costs that row one wasted token.
"""
from __future__ import annotations

from collections import deque

from .batch_plan import BatchPlan
from .block_manager import BlockManager
from .config import Config
from .in_flight import take_back
from .policies import policy_class
from .profiling import phase
from .scheduler_snapshot import SchedulerSnapshot, SeqState
from .sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, config: Config):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len
        self.policy = policy_class(config.scheduling_policy)()
        self.eos = config.eos
        self.block_manager = BlockManager(config.num_kvcache_blocks, config.kvcache_block_size)
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        # Sequences that finished as a step was scheduled, in row order: each frees its blocks (after hashing them)
        # once its cached tokens' values are all known, and never before one ahead of it, so the free list takes
        # back blocks in the order a synchronous engine gives them back.
        self._releasing: list[Sequence] = []
        # The plans made (each one's BatchPlan.step), and this scheduler's own Sequences of each plan's rows: until
        # it commits (or fails), and the last committed one's, whose state the step events read after the commit.
        self._planned = 0
        self._rows: dict[int, list[Sequence]] = {}
        self._committed: tuple[int, list[Sequence]] = (0, [])

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: Sequence):
        self.waiting.append(seq)

    def next_is_eager_prefill(self) -> bool:
        """Would schedule() now make a prefill-only step? (The policy's hint, read without changing anything.)"""
        return self.policy.prefill_alone_next(self)

    def head_can_prefill(self) -> bool:
        """Could the head of `waiting` prefill now (it holds blocks mid-chunk, or the pool can take it)?"""
        if not self.waiting:
            return False
        seq = self.waiting[0]
        return not seq.pending and (bool(seq.block_table) or self.block_manager.can_allocate(seq) != -1)

    # --- choosing a step ------------------------------------------------------------------------
    @phase("engine::schedule")
    def schedule(self) -> BatchPlan:
        """The next step's plan, as the policy picks it (raises when nothing can run although sequences wait)."""
        decodes, prefills, preempted = self.policy.pick(self)
        if not decodes and not prefills:
            raise RuntimeError("scheduler: nothing can run (the KV pool cannot hold the first waiting request)")
        plan = self._plan(decodes, prefills, preempted)
        self._fold(decodes + [seq for seq, _ in prefills], plan)
        return plan

    # --- the mechanics a policy picks with -------------------------------------------------------
    def take_prefills(self, max_seqs: int, budget: int, any_chunk: bool = False,
                      admit: bool = True) -> list[tuple[Sequence, int]]:
        """(sequence, tokens) of waiting sequences, from the head of `waiting`, under `budget` tokens.
        nano's rule: only the first of them may be chunked; with `any_chunk` the last one may be too.
        Without `admit`, only a sequence that already holds blocks (mid-chunk) is taken."""
        scheduled: list[tuple[Sequence, int]] = []
        num_batched_tokens = 0
        bm = self.block_manager
        while self.waiting and len(scheduled) < max_seqs:
            seq = self.waiting[0]
            remaining = budget - num_batched_tokens
            if remaining <= 0 or seq.pending:
                break  # (a sequence preempted with a token still in flight re-prefills once it is known)
            if not seq.block_table:
                if not admit:
                    break
                num_cached_blocks = bm.can_allocate(seq)
                if num_cached_blocks == -1:
                    break
                num_tokens = seq.num_tokens - num_cached_blocks * bm.block_size
            else:  # the rest of a chunked prompt
                num_tokens = seq.num_tokens - seq.num_cached_tokens
            if remaining < num_tokens and scheduled and not any_chunk:
                break  # only the first sequence of a batch may be chunked
            if not seq.block_table:
                bm.allocate(seq, num_cached_blocks)
            n = min(num_tokens, remaining)
            num_batched_tokens += n
            scheduled.append((seq, n))
            if n < num_tokens:
                break  # a chunk: it stays first in `waiting` and continues next step
            seq.status = SequenceStatus.RUNNING
            self.waiting.popleft()
            self.running.append(seq)
        return scheduled

    def take_decodes(self, preempted: list[Sequence], limit: int | None = None, rotate: bool = False) -> list[Sequence]:
        """Running sequences that decode now (at most `limit`, and max_num_seqs), from the head of `running`; when
        the pool cannot take a sequence's next token, sequences are preempted from the tail (into `preempted`).
        The served ones go back to the head of `running` (nano), or with `rotate` to its tail (everyone gets a
        turn when fewer fit than run)."""
        scheduled: list[Sequence] = []
        limit = self.max_num_seqs if limit is None else min(self.max_num_seqs, limit)
        while self.running and len(scheduled) < limit:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                if self.running:
                    self.preempt(self.running.pop(), preempted)
                else:
                    self.preempt(seq, preempted)
                    break
            else:
                self.block_manager.may_append(seq)
                scheduled.append(seq)
        if rotate:
            self.running.extend(scheduled)
        else:
            self.running.extendleft(reversed(scheduled))
        return scheduled

    def order_waiting(self, key) -> None:
        """Sort `waiting` by `key` (stable), but for a prompt mid-chunk: it holds blocks, and stays first."""
        held = [self.waiting.popleft()] if self.waiting and self.waiting[0].block_table else []
        self.waiting = deque(held + sorted(self.waiting, key=key))

    def preempt(self, seq: Sequence, preempted: list[Sequence]):
        seq.status = SequenceStatus.WAITING
        self.block_manager.deallocate(seq)
        if self.waiting and self.waiting[0].block_table:
            # A prompt is mid-chunk (possible under `balanced` and `mixed`): it keeps its place, or the
            # preempted sequence could wait forever for the blocks that chunk holds.
            self.waiting.insert(1, seq)
        else:
            self.waiting.appendleft(seq)
        preempted.append(seq)

    def _plan(self, decodes: list[Sequence], prefills: list[tuple[Sequence, int]],
              preempted: list[Sequence]) -> BatchPlan:
        seqs = decodes + [seq for seq, _ in prefills]
        starts = [seq.num_tokens - 1 for seq in decodes] + [seq.num_cached_tokens for seq, _ in prefills]
        num_new = [1] * len(decodes) + [n for _, n in prefills]
        input_ids = [seq.last_token for seq in decodes]
        from_previous = None
        if any(seq.pending for seq in decodes):
            # The last token of these is sampled by the step in flight: the runner reads it on the device.
            from_previous = [seq.flight.sample_row if seq.pending else -1 for seq in decodes]
            input_ids = [0 if seq.pending else t for seq, t in zip(decodes, input_ids)]
        for (seq, n), start in zip(prefills, starts[len(decodes):]):
            input_ids.extend(seq.token_ids[start:start + n])
        num_tokens = [s.num_tokens for s in seqs]
        sampling = [seq.sampling_params for seq, s, n, t in zip(seqs, starts, num_new, num_tokens) if s + n == t]
        self._planned += 1
        self._rows[self._planned] = seqs
        return BatchPlan([s.seq_id for s in seqs], [s.request_id for s in seqs], len(decodes), starts, num_new,
                         num_tokens, input_ids, [list(s.block_table) for s in seqs], from_previous,
                         [s.seq_id for s in preempted], sampling, self._planned)

    def _fold(self, seqs: list[Sequence], plan: BatchPlan) -> None:
        """What the step does whatever it samples: its tokens count as cached, each sampling row appends a
        placeholder, and a sequence that reaches max_tokens or max_model_len finishes now."""
        bm = self.block_manager
        row = 0
        for seq, n, samples in zip(seqs, plan.num_new, plan.samples):
            seq.flight.open_row(seq)  # (what taking this row back restores: engine/in_flight.py)
            seq.num_cached_tokens += n
            bm.hash_blocks(seq)
            if not samples:
                continue  # a chunk: its prompt goes on next step
            seq.append_placeholder()
            seq.flight.sample_row = row
            row += 1
            if seq.num_completion_tokens == seq.max_tokens or seq.num_tokens >= self.max_model_len:
                # (The max_model_len stop is not nano's, whose sequences would run past its RoPE table;
                # vLLM stops at the context limit too.)
                self._finish(seq, "length", later_rows=0, in_order=True)
        self._release_ready()

    # --- a step's tokens ------------------------------------------------------------------------
    @phase("engine::postprocess")
    def commit(self, plan: BatchPlan, token_ids: list[int]) -> tuple[list[int | None], list[str | None]]:
        """Fill the plan's placeholders with its sampled tokens (`token_ids`, one per sampling row) and stop
        sequences on EOS. Returns each row's new token (None: a chunk, or a discarded row) and the reason of
        each sequence that finished in this step (None: it goes on, or finished in another step)."""
        tokens: list[int | None] = []
        reasons: list[str | None] = []
        sampled = iter(token_ids)
        bm = self.block_manager
        seqs = self._rows.pop(plan.step)
        self._committed = (plan.step, seqs)
        for seq, samples in zip(seqs, plan.samples):
            flight = seq.flight
            flight.rows -= 1
            token = next(sampled) if samples else None
            if flight.discard:  # scheduled before the sequence stopped or was aborted
                flight.discard -= 1
                token = None
            elif token is not None:
                seq.fill_placeholder(token)
                if token == self.eos and not seq.ignore_eos:
                    self._finish(seq, "stop", later_rows=flight.rows)
                else:
                    bm.hash_blocks(seq)
            tokens.append(token)
            done = token is not None and seq.is_finished and flight.rows == flight.discard
            reasons.append(seq.finish_reason if done else None)
        self._release_ready()
        return tokens, reasons

    def _release_ready(self) -> None:
        bm = self.block_manager
        while self._releasing and self._releasing[0].num_known_tokens >= self._releasing[0].num_cached_tokens:
            seq = self._releasing.pop(0)
            bm.hash_blocks(seq)
            bm.deallocate(seq)

    def _finish(self, seq: Sequence, reason: str, later_rows: int, in_order: bool = False) -> None:
        """Finish a sequence. `later_rows`: rows of steps launched after the one that decided it (async
        scheduling: an EOS learnt late, an abort); they are discarded and leave no trace in its state.
        `in_order`: it finished as its step was scheduled, and frees its blocks in row order (_releasing)."""
        if seq in self.running:
            self.running.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        bm = self.block_manager
        if later_rows:
            seq.flight.discard = later_rows
            while seq.pending:
                seq.drop_placeholder()
            take_back(seq, bm)
        if in_order or seq.num_known_tokens < seq.num_cached_tokens:
            if seq not in self._releasing:
                self._releasing.append(seq)  # (a cached token's value may still be in flight: hash, then free)
        elif seq.block_table:
            if seq in self._releasing:
                self._releasing.remove(seq)
            bm.hash_blocks(seq)
            bm.deallocate(seq)

    def fail_step(self, plan: BatchPlan, undo: bool = True) -> tuple[list[int], list[str]]:
        """The step of `plan` could not run: its sequences are finished with "error" (but one that had finished on
        its own before it), with `undo` after each row is taken back (the engine goes on). Returns the seq ids and
        request ids of the sequences it took out."""
        seqs = self._rows.pop(plan.step)
        out = [s for s in seqs if not s.is_finished or s.finish_reason == "length"]
        if undo:
            for seq, samples in zip(seqs, plan.samples):
                self.fail(seq, samples)
        return [s.seq_id for s in out], [s.request_id for s in out]

    def fail(self, seq: Sequence, sampled: bool) -> None:
        """The step just scheduled with a row for `seq` could not be launched: undo that row and finish the
        sequence with "error" (unless it had already finished on its own before this step)."""
        if seq.is_finished and seq.finish_reason != "length":
            return
        seq.flight.rows -= 1
        if sampled:
            seq.drop_placeholder()
        take_back(seq, self.block_manager)
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._finish(seq, "error", later_rows=0)

    # --- the prefix cache's changes, for a router that mirrors it (LLMEngine.enable_kv_events) ----------
    def record_kv_events(self) -> None:
        """From now on the block manager records every change to the set of hashes the prefix cache can find."""
        bm = self.block_manager
        if bm.hash_to_block_id:
            raise ValueError("kv events: enable them before the first request (the prefix cache is not empty)")
        if bm.events is None:
            bm.events = []

    def take_kv_events(self) -> list[tuple]:
        """The changes recorded since the last call, in order (none unless record_kv_events was called)."""
        bm = self.block_manager
        events = bm.events
        if not events:
            return []
        bm.events = []
        return events

    # --- what it holds, read-only --------------------------------------------------------------------
    def snapshot(self, plan: BatchPlan | None = None) -> SchedulerSnapshot:
        """The queues, the pool and the prefix-cache counts now; with `plan` (in flight, or the last committed),
        the state of its rows' sequences too."""
        bm = self.block_manager
        rows = ()
        if plan is not None:
            seqs = self._rows.get(plan.step) or (self._committed[1] if self._committed[0] == plan.step else [])
            rows = tuple(SeqState(seq.seq_id, seq.request_id, seq.num_tokens, seq.num_cached_tokens,
                                  seq.num_completion_tokens, seq.status.name, seq.finish_reason,
                                  tuple(seq.block_table), tuple(bm.ref_counts(seq)),
                                  tuple(bm.blocks[b].ref_count for b in held))
                         for seq, held in zip(seqs, plan.block_tables))
        return SchedulerSnapshot(tuple(s.seq_id for s in self.waiting), tuple(s.seq_id for s in self.running),
                                 bm.num_free_blocks, bm.num_blocks, bm.prefix_queries, bm.prefix_hits, rows)

    def abort(self, seq: Sequence) -> bool:
        """Take a sequence out between steps (a cancelled request): its blocks go back to the pool
        (hashed blocks keep their prefix-cache entries). Returns False if it had already finished."""
        if seq.is_finished:
            return False
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._finish(seq, "abort", later_rows=seq.flight.rows)
        return True
