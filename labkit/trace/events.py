"""The engine's event log (SPEC section 6): its schema, reading and writing JSONL, and an index of a log
by step that the validator and the tables share."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from labkit.errors import LabkitError

SCHEMA_VERSION = 1
COMMON_KEYS = ("v", "event", "run", "t_ns", "step")
REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "run_start": ("config", "model", "device", "versions"),
    "request_added": ("seq_id", "request_id", "prompt_len", "max_tokens"),
    "before_schedule": ("waiting", "running", "free_blocks"),
    "scheduled": ("phase", "seqs"),
    "preempted": ("seq_id", "request_id"),
    "gpu_inputs": ("num_input_ids", "positions", "slot_mapping", "cu_seqlens_q", "cu_seqlens_k",
                   "max_seqlen_q", "max_seqlen_k", "context_lens", "block_tables", "execution",
                   "graph_batch"),
    "sampled": ("tokens",),
    "after_postprocess": ("seqs", "free_blocks"),
    "model_shape": ("layer", "module", "shape"),
    "run_end": ("steps", "wall_s"),
    # written by labkit's trace runner, not the engine: the engine raised (or stopped making progress)
    # in this step; the steps before it are still judged
    "engine_error": ("error", "message"),
    # written by `labkit trace` after run_start: whether the run was meant to change the case's states, and why
    "trace_context": ("expect_changes",),
    # written by a live server (labkit serve --live-trace) at the edges of a window `labkit trace --url` recorded:
    # kind "open" (what the log before it would have left: every live sequence's state, token ids and blocks,
    # the free blocks, the last step committed) or "close" (the same at the window's end)
    "live_state": ("kind", "seqs", "free_blocks", "last_step"),
}
SEQ_KEYS: dict[str, tuple[str, ...]] = {
    "scheduled": ("seq_id", "request_id", "num_tokens", "num_cached_tokens",
                  "num_scheduled_tokens", "block_table"),
    "after_postprocess": ("seq_id", "request_id", "num_tokens", "num_cached_tokens",
                          "num_completion_tokens", "status", "block_table", "accepted", "token_id"),
}
# Events that belong to one engine step (their `step` must be an integer >= 1).
STEP_EVENTS = ("before_schedule", "scheduled", "preempted", "gpu_inputs", "sampled",
               "after_postprocess", "aborted")  # aborted: in a step when it came while that step ran (async)
PHASES = ("prefill", "decode", "mixed")  # mixed: decode rows first, then prefill chunks (scheduling_policy mixed)
STATUSES = ("WAITING", "RUNNING", "FINISHED")


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def seq_entries(e, key: str = "seqs") -> list[dict]:
    """The dict entries of e[key] when e is an event (a dict) and that is a list; else none (a malformed log's
    schema checks say what is wrong with it, and every other check reads it as empty instead of crashing)."""
    v = e.get(key) if isinstance(e, dict) else None
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def event_problems(e) -> list[str]:
    """Schema problems of one event (empty list when it is fine)."""
    if not isinstance(e, dict):
        return [f"an event must be a JSON object, got {type(e).__name__}"]
    probs = []
    missing = [k for k in COMMON_KEYS if k not in e]
    if missing:
        probs.append(f"missing key(s) {', '.join(missing)}")
    if "v" in e and e["v"] != SCHEMA_VERSION:
        probs.append(f"schema version v={e['v']!r}, expected {SCHEMA_VERSION}")
    ev = e.get("event")
    if "event" in e and not isinstance(ev, str):
        probs.append(f"'event' must be a string, got {ev!r}")
    if "run" in e and not isinstance(e["run"], str):
        probs.append(f"'run' must be a string, got {e['run']!r}")
    if "t_ns" in e and not is_int(e["t_ns"]):
        probs.append(f"'t_ns' must be an integer, got {e['t_ns']!r}")
    if "step" in e and e["step"] is not None and not is_int(e["step"]):
        probs.append(f"'step' must be an integer or null, got {e['step']!r}")
    if ev in STEP_EVENTS and "step" in e and not (is_int(e["step"]) and e["step"] >= 1):
        probs.append(f"a {ev} event needs an integer step >= 1, got {e['step']!r}")
    if isinstance(ev, str) and ev in REQUIRED_KEYS:
        miss = [k for k in REQUIRED_KEYS[ev] if k not in e]
        if miss:
            probs.append(f"{ev} event lacks {', '.join(miss)}")
        if ev in SEQ_KEYS and "seqs" in e:
            seqs = e["seqs"]
            if not isinstance(seqs, list):
                probs.append(f"{ev}.seqs must be a list")
            else:
                for j, s in enumerate(seqs):
                    if not isinstance(s, dict):
                        probs.append(f"{ev}.seqs[{j}] must be an object")
                        continue
                    miss = [k for k in SEQ_KEYS[ev] if k not in s]
                    if miss:
                        probs.append(f"{ev}.seqs[{j}] lacks {', '.join(miss)}")
        if ev == "scheduled" and "phase" in e and e["phase"] not in PHASES:
            probs.append(f"scheduled.phase must be prefill, decode or mixed, got {e['phase']!r}")
        if ev == "run_start":
            probs += _run_start_problems(e)
    return probs


def _run_start_problems(e: dict) -> list[str]:
    """The types readers of run_start rely on (trace check takes model.path as the model folder)."""
    probs = []
    for key in ("config", "model", "versions"):
        if key in e and not isinstance(e[key], dict):
            probs.append(f"run_start.{key} must be an object, got {type(e[key]).__name__}")
    path = e["model"].get("path") if isinstance(e.get("model"), dict) else None
    if path is not None and not isinstance(path, str):
        probs.append(f"run_start.model.path must be a string, got {type(path).__name__}")
    if "device" in e and not isinstance(e["device"], str):
        probs.append(f"run_start.device must be a string, got {type(e['device']).__name__}")
    return probs


def _parse_line(p: Path, lineno: int, line) -> dict:
    try:
        e = json.loads(line)
    except json.JSONDecodeError as ex:
        raise LabkitError(f"{p}:{lineno}: not valid JSON ({ex.msg})") from None
    except UnicodeDecodeError as ex:
        raise LabkitError(f"{p}:{lineno}: not UTF-8 text (byte {ex.start})") from None
    probs = event_problems(e)
    if probs:
        raise LabkitError(f"{p}:{lineno}: {'; '.join(probs)}")
    return e


class _StepsOnDisk:
    """EventLog.steps for a log on disk: step -> {event name: [events]}, read back from the step's line offsets
    when asked for; the last step read is kept (a step's checks ask for it several times)."""

    def __init__(self, path: Path, offsets: dict[int, list[int]]):
        self._path, self._offsets = path, offsets
        self._cached: tuple[int, dict] | None = None

    def __getitem__(self, step: int) -> dict[str, list[dict]]:
        if self._cached is not None and self._cached[0] == step:
            return self._cached[1]
        events: dict[str, list[dict]] = {}
        with self._path.open("rb") as f:
            for at in self._offsets[step]:
                f.seek(at)
                e = json.loads(f.readline())
                events.setdefault(e["event"], []).append(e)
        self._cached = (step, events)
        return events

    def get(self, step: int, default=None):
        return self[step] if step in self._offsets else default

    def __contains__(self, step) -> bool:
        return step in self._offsets

    def __iter__(self):
        return iter(self._offsets)

    def __len__(self) -> int:
        return len(self._offsets)


class EventFile:
    """A saved log read as a stream, every time it is iterated: each line checked as read_jsonl checks it when the
    object is made (LabkitError naming the line), then yielded one event at a time by `iter`, so that a reader
    of the whole log (the report's pictures) holds one event at a time, not the million of a long run."""

    def __init__(self, path):
        self.path = Path(path)
        self.num_events = sum(1 for _ in self._events())

    def _events(self):
        try:
            f = self.path.open("rb")
        except OSError as e:
            raise LabkitError(f"cannot read event log {self.path}: {e}") from None
        with f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    yield _parse_line(self.path, lineno, line)

    def __iter__(self):
        return self._events()

    def __len__(self) -> int:
        return self.num_events


def read_jsonl(path) -> list[dict]:
    """Read an event log; LabkitError (naming the line) on bad JSON, text that is not UTF-8 or a schema problem."""
    p = Path(path)
    try:
        f = p.open("rb")
    except OSError as e:
        raise LabkitError(f"cannot read event log {p}: {e}") from None
    with f:
        return [_parse_line(p, lineno, line) for lineno, line in enumerate(f, 1) if line.strip()]


def write_jsonl(events, path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as f:
        for e in events:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")
    return p


MAX_KEPT = 100  # of the events a whole-log check lists (engine errors, run ids, times going backwards)


class EventLog:
    """A log indexed by step and event name, with request ids for every seq_id it has seen, and what the checks
    of the whole log need (its run ids, its times going backwards, its run_start and run_end events, the
    requests added and aborted, engine errors, where each request first finished), gathered in one pass.

    `EventLog(events)` indexes a list in memory. `EventLog.from_file(path)` streams a saved log: one pass keeps
    the summary above and each step's lines by their offset in the file, and a step's events are read back when
    the step is asked for (one step at a time), so a million-line log is checked in memory that grows with its
    steps and requests, not with its events (a list of them took 4.7 GB). `events` is the list for the first
    form and None for the second."""

    def __init__(self, events: list[dict] | None = None):
        self.events = [e for e in events or [] if isinstance(e, dict)] if events is not None else None
        self.num_events = 0
        self.run_starts: list[dict] = []      # the first MAX_KEPT
        self.num_run_starts = 0
        self.run_ends: list[dict] = []        # the first MAX_KEPT
        self.num_run_ends = 0
        self.added: list[tuple[int, dict]] = []
        self.aborted: list[tuple[int, dict]] = []
        self.live_states: list[tuple[int, dict]] = []  # a live window's edges (labkit trace --url)
        self.errors: list[dict] = []          # engine_error events, the first MAX_KEPT
        self.num_errors = 0
        self.runs: set = set()                # the run ids seen (at most MAX_KEPT)
        self.first_run = None
        self.trace_context: dict | None = None
        self.timed = 0                        # events with an integer t_ns
        self.time_reversals: list[tuple] = []  # (event, step, previous t_ns, t_ns): the first MAX_KEPT
        self.num_time_reversals = 0
        self._last_t = None
        self.finished_at: dict[str, int] = {}  # request id -> index of the first after_postprocess it FINISHED in
        self.first_index: dict[int, int] = {}
        self.seq_req: dict[Any, str] = {}
        self.steps: dict = {}
        for i, e in enumerate(self.events or []):
            self._note(i, e)
            if e.get("event") in STEP_EVENTS and is_int(e.get("step")):
                self.steps.setdefault(e["step"], {}).setdefault(e["event"], []).append(e)
        self._done()

    @classmethod
    def from_file(cls, path) -> "EventLog":
        """A saved log, streamed (see the class); LabkitError naming the line on bad JSON or a schema problem,
        as read_jsonl."""
        p = Path(path)
        log = cls()
        offsets: dict[int, list[int]] = {}
        try:
            f = p.open("rb")
        except OSError as e:
            raise LabkitError(f"cannot read event log {p}: {e}") from None
        with f:
            at, i = 0, 0
            for lineno, line in enumerate(f, 1):
                here, at = at, at + len(line)
                if not line.strip():
                    continue
                e = _parse_line(p, lineno, line)
                log._note(i, e)
                if e.get("event") in STEP_EVENTS and is_int(e.get("step")):
                    offsets.setdefault(e["step"], []).append(here)
                i += 1
        log.steps = _StepsOnDisk(p, offsets)
        log._done()
        return log

    def _note(self, i: int, e: dict) -> None:
        """What the whole-log checks keep of event number i."""
        self.num_events += 1
        ev = e.get("event")
        run = e.get("run")
        if len(self.runs) < MAX_KEPT:
            self.runs.add(run)
        if self.first_run is None and run is not None:
            self.first_run = run
        t = e.get("t_ns")
        if is_int(t):
            self.timed += 1
            if self._last_t is not None and t < self._last_t:
                self.num_time_reversals += 1
                if len(self.time_reversals) < MAX_KEPT:
                    self.time_reversals.append((ev, e.get("step"), self._last_t, t))
            self._last_t = t
        if ev == "request_added":
            self.added.append((i, e))
            if e.get("seq_id") is not None and e.get("request_id") is not None:
                self.seq_req[e["seq_id"]] = str(e["request_id"])
        elif ev == "run_start":
            self.num_run_starts += 1
            if len(self.run_starts) < MAX_KEPT:
                self.run_starts.append(e)
        elif ev == "run_end":
            self.num_run_ends += 1
            if len(self.run_ends) < MAX_KEPT:
                self.run_ends.append(e)
        elif ev == "engine_error":
            self.num_errors += 1
            if len(self.errors) < MAX_KEPT:
                self.errors.append(e)
        elif ev == "trace_context" and self.trace_context is None:
            self.trace_context = e
        if ev == "aborted":
            self.aborted.append((i, e))
        elif ev == "live_state":
            self.live_states.append((i, e))
        elif ev == "after_postprocess":
            for a in seq_entries(e):
                if a.get("status") == "FINISHED":
                    self.finished_at.setdefault(self.rid(a), i)
        if ev in STEP_EVENTS and is_int(e.get("step")):
            self.first_index.setdefault(e["step"], i)

    def _done(self) -> None:
        self.run_start = self.run_starts[0] if self.run_starts else {}
        # A live window (labkit trace --url): it starts from a live_state "open" and ends at one "close".
        states = [e for _, e in self.live_states]
        self.window_open = next((e for e in states if e.get("kind") == "open"), None)
        self.window_close = next((e for e in states if e.get("kind") == "close"), None)
        self.config = self.run_start.get("config") if isinstance(self.run_start.get("config"), dict) else {}

    def one(self, step: int, ev: str) -> dict | None:
        lst = self.steps.get(step, {}).get(ev) or []
        return lst[0] if lst else None

    def all(self, step: int, ev: str) -> list[dict]:
        return self.steps.get(step, {}).get(ev) or []

    def rid(self, entry: dict) -> str:
        r = entry.get("request_id")
        if r is None:
            r = self.seq_req.get(entry.get("seq_id"), f"seq{entry.get('seq_id')}")
        return str(r)

    def rids(self, seq_ids) -> list[str]:
        return [self.seq_req.get(s, f"seq{s}") for s in (seq_ids or [])]
