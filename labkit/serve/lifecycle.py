"""`labkit serve lifecycle`: cancel, overload, slow consumer and shutdown, checked at the server's own door.

    labkit serve lifecycle --device cpu                          # every scenario, runs/serve-lifecycle.json
    labkit serve lifecycle --scenario overload --scenario shutdown

It starts its own `labkit serve` processes on free loopback ports (the engine options given, with
--step-stream so each engine step says which request got a token): "main" for cancel-running, slow-consumer
and shutdown, "tight" for cancel-waiting and overload (TIGHT_FLAGS: a long prompt prefilled four tokens a step
holds every request behind it in the engine's waiting queue; --max-queue 2). For each scenario, what may
happen and what must be restored:

    cancel-running  a stream dropped after a few tokens: the server books it as `abort`, the engine produces at
                    most LATE_ROWS_MAX more tokens for it (steps already launched), the other stream finishes
    cancel-waiting  a request cancelled while it waits behind a running one: it never gets a token, in the
                    client or in the engine; the running one finishes
    overload        more requests than --max-queue: each excess one a 503 overloaded_error at once, /health
                    answering within HEALTH_MAX_S meanwhile, the admitted ones finish
    slow-consumer   one client stops reading for PAUSE_S: another client's tokens never stop for GAP_MAX_S, the
                    slow one ends with a finish reason or an error event
    shutdown        SIGTERM with a stream in flight: the stream ends with a reason and [DONE], the server exits 0
                    within --drain-timeout and a new one on the same port and options serves a request

and after every scenario the idle baseline within RESTORE_S: no request running, waiting or open, every KV
block free (from /health; a block still held is traced to its request through the step stream). Each scenario
has a deadline (SCENARIO_S): a hung server is a FAIL naming where it hung, never a hung command. Exit 0 when
every scenario run holds, 1 when one does not, 2 when it could not run (a server that does not start).
"""
from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from labkit.engine_args import EngineArgs
from labkit.errors import LabkitError
from labkit.options import (
    AsyncSchedulingOption,
    Device,
    DeviceOption,
    EnforceEagerOption,
    KvcacheBlockSizeOption,
    KvCacheDtypeOption,
    MaxModelLenOption,
    MaxNumBatchedTokensOption,
    MaxNumSeqsOption,
    ModelOption,
    NumKvcacheBlocksOption,
    Out,
    SchedulingPolicyOption,
    TensorParallelSizeOption,
)

SCENARIOS = ("cancel-running", "cancel-waiting", "overload", "slow-consumer", "shutdown")
Scenario = enum.Enum("Scenario", {s: s for s in SCENARIOS}, type=str, module=__name__)
ON_TIGHT = ("cancel-waiting", "overload")   # need requests that wait
# --max-num-seqs caps the requests one step schedules, not those running (nano-vLLM's rule): a request waits only
# behind a prompt that takes the whole step's budget, a few tokens a step. Two may wait for a first token: the long
# prompt and the one behind it; the next is the excess.
TIGHT_FLAGS = ["--max-num-batched-tokens", "4", "--max-queue", "2"]
LONG_PROMPT_S = 3.0    # how long the long prompt's prefill should hold the others back, at the measured rate

PROMPT = "The quick brown fox"
RESTORE_S = 5.0        # back at the idle baseline within this, once a scenario's requests have ended
SCENARIO_S = 120.0     # a scenario's deadline, its requests and the baseline wait included
REQUEST_S = 60.0       # one HTTP request's deadline
LATE_ROWS_MAX = 2      # tokens a cancelled request may still get: the step running and one launched ahead
PAUSE_S = 3.0          # how long the slow consumer stops reading
GAP_MAX_S = 1.5        # the other client's longest wait for a token meanwhile (blocked, it would be PAUSE_S)
HEALTH_MAX_S = 1.0     # /health's slowest answer under overload
EXCESS = 4             # requests sent past the full queue
DRAIN_S = 2.0          # the main server's --drain-timeout
EXIT_SLACK_S = 10.0    # beyond the drain: stopping uvicorn and the engine core
PROBE_TOKENS = 32      # the warm-up stream that measures a server's decode rate


class Broken(Exception):
    """A scenario could not go on; the message is its reason."""


# --- judging: observations -> problems (none: the scenario holds) -----------------------------------------------
def baseline_problems(h: dict) -> list[str]:
    """What keeps a /health answer from the idle baseline."""
    out = [] if h.get("status") == "ok" else [f"/health says {h.get('status')!r}: {h.get('error', '')}".rstrip(": ")]
    for key, what in (("running", "running in the engine"), ("waiting", "waiting in the engine"),
                      ("live", "open in the frontend"), ("queued", "queued for a first token")):
        if h.get(key):
            out.append(f"{h[key]} request(s) {what}")
    free, total = h.get("free_blocks"), h.get("num_blocks")
    if free is None or total is None:  # (nothing to hold the pool to: not a baseline reached)
        out.append("/health gives no KV block counts (free_blocks, num_blocks)")
    elif free != total:
        out.append(f"{total - free} of {total} KV blocks in use")
    return out


def _baseline(o: dict) -> list[str]:
    b = o.get("baseline")
    if not b:
        return ["the baseline was never checked"]
    if b["ok"]:
        return []
    held = "; held by " + ", ".join(f"{rid} ({kv} KV tokens)" for rid, kv in b["holders"].items()) \
        if b.get("holders") else ""
    return [f"not back at the idle baseline within {RESTORE_S:g} s: {', '.join(b['problems'])}{held}"]


def ended(s: dict) -> str:
    """How a stream ended, in a few words."""
    if s.get("status") not in (None, 200):
        return f"HTTP {s['status']}: {s.get('error')}"
    if s.get("error"):
        return f"error: {s['error']}" + ("" if s.get("done") else " (no [DONE])")
    if s.get("finish_reason"):
        return s["finish_reason"] + ("" if s.get("done") else " (no [DONE])")
    return "cut without a finish reason or an error" if s.get("status") else "never answered"


def _normal(s: dict) -> bool:
    return s.get("status") == 200 and s.get("finish_reason") in ("length", "stop") and s.get("done") \
        and not s.get("error")


def _others(o: dict) -> list[str]:
    return [f"the other request {s['rid']} did not finish normally: {ended(s)}" for s in o.get("others", [])
            if not _normal(s)]


def _aborted(o: dict) -> list[str]:
    return [] if o.get("abort_counted") else \
        ["the server's books show no abort for it (request_success_total{finished_reason=\"abort\"} did not rise)"]


def judge_cancel_running(o: dict) -> list[str]:
    v = o.get("victim") or {}
    out = [] if v.get("tokens") else ["the request to cancel got no token before it was cancelled"]
    out += _aborted(o)
    late = o.get("late_tokens")
    if late is None:
        out.append("the step stream lost records: whether it got more tokens after its abort is unknown")
    elif late > LATE_ROWS_MAX:
        out.append(f"{v.get('rid')} got {late} tokens in engine steps after its abort was booked (at most "
                   f"{LATE_ROWS_MAX}: steps already launched)")
    return out + _others(o) + _baseline(o)


def judge_cancel_waiting(o: dict) -> list[str]:
    v = o.get("victim") or {}
    out = [] if o.get("waited") else ["no request was seen waiting in the engine: nothing was cancelled before "
                                      "its first token"]
    if v.get("tokens"):
        out.append(f"{v.get('rid')} got {v['tokens']} tokens though it was cancelled before its first")
    engine = o.get("engine_tokens")
    if engine is None:
        out.append("the step stream lost records: whether the engine computed a token for it is unknown")
    elif engine:
        out.append(f"the engine produced {engine} tokens for {v.get('rid')} though it was cancelled while waiting")
    return out + _aborted(o) + _others(o) + _baseline(o)


def judge_overload(o: dict) -> list[str]:
    out = [] if o.get("queue_full") else ["the queue was never seen full: the excess requests were not excess"]
    excess = o.get("excess") or []
    if not excess:
        out.append("no excess request was sent")
    by: dict[str, int] = {}
    for r in excess:
        if not (r.get("status") == 503 and r.get("type") == "overloaded_error"):
            what = f"HTTP {r['status']}" if r.get("status") else (r.get("error") or "no answer")
            by[what] = by.get(what, 0) + 1
    out += [f"{n} of {len(excess)} excess requests got {what}, not 503 overloaded_error" for what, n in by.items()]
    slow = [r for r in excess if (r.get("seconds") or 0) > HEALTH_MAX_S]
    if slow:
        out.append(f"{len(slow)} excess requests waited over {HEALTH_MAX_S:g} s for their answer")
    health = o.get("health_s") or []
    if not health:
        out.append("/health was never asked meanwhile")
    elif max(health) > HEALTH_MAX_S:
        out.append(f"/health took {max(health):.2f} s to answer under overload (bound {HEALTH_MAX_S:g} s)")
    if o.get("health_errors"):
        out.append(f"/health failed {o['health_errors']} times under overload")
    return out + _others(o) + _baseline(o)


def judge_slow_consumer(o: dict) -> list[str]:
    fast = o.get("fast") or {}
    out = [] if fast.get("tokens") else ["the other client got no token while the slow one paused"]
    out += [f"the other client's request failed: {e}" for e in fast.get("errors", [])]
    gap = fast.get("max_gap_s")
    if gap is not None and gap > GAP_MAX_S:
        out.append(f"the other client's tokens stopped for {gap:.2f} s while the slow one paused "
                   f"(bound {GAP_MAX_S:g} s)")
    slow = o.get("slow") or {}
    if not (slow.get("done") and (slow.get("finish_reason") or slow.get("error"))):
        out.append(f"the slow client's stream did not end with a reason: {ended(slow)}")
    return out + _baseline(o)


def judge_shutdown(o: dict) -> list[str]:
    s = o.get("stream") or {}
    out = [] if s.get("tokens") else ["no stream was in flight when SIGTERM came"]
    if not (s.get("done") and (s.get("finish_reason") or s.get("error"))):
        out.append(f"the in-flight stream did not end with a reason and [DONE]: {ended(s)}")
    code, limit = o.get("exit_code"), DRAIN_S + EXIT_SLACK_S
    if code is None:
        out.append(f"the server had not exited {limit:g} s after SIGTERM (--drain-timeout {DRAIN_S:g})")
    elif code != 0:
        out.append(f"the server exited {code} after SIGTERM, not 0")
    r = o.get("restart") or {}
    if not r.get("served"):
        out.append(f"the restarted server did not serve a request: {r.get('error') or 'not started'}")
    return out + _baseline(o)


JUDGES = {"cancel-running": judge_cancel_running, "cancel-waiting": judge_cancel_waiting,
          "overload": judge_overload, "slow-consumer": judge_slow_consumer, "shutdown": judge_shutdown}


def observed(name: str, o: dict) -> str:
    """One line of what a scenario saw, for a scenario that held."""
    idle = f"idle again in {o['baseline']['seconds']:.2f} s" if o.get("baseline") else ""
    others = ", ".join(ended(s) for s in o.get("others", []))
    if name == "cancel-running":
        return (f"dropped after {o['victim']['tokens']} tokens; booked as abort; {o['late_tokens']} engine "
                f"tokens after; other: {others}; {idle}")
    if name == "cancel-waiting":
        return f"cancelled while waiting: 0 tokens, in the engine too; the one ahead: {others}; {idle}"
    if name == "overload":
        h = o["health_s"]
        return (f"{len(o['excess'])}/{len(o['excess'])} excess got 503 overloaded; /health max "
                f"{1e3 * max(h):.0f} ms over {len(h)} asks; admitted: {others}; {idle}")
    if name == "slow-consumer":
        f, s = o["fast"], o["slow"]
        return (f"paused {PAUSE_S:g} s: the other got {f['tokens']} tokens, longest gap {f['max_gap_s']:.2f} s; "
                f"slow one: {ended(s)}, {s['tokens_after_pause']} tokens after in {s['chunks_after_pause']} "
                f"chunks; {idle}")
    r = o["restart"]
    return (f"stream ended: {ended(o['stream'])}; exit 0 in {o['exit_s']:.1f} s; restarted and served in "
            f"{r['seconds']:.1f} s; {idle}")


# --- the client side -------------------------------------------------------------------------------------------
def _httpx():
    import httpx

    return httpx


# Streams not closed yet: a scenario cut short by its deadline closes what it left open, so that the next one starts
# from a server that is not still serving it.
OPEN: set = set()


class Stream:
    """One streamed completion as its client sees it (its own connection: closing it is the cancel)."""

    def __init__(self, url: str, rid: str, max_tokens: int, rcvbuf: int | None = None, prompt=PROMPT):
        httpx = _httpx()
        self.url, self.rid, self.max_tokens, self.prompt = url, rid, max_tokens, prompt
        self.status: int | None = None
        self.tokens = self.chunks = 0
        self.times: list[float] = []       # when each chunk with tokens came
        self.counts: list[int] = []        # and how many tokens it carried
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.done = False
        # A small receive buffer makes a client that stops reading push back on the server within a few KB.
        transport = httpx.AsyncHTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)]) \
            if rcvbuf else None
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(REQUEST_S, connect=10.0), transport=transport)
        self._lines = None
        OPEN.add(self)

    async def open(self) -> "Stream":
        body = {"prompt": self.prompt, "max_tokens": self.max_tokens, "ignore_eos": True, "temperature": 0.0,
                "stream": True, "return_token_ids": True, "request_id": self.rid}
        resp = await self._client.send(self._client.build_request("POST", self.url + "/v1/completions", json=body),
                                       stream=True)
        self.status = resp.status_code
        if resp.status_code != 200:
            await resp.aread()
            self.error = _error_message(resp)
        else:
            self._lines = resp.aiter_lines()
        return self

    async def read(self, until: int | None = None) -> "Stream":
        """Read until `until` tokens have come (None: to the end of the stream)."""
        if self._lines is None or self.done:
            return self
        try:
            async for line in self._lines:
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    self.done = True
                    return self
                data = json.loads(line[len("data: "):])
                if "error" in data:
                    self.error = str(data["error"].get("message") or data["error"])
                for choice in data.get("choices", []):
                    ids = choice.get("token_ids") or []
                    if ids:
                        self.tokens += len(ids)
                        self.chunks += 1
                        self.times.append(time.monotonic())
                        self.counts.append(len(ids))
                    self.finish_reason = choice.get("finish_reason") or self.finish_reason
                if until is not None and self.tokens >= until:
                    return self
        except _httpx().HTTPError as exc:
            self.error = self.error or f"{type(exc).__name__}: {exc}"
        self._lines = None
        return self

    async def close(self) -> None:
        OPEN.discard(self)
        await self._client.aclose()

    def record(self) -> dict:
        prompt = len(self.prompt) if isinstance(self.prompt, list) else self.prompt
        return {"rid": self.rid, "prompt": prompt, "status": self.status, "max_tokens": self.max_tokens,
                "tokens": self.tokens,
                "chunks": self.chunks, "finish_reason": self.finish_reason, "error": self.error, "done": self.done}


def _error_message(resp) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except Exception:  # noqa: BLE001 - any body
        return resp.text[:200]


class Steps:
    """The server's step stream (/v1/steps), read for as long as the server runs: which request got a token
    when (the core's monotonic clock, this host's), and what each running request holds."""

    def __init__(self, url: str):
        self.url = url
        self.tokens: list[tuple[float, str]] = []     # (time, request id) per token the engine produced
        self.last_rows: dict[str, int] = {}           # request id -> KV tokens, of the last step's unfinished rows
        self.dropped = False
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        opened = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._read(opened))
        await asyncio.wait_for(opened, 10.0)

    async def _read(self, opened) -> None:
        httpx = _httpx()
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0)) as client, \
                    client.stream("GET", self.url + "/v1/steps") as resp:
                if resp.status_code != 200:
                    raise Broken(f"{self.url}/v1/steps answered {resp.status_code}")
                event = None
                async for line in resp.aiter_lines():
                    if not opened.done():
                        opened.set_result(True)   # the first byte: subscribed
                    if line.startswith("event: "):
                        event = line[len("event: "):]
                        self.dropped = self.dropped or event == "dropped"
                    elif line.startswith("data: ") and event == "step":
                        self._on_step(json.loads(line[len("data: "):]))
        except Exception as exc:  # noqa: BLE001 - the server went away; a step stream that never opened is said
            if not opened.done():
                opened.set_exception(exc if isinstance(exc, Broken) else Broken(f"no step stream: {exc}"))

    def _on_step(self, rec: dict) -> None:
        rows = rec["rows"]
        held = {}
        for rid, tok, kv, reason in zip(rows["request_id"], rows["token_id"], rows["kv_tokens"],
                                        rows["finish_reason"]):
            if tok is not None:
                self.tokens.append((rec["t"], rid))
            if reason is None:
                held[rid] = kv
        self.last_rows = held

    def count(self, rid: str, after: float = float("-inf")) -> int | None:
        """Tokens the engine produced for `rid` after `after`; None when the stream lost records."""
        return None if self.dropped else sum(1 for t, r in self.tokens if r == rid and t > after)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


def _die_with_us() -> None:
    """In a server's process, before it runs: SIGTERM (a drain, then exit) when this command dies, even killed
    outright (a plan runner's timeout), so that no server outlives the command that started it (Linux)."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)   # (1: PR_SET_PDEATHSIG)
    except (OSError, AttributeError):
        pass


class Server:
    """`labkit serve` in a child process on a loopback port; its output in a log of its own."""

    def __init__(self, name: str, args: list[str], log_dir: Path, port: int | None = None):
        from engine.config import free_port

        self.name, self.args = name, args
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.steps: Steps | None = None
        self.rate = 100.0                     # tokens a second of one stream, measured once it is up
        self.max_model_len = self.vocab_size = 0
        self.start_s: float | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "labkit", "serve", "--port", str(self.port),
                                          "--log-level", "warning", *self.args], stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=_die_with_us)
        self._t0 = time.monotonic()

    def tail(self) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        except OSError:
            return ""
        # The cause in the server's own words ("labkit serve: stopping: the engine is gone (ValueError: ...)"),
        # not its last line ("see the log above") nor uvicorn's ("ERROR: Cancel 1 running task(s)").
        why = [x for x in lines if x.startswith("labkit") and "Error" in x] or lines
        return why[-1][:300] if why else ""

    async def ready(self, timeout_s: float, client) -> dict:
        """Wait for /health 200; Broken when the server exits or the time runs out."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise Broken(f"the {self.name} server exited with code {self.proc.returncode} before it was ready: "
                             f"{self.tail()} (log: {self.log_path})")
            try:
                r = await client.get(self.url + "/health", timeout=2.0)
                if r.status_code == 200:
                    self.start_s = time.monotonic() - self._t0
                    health = r.json()
                    self.max_model_len = int(health.get("max_model_len") or 0)
                    self.vocab_size = int(health.get("vocab_size") or 0)
                    return health
            except _httpx().HTTPError:
                pass
            await asyncio.sleep(0.1)
        raise Broken(f"the {self.name} server did not answer /health within {timeout_s:g} s (log: {self.log_path})")

    async def answers(self) -> bool:
        try:
            async with _httpx().AsyncClient() as c:
                return (await c.get(self.url + "/health", timeout=2.0)).status_code == 200
        except _httpx().HTTPError:
            return False

    def died(self) -> str:
        code = None if self.proc is None else self.proc.poll()
        return "" if code is None else f"; the {self.name} server exited with code {code}: {self.tail()}"

    def tokens_for(self, seconds: float) -> int:
        """max_tokens for a stream that lasts about `seconds` at this server's rate, within max_model_len."""
        return max(16, min(int(self.rate * seconds), self.max_model_len - 64))

    def long_prompt(self) -> list[int]:
        """Token ids whose prefill at 4 tokens a step (TIGHT_FLAGS) lasts about LONG_PROMPT_S, and at least 128
        steps whatever the rate measured said; from a random start, so that no earlier prompt is found in the
        prefix cache."""
        n = min(max(512, int(4 * self.rate * LONG_PROMPT_S)), self.max_model_len - 64)
        span = max(1, min(self.vocab_size, 151_000) - 200)
        start = uuid.uuid4().int % span
        return [100 + (start + i) % span for i in range(n)]

    async def wait_exit(self, timeout_s: float) -> int | None:
        if self.proc is None:  # never started: nothing to wait for
            return None
        end = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < end:
            await asyncio.sleep(0.05)
        return self.proc.poll()

    def kill(self) -> int | None:
        """Stop it now however it is (a second signal skips the drain); its exit code."""
        if self.steps is not None:
            self.steps.stop()
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            time.sleep(0.1)
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(DRAIN_S + EXIT_SLACK_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# --- observing a server --------------------------------------------------------------------------------------
async def health(client, srv: Server) -> dict:
    r = await client.get(srv.url + "/health", timeout=5.0)
    return r.json()


async def aborts(client, srv: Server) -> float:
    """request_success_total{finished_reason="abort"} from /metrics."""
    text = (await client.get(srv.url + "/metrics", timeout=5.0)).text
    return sum(float(m.group(2)) for m in re.finditer(r'^labkit:request_success_total\{([^}]*)\} (\S+)$', text, re.M)
               if 'finished_reason="abort"' in m.group(1))


async def wait_aborts(client, srv: Server, want: float, timeout_s: float) -> float | None:
    """When the server's books first showed `want` aborts (monotonic time), or None."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if await aborts(client, srv) >= want:
            return time.monotonic()
        await asyncio.sleep(0.02)
    return None


async def wait_baseline(client, srv: Server, timeout_s: float = RESTORE_S) -> dict:
    t0 = time.monotonic()
    end = t0 + timeout_s
    while True:
        h = await health(client, srv)
        problems = baseline_problems(h)
        if not problems or time.monotonic() >= end:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)     # the step records of the last steps, still on their way
    holders = dict(srv.steps.last_rows) if problems and srv.steps is not None else {}
    return {"ok": not problems, "seconds": round(time.monotonic() - t0, 3), "problems": problems,
            "holders": holders}


async def require_baseline(client, srv: Server) -> None:
    b = await wait_baseline(client, srv)
    if not b["ok"]:
        raise Broken(f"the {srv.name} server was not at its idle baseline before the scenario: "
                     f"{', '.join(b['problems'])}")


async def probe(client, srv: Server) -> None:
    """A short warm-up stream: first-use costs paid, and the decode rate that sizes every scenario's streams."""
    s = await Stream(srv.url, f"lifecycle-probe-{uuid.uuid4().hex[:8]}", PROBE_TOKENS).open()
    try:
        await s.read()
    finally:
        await s.close()
    if not _normal(s.record()):
        raise Broken(f"the {srv.name} server's warm-up request did not finish: {ended(s.record())}")
    half = len(s.times) // 2     # the second half: the first tokens pay first-use costs (allocations, compiles)
    if half >= 2 and s.times[-1] > s.times[half]:
        srv.rate = (s.tokens - sum(s.counts[:half + 1])) / (s.times[-1] - s.times[half])


def _rid(name: str) -> str:
    return f"lifecycle-{name}-{uuid.uuid4().hex[:8]}"


async def _finish(streams: list[Stream]) -> list[dict]:
    try:
        await asyncio.gather(*(s.read() for s in streams))
    finally:
        for s in streams:
            await s.close()
    return [s.record() for s in streams]


# --- the scenarios: each fills `o` as it goes (o["stage"]: where it is, for a deadline's reason) --------------------
async def cancel_running(client, srv: Server, o: dict) -> None:
    o["stage"] = "dropping a stream after its first tokens"
    before = await aborts(client, srv)
    victim = await Stream(srv.url, _rid("cancel"), srv.tokens_for(60)).open()   # only the cancel can end it
    other = await Stream(srv.url, _rid("other"), srv.tokens_for(1)).open()
    others = asyncio.ensure_future(_finish([other]))
    try:
        await victim.read(until=3)
    finally:
        await victim.close()
    o["victim"] = victim.record()
    o["stage"] = "waiting for the abort in the server's books"
    booked = await wait_aborts(client, srv, before + 1, RESTORE_S)
    o["abort_counted"] = booked is not None
    o["stage"] = "waiting for the other stream to finish"
    o["others"] = await others
    o["stage"] = "waiting for the idle baseline"
    o["baseline"] = await wait_baseline(client, srv)
    o["late_tokens"] = srv.steps.count(victim.rid, after=booked if booked is not None else time.monotonic())
    o["engine_tokens"] = srv.steps.count(victim.rid)


async def _wait_health(client, srv: Server, cond) -> bool:
    end = time.monotonic() + RESTORE_S
    while time.monotonic() < end:
        if cond(await health(client, srv)):
            return True
        await asyncio.sleep(0.02)
    return False


async def cancel_waiting(client, srv: Server, o: dict) -> None:
    o["stage"] = "sending a long prompt and a request behind it"
    before = await aborts(client, srv)
    ahead = await Stream(srv.url, _rid("ahead"), 8, prompt=srv.long_prompt()).open()
    victim = await Stream(srv.url, _rid("waiting"), 8).open()
    others = asyncio.ensure_future(_finish([ahead]))
    reading = asyncio.ensure_future(victim.read())    # whatever it gets before the cancel counts against it
    o["stage"] = "waiting for the second request to wait in the engine"
    o["waited"] = await _wait_health(client, srv, lambda h: h.get("waiting", 0) >= 2 and h.get("queued", 0) >= 2)
    reading.cancel()
    await asyncio.gather(reading, return_exceptions=True)
    await victim.close()
    o["victim"] = victim.record()
    o["stage"] = "waiting for the abort in the server's books"
    o["abort_counted"] = await wait_aborts(client, srv, before + 1, RESTORE_S) is not None
    o["stage"] = "waiting for the request ahead to finish"
    o["others"] = await others
    o["stage"] = "waiting for the idle baseline"
    o["baseline"] = await wait_baseline(client, srv)
    o["engine_tokens"] = srv.steps.count(victim.rid)


async def overload(client, srv: Server, o: dict) -> None:
    o["stage"] = "filling the queue"
    admitted = [await Stream(srv.url, _rid("ahead"), 8, prompt=srv.long_prompt()).open(),
                await Stream(srv.url, _rid("queued"), 8).open()]
    o["queue_full"] = await _wait_health(client, srv, lambda h: h.get("queued", 0) >= 2)
    o["health_s"], o["health_errors"] = [], 0
    stop = asyncio.Event()

    async def ask_health() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                r = await client.get(srv.url + "/health", timeout=5.0)
                o["health_s"].append(round(time.monotonic() - t0, 4))
                o["health_errors"] += r.status_code != 200
            except _httpx().HTTPError:
                o["health_errors"] += 1
            await asyncio.sleep(0.05)

    async def excess(i: int) -> dict:
        httpx = _httpx()
        t0 = time.monotonic()
        out: dict = {"status": None}
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(REQUEST_S, connect=10.0)) as c:
                r = await c.post(srv.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 4,
                                                                    "request_id": _rid(f"excess{i}")})
            json_body = r.headers.get("content-type", "").startswith("application/json")
            err = (r.json().get("error") or {}) if json_body else {}
            out = {"status": r.status_code, "type": err.get("type"), "message": err.get("message"),
                   "retry_after": r.headers.get("retry-after")}
        except httpx.HTTPError as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        out["seconds"] = round(time.monotonic() - t0, 4)
        return out

    o["stage"] = f"sending {EXCESS} requests past the full queue"
    asker = asyncio.ensure_future(ask_health())
    try:
        o["excess"] = list(await asyncio.gather(*(excess(i) for i in range(EXCESS))))
        o["stage"] = "waiting for the admitted requests to finish"
        o["others"] = await _finish(admitted)
    finally:
        stop.set()
        await asyncio.gather(asker, return_exceptions=True)
    o["stage"] = "waiting for the idle baseline"
    o["baseline"] = await wait_baseline(client, srv)


async def slow_consumer(client, srv: Server, o: dict) -> None:
    o["stage"] = "opening the slow client's stream"
    slow = await Stream(srv.url, _rid("slow"), srv.tokens_for(PAUSE_S + 1), rcvbuf=4096).open()
    await slow.read(until=1)
    before = (slow.tokens, slow.chunks)
    o["stage"] = f"streaming another client while the slow one reads nothing for {PAUSE_S:g} s"
    t0 = time.monotonic()
    times, fast = [t0], {"requests": 0, "tokens": 0, "errors": []}
    while time.monotonic() < t0 + PAUSE_S:
        s = await Stream(srv.url, _rid("fast"), 16).open()
        r = (await _finish([s]))[0]
        fast["requests"] += 1
        fast["tokens"] += r["tokens"]
        times += s.times
        if not _normal(r):
            fast["errors"].append(ended(r))
    fast["max_gap_s"] = round(max(b - a for a, b in zip(times, times[1:])), 4) if len(times) > 1 else None
    o["fast"] = fast
    o["stage"] = "reading the slow client's stream to its end"
    rec = (await _finish([slow]))[0]
    rec.update(tokens_after_pause=slow.tokens - before[0], chunks_after_pause=slow.chunks - before[1])
    o["slow"] = rec
    o["stage"] = "waiting for the idle baseline"
    o["baseline"] = await wait_baseline(client, srv)


async def shutdown(client, srv: Server, o: dict, startup_s: float, servers: dict) -> None:
    """SIGTERM mid-stream, then a new server on the same port; it joins `servers`, which the caller stops."""
    o["stage"] = "opening a stream"
    s = await Stream(srv.url, _rid("inflight"), srv.tokens_for(60)).open()
    await s.read(until=3)
    o["stage"] = "SIGTERM with the stream in flight"
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(s.read(), DRAIN_S + EXIT_SLACK_S)
    except TimeoutError:
        s.error = s.error or "no end within the drain"
    finally:
        await s.close()
    o["stream"] = s.record()
    o["stage"] = "waiting for the server to exit"
    o["exit_code"] = await srv.wait_exit(max(0.0, t0 + DRAIN_S + EXIT_SLACK_S - time.monotonic()))
    o["exit_s"] = round(time.monotonic() - t0, 3)
    if srv.steps is not None:
        srv.steps.stop()
    if o["exit_code"] is None:
        srv.kill()
    o["stage"] = "restarting on the same port and options"
    again = Server(f"{srv.name}-restarted", srv.args, srv.log_path.parent, srv.port)
    o["restart"] = {"served": False, "port": again.port, "log": str(again.log_path)}
    servers[again.name] = again
    again.start()
    try:
        await again.ready(startup_s, client)
        r = await client.post(again.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 4},
                              timeout=REQUEST_S)
        reason = (r.json().get("choices") or [{}])[0].get("finish_reason") if r.status_code == 200 else None
        o["restart"].update(served=reason is not None, status=r.status_code, finish_reason=reason,
                            error=None if reason else _error_message(r), seconds=round(time.monotonic() - t0, 3))
    except (Broken, _httpx().HTTPError) as exc:
        o["restart"]["error"] = str(exc) or type(exc).__name__
    o["stage"] = "waiting for the restarted server's idle baseline"
    o["baseline"] = await wait_baseline(client, again)


async def run_scenario(name: str, body, srv: Server, deadline_s: float | None = None) -> dict:
    """Run one scenario under its deadline (SCENARIO_S) and judge it; never raises but for Ctrl-C."""
    deadline_s = SCENARIO_S if deadline_s is None else deadline_s
    o: dict = {"stage": "checking the idle baseline before it"}
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(body(o), deadline_s)
        problems = JUDGES[name](o)
    except TimeoutError:
        problems = [f"did not end within {deadline_s:g} s, at: {o['stage']}{srv.died()}"]
    except Broken as exc:
        problems = [f"{exc}{srv.died()}"]
    except Exception as exc:  # noqa: BLE001 - a server that fails under a scenario fails the scenario, with why
        if not await srv.answers():
            # On its way out, maybe: a server whose engine died waits up to 5 s for open streams (uvicorn's
            # graceful shutdown, the step stream's among them) before it exits. Its exit and last line are the why.
            await srv.wait_exit(8.0)
        problems = [f"{o['stage']}: {type(exc).__name__}: {exc}{srv.died()}"]
    for s in list(OPEN):
        await s.close()
    stage = o.pop("stage")
    verdict = "FAIL" if problems else "PASS"
    return {"name": name, "verdict": verdict, "server": srv.name, "seconds": round(time.monotonic() - t0, 3),
            "observed": "; ".join(problems) if problems else observed(name, o), "problems": problems,
            "ended_at_stage": stage if problems else None, "observations": o}


async def start(client, srv: Server, startup_s: float) -> None:
    """Start a server, wait for it, check it idles, subscribe to its steps and measure its rate; exit 2 if not."""
    srv.start()
    try:
        problems = baseline_problems(await srv.ready(startup_s, client))
        if problems:
            raise Broken(f"the {srv.name} server is not idle once started: {', '.join(problems)}")
        srv.steps = Steps(srv.url)
        await srv.steps.start()
        await probe(client, srv)
    except (Broken, TimeoutError, _httpx().HTTPError) as exc:
        raise LabkitError(f"could not start: {exc or type(exc).__name__}", 2) from None


async def run_all(plan: list[str], servers: dict[str, Server], startup_s: float) -> list[dict]:
    """The plan's scenarios, one server at a time (two would share a GPU's memory: the second finds none for its
    KV cache): the tight server's, then the main one's, shutdown last. `servers` is the caller's, so that whatever
    was started is stopped however this ends."""
    httpx = _httpx()
    results = {}
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0)) as client:
        for group in ("tight", "main"):
            names = [n for n in plan if (n in ON_TIGHT) == (group == "tight")]
            if not names:
                continue
            srv = servers[group]
            await start(client, srv, startup_s)
            for name in names:
                fn = {"cancel-running": cancel_running, "cancel-waiting": cancel_waiting, "overload": overload,
                      "slow-consumer": slow_consumer, "shutdown": shutdown}[name]

                async def body(o, srv=srv, fn=fn):
                    await require_baseline(client, srv)
                    await fn(client, srv, o, startup_s, servers) if fn is shutdown else await fn(client, srv, o)
                results[name] = await run_scenario(name, body, srv)
            if srv.proc.poll() is None:
                srv.steps.stop()
                srv.proc.send_signal(signal.SIGTERM)
                await srv.wait_exit(DRAIN_S + EXIT_SLACK_S)
    return [results[n] for n in plan]


# --- the command -----------------------------------------------------------------------------------------------
def headline(scenarios: list[dict]) -> str:
    held = sum(s["verdict"] == "PASS" for s in scenarios)
    return f"{held}/{len(scenarios)} scenarios hold: " + ", ".join(f"{s['name']} {s['verdict']}" for s in scenarios)


def print_table(result: dict, console: Console) -> None:
    table = Table(title=f"serve lifecycle: {result['verdict']}", title_justify="left", expand=False)
    table.add_column("scenario", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("observed", ratio=1)
    for s in result["scenarios"]:
        table.add_row(s["name"], Text(s["verdict"], style="green" if s["verdict"] == "PASS" else "red"),
                      s["observed"])
    console.print(table)
    console.print(result["headline"])


def markdown(r: dict) -> str:
    lines = [f"# serve lifecycle: {r['verdict']}", "", r["headline"], "",
             f"Device {r['device'].get('name') or r['device'].get('type')}, commit {r.get('git_head')}, model "
             f"{r['model'].get('path')}. Bounds: back at the idle baseline within {RESTORE_S:g} s; at most "
             f"{LATE_ROWS_MAX} engine tokens after an abort; /health under {HEALTH_MAX_S:g} s under overload; the "
             f"other client's gap under {GAP_MAX_S:g} s while one pauses {PAUSE_S:g} s; exit 0 within "
             f"{DRAIN_S:g} + {EXIT_SLACK_S:g} s of SIGTERM.", "",
             "| scenario | verdict | observed |", "| --- | --- | --- |"]
    lines += [f"| {s['name']} | {s['verdict']} | {s['observed'].replace('|', '/')} |" for s in r["scenarios"]]
    lines += ["", "## Servers", ""]
    lines += [f"- {s['name']}: `labkit serve {' '.join(s['args'])}`, log `{s['log']}`, exit {s['exit_code']}"
              for s in r["servers"]]
    return "\n".join(lines) + "\n"


def run(
    ctx: typer.Context,
    scenario: Optional[List[Scenario]] = typer.Option(None, "--scenario", help="Run this scenario (repeat for "
                                                      "several; default: all five)."),
    model: ModelOption = None,
    device: DeviceOption = Device.auto,
    tensor_parallel_size: TensorParallelSizeOption = None,
    max_num_seqs: MaxNumSeqsOption = None,
    max_num_batched_tokens: MaxNumBatchedTokensOption = None,
    max_model_len: MaxModelLenOption = None,
    kvcache_block_size: KvcacheBlockSizeOption = None,
    num_kvcache_blocks: NumKvcacheBlocksOption = None,
    enforce_eager: EnforceEagerOption = None,
    async_scheduling: AsyncSchedulingOption = None,
    kv_cache_dtype: KvCacheDtypeOption = None,
    scheduling_policy: SchedulingPolicyOption = None,
    startup_timeout: float = typer.Option(600.0, "--startup-timeout", min=1.0, help="Seconds each started server "
                                          "may take to answer /health."),
    out: Out("JSON path (default: runs/serve-lifecycle[-OPTION-VALUE...].json); the Markdown twin and the "
             "servers' logs go beside it.") = None,
) -> None:
    """Cancel, overload, slow consumer and shutdown against servers of its own: each ends with a reason, and
    the server comes back to idle with every KV block free.

    Starts `labkit serve` with the Engine options given (and --step-stream; cancel-waiting and overload on a
    second one with --max-num-batched-tokens 4 --max-queue 2, so that requests wait), runs each scenario under
    a deadline, prints a verdict a scenario and writes the result JSON and its Markdown twin. Exit 0 when every
    scenario holds, 1 when one does not, 2 when a server cannot start.

    Example: labkit serve lifecycle --device cpu --scenario cancel-running --scenario shutdown
    """
    from labkit.model import resolve_model
    from labkit.output import (
        configuration_suffix,
        envelope,
        evidence_for,
        finish,
        resolve_device,
        runs_dir,
        write_json,
    )
    from labkit.serve.packages import need_serve_packages

    need_serve_packages()
    try:
        _httpx()
    except ImportError:
        raise LabkitError("labkit serve lifecycle needs httpx: pip install 'labkit[serve]'", 2) from None
    model_dir = resolve_model(model)
    dev = resolve_device(device)
    plan = [s for s in SCENARIOS if not scenario or s in {x.value for x in scenario}]
    engine_args = EngineArgs.given(ctx, device=None)
    suffix = configuration_suffix(skip=("scenario", "startup_timeout"))
    if len(plan) < len(SCENARIOS):
        suffix += "-" + "-".join(plan)      # a part of the lab is a record of its own, never the whole lab's
    json_path = out if out is not None else runs_dir() / f"serve-lifecycle{suffix}.json"
    log_dir = json_path.parent / f"{json_path.stem}.logs"
    base = ["--model", str(model_dir), "--device", dev, *engine_args.flags(), "--step-stream"]
    servers: dict[str, Server] = {}
    if any(s not in ON_TIGHT for s in plan):
        servers["main"] = Server("main", [*base, "--drain-timeout", f"{DRAIN_S:g}"], log_dir)
    if any(s in ON_TIGHT for s in plan):
        tight = dataclasses.replace(engine_args, max_num_batched_tokens=None).flags()
        servers["tight"] = Server("tight", ["--model", str(model_dir), "--device", dev, *tight, "--step-stream",
                                            *TIGHT_FLAGS, "--drain-timeout", f"{DRAIN_S:g}"], log_dir)
    env = envelope("serve lifecycle", device=dev, model_dir=model_dir, evidence=evidence_for(dev))
    console = Console()
    console.print(f"labkit serve lifecycle: {', '.join(plan)} on {dev}; servers' logs in {log_dir}", style="dim")

    def interrupted(*_args):
        raise KeyboardInterrupt   # SIGTERM as Ctrl-C: the servers below are stopped either way

    previous = signal.signal(signal.SIGTERM, interrupted) \
        if threading.current_thread() is threading.main_thread() else None
    try:
        scenarios = asyncio.run(run_all(plan, servers, startup_timeout))
    finally:
        codes = {name: srv.kill() for name, srv in servers.items()}
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    verdict = "PASS" if all(s["verdict"] == "PASS" for s in scenarios) else "FAIL"
    result = finish(env, verdict=verdict, headline=headline(scenarios), scenarios=scenarios,
                    servers=[{"name": n, "args": s.args, "port": s.port, "log": str(s.log_path),
                              "start_s": None if s.start_s is None else round(s.start_s, 3),
                              "tokens_per_s": round(s.rate, 1) if s.steps else None, "exit_code": codes[n]}
                             for n, s in servers.items()],
                    bounds={"restore_s": RESTORE_S, "scenario_s": SCENARIO_S, "late_rows_max": LATE_ROWS_MAX,
                            "pause_s": PAUSE_S, "gap_max_s": GAP_MAX_S, "health_max_s": HEALTH_MAX_S,
                            "excess": EXCESS, "drain_s": DRAIN_S, "exit_slack_s": EXIT_SLACK_S},
                    files={"json": str(json_path), "md": str(json_path.with_suffix(".md")), "logs": str(log_dir)})
    write_json(json_path, result)
    json_path.with_suffix(".md").write_text(markdown(result), encoding="utf-8")
    print_table(result, console)
    console.print(f"wrote {json_path} and {json_path.with_suffix('.md')}")
    raise typer.Exit(0 if verdict == "PASS" else 1)
