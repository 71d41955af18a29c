"""The tracer seam between the engine and labkit. The engine calls `emit` only when a tracer is set, and
builds event payloads only then, so tracing off costs one `is None` test per hook.

Event schema v1: every event is {"v": 1, "event", "run", "t_ns", "step", ...fields}.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from typing import IO

_STAMPS = frozenset(("v", "run", "t_ns", "step"))  # ("event" is emit's own parameter)

class Tracer:
    """Base tracer: stamps events; subclasses decide where they go (`record`)."""

    def __init__(self, run: str | None = None):
        self.run = run or uuid.uuid4().hex[:12]
        self.step: int | None = None
        self.shapes = False  # ask the model for model_shape events

    def emit(self, event: str, **fields) -> None:
        if _STAMPS.intersection(fields):  # the validator trusts these stamps: a field must not overwrite one
            raise TypeError(f"Tracer.emit({event!r}): {sorted(_STAMPS.intersection(fields))} are the tracer's stamps")
        record = {"v": 1, "event": event, "run": self.run, "t_ns": time.monotonic_ns(), "step": self.step}
        record.update(fields)
        self.record(record)

    def record(self, event: dict) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class ListTracer(Tracer):
    """Keeps events in memory (tests, in-process analysis)."""

    def __init__(self, run: str | None = None):
        super().__init__(run)
        self.events: list[dict] = []

    def record(self, event: dict) -> None:
        self.events.append(event)


class JsonlTracer(Tracer):
    """Appends one JSON object per line; keeps a copy in memory when `keep` is set."""

    def __init__(self, path: str | os.PathLike, run: str | None = None, keep: bool = False):
        super().__init__(run)
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._file: IO[str] | None = open(self.path, "w", encoding="utf-8")
        self.events: list[dict] | None = [] if keep else None

    def record(self, event: dict) -> None:
        if self._file is None:
            raise RuntimeError(f"tracer: {self.path} is closed")
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        if self.events is not None:
            self.events.append(event)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
