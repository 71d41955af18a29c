"""A BatchPlan is a value once built (ids and counts: no live Sequence rides on it, nothing rewrites it), and the
engine reads the scheduler's queues and pool through one read-only snapshot (engine/scheduler_snapshot.py)."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.config import Config
from engine.executor import Executor
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from tests.conftest import replay_graphs

REPO = Path(__file__).resolve().parents[1]


def _values(x):
    """Every leaf value inside x (lists, tuples, dicts, dataclasses)."""
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _values(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _values(v)
    else:
        yield x


def test_a_plan_is_a_value_of_ids_and_counts_once_built(tiny_model):
    sched = Scheduler(Config(tiny_model, kvcache_block_size=16, num_kvcache_blocks=16, scheduling_policy="mixed",
                             max_num_batched_tokens=24))
    for i in range(3):
        sched.add(Sequence(list(range(100 + i, 120 + i)), SamplingParams(max_tokens=3, ignore_eos=True), i, 16))
    while not sched.is_finished():
        plan = sched.schedule()
        with pytest.raises(dataclasses.FrozenInstanceError):
            plan.input_ids = []
        leaves = list(_values([getattr(plan, f.name) for f in dataclasses.fields(plan) if f.name != "sampling"]))
        assert all(v is None or type(v) in (int, str) for v in leaves), {type(v) for v in leaves}
        assert all(isinstance(p, SamplingParams) for p in plan.sampling) and len(plan.sampling) == len(plan.sample_rows)
        sched.commit(plan, [150] * len(plan.sample_rows))


def test_the_launched_steps_inputs_are_not_rewritten_by_its_commit(tiny_model, monkeypatch):
    """Async scheduling: a decode row whose last token the step before samples reads it on the device (input id 0
    when launched). The StepResult shows the id the device read; what was launched stays as it was."""
    replay_graphs(monkeypatch, "every")
    launched = {}
    execute = Executor.execute

    def keep(self, plan):
        handle = execute(self, plan)
        launched[plan.step] = (plan, handle.inputs, list(handle.inputs.input_ids))
        return handle

    monkeypatch.setattr(Executor, "execute", keep)
    llm = LLM(tiny_model, device="cpu", async_scheduling=True)
    for i in range(3):
        llm.add_request([100 + i] * (4 + i), SamplingParams(max_tokens=6, ignore_eos=True, temperature=1.0, seed=i))
    results, read_ahead = [], 0
    while not llm.is_finished():
        results.append(llm.step())
    by_step = {r.step: r for r in results}
    for r in results:
        plan, inputs, ids_at_launch = launched[r.step]
        assert inputs.input_ids == ids_at_launch          # the launched step's inputs: untouched
        if plan.from_previous is None:
            assert r.inputs.input_ids == ids_at_launch
            continue
        before = by_step[r.step - 1]
        for row, src in enumerate(plan.from_previous):
            if src >= 0:
                read_ahead += 1
                assert ids_at_launch[row] == 0
                sampled_before = dict(zip(before.seq_ids, before.token_ids))
                assert r.inputs.input_ids[row] == sampled_before[r.seq_ids[row]]
    assert read_ahead >= 10
    llm.exit()


def test_the_snapshot_is_what_the_queues_and_pool_hold(tiny_model):
    sched = Scheduler(Config(tiny_model, kvcache_block_size=16, num_kvcache_blocks=8, max_num_seqs=2))
    for i in range(3):
        sched.add(Sequence(list(range(100, 130)), SamplingParams(max_tokens=2, ignore_eos=True), i, 16))
    before = sched.snapshot()
    assert (before.waiting_ids, before.running_ids, before.free_blocks, before.num_blocks) == ((0, 1, 2), (), 8, 8)
    plan = sched.schedule()
    now = sched.snapshot(plan)
    assert (now.waiting_ids, now.running_ids, now.free_blocks) == ((2,), (0, 1), 4)
    assert now.prefix_queries == 60 and now.prefix_hits == 0   # (each prompt's 30 tokens looked up)
    assert [(r.seq_id, r.num_cached_tokens, r.num_tokens, r.status) for r in now.rows] == [
        (0, 30, 31, "RUNNING"), (1, 30, 31, "RUNNING")]
    assert before.waiting_ids == (0, 1, 2)   # a snapshot is a value: what the scheduler did since does not reach it
    with pytest.raises(dataclasses.FrozenInstanceError):
        now.free_blocks = 0


# The scheduler's queues and pool, which only the scheduler, its policies and the block manager touch.
INSIDES = {"waiting", "running", "block_manager"}
OWNERS = {"scheduler.py", "policies.py", "block_manager.py", "in_flight.py"}


def insides_read(source: str, name: str = "<src>") -> list[str]:
    return [f"{name}:{node.lineno}: .{node.attr}" for node in ast.walk(ast.parse(source, name))
            if isinstance(node, ast.Attribute) and node.attr in INSIDES]


def test_the_engine_reads_the_scheduler_through_its_snapshot_only():
    files = [p for p in sorted((REPO / "engine").rglob("*.py")) if p.name not in OWNERS]
    found = [hit for p in files for hit in insides_read(p.read_text(encoding="utf-8"), str(p.relative_to(REPO)))]
    assert not found, "the scheduler's queues or pool read outside it:\n" + "\n".join(found)


def test_the_scan_sees_a_read_of_the_queues():
    assert insides_read("n = len(engine.scheduler.waiting)\nf = s.block_manager.num_free_blocks\n") == [
        "<src>:1: .waiting", "<src>:2: .block_manager"]
