"""LLMEngine.step()'s StepResult, the request limits a server shares with the engine, and a failed step."""
from __future__ import annotations

import math

import pytest

from engine import LLM, SamplingParams
from engine.request_limits import RequestLimits
from engine.step_result import StepFailed


@pytest.fixture(scope="module")
def llm(tiny_model):
    engine = LLM(tiny_model, device="cpu", enforce_eager=True, max_model_len=256, max_num_batched_tokens=64,
                 max_num_seqs=4, kvcache_block_size=16, num_kvcache_blocks=12)
    yield engine
    engine.exit()


def _run(llm):
    out = []
    while not llm.is_finished():
        out.append(llm.step())
    return out


def test_chunked_prefill_then_decode_as_the_scheduler_did_it(llm):
    a = llm.add_request(list(range(100, 180)), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), "A")
    b = llm.add_request(list(range(200, 210)), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), "B")
    results = _run(llm)
    first, second = results[0], results[1]
    # Budget 64: A's 80-token prompt is chunked (64 then 16); its first chunk's candidate is dropped.
    assert first.phase == "prefill" and first.seq_ids == [a] and first.num_scheduled_tokens == [64]
    assert first.token_ids == [None] and first.num_cached_tokens == [64] and first.request_ids == ["A"]
    assert second.phase == "prefill" and second.seq_ids == [a, b] and second.num_scheduled_tokens == [16, 10]
    assert all(t is not None for t in second.token_ids)
    # The step's totals (what bench's step timing and the progress bar read): a chunk computes tokens and adds
    # none; each sampled row adds one.
    assert (first.batch_size, first.num_computed_tokens, first.num_new_tokens) == (1, 64, 0)
    assert (second.batch_size, second.num_computed_tokens, second.num_new_tokens) == (2, 26, 2)
    decodes = [r for r in results if r.phase == "decode"]
    assert decodes and all(r.num_scheduled_tokens == [1] * r.batch_size for r in decodes)
    finished = {s.request_id: s.finish_reason for r in results for s in r.finished}
    assert finished == {"A": "length", "B": "length"}
    # A finished sequence's blocks are back in the pool: none of its KV counts as written any more, while a
    # running one's counts every token but the one it just sampled.
    for r in results:
        for s in r.seqs:
            if s.finish_reason is not None:
                assert s.num_cached_tokens == 0, (r.step, s)
            elif s.token_id is not None:
                assert s.num_cached_tokens == s.num_tokens - 1, (r.step, s)
    assert results[-1].num_free_blocks == results[-1].num_blocks == 12 and results[-1].kv_cache_usage == 0.0
    # The tokens a StepResult reports are exactly what the sequences hold.
    for seq_id in (a, b):
        got = [t for r in results for i, t in zip(r.seq_ids, r.token_ids) if i == seq_id and t is not None]
        assert got == llm.get_sequence(seq_id).completion_token_ids
        llm.forget(seq_id)


def test_prefix_cache_queries_and_hits_count_tokens(llm):
    prompt = list(range(300, 340))  # 40 tokens: two full blocks of 16 are cacheable, the lookup skips the last
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    ids = [llm.add_request(prompt, sp)]
    r1 = _run(llm)
    ids.append(llm.add_request(prompt, sp))
    r2 = _run(llm)
    assert sum(r.prefix_cache_queries for r in r1) == 40 and sum(r.prefix_cache_hits for r in r1) == 0
    assert sum(r.prefix_cache_queries for r in r2) == 40 and sum(r.prefix_cache_hits for r in r2) == 32
    # A prefill that reads no cached keys attends over its own (no block tables: the contiguous path); one
    # that reads a cached prefix goes through the pool (its block table).
    assert r1[0].phase == "prefill" and r1[0].inputs.block_tables is None
    assert r2[0].phase == "prefill" and len(r2[0].inputs.block_tables or []) == 1
    assert -1 not in r2[0].inputs.block_tables[0]
    for i in ids:
        llm.forget(i)


def test_a_failed_step_aborts_its_sequences_and_the_engine_carries_on(llm, monkeypatch):
    runner = llm.model_runner
    execute = runner.execute  # the engine's path to the runner in one process
    calls = {"n": 0}

    def fails_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OverflowError("planted")
        return execute(*args, **kwargs)

    monkeypatch.setattr(runner, "execute", fails_once)
    free = llm.scheduler.block_manager.num_free_blocks
    bad = llm.add_request(list(range(100, 120)), SamplingParams(max_tokens=3, ignore_eos=True), "bad")
    # one token: it reaches its length as the failing step is scheduled, and is still that step's to take out
    one = llm.add_request(list(range(200, 210)), SamplingParams(max_tokens=1, ignore_eos=True), "one")
    with pytest.raises(StepFailed, match=r"OverflowError: planted.*2 sequence\(s\) were aborted") as info:
        llm.step()
    assert info.value.request_ids == ["bad", "one"] and not info.value.fatal
    assert llm.is_finished() and llm.scheduler.block_manager.num_free_blocks == free
    assert [llm.get_sequence(s).finish_reason for s in (bad, one)] == ["error", "error"]
    llm.forget(bad)
    llm.forget(one)
    good = llm.add_request(list(range(100, 120)), SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert sum(r.num_new_tokens for r in _run(llm)) == 3
    llm.forget(good)


LIMITS = RequestLimits(max_model_len=64, vocab_size=1000, block_size=16, num_blocks=4)


@pytest.mark.parametrize("ids, sp, api, field", [
    ([1] * 65, SamplingParams(max_tokens=1), False, "prompt: 65 tokens is longer"),
    ([1] * 10, SamplingParams(max_tokens=60), True, "max_tokens: prompt \\(10 tokens\\) \\+ max_tokens \\(60\\)"),
    ([1] * 10, SamplingParams(max_tokens=1, top_k=1180591620717411303424), False, "top_k: must be at most"),
])
def test_request_limits_name_the_field(ids, sp, api, field):
    with pytest.raises(ValueError, match=field):
        LIMITS.check(ids, sp, within_model_len=api)


def test_request_limits_count_kv_blocks():
    small = RequestLimits(max_model_len=64, vocab_size=1000, block_size=16, num_blocks=3)
    small.check([1] * 40, SamplingParams(max_tokens=9))  # 48 tokens of KV: 3 blocks
    with pytest.raises(ValueError, match="needs up to 4 KV blocks"):
        small.check([1] * 40, SamplingParams(max_tokens=10))


def test_request_limits_accept_what_fits():
    LIMITS.check([1] * 10, SamplingParams(max_tokens=54, top_k=1000), within_model_len=True)
    LIMITS.check([1] * 10, SamplingParams(max_tokens=500))  # the engine itself stops at max_model_len
    assert LIMITS.check_token_ids([0, 999]) == [0, 999]
    for bad in ([], [1000], [-1], [True], "x"):
        with pytest.raises(ValueError, match="prompt"):
            LIMITS.check_token_ids(bad)


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": math.nan}, "temperature"), ({"temperature": math.inf}, "temperature"),
    ({"top_p": math.nan}, "top_p"), ({"top_p": math.inf}, "top_p"),
])
def test_sampling_params_refuse_non_finite_numbers(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_engine_refuses_a_top_k_beyond_the_vocabulary(llm):
    with pytest.raises(ValueError, match="top_k"):
        llm.add_request([100, 101], SamplingParams(top_k=1180591620717411303424))
    assert llm.is_finished()
