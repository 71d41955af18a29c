"""The numbers a user reads off `labkit serve client` and the server's periodic stats line, from their definitions:
TPOT is (e2e latency - TTFT) / (output tokens - 1) (vLLM's and genai-perf's definition), the token count falls
back to the answer's usage.completion_tokens when the server sends no ids, and the stats line's prefix cache hit
rate is the interval's prefix hits over its prefix queries."""
from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx")


def _with_transport(monkeypatch, handler) -> None:
    """labkit.serve.client's httpx.Client, answered by `handler` instead of the network."""
    real = httpx.Client

    def client(*args, **kw):
        return real(*args, transport=httpx.MockTransport(handler), **kw)

    monkeypatch.setattr(httpx, "Client", client)


def _sse(*events) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


def test_tpot_is_the_time_after_the_first_token_over_the_tokens_after_it(monkeypatch):
    from labkit.serve.client import request

    head = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m"}
    body = _sse(*[{**head, "choices": [{"index": 0, "text": t, "token_ids": [i], "finish_reason": None}]}
                  for i, t in enumerate(["a", "b", "c", "d"])],
                {**head, "choices": [{"index": 0, "text": "", "token_ids": [], "finish_reason": "length"}]},
                {**head, "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}},
                b"[DONE]")
    _with_transport(monkeypatch, lambda req: httpx.Response(200, content=body,
                                                             headers={"content-type": "text/event-stream"}))
    res = request("http://x", "hi", max_tokens=4, stream=True, echo=lambda *a, **k: None)
    assert res["text"] == "abcd" and res["token_ids"] == [0, 1, 2, 3] and res["finish_reason"] == "length"
    assert res["num_tokens"] == 4 and len(res["itl_ms"]) == 3
    assert res["tpot_ms"] == pytest.approx((res["e2el_ms"] - res["ttft_ms"]) / 3)


def test_without_token_ids_the_count_is_the_usages_completion_tokens(monkeypatch):
    from labkit.serve.client import request

    answer = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m",
              "choices": [{"index": 0, "text": "abc", "finish_reason": "length", "logprobs": None}],
              "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}
    _with_transport(monkeypatch, lambda req: httpx.Response(200, json=answer))
    res = request("http://x", "hi", max_tokens=3, echo=lambda *a, **k: None)
    assert res["num_tokens"] == 3 and res["usage"]["prompt_tokens"] == 7
    # unstreamed, the first token's time is not seen: no TTFT, no TPOT (not a whole-answer TTFT and a TPOT of ~0)
    assert res["ttft_ms"] is None and res["tpot_ms"] is None and res["e2el_ms"] > 0


def test_the_stats_lines_hit_rate_is_hits_over_queries_and_usage_is_blocks_in_use():
    from types import SimpleNamespace

    from labkit.serve.server import StatsLine

    engine = SimpleNamespace(totals={"prompt_tokens": 0, "generation_tokens": 0, "prefix_queries": 0,
                                     "prefix_hits": 0},
                             stats={"running": 1, "waiting": 0, "free_blocks": 64, "num_blocks": 64}, num_live=1)
    line = StatsLine(engine, now=0.0)
    # 1000 prompt tokens, 400 of them looked up in the prefix cache, 100 found: 25%; 48 of 64 blocks free: 25% used.
    engine.totals = {"prompt_tokens": 1000, "generation_tokens": 10, "prefix_queries": 400, "prefix_hits": 100}
    engine.stats = {"running": 1, "waiting": 0, "free_blocks": 48, "num_blocks": 64}
    text = line.next(10.0)
    assert "Avg prompt throughput: 100.0 tokens/s" in text
    assert "Prefix cache hit rate: 25.0%" in text
    assert "KV cache usage: 25.0%" in text
