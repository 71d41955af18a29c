"""The step stream (labkit serve --step-stream): one record per engine step from the engine core, on a ZeroMQ PUB
socket in msgpack, with ForwardPassMetrics' fields and labkit's; the frontend's hub that serves it as
server-sent events, drops a slow subscriber with a count, and never makes the engine wait."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")
pytest.importorskip("prometheus_client")

from engine import LLM  # noqa: E402

POLICIES = ("prefill_first", "balanced", "mixed")
ENGINE = dict(device="cpu", enforce_eager=True, max_model_len=512, max_num_batched_tokens=256, max_num_seqs=8)
SP = {"temperature": 0, "ignore_eos": True, "top_k": -1, "top_p": 1.0}
FPM_SCHEDULED = ("num_prefill_requests", "sum_prefill_tokens", "var_prefill_length", "sum_prefill_kv_tokens",
                 "num_decode_requests", "sum_decode_kv_tokens", "var_decode_kv_tokens")
FPM_QUEUED = ("num_prefill_requests", "sum_prefill_tokens", "var_prefill_length", "num_decode_requests",
              "sum_decode_kv_tokens", "var_decode_kv_tokens")


class Sub:
    """A ZeroMQ subscriber to a publisher's endpoint, as an outside client would be."""

    def __init__(self, ctx, endpoint: str, topic: bytes = b""):
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(endpoint)

    def drain(self, timeout_ms: int = 200) -> list[tuple[bytes, int, dict]]:
        out = []
        while self.sock.poll(timeout_ms):
            topic, counter, payload = self.sock.recv_multipart()
            out.append((topic, int.from_bytes(counter, "big"), msgpack.unpackb(payload, raw=False)))
        return out


@pytest.fixture()
def pubsub(tmp_path):
    from labkit.serve.step_stream import Publisher

    ctx = zmq.Context()
    endpoint = f"ipc://{tmp_path}/steps"
    pub = Publisher(ctx, [endpoint])
    sub = Sub(ctx, endpoint)
    time.sleep(0.2)  # (a PUB drops what it sends before the subscription arrives: ZeroMQ's slow joiner)
    yield pub, sub
    sub.sock.close(linger=0)
    pub.close()
    ctx.term()


def _run(core, arrivals) -> list:
    pending, n, msgs = sorted(arrivals), 0, []
    while pending or core.has_work:
        while pending and pending[0][0] <= n:
            _, rid, ids, max_tokens = pending.pop(0)
            core.handle(["add", rid, ids, {**SP, "max_tokens": max_tokens}])
        if core.has_work:
            msgs += core.step()
        n += 1
    return msgs


@pytest.mark.parametrize("policy", POLICIES)
def test_one_record_per_step_with_forward_pass_metrics_that_add_up(tiny_model, pubsub, policy):
    from labkit.serve.core import EngineCore

    pub, sub = pubsub
    llm = LLM(tiny_model, scheduling_policy=policy, **ENGINE)
    try:
        core = EngineCore(llm, pub, worker_id="w1")
        arrivals = [(0, "a", list(range(100, 400)), 5), (0, "b", list(range(500, 540)), 6),
                    (2, "c", list(range(600, 700)), 4), (3, "d", list(range(800, 810)), 3)]
        msgs = _run(core, arrivals)
    finally:
        llm.exit()
    got = sub.drain()
    steps = [m[1] for m in msgs if m[0] == "step"]
    assert [t for t, _, _ in got] == [b"step"] * len(steps)
    assert [c for _, c, _ in got] == list(range(1, len(steps) + 1))          # numbered: a gap would show
    recs = [r for _, _, r in got]
    assert [r["step"] for r in recs] == [s["n"] for s in steps]
    assert [r["phase"] for r in recs] == [s["phase"] for s in steps]
    for r, s in zip(recs, steps):
        sched, queued = r["scheduled_requests"], r["queued_requests"]
        assert set(sched) == set(FPM_SCHEDULED) and set(queued) == set(FPM_QUEUED)
        assert r["version"] == 1 and r["worker_id"] == "w1" and r["counter_id"] == r["step"] and r["wall_time"] > 0
        assert sched["sum_prefill_tokens"] + sched["num_decode_requests"] == s["tokens"] == sum(r["rows"]["new_tokens"])
        assert sched["sum_prefill_tokens"] + sched["num_decode_requests"] == s["tokens"]
        assert s["tokens"] == sum(r["rows"]["new_tokens"])
        assert sched["num_decode_requests"] == r["num_decodes"]
        assert [r["num_waiting"], r["num_running"]] == s["stats"][:2]
        assert r["free_blocks"] == s["stats"][2] and r["num_blocks"] == s["stats"][3]
    # Each request: its prompt and every output but the last computed once, over the steps (no prefix hits, no
    # preemption here); the KV it holds after its last unfinished step is all of it but the newest token.
    computed: dict[str, int] = {}
    for r in recs:
        for rid, k in zip(r["rows"]["request_id"], r["rows"]["new_tokens"]):
            computed[rid] = computed.get(rid, 0) + k
    assert computed == {rid: len(ids) + m - 1 for _, rid, ids, m in arrivals}
    # What waits: the prompts not yet scheduled, as the core knows them.
    first_step = {}
    for r in recs:
        for rid in r["rows"]["request_id"]:
            first_step.setdefault(rid, r["step"])
    for r in recs:  # (arrivals at round k are added before step k + 1)
        waiting = [len(ids) for at, rid, ids, _ in arrivals if at < r["step"] < first_step[rid]]
        assert r["queued_requests"]["num_prefill_requests"] == len(waiting)
        assert r["queued_requests"]["sum_prefill_tokens"] == sum(waiting)
    if policy == "mixed":
        mixed = [r for r in recs if r["phase"] == "mixed"]
        assert mixed and all(r["scheduled_requests"]["num_prefill_requests"] > 0
                             and r["scheduled_requests"]["num_decode_requests"] > 0 for r in mixed)


def test_queued_and_preempted_requests_are_counted(tiny_model, pubsub):
    """A pool too small for everyone: preemptions are named in the record of the step that made them, and
    the preempted request counts as a queued decode until it is scheduled again."""
    from labkit.serve.core import EngineCore

    pub, sub = pubsub
    llm = LLM(tiny_model, **{**ENGINE, "kvcache_block_size": 16, "num_kvcache_blocks": 12})
    try:
        core = EngineCore(llm, pub)
        for i in range(4):
            core.handle(["add", f"r{i}", list(range(100 + 50 * i, 140 + 50 * i)), {**SP, "max_tokens": 60}])
        first = core.step()[0][1]
        msgs = [["step", first]] + _run(core, [])
    finally:
        llm.exit()
    recs = [r for _, _, r in sub.drain()]
    assert (recs[0]["queued_requests"]["num_prefill_requests"]
            == 4 - recs[0]["scheduled_requests"]["num_prefill_requests"])
    preempting = [r for r in recs if r["preempted"]]
    assert preempting, "the small pool should have preempted someone"
    assert sum(len(r["preempted"]) for r in recs) == sum(m[1]["stats"][4] for m in msgs)
    r = preempting[0]
    after = recs[recs.index(r) + 1] if r is not recs[-1] else r
    assert r["queued_requests"]["num_decode_requests"] >= 1 and r["queued_requests"]["sum_decode_kv_tokens"] > 0
    assert after["queued_requests"]["num_decode_requests"] >= 0
    assert recs[-1]["queued_requests"]["num_decode_requests"] == 0
    assert recs[-1]["queued_requests"]["num_prefill_requests"] == 0


def test_publishing_never_waits_for_a_subscriber_that_does_not_read(tmp_path):
    from labkit.serve.step_stream import Publisher

    ctx = zmq.Context()
    endpoint = f"ipc://{tmp_path}/s"
    pub = Publisher(ctx, [endpoint], hwm=10)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 10)
    sub.connect(endpoint)
    time.sleep(0.2)
    record = {"rows": {"request_id": ["x"] * 256, "new_tokens": [1] * 256}}
    t0 = time.perf_counter()
    for _ in range(20000):
        pub.publish(b"step", record)   # nobody reads: PUB drops past the high-water marks
    elapsed = time.perf_counter() - t0
    assert elapsed < 10, elapsed
    counters = []
    while sub.poll(100):
        counters.append(int.from_bytes(sub.recv_multipart()[1], "big"))
    assert 0 < len(counters) < 20000 and counters == sorted(counters)
    assert counters[-1] - counters[0] + 1 > len(counters)  # the subscriber can see what it missed
    sub.close(linger=0)
    pub.close()
    ctx.term()


def test_the_hub_drops_a_slow_subscriber_with_a_count_and_keeps_serving_the_others(tmp_path):
    import zmq.asyncio

    from labkit.serve.metrics import ServerMetrics
    from labkit.serve.step_stream import Publisher
    from labkit.serve.stream_hub import StreamHub

    async def main():
        actx = zmq.asyncio.Context()
        pctx = zmq.Context()
        endpoint = f"ipc://{tmp_path}/hub"
        pub = Publisher(pctx, [endpoint])
        metrics = ServerMetrics("m")
        hub = StreamHub(actx, endpoint, metrics, queue_size=4)
        slow = hub.subscribe(b"step")
        fast = hub.subscribe(b"step", queue_size=1000)
        # A SUB socket's subscription reaches the publisher some time after it connects (ZeroMQ's slow joiner:
        # 0.3 s was not enough on a loaded 2-core CI machine): step-0 records until the fast subscriber sees one.
        for _ in range(200):
            pub.publish(b"step", {"step": 0})
            try:
                await asyncio.wait_for(fast.get(), 0.05)
                break
            except asyncio.TimeoutError:
                pass
        for i in range(20):
            pub.publish(b"step", {"step": i + 1})
        got = []
        while len(got) < 20:
            rec = await asyncio.wait_for(fast.get(), 5)
            if rec["step"]:
                got.append(rec["step"])
        assert got == list(range(1, 21))
        assert slow.dropped and await slow.get() is None and hub.dropped_subscribers == 1
        assert metrics.stream_dropped._value.get() == 1
        assert slow not in hub.subs[b"step"] and fast in hub.subs[b"step"]
        hub.unsubscribe(fast)
        await hub.close()
        pub.close()
        pctx.term()
        actx.term()

    asyncio.run(main())


def test_summary_totals_are_the_registry_and_percentiles_follow_the_buckets():
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from labkit.serve.live_summary import LiveSummary, quantile
    from labkit.serve.metrics import ServerMetrics

    m = ServerMetrics("m")
    summary = LiveSummary(m.registry, window_s=10)
    m.prompt_tokens.inc(300)
    m.generation_tokens.inc(40)
    m.running.set(3)
    for v in (0.003,) * 90 + (0.3,) * 10:
        m.itl.observe(v)
    first = summary.snapshot(now=100.0)
    text = generate_latest(m.registry).decode()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert first["totals"]["prompt_tokens"] == values["labkit:prompt_tokens_total"] == 300
    assert first["totals"]["generation_tokens"] == 40 and first["running"] == 3
    assert 2.5 <= first["itl_ms"]["p50"] <= 5.0 and 200 <= first["itl_ms"]["p99"] <= 300
    # 20 s later, only what was observed in the last 10 s counts
    for t in range(101, 121):
        if t == 115:
            for _ in range(50):
                m.itl.observe(0.0012)
        last = summary.snapshot(now=float(t))
    assert last["itl_ms"]["count"] == 50 and last["itl_ms"]["p99"] <= 2.5
    assert quantile(0.5, []) is None and quantile(0.5, [(1.0, 0.0), (float("inf"), 0.0)]) is None
    assert quantile(0.5, [(1.0, 2.0), (2.0, 4.0), (float("inf"), 4.0)]) == 1.0
    assert quantile(0.75, [(1.0, 2.0), (2.0, 4.0), (float("inf"), 4.0)]) == 1.5


# --- the server, run as a user runs it --------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    from tests.test_serve import Server

    s = Server(tiny_model, tmp_path_factory.mktemp("steps"), "--step-stream", "--policy", "mixed",
               "--log-stats-interval", "0")
    yield s
    assert s.stop() == 0, s.log()


def _read_sse(resp, until, limit_s: float = 60.0) -> list[tuple[str, dict]]:
    from labkit.watch import sse_events

    out, end = [], time.monotonic() + limit_s
    for event, data in sse_events(resp.iter_lines()):
        out.append((event, json.loads(data)))
        if until(out) or time.monotonic() > end:
            break
    return out


def test_v1_steps_serves_every_step_of_a_request_and_summaries_that_are_the_metrics(server):
    import threading

    import httpx

    from tests.test_serve import _metrics, _value

    prompt = list(range(100, 400))
    with httpx.stream("GET", server.url + "/v1/steps", timeout=httpx.Timeout(10, read=60)) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        done = threading.Event()

        def send():
            r = server.post(json={"prompt": prompt, "max_tokens": 5, "ignore_eos": True, "request_id": "watched"})
            assert r.status_code == 200
            done.set()

        threading.Thread(target=send).start()
        events = _read_sse(resp, lambda ev: done.is_set() and sum(e == "summary" for e, _ in ev[-3:]) >= 2)
    steps = [r for e, r in events if e == "step"]
    mine = [(r["step"], dict(zip(r["rows"]["request_id"], r["rows"]["new_tokens"]))["watched"]) for r in steps
            if "watched" in r["rows"]["request_id"]]
    assert sum(k for _, k in mine) == len(prompt) + 4
    assert [n for n, _ in mine] == list(range(mine[0][0], mine[0][0] + len(mine)))
    summary = [r for e, r in events if e == "summary"][-1]
    metrics = _metrics(server)
    assert summary["totals"]["prompt_tokens"] == _value(metrics["labkit:prompt_tokens"], "_total")
    assert summary["totals"]["generation_tokens"] == _value(metrics["labkit:generation_tokens"], "_total")
    assert summary["totals"]["engine_steps"] == _value(metrics["labkit:engine_steps"], "_total")


def test_rows_can_be_left_out_and_the_stream_is_404_when_off(server, tiny_model, tmp_path):
    import httpx

    with httpx.stream("GET", server.url + "/v1/steps", params={"rows": "false"},
                      timeout=httpx.Timeout(10, read=30)) as resp:
        server.post(json={"prompt": [100, 101, 102], "max_tokens": 2})
        events = _read_sse(resp, lambda ev: any(e == "step" for e, _ in ev))
    step = next(r for e, r in events if e == "step")
    assert "rows" not in step and "scheduled_requests" in step
    page = httpx.get(server.url + "/live", timeout=10)
    assert page.status_code == 200 and "/v1/steps" in page.text and "://" not in page.text  # nothing from the network


def test_watch_shows_the_load_in_80_columns_and_its_json_is_the_stream(server):
    import subprocess
    import sys
    import threading

    from tests.test_cli_width import assert_fits

    stop = threading.Event()

    def load():  # a request after another, until both watches are done
        while not stop.is_set():
            server.post(json={"prompt": list(range(100, 300)), "max_tokens": 30, "ignore_eos": True})

    t = threading.Thread(target=load)
    t.start()
    env = {**__import__("os").environ, "COLUMNS": "80"}
    shown = subprocess.run([sys.executable, "-m", "labkit", "watch", server.url, "--seconds", "4"],
                           capture_output=True, text=True, timeout=60, env=env)
    as_json = subprocess.run([sys.executable, "-m", "labkit", "watch", server.url, "--seconds", "3", "--json"],
                             capture_output=True, text=True, timeout=60, env=env)
    stop.set()
    t.join()
    assert shown.returncode == 0, shown.stderr
    assert_fits(shown.stdout, ["steps / s", "prefill tok / step", "decode tok / step", "KV cache used",
                               "preemptions", "TTFT p50/p99 ms", "ITL p50/p99 ms"])
    assert as_json.returncode == 0, as_json.stderr
    view = json.loads(as_json.stdout[as_json.stdout.index("{"):])
    assert view["steps_seen"] > 0 and view["engine_steps"] > 0 and view["prompt_tokens"] > 0


def test_watch_without_a_step_stream_or_a_server_is_one_line_and_exit_2(tiny_model, tmp_path):
    import subprocess
    import sys

    from tests.test_serve import Server, _free_port

    for url in (f"http://127.0.0.1:{_free_port()}", "not-a-url"):
        res = subprocess.run([sys.executable, "-m", "labkit", "watch", url, "--seconds", "1"], capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 2 and "Traceback" not in res.stderr and res.stderr.strip(), res.stderr
    plain = Server(tiny_model, tmp_path, "--log-stats-interval", "0")
    try:
        res = subprocess.run([sys.executable, "-m", "labkit", "watch", plain.url, "--seconds", "1"],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and "--step-stream" in res.stderr, res.stderr
        assert __import__("httpx").get(plain.url + "/v1/steps", timeout=10).status_code == 404
    finally:
        assert plain.stop() == 0


def test_the_live_page_in_chromium_changes_under_load_and_matches_the_metrics(server, tmp_path):
    """The live page (/live) in headless Chromium (Debian's, driven by Playwright, as the report's browser test does):
    while a load runs its step figures move; once the load is over its totals are /metrics' values."""
    import threading

    from tests.test_report_browser import FLAGS, _chromium
    from tests.test_serve import _metrics, _value

    executable = _chromium()
    from playwright.sync_api import sync_playwright

    stop = threading.Event()

    def load():
        while not stop.is_set():
            server.post(json={"prompt": list(range(100, 260)), "max_tokens": 24, "ignore_eos": True})

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    ids = ("prompt-tokens", "generation-tokens", "engine-steps", "requests-finished", "preemptions", "running",
           "waiting")

    def values(page) -> dict:
        return page.evaluate("ids => Object.fromEntries(ids.map(i => [i, document.getElementById(i).dataset.value]))",
                             list(ids) + ["last-step", "steps-per-s"])

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=executable,
                                                       headless=True, args=FLAGS)
        try:
            page = context.new_page()
            page.goto(server.url + "/live", wait_until="load")
            page.wait_for_function("document.getElementById('engine-steps').dataset.value !== undefined "
                                   "&& document.getElementById('last-step').dataset.value !== undefined", timeout=30000)
            first = values(page)
            time.sleep(2.5)
            second = values(page)
            stop.set()
            for t in threads:
                t.join()
            deadline = time.monotonic() + 60
            while server.health()["live"] and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(2.5)      # a summary after the last step
            settled = values(page)
            metrics = _metrics(server)
            svg = page.evaluate("document.getElementById('line-decode').getAttribute('points')")
            offline = page.evaluate("Array.from(document.querySelectorAll('script[src],link[href]')).length")
        finally:
            stop.set()
            context.close()
    assert int(second["last-step"]) > int(first["last-step"]) and float(first["steps-per-s"]) > 0
    assert float(second["generation-tokens"]) > float(first["generation-tokens"])
    families = {"prompt-tokens": ("labkit:prompt_tokens", "_total"),
                "generation-tokens": ("labkit:generation_tokens", "_total"),
                "engine-steps": ("labkit:engine_steps", "_total"), "preemptions": ("labkit:num_preemptions", "_total"),
                "running": ("labkit:num_requests_running", ""), "waiting": ("labkit:num_requests_waiting", "")}
    for key, (fam, suffix) in families.items():
        assert float(settled[key]) == _value(metrics[fam], suffix), (key, settled[key])
    finished = sum(s.value for s in metrics["labkit:request_success"].samples if s.name.endswith("_total"))
    assert float(settled["requests-finished"]) == finished
    assert svg and len(svg.split()) >= 2 and offline == 0   # drawn in SVG; nothing loaded from anywhere
