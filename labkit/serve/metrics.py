"""Prometheus metrics under the names a vLLM user knows (`vllm:` -> `labkit:`, same suffixes and labels).

docs/serving.md maps each family to vLLM's. Every family carries a `model_name` label.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.metrics_core import Metric

# No `*_created` series: vLLM's server turns them off too, and they double the exposition for nothing.
disable_created_metrics()

# vLLM's buckets for request latencies (seconds).
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                   10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
# vLLM's inter-token buckets, with four finer ones below 10 ms (a decode step here takes a few ms).
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class VllmNames:
    """A collector that re-exports a registry's `labkit:` families under vLLM's `vllm:` names (a router or a
    dashboard that reads vLLM's names reads these); computed only when /metrics is scraped."""

    def __init__(self, registry):
        self.source = registry

    def collect(self):
        for family in self.source.collect():
            if not family.name.startswith("labkit:"):
                continue
            name = "vllm:" + family.name[len("labkit:"):]
            fam = Metric(name, family.documentation, family.type, family.unit)
            for s in family.samples:
                fam.add_sample("vllm:" + s.name[len("labkit:"):], s.labels, s.value, s.timestamp, s.exemplar)
            yield fam


class ServerMetrics:
    def __init__(self, model_name: str, vllm_names: bool = False):
        self.registry = r = CollectorRegistry()
        lbl = ["model_name"]

        def gauge(name, doc):
            return Gauge(f"labkit:{name}", doc, lbl, registry=r).labels(model_name)

        def counter(name, doc):
            return Counter(f"labkit:{name}", doc, lbl, registry=r).labels(model_name)

        def histogram(name, doc, buckets):
            return Histogram(f"labkit:{name}", doc, lbl, buckets=buckets, registry=r).labels(model_name)

        self.running = gauge("num_requests_running", "Requests in the engine's running queue")
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled")
        self.kv_usage = gauge("kv_cache_usage_perc", "KV cache usage: 1 means every block is in use")
        self.prefix_queries = counter("prefix_cache_queries", "Prefix cache queries, in tokens")
        self.prefix_hits = counter("prefix_cache_hits", "Prefix cache hits, in tokens")
        self.preemptions = counter("num_preemptions", "Preemptions of running requests")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of requests once scheduled")
        self.generation_tokens = counter("generation_tokens", "Generated tokens delivered")
        self.steps = counter("engine_steps", "Engine steps run")
        self.ttft = histogram("time_to_first_token_seconds", "Arrival to first token", LATENCY_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Gap between a request's tokens", ITL_BUCKETS)
        self.e2el = histogram("e2e_request_latency_seconds", "Arrival to last token", LATENCY_BUCKETS)
        self.queue_time = histogram("request_queue_time_seconds", "Time a request waited for its first schedule",
                                    LATENCY_BUCKETS)
        self._success = Counter("labkit:request_success", "Finished requests by finish reason",
                                ["model_name", "finished_reason"], registry=r)
        self._http = Counter("labkit:http_requests", "HTTP requests by endpoint and status",
                             ["model_name", "endpoint", "status"], registry=r)
        self._ahead = Counter("labkit:async_scheduled_steps", "Steps launched while the step before them still ran "
                              "(async scheduling)", ["model_name"], registry=r)
        self._wasted = Counter("labkit:async_wasted_rows", "Rows computed for requests that had meanwhile stopped "
                               "on EOS or been aborted (async scheduling: their tokens are dropped)",
                               ["model_name"], registry=r)
        self.healthy = gauge("healthy", "1 while the engine core is alive and admitting")
        self.vllm_names = None
        if vllm_names:
            self.vllm_names = CollectorRegistry()
            self.vllm_names.register(VllmNames(r))
        # --step-stream (and the live trace): who reads the engine core's stream through this frontend.
        self.stream_subscribers = gauge("stream_subscribers", "Clients reading /v1/steps or /v1/trace now")
        self.stream_dropped = counter("stream_dropped_subscribers", "Stream clients dropped because they fell a "
                                      "whole queue behind")
        self.stream_missed = counter("stream_missed_records", "Stream records the engine core dropped before this "
                                     "frontend read them (its PUB socket's high-water mark)")
        self.model_name = model_name

    def finished(self, reason: str) -> None:
        self._success.labels(self.model_name, reason).inc()

    def async_step(self, ahead: int, wasted: int) -> None:
        if ahead:
            self._ahead.labels(self.model_name).inc(ahead)
        if wasted:
            self._wasted.labels(self.model_name).inc(wasted)

    def http(self, endpoint: str, status: int) -> None:
        self._http.labels(self.model_name, endpoint, str(status)).inc()
