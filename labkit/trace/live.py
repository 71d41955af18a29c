"""`labkit trace --url URL --seconds N`: record a window of a running server's engine event log (the server runs
with `labkit serve --live-trace`; GET /v1/trace) into a normal events.jsonl, to be validated like any run.

The window starts with the state the log before it would have left (run_start, the live requests, a live_state)
and ends with a second live_state: labkit/serve/live_trace.py says how, labkit/trace/validate.py checks it.
"""
from __future__ import annotations

import json
from pathlib import Path

from labkit.errors import LabkitError
from labkit.trace.events import event_problems


def record(url: str, seconds: float, out: Path, timeout_s: float = 30.0) -> list[dict]:
    """The window's events, also written to `out` as they arrive (one JSON object a line)."""
    import httpx

    from labkit.options import check_url

    url = check_url("--url", url)
    out.parent.mkdir(parents=True, exist_ok=True)
    events: list[dict] = []
    try:
        with httpx.stream("GET", url.rstrip("/") + "/v1/trace", params={"seconds": seconds},
                          timeout=httpx.Timeout(timeout_s, read=seconds + timeout_s)) as resp, \
                out.open("w", encoding="utf-8") as f:
            if resp.status_code == 404:
                raise LabkitError(f"{url}: this server keeps no live trace (start it with labkit serve --live-trace)")
            if resp.status_code != 200:
                raise LabkitError(f"{url}/v1/trace answered HTTP {resp.status_code}: {resp.read()[:200]!r}")
            for line in resp.iter_lines():
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    raise LabkitError(f"{url}/v1/trace: a line that is not JSON ({line[:80]!r}): is this labkit "
                                      "serve --live-trace?") from None
                if not isinstance(event, dict):
                    raise LabkitError(f"{url}/v1/trace: a line that is not a JSON object ({line[:80]!r})")
                if "error" in event and "event" not in event:
                    raise LabkitError(f"{url}: {event['error']} (the events so far are in {out})")
                problems = event_problems(event)
                if problems:
                    raise LabkitError(f"{url}: the server sent an event that is not schema v1: {'; '.join(problems)}")
                f.write(json.dumps(event, separators=(",", ":")) + "\n")
                events.append(event)
    except httpx.HTTPError as exc:
        raise LabkitError(f"{url}: cannot record the live trace ({type(exc).__name__}: {exc})") from None
    if not any(e.get("event") == "live_state" and e.get("kind") == "close" for e in events):
        raise LabkitError(f"{url}: the window ended without its closing state (the server stopped?); the events "
                          f"so far are in {out}")
    return events
