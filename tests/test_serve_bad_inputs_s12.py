"""Bad requests to the endpoints of sessions 11-12 (/tokenize, /v1/steps, /v1/trace) on one running server: each
gets a 400 (404 where the feature is off) with a message naming the field, and the server keeps serving."""
from __future__ import annotations

import httpx
import pytest

from tests.test_serve import Server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    s = Server(tiny_model, tmp_path_factory.mktemp("bad-s12"), "--step-stream", "--log-stats-interval", "0")
    yield s
    assert s.stop() == 0, s.log()


def _error(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    message = r.json()["error"]["message"]
    for word in words:
        assert word in message, (word, message)


def test_tokenize_refuses_empty_messages_as_chat_does(server):
    # /tokenize answered 200 with the tokens of a bare generation prompt; /v1/chat/completions refuses the same
    _error(server.post("/tokenize", json={"messages": []}), 400, "messages")
    _error(server.post("/v1/chat/completions", json={"messages": [], "max_tokens": 1}), 400, "messages")


@pytest.mark.parametrize("body, words", [
    (b"{bad", ["body", "not valid JSON"]),
    (b"[1, 2]", ["body", "JSON object"]),
    (b"{}", ["prompt or messages"]),
    (b'{"prompt": 5}', ["prompt"]),
    (b'{"prompt": [1, 2]}', ["prompt"]),
    (b'{"prompt": "a", "messages": [{"role": "user", "content": "x"}]}', ["prompt or messages"]),
    (b'{"messages": "hi"}', ["messages"]),
    (b'{"messages": [{"role": 5, "content": "x"}]}', ["messages.0.role"]),
    (b'{"prompt": "a", "add_generation_prompt": "yes"}', ["add_generation_prompt"]),
    (b'{"prompt": "a", "foo": 1}', ["foo", "not supported"]),
    (b'{"prompt": "\\ud800"}', ["prompt", "surrogate"]),
])
def test_tokenize_bad_bodies_get_400(server, body, words):
    _error(server.post("/tokenize", content=body, headers={"content-type": "application/json"}), 400, *words)


@pytest.mark.parametrize("query", ["rows=maybe", "rows="])
def test_steps_bad_query_gets_400(server, query):
    with httpx.stream("GET", f"{server.url}/v1/steps?{query}", timeout=10) as r:
        r.read()
        _error(r, 400, "rows")


def test_trace_is_404_without_live_trace_and_the_server_keeps_serving(server):
    _error(httpx.get(server.url + "/v1/trace?seconds=1", timeout=10), 404, "--live-trace")
    r = server.post(json={"prompt": "hello", "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2
    assert server.health()["status"] == "ok"
