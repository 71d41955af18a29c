"""The HTTP face (labkit/serve/http.py) in-process: the FastAPI app of `labkit serve` over the real EngineClient and
a real EngineCore stepping the tiny model in the same event loop (no processes, no sockets), spoken to through
httpx's ASGI transport. What a client sees: status codes and error types at the limits, the SSE stream's last
chunks and usage, /health when the server drains, /v1/models, /tokenize and the request counter in /metrics."""
from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("zmq")
pytest.importorskip("msgpack")
httpx = pytest.importorskip("httpx")
prometheus_parser = pytest.importorskip("prometheus_client.parser")

from engine import LLM  # noqa: E402
from engine.request_limits import RequestLimits  # noqa: E402
from labkit.engine_args import EngineArgs  # noqa: E402
from labkit.serve.engine_client import EngineClient  # noqa: E402
from labkit.serve.http import ServeSettings, build_app  # noqa: E402
from labkit.serve.metrics import ServerMetrics  # noqa: E402

ENGINE = dict(device="cpu", enforce_eager=True, max_model_len=256, max_num_batched_tokens=256, max_num_seqs=8)
MODEL = "tiny"


class InProcessEngine(EngineClient):
    """EngineClient whose core is an EngineCore in this process: each message it would send over the socket goes
    to `core.handle`, and a task steps the core while it has work, handing every message back as the reader
    would."""

    def __init__(self, llm, tokenizer, metrics: ServerMetrics | None = None):
        from labkit.serve.core import EngineCore

        super().__init__(MODEL, EngineArgs(), metrics=metrics or ServerMetrics(MODEL))
        self.core = EngineCore(llm)
        self.info = self.core.info()
        self.limits = RequestLimits(**self.info["limits"])
        self.stats["free_blocks"] = self.stats["num_blocks"] = self.info["num_blocks"]
        self.tokenizer = tokenizer
        self._driver = None
        self.alive = True

    @property
    def healthy(self) -> bool:
        return self.alive and self.dead is None

    def _deliver(self, msg) -> None:
        kind = msg[0]
        {"step": self._on_step, "stats": self._on_stats, "rejected": self._on_rejected,
         "failed": self._on_failed}[kind](*msg[1:])

    async def _send(self, msg, timeout_s: float = 5.0) -> None:
        for out in self.core.handle(msg):
            self._deliver(out)
        if self._driver is None or self._driver.done():
            self._driver = asyncio.ensure_future(self._drive())

    async def _drive(self) -> None:
        await asyncio.sleep(0)
        while self.core.has_work:
            for out in self.core.step():
                self._deliver(out)
            await asyncio.sleep(0)


@pytest.fixture(scope="module")
def llm(tiny_model):
    engine = LLM(tiny_model, **ENGINE)
    yield engine
    engine.exit()


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from engine.tokenizer import Tokenizer

    return Tokenizer(tiny_model)


@pytest.fixture()
def engine(llm, tokenizer):
    eng = InProcessEngine(llm, tokenizer)
    yield eng
    assert not eng.core.live  # every request left the engine


def call(engine, method: str, path: str, settings: ServeSettings | None = None, **kw) -> httpx.Response:
    """One request to a fresh app over `engine`; the response read to its end."""
    app = build_app(engine, settings or ServeSettings(MODEL))

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            resp = await client.request(method, path, **kw)
        if engine._driver is not None:
            await engine._driver
        return resp

    return asyncio.run(go())


def sse(resp: httpx.Response) -> list:
    """The data of each event: a dict, or the string "[DONE]"."""
    out = []
    for block in resp.text.split("\n\n"):
        if block.startswith("data: "):
            payload = block[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def http_count(engine, endpoint: str, status: str) -> float:
    from prometheus_client import generate_latest

    text = generate_latest(engine.metrics.registry).decode()
    return sum(s.value for f in prometheus_parser.text_string_to_metric_families(text) for s in f.samples
               if s.name == "labkit:http_requests_total" and s.labels.get("endpoint") == endpoint
               and s.labels.get("status") == status)


GEN = {"temperature": 0, "ignore_eos": True}


# --- bodies at --max-body-bytes ------------------------------------------------------------------------------
def _body_of(size: int) -> bytes:
    """A valid completion body of exactly `size` bytes (the prompt's id list padded with spaces)."""
    body = json.dumps({"model": MODEL, "prompt": [100, 101, 102], "max_tokens": 2, **GEN}).encode()
    assert len(body) <= size
    return body[:-1] + b" " * (size - len(body)) + b"}"


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_of_exactly_the_limit_is_served_and_one_byte_more_is_a_400(engine, chunked):
    """--max-body-bytes is the largest body accepted: a body of that many bytes is served, one byte more is refused,
    whether the client declares its length (Content-Length) or streams it (chunked: counted as it arrives)."""
    limit = 300
    settings = ServeSettings(MODEL, max_body_bytes=limit)

    def post(size):
        raw = _body_of(size)
        if chunked:
            async def gen():
                yield raw[:10]
                yield raw[10:]
            content = gen()
        else:
            content = raw
        return call(engine, "POST", "/v1/completions", settings, content=content,
                    headers={"content-type": "application/json"})

    ok = post(limit)
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] == 2
    over = post(limit + 1)
    assert over.status_code == 400
    assert over.json()["error"]["type"] == "invalid_request_error"
    assert "--max-body-bytes" in over.json()["error"]["message"]


# --- the stream's end and usage --------------------------------------------------------------------------------
def test_a_stream_without_include_usage_has_no_usage_chunk(engine):
    """OpenAI: the usage chunk (empty choices) comes only with stream_options.include_usage true."""
    base = {"model": MODEL, "prompt": [100, 101, 102], "max_tokens": 3, "stream": True, **GEN}
    for options, want_usage in (({"include_usage": False}, False), (None, False), ({"include_usage": True}, True)):
        body = {**base, **({"stream_options": options} if options is not None else {})}
        r = call(engine, "POST", "/v1/completions", json=body)
        assert r.status_code == 200, r.text
        events = sse(r)
        assert events[-1] == "[DONE]"
        usage = [e for e in events[:-1] if e.get("usage")]
        if want_usage:
            assert len(usage) == 1 and usage[0]["choices"] == []
            assert usage[0]["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
        else:
            assert usage == [], options


def test_every_token_id_is_streamed_even_before_its_text_is_whole(engine):
    """return_token_ids: the stream carries every generated id exactly once (in order), also those whose text is
    still half a character and so not shown yet; the ids equal the non-streamed answer's."""
    body = {"model": MODEL, "prompt": [100, 101, 102, 103], "max_tokens": 40, "return_token_ids": True, **GEN}
    whole = call(engine, "POST", "/v1/completions", json=body).json()
    ids = whole["choices"][0]["token_ids"]
    assert len(ids) == 40
    events = sse(call(engine, "POST", "/v1/completions", json={**body, "stream": True}))
    streamed = [t for e in events[:-1] for c in e["choices"] for t in c.get("token_ids", [])]
    assert streamed == ids
    text = "".join(c["text"] for e in events[:-1] for c in e["choices"])
    assert text == whole["choices"][0]["text"]


def test_the_last_chat_chunk_carries_the_finish_reason_and_no_empty_content(engine, tokenizer):
    """A chat stream: a first chunk with the role, content deltas, and a last chunk with the finish reason whose
    delta has no content when nothing was held back (OpenAI's last chunk: `delta: {}`)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "stream": True,
            "return_token_ids": True, **GEN}
    # A token whose text is whole on its own: nothing is held back for the last chunk.
    events = sse(call(engine, "POST", "/v1/chat/completions", json=body))
    assert events[-1] == "[DONE]"
    chunks = [e["choices"][0] for e in events[:-1]]
    assert chunks[0]["delta"] == {"role": "assistant", "content": ""}
    last = chunks[-1]
    assert last["finish_reason"] == "length"
    (tok,) = [t for c in chunks for t in c.get("token_ids", [])]
    if tokenizer.decode([tok]) and "\ufffd" not in tokenizer.decode([tok]):
        assert "content" not in last["delta"], last


# --- /health, /v1/models, /tokenize ------------------------------------------------------------------------------
def test_health_while_draining_is_503_with_retry_after_and_dead_is_503_without(engine):
    ok = call(engine, "GET", "/health")
    assert ok.status_code == 200 and ok.json()["status"] == "ok"
    engine.draining = True
    r = call(engine, "GET", "/health")
    assert r.status_code == 503
    assert r.json()["status"] == "unhealthy" and r.json()["healthy"] is False
    assert r.headers.get("retry-after") == str(EngineClient.RETRY_AFTER_S)  # waiting helps: a new server comes
    engine.draining = False
    engine.dead = "the engine core exited with code 1"
    r = call(engine, "GET", "/health")
    assert r.status_code == 503 and r.json()["error"] == engine.dead
    assert "retry-after" not in r.headers  # dead: waiting does not help
    engine.dead = None


def test_models_lists_the_served_model_with_its_max_model_len(engine):
    r = call(engine, "GET", "/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    assert [(m["id"], m["object"], m["max_model_len"]) for m in body["data"]] == [(MODEL, "model", 256)]


def test_tokenize_counts_the_ids_it_returns(engine, tokenizer):
    text = "The quick brown fox"
    r = call(engine, "POST", "/tokenize", json={"prompt": text})
    assert r.status_code == 200, r.text
    ids = tokenizer.encode(text)
    assert r.json() == {"count": len(ids), "max_model_len": 256, "tokens": ids}


def test_an_unknown_route_is_a_404_not_found_error(engine):
    r = call(engine, "GET", "/v1/nothing-here")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"


# --- the request counter ------------------------------------------------------------------------------------
def test_models_requests_are_counted_with_their_status(engine):
    assert http_count(engine, "/v1/models", "200") == 0
    call(engine, "GET", "/v1/models")
    call(engine, "GET", "/v1/models")
    assert http_count(engine, "/v1/models", "200") == 2


def test_a_client_gone_before_any_answer_is_counted_499(engine):
    """A request whose client left before a response started is counted with nginx's 499, not as a 500."""
    from labkit.serve.http import CountRequests

    async def app(scope, receive, send):   # a route that never answers: the client went away meanwhile
        return None

    mw = CountRequests(app, engine.metrics)

    async def noop(*_a):
        return None

    asyncio.run(mw({"type": "http", "path": "/v1/completions"}, noop, noop))
    assert http_count(engine, "/v1/completions", "499") == 1
    assert http_count(engine, "/v1/completions", "500") == 0


def test_metrics_under_vllm_names_name_every_sample_so(llm, tokenizer):
    """--metric-names both: /metrics has each family twice, and the second copy is vLLM's: the family AND its
    samples named vllm:..., with the same values (a scraper reads sample names)."""
    engine = InProcessEngine(llm, tokenizer, metrics=ServerMetrics(MODEL, vllm_names=True))
    r = call(engine, "POST", "/v1/completions", json={"model": MODEL, "prompt": [100, 101, 102], "max_tokens": 4,
                                                       **GEN})
    assert r.status_code == 200
    text = call(engine, "GET", "/metrics").text
    samples = {s.name: s.value for f in prometheus_parser.text_string_to_metric_families(text) for s in f.samples
               if s.labels.get("model_name") == MODEL and not s.labels.get("finished_reason")}
    assert samples["labkit:generation_tokens_total"] == 4
    assert samples["vllm:generation_tokens_total"] == 4
    assert samples["vllm:prompt_tokens_total"] == samples["labkit:prompt_tokens_total"] == 3
    vllm_lines = [x for x in text.splitlines() if x.startswith("vllm:")]
    labkit_lines = [x for x in text.splitlines() if x.startswith("labkit:")]
    assert len(vllm_lines) == len(labkit_lines) > 0
