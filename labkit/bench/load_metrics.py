"""The load bench's numbers, from the per-request outcomes, as vLLM's benchmark (vllm bench serve) defines them.

Per request (completed ones only): ttft (sent to the first token event), tpot ((e2el - ttft) / (tokens - 1),
requests with more than one token), itl (one gap per token event after the first: see load.py's _Stream for
coalesced events), e2el (sent to the end of the stream). Each in ms with mean, median, std (numpy's, ddof 0)
and the --percentiles (numpy's linear interpolation), keyed p50, p90, p99.9, ...; n counts the values. An
empty list gives None, where vLLM prints 0.

Over the run, whose duration is first request sent to last response finished: request_throughput,
output_throughput, total_token_throughput (tokens per second), goodput (requests per second meeting every
--slo bound), and vLLM's two peaks: max_output_tokens_per_s (the most output tokens that arrived within one
1-second bucket counted from the first request sent; a coalesced event puts all its tokens in its bucket, so
on a server that streams one token per event this is vLLM's number) and max_concurrent_requests (the most
requests in flight at one instant, [sent, finished) intervals, a finish before a send at equal times).

vLLM's flat key names map to ours: mean_ttft_ms -> ttft_ms.mean, p99_tpot_ms -> tpot_ms.p99, duration ->
duration_s, total_input_tokens / total_output_tokens -> input_tokens / output_tokens, request_goodput ->
goodput; the rest are spelled the same.
"""
from __future__ import annotations

import math
from typing import Any

from labkit.errors import LabkitError

SLO_METRICS = ("ttft", "tpot", "e2el")
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


# ------------------------------------------------------------------------------------------ options

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


def parse_percentiles(text: str | None) -> list[float]:
    """"50,90,99.9" -> [50.0, 90.0, 99.9]; each within [0, 100], in the order given, repeats dropped."""
    if text is None or not text.strip():
        return list(DEFAULT_PERCENTILES)
    out: list[float] = []
    for part in text.split(","):
        try:
            p = float(part)
        except ValueError:
            p = math.nan
        if not 0 <= p <= 100:
            raise LabkitError(f"--percentiles: expected numbers from 0 to 100 separated by commas, "
                              f"got {part.strip()!r}")
        if p not in out:
            out.append(p)
    return out


def percentile_key(p: float) -> str:
    """vLLM's spelling: 99 -> "p99", 99.9 -> "p99.9"."""
    return f"p{int(p)}" if p == int(p) else f"p{p:g}"


# ------------------------------------------------------------------------------------------ per request

def meets_slo(o, slo: dict[str, float]) -> bool:
    if not o.ok:
        return False
    values = {"ttft": o.ttft_ms, "tpot": o.tpot_ms, "e2el": o.e2el_ms}
    # A one-token request has no tpot: that bound does not apply to it (vLLM counts its tpot as 0).
    return all((values[k] is None and k == "tpot") or (values[k] is not None and values[k] <= ms)
               for k, ms in slo.items())


def stats(xs: list[float], percentiles: list[float]) -> dict[str, float | None]:
    """mean, median, std, one key per percentile, and n."""
    keys = ["mean", "median", "std"] + [percentile_key(p) for p in percentiles]
    if not xs:
        return {**{k: None for k in keys}, "n": 0}
    import numpy as np

    a = np.asarray(xs, dtype=float)
    out: dict[str, Any] = {"mean": float(a.mean()), "median": float(np.median(a)), "std": float(a.std())}
    for p, v in zip(percentiles, np.percentile(a, percentiles)):
        out[percentile_key(p)] = float(v)
    out["n"] = int(a.size)
    return out


# ------------------------------------------------------------------------------------------ peaks

def token_arrivals_s(o) -> tuple[list[float], list[int]]:
    """When each token event of a completed request arrived (seconds, the sent_ns clock) and its tokens."""
    t = o.sent_ns / 1e9 + o.ttft_ms / 1e3
    times = [t]
    for gap in o.itl_ms:
        t += gap / 1e3
        times.append(t)
    return times, list(o.chunk_tokens)


def max_output_tokens_per_s(done: list) -> float | None:
    """Most output tokens within one 1-second bucket, buckets counted from the first request sent."""
    if not done:
        return None
    import numpy as np

    start = min(o.sent_ns for o in done) / 1e9
    times: list[float] = []
    tokens: list[int] = []
    for o in done:
        t, n = token_arrivals_s(o)
        times += t
        tokens += n
    buckets = np.floor(np.asarray(times) - start).astype(np.int64)
    return float(np.bincount(np.maximum(buckets, 0), weights=np.asarray(tokens, dtype=float)).max())


def max_concurrent_requests(done: list) -> int | None:
    """Most requests in flight at one instant: a sweep over [sent, finished); a finish before a send at ties."""
    if not done:
        return None
    events = sorted([(o.sent_ns, 1) for o in done] + [(o.done_ns, -1) for o in done])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


# ------------------------------------------------------------------------------------------ the run

def summarize(outcomes: list, slo: dict[str, float], percentiles: list[float] | None = None,
              duration_s: float | None = None, per_endpoint: bool = True) -> dict[str, Any]:
    """Every metric over `outcomes`; with several endpoints, the same per endpoint under "endpoints" (their
    throughputs over the whole run's duration, so they add up to the combined figures); with request classes
    (an arrivals file's "class"), the same per class under "classes"."""
    pcts = list(DEFAULT_PERCENTILES) if percentiles is None else percentiles
    done = [o for o in outcomes if o.ok]
    if duration_s is None:
        starts = [o.sent_ns for o in outcomes if o.sent_ns is not None]
        ends = [o.done_ns for o in done]
        duration_s = (max(ends) - min(starts)) / 1e9 if ends and starts else None
    out_tokens = sum(o.output_tokens for o in done)
    in_tokens = sum(o.prompt_tokens or 0 for o in done)
    per_s = (lambda n: n / duration_s) if duration_s else (lambda n: None)
    res: dict[str, Any] = {
        "requests": len(outcomes), "completed": len(done), "failed": len(outcomes) - len(done),
        "duration_s": duration_s, "input_tokens": in_tokens, "output_tokens": out_tokens,
        "request_throughput": per_s(len(done)), "output_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(in_tokens + out_tokens),
        "max_output_tokens_per_s": max_output_tokens_per_s(done),
        "max_concurrent_requests": max_concurrent_requests(done),
        "percentiles": pcts,
        "ttft_ms": stats([o.ttft_ms for o in done if o.ttft_ms is not None], pcts),
        "tpot_ms": stats([o.tpot_ms for o in done if o.tpot_ms is not None], pcts),
        "itl_ms": stats([x for o in done for x in o.itl_ms], pcts),
        "e2el_ms": stats([o.e2el_ms for o in done if o.e2el_ms is not None], pcts),
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
    urls = list(dict.fromkeys(o.endpoint for o in outcomes))
    if per_endpoint and len(urls) > 1:
        res["endpoints"] = [{"url": u, **summarize([o for o in outcomes if o.endpoint == u], slo, pcts, duration_s,
                                                   per_endpoint=False)} for u in urls]
    classes = list(dict.fromkeys(o.cls for o in outcomes if getattr(o, "cls", None)))
    if per_endpoint and classes:
        res["classes"] = {c: summarize([o for o in outcomes if o.cls == c], slo, pcts, duration_s, per_endpoint=False)
                          for c in classes}
    return res


def outcome_record(o) -> dict:
    return {"id": o.id, "class": o.cls, "endpoint": o.endpoint, "scheduled_s": o.scheduled_s,
            "prompt_tokens": o.prompt_tokens,
            "output_tokens": o.output_tokens, "ttft_ms": o.ttft_ms, "tpot_ms": o.tpot_ms, "e2el_ms": o.e2el_ms,
            "itl_ms": o.itl_ms, "chunk_tokens": o.chunk_tokens, "finish_reason": o.finish_reason, "error": o.error}
