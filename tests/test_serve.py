"""`labkit serve` on the CPU with the tiny model: the worker (admission between steps, per-token events,
cancel, overload, engine failure), the OpenAI-shaped HTTP app served by a real uvicorn in a thread (so
streaming and disconnects are real), tensor parallel 2, and `labkit serve` + `labkit serve client` as
processes."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

from engine import LLM, SamplingParams  # noqa: E402
from labkit.serve.http import create_app  # noqa: E402
from labkit.serve.worker import EngineWorker, Overloaded  # noqa: E402

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[1]
ENGINE = dict(device="cpu", enforce_eager=True, max_model_len=512, max_num_batched_tokens=512, max_num_seqs=16,
              kvcache_block_size=16, num_kvcache_blocks=64)
MAX_QUEUE = 6
PROMPT = "The quick brown fox"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond, timeout=10.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class _Server:
    """uvicorn serving create_app(worker) in a thread of this process."""

    def __init__(self, worker: EngineWorker, name: str = "tiny"):
        import uvicorn

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(worker, name)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        _wait(lambda: self.server.started, 20, "uvicorn to start")

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def worker(tiny_model):
    w = EngineWorker(tiny_model, max_queue=MAX_QUEUE, **ENGINE).start()
    yield w
    w.close()


@pytest.fixture(scope="module")
def server(worker):
    s = _Server(worker)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reference(tiny_model):
    llm = LLM(tiny_model, **ENGINE)
    yield llm
    llm.exit()


@pytest.fixture(autouse=True)
def _unpaused(request):
    yield
    if "worker" in request.fixturenames:
        request.getfixturevalue("worker").resume()


def _sse(lines) -> list:
    out = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def _idle(worker):
    s = worker.stats()
    return s["live"] == 0 and s["pending"] == 0 and s["free_blocks"] == s["total_blocks"] and s["running"] == 0 \
        and s["waiting"] == 0


# --- completions ----------------------------------------------------------------------------------
def test_completion_matches_generate(server, worker, reference):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "text_completion" and data["model"] == "tiny" and data["id"]
    choice = data["choices"][0]
    want = reference.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)[0]
    assert choice["token_ids"] == want["token_ids"]
    assert choice["text"] == reference.tokenizer.decode(want["token_ids"], skip_special_tokens=True)
    assert choice["finish_reason"] == "length"
    n_prompt = len(reference.tokenizer.encode(PROMPT))
    assert data["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 12, "total_tokens": n_prompt + 12}
    # Token ids as the prompt give the same answer.
    r2 = httpx.post(server.url + "/v1/completions", timeout=30, json={**body, "prompt": reference.tokenizer.encode(PROMPT)})
    assert r2.json()["choices"][0]["token_ids"] == want["token_ids"]
    _wait(lambda: _idle(worker), what="the engine to drain")


def test_stream_arrives_token_by_token(server, worker):
    body = {"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True,
            "return_token_ids": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        first = None
        for line in lines:
            if line.startswith("data: "):
                first = json.loads(line[6:])
                break
        # The first token is here while the request is still generating: hold the engine and look.
        worker.pause()
        time.sleep(0.05)
        assert worker.stats()["live"] == 1, "the whole completion was produced before the first chunk arrived"
        worker.resume()
        chunks = [first] + _sse(lines)
    assert chunks[-1] == "[DONE]"
    usage = chunks[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 200
    token_chunks = [c for c in chunks[:-2] if c["choices"][0]["token_ids"]]
    assert len(token_chunks) == 200 and all(len(c["choices"][0]["token_ids"]) == 1 for c in token_chunks)
    assert chunks[-3]["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["text"] for c in chunks[:-2])
    ids = [t for c in token_chunks for t in c["choices"][0]["token_ids"]]
    # Same text as decoding the whole completion at once.
    assert text == worker.tokenizer.decode(ids, skip_special_tokens=True)
    r = httpx.post(server.url + "/v1/completions", timeout=30, json={**body, "stream": False})
    assert r.json()["choices"][0]["token_ids"] == ids


def test_chat_uses_the_template(server, worker, reference):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                   json={"messages": messages, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                         "return_token_ids": True})
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "chat.completion"
    tok = reference.tokenizer
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    prompt_ids = tok.encode(text, add_special_tokens=False)
    assert data["usage"]["prompt_tokens"] == len(prompt_ids)
    want = reference.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)[0]
    msg = data["choices"][0]["message"]
    assert msg["role"] == "assistant" and data["choices"][0]["token_ids"] == want["token_ids"]
    assert msg["content"] == tok.decode(want["token_ids"], skip_special_tokens=True)
    # Streaming chat: a role delta first, content deltas, then [DONE].
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=30,
                      json={"messages": messages, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                            "stream": True}) as s:
        chunks = _sse(s.iter_lines())
    assert chunks[-1] == "[DONE]" and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks[:-1])
    assert "".join(c["choices"][0]["delta"].get("content", "") or "" for c in chunks[:-1]) == msg["content"]


def test_concurrent_requests_are_batched(server, worker):
    prompts = [f"{PROMPT} number {i}" for i in range(5)]
    before = worker.num_steps

    async def go():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            worker.pause()  # all five reach the worker before any step runs
            tasks = [asyncio.ensure_future(c.post("/v1/completions", json={
                "prompt": p, "max_tokens": 8, "temperature": 0, "ignore_eos": True})) for p in prompts]
            await asyncio.to_thread(_wait, lambda: worker.num_queued() == 5, 10, "5 queued requests")
            worker.resume()
            return await asyncio.gather(*tasks)

    responses = asyncio.run(go())
    assert [r.status_code for r in responses] == [200] * 5
    assert all(r.json()["usage"]["completion_tokens"] == 8 for r in responses)
    steps = list(worker.step_log)[-(worker.num_steps - before):]
    assert max(s["batch"] for s in steps) == 5
    assert any(s["phase"] == "decode" and s["batch"] == 5 for s in steps)
    _wait(lambda: _idle(worker), what="the engine to drain")


# --- cancel -----------------------------------------------------------------------------------------
def test_disconnect_mid_stream_cancels(server, worker):
    body = {"prompt": PROMPT, "max_tokens": 480, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        got = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                got += 1
                if got == 2:
                    break
        assert worker.stats()["live"] == 1
    # The client is gone: the request leaves the scheduler and its KV blocks come back.
    _wait(lambda: _idle(worker), 15, "the aborted request to leave the engine")
    sched = worker.llm.scheduler
    assert not sched.waiting and not sched.running
    assert sched.block_manager.num_free_blocks == worker.total_blocks
    metrics = httpx.get(server.url + "/metrics").text
    assert 'labkit_request_finished_total{finish_reason="abort"}' in metrics


def test_worker_cancel_running_and_waiting(worker):
    async def go():
        running = worker.submit(list(range(100, 140)), SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
        assert (await running.next_event()).type == "admitted"
        ev = await running.next_event()
        assert ev.type == "tokens"
        worker.pause()
        waiting = worker.submit([5, 6, 7], SamplingParams(max_tokens=4))
        await asyncio.to_thread(_wait, lambda: worker.num_queued() == 1, 5, "the waiting request")
        worker.cancel(waiting.request_id)
        worker.cancel(running.request_id)
        evs = [e async for e in waiting]
        assert [e.type for e in evs] == ["finished"] and evs[0].finish_reason == "abort"
        rest = [e async for e in running]
        worker.resume()
        return rest

    rest = asyncio.run(go())
    assert rest[-1].type == "finished" and rest[-1].finish_reason == "abort"
    assert sum(len(e.token_ids) for e in rest) + 1 < 400
    _wait(lambda: _idle(worker), what="the engine to drain")
    assert worker.llm.scheduler.block_manager.num_free_blocks == worker.total_blocks


# --- overload and bad input -----------------------------------------------------------------------
def test_overload_answers_503(server, worker):
    async def go():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            worker.pause()
            tasks = [asyncio.ensure_future(c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}))
                     for _ in range(MAX_QUEUE)]
            await asyncio.to_thread(_wait, lambda: worker.num_queued() == MAX_QUEUE, 10, "a full queue")
            over = await c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
            worker.resume()
            return over, await asyncio.gather(*tasks)

    over, ok = asyncio.run(go())
    assert over.status_code == 503
    assert over.json()["error"]["type"] == "overloaded_error" and "max-queue" in over.json()["error"]["message"]
    assert [r.status_code for r in ok] == [200] * MAX_QUEUE
    with pytest.raises(Overloaded):
        async def direct():
            worker.pause()
            try:
                for _ in range(MAX_QUEUE + 1):
                    worker.submit([1, 2, 3], SamplingParams(max_tokens=1))
            finally:
                worker.resume()
        asyncio.run(direct())
    _wait(lambda: _idle(worker), what="the engine to drain")


@pytest.mark.parametrize("body, needle", [
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": list(range(100, 700))}, "max_model_len"),
    ({"prompt": "hi", "n": 2}, "n"),
    ({"prompt": "hi", "temperature": -1}, "temperature"),
    ({"prompt": [10 ** 9]}, "token id"),
    ({"max_tokens": 3}, "prompt"),
])
def test_bad_input_400(server, body, needle):
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and needle in err["message"]


def test_bad_requests_other(server):
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": []}, timeout=30)
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "model": "other"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    models = httpx.get(server.url + "/v1/models").json()
    assert models["data"][0]["id"] == "tiny"


def test_health_and_metrics(server, worker):
    r = httpx.get(server.url + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    httpx.post(server.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "ignore_eos": True}, timeout=30)
    text = httpx.get(server.url + "/metrics").text
    for name in ("labkit_requests_total", "labkit_requests_in_flight", "labkit_time_to_first_token_seconds_bucket",
                 "labkit_inter_token_latency_seconds_bucket", "labkit_generation_tokens_total",
                 "labkit_kv_free_blocks"):
        assert name in text, name
    assert 'labkit_requests_total{endpoint="/v1/completions",status="200"}' in text
    assert "labkit_requests_in_flight 0.0" in text


# --- engine failure -------------------------------------------------------------------------------
def test_engine_failure_fails_in_flight_and_reports_unhealthy(tiny_model):
    from fastapi.testclient import TestClient

    w = EngineWorker(tiny_model, **ENGINE).start()
    try:
        with TestClient(create_app(w, "tiny")) as c:
            assert c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200

            def boom(*a, **k):
                raise RuntimeError("injected device failure")

            w.llm.step = boom
            r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert r.status_code == 500 and "injected device failure" in r.json()["error"]["message"]
            h = c.get("/health")
            assert h.status_code == 503 and "injected" in h.json()["error"]
            r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert r.status_code == 503
    finally:
        w.close()


# --- tensor parallel ------------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_serve_tp2(tiny_model, reference):
    from fastapi.testclient import TestClient

    w = EngineWorker(tiny_model, **{**ENGINE, "tensor_parallel_size": 2}).start()
    try:
        with TestClient(create_app(w, "tiny")) as c:
            r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0,
                                                "ignore_eos": True, "return_token_ids": True})
            assert r.status_code == 200, r.text
    finally:
        w.close()
    want = reference.generate([PROMPT], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)[0]
    assert r.json()["choices"][0]["token_ids"] == want["token_ids"]


# --- the commands as processes --------------------------------------------------------------------
def test_serve_and_client_processes(tiny_model, tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    labkit = [sys.executable, "-m", "labkit"]
    log = open(tmp_path / "server.log", "w")
    trace = tmp_path / "engine.jsonl"
    proc = subprocess.Popen(labkit + ["serve", "--model", tiny_model, "--device", "cpu", "--port", str(port),
                                      "--max-model-len", "512", "--eager", "--log-level", "warning",
                                      "--trace", str(trace)],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < end, "server did not become healthy"
            time.sleep(0.2)
        out = tmp_path / "client.jsonl"
        res = subprocess.run(labkit + ["serve", "client", "--url", url, "--prompt", "Hello", "--max-tokens", "8",
                                       "--ignore-eos", "--stream", "--out", str(out)],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert "finish_reason=length" in res.stderr and "tokens=8" in res.stderr
        events = [json.loads(line) for line in out.read_text().splitlines()]
        tokens = [e for e in events if e["event"] == "token"]
        assert len(tokens) == 8 and tokens[0]["ttft_ms"] > 0 and all("itl_ms" in e for e in tokens[1:])
        assert events[-1]["event"] == "finished" and events[-1]["usage"]["completion_tokens"] == 8
        assert all(e["v"] == 1 and e["observer"] == "client" for e in events)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0 or proc.returncode in (0, 130)
        # The engine's own log of the same request: schema v1, and every invariant holds.
        from labkit.trace.events import read_jsonl
        from labkit.trace.validate import validate

        engine_events = read_jsonl(trace)
        assert {"run_start", "request_added", "scheduled", "after_postprocess", "run_end"} <= {
            e["event"] for e in engine_events}
        assert validate(engine_events).ok
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
    # A server that is not there: exit 2 with one line.
    res = subprocess.run(labkit + ["serve", "client", "--url", url, "--prompt", "x"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "cannot reach" in res.stderr


def test_serve_refuses_remote_host():
    from labkit.serve.command import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    res = subprocess.run([sys.executable, "-m", "labkit", "serve", "--host", "0.0.0.0"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--allow-remote" in res.stderr


def _aborts(server) -> float:
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith('labkit_request_finished_total{finish_reason="abort"}'):
            return float(line.split()[-1])
    return 0.0


def test_non_stream_disconnect_cancels(server, worker):
    aborts = _aborts(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", timeout=httpx.Timeout(0.3, connect=5),
                   json={"prompt": PROMPT, "max_tokens": 490, "temperature": 0, "ignore_eos": True})
    _wait(lambda: _idle(worker), 15, "the abandoned request to leave the engine")
    assert worker.llm.scheduler.block_manager.num_free_blocks == worker.total_blocks
    assert not getattr(worker.llm, "_seqs", {})  # the worker forgets finished sequences
    assert _aborts(server) == aborts + 1
    assert worker.step_log[-1]["t_ns"] - worker.step_log[0]["t_ns"] > 0
