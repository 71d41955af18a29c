"""Async scheduling (Config.async_scheduling): the engine launches the planned next decode step before this
step's ids reach the host and keeps it only when the real schedule matches. Whatever happens between steps
(EOS, preemption, arrivals, aborts, top-k/top-p draws), every step must come out exactly as without it."""
from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams


def _rows(result):
    i = result.inputs
    return (result.phase, result.seq_ids, result.num_scheduled_tokens, result.num_cached_tokens, result.token_ids,
            result.finish_reasons, result.preempted, result.num_waiting, result.num_running, result.num_free_blocks,
            i.input_ids, i.positions, i.slot_mapping, i.context_lens, i.block_tables, i.execution)


def _requests(seed: int, n: int, sampling: dict):
    rng = random.Random(seed)
    return [([rng.randrange(1, 250) for _ in range(rng.randrange(2, 30))],
             SamplingParams(max_tokens=rng.randrange(1, 24), ignore_eos=i % 4 == 0,
                            temperature=0.0 if i % 3 == 0 else 1.0, **sampling)) for i in range(n)]


def _run(model, async_scheduling, requests, eos=None, between=None, **config):
    llm = LLM(model, device="cpu", async_scheduling=async_scheduling, **config)
    if eos is not None:
        llm.scheduler.eos = eos  # a token the tiny model samples often, so plans are often wrong
    for prompt, sp in requests:
        llm.add_request(prompt, sp)
    steps, n = [], 0
    while not llm.is_finished():
        steps.append(_rows(llm.step()))
        n += 1
        if between is not None:
            between(llm, n)
    outputs = [llm.get_sequence(i).completion_token_ids for i in range(len(requests))]
    counts = dict(llm.async_steps)
    llm.exit()
    return steps, outputs, counts


def _frequent_token(model, requests) -> int:
    _, outputs, _ = _run(model, False, requests, kvcache_block_size=4)
    counts: dict[int, int] = {}
    for out in outputs:
        for t in out:
            counts[t] = counts.get(t, 0) + 1
    return max(counts, key=counts.get)


@pytest.mark.parametrize("sampling", [{}, {"top_k": 20, "top_p": 0.9}], ids=["gumbel-or-greedy", "top-k-top-p"])
def test_steps_are_identical_when_plans_go_wrong(tiny_model, sampling):
    requests = _requests(1, 16, sampling)
    eos = _frequent_token(tiny_model, requests)
    sync = _run(tiny_model, False, requests, eos=eos, kvcache_block_size=4)
    overlapped = _run(tiny_model, True, requests, eos=eos, kvcache_block_size=4)
    assert overlapped[0] == sync[0]
    assert overlapped[1] == sync[1]
    assert sync[2] == {"adopted": 0, "discarded": 0}
    # Both paths ran: plans kept, and plans thrown away because a sequence sampled EOS.
    assert overlapped[2]["adopted"] > 5 and overlapped[2]["discarded"] > 0, overlapped[2]


def test_steps_are_identical_under_preemption_and_the_balanced_policy(tiny_model):
    requests = _requests(2, 12, {})
    for config in ({"num_kvcache_blocks": 14}, {"num_kvcache_blocks": 40, "scheduling_policy": "balanced",
                                                 "max_num_seqs": 3}):
        sync = _run(tiny_model, False, requests, kvcache_block_size=4, **config)
        overlapped = _run(tiny_model, True, requests, kvcache_block_size=4, **config)
        assert overlapped[:2] == sync[:2], config
        assert overlapped[2]["adopted"] > 5, (config, overlapped[2])


def test_preemption_happens_in_the_small_pool(tiny_model):
    """(The previous test is only worth something if the small pool really preempts.)"""
    steps, _, _ = _run(tiny_model, True, _requests(2, 12, {}), kvcache_block_size=4, num_kvcache_blocks=14)
    assert any(step[6] for step in steps)


def test_arrivals_and_aborts_between_steps(tiny_model):
    requests = _requests(3, 6, {})
    late = _requests(4, 4, {})

    def between(llm, n):
        if n in (3, 7, 8):
            prompt, sp = late[(n - 3) % len(late)]
            llm.add_request(prompt, sp)
        if n == 5 and not llm.get_sequence(1).is_finished:
            llm.abort(1)

    sync = _run(tiny_model, False, requests, between=between, kvcache_block_size=4)
    overlapped = _run(tiny_model, True, requests, between=between, kvcache_block_size=4)
    assert overlapped[:2] == sync[:2]
    assert overlapped[2]["adopted"] > 0 and overlapped[2]["discarded"] > 0, overlapped[2]


def test_every_decode_step_that_can_be_planned_is_adopted(tiny_model):
    """No EOS (ignore_eos), no arrivals: a plan can only be wrong if it is built wrong. Sequences finish at
    max_tokens, more requests than max_num_seqs wait their turn: each decode step whose previous step left
    nothing waiting must have been launched ahead and kept, and no plan thrown away."""
    rng = random.Random(5)
    requests = [([rng.randrange(1, 250) for _ in range(rng.randrange(2, 30))],
                 SamplingParams(max_tokens=rng.randrange(1, 24), ignore_eos=True, temperature=1.0))
                for _ in range(10)]
    steps, _, counts = _run(tiny_model, True, requests, kvcache_block_size=4, max_num_seqs=4)
    plannable = sum(1 for prev, step in zip(steps, steps[1:]) if step[0] == "decode" and prev[7] == 0)
    assert plannable > 10
    assert counts == {"adopted": plannable, "discarded": 0}


def test_a_planned_launch_that_raises_fails_its_step_and_the_engine_carries_on(tiny_model, monkeypatch):
    from engine.step_result import StepFailed

    llm = LLM(tiny_model, device="cpu", kvcache_block_size=4)
    runner = llm.model_runner
    launch_ahead = runner.launch_ahead
    calls = {"n": 0}

    def fails_third(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OverflowError("planted")
        return launch_ahead(*args, **kwargs)

    monkeypatch.setattr(runner, "launch_ahead", fails_third)
    ids = [llm.add_request([5 + i, 6, 7], SamplingParams(max_tokens=8, ignore_eos=True)) for i in range(2)]
    failed = None
    while not llm.is_finished():
        try:
            llm.step()
        except StepFailed as exc:
            failed = exc
    assert failed is not None and not failed.fatal and sorted(failed.seq_ids) == ids
    assert all(llm.get_sequence(i).finish_reason == "error" for i in ids)
    assert llm.stats()["free_blocks"] == llm.stats()["num_blocks"]
    late = llm.add_request([9, 9, 9], SamplingParams(max_tokens=4, ignore_eos=True))
    while not llm.is_finished():
        llm.step()
    assert llm.get_sequence(late).finish_reason == "length" and llm.async_steps["adopted"] >= 2
    llm.exit()


@pytest.mark.parametrize("case", ["preempt", "chunk", "prefix-reuse", "balanced", "decode-order"])
def test_trace_logs_are_event_for_event_the_same(tiny_model, tmp_path, case):
    """With tracing on, async scheduling on and off write the same event log: every scheduled, gpu_inputs,
    sampled and after_postprocess event (timestamps and the run's own settings aside)."""
    from labkit.trace.cases import load_case
    from labkit.trace.events import read_jsonl
    from labkit.trace.run import run_case

    logs = {}
    for on in (True, False):
        path = tmp_path / f"{on}.jsonl"
        run_case(load_case(case), tiny_model, path, overrides={"async_scheduling": on}, device="cpu")
        events = []
        for e in read_jsonl(path):
            e = {k: v for k, v in e.items() if k not in ("t_ns", "run", "wall_s")}
            if e["event"] == "run_start":
                e["config"] = {k: v for k, v in e["config"].items() if k not in ("async_scheduling", "shm_name")}
            events.append(e)
        logs[on] = events
    assert len(logs[True]) > 10 and any(e["event"] == "gpu_inputs" for e in logs[True])
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
