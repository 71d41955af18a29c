"""The online load bench: requests arrive on a schedule at a running `labkit serve` (or one this command
starts), each streamed over SSE; latencies per request, throughput and goodput over the run.

Arrivals come from a workload (its requests, spaced by a Poisson process of --rate requests/s, seeded;
--rate inf sends them all at once) or from an arrivals file (workloads/arrivals/*.jsonl), one request per
line: {"t": seconds from the start, "prompt_len": N | "prompt_ids": [...] | "prompt": "text",
"max_tokens": M, "id": optional label}.

Metrics follow vLLM's benchmark_serving: ttft (first token), tpot ((e2el - ttft) / (tokens - 1), requests
with more than one token), itl (every gap between streamed tokens), e2el (request sent to last token), in ms
with mean / median / p90 / p99; request_throughput, output_throughput and total_token_throughput over the
benchmark's duration (first request sent to last response); goodput: requests per second meeting every
--slo bound (ttft:MS, tpot:MS, e2el:MS).
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
from typing import Any

from engine.config import free_port
from labkit.bench.workloads import Workload, draw
from labkit.errors import LabkitError

SLO_METRICS = ("ttft", "tpot", "e2el")
PERCENTILES = (50, 90, 99)


@dataclass
class Arrival:
    t: float                          # seconds after the start
    prompt: list[int] | str
    max_tokens: int
    id: str


@dataclass
class Outcome:
    id: str
    scheduled_s: float
    prompt_tokens: int | None = None
    output_tokens: int = 0
    ttft_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
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
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{p}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise LabkitError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise LabkitError(f"{where}: expected an object per line")
        unknown = set(rec) - {"t", "prompt", "prompt_ids", "prompt_len", "max_tokens", "id"}
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
            rng = random.Random(f"labkit-arrivals:{seed}:{n}")
            prompt = [rng.randrange(*vocab_range) for _ in range(k)]
        rid = rec.get("id", f"line{n}")
        out.append(Arrival(t=float(t), prompt=prompt, max_tokens=m, id=str(rid)))
    if not out:
        raise LabkitError(f"--arrivals: {p} has no requests")
    return sorted(out, key=lambda a: a.t)


def parse_slo(text: str | None) -> dict[str, float]:
    """"ttft:500,tpot:50" -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    if not text:
        return {}
    out = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition(":")
        if not sep or name not in SLO_METRICS:
            raise LabkitError(f"--slo: expected METRIC:MS[,METRIC:MS] with METRIC in {', '.join(SLO_METRICS)}, "
                              f"got {part.strip()!r}")
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if not ms > 0:
            raise LabkitError(f"--slo: {name} needs a positive number of milliseconds, got {value!r}")
        out[name] = ms
    return out


# ------------------------------------------------------------------------------------------ the client

async def _one(http, url: str, a: Arrival, t0: float, body_extra: dict, sem: asyncio.Semaphore | None,
               progress) -> Outcome:
    o = Outcome(id=a.id, scheduled_s=a.t)
    delay = t0 + a.t - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    body = {"prompt": a.prompt, "max_tokens": a.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True, **body_extra}
    if sem is not None:
        await sem.acquire()
    try:
        o.sent_ns = time.monotonic_ns()
        last = None
        async with http.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                try:
                    msg = json.loads(text)["error"]["message"]
                except Exception:  # noqa: BLE001 - any body
                    msg = text[:200]
                o.error = f"HTTP {resp.status_code}: {msg}"
                return o
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[6:]
                if payload == "[DONE]":
                    break
                data = json.loads(payload)
                if "error" in data:
                    o.error = f"mid-stream: {data['error'].get('message')}"
                    return o
                usage = data.get("usage")
                if usage:
                    o.prompt_tokens = usage.get("prompt_tokens")
                for choice in data.get("choices", []):
                    if choice.get("finish_reason"):
                        o.finish_reason = choice["finish_reason"]
                    ids = choice.get("token_ids") or []
                    if not ids:
                        continue
                    now = time.monotonic_ns()
                    if last is None:
                        o.ttft_ms = (now - o.sent_ns) / 1e6
                    else:
                        o.itl_ms.append((now - last) / 1e6)
                    last = now
                    o.output_tokens += len(ids)
        o.done_ns = time.monotonic_ns()
        o.e2el_ms = (o.done_ns - o.sent_ns) / 1e6
        if o.output_tokens == 0:
            o.error = "no tokens streamed"
    except Exception as e:  # noqa: BLE001 - a failed request is a result, not a crash
        o.error = f"{type(e).__name__}: {e}"
    finally:
        if sem is not None:
            sem.release()
        progress()
    return o


async def _run_all(base_url: str, arrivals: list[Arrival], body_extra: dict, max_concurrency: int | None,
                   timeout_s: float, progress) -> list[Outcome]:
    import httpx

    limits = httpx.Limits(max_connections=max(len(arrivals), 1) + 4, max_keepalive_connections=64)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), limits=limits) as http:
        t0 = time.perf_counter()
        tasks = [_one(http, base_url + "/v1/completions", a, t0, body_extra, sem, progress) for a in arrivals]
        return list(await asyncio.gather(*tasks))


def run_load(base_url: str, arrivals: list[Arrival], *, temperature: float, ignore_eos: bool,
             max_concurrency: int | None = None, timeout_s: float = 600.0, progress=lambda: None) -> list[Outcome]:
    try:
        import httpx  # noqa: F401 - fail early, with the install hint
    except ImportError:
        raise LabkitError("the load bench needs httpx: pip install 'labkit[serve]'", 2) from None
    extra = {"temperature": temperature, "ignore_eos": ignore_eos}
    return asyncio.run(_run_all(base_url.rstrip("/"), arrivals, extra, max_concurrency, timeout_s, progress))


# ------------------------------------------------------------------------------------------ metrics

def _stats(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"mean": None, "median": None, "p90": None, "p99": None, "n": 0}
    import numpy as np

    a = np.asarray(xs, dtype=float)
    return {"mean": float(a.mean()), "median": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "n": int(a.size)}


def meets_slo(o: Outcome, slo: dict[str, float]) -> bool:
    if not o.ok:
        return False
    values = {"ttft": o.ttft_ms, "tpot": o.tpot_ms, "e2el": o.e2el_ms}
    # A one-token request has no tpot: that bound does not apply to it.
    return all((values[k] is None and k == "tpot") or (values[k] is not None and values[k] <= ms)
               for k, ms in slo.items())


def summarize(outcomes: list[Outcome], slo: dict[str, float]) -> dict[str, Any]:
    done = [o for o in outcomes if o.ok]
    starts = [o.sent_ns for o in outcomes if o.sent_ns is not None]
    ends = [o.done_ns for o in done]
    duration = (max(ends) - min(starts)) / 1e9 if ends and starts else None
    out_tokens = sum(o.output_tokens for o in done)
    in_tokens = sum(o.prompt_tokens or 0 for o in done)
    per_s = (lambda n: n / duration) if duration else (lambda n: None)
    res: dict[str, Any] = {
        "requests": len(outcomes), "completed": len(done), "failed": len(outcomes) - len(done),
        "duration_s": duration, "input_tokens": in_tokens, "output_tokens": out_tokens,
        "request_throughput": per_s(len(done)), "output_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(in_tokens + out_tokens),
        "ttft_ms": _stats([o.ttft_ms for o in done if o.ttft_ms is not None]),
        "tpot_ms": _stats([o.tpot_ms for o in done if o.tpot_ms is not None]),
        "itl_ms": _stats([x for o in done for x in o.itl_ms]),
        "e2el_ms": _stats([o.e2el_ms for o in done if o.e2el_ms is not None]),
    }
    if slo:
        good = sum(meets_slo(o, slo) for o in outcomes)
        res["slo"] = slo
        res["good_requests"] = good
        res["goodput"] = per_s(good)
    errors: dict[str, int] = {}
    for o in outcomes:
        if o.error:
            errors[o.error[:120]] = errors.get(o.error[:120], 0) + 1
    res["errors"] = errors
    return res


def outcome_record(o: Outcome) -> dict:
    return {"id": o.id, "scheduled_s": o.scheduled_s, "prompt_tokens": o.prompt_tokens,
            "output_tokens": o.output_tokens, "ttft_ms": o.ttft_ms, "tpot_ms": o.tpot_ms, "e2el_ms": o.e2el_ms,
            "itl_ms": o.itl_ms, "finish_reason": o.finish_reason, "error": o.error}


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
    """What /health says about the server (device, blocks); LabkitError when it cannot be reached."""
    import httpx

    try:
        r = httpx.get(base_url.rstrip("/") + "/health", timeout=10.0)
    except httpx.HTTPError as e:
        raise LabkitError(f"cannot reach {base_url}: {type(e).__name__}: {e}", 2) from None
    if r.status_code != 200:
        raise LabkitError(f"{base_url}/health answered {r.status_code}: the server is not ready", 2)
    try:
        return r.json()
    except ValueError:
        return {}
