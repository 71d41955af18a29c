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


def read_jsonl(path) -> list[dict]:
    """Read an event log; LabkitError (naming the line) on bad JSON or a schema problem."""
    p = Path(path)
    try:
        f = p.open(encoding="utf-8")
    except OSError as e:
        raise LabkitError(f"cannot read event log {p}: {e}") from None
    events: list[dict] = []
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                e = json.loads(line)
            except json.JSONDecodeError as ex:
                raise LabkitError(f"{p}:{lineno}: not valid JSON ({ex.msg})") from None
            probs = event_problems(e)
            if probs:
                raise LabkitError(f"{p}:{lineno}: {'; '.join(probs)}")
            events.append(e)
    return events


def write_jsonl(events, path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as f:
        for e in events:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")
    return p


class EventLog:
    """A log indexed by step and event name, with request ids for every seq_id it has seen."""

    def __init__(self, events: list[dict]):
        self.events = [e for e in events if isinstance(e, dict)]
        self.run_starts = [e for e in self.events if e.get("event") == "run_start"]
        self.run_ends = [e for e in self.events if e.get("event") == "run_end"]
        self.added: list[tuple[int, dict]] = []
        self.steps: dict[int, dict[str, list[dict]]] = {}
        self.first_index: dict[int, int] = {}
        self.seq_req: dict[Any, str] = {}
        for i, e in enumerate(self.events):
            ev = e.get("event")
            if ev == "request_added":
                self.added.append((i, e))
                if e.get("seq_id") is not None and e.get("request_id") is not None:
                    self.seq_req[e["seq_id"]] = str(e["request_id"])
            elif ev in STEP_EVENTS and is_int(e.get("step")):
                st = e["step"]
                self.steps.setdefault(st, {}).setdefault(ev, []).append(e)
                self.first_index.setdefault(st, i)
        self.run_start = self.run_starts[0] if self.run_starts else {}
        # A live window (labkit trace --url): it starts from a live_state "open" and ends at one "close".
        states = [e for e in self.events if e.get("event") == "live_state"]
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
