"""Paged KV blocks with reference counts and a full-block xxh64 hash chain (the prefix cache).

Rules, as nano-vLLM bb823b3 has them:
- a block's hash covers its tokens and the previous block's hash, so equal hashes mean equal prefixes;
- hashes are registered only once a block's KV is computed, or queued on the device by a launched step, and
  its tokens are all known (`hash_blocks`: the scheduler calls it as it schedules a step, and again when a
  step's sampled tokens fill the placeholders of async scheduling);
- the prefix lookup skips a sequence's last logical block, so at least one token is always computed;
- a freed block keeps its hash and KV until it is handed out again: a later lookup may revive it;
- handing a block out for new content drops its old hash mapping.

With `events` set to a list (LLMEngine.enable_kv_events), every change to the set of hashes the prefix cache
can find is appended to it as ("stored", hash, parent hash or None, token ids) or ("removed", hash): replayed
in order they rebuild `hash_to_block_id`'s keys exactly (what a prefix-aware router mirrors). None: nothing
is recorded (one `is None` test per registered block).
"""
from __future__ import annotations

from collections import deque

import numpy as np
import xxhash

from .sequence import Sequence


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1
        self.token_ids: list[int] = []

    def update(self, h: int, token_ids: list[int]):
        self.hash = h
        self.token_ids = token_ids

    def reset(self):
        self.ref_count = 1
        self.hash = -1
        self.token_ids = []


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1:
            raise ValueError(f"num_kvcache_blocks: the KV pool has {num_blocks} blocks; it needs at least 1")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.used_block_ids: set[int] = set()
        # Prefix cache statistics, in tokens, over every first-time allocation (vLLM's queries / hits).
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.events: list | None = None

    @staticmethod
    def compute_hash(token_ids: list[int], prefix: int = -1) -> int:
        h = xxhash.xxh64()
        if prefix != -1:
            h.update(prefix.to_bytes(8, "little"))
        h.update(np.array(token_ids, dtype=np.int64).tobytes())
        return h.intdigest()

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def _allocate_block(self, block_id: int) -> Block:
        block = self.blocks[block_id]
        assert block.ref_count == 0
        if block.hash != -1 and self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]
            if self.events is not None:
                self.events.append(("removed", block.hash))
        block.reset()
        self.free_block_ids.remove(block_id)
        self.used_block_ids.add(block_id)
        return block

    def _deallocate_block(self, block_id: int):
        assert self.blocks[block_id].ref_count == 0
        self.used_block_ids.remove(block_id)
        self.free_block_ids.append(block_id)

    def can_allocate(self, seq: Sequence) -> int:
        """Number of leading blocks the prefix cache already holds, or -1 if the pool cannot take `seq`.

        The lookup skips the last logical block. A hit on a block other sequences hold needs no free
        block; a hit on a freed block revives it and so still takes one from the free list.
        """
        num_cached = 0
        num_new = seq.num_blocks
        h = -1
        for i in range(seq.num_blocks - 1):
            token_ids = seq.block(i)
            h = self.compute_hash(token_ids, h)
            block_id = self.hash_to_block_id.get(h, -1)
            if block_id == -1 or self.blocks[block_id].token_ids != token_ids:
                break
            num_cached += 1
            if block_id in self.used_block_ids:
                num_new -= 1
        return num_cached if len(self.free_block_ids) >= num_new else -1

    def allocate(self, seq: Sequence, num_cached_blocks: int):
        assert not seq.block_table
        h = -1
        for i in range(num_cached_blocks):
            h = self.compute_hash(seq.block(i), h)
            block_id = self.hash_to_block_id[h]
            block = self.blocks[block_id]
            if block_id in self.used_block_ids:
                block.ref_count += 1
            else:  # revive a freed block: its hash and KV are still good
                block.ref_count = 1
                self.free_block_ids.remove(block_id)
                self.used_block_ids.add(block_id)
            seq.block_table.append(block_id)
        seq.num_cached_tokens = num_cached_blocks * self.block_size
        seq.num_hashed_blocks = num_cached_blocks
        self.prefix_queries += seq.num_tokens
        self.prefix_hits += seq.num_cached_tokens
        for _ in range(seq.num_blocks - num_cached_blocks):
            seq.block_table.append(self._allocate_block(self.free_block_ids[0]).block_id)

    def deallocate(self, seq: Sequence):
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._deallocate_block(block_id)
        seq.num_cached_tokens = 0
        seq.num_hashed_blocks = 0
        seq.block_table.clear()

    def can_append(self, seq: Sequence) -> bool:
        return len(self.free_block_ids) >= self._blocks_to_append(seq)

    def may_append(self, seq: Sequence):
        # With block_size > 1 this is nano's `len(seq) % block_size == 1`.
        for _ in range(self._blocks_to_append(seq)):
            seq.block_table.append(self._allocate_block(self.free_block_ids[0]).block_id)

    def _blocks_to_append(self, seq: Sequence) -> int:
        return max(0, seq.num_blocks - len(seq.block_table))

    def hash_blocks(self, seq: Sequence):
        """Register the full blocks whose KV is computed or queued and whose tokens are all known, from the
        first one not registered yet (each block's hash folds in the previous block's)."""
        bs = self.block_size
        start = seq.num_hashed_blocks
        end = min(seq.num_cached_tokens, seq.num_known_tokens) // bs
        if start >= end:
            return
        h = self.blocks[seq.block_table[start - 1]].hash if start > 0 else -1
        for i in range(start, end):
            block = self.blocks[seq.block_table[i]]
            token_ids = seq.block(i)
            parent, h = h, self.compute_hash(token_ids, h)
            block.update(h, token_ids)
            previous = self.hash_to_block_id.get(h)
            seq.flight.hash_undo.append((block.block_id, h, previous))
            self.hash_to_block_id[h] = block.block_id
            if previous is None and self.events is not None:
                self.events.append(("stored", h, None if parent == -1 else parent, token_ids))
        seq.num_hashed_blocks = end

    def unhash(self, seq: Sequence, start: int):
        """Take back what `seq` registered since its latest step was scheduled (seq.flight.hash_undo), down to block
        `start`: that KV will never be written. A hash another block held before goes back to that block, as if
        the registration had never happened (equal prompts after equal prefixes hash alike)."""
        for block_id, h, previous in reversed(seq.flight.hash_undo):
            if self.hash_to_block_id.get(h) == block_id:
                if previous is None:
                    del self.hash_to_block_id[h]
                    if self.events is not None:
                        self.events.append(("removed", h))
                else:
                    self.hash_to_block_id[h] = previous
            block = self.blocks[block_id]
            block.hash = -1
            block.token_ids = []
        seq.flight.hash_undo = []
        seq.num_hashed_blocks = min(seq.num_hashed_blocks, start)

    def ref_counts(self, seq: Sequence) -> list[int]:
        return [self.blocks[b].ref_count for b in seq.block_table]
