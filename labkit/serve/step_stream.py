"""The step stream: one record per engine step, built in the engine core from what `LLMEngine.step()` returns
(StepResult) and published on a ZeroMQ PUB socket in msgpack (`labkit serve --step-stream`). The frontend
serves the same records as server-sent events (GET /v1/steps, stream_hub.py); `labkit watch` and the live
page read them there.

A record carries ForwardPassMetrics' fields under their names (the per-iteration record SGLang and Dynamo
publish: `scheduled_requests` and `queued_requests` with their prefill and decode counts, tokens, KV tokens
and variances, and `wall_time`), and labkit's own:

    step, phase, t (the core's monotonic time), num_decodes (rows [0, num_decodes) are decodes),
    rows: {request_id, new_tokens, kv_tokens, num_tokens, token_id, finish_reason}   one list per field, in
          batch order (new_tokens: computed this step; kv_tokens: the KV the request holds after it, in
          tokens; token_id: the token the step added, null for a chunk),
    num_waiting, num_running, free_blocks, num_blocks, kv_cache_usage,
    preempted (request ids this step's scheduling preempted), prefix_cache {queries, hits} (this step's),
    async {launched_ahead, wasted_rows} (since the record before).

Publishing never blocks a step: PUB drops what a subscriber has not taken past its high-water mark, and
`counter_id` numbers the records so a subscriber sees the gap.
"""
from __future__ import annotations

import time

FPM_VERSION = 1
STEP_TOPIC = b"step"
# Records a subscriber may leave unread before PUB drops the next ones for it (never blocking the engine).
PUB_HWM = 2000


def _sum_var(xs) -> tuple[int, float]:
    """Sum and population variance of a list of ints."""
    n = len(xs)
    if not n:
        return 0, 0.0
    s = sum(xs)
    mean = s / n
    return s, max(0.0, sum(x * x for x in xs) / n - mean * mean)


class QueueBook:
    """What waits, as ForwardPassMetrics' `queued_requests` counts it: prompts never scheduled yet (their sum
    and sum of squares kept as they come and go, so a step costs nothing per waiting request) and requests
    preempted back to the queue (with the tokens they had)."""

    def __init__(self):
        self.n = self.sum = self.sumsq = 0
        self.preempted: dict[int, int] = {}     # seq_id -> its tokens when preempted, until scheduled again

    def added(self, prompt_len: int) -> None:
        self.n += 1
        self.sum += prompt_len
        self.sumsq += prompt_len * prompt_len

    def scheduled(self, prompt_len: int) -> None:
        self.n -= 1
        self.sum -= prompt_len
        self.sumsq -= prompt_len * prompt_len

    def metrics(self) -> dict:
        n, mean = self.n, (self.sum / self.n if self.n else 0.0)
        kv = list(self.preempted.values())
        kv_sum, kv_var = _sum_var(kv)
        return {"num_prefill_requests": n, "sum_prefill_tokens": self.sum,
                "var_prefill_length": max(0.0, self.sumsq / n - mean * mean) if n else 0.0,
                "num_decode_requests": len(kv), "sum_decode_kv_tokens": kv_sum, "var_decode_kv_tokens": kv_var}


def step_record(r, wall_s: float, counter: int, queue: QueueBook, ahead: list[int], preempted_ids: list[str],
                worker_id: str = "") -> dict:
    """The record of one step (StepResult `r`), as published."""
    d = r.num_decodes
    starts, tokens = r.starts, r.num_tokens
    prefill_len = [t - (tok is not None) for t, tok in zip(tokens[d:], r.token_ids[d:])]  # length when scheduled
    _, p_var = _sum_var(prefill_len)
    d_sum, d_var = _sum_var(starts[:d])
    scheduled = {"num_prefill_requests": len(r.seq_ids) - d, "sum_prefill_tokens": sum(r.num_scheduled_tokens[d:]),
                 "var_prefill_length": p_var, "sum_prefill_kv_tokens": sum(starts[d:]),
                 "num_decode_requests": d, "sum_decode_kv_tokens": d_sum, "var_decode_kv_tokens": d_var}
    return {"version": FPM_VERSION, "worker_id": worker_id, "dp_rank": 0, "counter_id": counter,
            "wall_time": wall_s, "scheduled_requests": scheduled, "queued_requests": queue.metrics(),
            "step": r.step, "phase": r.phase, "t": time.monotonic(), "num_decodes": d,
            "rows": {"request_id": r.request_ids, "new_tokens": r.num_scheduled_tokens,
                     "kv_tokens": r.num_cached_tokens, "num_tokens": tokens, "token_id": r.token_ids,
                     "finish_reason": r.finish_reasons},
            "num_waiting": r.num_waiting, "num_running": r.num_running, "free_blocks": r.num_free_blocks,
            "num_blocks": r.num_blocks, "kv_cache_usage": r.kv_cache_usage, "preempted": preempted_ids,
            "prefix_cache": {"queries": r.prefix_cache_queries, "hits": r.prefix_cache_hits},
            "async": {"launched_ahead": ahead[0], "wasted_rows": ahead[1]}}


class Publisher:
    """A PUB socket bound to the given endpoints; `publish(topic, obj)` sends [topic, counter (8 bytes, big-endian,
    from 1 per topic), msgpack] and never waits (a subscriber that does not keep up loses records, which its counter
    shows)."""

    def __init__(self, ctx, endpoints: list[str], hwm: int = PUB_HWM):
        import msgpack
        import zmq

        self._zmq = zmq
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.setsockopt(zmq.LINGER, 0)
        for ep in endpoints:
            self.sock.bind(ep)
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self.counters: dict[bytes, int] = {}   # records published per topic

    def next_counter(self, topic: bytes) -> int:
        return self.counters.get(topic, 0) + 1

    def publish(self, topic: bytes, obj) -> None:
        n = self.counters[topic] = self.counters.get(topic, 0) + 1
        try:
            self.sock.send_multipart([topic, n.to_bytes(8, "big"), self._pack(obj)],
                                     flags=self._zmq.NOBLOCK, copy=False)
        except self._zmq.Again:  # (PUB drops rather than raises; kept for any socket type that would block)
            pass

    def close(self) -> None:
        self.sock.close(linger=0)
