"""KV cache events in vLLM's schema (labkit serve --kv-events): replayed in order, they rebuild the engine's
prefix-cache hash table exactly, after every step, under every policy, with preemption, block reuse, aborts and
async scheduling's take-backs; and the core publishes them as vLLM's msgpack batches over ZeroMQ."""
from __future__ import annotations

import random
import time

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

from engine import LLM, SamplingParams  # noqa: E402

POLICIES = ("prefill_first", "balanced", "mixed")


def _table(llm) -> dict[int, list[int]]:
    """The engine's own hash table: hash -> the token ids of the block it names (tests may look inside)."""
    bm = llm.scheduler.block_manager
    return {h: list(bm.blocks[b].token_ids) for h, b in bm.hash_to_block_id.items()}


def _mirror_apply(mirror, llm, block_size: int) -> None:
    """The engine's events since the last call, through vLLM's wire format (msgpack) into the mirror."""
    from labkit.serve.kv_events import batch, to_vllm

    events = llm.take_kv_events()
    if events:
        wire = msgpack.packb(batch([to_vllm(e, block_size) for e in events]), use_bin_type=True)
        mirror.apply(msgpack.unpackb(wire, raw=False))


def _prompts(rng: random.Random, n: int, bs: int) -> list[list[int]]:
    """Prompts that share prefixes of whole blocks and of part of a block, and some that share nothing."""
    stems = [[rng.randrange(100, 2000) for _ in range(3 * bs)] for _ in range(3)]
    out = []
    for _ in range(n):
        stem = rng.choice(stems)
        cut = rng.choice([bs, 2 * bs, 2 * bs + 5, 3 * bs, 0])
        out.append(stem[:cut] + [rng.randrange(100, 2000) for _ in range(rng.randrange(1, 2 * bs))])
    return out


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("async_steps", [False, True])
def test_replayed_events_rebuild_the_hash_table_exactly_after_every_step(tiny_model, monkeypatch, policy,
                                                                         async_steps):
    from labkit.serve.kv_events import KVMirror

    if async_steps:  # as on a GPU: steps launched ahead, whose hashes are taken back on an abort or an EOS
        from tests.conftest import replay_graphs

        replay_graphs(monkeypatch, "every")
    bs = 16
    llm = LLM(tiny_model, device="cpu", enforce_eager=True, max_model_len=256, max_num_batched_tokens=96,
              max_num_seqs=6, kvcache_block_size=bs, num_kvcache_blocks=24, scheduling_policy=policy)
    try:
        llm.enable_kv_events()
        mirror = KVMirror()
        rng = random.Random(hash(policy) % 1000 + async_steps)
        prompts = _prompts(rng, 24, bs)
        live, added, steps, stored = [], 0, 0, 0
        while added < len(prompts) or not llm.is_finished():
            for _ in range(rng.randrange(0, 3)):
                if added < len(prompts):
                    sp = SamplingParams(temperature=0, max_tokens=rng.randrange(1, 24), ignore_eos=True)
                    live.append(llm.add_request(prompts[added], sp))
                    added += 1
            if live and rng.random() < 0.08:   # an abort, sometimes of a step already launched
                victim = live.pop(rng.randrange(len(live)))
                llm.abort(victim)
            _mirror_apply(mirror, llm, bs)
            if llm.is_finished():
                continue
            llm.step()
            steps += 1
            _mirror_apply(mirror, llm, bs)
            table = _table(llm)
            assert {h: toks for h, (_, toks) in mirror.blocks.items()} == table, f"step {steps}"
            stored = max(stored, len(table))
        assert steps > 20 and stored > 4
    finally:
        llm.exit()


def test_parents_chain_each_block_to_the_one_before_it(tiny_model):
    from labkit.serve.kv_events import KVMirror

    bs = 16
    llm = LLM(tiny_model, device="cpu", enforce_eager=True, max_model_len=256, kvcache_block_size=bs,
              num_kvcache_blocks=32)
    try:
        llm.enable_kv_events()
        mirror = KVMirror()
        prompt = list(range(100, 100 + 4 * bs + 3))
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
        _mirror_apply(mirror, llm, bs)
        assert mirror.cached_prefix_blocks(prompt, bs) == 4
        assert mirror.cached_prefix_blocks(prompt[:bs] + [7] * 3 * bs, bs) == 1
        assert mirror.cached_prefix_blocks([5] + prompt[1:], bs) == 0
        roots = [h for h, (p, _) in mirror.blocks.items() if p is None]
        assert len(roots) == 1 and mirror.blocks[roots[0]][1] == prompt[:bs]
    finally:
        llm.exit()


def test_enabling_events_after_the_cache_filled_is_refused(tiny_model):
    llm = LLM(tiny_model, device="cpu", enforce_eager=True, max_model_len=256, kvcache_block_size=16,
              num_kvcache_blocks=32)
    try:
        assert llm.take_kv_events() == []          # off: nothing recorded
        llm.generate([list(range(100, 150))], SamplingParams(max_tokens=1), use_tqdm=False)
        assert llm.take_kv_events() == []
        with pytest.raises(ValueError, match="before the first request"):
            llm.enable_kv_events()
    finally:
        llm.exit()


def test_the_core_publishes_vllm_batches_a_subscriber_can_mirror(tiny_model, tmp_path):
    from labkit.serve.core import EngineCore
    from labkit.serve.kv_events import KVEventPublisher, KVMirror

    ctx = zmq.Context()
    endpoint = f"ipc://{tmp_path}/kv"
    pub = KVEventPublisher(ctx, endpoint, 0, topic="kv@w1")
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@w1")
    sub.connect(endpoint)
    time.sleep(0.2)
    llm = LLM(tiny_model, device="cpu", enforce_eager=True, max_model_len=512, kvcache_block_size=16,
              num_kvcache_blocks=64)
    try:
        core = EngineCore(llm, kv_events=pub)
        sp = {"temperature": 0, "max_tokens": 3, "ignore_eos": True, "top_k": -1, "top_p": 1.0}
        core.handle(["add", "a", list(range(100, 180)), sp])
        core.handle(["add", "b", list(range(100, 150)) + [9, 9, 9], sp])
        while core.has_work:
            core.step()
        table = _table(llm)
    finally:
        llm.exit()
    got = []
    while sub.poll(200):
        got.append(sub.recv_multipart())
    sub.close(linger=0)
    pub.close()
    ctx.term()
    assert all(t == b"kv@w1" for t, _, _ in got)
    assert [int.from_bytes(s, "big") for _, s, _ in got] == list(range(1, len(got) + 1))
    payloads = [msgpack.unpackb(p, raw=False) for _, _, p in got]
    assert payloads[0][1] == [{"type": "AllBlocksCleared"}] and isinstance(payloads[0][0], float)
    stored = [e for p in payloads for e in p[1] if e["type"] == "BlockStored"]
    assert stored and all(e["block_size"] == 16 and len(e["token_ids"]) == 16 and e["medium"] == "GPU"
                          and set(e) == {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
                                         "lora_id", "medium", "lora_name"} for e in stored)
    mirror = KVMirror()
    for p in payloads:
        mirror.apply(p)
    assert {h: toks for h, (_, toks) in mirror.blocks.items()} == table and len(table) >= 5


def test_an_abort_takes_back_the_hashes_of_a_step_already_launched(tiny_model, monkeypatch):
    """Async scheduling (as on a GPU): a prefill in the step launched ahead registers its blocks' hashes as it is
    scheduled; aborting the request before that step commits takes them back (the KV will never be written), and
    the events say so: the mirror loses them with the engine's table."""
    from labkit.serve.kv_events import KVMirror
    from tests.conftest import replay_graphs

    replay_graphs(monkeypatch, "every")
    bs = 16
    llm = LLM(tiny_model, device="cpu", enforce_eager=True, max_model_len=256, kvcache_block_size=bs,
              num_kvcache_blocks=32, scheduling_policy="mixed")
    try:
        llm.enable_kv_events()
        mirror = KVMirror()
        llm.add_request(list(range(100, 120)), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
        for _ in range(3):
            llm.step()
        a = llm.add_request(list(range(500, 500 + 3 * bs + 2)), SamplingParams(temperature=0, max_tokens=4))
        llm.step()   # commits a decode step and launches the next, with A's prompt in it: its hashes registered
        _mirror_apply(mirror, llm, bs)
        registered = set(_table(llm))
        assert mirror.cached_prefix_blocks(list(range(500, 500 + 3 * bs)), bs) == 3
        llm.abort(a)
        events = llm.take_kv_events()
        assert [e[0] for e in events] == ["removed"] * 3
        from labkit.serve.kv_events import batch, to_vllm

        mirror.apply(msgpack.unpackb(msgpack.packb(batch([to_vllm(e, bs) for e in events])), raw=False))
        assert {h: t for h, (_, t) in mirror.blocks.items()} == _table(llm) and set(_table(llm)) < registered
        while not llm.is_finished():
            llm.step()
        _mirror_apply(mirror, llm, bs)
        assert {h: t for h, (_, t) in mirror.blocks.items()} == _table(llm)
    finally:
        llm.exit()
