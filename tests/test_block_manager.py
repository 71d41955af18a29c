"""BlockManager and Scheduler invariants under random request mixes, and preemption that loses nothing."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from engine import LLM, SamplingParams
from engine.block_manager import BlockManager
from engine.config import Config
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus


def _check_invariants(bm: BlockManager, live: list[Sequence]):
    assert len(bm.free_block_ids) + len(bm.used_block_ids) == bm.num_blocks
    assert not set(bm.free_block_ids) & bm.used_block_ids
    assert len(set(bm.free_block_ids)) == len(bm.free_block_ids)
    refs = Counter(b for s in live for b in s.block_table)
    assert set(refs) == bm.used_block_ids
    for block_id, n in refs.items():
        assert bm.blocks[block_id].ref_count == n
    for block_id in bm.free_block_ids:
        assert bm.blocks[block_id].ref_count == 0
    for seq in live:
        if seq.block_table:  # waiting (new or preempted) sequences hold none
            assert len(seq.block_table) >= seq.num_blocks - 1
        # Every block whose KV is computed and full carries the hash of its whole prefix.
        h = -1
        for i in range(seq.num_cached_tokens // bm.block_size):
            h = BlockManager.compute_hash(seq.block(i), h)
            block = bm.blocks[seq.block_table[i]]
            assert block.hash == h and block.token_ids == seq.block(i)
            assert bm.hash_to_block_id.get(h) is not None


@pytest.mark.parametrize("seed", range(int(__import__("os").environ.get("LABKIT_FUZZ_SEEDS", "6"))))
@pytest.mark.parametrize("policy", ["prefill_first", "balanced"])
def test_random_mixes_keep_the_books(tiny_model, seed, policy):
    rng = random.Random(seed)
    block_size = rng.choice([4, 8, 16])
    num_blocks = rng.randint(12, 40)
    cfg = Config(tiny_model, max_num_batched_tokens=rng.choice([16, 48, 200]), max_num_seqs=rng.choice([2, 4, 16]),
                 max_model_len=512, kvcache_block_size=block_size, num_kvcache_blocks=num_blocks,
                 scheduling_policy=policy)
    cfg.eos = 7
    sched = Scheduler(cfg)
    shared = [rng.randrange(100, 200) for _ in range(3 * block_size)]
    seqs: list[Sequence] = []
    pending = []
    for i in range(rng.randint(5, 14)):
        n = rng.randint(1, 4 * block_size)
        prompt = (shared[: rng.choice([0, block_size, 2 * block_size, 3 * block_size])] +
                  [rng.randrange(100, 200) for _ in range(n)])
        max_tokens = rng.randint(1, 3 * block_size)
        if -(-(len(prompt) + max_tokens) // block_size) > num_blocks:
            continue
        ignore_eos = rng.random() < 0.8
        pending.append(Sequence(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos), i, block_size))
    outputs: dict[int, list[int]] = {}
    steps = 0
    while pending or not sched.is_finished():
        if pending and (rng.random() < 0.4 or sched.is_finished()):
            seq = pending.pop(0)
            seqs.append(seq)
            sched.add(seq)
        if sched.is_finished():
            continue
        before = {s.seq_id: s.num_completion_tokens for s in seqs}
        plan = sched.schedule()
        by_id = {s.seq_id: s for s in seqs}
        batch = [by_id[i] for i in plan.seq_ids]
        assert batch
        if plan.phase == "prefill":
            assert sum(plan.num_new) <= cfg.max_num_batched_tokens
            assert all(n == t - c for n, t, c in zip(plan.num_new[1:], plan.num_tokens[1:], plan.starts[1:]))
        else:
            assert all(n == 1 and t == c + 1 for n, t, c in zip(plan.num_new, plan.num_tokens, plan.starts))
        assert len(batch) <= cfg.max_num_seqs
        tokens = [rng.choice([7, 150, 160]) for _ in plan.sample_rows]
        accepted, _ = sched.commit(plan, tokens)
        for s, acc in zip(batch, accepted):
            assert s.num_completion_tokens == before[s.seq_id] + (acc is not None)
            if s.is_finished:
                outputs[s.seq_id] = s.completion_token_ids
        live = [s for s in seqs if s.status != SequenceStatus.FINISHED]
        _check_invariants(sched.block_manager, live)
        steps += 1
        assert steps < 5000
    assert len(outputs) == len(seqs)
    for s in seqs:
        assert s.is_finished and not s.block_table and s.num_cached_tokens == 0
        if s.ignore_eos:
            assert s.num_completion_tokens == s.max_tokens
        else:
            assert s.num_completion_tokens == s.max_tokens or s.completion_token_ids[-1] == 7
    assert sched.block_manager.num_free_blocks == num_blocks


def test_prefix_lookup_skips_the_last_block(tiny_model):
    bm = BlockManager(8, 4)
    sp = SamplingParams()
    a = Sequence(list(range(100, 108)), sp, 0, 4)  # exactly two full blocks
    assert bm.can_allocate(a) == 0
    bm.allocate(a, 0)
    a.num_cached_tokens = 8
    bm.hash_blocks(a)
    bm.deallocate(a)
    again = Sequence(list(range(100, 108)), sp, 1, 4)
    assert bm.can_allocate(again) == 1  # the second (last) block is never looked up
    longer = Sequence(list(range(100, 110)), sp, 2, 4)
    assert bm.can_allocate(longer) == 2
    bm.allocate(longer, 2)
    # the prefix cache's books (vLLM's prefix_cache_queries / _hits): every allocated token looked up, the two
    # revived blocks' 8 tokens hit
    assert (longer.num_cached_tokens, bm.prefix_queries, bm.prefix_hits) == (8, 8 + 10, 8)


def test_reused_block_drops_its_old_hash():
    bm = BlockManager(2, 4)
    sp = SamplingParams()
    a = Sequence(list(range(100, 106)), sp, 0, 4)
    bm.allocate(a, bm.can_allocate(a))
    a.num_cached_tokens = 6
    bm.hash_blocks(a)
    first = a.block_table[0]
    bm.deallocate(a)
    assert bm.blocks[first].hash != -1  # freed, still hashed: a later request may revive it
    b = Sequence(list(range(300, 306)), sp, 1, 4)
    bm.allocate(b, bm.can_allocate(b))
    assert first in b.block_table
    assert bm.blocks[first].hash == -1 and not bm.hash_to_block_id
    c = Sequence(list(range(100, 106)), sp, 2, 4)
    bm.deallocate(b)
    assert bm.can_allocate(c) == 0


def test_preemption_loses_no_request_and_no_token(tiny_model):
    rng = random.Random(5)
    prompts = [[rng.randrange(100, 2000) for _ in range(rng.randint(3, 20))] for _ in range(8)]
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    roomy = LLM(tiny_model, enforce_eager=True, max_model_len=128, kvcache_block_size=4, num_kvcache_blocks=200)
    expected = [o["token_ids"] for o in roomy.generate(prompts, sp, use_tqdm=False)]
    from engine.trace import ListTracer

    tracer = ListTracer()
    tight = LLM(tiny_model, enforce_eager=True, max_model_len=128, kvcache_block_size=4, num_kvcache_blocks=10,
                tracer=tracer)
    got = [o["token_ids"] for o in tight.generate(prompts, sp, use_tqdm=False)]
    assert any(e["event"] == "preempted" for e in tracer.events), "the small pool should force preemption"
    assert got == expected


@pytest.mark.parametrize("num_blocks", [0, -1])
def test_a_pool_of_no_blocks_is_refused(num_blocks):
    with pytest.raises(ValueError, match=f"^num_kvcache_blocks: the KV pool has {num_blocks} blocks; it needs at "
                                         "least 1$"):
        BlockManager(num_blocks, 16)
    assert len(BlockManager(1, 16).free_block_ids) == 1
