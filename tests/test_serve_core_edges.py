"""The engine core's messages at their edges (labkit/serve/core.py), driven in-process: what it says of a request it
refuses or cannot take, the figures of a step (queue time, prefill tokens, preemptions, rows with news), what a
stop leaves behind, and what `info` tells the frontend."""
# ruff: noqa: F811  (a test taking the imported `core` fixture reads to ruff as redefining it)
from __future__ import annotations

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

from engine import LLM  # noqa: E402

from .test_serve_core_books import ENGINE, SP, core  # noqa: E402, F401  (core: a fixture)


def _steps(core) -> list[dict]:
    out = []
    while core.has_work:
        out += [m[1] for m in core.step() if m[0] == "step"]
    return out


def test_a_request_id_still_queued_or_decoding_is_refused_and_an_unknown_message_is_named(core):
    core.handle(["add", "a", [100, 101, 102], {**SP, "max_tokens": 4}])
    core.step()                                   # "a" is scheduled: no longer in the unscheduled book
    again = core.handle(["add", "a", [100, 101], {**SP, "max_tokens": 4}])
    assert again == [["rejected", "a", "request_id: 'a' is already in flight"]]
    assert core.handle(["bogus", 1]) == [["rejected", None, "unknown message 'bogus'"]]
    _steps(core)
    assert core.handle(["add", "a", [100, 101], {**SP, "max_tokens": 1}]) == []   # done: the id is free again


def test_a_refusal_that_is_not_a_value_error_names_its_type(core, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("no room")

    monkeypatch.setattr(core.llm, "add_request", boom)
    assert core.handle(["add", "x", [100], {**SP, "max_tokens": 2}]) == [["rejected", "x", "RuntimeError: no room"]]
    assert core.live == {} and core.unscheduled == {}


def test_a_steps_figures_queue_time_prefill_tokens_and_rows(core):
    core.handle(["add", "a", list(range(100, 140)), {**SP, "max_tokens": 3}])
    first = core.step()[0][1]
    assert first["phase"] == "prefill" and first["prefill"] == [1, 40] and first["tokens"] == 40
    (q,) = first["queued"]
    assert q[0] == "a" and q[2] == 40 and 0 <= q[1] < 60
    assert first["out"] == [["a", first["out"][0][1], None]] and isinstance(first["out"][0][1], int)
    core.handle(["add", "b", list(range(200, 210)), {**SP, "max_tokens": 3}])
    mixed = _steps(core)
    # "a" decodes (one row, one token) beside the 10 tokens of "b"'s prompt, or after it alone.
    for s in mixed:
        decodes = s["batch"] - s["prefill"][0]
        assert s["prefill"][1] == s["tokens"] - decodes
    assert [r[0] for s in mixed for r in s["out"]].count("a") == 2
    assert [r[0] for s in mixed for r in s["out"]].count("b") == 3


def test_a_preemption_is_counted_in_the_steps_stats(tiny_model):
    from labkit.serve.core import EngineCore

    llm = LLM(tiny_model, **{**ENGINE, "kvcache_block_size": 16, "num_kvcache_blocks": 12})
    try:
        core = EngineCore(llm)
        # Four prompts of 47 tokens fill the 12 blocks of 16: the second token each decodes needs a block more.
        for i in range(4):
            core.handle(["add", f"r{i}", list(range(100 + 50 * i, 147 + 50 * i)), {**SP, "max_tokens": 20}])
        preempted = 0
        for _ in range(20):
            preempted += sum(m[1]["stats"][4] for m in core.step() if m[0] == "step")
            if preempted:
                break
        core.handle(["stop"])
    finally:
        llm.exit()
    assert preempted >= 1


def test_stop_aborts_everything_and_says_the_loop_is_over(core):
    core.handle(["add", "a", [100, 101], {**SP, "max_tokens": 20}])
    core.handle(["add", "b", [200, 201], {**SP, "max_tokens": 20}])
    core.step()
    assert not core.stopping
    assert core.handle(["stop"]) == []
    assert core.stopping and core.live == {} and core.unscheduled == {}


def test_aborting_a_request_never_scheduled_leaves_no_queue_entry(core):
    core.handle(["add", "never", [100, 101], {**SP, "max_tokens": 4}])
    core.handle(["abort", ["never"]])
    assert core.live == {} and core.unscheduled == {}
    core.handle(["add", "next", [300, 301], {**SP, "max_tokens": 1}])
    (step,) = _steps(core)
    assert [q[0] for q in step["queued"]] == ["next"]


def test_info_reports_the_kv_pool(core):
    info = core.info()
    cfg = core.llm.config
    assert info["num_blocks"] == cfg.num_kvcache_blocks == core.stats()[3]
    assert info["block_size"] == cfg.kvcache_block_size and info["max_num_seqs"] == 8


def test_step_records_off_publishes_nothing(tiny_model):
    from labkit.serve.core import EngineCore

    class Pub:
        def __init__(self):
            self.sent = []

        def next_counter(self, topic):
            return len(self.sent)

        def publish(self, topic, record):
            self.sent.append(record)

    llm = LLM(tiny_model, **ENGINE)
    try:
        off, on = Pub(), Pub()
        core = EngineCore(llm, off, step_records=False)
        core.handle(["add", "a", [100, 101], {**SP, "max_tokens": 2}])
        assert len(_steps(core)) == 2
        core = EngineCore(llm, on)
        core.handle(["add", "a", [100, 101], {**SP, "max_tokens": 2}])
        assert len(_steps(core)) == 2
    finally:
        llm.exit()
    assert off.sent == [] and len(on.sent) == 2
