"""The server's books under every scheduling policy: prompt tokens, queue time and the core's per-request maps.

Issue 34's bug: the core reported queue time and prompt tokens only for requests first scheduled in a step
whose phase was "prefill", so under mixed (whose arrivals start in mixed steps) most requests never got them
and its `unscheduled` map kept one entry per such request for ever; and the frontend counted a request's
prompt tokens only while its stream was open, so a request that finished in its first step was never counted.
These tests drive the engine core in-process (EngineCore) and feed its step messages to the frontend's
EngineClient, as the server does over its sockets, with arrivals while others decode."""
from __future__ import annotations

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgpack")
pytest.importorskip("prometheus_client")

from engine import LLM  # noqa: E402

POLICIES = ("prefill_first", "balanced", "mixed")
ENGINE = dict(device="cpu", enforce_eager=True, max_model_len=512, max_num_batched_tokens=256, max_num_seqs=8)
SP = {"temperature": 0, "ignore_eos": True, "top_k": -1, "top_p": 1.0}


def _metric(client, name: str) -> float:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(client.metrics.registry).decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def _drive(core, client, arrivals: list[tuple[int, str, list[int], int]]) -> list[dict]:
    """Step the core until idle; `arrivals` (step, request_id, prompt ids, max_tokens) are added before that step.
    Every message goes to the frontend as the server would deliver it; returns the step messages."""
    from labkit.serve.engine_client import RequestStream

    steps, n = [], 0
    pending = sorted(arrivals)
    while pending or core.has_work:
        while pending and pending[0][0] <= n:
            _, rid, ids, max_tokens = pending.pop(0)
            assert core.handle(["add", rid, ids, {**SP, "max_tokens": max_tokens}]) == []
            client._live[rid] = RequestStream(rid, len(ids))  # what EngineClient.submit records
            client._no_token_yet += 1
        if core.has_work:
            for msg in core.step():
                assert msg[0] == "step", msg
                client._on_step(msg[1])
                steps.append(msg[1])
        n += 1
    return steps


@pytest.mark.parametrize("policy", POLICIES)
def test_prompt_tokens_queue_time_and_maps_are_right_under_every_policy(tiny_model, policy):
    from labkit.serve.core import EngineCore
    from labkit.serve.engine_client import EngineClient
    from labkit.serve.metrics import ServerMetrics

    llm = LLM(tiny_model, scheduling_policy=policy, **ENGINE)
    try:
        core = EngineCore(llm)
        client = EngineClient("m", {}, metrics=ServerMetrics("m"))
        # Two long prompts first (chunked under the 256-token budget), then arrivals while they decode: one that
        # finishes in its first step (max_tokens 1), and an id that comes back once its first request is done.
        arrivals = [(0, "a", list(range(100, 400)), 6), (0, "b", list(range(500, 540)), 8),
                    (3, "c", list(range(600, 700)), 4), (4, "one", list(range(700, 730)), 1),
                    (5, "d", list(range(800, 1000)), 3), (6, "e", list(range(1000, 1010)), 5),
                    (30, "c", list(range(1100, 1150)), 2)]
        steps = _drive(core, client, arrivals)
        phases = {s["phase"] for s in steps}
        if policy == "mixed":
            assert "mixed" in phases  # arrivals joined steps that also decode (the case the bug missed)
        else:
            assert "mixed" not in phases and {"prefill", "decode"} <= phases
        # Every request counted once, with its prompt, whatever the phase of its first step.
        queued = [q[0] for s in steps for q in s["queued"]]
        assert sorted(queued) == sorted(rid for _, rid, _, _ in arrivals)
        assert _metric(client, "labkit:prompt_tokens_total") == sum(len(ids) for _, _, ids, _ in arrivals)
        assert client.totals["prompt_tokens"] == sum(len(ids) for _, _, ids, _ in arrivals)
        assert _metric(client, "labkit:request_queue_time_seconds_count") == len(arrivals)
        assert _metric(client, "labkit:generation_tokens_total") == sum(m for _, _, _, m in arrivals)
        assert _metric(client, "labkit:time_to_first_token_seconds_count") == len(arrivals)
        # Every per-request map is empty once everything finished, in the core and in the frontend.
        assert core.live == {} and core.unscheduled == {}
        assert client._live == {} and client.num_waiting == 0
        _check_iteration_lines(steps, arrivals)
        assert llm._seqs == {}
    finally:
        llm.exit()


@pytest.mark.parametrize("policy", POLICIES)
def test_an_aborted_request_leaves_no_entry_under_every_policy(tiny_model, policy):
    from labkit.serve.core import EngineCore

    llm = LLM(tiny_model, scheduling_policy=policy, **ENGINE)
    try:
        core = EngineCore(llm)
        core.handle(["add", "run", list(range(100, 160)), {**SP, "max_tokens": 20}])
        core.step()
        core.step()
        core.handle(["add", "never", list(range(200, 260)), {**SP, "max_tokens": 4}])
        core.handle(["abort", ["never", "run"]])  # one never scheduled, one running
        while core.has_work:
            core.step()
        assert core.live == {} and core.unscheduled == {} and llm._seqs == {}
    finally:
        llm.exit()


def _check_iteration_lines(steps: list[dict], arrivals: list) -> None:
    """vLLM's per-iteration line (--log-iteration-details) of each step: context (prefill) and generation (decode)
    rows and tokens that add up to the step, and over the run to every prompt token (the prompts share no prefix)
    and every output token but each request's first (which its prefill samples)."""
    import re

    from labkit.serve.engine_client import iteration_line

    context = generation = 0
    for s in steps:
        line = iteration_line(s)
        m = re.fullmatch(r"labkit serve: Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) "
                         r"generation requests, (\d+) generation tokens, iteration elapsed time: ([\d.]+) ms, "
                         r"KV cache usage: ([\d.]+)%", line)
        assert m, line
        n, c_req, c_tok, g_req, g_tok = (int(x) for x in m.groups()[:5])
        assert n == s["n"] and c_req + g_req == s["batch"] and c_tok + g_tok == s["tokens"] and g_req == g_tok
        assert (c_req > 0, g_req > 0) == {"prefill": (True, False), "decode": (False, True),
                                          "mixed": (True, True)}[s["phase"]], line
        context += c_tok
        generation += g_tok
    assert context == sum(len(ids) for _, _, ids, _ in arrivals)
    assert generation == sum(m - 1 for _, _, _, m in arrivals)


def _histogram(client, name: str) -> tuple[float, float]:
    """(count, sum) of a histogram family."""
    return _metric(client, f"{name}_count"), _metric(client, f"{name}_sum")


@pytest.mark.parametrize("policy", POLICIES)
def test_latency_histograms_add_up_request_by_request(tiny_model, policy, monkeypatch):
    """Per request, time to first token plus its inter-token gaps is its end-to-end latency (the last token and
    the finish arrive together), so the histograms' sums agree; one gap a token after each request's first; the
    queue-time histogram holds what the core measured. A fake clock ticks once per reading, so every time is
    distinct and exact."""
    from labkit.serve import engine_client
    from labkit.serve.core import EngineCore
    from labkit.serve.engine_client import EngineClient
    from labkit.serve.metrics import ServerMetrics

    ticks = iter(range(1, 10 ** 6))
    monkeypatch.setattr(engine_client.time, "monotonic", lambda: float(next(ticks)))
    llm = LLM(tiny_model, scheduling_policy=policy, **ENGINE)
    try:
        core = EngineCore(llm)
        client = EngineClient("m", {}, metrics=ServerMetrics("m"))
        arrivals = [(0, "a", list(range(100, 400)), 6), (0, "b", list(range(500, 540)), 8),
                    (3, "c", list(range(600, 700)), 4), (4, "one", list(range(700, 730)), 1)]
        steps = _drive(core, client, arrivals)
        waited = [q[1] for st in steps for q in st["queued"]]
        assert len(waited) == len(arrivals) and min(waited) > 0   # every request waited some ticks to be scheduled
        assert _histogram(client, "labkit:request_queue_time_seconds") == (len(arrivals), pytest.approx(sum(waited)))
        n_ttft, ttft = _histogram(client, "labkit:time_to_first_token_seconds")
        n_itl, itl = _histogram(client, "labkit:inter_token_latency_seconds")
        n_e2el, e2el = _histogram(client, "labkit:e2e_request_latency_seconds")
        assert n_ttft == n_e2el == len(arrivals)
        assert n_itl == sum(m - 1 for *_, m in arrivals)
        assert ttft + itl == pytest.approx(e2el) and itl >= n_itl  # each gap spans at least one clock reading
    finally:
        llm.exit()


def test_the_latency_histograms_have_vllms_buckets():
    """A dashboard built on vLLM's histograms reads ours: TTFT (and the other request latencies) on vLLM's TTFT
    boundaries; inter-token latency on vLLM's, with four finer ones below 10 ms (a decode step takes a few ms)."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from labkit.serve.metrics import ServerMetrics

    vllm_ttft = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                 40.0, 80.0, 160.0, 640.0, 2560.0]
    vllm_itl = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0]
    m = ServerMetrics("m")
    bounds = {}
    for family in text_string_to_metric_families(generate_latest(m.registry).decode()):
        les = [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")]
        if les:
            bounds[family.name] = les
    inf = [float("inf")]
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert bounds[f"labkit:{name}"] == vllm_ttft + inf, name
    assert bounds["labkit:inter_token_latency_seconds"] == [0.001, 0.0025, 0.005, 0.0075] + vllm_itl + inf
