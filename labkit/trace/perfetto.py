"""Chrome trace-event JSON (opens in ui.perfetto.dev) from an event log: a lane per request, a lane for
engine steps, counters for free blocks and batch size."""
from __future__ import annotations

import json
from pathlib import Path

from .tables import row_kind

_REQUESTS_PID, _ENGINE_PID = 1, 2


def _us(t_ns: int, t0: int) -> float:
    return (t_ns - t0) / 1000.0


def to_trace_events(events: list[dict]) -> dict:
    if not events:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    t0 = min(e["t_ns"] for e in events)
    out: list[dict] = [
        {"ph": "M", "pid": _REQUESTS_PID, "name": "process_name", "args": {"name": "requests"}},
        {"ph": "M", "pid": _ENGINE_PID, "name": "process_name", "args": {"name": "engine"}},
        {"ph": "M", "pid": _ENGINE_PID, "tid": 0, "name": "thread_name", "args": {"name": "steps"}},
    ]
    label: dict[int, str] = {}
    prompt_len: dict[int, int] = {}
    tid: dict[int, int] = {}
    queued_since: dict[int, int] = {}
    steps: dict[int, dict[str, dict]] = {}
    for e in events:
        if e.get("step") is not None:
            steps.setdefault(e["step"], {}).setdefault(e["event"], e)
        if e["event"] == "request_added":
            sid = e["seq_id"]
            label[sid] = str(e.get("request_id", sid))
            prompt_len[sid] = e.get("prompt_len")
            tid[sid] = len(tid) + 1
            queued_since[sid] = e["t_ns"]
            out.append({"ph": "M", "pid": _REQUESTS_PID, "tid": tid[sid], "name": "thread_name",
                        "args": {"name": f"{label[sid]} (seq {sid})"}})
        elif e["event"] == "preempted":
            sid = e["seq_id"]
            out.append({"ph": "i", "pid": _REQUESTS_PID, "tid": tid.get(sid, 0), "ts": _us(e["t_ns"], t0),
                        "name": "preempted", "s": "t"})
    for step in sorted(steps):
        ev = steps[step]
        start = ev.get("before_schedule", ev.get("scheduled"))
        end = ev.get("after_postprocess")
        sched = ev.get("scheduled")
        if start is None or end is None or sched is None:
            continue
        ts, dur = _us(start["t_ns"], t0), max(_us(end["t_ns"], t0) - _us(start["t_ns"], t0), 0.001)
        phase = sched["phase"]
        out.append({"ph": "X", "pid": _ENGINE_PID, "tid": 0, "ts": ts, "dur": dur, "name": f"step {step} {phase}",
                    "args": {"phase": phase, "seqs": len(sched["seqs"]),
                             "tokens": sum(s["num_scheduled_tokens"] for s in sched["seqs"])}})
        out.append({"ph": "C", "pid": _ENGINE_PID, "ts": _us(end["t_ns"], t0), "name": "free_blocks",
                    "args": {"free": end.get("free_blocks", 0)}})
        out.append({"ph": "C", "pid": _ENGINE_PID, "ts": ts, "name": "batch",
                    "args": {"seqs": len(sched["seqs"])}})
        after = {a["seq_id"]: a for a in end.get("seqs", [])}
        for s in sched["seqs"]:
            sid = s["seq_id"]
            if sid in queued_since:  # the wait in `waiting` ends when the request is first scheduled again
                q0 = queued_since.pop(sid)
                out.append({"ph": "X", "pid": _REQUESTS_PID, "tid": tid.get(sid, 0), "ts": _us(q0, t0),
                            "dur": max(ts - _us(q0, t0), 0.001), "name": "queued"})
            a = after.get(sid, {})
            # A mixed step's decode rows are told apart by their own counts (tables.row_kind); a prefill row is a
            # chunk when its candidate token was not accepted.
            if row_kind(s, phase, prompt_len.get(sid)) == "decode":
                name = "decode"
            else:
                name = "prefill" if a.get("accepted") else "prefill chunk"
            out.append({"ph": "X", "pid": _REQUESTS_PID, "tid": tid.get(sid, 0), "ts": ts, "dur": dur, "name": name,
                        "args": {"step": step, "scheduled": s["num_scheduled_tokens"],
                                 "cached": s["num_cached_tokens"], "token_id": a.get("token_id"),
                                 "accepted": a.get("accepted")}})
            if a.get("status") == "FINISHED":
                out.append({"ph": "i", "pid": _REQUESTS_PID, "tid": tid.get(sid, 0), "ts": ts + dur,
                            "name": "finished", "s": "t"})
        for p_sid in [e["seq_id"] for e in events if e["event"] == "preempted" and e.get("step") == step]:
            queued_since[p_sid] = end["t_ns"]
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_perfetto(events: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_trace_events(events)))
    return path
