"""The engine's event log of a running server (`labkit serve --live-trace`), for `labkit trace --url`.

The engine core runs with this tracer. It keeps, from the events alone, what the validator's replay would know
at this point of the log: the run_start event, and each live sequence's request_added event, token ids, state
and block table, and the free blocks. A client opens a window (`open`): the tracer publishes, between two engine
steps, a snapshot of that knowledge as ordinary v1 events (run_start, one request_added per live sequence) and a
`live_state` event (each live sequence's status, counts, block table and token ids; the free blocks; the last
step committed), then every event the engine emits, a batch per step, until the window is closed with a second
`live_state`. Replayed from the first live_state, the window is checked by every invariant of
labkit/trace/validate.py as a whole run would be; the second says what must be live at the end (no request lost
or duplicated). Between windows only the small model above is kept up to date; events go out only while a
window is open.

Messages on the core's stream socket, topic b"trace": {"events": [event, ...]} per step, and {"mark": token,
"kind": "open"|"close", "events": [...]} for a window's edges.
"""
from __future__ import annotations

from engine.trace import Tracer

TRACE_TOPIC = b"trace"


class LiveTracer(Tracer):
    def __init__(self, publisher, run: str | None = None):
        super().__init__(run)
        self.publisher = publisher
        self.run_start: dict | None = None
        self.live: dict = {}                # seq_id -> {"added": request_added event, "tokens", "state"}
        self.free_blocks: int | None = None
        self.last_step = 0
        self.windows: set[str] = set()      # open windows' tokens
        self.buffer: list[dict] = []
        self.t_ns = 0                       # the last event's time: a snapshot sits between it and the next

    # --- the engine's events
    def record(self, e: dict) -> None:
        kind = e["event"]
        self.t_ns = e["t_ns"]
        if kind == "after_postprocess":
            live = self.live
            for a in e["seqs"]:
                q = live.get(a["seq_id"])
                if q is None:
                    continue
                if a["status"] == "FINISHED":
                    del live[a["seq_id"]]
                    continue
                if a["accepted"]:
                    q["tokens"].append(a["token_id"])
                q["state"] = (a["status"], a["num_tokens"], a["num_cached_tokens"], a["num_completion_tokens"],
                              a["block_table"])
            self.free_blocks = e["free_blocks"]
            self.last_step = e["step"]
        elif kind == "request_added":
            self.live[e["seq_id"]] = {"added": e, "tokens": list(e["prompt_token_ids"]),
                                      "state": ("WAITING", e["prompt_len"], 0, 0, [])}
        elif kind == "preempted":
            q = self.live.get(e["seq_id"])
            if q is not None:
                _, nt, _, comp, _ = q["state"]
                q["state"] = ("WAITING", nt, 0, comp, [])
        elif kind == "aborted":
            self.live.pop(e["seq_id"], None)
            self.free_blocks = e["free_blocks"]
        elif kind == "run_start":
            self.run_start = e
            self.free_blocks = e.get("num_kvcache_blocks")
        if self.windows:
            self.buffer.append(e)

    def flush(self) -> None:
        """The events since the last flush, to the open windows (the core calls it after each step)."""
        if self.buffer:
            events, self.buffer = self.buffer, []
            self.publisher.publish(TRACE_TOPIC, {"events": events})

    # --- windows
    def snapshot(self, kind: str) -> list[dict]:
        """What the replay knows at this point, as v1 events (see the module's doc)."""
        seqs = []
        for seq_id, q in sorted(self.live.items()):
            status, nt, nc, comp, table = q["state"]
            seqs.append({"seq_id": seq_id, "request_id": q["added"]["request_id"], "status": status,
                         "num_tokens": nt, "num_cached_tokens": nc, "num_completion_tokens": comp,
                         "block_table": list(table), "token_ids": list(q["tokens"])})
        state = {"v": 1, "event": "live_state", "run": self.run, "t_ns": self.t_ns, "step": None,
                 "kind": kind, "last_step": self.last_step, "seqs": seqs, "free_blocks": self.free_blocks}
        if kind == "close":
            return [state]
        added = [q["added"] for _, q in sorted(self.live.items())]
        return ([self.run_start] if self.run_start else []) + added + [state]

    def open(self, token: str) -> None:
        self.flush()
        self.publisher.publish(TRACE_TOPIC, {"mark": token, "kind": "open", "events": self.snapshot("open")})
        self.windows.add(token)

    def close(self, token: str | None = None) -> None:
        """Close window `token`; None (Tracer.close: the engine exits) only sends what is buffered."""
        self.flush()
        if token in self.windows:
            self.windows.discard(token)
            self.publisher.publish(TRACE_TOPIC, {"mark": token, "kind": "close", "events": self.snapshot("close")})


class _Collect:
    """A publisher that keeps what it is given (cut_window)."""

    def __init__(self):
        self.sent: list = []

    def publish(self, topic: bytes, obj) -> None:
        self.sent.append(obj)


def cut_window(events: list[dict], open_after: int, close_after: int) -> list[dict]:
    """The window a live server would have sent for a recorded run: opened once step `open_after` committed (0:
    before the first step), closed once `close_after` did. Built by feeding the events through LiveTracer, as the
    engine would have (a test's way to check the snapshots against whole runs)."""
    pub = _Collect()
    tracer = LiveTracer(pub, run=next((e["run"] for e in events if e.get("run")), None))
    opened = open_after == 0
    steps_done = 0

    def edge(kind: str) -> None:
        (tracer.open if kind == "open" else tracer.close)("w")

    if opened:
        run_start = [e for e in events if e.get("event") == "run_start"]
        for e in run_start:
            tracer.record(e)
        edge("open")
        events = [e for e in events if e.get("event") != "run_start"]
    for i, e in enumerate(events):
        tracer.record(e)
        if e.get("event") == "after_postprocess":
            steps_done = e["step"]
            nxt = events[i + 1] if i + 1 < len(events) else {}
            if nxt.get("step") == steps_done:
                continue                   # (the step's own events are not over)
            tracer.flush()
            if steps_done == open_after and not opened:
                opened = True
                edge("open")
            if steps_done == close_after:
                edge("close")
                break
    out = []
    for message in pub.sent:
        out += message["events"]
    return out
