"""Async scheduling's planning ahead (engine/step_loop.py), counted from what was launched: under a policy that
mixes phases a prompt waiting does not stop the loop planning the next step while this one runs (a mixed step
carries the decodes and the prompt together, so there is no prefill-only step to hold back for late arrivals,
engine/policies.py's prefill_alone_next), under prefill_first it does; and a step planned ahead whose launch
failed is not counted as launched ahead."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from tests.conftest import replay_graphs


def _steps(llm, n_requests: int) -> int:
    for i in range(n_requests):
        llm.add_request([100 + i] * (5 + i), SamplingParams(max_tokens=4, ignore_eos=True))
    steps = 0
    while not llm.is_finished():
        llm.step()
        steps += 1
    return steps


@pytest.mark.parametrize("policy", ["mixed", "prefill_first"])
def test_a_waiting_prompt_stops_planning_ahead_only_under_a_policy_that_does_not_mix(tiny_model, monkeypatch,
                                                                                    policy):
    replay_graphs(monkeypatch, "every")     # every step replays a graph: the overlapped loop may plan ahead
    llm = LLM(tiny_model, device="cpu", async_scheduling=True, max_num_seqs=2, scheduling_policy=policy)
    try:
        steps = _steps(llm, 6)              # two seats: prompts wait while others decode
        ahead = llm.async_stats["launched_ahead"]
        if policy == "mixed":
            assert ahead == steps - 1, (ahead, steps)   # every step but the last had its successor planned
        else:
            assert 0 < ahead < steps - 1, (ahead, steps)
    finally:
        llm.exit()


def test_a_step_planned_ahead_whose_launch_fails_is_not_counted_as_launched_ahead(tiny_model, monkeypatch):
    from engine.step_result import StepFailed

    replay_graphs(monkeypatch, "every")
    llm = LLM(tiny_model, device="cpu", kvcache_block_size=4)
    try:
        runner, calls = llm.model_runner, {"n": 0}
        run = runner.execute

        def fails_third(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 3:
                raise OverflowError("planted")
            return run(*args, **kwargs)

        monkeypatch.setattr(runner, "execute", fails_third)
        order = []
        execute, commit = llm.executor.execute, llm.scheduler.commit

        def launch(plan):
            handle = execute(plan)
            order.append("launch")       # (only a launch that happened)
            return handle

        llm.executor.execute = launch
        llm.scheduler.commit = lambda plan, sampled: (order.append("commit"), commit(plan, sampled))[1]
        for i in range(2):
            llm.add_request([5 + i, 6, 7], SamplingParams(max_tokens=6, ignore_eos=True))
        failed = 0
        while not llm.is_finished():
            try:
                llm.step()
            except StepFailed:
                failed += 1
        assert failed == 1
        # a launch while an earlier step had not committed yet is one launched ahead
        ahead = sum(1 for i, x in enumerate(order)
                    if x == "launch" and order[:i].count("launch") > order[:i].count("commit"))
        assert ahead >= 1 and llm.async_stats["launched_ahead"] == ahead, (order, llm.async_stats)
    finally:
        llm.exit()
