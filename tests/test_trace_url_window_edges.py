"""`labkit trace --url` (labkit/trace/live.py) against a stand-in server: a window is recorded only whole (its
closing live_state came) and only of schema-v1 events; what came before a failure stays in the file."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from labkit.errors import LabkitError
from labkit.serve.live_trace import LiveTracer
from labkit.trace.live import record


class _Collect:
    def publish(self, topic, obj):
        pass


def _state(kind: str) -> dict:
    return LiveTracer(_Collect(), run="r").snapshot(kind)[-1]


@pytest.fixture
def server():
    """serve(lines) -> the URL of a server whose GET /v1/trace answers those JSON lines."""
    servers = []

    def serve(lines: list[dict]) -> str:
        body = "".join(json.dumps(x) + "\n" for x in lines).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield serve
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def test_a_whole_window_is_recorded_as_sent(server, tmp_path):
    out = tmp_path / "events.jsonl"
    sent = [_state("open"), _state("close")]
    assert record(server(sent), 0.1, out) == sent
    assert [json.loads(line) for line in out.read_text().splitlines()] == sent


def test_a_window_without_its_closing_state_is_refused(server, tmp_path):
    out = tmp_path / "events.jsonl"
    with pytest.raises(LabkitError, match="without its closing state"):
        record(server([_state("open")]), 0.1, out)
    assert len(out.read_text().splitlines()) == 1   # (what came is kept)


def test_an_event_that_is_not_schema_v1_is_refused(server, tmp_path):
    bad = {**_state("close"), "v": 2}
    with pytest.raises(LabkitError, match="not schema v1"):
        record(server([_state("open"), bad]), 0.1, tmp_path / "events.jsonl")
