"""`labkit watch URL`: a live terminal view of a running `labkit serve --step-stream`, from its step stream
(GET /v1/steps): steps a second, prefill and decode tokens a step, queue and running, KV use, preemptions,
TTFT and ITL percentiles. It fits 80 columns and refreshes four times a second (rich Live).

    labkit watch http://127.0.0.1:8000
    labkit watch http://127.0.0.1:8000 --seconds 30 --json     # then the last view as JSON

The step figures are over the last second of step records; the totals, gauges and latency percentiles are the
server's own summary, sent once a second: /metrics at that moment, percentiles over its last 10 s (estimated
from the histograms' buckets). Exit 0 at the end (--seconds, Ctrl-C, the server gone after it was seen);
2 when the server cannot be reached or has no step stream.
"""
from __future__ import annotations

import json
import time
from collections import deque
from typing import Iterator

import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from labkit.errors import LabkitError
from labkit.options import JsonOption, check_url
from labkit.output import EXIT_PASS

REFRESH_S = 0.25


class WatchState:
    """What the view shows, from the records as they arrive (`on_step`, `on_summary`)."""

    def __init__(self, window_s: float = 1.0):
        self.window_s = window_s
        self.recent: deque = deque()        # (arrival time, step record) of the last window
        self.last: dict | None = None
        self.summary: dict | None = None
        self.steps_seen = 0
        self.preempted_seen = 0
        self.dropped = 0

    def on_step(self, rec: dict, now: float) -> None:
        self.recent.append((now, rec))
        self.last = rec
        self.steps_seen += 1
        self.preempted_seen += len(rec.get("preempted") or [])
        self._trim(now)

    def on_summary(self, rec: dict) -> None:
        self.summary = rec

    def _trim(self, now: float) -> None:
        while self.recent and now - self.recent[0][0] > self.window_s:
            self.recent.popleft()

    def view(self, now: float) -> dict:
        self._trim(now)
        recs = [r for _, r in self.recent]
        n = len(recs)
        prefill = sum(r["scheduled_requests"]["sum_prefill_tokens"] for r in recs)
        decode = sum(r["scheduled_requests"]["num_decode_requests"] for r in recs)
        batch = sum(r["scheduled_requests"]["num_prefill_requests"] + r["scheduled_requests"]["num_decode_requests"]
                    for r in recs)
        last, s = self.last or {}, self.summary or {}
        totals = s.get("totals", {})
        return {"steps_per_s": n / self.window_s, "prefill_tokens_per_step": prefill / n if n else 0.0,
                "decode_tokens_per_step": decode / n if n else 0.0, "batch_per_step": batch / n if n else 0.0,
                "step": last.get("step"), "phase": last.get("phase"),
                "running": s.get("running", last.get("num_running")),
                "waiting": s.get("waiting", last.get("num_waiting")),
                "kv_cache_usage": s.get("kv_cache_usage", last.get("kv_cache_usage")),
                "free_blocks": last.get("free_blocks"), "num_blocks": last.get("num_blocks"),
                "preemptions": totals.get("preemptions"), "preempted_seen": self.preempted_seen,
                "prompt_tokens": totals.get("prompt_tokens"), "generation_tokens": totals.get("generation_tokens"),
                "requests_finished": totals.get("requests_finished"), "engine_steps": totals.get("engine_steps"),
                "ttft_ms": s.get("ttft_ms"), "itl_ms": s.get("itl_ms"), "window_s": s.get("window_s"),
                "steps_seen": self.steps_seen, "dropped": self.dropped}


def _num(v, digits: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def _pct(q: dict | None) -> str:
    if not q or q.get("p50") is None:
        return "-"
    return f"{q['p50']:.1f} / {q['p99']:.1f}"


def render(url: str, v: dict):
    head = Text(f"labkit watch {url}", style="bold")
    step = f"step {v['step']} ({v['phase']})" if v["step"] is not None else "no step yet"
    head.append(f"  ·  {step}", style="")
    table = Table(box=None, show_header=False, padding=(0, 1), pad_edge=False)
    for justify in ("left", "right", "left", "right"):
        table.add_column(justify=justify, no_wrap=True)
    usage = v["kv_cache_usage"]
    blocks = f"{v['free_blocks']}/{v['num_blocks']}" if v["free_blocks"] is not None else "-"
    rows = [("steps / s", _num(v["steps_per_s"]), "batch / step", _num(v["batch_per_step"], 1)),
            ("prefill tok / step", _num(v["prefill_tokens_per_step"], 1), "decode tok / step",
             _num(v["decode_tokens_per_step"], 1)),
            ("running", _num(v["running"]), "waiting", _num(v["waiting"])),
            ("KV cache used", "-" if usage is None else f"{100 * usage:.1f} %", "free blocks", blocks),
            ("preemptions", _num(v["preemptions"]), "requests done", _num(v["requests_finished"])),
            ("prompt tokens", _num(v["prompt_tokens"]), "output tokens", _num(v["generation_tokens"])),
            ("TTFT p50/p99 ms", _pct(v["ttft_ms"]), "ITL p50/p99 ms", _pct(v["itl_ms"]))]
    for row in rows:
        table.add_row(*row)
    window = v["window_s"]
    foot = Text(f"steps: last second · totals: /metrics · latencies: last {_num(window)} s", style="dim") \
        if window is not None else Text("waiting for the server's first summary (once a second)", style="dim")
    return Group(head, table, foot)


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """(event, data) of each server-sent event in `lines` (comments skipped)."""
    event, data = "message", []
    for line in lines:
        if line == "":
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))  # the SSE spec drops one space, not all


def stream(url: str, timeout_s: float = 10.0) -> Iterator[tuple[str, dict]]:
    """The step stream's (event, record) pairs; LabkitError when it cannot be had."""
    import httpx

    try:
        with httpx.stream("GET", url.rstrip("/") + "/v1/steps", params={"rows": "false"},
                          timeout=httpx.Timeout(timeout_s, read=None)) as resp:
            if resp.status_code == 404:
                raise LabkitError(f"{url}: this server has no step stream (start it with labkit serve --step-stream)")
            if resp.status_code != 200:
                raise LabkitError(f"{url}/v1/steps answered HTTP {resp.status_code}")
            for event, data in sse_events(resp.iter_lines()):
                try:
                    rec = json.loads(data)
                except ValueError:
                    rec = None
                if not isinstance(rec, dict):
                    raise LabkitError(f"{url}/v1/steps: an event that is not a JSON object ({data[:80]!r}): is this "
                                      "labkit serve --step-stream?")
                yield event, rec
    except httpx.HTTPError as exc:
        raise LabkitError(f"{url}: cannot read the step stream ({type(exc).__name__}: {exc})") from None


def run(
    url: str = typer.Argument(..., metavar="URL", help="A running labkit serve --step-stream, e.g. "
                                                       "http://127.0.0.1:8000."),
    seconds: float = typer.Option(0.0, "--seconds", min=0.0, help="Stop after this many seconds (0: until Ctrl-C)."),
    as_json: JsonOption = False,
) -> None:
    """Watch a running server step by step: steps a second, prefill and decode tokens a step, queue and running,
    KV use, preemptions, TTFT and ITL percentiles; 80 columns, refreshed four times a second.

    Needs `labkit serve --step-stream`. The live page at URL/live shows the same in a browser.

    Example: labkit watch http://127.0.0.1:8000 --seconds 60
    """
    from rich.live import Live

    url = check_url("URL", url)
    state = WatchState()
    console = Console(quiet=as_json)
    end = time.monotonic() + seconds if seconds else None
    seen = False
    with Live(render(url, state.view(time.monotonic())), console=console, auto_refresh=False,
              transient=False) as live:
        next_draw = 0.0
        try:
            while end is None or time.monotonic() < end:
                try:
                    for event, rec in stream(url):
                        seen = True
                        now = time.monotonic()
                        if event == "step":
                            state.on_step(rec, now)
                        elif event == "summary":
                            state.on_summary(rec)
                        elif event == "dropped":
                            state.dropped += 1
                            break           # this client fell behind: read on from a new connection
                        if now >= next_draw:
                            live.update(render(url, state.view(now)), refresh=True)
                            next_draw = now + REFRESH_S
                        if end is not None and now >= end:
                            break
                    else:
                        if seen:
                            break           # the server closed the stream (it is stopping)
                except LabkitError:
                    if not seen:
                        raise
                    break                   # gone after it was seen: the end of the watch, not an error
        except KeyboardInterrupt:
            pass
        view = state.view(time.monotonic())
        live.update(render(url, view), refresh=True)
    if as_json:
        print(json.dumps(view, indent=1))
    raise typer.Exit(EXIT_PASS)
