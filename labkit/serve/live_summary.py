"""What the frontend adds to the step stream once a second: the /metrics totals and gauges at that moment, and
TTFT, ITL and end-to-end latency percentiles over the last WINDOW_S seconds, estimated from the histograms'
bucket counts as Prometheus' histogram_quantile does (linear inside a bucket). Read from the same registry as
/metrics, on the same event loop, so a summary's totals are /metrics' values at that instant.

The latencies are the frontend's (arrival to first token, gaps between a request's tokens), which the engine
core cannot see; the step records carry the rest.
"""
from __future__ import annotations

import math
import time
from collections import deque

WINDOW_S = 10.0
# /metrics families -> the summary's names (counters as totals; gauges as they are).
TOTALS = {"labkit:prompt_tokens_total": "prompt_tokens", "labkit:generation_tokens_total": "generation_tokens",
          "labkit:engine_steps_total": "engine_steps", "labkit:num_preemptions_total": "preemptions",
          "labkit:request_success_total": "requests_finished", "labkit:prefix_cache_queries_total":
          "prefix_cache_queries", "labkit:prefix_cache_hits_total": "prefix_cache_hits"}
GAUGES = {"labkit:num_requests_running": "running", "labkit:num_requests_waiting": "waiting",
          "labkit:kv_cache_usage_perc": "kv_cache_usage"}
HISTOGRAMS = {"labkit:time_to_first_token_seconds": "ttft_ms", "labkit:inter_token_latency_seconds": "itl_ms",
              "labkit:e2e_request_latency_seconds": "e2el_ms"}
QUANTILES = (0.5, 0.9, 0.99)


def read_registry(registry) -> tuple[dict[str, float], dict[str, list[tuple[float, float]]]]:
    """(sample name -> value summed over labels, histogram family -> [(le, cumulative count), ...])."""
    values: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                fam = buckets.setdefault(family.name, {})
                fam[le] = fam.get(le, 0.0) + s.value
            else:
                values[s.name] = values.get(s.name, 0.0) + s.value
    return values, {name: sorted(b.items()) for name, b in buckets.items()}


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """histogram_quantile(q) over cumulative (le, count) pairs; None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le           # past the last finite bucket: its bound, as Prometheus answers
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


class LiveSummary:
    def __init__(self, registry, window_s: float = WINDOW_S):
        self.registry = registry
        self.window_s = window_s
        self._history: deque = deque()   # (t, {family: buckets}) a second apart, the window's worth

    def snapshot(self, now: float | None = None) -> dict:
        now = time.monotonic() if now is None else now
        values, buckets = read_registry(self.registry)
        self._history.append((now, buckets))
        while len(self._history) > 1 and now - self._history[1][0] >= self.window_s:
            self._history.popleft()
        t0, old = self._history[0]
        out = {"kind": "summary", "t": now, "window_s": round(now - t0, 3),
               "totals": {short: values.get(name, 0.0) for name, short in TOTALS.items()},
               **{short: values.get(name, 0.0) for name, short in GAUGES.items()}}
        for name, short in HISTOGRAMS.items():
            cur, before = buckets.get(name, []), dict(old.get(name, []))
            window = [(le, c - before.get(le, 0.0)) for le, c in cur] if t0 < now else cur
            qs = {f"p{round(q * 100)}": quantile(q, window) for q in QUANTILES}
            out[short] = {k: (None if v is None else round(1e3 * v, 3)) for k, v in qs.items()}
            out[short]["count"] = window[-1][1] if window else 0.0
        return out
