"""The step loop is chosen once when the engine starts (engine/step_loop.py): the synchronous loop (schedule,
execute, commit) or the overlapped one (async scheduling). LLMEngine.step() only delegates, and Scheduler.schedule
only asks the policy and builds the plan: both stay short enough to read at a glance."""
from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from engine import LLM, SamplingParams
from engine.llm import LLMEngine
from engine.sampler import TeacherForcing
from engine.scheduler import Scheduler
from tests.conftest import replay_graphs


def body_lines(fn) -> int:
    """Lines of a function's body without its docstring (what a reader reads to follow it)."""
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    return body[-1].end_lineno - body[0].lineno + 1


def test_the_step_and_the_schedule_stay_short():
    assert body_lines(LLMEngine.step) <= 5
    assert body_lines(Scheduler.schedule) <= 12


def test_body_lines_counts_code_not_the_docstring():
    def f():
        """Doc
        string."""
        a = 1
        return (a,
                a)
    assert body_lines(f) == 3


def _run(llm, n_requests=4, every_step=None):
    for i in range(n_requests):
        llm.add_request([100 + i] * (3 + i), SamplingParams(max_tokens=5, ignore_eos=True))
    while not llm.is_finished():
        llm.step()
        if every_step is not None:
            every_step(llm)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_loop_is_chosen_at_start_up_and_only_the_overlapped_one_plans_ahead(tiny_model, monkeypatch,
                                                                                 async_scheduling):
    replay_graphs(monkeypatch, "every")   # every step would replay a graph: the overlapped loop plans ahead
    asked = []
    monkeypatch.setattr(Scheduler, "next_is_eager_prefill", lambda self: asked.append(1) or False)
    llm = LLM(tiny_model, device="cpu", async_scheduling=async_scheduling)
    _run(llm)
    assert (llm.async_stats["launched_ahead"] > 0) == async_scheduling
    assert bool(asked) == async_scheduling   # the synchronous loop never asks the run-ahead question
    llm.exit()


def test_a_host_side_sampling_strategy_makes_the_loop_synchronous(tiny_model, monkeypatch):
    replay_graphs(monkeypatch, "every")
    llm = LLM(tiny_model, device="cpu", async_scheduling=True)
    seen_logits = []

    def choose(plan, logits):
        seen_logits.append(len(plan.sample_rows))
        return [7] * len(plan.sample_rows)

    llm.sampling = TeacherForcing(choose)
    _run(llm)
    assert seen_logits and llm.async_stats["launched_ahead"] == 0
    assert all(llm.get_sequence(i).completion_token_ids == [7] * 5 for i in range(4))
    llm.exit()


def test_the_sampling_strategy_is_not_swapped_under_a_step_on_the_device(tiny_model, monkeypatch):
    replay_graphs(monkeypatch, "every")
    llm = LLM(tiny_model, device="cpu", async_scheduling=True)
    for i in range(2):
        llm.add_request([100 + i] * 4, SamplingParams(max_tokens=6, ignore_eos=True))
    llm.step()
    llm.step()   # a decode step: the next one is on the device now
    with pytest.raises(ValueError, match="sampling"):
        llm.sampling = TeacherForcing(lambda plan, logits: [7] * len(plan.sample_rows))
    while not llm.is_finished():
        llm.step()
    steps = llm.step_count
    llm.sampling = TeacherForcing(lambda plan, logits: [7] * len(plan.sample_rows))   # idle: fine
    llm.add_request([5, 6, 7], SamplingParams(max_tokens=2, ignore_eos=True))
    r = llm.step()
    assert r.step == steps + 1   # the step numbers go on across the swap
    llm.exit()
