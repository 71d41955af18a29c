"""Async scheduling (Config.async_scheduling): the real scheduler plans step N+1 while step N runs, its inputs
reading N's samples on the device. Whatever happens between steps (EOS, preemption, arrivals, aborts, top-k/top-p
draws, any policy), every request must get exactly the tokens a synchronous engine gives it; without EOS and
aborts every step is the synchronous step, and an EOS or an abort costs at most that row's token."""
from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams
from tests.conftest import replay_graphs

POLICIES = ("prefill_first", "balanced", "mixed")


@pytest.fixture(autouse=True, params=["graph-ahead", "decode-graph"])
def launch_order(request, monkeypatch):
    """A step is scheduled ahead only while one that replays a CUDA graph runs; the step scheduled ahead is
    launched before that one commits when it replays a graph too, after the commit when it runs eagerly. On
    the CPU every step is eager (nothing would be scheduled ahead), so each test here runs as on a GPU where
    every step replays a graph and as on one where only decode steps do: both must give the tokens and
    states of a synchronous engine."""
    replay_graphs(monkeypatch, "every" if request.param == "graph-ahead" else "decodes")
    return request.param


def _rows(result):
    i = result.inputs
    return (result.phase, result.seq_ids, result.num_scheduled_tokens, result.num_cached_tokens, result.token_ids,
            result.finish_reasons, result.preempted, result.num_waiting, result.num_running, result.num_free_blocks,
            i.input_ids, i.positions, i.slot_mapping, i.context_lens, i.block_tables, i.cu_seqlens_q, i.execution)


def _kept(result):
    """A step's rows without the ones a late EOS or an abort wasted (their token is dropped)."""
    return (result.phase, [(s, t, f) for s, t, f, ok in zip(result.seq_ids, result.token_ids, result.finish_reasons,
                                                            _samples(result))
                           if t is not None or f is not None or not ok])


def _after_replays(results, launch_order, policy) -> int:
    """How many steps were scheduled ahead: each one after a step that replays a graph, but the last, and but
    an eager prefill (under prefill_first and balanced a prefill-only step: it is planned after the commit, so
    that requests arriving meanwhile can join it)."""
    return sum((launch_order == "graph-ahead" or r.phase == "decode")
               and not (policy != "mixed" and nxt.phase == "prefill")
               for r, nxt in zip(results, results[1:]))


def _samples(result):
    return [c + n == t for c, n, t in zip(result.num_cached_tokens, result.num_scheduled_tokens, result.num_tokens)]


def _requests(seed: int, n: int, sampling: dict, ignore_eos=None):
    rng = random.Random(seed)
    return [([rng.randrange(1, 250) for _ in range(rng.randrange(2, 30))],
             SamplingParams(max_tokens=rng.randrange(1, 24),
                            ignore_eos=i % 4 == 0 if ignore_eos is None else ignore_eos,
                            temperature=0.0 if i % 3 == 0 else 1.0, **sampling)) for i in range(n)]


def _run(model, async_scheduling, requests, eos=None, between=None, **config):
    llm = LLM(model, device="cpu", async_scheduling=async_scheduling, **config)
    if eos is not None:
        llm.scheduler.eos = eos  # a token the tiny model samples often, so EOS often comes late
    for prompt, sp in requests:
        llm.add_request(prompt, sp)
    results, n = [], 0
    while not llm.is_finished():
        results.append(llm.step())
        n += 1
        if between is not None:
            between(llm, n)
    outputs = [(llm.get_sequence(i).completion_token_ids, llm.get_sequence(i).finish_reason)
               for i in range(len(requests) + 8) if i in llm._seqs]
    counts = dict(llm.async_stats)
    prefix_cache = sorted(llm.scheduler.block_manager.hash_to_block_id.items())
    stats = llm.stats()
    # Every block back in the pool once every request has finished (a late EOS's discarded row included).
    assert stats["free_blocks"] == stats["num_blocks"], stats
    llm.exit()
    return results, outputs, counts, prefix_cache


def _frequent_token(model, requests, **config) -> int:
    """The token that most requests sample at some point: as EOS, it stops many of them early."""
    _, outputs, _, _ = _run(model, False, requests, kvcache_block_size=4, **config)
    counts: dict[int, int] = {}
    for out, _ in outputs:
        for t in set(out):
            counts[t] = counts.get(t, 0) + 1
    return max(counts, key=counts.get)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("sampling", [{}, {"top_k": 20, "top_p": 0.9}], ids=["gumbel-or-greedy", "top-k-top-p"])
def test_every_request_gets_the_same_tokens_when_eos_comes_late(tiny_model, sampling, policy):
    requests = _requests(1, 24, sampling)
    eos = _frequent_token(tiny_model, requests)
    sync = _run(tiny_model, False, requests, eos=eos, kvcache_block_size=4, scheduling_policy=policy,
                max_num_batched_tokens=48)
    overlapped = _run(tiny_model, True, requests, eos=eos, kvcache_block_size=4, scheduling_policy=policy,
                      max_num_batched_tokens=48)
    assert overlapped[1] == sync[1]
    assert sum(reason == "stop" for _, reason in sync[1]) >= 2  # EOS did end requests early
    # An EOS learnt after the next step was launched wastes that row's token and nothing else: take the
    # wasted rows out and the steps are the synchronous ones.
    # The prefix cache a synchronous engine leaves: a discarded row's token is not counted as cached, and its
    # block is not hashed (the same hashes on the same blocks).
    assert overlapped[3] == sync[3]
    assert overlapped[2]["wasted_rows"] > 0 and sync[2] == {"launched_ahead": 0, "wasted_rows": 0}
    kept = [_kept(r) for r in overlapped[0]]
    assert [k for k in kept if k[1]] == [_kept(r) for r in sync[0]]
    wasted = sum(t is None and f is None and ok for r in overlapped[0]
                 for t, f, ok in zip(r.token_ids, r.finish_reasons, _samples(r)))
    assert wasted == overlapped[2]["wasted_rows"]


@pytest.mark.parametrize("policy", POLICIES)
def test_without_eos_every_step_is_the_synchronous_step(tiny_model, policy, launch_order):
    """ignore_eos everywhere, a small pool (preemption), more requests than max_num_seqs: every StepResult is
    identical, inputs included, and every step that follows one replaying a graph was launched ahead."""
    requests = _requests(2, 12, {}, ignore_eos=True)
    for config in ({"num_kvcache_blocks": 14}, {"num_kvcache_blocks": 40, "max_num_seqs": 3}):
        sync = _run(tiny_model, False, requests, kvcache_block_size=4, scheduling_policy=policy, **config)
        overlapped = _run(tiny_model, True, requests, kvcache_block_size=4, scheduling_policy=policy, **config)
        assert [_rows(r) for r in overlapped[0]] == [_rows(r) for r in sync[0]], config
        assert overlapped[1] == sync[1]
        assert overlapped[2] == {"launched_ahead": _after_replays(overlapped[0], launch_order, policy),
                                 "wasted_rows": 0}, \
            (config, overlapped[2])
        if "num_kvcache_blocks" in config and config["num_kvcache_blocks"] < 20:
            assert any(r.preempted for r in sync[0])  # the small pool did preempt


@pytest.mark.parametrize("policy", POLICIES)
def test_arrivals_join_a_later_step_and_aborts_cost_their_row(tiny_model, policy, launch_order):
    requests = _requests(3, 6, {})
    late = _requests(4, 4, {})

    def between(llm, n):
        if n in (3, 7, 8):
            prompt, sp = late[(n - 3) % len(late)]
            llm.add_request(prompt, sp)
        if n == 5 and not llm.get_sequence(1).is_finished:
            llm.abort(1)

    sync = _run(tiny_model, False, requests, between=between, kvcache_block_size=4, scheduling_policy=policy)
    overlapped = _run(tiny_model, True, requests, between=between, kvcache_block_size=4, scheduling_policy=policy)
    assert overlapped[1] == sync[1]  # the same tokens for every request, the aborted one's up to its abort
    assert sync[1][1][1] == "abort"
    # The arrivals wasted nothing: they joined the step after the one already launched. The abort wasted the
    # row of request 1 in that step, and that is all.
    assert overlapped[2]["wasted_rows"] <= 1 + sum(r == "stop" for _, r in sync[1])
    assert overlapped[2]["launched_ahead"] == _after_replays(overlapped[0], launch_order, policy)


def test_a_request_arriving_while_a_step_runs_joins_the_step_after_the_launched_one(tiny_model, launch_order):
    """While a step that replays a graph runs, the engine has already scheduled step N+1, so a request added
    when step N's result comes back is first scheduled in step N+2, and step N+1 is kept. After an eager step
    (a prefill, here) nothing was scheduled ahead: the request joins step N+1."""
    llm = LLM(tiny_model, device="cpu", kvcache_block_size=4, scheduling_policy="mixed")
    llm.add_request([5, 6, 7, 8, 9], SamplingParams(max_tokens=10, ignore_eos=True))
    first = llm.step()
    late = llm.add_request([11, 12, 13], SamplingParams(max_tokens=2, ignore_eos=True))
    second, third = llm.step(), llm.step()
    assert first.phase == "prefill"
    if launch_order == "graph-ahead":
        assert second.phase == "decode" and late not in second.seq_ids
        assert third.phase == "mixed" and third.seq_ids == [0, late]
        assert llm.async_stats == {"launched_ahead": 3, "wasted_rows": 0}
    else:
        assert second.phase == "mixed" and second.seq_ids == [0, late]
        assert third.phase == "decode" and third.seq_ids == [0, late]
        assert llm.async_stats == {"launched_ahead": 1, "wasted_rows": 0}  # the third step (a decode) replays
    llm.exit()


@pytest.mark.parametrize("first_max_tokens", [8, 3])
def test_a_queued_launch_that_raises_fails_its_step_at_the_next_call_and_the_engine_carries_on(tiny_model,
                                                                                                monkeypatch,
                                                                                                first_max_tokens):
    """(first_max_tokens 3: the first request reaches its length as the failing step is scheduled; it is taken
    back and fails with the rest, not left finished on a token that was never sampled.)"""
    from engine.step_result import StepFailed

    llm = LLM(tiny_model, device="cpu", kvcache_block_size=4)
    runner = llm.model_runner
    execute = runner.execute
    calls = {"n": 0}

    def fails_third(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OverflowError("planted")
        return execute(*args, **kwargs)

    monkeypatch.setattr(runner, "execute", fails_third)
    ids = [llm.add_request([5 + i, 6, 7], SamplingParams(max_tokens=first_max_tokens if i == 0 else 8,
                                                         ignore_eos=True)) for i in range(2)]
    results, failed = [], None
    while not llm.is_finished():
        try:
            results.append(llm.step())
        except StepFailed as exc:
            failed = exc
    # Steps 1 and 2 came back whole (step 3 was launched, and failed, while step 2 ran); step 3 failed.
    assert [r.step for r in results] == [1, 2] and all(t is not None for r in results for t in r.token_ids)
    assert failed is not None and not failed.fatal and sorted(failed.seq_ids) == ids and "step 3" in str(failed)
    assert all(llm.get_sequence(i).finish_reason == "error" for i in ids)
    assert all(len(llm.get_sequence(i).completion_token_ids) == 2 for i in ids)  # no placeholder left behind
    assert llm.stats()["free_blocks"] == llm.stats()["num_blocks"]
    late = llm.add_request([9, 9, 9], SamplingParams(max_tokens=4, ignore_eos=True))
    while not llm.is_finished():
        llm.step()
    assert llm.get_sequence(late).finish_reason == "length" and llm.async_stats["launched_ahead"] >= 2
    llm.exit()


@pytest.mark.parametrize("case, policy", [("preempt", None), ("chunk", None), ("prefix-reuse", None),
                                          ("balanced", None), ("decode-order", None), ("refs", "mixed"),
                                          ("balanced", "mixed")])
def test_trace_logs_are_event_for_event_the_same(tiny_model, tmp_path, case, policy):
    """With tracing on, async scheduling on and off write the same event log: every scheduled, gpu_inputs,
    sampled and after_postprocess event (timestamps and the run's own settings aside), `after` arrivals
    included (balanced, prefix-reuse: a request submitted once another finished)."""
    from labkit.trace.cases import load_case
    from labkit.trace.events import read_jsonl
    from labkit.trace.run import run_case

    logs = {}
    for on in (True, False):
        path = tmp_path / f"{on}.jsonl"
        overrides = {"async_scheduling": on, **({"scheduling_policy": policy} if policy else {})}
        run_case(load_case(case), tiny_model, path, overrides=overrides, device="cpu")
        events = []
        for e in read_jsonl(path):
            e = {k: v for k, v in e.items() if k not in ("t_ns", "run", "wall_s", "async_scheduling")}
            if e["event"] == "run_start":
                e["config"] = {k: v for k, v in e["config"].items() if k not in ("async_scheduling", "shm_name")}
            events.append(e)
        logs[on] = events
    assert len(logs[True]) > 10 and any(e["event"] == "gpu_inputs" for e in logs[True])
    if policy == "mixed":
        assert any(e["event"] == "scheduled" and e["phase"] == "mixed" for e in logs[True])
    assert logs[True] == logs[False]


def test_trace_without_async_scheduling_is_judged_strictly(tiny_model, tmp_path, capsys):
    """--no-async-scheduling is a state-neutral override: the case's states gate (PASS), not a CHANGED diff."""
    import json

    from .helpers import run_cli

    code, out, err = run_cli(["trace", "--case", "preempt", "--model", tiny_model, "--device", "cpu", "-q",
                              "--no-async-scheduling", "--out", str(tmp_path / "t")], capsys)
    check = json.loads((tmp_path / "t" / "check.json").read_text())
    assert code == 0 and check["verdict"] == "PASS", (out, err)
    assert check["engine"]["async_scheduling"] is False
    # Judged against the case, not as an intended change. (A working tree whose engine/ differs from HEAD
    # is expected to change on its own account; the override itself must never be the reason.)
    why = check["report"]["why_changes"] or ""
    assert "async" not in why
    assert check["report"]["expect_changes"] is False or "engine/ differs" in why


@pytest.mark.parametrize("launch_order", ["graph-ahead"], indirect=True)  # (the most rows discarded)
def test_a_log_with_late_eos_and_aborts_passes_every_invariant(tiny_model, launch_order):
    """Under async scheduling a late EOS and an abort while a step runs leave `discarded` rows in the log: every
    invariant of validate.py holds on such a log, and the rows are there to be judged."""
    from engine.trace import ListTracer
    from labkit.trace.validate import validate

    requests = _requests(1, 24, {})
    eos = _frequent_token(tiny_model, requests)
    tracer = ListTracer()
    llm = LLM(tiny_model, device="cpu", kvcache_block_size=4, tracer=tracer, scheduling_policy="mixed",
              max_num_batched_tokens=48)
    llm.scheduler.eos = eos
    llm.config.eos = eos  # (what run_start reports, for the validator's EOS rule)
    tracer.events[0]["config"]["eos"] = eos
    for prompt, sp in requests:
        llm.add_request(prompt, sp)
    n = 0
    while not llm.is_finished():
        llm.step()
        n += 1
        if n == 4:
            for i in (2, 5):
                llm.abort(i)
    llm.exit()
    discarded = [a for e in tracer.events if e["event"] == "after_postprocess" for a in e["seqs"] if a.get("discarded")]
    assert len(discarded) >= 3 and {a["finish_reason"] for a in discarded} == {"stop", "abort"}
    report = validate(tracer.events)
    assert report.verdict in ("PASS", "RECORDED") and not report.failures, [c.message for c in report.failures][:3]
    # The same log with a discarded row that had no reason to be: async.discarded fails it.
    entry = next(a for e in tracer.events if e["event"] == "after_postprocess" for a in e["seqs"]
                 if a["accepted"] and a["status"] == "RUNNING")
    entry.update(accepted=False, token_id=None, discarded=True)
    assert "async.discarded" in {c.name for c in validate(tracer.events).failures}


def test_a_step_is_scheduled_ahead_only_while_a_graph_replays_and_launched_before_the_commit_only_if_it_replays(
        tiny_model, launch_order):
    """Async scheduling plans step N+1 while step N runs only if N replays a graph (an eager N keeps the host
    busy for its whole run; after it, requests that arrived join N+1). N+1 is launched before N commits when
    it replays a graph (microseconds), after N's commit when it runs eagerly (host-bound, tens of ms on the
    GPU), so N's tokens are never held back by it."""
    llm = LLM(tiny_model, device="cpu", kvcache_block_size=4)
    order = []
    execute, commit = llm.executor.execute, llm.scheduler.commit
    llm.executor.execute = lambda plan: (order.append(("launch", plan.phase)), execute(plan))[1]
    llm.scheduler.commit = lambda plan, sampled: (order.append(("commit", plan.phase)), commit(plan, sampled))[1]
    llm.add_request([5, 6, 7, 8, 9], SamplingParams(max_tokens=4, ignore_eos=True))
    for _ in range(3):
        llm.step()
    llm.add_request([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))  # joins after the step ahead
    while not llm.is_finished():
        llm.step()
    P, D = "prefill", "decode"
    # The second request waits while the first one's last decode runs: the prefill for it is planned after that
    # commit, not ahead (it is an eager prefill), in both launch orders.
    if launch_order == "graph-ahead":  # every step replays: each other next step goes before the commit
        want = [("launch", P), ("launch", D), ("commit", P), ("launch", D), ("commit", D), ("launch", D),
                ("commit", D), ("commit", D), ("launch", P), ("launch", D), ("commit", P), ("commit", D)]
        assert llm.async_stats["launched_ahead"] == 4
    else:  # a prefill is eager: nothing is planned while it runs, and it is launched after the decode commits
        want = [("launch", P), ("commit", P), ("launch", D), ("launch", D), ("commit", D), ("launch", D),
                ("commit", D), ("commit", D), ("launch", P), ("commit", P), ("launch", D), ("commit", D)]
        assert llm.async_stats["launched_ahead"] == 2
    assert order == want
    llm.exit()


def test_an_abort_while_a_step_runs_gives_an_equal_hash_back_to_the_block_that_held_it(tiny_model):
    """A and B have the same prompt and are prefilled side by side (B in two chunks), so B's second chunk
    registers the hashes A's blocks already hold. B is aborted while that chunk's step runs: its registrations
    are taken back and the hashes go back to A's blocks, so a later C with that prompt hits them (as it hits
    B's blocks in a synchronous engine)."""
    prompt = [7 + i for i in range(9)]  # two full blocks of 4, the lookup skips the third
    hits = {}
    for on in (False, True):
        llm = LLM(tiny_model, device="cpu", kvcache_block_size=4, scheduling_policy="mixed",
                  max_num_batched_tokens=12, async_scheduling=on)
        sp = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0)
        llm.add_request(prompt, sp)
        b = llm.add_request(prompt, sp)
        first = llm.step()
        assert first.num_scheduled_tokens == [9, 3]  # A whole, B's first chunk
        llm.abort(b)  # async: B's second chunk is in the step already launched
        llm.add_request(prompt, sp)
        results = []
        while not llm.is_finished():
            results.append(llm.step())
        hits[on] = sum(r.prefix_cache_hits for r in results)
        llm.exit()
    assert hits[True] == hits[False] == 8, hits


@pytest.mark.parametrize("policy", POLICIES)
def test_the_eager_prefill_hint_names_the_step_the_scheduler_makes(tiny_model, policy):
    """Scheduler.next_is_eager_prefill, read between steps of a synchronous engine (arrivals, a small pool that
    preempts, EOS), says whether the next schedule() is a prefill-only step: always under prefill_first and
    balanced; never under mixed (its prefills join the decodes)."""
    requests = _requests(5, 16, {})
    llm = LLM(tiny_model, device="cpu", kvcache_block_size=4, scheduling_policy=policy, async_scheduling=False,
              num_kvcache_blocks=20, max_num_seqs=4, max_num_batched_tokens=40)
    llm.scheduler.eos = _frequent_token(tiny_model, requests)
    pending = list(requests)
    said, made = [], []
    while pending or not llm.is_finished():
        for _ in range(3 if len(made) % 3 == 0 else 0):  # more than a step admits: some wait a decode turn
            if pending:
                llm.add_request(*pending.pop())
        if llm.is_finished():
            continue
        said.append(llm.scheduler.next_is_eager_prefill())
        made.append(llm.step().phase == "prefill" and policy != "mixed")
    llm.exit()
    assert said == made
    assert (any(made) and not all(made)) if policy != "mixed" else not any(said)


@pytest.mark.parametrize("policy", POLICIES)
def test_sequences_that_finish_as_they_are_scheduled_free_their_blocks_in_row_order(tiny_model, policy):
    """Many one- and two-token requests beside decodes, in a pool small enough that freed blocks are handed out
    again: a sequence that finishes as its step is scheduled (its length reached) frees its blocks only after every
    one finished ahead of it in that step, also when its own tokens are all known and the one ahead waits for a
    token still in flight. Otherwise the free list takes blocks back in another order than a synchronous engine's
    and later block tables differ."""
    rng = random.Random(4)
    requests = [([rng.randrange(1, 250) for _ in range(rng.randrange(2, 20))],
                 SamplingParams(max_tokens=rng.choice([1, 1, 2, 3, 5]), ignore_eos=True, temperature=0))
                for _ in range(16)]
    config = dict(kvcache_block_size=4, scheduling_policy=policy, max_num_batched_tokens=16, num_kvcache_blocks=12)
    sync = _run(tiny_model, False, requests, **config)
    overlapped = _run(tiny_model, True, requests, **config)
    assert [_rows(r) for r in overlapped[0]] == [_rows(r) for r in sync[0]]
    assert overlapped[1] == sync[1]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_sequence_stopped_by_eos_leaves_the_blocks_its_steps_filled_in_the_prefix_cache(tiny_model,
                                                                                           async_scheduling):
    """An EOS takes back only the rows of steps launched after the one that sampled it (none, synchronously):
    the KV of every token before the EOS was written, so a block those tokens fill stays in the prefix cache.
    The EOS is chosen to fall right after a block's last token: the step that samples it is the one that
    completes that block."""
    bs = 4
    found = None
    for seed in range(20):
        prompt = [random.Random(seed).randrange(1, 250) for _ in range(6)]
        _, outputs, _, _ = _run(tiny_model, False, [(prompt, SamplingParams(temperature=0.0, max_tokens=24,
                                                                           ignore_eos=True))], kvcache_block_size=bs)
        tokens = prompt + outputs[0][0]
        # k: the EOS's index; the greedy run first samples it there, and tokens [0, k) fill k // bs blocks.
        ks = [k for k in range(len(prompt) + 1, len(tokens)) if k % bs == 0 and tokens[k] not in tokens[len(prompt):k]]
        if ks:
            found = prompt, tokens, ks[0]
            break
    assert found, "no greedy completion puts a new token right after a block's end"
    prompt, tokens, k = found
    llm = LLM(tiny_model, device="cpu", async_scheduling=async_scheduling, kvcache_block_size=bs,
              num_kvcache_blocks=64)
    llm.scheduler.eos = tokens[k]
    a = llm.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=24))
    while not llm.is_finished():
        llm.step()
    seq = llm.get_sequence(a)
    assert (seq.finish_reason, seq.num_tokens) == ("stop", k + 1)
    llm.add_request(tokens[:k] + [7], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    first = llm.step()
    assert first.prefix_cache_hits == k  # every block before the EOS, the one its last step completed included
    llm.exit()
