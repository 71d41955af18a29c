"""A reference model of the scheduler and the paged-KV block manager, written from their rules.

The rules come from SPEC.md section 4, the seeds' step tables (EXPECTED.md), docs/architecture.md and the rule
statements in engine/scheduler.py's and engine/block_manager.py's docstrings; the `mixed` policy comes from
issue 23's specification. Nothing here imports `engine`: a model that shares the engine's code would share its
bugs. The model keeps only what decides a schedule (token counts, block tables, queues, the prefix index), so a
test can replay the engine's sampled tokens through it and compare every traced state.

Two deliberate differences in representation, not in behaviour:
- a block's prefix-cache key is the tuple of *all* tokens up to the end of that block. That is what a correct
  hash chain means ("equal hashes mean equal prefixes"), with no hash function to get wrong;
- sequences are plain records; the engine's Sequence methods are not mirrored.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

POLICIES = ("prefill_first", "balanced", "mixed")


class NothingCanRun(RuntimeError):
    """A step with nothing to schedule while requests remain (the engine raises RuntimeError there)."""


@dataclass
class Seq:
    seq_id: int
    tokens: list[int]
    prompt_len: int
    max_tokens: int
    cached: int = 0
    table: list[int] = field(default_factory=list)
    status: str = "WAITING"
    scheduled: int = 0  # tokens this step computes

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def completion(self) -> int:
        return len(self.tokens) - self.prompt_len


@dataclass
class Block:
    ref: int = 0
    key: tuple | None = None  # the whole prefix this block ends (None: no registered content)


class Pool:
    """KV blocks: reference counts, a first-in-first-out free list and the prefix index.

    - a freed block goes to the tail of the free list and keeps its key (and KV) until handed out again;
    - handing a block out for new content (from the head of the free list) forgets its key;
    - keys are registered only for full blocks whose KV is computed; a later registration of the same key wins.
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.bs = block_size
        self.blocks = [Block() for _ in range(num_blocks)]
        self.free: deque[int] = deque(range(num_blocks))
        self.index: dict[tuple, int] = {}

    def key(self, seq: Seq, i: int) -> tuple:
        return tuple(seq.tokens[: (i + 1) * self.bs])

    def lookup(self, seq: Seq) -> tuple[list[int], int]:
        """The leading blocks the cache holds for `seq` (never its last logical block, so at least one token is
        computed) and how many blocks from the free list admitting it takes (a hit on a freed block revives it
        from the free list; a hit on a held block is shared)."""
        n_blocks = -(-seq.num_tokens // self.bs)
        hits = []
        for i in range(n_blocks - 1):
            b = self.index.get(self.key(seq, i))
            if b is None or self.blocks[b].key != self.key(seq, i):
                break
            hits.append(b)
        takes = n_blocks - sum(1 for b in hits if self.blocks[b].ref > 0)
        return hits, takes

    def take_new(self) -> int:
        b = self.free.popleft()
        block = self.blocks[b]
        assert block.ref == 0
        if block.key is not None and self.index.get(block.key) == b:
            del self.index[block.key]
        block.key = None
        block.ref = 1
        return b

    def admit(self, seq: Seq, hits: list[int]) -> None:
        for b in hits:
            if self.blocks[b].ref == 0:
                self.free.remove(b)
            self.blocks[b].ref += 1
            seq.table.append(b)
        seq.cached = len(hits) * self.bs
        for _ in range(-(-seq.num_tokens // self.bs) - len(hits)):
            seq.table.append(self.take_new())

    def release(self, seq: Seq) -> None:
        for b in reversed(seq.table):
            self.blocks[b].ref -= 1
            if self.blocks[b].ref == 0:
                self.free.append(b)
        seq.table = []
        seq.cached = 0

    def needs_block(self, seq: Seq) -> bool:
        """A decode of `seq` writes position num_tokens - 1: a new block when that position starts one."""
        return -(-seq.num_tokens // self.bs) > len(seq.table)

    def register(self, seq: Seq, start: int, end: int) -> None:
        """Blocks whose last token lies in (start, end] are now computed: index them under their prefix."""
        for i in range(start // self.bs, end // self.bs):
            b = seq.table[i]
            self.blocks[b].key = self.key(seq, i)
            self.index[self.blocks[b].key] = b


@dataclass
class Plan:
    phase: str
    rows: list[Seq]  # in the order the scheduled event lists them
    preempted: list[int]


class SchedulerModel:
    def __init__(self, policy: str, max_num_batched_tokens: int, max_num_seqs: int, block_size: int,
                 num_blocks: int, max_model_len: int):
        assert policy in POLICIES, policy
        self.policy = policy
        self.T = max_num_batched_tokens
        self.S = max_num_seqs
        self.max_model_len = max_model_len
        self.pool = Pool(num_blocks, block_size)
        self.waiting: deque[Seq] = deque()
        self.running: deque[Seq] = deque()
        self.seqs: dict[int, Seq] = {}
        self.last_was_prefill: bool | None = None
        self._late_releases: list[Seq] = []

    # --- requests ---------------------------------------------------------------------------------------
    def add(self, seq_id: int, prompt: list[int], max_tokens: int) -> None:
        seq = Seq(seq_id, list(prompt), len(prompt), max_tokens)
        self.seqs[seq_id] = seq
        self.waiting.append(seq)

    def abort(self, seq_id: int) -> bool:
        seq = self.seqs[seq_id]
        if seq.status == "FINISHED":
            return False
        if seq in self.waiting:
            self.waiting.remove(seq)
        else:
            self.running.remove(seq)
        self.pool.release(seq)
        seq.status = "FINISHED"
        return True

    def abort_while_running(self, seq_id: int) -> bool:
        """An abort that reached the engine while the step just scheduled ran (async scheduling): the sequence
        leaves now and its row in that step is dropped, but its blocks go back after the blocks of the sequences
        that step finishes (the engine freed those as it scheduled the step, before the abort came)."""
        seq = self.seqs[seq_id]
        if seq.status == "FINISHED":
            return False
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.running.remove(seq)
        seq.status = "FINISHED"
        self._late_releases.append(seq)
        return True

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    @property
    def free_blocks(self) -> int:
        return len(self.pool.free)

    # --- one step -----------------------------------------------------------------------------------------
    def schedule(self) -> Plan:
        preempted: list[int] = []
        if self.policy == "mixed":
            return self._mixed(preempted)
        if self.policy == "balanced" and self.last_was_prefill and self.running:
            order = ("decode", "prefill")
        else:
            order = ("prefill", "decode")
        for phase in order:
            rows = self._prefill() if phase == "prefill" else self._decode(preempted)
            if rows:
                self.last_was_prefill = phase == "prefill"
                return Plan(phase, rows, preempted)
        raise NothingCanRun("nothing can run")

    def _prefill(self) -> list[Seq]:
        """prefill_first / balanced: admit from the head of `waiting` while seats and tokens last; only the
        first sequence of the batch may be chunked, and nobody is skipped."""
        rows: list[Seq] = []
        left = self.T
        while self.waiting and len(rows) < self.S and left > 0:
            seq = self.waiting[0]
            if seq.table:  # the rest of a chunked prompt
                need, hits = seq.num_tokens - seq.cached, None
            else:
                hits, takes = self.pool.lookup(seq)
                if takes > len(self.pool.free):
                    break
                need = seq.num_tokens - len(hits) * self.pool.bs
            if need > left and rows:
                break
            if hits is not None:
                self.pool.admit(seq, hits)
            seq.scheduled = min(need, left)
            left -= seq.scheduled
            rows.append(seq)
            if seq.scheduled < need:
                break  # chunked: it stays at the head of `waiting`
            seq.status = "RUNNING"
            self.waiting.popleft()
            self.running.append(seq)
        return rows

    def _preempt(self, seq: Seq, preempted: list[int]) -> None:
        self.pool.release(seq)
        seq.status = "WAITING"
        if self.waiting and self.waiting[0].table:
            self.waiting.insert(1, seq)  # a mid-chunk prompt at the head keeps its place
        else:
            self.waiting.appendleft(seq)
        preempted.append(seq.seq_id)

    def _decode_walk(self, preempted: list[int], tokens: int | None) -> list[Seq]:
        """Serve `running` from its head, one token and one seat each; a sequence whose new token starts a
        block and finds none free preempts the tail of `running` (not yet served this step) and retries, or
        itself when nobody is left. Served sequences are taken out of `running`; the caller puts them back."""
        rows: list[Seq] = []
        while self.running and len(rows) < self.S and (tokens is None or len(rows) < tokens):
            seq = self.running.popleft()
            while self.pool.needs_block(seq) and not self.pool.free:
                if self.running:
                    self._preempt(self.running.pop(), preempted)
                else:
                    self._preempt(seq, preempted)
                    break
            else:
                if self.pool.needs_block(seq):
                    seq.table.append(self.pool.take_new())
                seq.scheduled = 1
                rows.append(seq)
        return rows

    def _decode(self, preempted: list[int]) -> list[Seq]:
        rows = self._decode_walk(preempted, None)
        if self.policy == "balanced":
            self.running.extend(rows)  # served sequences rotate to the tail: everyone gets a turn
        else:
            self.running.extendleft(reversed(rows))
        return rows

    def _mixed(self, preempted: list[int]) -> Plan:
        decodes = self._decode_walk(preempted, self.T)
        self.running.extendleft(reversed(decodes))
        prefills: list[Seq] = []
        seats, left = self.S - len(decodes), self.T - len(decodes)
        # After a preemption nothing new is admitted; a prompt mid-chunk (it holds blocks) still goes on.
        if True:
            for seq in list(self.waiting):
                if len(prefills) >= seats or left <= 0 or (preempted and not seq.table):
                    break
                if seq.table:
                    need = seq.num_tokens - seq.cached
                else:
                    hits, takes = self.pool.lookup(seq)
                    if takes > len(self.pool.free):
                        break
                    self.pool.admit(seq, hits)
                    need = seq.num_tokens - seq.cached
                seq.scheduled = min(need, left)
                left -= seq.scheduled
                prefills.append(seq)
                if seq.scheduled < need:
                    break  # chunked: it keeps its place in `waiting`
                seq.status = "RUNNING"
                self.waiting.remove(seq)
                self.running.append(seq)
        if not decodes and not prefills:
            raise NothingCanRun("mixed: nothing scheduled")
        phase = "mixed" if decodes and prefills else ("decode" if decodes else "prefill")
        return Plan(phase, decodes + prefills, preempted)

    def postprocess(self, plan: Plan, sampled: dict[int, int]) -> list[bool]:
        """Fold each row's computed tokens in; accept its sampled token only once its whole known sequence is
        computed (a chunk's candidate is dropped); finish at max_tokens or at max_model_len, freeing its blocks."""
        accepted = []
        for seq in plan.rows:
            if seq.status == "FINISHED":  # aborted while the step ran (async scheduling): its row is dropped
                accepted.append(False)
                continue
            self.pool.register(seq, seq.cached, seq.cached + seq.scheduled)
            seq.cached += seq.scheduled
            seq.scheduled = 0
            if seq.cached < seq.num_tokens:
                accepted.append(False)
                continue
            seq.tokens.append(sampled[seq.seq_id])
            accepted.append(True)
            if seq.completion == seq.max_tokens or seq.num_tokens >= self.max_model_len:
                seq.status = "FINISHED"
                self.pool.release(seq)
                self.running.remove(seq)
        for seq in self._late_releases:
            self.pool.release(seq)
        self._late_releases = []
        return accepted
