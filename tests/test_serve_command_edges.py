"""`labkit serve`'s option handling, in-process and without an engine: what the command hands the server (name,
queue, streams, timeouts), how it reads the server's exit status, which endpoints and log levels it takes, and
the socket it listens on. The server itself (labkit.serve.server.serve_async) is replaced by a recorder; the
tests that start real servers are tests/test_serve.py's."""
from __future__ import annotations

import socket

import pytest

from labkit.errors import LabkitError

from .helpers import run_cli

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("zmq")

# An address no interface here has (TEST-NET-1): a serve that got past its checks fails to listen, never loading
# its model or serving (as in tests/test_bad_inputs_s12.py).
NO_LISTEN = ["--host", "192.0.2.1", "--allow-remote", "--port", "8000"]


class _Recorder:
    """Stands in for serve_async: records what the command passed, says ready, returns `code`."""

    def __init__(self, code: int = 0):
        self.code, self.calls = code, []

    async def __call__(self, model, engine_args, settings, **kw):
        self.calls.append({"model": model, "engine_args": engine_args, "settings": settings, **kw})
        kw["on_ready"](type("E", (), {"info": {"device": "cpu"}})())
        return self.code


@pytest.fixture()
def serve_with(monkeypatch, tiny_model, capsys):
    """Run `labkit serve --model tiny --device cpu ARGS` on a free loopback port with a recorded server."""
    import labkit.serve.server as server_mod

    monkeypatch.setattr(server_mod, "setup_logging", lambda: None)

    def run(*args, code: int = 0):
        rec = _Recorder(code)
        monkeypatch.setattr(server_mod, "serve_async", rec)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        rc, out, err = run_cli(["serve", "--model", tiny_model, "--device", "cpu", "--port", str(port), *args],
                               capsys)
        return rc, err, (rec.calls[0] if rec.calls else None)

    return run


def test_the_server_gets_the_name_queue_and_timeouts_asked_for(serve_with, tiny_model):
    rc, err, call = serve_with()
    assert rc == 0, err
    s = call["settings"]
    assert s.model_name == "tiny" and call["max_queue"] == 256        # the folder's name; the documented queue
    assert call["step_stream"] is None and call["kv_events"] is None and call["trace_path"] is None
    assert "model 'tiny' on cpu" in err and "ready at http://127.0.0.1:" in err
    rc, err, call = serve_with("--served-model-name", "qwen-small", "--max-queue", "3", "--body-timeout", "5",
                               "--header-timeout", "7", "--drain-timeout", "2")
    assert rc == 0, err
    s = call["settings"]
    assert s.model_name == "qwen-small" and "model 'qwen-small'" in err
    assert (call["max_queue"], s.body_timeout_s, s.header_timeout_s, call["drain_s"]) == (3, 5.0, 7.0, 2.0)


def test_step_stream_zmq_alone_turns_the_step_stream_on(serve_with):
    rc, err, call = serve_with("--step-stream-zmq", "tcp://127.0.0.1:*")   # any free port: accepted
    assert rc == 0, err
    assert call["step_stream"] == ["tcp://127.0.0.1:*"]
    rc, err, call = serve_with("--step-stream")
    assert rc == 0 and call["step_stream"] == []
    rc, err, call = serve_with("--kv-events", "ipc:///tmp/kv", "--kv-events-topic", "kv")
    assert rc == 0 and (call["kv_events"], call["kv_events_topic"]) == ("ipc:///tmp/kv", "kv")


def test_the_servers_exit_status_is_the_commands(serve_with):
    rc, err, _ = serve_with(code=2)
    assert rc == 2 and "could not start" in err and "Traceback" not in err
    rc, err, _ = serve_with(code=1)
    assert rc == 1 and "engine died" in err and "Traceback" not in err


@pytest.mark.parametrize("args", [["--log-level", "INFO"], ["--log-level", "Warning"], ["--live-trace"],
                                  ["--kv-events", "tcp://127.0.0.1:*"]])
def test_accepted_options_get_as_far_as_listening(args, tiny_model, capsys):
    rc, _, err = run_cli(["serve", "--model", tiny_model, "--device", "cpu", *NO_LISTEN, *args], capsys)
    assert rc == 2 and "cannot listen on 192.0.2.1:8000" in err, err


def test_live_trace_with_trace_is_refused(tiny_model, tmp_path, capsys):
    rc, _, err = run_cli(["serve", "--model", tiny_model, "--device", "cpu", *NO_LISTEN, "--live-trace",
                          "--trace", str(tmp_path / "t.jsonl")], capsys)
    assert rc == 2 and "--live-trace and --trace" in err, err


def test_listen_socket_takes_an_ipv6_host_and_refuses_a_taken_port():
    from labkit.serve.command import listen_socket

    if socket.has_ipv6:
        try:
            probe = socket.socket(socket.AF_INET6)
            probe.bind(("::1", 0))
            probe.close()
        except OSError:
            probe = None
        if probe is not None:
            with listen_socket("::1", 0) as sock:
                assert sock.family == socket.AF_INET6
    with listen_socket("127.0.0.1", 0) as held:
        port = held.getsockname()[1]
        assert not held.get_inheritable()   # the engine core and its workers do not hold the port open
        with pytest.raises(LabkitError) as refused:
            listen_socket("127.0.0.1", port)
    assert refused.value.code == 2 and f"cannot listen on 127.0.0.1:{port}" in str(refused.value)
