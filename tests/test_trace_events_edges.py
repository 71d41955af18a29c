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
    # an added request without an id names nothing: its sequence keeps its seq name, not "None"
    log = EventLog([_ev("request_added", seq_id=9, request_id=None, prompt_len=1, max_tokens=1)])
    assert log.rid({"seq_id": 9}) == "seq9"


def test_blank_lines_in_a_log_are_skipped(tmp_path):
    log = tmp_path / "events.jsonl"
    log.write_text("\n" + json.dumps(_ev()) + "\n  \n\n" + json.dumps(_ev(run="s")) + "\n")
    assert [e["run"] for e in read_jsonl(log)] == ["r", "s"]
    assert EventLog.from_file(log).num_events == 2
    log.write_text(json.dumps(_ev()) + "\n{not json\n")
    with pytest.raises(LabkitError, match="events.jsonl:2: not valid JSON"):
        read_jsonl(log)


def _saved(tmp_path, events, name="events.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_a_saved_log_read_back_keeps_what_the_whole_log_checks_read(tmp_path):
    # `labkit trace validate` streams a saved log (from_file); the library's callers hand the events over
    # (EventLog(events)). Both must keep the same: which steps exist (an engine_error carries the step it failed
    # in, but is not one of that step's events: a failure at step 4 adds no step 4), each step's first event,
    # and the indexes of the requests, their ends, the aborts and a live window's edges.
    events = chunk_log()
    last = max(e["step"] for e in events if e.get("event") == "after_postprocess")
    events = events[:-1] + [
        _ev("live_state", step=None, kind="open", last_step=0, seqs=[], free_blocks=9),
        _ev("aborted", step=last, seq_id=1, request_id="B"),
        _ev("engine_error", step=last + 1, error="RuntimeError", message="boom"),
        _ev("live_state", step=None, kind="close", last_step=9, seqs=[], free_blocks=9),
    ] + events[-1:]
    streamed, in_memory = EventLog.from_file(_saved(tmp_path, events)), EventLog(events)
    assert sorted(streamed.steps) == sorted(in_memory.steps) == list(range(1, last + 1))
    assert streamed.first_index == in_memory.first_index
    assert sorted(in_memory.first_index) == sorted(in_memory.steps)
    for name in ("added", "aborted", "live_states", "finished_at", "num_events", "timed", "errors"):
        assert getattr(streamed, name) == getattr(in_memory, name), name
    assert [i for i, _ in in_memory.added] == [i for i, e in enumerate(events) if e["event"] == "request_added"]
    assert in_memory.window_open["kind"] == "open" and in_memory.window_close["kind"] == "close"


def test_schema_problems_name_what_is_wrong():
    bare = {k: v for k, v in _ev().items() if k not in ("v", "run", "t_ns")}
    assert event_problems(bare) == ["missing key(s) v, run, t_ns"]
    assert event_problems(_ev(run=3)) == ["'run' must be a string, got 3"]
    assert event_problems(_ev("scheduled", step=1, phase="warmup", seqs=[])) == [
        "scheduled.phase must be prefill, decode or mixed, got 'warmup'"]
    # the phase check is scheduled's: another event's own field of that name is not judged by it
    assert "phase" not in " ".join(event_problems(_ev("gpu_inputs", step=1, phase="warmup")))


def test_a_log_that_is_not_utf8_names_its_line(tmp_path):
    log = tmp_path / "events.jsonl"
    log.write_bytes(json.dumps(_ev()).encode() + b"\n" + b'{"event": "\xff"}\n')
    for read in (read_jsonl, EventLog.from_file):
        with pytest.raises(LabkitError, match=r"events.jsonl:2: not UTF-8 text \(byte"):
            read(log)


def test_a_log_keeps_the_first_max_kept_run_edges_and_errors_and_counts_them_all():
    n = MAX_KEPT + 3
    log = EventLog([_ev("run_start", config={}, model={}, versions={}, run=f"s{i}") for i in range(n)]
                   + [_ev(steps=i) for i in range(n)]
                   + [_ev("engine_error", step=i + 1, error="E", message=str(i)) for i in range(n)])
    assert len(log.run_starts) == len(log.run_ends) == len(log.errors) == MAX_KEPT
    assert log.num_run_starts == log.num_run_ends == log.num_errors == n
    assert log.run_start["run"] == "s0" and log.errors[0]["message"] == "0"
