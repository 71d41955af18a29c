"""The CLI's shared pieces, in-process: the URLs commands take (labkit/options.py), `labkit watch` against a
stand-in step stream (an SSE server of a few lines, no engine), the tables fitted to a narrow terminal
(labkit/narrow.py), and `labkit bench load`'s own handling (the server it starts, its arrivals, its warm-up,
its prompts folded into the servers' vocabulary, its exit status) against tests/fake_sse_server.py."""
from __future__ import annotations

import http.server
import json
import threading
import time

import pytest
from rich.console import Console
from rich.table import Table

from labkit.errors import LabkitError

from .fake_sse_server import start_in_thread
from .helpers import run_cli

pytest.importorskip("httpx")


@pytest.fixture(autouse=True)
def _runs(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNS_DIR", str(tmp_path / "runs"))


# ------------------------------------------------------------------ URLs

def test_a_url_is_taken_with_https_and_without_its_trailing_slash():
    from labkit.options import check_url

    assert check_url("--url", "https://example.org:8443/") == "https://example.org:8443"
    assert check_url("--url", "http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert check_url("URL", "http://h") == "http://h"
    with pytest.raises(LabkitError, match="no host"):
        check_url("--url", "http://:80")


# ------------------------------------------------------------------ labkit watch against a stand-in step stream

def _sse(event: str, rec) -> bytes:
    return f"event: {event}\ndata: {json.dumps(rec)}\n\n".encode()


def _step(k: int, prefill_tokens: int, prefill: int, decode: int, preempted=(), waiting: int = 1) -> bytes:
    return _sse("step", {"step": k, "phase": "mixed", "num_running": prefill + decode, "num_waiting": waiting,
                         "kv_cache_usage": 0.5, "free_blocks": 30, "num_blocks": 64, "preempted": list(preempted),
                         "scheduled_requests": {"sum_prefill_tokens": prefill_tokens, "num_prefill_requests": prefill,
                                                "num_decode_requests": decode}})


SUMMARY = {"running": 3, "waiting": 7, "kv_cache_usage": 0.25, "window_s": 10,
           "totals": {"preemptions": 2, "prompt_tokens": 1000, "generation_tokens": 500, "requests_finished": 4,
                      "engine_steps": 99},
           "ttft_ms": {"p50": 12.0, "p99": 40.0}, "itl_ms": {"p50": 3.0, "p99": 9.5}}


class _Steps:
    """GET /v1/steps answers the next of `streams` (bytes, or a callable writing to the socket), then closes;
    once they are used up, 404."""

    def __init__(self, streams: list):
        self.streams, self.connections = list(streams), 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args):
                pass

            def do_GET(self):
                if not self.path.startswith("/v1/steps") or not owner.streams:
                    self.send_response(404)
                    self.end_headers()
                    return
                owner.connections += 1
                body = owner.streams.pop(0)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                try:
                    body(self.wfile) if callable(body) else self.wfile.write(body)
                    self.wfile.flush()
                except OSError:
                    pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def steps():
    made = []

    def make(*streams):
        made.append(_Steps(list(streams)))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_watch_json_is_the_streams_figures_and_a_closed_stream_ends_it_with_exit_0(steps, capsys):
    first = (b": a comment, then an empty event\n\n" + _sse("summary", SUMMARY)
             + _sse("dropped", {"dropped": 1}) + _step(99, 0, 0, 0))   # after a drop: read from a new connection
    second = _step(1, 100, 2, 1) + _step(2, 0, 0, 3, preempted=["a", "b"]) + _step(3, 50, 1, 2, preempted=["c"])
    server = steps(first, second)
    t0 = time.monotonic()
    rc, out, err = run_cli(["watch", server.url + "/", "--seconds", "20", "--json"], capsys)
    assert rc == 0, err
    assert time.monotonic() - t0 < 10          # the server closed the stream it was seen on: the watch ends
    view = json.loads(out)
    assert server.connections == 2 and view["dropped"] == 1
    assert view["steps_seen"] == 3 and view["step"] == 3 and view["preempted_seen"] == 3
    assert view["prefill_tokens_per_step"] == pytest.approx(150 / 3)
    assert view["decode_tokens_per_step"] == pytest.approx(6 / 3)
    assert view["batch_per_step"] == pytest.approx((3 + 3 + 3) / 3)
    # gauges and totals: the server's summary, not the last step's own
    assert (view["running"], view["waiting"], view["kv_cache_usage"]) == (3, 7, 0.25)
    assert (view["preemptions"], view["prompt_tokens"], view["engine_steps"]) == (2, 1000, 99)
    assert view["ttft_ms"] == {"p50": 12.0, "p99": 40.0} and view["free_blocks"] == 30


def test_watch_stops_after_its_seconds_while_steps_keep_coming(steps, capsys):
    def endless(wfile):   # a step every 20 ms for 6 s
        for k in range(300):
            wfile.write(_step(k, 0, 0, 1))
            wfile.flush()
            time.sleep(0.02)

    server = steps(endless)
    t0 = time.monotonic()
    rc, out, err = run_cli(["watch", server.url, "--seconds", "0.5", "--json"], capsys)
    assert rc == 0, err
    assert time.monotonic() - t0 < 4, "--seconds 0.5 ran on while the stream went on"
    assert json.loads(out)["steps_seen"] > 0


def test_watch_refuses_an_event_that_is_not_json(steps, capsys):
    rc, _, err = run_cli(["watch", steps(b"event: step\ndata: hello\n\n").url, "--seconds", "5"], capsys)
    assert rc == 2 and "not a JSON object" in err


def test_sse_events_join_data_lines_and_reset_between_events():
    from labkit.watch import sse_events

    lines = [": hello", "", "event: step", "data: {\"a\":", "data: 1}", "", "data:x", "", "event: summary", ""]
    assert list(sse_events(iter(lines))) == [("step", "{\"a\":\n1}"), ("message", "x")]


def test_the_view_counts_the_last_second_and_renders_percent_and_p50_before_p99():
    from labkit.watch import WatchState, render

    st = WatchState()
    for t in (0.0, 0.5, 1.2):
        st.on_step({"step": int(t * 10), "phase": "decode", "scheduled_requests": {
            "sum_prefill_tokens": 0, "num_prefill_requests": 0, "num_decode_requests": 2}}, now=t)
    st.on_summary(SUMMARY)
    v = st.view(1.6)
    assert v["steps_per_s"] == 1.0 and v["steps_seen"] == 3    # only the step of the last second
    console = Console(width=80, record=True, file=open("/dev/null", "w"))
    console.print(render("http://h:1", v))
    text = console.export_text()
    assert "25.0 %" in text and "12.0 / 40.0" in text and "3.0 / 9.5" in text, text


# ------------------------------------------------------------------ narrow.fit

def _shown(table: Table, width: int) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(table)
    return console.export_text()


def test_a_table_exactly_as_wide_as_the_terminal_fits_as_it_is():
    from labkit.narrow import fit

    def table():
        t = Table()
        t.add_column("name")
        t.add_column("value")
        t.add_row("throughput", "12,345.67")
        return t

    natural = max(len(line) for line in _shown(table(), 200).splitlines())
    t = table()
    assert fit(t, Console(width=natural, file=open("/dev/null", "w")))
    assert "throughput" in _shown(t, natural)
    assert not fit(table(), Console(width=natural - 3, file=open("/dev/null", "w")))


def test_fit_wraps_the_column_with_room_to_spare_and_keeps_a_long_word_whole():
    from labkit.narrow import fit

    long_word = "x" * 30
    t = Table(show_header=False)
    t.add_column()
    t.add_column()
    t.add_row(long_word, " ".join(["word"] * 8))     # 39 columns wide, but no word over 4
    assert fit(t, Console(width=60, file=open("/dev/null", "w")))
    shown = _shown(t, 60)
    assert long_word in shown and all(len(line) <= 60 for line in shown.splitlines()), shown


# ------------------------------------------------------------------ help_layout: two columns, or stacked

def test_an_options_panel_stacks_the_help_under_its_flags_when_the_help_would_get_under_32_columns():
    from rich.text import Text

    from labkit.help_layout import options_panel

    names = Text("--a-rather-long-option-name-here " + "N" * 7)        # 40 columns of flags
    help_text = "Tokens per step, the step's budget, in short words only."

    def shown(width: int) -> list[str]:
        console = Console(width=width, record=True, file=open("/dev/null", "w"))
        console.print(options_panel("Engine", [(names, Text(help_text))], console))
        return console.export_text().splitlines()

    wide = shown(80)        # 76 inside the panel: 34 left for the help, beside the flags
    assert any(names.plain in line and "Tokens per step" in line for line in wide), wide
    narrow = shown(70)      # 24 left: the help goes on lines of its own, indented under the flags
    assert not any(names.plain in line and "Tokens" in line for line in narrow), narrow
    assert any(line.strip("│ ").startswith("Tokens per step") for line in narrow), narrow


# ------------------------------------------------------------------ bench load's own handling

FAKE_HEALTH = {"status": "ok", "model_name": "fake", "device": "cpu", "device_name": None, "vocab_size": 1000}


def _recording_prompts(fake) -> list:
    prompts: list = []
    complete = fake._complete

    async def record(req, writer):
        prompts.append(req.get("prompt"))
        await complete(req, writer)

    fake._complete = record
    return prompts


def test_bench_load_started_server_gets_room_for_every_request_and_the_flags(tiny_model, tmp_path, capsys,
                                                                            monkeypatch):
    from labkit.bench import load as L

    started = []

    class FakeSpawned:
        def __init__(self, args, log_path, timeout):
            started.append(args)
            self.fake = start_in_thread()
            self.url = self.fake.url

        def close(self):
            pass

    monkeypatch.setattr(L, "SpawnedServer", FakeSpawned)
    out = tmp_path / "started.json"
    code, stdout, err = run_cli(["bench", "load", "--model", tiny_model, "--device", "cpu", "--num-requests", "3",
                                 "--max-num-seqs", "4", "--no-warmup", "--out", out], capsys)
    assert code == 0, err + stdout
    args = started[0]
    assert args[args.index("--max-queue") + 1] == "256" and args.count("--device") == 1
    assert args[args.index("--max-num-seqs") + 1] == "4"
    r = json.loads(out.read_text())
    assert r["config"]["server"] == {"started": True, "--model": tiny_model, "--device": "cpu",
                                     "--max-num-seqs": 4}
    assert r["config"]["source"]["rate"] == "inf" and r["metrics"]["completed"] == 3


def test_bench_load_names_its_file_by_the_rate_and_takes_a_url_with_a_slash(tmp_path, capsys):
    fake = start_in_thread()
    code, stdout, err = run_cli(["bench", "load", "--url", fake.url + "/", "--rate", "4", "--num-requests", "2",
                                 "--no-warmup"], capsys)
    assert code == 0, err + stdout
    files = sorted(p.name for p in (tmp_path / "runs").glob("bench-load-*.json"))
    assert files and all(f.startswith("bench-load-fixed-4") and not f.startswith("bench-load-fixed-4.0")
                         for f in files), files
    r = json.loads((tmp_path / "runs" / files[0]).read_text())
    assert r["config"]["server"]["url"] == fake.url and r["metrics"]["completed"] == 2


def test_bench_load_num_requests_keeps_the_first_arrivals_of_a_file(tmp_path, capsys):
    fake = start_in_thread()
    arr = tmp_path / "three.jsonl"
    arr.write_text("".join(json.dumps({"t": i * 0.01, "prompt_len": 5, "max_tokens": 2}) + "\n" for i in range(3)))
    out = tmp_path / "two.json"
    code, stdout, err = run_cli(["bench", "load", "--arrivals", arr, "--num-requests", "2", "--url", fake.url,
                                 "--no-warmup", "--out", out], capsys)
    assert code == 0, err + stdout
    assert json.loads(out.read_text())["metrics"]["requests"] == 2 and fake.completions == 2


def test_bench_load_warms_every_endpoint_and_folds_prompts_into_the_smallest_vocabulary(tmp_path, capsys):
    a = start_in_thread(health=FAKE_HEALTH)
    b = start_in_thread(health={**FAKE_HEALTH, "vocab_size": 500})
    seen_a, seen_b = _recording_prompts(a), _recording_prompts(b)
    out = tmp_path / "fold.json"
    code, stdout, err = run_cli(["bench", "load", "--endpoints", f"{a.url},{b.url}", "--allow-mixed",
                                 "--num-requests", "1", "--out", out], capsys)
    assert code == 0, err + stdout
    # one request: its warm-up draw holds one prompt, yet each endpoint gets a warm-up request
    assert (a.completions, b.completions) == (2, 1)
    prompts = [p for p in seen_a + seen_b if isinstance(p, list)]
    assert len(prompts) == 3 and max(max(p) for p in prompts) < 500
    assert json.loads(out.read_text())["config"]["prompt_ids_folded"] is True


class _Failing:
    """A server whose /health is fine and whose every completion is an HTTP 500."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, body: bytes):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send(200, json.dumps(FAKE_HEALTH).encode()) if self.path == "/health" else self._send(404, b"")

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._send(500, b'{"error": {"message": "broken"}}')

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_bench_load_with_failing_requests_exits_1_and_a_failing_warm_up_exits_2(tmp_path, capsys):
    bad = _Failing()
    try:
        out = tmp_path / "failed.json"
        code, stdout, err = run_cli(["bench", "load", "--url", bad.url, "--num-requests", "2", "--no-warmup",
                                     "--out", out], capsys)
        assert code == 1, err + stdout
        r = json.loads(out.read_text())
        assert r["status"] == "failed_requests" and r["metrics"]["failed"] == 2
        assert "2 of 2 requests failed" in stdout
        code, stdout, err = run_cli(["bench", "load", "--url", bad.url, "--num-requests", "2"], capsys)
        assert code == 2 and "every warm-up request failed" in err, err + stdout
    finally:
        bad.httpd.shutdown()
        bad.httpd.server_close()


def test_bench_load_refuses_zero_requests_from_an_arrivals_file(tmp_path, capsys):
    fake = start_in_thread()
    arr = tmp_path / "one.jsonl"
    arr.write_text(json.dumps({"t": 0, "prompt_len": 5, "max_tokens": 2}) + "\n")
    code, stdout, err = run_cli(["bench", "load", "--arrivals", arr, "--num-requests", "0", "--url", fake.url,
                                 "--no-warmup", "--out", tmp_path / "zero.json"], capsys)
    assert code == 2 and "--num-requests" in err, err + stdout
    assert not (tmp_path / "zero.json").exists()


def test_sse_events_drop_one_space_after_the_colon_not_all():
    from labkit.watch import sse_events

    # The SSE spec removes a single leading space: the rest is the data (a token that starts with spaces).
    lines = ["data:   two spaces kept", "", "data: one", "data:none", ""]
    assert list(sse_events(iter(lines))) == [("message", "  two spaces kept"), ("message", "one\nnone")]
