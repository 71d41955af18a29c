"""The online load bench: requests arrive on a schedule at a running `labkit serve` (or one this command
starts), each streamed over SSE; latencies per request, throughput and goodput over the run.

Arrivals come from a workload (its requests, spaced by a Poisson process of --rate requests/s, seeded;
--rate inf sends them all at once) or from an arrivals file (workloads/arrivals/*.jsonl), one request per
line: {"t": seconds from the start, "prompt_len": N | "prompt_ids": [...] | "prompt": "text",
"max_tokens": M, "id": optional label, "class": optional name of the request's kind (bench load then
reports ttft/itl/tpot per class too: say, the ITL of short streams apart from the TTFT of long prompts)}.

Each arrival goes to one endpoint (round-robin in arrival order over --endpoints); every endpoint's /health
gives the run its provenance (device, evidence kind, model). The metrics over the outcomes are in
load_metrics.py; docs/bench-load.md describes the whole command.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import free_port
from labkit.bench.workloads import MAX_REQUESTS, MAX_TOKENS, Workload, draw
from labkit.errors import LabkitError


@dataclass
class Arrival:
    t: float                          # seconds after the start
    prompt: list[int] | str
    max_tokens: int
    id: str
    cls: str | None = None            # the arrivals file's "class"


@dataclass
class Outcome:
    id: str
    scheduled_s: float
    cls: str | None = None
    endpoint: str = ""                # the server's base URL
    prompt_tokens: int | None = None
    output_tokens: int = 0
    ttft_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)   # tokens of each arrival: ttft's, then each itl's
    e2el_ms: float | None = None
    sent_ns: int | None = None
    done_ns: int | None = None
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_ms(self) -> float | None:
        if self.ok and self.output_tokens > 1 and self.ttft_ms is not None and self.e2el_ms is not None:
            return (self.e2el_ms - self.ttft_ms) / (self.output_tokens - 1)
        return None


# ------------------------------------------------------------------------------------------ arrivals

def poisson_arrivals(w: Workload, rate: float, seed: int = 0) -> list[Arrival]:
    """The workload's requests (its first draw), spaced by exponential gaps of mean 1/rate seconds."""
    if not (rate > 0):
        raise LabkitError(f"--rate: must be > 0 requests per second (or inf), got {rate}")
    d = draw(w)
    rng = random.Random(f"labkit-load:{seed}")
    t, out = 0.0, []
    for i, (p, m) in enumerate(zip(d.prompts, d.max_tokens)):
        if i and math.isfinite(rate):
            t += rng.expovariate(rate)
        out.append(Arrival(t=t, prompt=p, max_tokens=m, id=f"r{i}"))
    return out


def load_arrivals(path: str | Path, vocab_range: tuple[int, int] = (100, 10000), seed: int = 0) -> list[Arrival]:
    """Read an arrivals JSONL file; LabkitError naming the line on anything malformed."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise LabkitError(f"--arrivals: cannot read {p}: {e.strerror or e}") from None
    out: list[Arrival] = []
    drawn = 0
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{p}:{n}"
        if len(out) >= MAX_REQUESTS:
            raise LabkitError(f"{where}: more than {MAX_REQUESTS} requests, more than a workload may hold")
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise LabkitError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise LabkitError(f"{where}: expected an object per line")
        unknown = set(rec) - {"t", "prompt", "prompt_ids", "prompt_len", "max_tokens", "id", "class"}
        if unknown:
            raise LabkitError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        t = rec.get("t")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0 or not math.isfinite(t):
            raise LabkitError(f"{where}: t must be a number of seconds >= 0, got {t!r}")
        m = rec.get("max_tokens")
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise LabkitError(f"{where}: max_tokens must be an integer >= 1, got {m!r}")
        given = [k for k in ("prompt", "prompt_ids", "prompt_len") if k in rec]
        if len(given) != 1:
            raise LabkitError(f"{where}: give exactly one of prompt, prompt_ids, prompt_len")
        if "prompt" in rec:
            prompt: list[int] | str = rec["prompt"]
            if not isinstance(prompt, str) or not prompt:
                raise LabkitError(f"{where}: prompt must be a non-empty string")
        elif "prompt_ids" in rec:
            prompt = rec["prompt_ids"]
            if not isinstance(prompt, list) or not prompt or not all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in prompt):
                raise LabkitError(f"{where}: prompt_ids must be a non-empty list of token ids >= 0")
        else:
            k = rec["prompt_len"]
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise LabkitError(f"{where}: prompt_len must be an integer >= 1, got {k!r}")
            drawn += k
            if drawn > MAX_TOKENS:  # before the ids are drawn: the file's prompt_len lines share one budget
                raise LabkitError(f"{where}: prompt_len: the file's prompt_len lines draw {drawn} tokens so far, "
                                  f"more than a workload may ({MAX_TOKENS})")
            rng = random.Random(f"labkit-arrivals:{seed}:{n}")
            prompt = [rng.randrange(*vocab_range) for _ in range(k)]
        rid = rec.get("id", f"line{n}")
        cls = rec.get("class")
        if cls is not None and (not isinstance(cls, str) or not cls):
            raise LabkitError(f"{where}: class must be a non-empty string, got {cls!r}")
        out.append(Arrival(t=float(t), prompt=prompt, max_tokens=m, id=str(rid), cls=cls))
    if not out:
        raise LabkitError(f"--arrivals: {p} has no requests")
    return sorted(out, key=lambda a: a.t)


# ------------------------------------------------------------------------------------------ the client
#
# The client must never be what limits a run: a GPU server streams ~21,000 tokens/s over 256 SSE streams.
# So: aiohttp when installed (C HTTP parser), else httpx; raw bytes split on blank lines (no per-line
# iterator), one clock read per network read, one json.loads per event. scripts/client_throughput.py
# measures what one core of this client takes in, and every result records the client's CPU time.

CLIENTS = ("aiohttp", "httpx")


def client_name(choice: str | None = None) -> str:
    """The HTTP library the load client uses: `choice`, or aiohttp when installed, else httpx."""
    import importlib.util

    if choice in (None, "auto"):
        for name in CLIENTS:
            if importlib.util.find_spec(name) is not None:
                return name
        raise LabkitError("the load bench needs aiohttp or httpx: pip install 'labkit[serve]'")
    if choice not in CLIENTS:
        raise LabkitError(f"--client: expected auto, {' or '.join(CLIENTS)}, got {choice!r}")
    if importlib.util.find_spec(choice) is None:
        raise LabkitError(f"--client {choice}: not installed (pip install {choice})")
    return choice


_IDS_KEY = b'"token_ids":'
_NOT_FINISHED = (b'"finish_reason": null', b'"finish_reason":null')


def plain_token_count(payload: bytes) -> int | None:
    """How many token ids a plain token event carries (one choice, not finished, no usage, no error), read
    without a JSON parse: json.loads was half the client's time per event. None for any other event, which
    then gets parsed in full. Sound because a JSON string escapes its quotes, so `"token_ids":` or
    `"finish_reason": null` can only be keys and values, never text inside a string."""
    if payload.count(_IDS_KEY) != 1 or b'"usage"' in payload or b'"error"' in payload:
        return None
    if _NOT_FINISHED[0] not in payload and _NOT_FINISHED[1] not in payload:
        return None
    start = payload.index(_IDS_KEY) + len(_IDS_KEY)
    end = payload.find(b"]", start)
    ids = payload[start:end].strip()
    if end < 0 or not ids.startswith(b"["):
        return None
    return ids.count(b",") + 1 if ids[1:].strip() else 0


class _Stream:
    """Reads one request's SSE stream into its Outcome.

    Token accounting follows vLLM's benchmark: each SSE event that carries tokens is one arrival; ttft is the
    first arrival, and every later arrival adds one itl (the gap since the previous arrival), however many
    tokens it holds. The server may coalesce several tokens into one event when the client falls behind, so
    output tokens are counted from each event's token_ids (a coalesced event adds len(token_ids) tokens and
    one itl). Events that reach us in the same network read share one timestamp.
    """

    def __init__(self, o: Outcome):
        self.o = o
        self.buf = b""
        self.last_ns: int | None = None
        self.done = False

    def feed(self, data: bytes) -> None:
        now = time.monotonic_ns()
        buf = self.buf + data if self.buf else data
        if b"\r" in buf:             # SSE allows CRLF line ends; labkit serve and vLLM send bare LF
            buf = buf.replace(b"\r\n", b"\n")
        events = buf.split(b"\n\n")
        self.buf = events.pop()
        for ev in events:
            if not ev.startswith(b"data:"):
                continue             # a comment (":" keep-alive) or a field we do not use
            payload = ev[5:]
            n = plain_token_count(payload)
            if n is None:
                n = self._parse(payload.strip())
                if self.done:
                    return
            if n:
                self._arrived(n, now)

    def _arrived(self, n: int, now: int) -> None:
        o = self.o
        if self.last_ns is None:
            o.ttft_ms = (now - o.sent_ns) / 1e6
        else:
            o.itl_ms.append((now - self.last_ns) / 1e6)
        self.last_ns = now
        o.chunk_tokens.append(n)
        o.output_tokens += n

    def _parse(self, payload: bytes) -> int:
        """Any event in full: [DONE], an error, usage, a finish; returns the tokens it carries."""
        if payload == b"[DONE]":
            self.done = True
            return 0
        data = json.loads(payload)
        if "error" in data:
            raise _StreamError(f"mid-stream: {(data['error'] or {}).get('message')}")
        usage = data.get("usage")
        if usage:
            self.o.prompt_tokens = usage.get("prompt_tokens")
        n = 0
        for choice in data.get("choices") or ():
            if choice.get("finish_reason"):
                self.o.finish_reason = choice["finish_reason"]
            n += len(choice.get("token_ids") or ())
        return n


class _StreamError(Exception):
    pass


def _error_text(status: int, body: bytes) -> str:
    try:
        msg = json.loads(body)["error"]["message"]
    except Exception:  # noqa: BLE001 - any body
        msg = body.decode(errors="replace")[:200]
    return f"HTTP {status}: {msg}"


async def _post_aiohttp(session, url: str, body: dict, stream: _Stream) -> str | None:
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            return _error_text(resp.status, await resp.read())
        async for data in resp.content.iter_any():
            stream.feed(data)
            if stream.done:
                break
    return None


async def _post_httpx(session, url: str, body: dict, stream: _Stream) -> str | None:
    async with session.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            return _error_text(resp.status_code, await resp.aread())
        async for data in resp.aiter_raw():
            stream.feed(data)
            if stream.done:
                break
    return None


async def _one(post, session, url: str, a: Arrival, t0: float, body_extra: dict,
               sem: asyncio.Semaphore | None, progress) -> Outcome:
    o = Outcome(id=a.id, scheduled_s=a.t, endpoint=url, cls=a.cls)
    delay = t0 + a.t - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    body = {"prompt": a.prompt, "max_tokens": a.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True, **body_extra}
    if sem is not None:
        await sem.acquire()
    try:
        o.sent_ns = time.monotonic_ns()
        o.error = await post(session, url + "/v1/completions", body, _Stream(o))
        if o.error is None:
            o.done_ns = time.monotonic_ns()
            o.e2el_ms = (o.done_ns - o.sent_ns) / 1e6
            if o.output_tokens == 0:
                o.error = "no tokens streamed"
    except _StreamError as e:
        o.error = str(e)
    except Exception as e:  # noqa: BLE001 - a failed request is a result, not a crash
        o.error = f"{type(e).__name__}: {e}"
    finally:
        if sem is not None:
            sem.release()
        progress()
    return o


def assign_endpoints(arrivals: list[Arrival], endpoints: list[str]) -> list[str]:
    """Round-robin in arrival order (ties keep their list order): the i-th arrival goes to endpoint i mod n."""
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i].t)
    out = [""] * len(arrivals)
    for rank, i in enumerate(order):
        out[i] = endpoints[rank % len(endpoints)]
    return out


async def _run_all(endpoints: list[str], arrivals: list[Arrival], body_extra: dict, max_concurrency: int | None,
                   timeout_s: float, progress, client: str) -> list[Outcome]:
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    urls = assign_endpoints(arrivals, endpoints)
    if client == "aiohttp":
        import aiohttp

        # limit=0: one connection per stream in flight, however many; no total timeout, a per-read one.
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=False),
                                        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0,
                                                                      sock_read=timeout_s))
        post = _post_aiohttp
    else:
        import httpx

        session = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0),
                                    limits=httpx.Limits(max_connections=max(len(arrivals), 1) + 4,
                                                        max_keepalive_connections=64))
        post = _post_httpx
    async with session:
        t0 = time.perf_counter()
        return list(await asyncio.gather(*(_one(post, session, url, a, t0, body_extra, sem, progress)
                                           for url, a in zip(urls, arrivals))))


def run_load(endpoints: list[str], arrivals: list[Arrival], *, temperature: float, ignore_eos: bool,
             max_concurrency: int | None = None, timeout_s: float = 600.0, progress=lambda: None,
             client: str | None = None) -> list[Outcome]:
    """Send every arrival (streamed, at its time) to its endpoint; one Outcome per arrival, in arrival order."""
    name = client_name(client)
    extra = {"temperature": temperature, "ignore_eos": ignore_eos}
    return asyncio.run(_run_all([u.rstrip("/") for u in endpoints], arrivals, extra, max_concurrency, timeout_s,
                                progress, name))


# ------------------------------------------------------------------------------------------ the server

class SpawnedServer:
    """`labkit serve` in a child process on a free loopback port; its output goes to `log_path`."""

    def __init__(self, args: list[str], log_path: Path, startup_timeout_s: float):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "w", encoding="utf-8")
        cmd = [sys.executable, "-m", "labkit", "serve", "--port", str(self.port), "--log-level", "warning", *args]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=os.environ.copy())
        self._wait_healthy(startup_timeout_s)

    def _tail(self) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1][:300] if lines else ""

    def _wait_healthy(self, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.close()
                raise LabkitError(f"the server exited with code {self.proc.returncode} before it was ready: "
                                  f"{self._tail()} (log: {self.log_path})", 2)
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.close()
        raise LabkitError(f"the server was not healthy after {timeout_s:.0f} s (log: {self.log_path})", 2)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def server_info(base_url: str) -> dict:
    """What GET /health says about the server; LabkitError (exit 2) when it cannot be reached or is not ready."""
    try:
        import httpx
    except ImportError:
        raise LabkitError("the load bench needs httpx: pip install 'labkit[serve]'") from None

    try:
        r = httpx.get(base_url.rstrip("/") + "/health", timeout=10.0)
    except httpx.HTTPError as e:
        raise LabkitError(f"cannot reach {base_url}: {type(e).__name__}: {e}", 2) from None
    if r.status_code != 200:
        raise LabkitError(f"{base_url}/health answered {r.status_code}: the server is not ready", 2)
    try:
        info = r.json()
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


# ------------------------------------------------------------------------------------------ provenance
#
# A load result belongs to the server that produced it, not to the client machine: its device (so its
# evidence kind), its model and its commit come from each endpoint's /health. labkit serve's /health holds
# at least {status, model_name, model: {path, config_sha256}, device, device_name, vocab_size, max_model_len,
# tp, git_head, labkit_version}; older servers hold a subset, and whatever is missing is recorded as None.

def _model_of(info: dict) -> dict:
    m = info.get("model") if isinstance(info.get("model"), dict) else {}
    return {"name": info.get("model_name"), "path": m.get("path"), "config_sha256": m.get("config_sha256")}


def _common(values: list):
    """The one value all endpoints share, else None."""
    return values[0] if values and all(v == values[0] for v in values) else None


def server_provenance(healths: list[tuple[str, dict]], allow_mixed: bool = False) -> dict:
    """device, evidence and model of a run from each endpoint's /health; LabkitError (exit 2) when the endpoints
    serve different models (config_sha256 or vocab_size differ) and allow_mixed is off."""
    models = [_model_of(info) for _, info in healths]
    identity = {"config_sha256": [m["config_sha256"] for m in models],
                "vocab_size": [info.get("vocab_size") for _, info in healths]}
    for key, values in identity.items():
        seen: dict = {}
        for (url, _), value in zip(healths, values):
            if value is not None:
                seen.setdefault(value, url)
        if len(seen) > 1 and not allow_mixed:
            where = ", ".join(f"{str(v)[:12]} at {u}" for v, u in seen.items())
            raise LabkitError(f"the endpoints serve different models ({key}: {where}); pass --allow-mixed to load "
                              "them together anyway", 2)
    devices = [str(info.get("device") or "unknown") for _, info in healths]
    knobs = [info.get("knobs") for _, info in healths]
    kinds = sorted({d.split(":")[0] for d in devices})
    unverified = [u for (u, _), m in zip(healths, models) if m["config_sha256"] is None]
    model = {k: _common([m[k] for m in models]) for k in ("name", "path", "config_sha256")}
    model["mixed"] = len({m["config_sha256"] for m in models if m["config_sha256"] is not None}) > 1
    return {
        # A measurement of GPU serving only when every endpoint served from a GPU.
        "evidence": "gpu-measured" if kinds == ["cuda"] else "cpu-executed",
        "device": {"type": kinds[0] if len(kinds) == 1 else "mixed",
                   "name": _common([info.get("device_name") for _, info in healths]),
                   "server": ", ".join(dict.fromkeys(devices)), "from": "server /health"},
        "model": model,
        # The engine knobs the servers run with, from /health: None when one does not say (another server, or
        # an older labkit) or when they differ.
        "knobs": knobs[0] if all(k is not None and k == knobs[0] for k in knobs) else None,
        "unverified_model": unverified if len(healths) > 1 else [],
        "servers": [{"url": url, "health": info} for url, info in healths],
    }
