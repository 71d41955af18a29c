"""The event log at its edges (labkit/trace/events.py): the schema version and integer fields, a saved log read
back step by step as it was written, the run ids it keeps, the first trace_context, where a step starts, a request
whose id is 0, blank lines."""
from __future__ import annotations

import json

import pytest

from labkit.errors import LabkitError
from labkit.trace.events import MAX_KEPT, EventLog, event_problems, read_jsonl
from tests.test_validate import chunk_log


def _ev(event="run_end", **fields):
    return {"v": 1, "event": event, "run": "r", "t_ns": 1, "step": None, "steps": 0, "wall_s": 0.0, **fields}


def test_only_the_current_schema_version_passes():
    assert event_problems(_ev()) == []
    for v in (0, 2):
        assert event_problems(_ev(v=v)) == [f"schema version v={v}, expected 1"]


def test_a_boolean_is_not_an_integer_time_or_step():
    assert event_problems(_ev(t_ns=True)) == ["'t_ns' must be an integer, got True"]
    assert any("'step' must be an integer or null" in p for p in event_problems(_ev(step=False)))


def test_a_saved_log_gives_back_each_steps_own_events(tmp_path):
    events = chunk_log()
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    streamed, in_memory = EventLog.from_file(log), EventLog(events)
    assert sorted(streamed.steps) == sorted(in_memory.steps)
    for step in in_memory.steps:
        for name in ("before_schedule", "scheduled", "gpu_inputs", "after_postprocess"):
            assert streamed.all(step, name) == in_memory.all(step, name), (step, name)


def test_a_log_keeps_at_most_max_kept_run_ids():
    log = EventLog([_ev(run=f"r{i}") for i in range(MAX_KEPT + 20)])
    assert len(log.runs) == MAX_KEPT and log.first_run == "r0"


def test_the_first_trace_context_is_the_one_a_replay_goes_by():
    ctx = [_ev("trace_context", expect_changes=flag) for flag in (False, True)]
    assert EventLog(ctx).trace_context["expect_changes"] is False


def test_a_steps_first_index_is_its_first_event():
    events = chunk_log()
    log = EventLog(events)
    for step in log.steps:
        assert log.first_index[step] == next(i for i, e in enumerate(events) if e.get("step") == step)


def test_a_request_whose_id_is_zero_keeps_it():
    log = EventLog([_ev("request_added", seq_id=7, request_id="R7", prompt_len=1, max_tokens=1)])
    assert log.rid({"seq_id": 7, "request_id": 0}) == "0"
    assert log.rid({"seq_id": 7}) == "R7" and log.rid({"seq_id": 8}) == "seq8"


def test_blank_lines_in_a_log_are_skipped(tmp_path):
    log = tmp_path / "events.jsonl"
    log.write_text("\n" + json.dumps(_ev()) + "\n  \n\n" + json.dumps(_ev(run="s")) + "\n")
    assert [e["run"] for e in read_jsonl(log)] == ["r", "s"]
    assert EventLog.from_file(log).num_events == 2
    log.write_text(json.dumps(_ev()) + "\n{not json\n")
    with pytest.raises(LabkitError, match="events.jsonl:2: not valid JSON"):
        read_jsonl(log)
