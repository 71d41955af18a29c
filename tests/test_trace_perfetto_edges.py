"""The Perfetto (Chrome trace-event) file of an event log: times in microseconds from the log's first event, a
request's row named prefill or prefill chunk by whether its token was accepted, the wait of a preempted request
starting when its preempting step ends, and a finish marked at the end of the step that finished it."""
from __future__ import annotations

import json

from labkit.trace.perfetto import to_trace_events, write_perfetto

MS = 1_000_000  # ns


def _seq(seq_id, rid, new, cached=0):
    return {"seq_id": seq_id, "request_id": rid, "num_tokens": cached + new, "num_cached_tokens": cached,
            "num_scheduled_tokens": new, "block_table": [0]}


def _after(seq_id, rid, accepted, status="RUNNING", token=5):
    return {"seq_id": seq_id, "request_id": rid, "accepted": accepted, "status": status, "token_id": token,
            "num_tokens": 1, "num_cached_tokens": 0, "num_completion_tokens": 1, "block_table": [0]}


def _step(n, t0_ms, t1_ms, phase, seqs, afters, free=3):
    return [{"event": "before_schedule", "step": n, "t_ns": t0_ms * MS, "waiting": [], "running": [],
             "free_blocks": free},
            {"event": "scheduled", "step": n, "t_ns": t0_ms * MS, "phase": phase, "seqs": seqs},
            {"event": "after_postprocess", "step": n, "t_ns": t1_ms * MS, "seqs": afters, "free_blocks": free}]


def _log():
    """A (seq 1) and B (seq 2) added at 0 ms. Step 1 (1-3 ms): A's first chunk (discarded) and B's whole prompt.
    Step 2 (4-5 ms): A's last chunk, accepted; B preempted. Step 3 (10-12 ms): B again, finishing."""
    ev = [{"event": "request_added", "step": None, "t_ns": 0, "seq_id": 1, "request_id": "A", "prompt_len": 8,
           "max_tokens": 2},
          {"event": "request_added", "step": None, "t_ns": 0, "seq_id": 2, "request_id": "B", "prompt_len": 2,
           "max_tokens": 1}]
    ev += _step(1, 1, 3, "prefill", [_seq(1, "A", 4), _seq(2, "B", 2)],
                [_after(1, "A", False), _after(2, "B", True)])
    ev += _step(2, 4, 5, "prefill", [_seq(1, "A", 4, cached=4)], [_after(1, "A", True)])
    ev.append({"event": "preempted", "step": 2, "t_ns": 4 * MS + 500, "seq_id": 2, "request_id": "B"})
    ev += _step(3, 10, 12, "prefill", [_seq(2, "B", 3)], [_after(2, "B", True, status="FINISHED")])
    return ev


def _x(trace, name, **where):
    return [e for e in trace["traceEvents"] if e.get("ph") in ("X", "i") and e["name"] == name
            and all(e.get(k) == v for k, v in where.items())]


def test_times_are_microseconds_from_the_first_event(tmp_path):
    trace = json.loads(write_perfetto(_log(), tmp_path / "t.json").read_text())
    (step1,) = _x(trace, "step 1 prefill")
    # Step 1 runs from 1 ms to 3 ms after the first event: ts 1,000 us, 2,000 us long.
    assert step1["ts"] == 1000.0 and step1["dur"] == 2000.0
    (step3,) = _x(trace, "step 3 prefill")
    assert step3["ts"] == 10_000.0 and step3["dur"] == 2000.0


def test_a_rows_name_follows_whether_its_token_was_accepted():
    trace = to_trace_events(_log())
    tid_a = next(e["tid"] for e in trace["traceEvents"] if e.get("name") == "thread_name"
                 and e["args"]["name"].startswith("A "))
    a_rows = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("tid") == tid_a
              and e["pid"] == 1 and e["name"] != "queued"]
    # Step 1's chunk was discarded (not the prompt's end), step 2's token accepted: chunk, then prefill.
    assert [(e["args"]["step"], e["name"]) for e in a_rows] == [(1, "prefill chunk"), (2, "prefill")]


def test_a_preempted_request_waits_from_the_end_of_the_step_that_preempted_it():
    trace = to_trace_events(_log())
    tid_b = next(e["tid"] for e in trace["traceEvents"] if e.get("name") == "thread_name"
                 and e["args"]["name"].startswith("B "))
    queued = [e for e in _x(trace, "queued") if e["tid"] == tid_b]
    # First wait: added at 0 ms, scheduled at 1 ms. Second: step 2 ends at 5 ms, step 3 starts at 10 ms.
    assert [(e["ts"], e["dur"]) for e in queued] == [(0.0, 1000.0), (5000.0, 5000.0)]


def test_a_finish_is_marked_at_the_end_of_its_step():
    trace = to_trace_events(_log())
    (fin,) = _x(trace, "finished")
    assert fin["ts"] == 12_000.0   # step 3 ends at 12 ms


def test_a_mixed_steps_decode_row_is_named_decode_and_its_prefill_rows_by_acceptance():
    """Step 1: A's whole 2-token prompt. Step 2 (mixed): A decodes its one token while B's 8-token prompt takes
    its first 4-token chunk. Step 3 (mixed): A decodes again, B's last chunk is accepted."""
    ev = [{"event": "request_added", "step": None, "t_ns": 0, "seq_id": 1, "request_id": "A", "prompt_len": 2,
           "max_tokens": 4},
          {"event": "request_added", "step": None, "t_ns": 0, "seq_id": 2, "request_id": "B", "prompt_len": 8,
           "max_tokens": 2}]
    ev += _step(1, 1, 2, "prefill", [_seq(1, "A", 2)], [_after(1, "A", True)])
    ev += _step(2, 3, 4, "mixed", [_seq(1, "A", 1, cached=2), _seq(2, "B", 4)],
                [_after(1, "A", True), _after(2, "B", False)])
    ev += _step(3, 5, 6, "mixed", [_seq(1, "A", 1, cached=3), _seq(2, "B", 4, cached=4)],
                [_after(1, "A", True), _after(2, "B", True)])
    trace = to_trace_events(ev)
    rows = {(e["args"]["step"], e["tid"]): e["name"] for e in trace["traceEvents"]
            if e.get("ph") == "X" and e.get("pid") == 1 and "step" in e.get("args", {})}
    assert rows == {(1, 1): "prefill", (2, 1): "decode", (2, 2): "prefill chunk", (3, 1): "decode",
                    (3, 2): "prefill"}
