"""`labkit serve` on the CPU with the tiny model, run as a user runs it (a process): the OpenAI-shaped API,
streaming, validation at the API boundary (every bad input a 400 and the server carries on), overload,
disconnects, metrics, graceful shutdown on SIGTERM/SIGINT, a dead engine core or TP worker; plus the
engine core's loop driven in-process."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("zmq")
pytest.importorskip("msgpack")
prometheus_parser = pytest.importorskip("prometheus_client.parser")
httpx = pytest.importorskip("httpx")

from engine import LLM, SamplingParams  # noqa: E402

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[1]
ENGINE_FLAGS = ["--device", "cpu", "--eager", "--max-model-len", "1024", "--budget", "1024", "--max-num-seqs", "16"]
ENGINE = dict(device="cpu", enforce_eager=True, max_model_len=1024, max_num_batched_tokens=1024, max_num_seqs=16)
PROMPT = "The quick brown fox"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond, timeout=60.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _spawned(pid: int) -> list[int]:
    """Children started by multiprocessing's spawn (not its resource tracker)."""
    out = []
    for child in _children(pid):
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(child)
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


class Server:
    """`labkit serve` as a child process on a free port, with its log in tmp_path."""

    def __init__(self, model: str, tmp_path: Path, *extra: str):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"server-{self.port}.log"
        self._log = open(self.log_path, "w")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "labkit", "serve", "--model", model, "--port",
                                      str(self.port), "--log-level", "warning", *ENGINE_FLAGS, *extra],
                                     cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 240
        while True:
            assert self.proc.poll() is None, self.log()
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < end, "the server did not become healthy:\n" + self.log()
            time.sleep(0.2)
        self.core_pid = _spawned(self.proc.pid)[0]

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def post(self, path: str = "/v1/completions", **kw):
        kw.setdefault("timeout", 120)
        return httpx.post(self.url + path, **kw)

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def stop(self, sig=signal.SIGTERM, timeout=60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise AssertionError("the server did not exit after " + signal.Signals(sig).name + ":\n" + self.log())
        self._log.close()
        return self.proc.returncode


def _sse(lines) -> list:
    out = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def _idle(server: Server) -> bool:
    h = server.health()
    return h["live"] == 0 and h["running"] == 0 and h["waiting"] == 0 and h["free_blocks"] == h["num_blocks"]


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    s = Server(tiny_model, tmp_path_factory.mktemp("serve"), "--max-body-bytes", "65536")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def reference(tiny_model):
    llm = LLM(tiny_model, **ENGINE)
    yield llm
    llm.exit()


# --- the API ---------------------------------------------------------------------------------------
def test_completion_matches_generate(server, reference):
    body = {"model": Path(server.health()["model"]["path"]).name, "prompt": PROMPT, "max_tokens": 12,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    r = server.post(json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    want = reference.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                              use_tqdm=False)[0]
    choice = data["choices"][0]
    assert choice["token_ids"] == want["token_ids"] and choice["finish_reason"] == "length"
    assert choice["text"] == reference.tokenizer.decode(want["token_ids"], skip_special_tokens=True)
    assert data["usage"]["completion_tokens"] == 12 and data["object"] == "text_completion"


def test_stream_delivers_every_token_then_usage_and_done(server, reference):
    body = {"prompt": PROMPT, "max_tokens": 20, "temperature": 0, "ignore_eos": True, "stream": True,
            "return_token_ids": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        events = _sse(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    want = reference.generate([PROMPT], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                              use_tqdm=False)[0]
    assert ids == want["token_ids"] and chunks[-1]["choices"][0]["finish_reason"] == "length"
    # Incremental detokenisation gives the same text as decoding the whole output at once.
    assert "".join(c["choices"][0]["text"] for c in chunks) == want["text"]
    assert usage["usage"]["completion_tokens"] == 20 and usage["choices"] == []


def test_chat_uses_the_template(server, reference):
    msgs = [{"role": "user", "content": "Hello there"}]
    r = server.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 5, "temperature": 0,
                                                  "ignore_eos": True, "return_token_ids": True})
    assert r.status_code == 200, r.text
    tok = reference.tokenizer
    prompt = tok.encode(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                        add_special_tokens=False)
    want = reference.generate([prompt], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
                              use_tqdm=False)[0]
    assert r.json()["choices"][0]["token_ids"] == want["token_ids"]
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


def test_concurrent_requests_share_steps(server):
    import concurrent.futures

    body = {"prompt": PROMPT, "max_tokens": 40, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        codes = [f.result().status_code for f in [pool.submit(server.post, json=body) for _ in range(6)]]
    assert codes == [200] * 6
    assert server.health()["max_batch"] > 1


BAD = [
    ({"prompt": "hi", "max_tokens": 2, "top_k": 1180591620717411303424}, "top_k"),
    ({"prompt": "hi", "max_tokens": 100000}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": [1, 2, 10 ** 9], "max_tokens": 2}, "prompt"),
    ({"prompt": [], "max_tokens": 2}, "prompt"),
    ({"prompt": "", "max_tokens": 2}, "prompt"),
    ({"prompt": "hi", "top_p": 0}, "top_p"),
    ({"prompt": "hi", "temperature": -1}, "temperature"),
    ({"prompt": "hi", "n": 2}, "n"),
    ({"prompt": "hi", "stop": ["x"]}, "stop"),
    ({"prompt": "hi", "logprobs": 3}, "logprobs"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"max_tokens": 2}, "prompt"),
]


@pytest.mark.parametrize("body, field", BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD)])
def test_bad_input_is_a_400_naming_the_field(server, body, field):
    r = server.post(json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == 400
    assert err["message"].startswith(field) and err["param"] == field


@pytest.mark.parametrize("raw, field", [
    ('{"prompt": "hi", "max_tokens": 2, "temperature": NaN}', "temperature"),
    ('{"prompt": "hi", "max_tokens": 2, "temperature": Infinity}', "temperature"),
    ('{"prompt": "hi", "max_tokens": 2, "top_p": NaN}', "top_p"),
    ('{"prompt": "\\ud800abc", "max_tokens": 2}', "prompt"),  # a lone surrogate, as JSON escapes it
    ('{"prompt": "hi", ', "body"),
    ("[1, 2]", "body"),
    ("[" * 100000 + "]" * 100000, "body"),
    ("\xff\xfe", "body"),
])
def test_bad_raw_bodies_are_400(server, raw, field):
    r = server.post(content=raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw,
                    headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith(field)


def test_chat_with_unencodable_text_is_a_400(server):
    raw = b'{"messages": [{"role": "user", "content": "\\ud800x"}]}'
    r = server.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.content"


def test_a_body_over_the_limit_is_refused_before_it_is_read(server):
    big = json.dumps({"prompt": "a" * 70000, "max_tokens": 2})
    r = server.post(content=big, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "--max-body-bytes" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: the server counts as it reads
        for _ in range(20):
            yield b"x" * 8192

    r = server.post(content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 400 and "--max-body-bytes" in r.json()["error"]["message"]


def test_other_model_is_404(server):
    r = server.post(json={"model": "gpt-4", "prompt": "hi"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_the_server_carries_on_after_every_bad_request(server):
    # Runs after the bad-input tests above (file order): the engine is alive and answers correctly.
    assert server.health()["status"] == "ok"
    r = server.post(json={"prompt": "hi", "max_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert "Traceback" not in server.log()


def test_disconnect_mid_stream_cancels_in_the_engine(server):
    body = {"prompt": PROMPT, "max_tokens": 900, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: "):
                got += 1
                if got == 3:
                    break
    _wait(lambda: _idle(server), 60, "the abandoned stream to leave the engine")


def test_non_stream_disconnect_cancels_in_the_engine(server):
    with pytest.raises(httpx.ReadTimeout):
        server.post(json={"prompt": PROMPT, "max_tokens": 900, "ignore_eos": True},
                    timeout=httpx.Timeout(0.5, connect=10))
    _wait(lambda: _idle(server), 60, "the abandoned request to leave the engine")


def _metrics(server) -> dict:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return {f.name: f for f in prometheus_parser.text_string_to_metric_families(text)}


def _value(family, suffix="", **labels) -> float:
    for s in family.samples:
        if s.name == family.name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(family.name + suffix)


def test_metrics_families_parse_and_count(server):
    long_prompt = list(range(100, 700))  # 600 tokens: two full 256-token blocks can be reused
    body = {"prompt": long_prompt, "max_tokens": 4, "ignore_eos": True}
    before = _metrics(server)
    assert server.post(json=body).status_code == 200
    assert server.post(json=body).status_code == 200
    after = _metrics(server)
    name = Path(server.health()["model"]["path"]).name
    families = {"labkit:num_requests_running": "gauge", "labkit:num_requests_waiting": "gauge",
                "labkit:kv_cache_usage_perc": "gauge", "labkit:prefix_cache_queries": "counter",
                "labkit:prefix_cache_hits": "counter", "labkit:num_preemptions": "counter",
                "labkit:prompt_tokens": "counter", "labkit:generation_tokens": "counter",
                "labkit:engine_steps": "counter", "labkit:time_to_first_token_seconds": "histogram",
                "labkit:inter_token_latency_seconds": "histogram", "labkit:e2e_request_latency_seconds": "histogram",
                "labkit:request_queue_time_seconds": "histogram", "labkit:request_success": "counter",
                "labkit:async_scheduled_steps": "counter", "labkit:async_wasted_rows": "counter"}
    for fam, kind in families.items():
        assert fam in after and after[fam].type == kind, fam
        assert all(s.labels.get("model_name") == name for s in after[fam].samples), fam

    def delta(fam, suffix="_total"):
        return _value(after[fam], suffix) - _value(before[fam], suffix)

    assert delta("labkit:prompt_tokens") == 1200 and delta("labkit:generation_tokens") == 8
    # Each request: a prefill, then 3 decode steps, each launched ahead while the step before it ran.
    def kept(snapshot):
        family = snapshot.get("labkit:async_scheduled_steps")
        try:
            return _value(family, "_total")
        except (KeyError, AttributeError):
            return 0.0  # no step launched ahead yet: a labelled counter has no sample until its first inc
    assert kept(after) - kept(before) == 6
    assert delta("labkit:prefix_cache_queries") == 1200 and delta("labkit:prefix_cache_hits") == 512
    assert delta("labkit:time_to_first_token_seconds", "_count") == 2
    assert delta("labkit:inter_token_latency_seconds", "_count") == 6
    assert delta("labkit:e2e_request_latency_seconds", "_count") == 2
    assert delta("labkit:request_queue_time_seconds", "_count") == 2
    assert _value(after["labkit:kv_cache_usage_perc"]) == 0.0 and _value(after["labkit:num_requests_running"]) == 0


# --- overload --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_overload_is_503_with_retry_after(tiny_model, tmp_path):
    # A budget of 4 tokens a step: a 1000-token prompt waits 250 steps for its first token, so it stays
    # queued while the next request arrives and is refused.
    s = Server(tiny_model, tmp_path, "--max-queue", "1", "--budget", "4")
    try:
        slow = {"prompt": [100 + i % 1900 for i in range(1000)], "max_tokens": 2, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=slow, timeout=300) as first:
            assert first.status_code == 200
            _wait(lambda: s.health()["queued"] == 1, 30, "the first request to queue")
            r = s.post(json={"prompt": "hi", "max_tokens": 2})
            assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error"
            assert r.headers["retry-after"] == "1"
            events = _sse(first.iter_lines())
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    finally:
        assert s.stop() == 0, s.log()


# --- shutdown and failures ----------------------------------------------------------------------------
def _open_streams(s: Server, n: int, max_tokens: int = 900):
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    client = httpx.Client(timeout=120)
    streams = []
    for _ in range(n):
        resp = client.send(client.build_request("POST", s.url + "/v1/completions", json=body), stream=True)
        lines = resp.iter_lines()
        assert next(lines).startswith("data: ")
        streams.append((resp, lines))
    return client, streams


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_streams_ends_each_with_an_error_and_done_then_exits_0(tiny_model, tmp_path, sig):
    s = Server(tiny_model, tmp_path, "--drain-timeout", "1")
    core = s.core_pid
    client, streams = _open_streams(s, 3)
    s.proc.send_signal(sig)
    for resp, lines in streams:
        events = _sse(lines)
        assert events[-1] == "[DONE]" and "error" in events[-2], events[-3:]
        assert "shutting down" in events[-2]["error"]["message"]
        resp.close()
    client.close()
    assert s.stop(sig) == 0, s.log()
    log = s.log()
    assert "Traceback" not in log and "CancelledError" not in log and "cancelled 3 request(s)" in log
    assert not _alive(core)
    assert not list(Path(tempfile.gettempdir()).glob(f"labkit-serve-{s.proc.pid}-*"))  # its socket folder is gone


@pytest.mark.slow
def test_sigterm_drain_lets_short_requests_finish(tiny_model, tmp_path):
    s = Server(tiny_model, tmp_path, "--drain-timeout", "60")
    client, streams = _open_streams(s, 2, max_tokens=30)
    s.proc.send_signal(signal.SIGTERM)
    _wait(lambda: httpx.get(s.url + "/health", timeout=5).status_code == 503, 30, "/health to say 503")
    r = s.post(json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    for resp, lines in streams:
        events = _sse(lines)
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
        resp.close()
    client.close()
    assert s.stop() == 0, s.log()


@pytest.mark.slow
def test_a_dead_engine_core_fails_streams_and_the_server_exits_1(tiny_model, tmp_path):
    s = Server(tiny_model, tmp_path)
    client, streams = _open_streams(s, 1)
    os.kill(s.core_pid, signal.SIGKILL)
    events = _sse(streams[0][1])
    assert events[-1] == "[DONE]" and "engine core exited with code -9" in events[-2]["error"]["message"]
    client.close()
    s.proc.wait(60)
    assert s.proc.returncode == 1 and "engine core exited with code -9" in s.log()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_tp2_serve_matches_tp1_and_cleans_up_on_sigterm(tiny_model, tmp_path, reference):
    s = Server(tiny_model, tmp_path, "--tp", "2")
    core = s.core_pid
    workers = _spawned(core)
    shm = [p.name for p in Path("/dev/shm").glob("labkit-*")]
    r = s.post(json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                     "return_token_ids": True})
    assert r.status_code == 200, r.text
    want = reference.generate([PROMPT], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                              use_tqdm=False)[0]
    assert r.json()["choices"][0]["token_ids"] == want["token_ids"]
    assert s.stop() == 0, s.log()
    assert not _alive(core) and workers and not any(_alive(p) for p in workers)
    assert not [n for n in shm if (Path("/dev/shm") / n).exists() and str(core) in n]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_dead_tp_worker_makes_the_server_log_why_and_exit_1(tiny_model, tmp_path):
    s = Server(tiny_model, tmp_path, "--tp", "2")
    worker = _spawned(s.core_pid)[0]
    client, streams = _open_streams(s, 1)
    os.kill(worker, signal.SIGKILL)
    events = _sse(streams[0][1])
    assert events[-1] == "[DONE]" and "error" in events[-2]
    client.close()
    s.proc.wait(120)
    assert s.proc.returncode == 1
    assert "tensor parallel worker rank 1 died" in s.log()


# --- the commands as processes ------------------------------------------------------------------------
@pytest.mark.slow
def test_serve_client_and_trace(tiny_model, tmp_path):
    trace = tmp_path / "engine.jsonl"
    s = Server(tiny_model, tmp_path, "--trace", str(trace))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    labkit = [sys.executable, "-m", "labkit"]
    try:
        out = tmp_path / "client.jsonl"
        res = subprocess.run(labkit + ["serve", "client", "--url", s.url, "--prompt", "Hello", "--max-tokens", "8",
                                       "--ignore-eos", "--stream", "--out", str(out)],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert "finish_reason=length" in res.stderr and "tokens=8" in res.stderr
        events = [json.loads(line) for line in out.read_text().splitlines()]
        assert events[-1]["event"] == "finished" and events[-1]["usage"]["completion_tokens"] == 8
    finally:
        assert s.stop(signal.SIGINT) == 0, s.log()
    from labkit.trace.events import read_jsonl
    from labkit.trace.validate import validate

    engine_events = read_jsonl(trace)
    assert {"run_start", "request_added", "scheduled", "after_postprocess", "run_end"} <= {
        e["event"] for e in engine_events}
    assert validate(engine_events).ok
    res = subprocess.run(labkit + ["serve", "client", "--url", s.url, "--prompt", "x"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "cannot reach" in res.stderr


@pytest.mark.slow
def test_serve_refuses_remote_host_and_bad_engine_arguments(tiny_model):
    from labkit.serve.command import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    res = subprocess.run([sys.executable, "-m", "labkit", "serve", "--host", "0.0.0.0"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--allow-remote" in res.stderr
    res = subprocess.run([sys.executable, "-m", "labkit", "serve", "--model", tiny_model, "--device", "cpu",
                          "--port", str(_free_port()), "--tp", "3"],
                         cwd=REPO, capture_output=True, text=True, timeout=240)
    assert res.returncode == 2 and "tensor_parallel_size" in res.stderr and "Traceback" not in res.stderr


# --- the engine core's loop, in-process ------------------------------------------------------------
@pytest.fixture()
def core(tiny_model):
    from labkit.serve.core import EngineCore

    llm = LLM(tiny_model, **{**ENGINE, "max_model_len": 256})
    yield EngineCore(llm)
    llm.exit()


def _run(core) -> list:
    out = []
    while core.has_work:
        out += core.step()
    return out


def test_core_streams_each_request_its_tokens_once_per_step(core):
    sp = {"temperature": 0, "max_tokens": 3, "ignore_eos": True, "top_k": -1, "top_p": 1.0}
    assert core.handle(["add", "a", [100, 101, 102], sp]) == []
    assert core.handle(["add", "b", [200, 201], sp]) == []
    msgs = _run(core)
    assert all(m[0] == "step" for m in msgs)
    rows = [row for m in msgs for row in m[1]["out"]]
    for rid in ("a", "b"):
        mine = [r for r in rows if r[0] == rid]
        assert len(mine) == 3 and [r[2] for r in mine] == [None, None, "length"]
    assert sorted(r for m in msgs for r, _ in m[1]["queued"]) == ["a", "b"]
    assert not core.live and not core.llm._seqs  # finished requests are forgotten


def test_core_reports_steps_launched_ahead_and_wasted_rows(core):
    """Async scheduling in the server: each step message says how many steps were launched while the one before
    ran, and how many rows were wasted, since the last. A request arriving while a step runs joins a later step
    and wastes nothing; an abort wastes the row its request had in the step already launched."""
    sp = {"temperature": 0, "max_tokens": 6, "ignore_eos": True, "top_k": -1, "top_p": 1.0}
    core.handle(["add", "a", [100, 101, 102], sp])
    msgs = core.step() + core.step() + core.step()  # prefill, then decode steps launched ahead
    core.handle(["add", "b", [200, 201], sp])       # arrives while the next decode step runs
    msgs += _run(core)
    ahead = [m[1]["ahead"] for m in msgs]
    launched, wasted = sum(a for a, _ in ahead), sum(w for _, w in ahead)
    assert wasted == 0 and launched == core.llm.async_stats["launched_ahead"] >= 5
    assert [m[1]["phase"] for m in msgs].count("prefill") == 2
    core.handle(["add", "c", [300, 301], {**sp, "max_tokens": 20}])
    msgs = core.step() + core.step()
    core.handle(["abort", ["c"]])                    # its next row is already on the device
    msgs += _run(core)
    assert sum(m[1]["ahead"][1] for m in msgs) == 1


def test_core_rejects_one_request_and_keeps_the_rest(core):
    sp = {"temperature": 0, "max_tokens": 2, "ignore_eos": True, "top_k": -1, "top_p": 1.0}
    core.handle(["add", "ok", [100, 101], sp])
    assert core.handle(["add", "ok", [100, 101], sp])[0][:2] == ["rejected", "ok"]
    bad = core.handle(["add", "bad", [100], {**sp, "top_k": 10 ** 30}])
    assert bad[0][:2] == ["rejected", "bad"] and bad[0][2].startswith("top_k")
    bad = core.handle(["add", "bad2", [100], {**sp, "temperature": float("nan")}])
    assert bad[0][:2] == ["rejected", "bad2"]
    assert len([r for m in _run(core) for r in m[1]["out"] if r[0] == "ok"]) == 2


def test_core_survives_a_step_that_raises(core, monkeypatch):
    runner = core.llm.model_runner
    execute = runner.execute  # the engine's path to the runner in one process
    calls = {"n": 0}

    def fails_once(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OverflowError("planted")
        return execute(*a, **k)

    monkeypatch.setattr(runner, "execute", fails_once)
    sp = {"temperature": 0, "max_tokens": 2, "ignore_eos": True, "top_k": -1, "top_p": 1.0}
    core.handle(["add", "x", [100, 101], sp])
    failed = core.step()
    assert failed[0][0] == "failed" and failed[0][1] == ["x"] and "planted" in failed[0][2]
    assert not core.has_work and not core.live
    core.handle(["add", "y", [100, 101], sp])
    assert len([r for m in _run(core) for r in m[1]["out"]]) == 2


def test_core_abort_frees_the_blocks(core):
    sp = {"temperature": 0, "max_tokens": 50, "ignore_eos": True, "top_k": -1, "top_p": 1.0}
    core.handle(["add", "long", list(range(100, 300)), sp])
    core.step()
    assert core.llm.stats()["free_blocks"] < core.llm.stats()["num_blocks"]
    core.handle(["abort", ["long"]])
    assert core.llm.stats()["free_blocks"] == core.llm.stats()["num_blocks"]  # at once
    # A step launched before the abort still commits (async scheduling); its row for "long" is dropped.
    assert not [row for m in _run(core) for row in m[1]["out"]] and not core.has_work
    core.handle(["stop"])
    assert core.stopping


def test_incremental_detokenizer_matches_a_full_decode(reference):
    from labkit.serve.detokenize import IncrementalDetokenizer

    tok = reference.tokenizer
    import random

    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 40))]
        detok = IncrementalDetokenizer(tok)
        text = "".join(detok.add(ids[i:i + 3]) for i in range(0, len(ids), 3))
        full = tok.decode(ids, skip_special_tokens=True)
        assert full.startswith(text) and full[len(text):].strip("\ufffd") == ""


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def _client_nobody_reads(tmp_path):
    """An EngineClient whose core socket has no reader (the core closed it, or is gone)."""
    import zmq.asyncio

    from labkit.serve.engine_client import EngineClient
    from labkit.serve.metrics import ServerMetrics

    client = EngineClient("unused", {}, metrics=ServerMetrics("m"))
    client._ctx = zmq.asyncio.Context()
    client._push = client._ctx.socket(zmq.PUSH)
    client._push.setsockopt(zmq.LINGER, 0)
    client._push.bind(f"ipc://{tmp_path}/in")  # nobody connects
    client._pack = lambda msg: json.dumps(msg).encode()
    return client


def test_stopping_a_core_that_no_longer_reads_does_not_hang(tmp_path):
    """The core may close its socket and still be alive (its last message lingering) when the frontend stops
    it, as after a refused engine argument: a PUSH send with no reader waits forever, so the stop must not."""
    import asyncio
    import multiprocessing

    client = _client_nobody_reads(tmp_path)
    client._proc = multiprocessing.get_context("spawn").Process(target=_sleep, args=(600,))
    client._proc.start()

    async def stop() -> None:
        await asyncio.wait_for(client._stop_core(timeout_s=1.0), 60)

    try:
        asyncio.run(stop())
        assert not client._proc.is_alive()
    finally:
        if client._proc.is_alive():
            client._proc.kill()
        client._close_sockets()


def test_a_request_the_core_never_takes_is_a_503_not_a_hang(tmp_path):
    import asyncio

    from labkit.serve.protocol import APIError

    client = _client_nobody_reads(tmp_path)

    async def submit():
        return await asyncio.wait_for(client.submit("r1", [1, 2, 3], {"max_tokens": 2}), 60)

    try:
        with pytest.raises(APIError) as err:
            asyncio.run(submit())
        assert err.value.status == 503 and "not running" in str(err.value)
        assert client.num_live == 0 and client.num_waiting == 0  # nothing left counted against --max-queue
    finally:
        client._close_sockets()
