"""The engine core's messages as the frontend reads them: the idle stats message has the step's stats layout
([waiting, running, free_blocks, total_blocks, ...], core.py's protocol), and the step log (LABKIT_STEP_LOG) counts
the new tokens of each step, not the rows that only finished."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

from engine import LLM  # noqa: E402

ENGINE = dict(device="cpu", enforce_eager=True, max_model_len=512, max_num_batched_tokens=256, max_num_seqs=8)
SP = {"temperature": 0, "ignore_eos": True, "top_k": -1, "top_p": 1.0}


@pytest.fixture()
def core(tiny_model):
    from labkit.serve.core import EngineCore

    llm = LLM(tiny_model, **ENGINE)
    yield EngineCore(llm)
    llm.exit()


def test_the_idle_stats_message_has_the_steps_layout(core):
    """After a step that holds blocks, core.stats() (what the core sends when adds or aborts change things while
    it is idle) reads the same as that step's stats: free blocks third, total blocks fourth."""
    total = core.info()["num_blocks"]
    core.handle(["add", "a", list(range(100, 200)), {**SP, "max_tokens": 50}])
    (msg,) = core.step()
    waiting, running, free, num_blocks = msg[1]["stats"][:4]
    assert (waiting, running, num_blocks) == (0, 1, total) and free < total
    assert core.stats()[:4] == [0, 1, free, total]
    core.handle(["abort", ["a"]])
    assert core.stats()[:4] == [0, 0, total, total]


def test_the_step_log_counts_tokens_not_rows(core, tmp_path):
    from labkit.serve.core import _log_step

    core.handle(["add", "a", [100, 101, 102], {**SP, "max_tokens": 3}])
    steps = []
    while core.has_work:
        steps += [m[1] for m in core.step() if m[0] == "step"]
    # A row that carries a finish reason without a token (an abort seen in a step) is not a new token.
    steps.append({**steps[-1], "out": [["a", None, "abort"], ["b", 7, None]]})
    path = tmp_path / "steps.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for s in steps:
            _log_step(f, s)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["new_tokens"] for r in rows] == [1, 1, 1, 1]
    assert all("out" not in r for r in rows)


def test_steps_ahead_and_wasted_rows_are_reported_once_each_over_the_steps(core, monkeypatch):
    """Each step message's `ahead` is what happened since the message before: over a run, the reported figures add
    up to the engine's totals. An abort while another request keeps decoding for many more steps wastes the one
    row its request had in the step already launched, reported once, not again in every later step."""
    from tests.conftest import replay_graphs

    replay_graphs(monkeypatch, "every")  # every step replayed as a graph: launched ahead (async scheduling)
    core.handle(["add", "keep", [100, 101, 102], {**SP, "max_tokens": 20}])
    core.handle(["add", "gone", [300, 301], {**SP, "max_tokens": 20}])
    msgs = core.step() + core.step() + core.step()
    core.handle(["abort", ["gone"]])
    while core.has_work:
        msgs += core.step()
    after = [m for m in msgs[3:] if m[0] == "step"]
    assert len(after) >= 10       # "keep" decodes on for many steps after the abort
    assert sum(m[1]["ahead"][1] for m in msgs) == core.llm.async_stats["wasted_rows"] == 1
    assert sum(m[1]["ahead"][0] for m in msgs) == core.llm.async_stats["launched_ahead"]
