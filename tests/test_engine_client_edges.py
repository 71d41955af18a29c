"""The frontend's books (labkit/serve/engine_client.py) and the server's run (labkit/serve/server.py) at their
edges, in-process with no engine core: an EngineClient whose core is a list of the messages sent to it. What a
caller sees: --max-queue exactly, a request id in flight twice, a late abort of an ended request, the queue count
as requests get tokens and end, the step and KV figures /health and /metrics give, the heartbeat at its bound, a
drain that ends what is left in the core too; and the server's second signal, header deadline, stats line and
exit status when the engine dies."""
from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time

import pytest

from labkit.engine_args import EngineArgs
from labkit.serve.engine_client import EngineClient
from labkit.serve.metrics import ServerMetrics
from labkit.serve.protocol import APIError

from .test_serve import _FakeCore

pytest.importorskip("zmq")


def _client(max_queue: int = 256, **kw) -> tuple[EngineClient, list]:
    sent: list = []
    client = EngineClient("m", EngineArgs(), metrics=ServerMetrics("m"), max_queue=max_queue, **kw)

    async def send(msg, timeout_s: float = 5.0) -> None:
        sent.append(msg)

    client._send = send
    return client, sent


def _step(out=(), batch: int = 1, wall_s: float = 0.01, stats=(0, 1, 10, 10, 0, 0, 0)) -> dict:
    return {"n": 1, "phase": "decode", "batch": batch, "tokens": batch, "wall_s": wall_s, "out": list(out),
            "queued": [], "stats": list(stats)}


def _sample(client: EngineClient, name: str, **labels) -> float | None:
    return client.metrics.registry.get_sample_value(name, {"model_name": "m", **labels})


def test_max_queue_admits_exactly_that_many_waiting_and_a_first_token_frees_a_place():
    client, _ = _client(max_queue=2)

    async def go():
        await client.submit("a", [1, 2], {})
        await client.submit("b", [1, 2], {})
        with pytest.raises(APIError) as err:
            await client.submit("c", [1, 2], {})
        client._on_step(_step([("a", 7, None)]))
        await client.submit("c", [1, 2], {})      # a has its first token: it waits no more
        return err.value

    err = asyncio.run(go())
    assert err.status == 503 and err.type == "overloaded_error" and "--max-queue 2" in err.message
    assert err.headers == {"Retry-After": str(EngineClient.RETRY_AFTER_S)}
    assert client.num_live == 3 and client.num_waiting == 2


def test_a_request_id_already_in_flight_is_a_400():
    client, sent = _client()

    async def go():
        await client.submit("r1", [1], {})
        with pytest.raises(APIError) as err:
            await client.submit("r1", [2], {})
        return err.value

    err = asyncio.run(go())
    assert err.status == 400 and "'r1' is already in flight" in err.message
    assert [m[:2] for m in sent] == [["add", "r1"]]


def test_a_late_abort_never_touches_a_newer_request_with_the_same_id():
    client, sent = _client()

    async def go():
        old = await client.submit("r1", [1], {})
        client._on_step(_step([("r1", 5, "length")]))
        new = await client.submit("r1", [1], {})
        client.abort(old)                            # the client of the first one goes away after its end
        await asyncio.sleep(0)
        assert not new.closed and client.num_live == 1 and ["abort", ["r1"]] not in sent
        client.abort(new)
        await asyncio.sleep(0)
        return old, new

    old, new = asyncio.run(go())
    assert old.reason == "length" and new.closed and new.reason == "abort" and client.num_live == 0
    assert sent[-1] == ["abort", ["r1"]]
    assert _sample(client, "labkit:request_success_total", finished_reason="abort") == 1
    assert _sample(client, "labkit:request_success_total", finished_reason="length") == 1


def test_the_queue_counts_only_requests_without_a_first_token_as_they_end():
    client, _ = _client()

    async def go():
        a = await client.submit("a", [1], {})
        await client.submit("b", [1], {})
        assert client.num_waiting == 2
        client._on_step(_step([("a", 5, None)]))
        assert client.num_waiting == 1
        client._on_step(_step([("a", 6, "length")]))
        assert client.num_waiting == 1 and client.num_live == 1       # b still waits for its first token
        client._on_step(_step([("b", 9, "stop")]))
        return a

    a = asyncio.run(go())
    assert client.num_waiting == 0 and client.num_live == 0 and a.num_out == 2


def test_steps_add_their_time_and_keep_the_largest_batch():
    client, _ = _client()
    for batch, wall_s in ((3, 0.5), (5, 0.25), (1, 0.125)):
        client._on_step(_step(batch=batch, wall_s=wall_s))
    assert client.stats["max_batch"] == 5 and client.stats["steps"] == 3
    assert client.stats["step_seconds"] == pytest.approx(0.875)


def test_engine_stats_reach_health_and_metrics_with_their_counts():
    client, _ = _client()
    client._on_stats([2, 3, 75, 100, 4, 200, 50])    # waiting, running, free, total, preempted, queries, hits
    client._on_stats([0, 1, 90, 100, 1, 10, 0])
    assert {k: client.stats[k] for k in ("waiting", "running", "free_blocks", "num_blocks")} == \
        {"waiting": 0, "running": 1, "free_blocks": 90, "num_blocks": 100}
    assert _sample(client, "labkit:kv_cache_usage_perc") == pytest.approx(0.10)
    assert _sample(client, "labkit:num_preemptions_total") == 5
    assert client.totals["prefix_queries"] == 210 and client.totals["prefix_hits"] == 50
    assert _sample(client, "labkit:prefix_cache_hits_total") == 50


def test_a_core_silent_for_exactly_the_engine_timeout_is_not_yet_dead():
    client, _ = _client(engine_timeout_s=5.0)
    client._proc, client._heard = _FakeCore(), 100.0
    assert not client.check_heartbeat(105.0)
    assert client.dead is None and not client._proc.killed


def test_a_drain_that_runs_out_of_time_fails_the_rest_and_aborts_them_in_the_core():
    client, sent = _client()

    async def go():
        stream = await client.submit("r1", [1], {})
        left = await client.drain(0.0)
        return stream, left

    stream, left = asyncio.run(go())
    assert left == 1 and stream.closed and stream.error.status == 503 and "shutting down" in stream.error.message
    assert sent[-1] == ["abort", ["r1"]] and client.num_live == 0
    assert _sample(client, "labkit:healthy") == 0


# --- server.py ---------------------------------------------------------------------------------------------------
class _Engine:
    num_live = 1

    def __init__(self):
        self.drains: list[float] = []

    async def drain(self, timeout_s: float) -> int:
        self.drains.append(timeout_s)
        return 0


def _app(scope, receive, send):  # never called: these servers are not run
    raise AssertionError


def test_a_second_signal_skips_the_drain_and_a_dead_engine_exits_1():
    uvicorn = pytest.importorskip("uvicorn")

    from labkit.serve.server import LabServer

    engine = _Engine()
    server = LabServer(uvicorn.Config(_app), engine, drain_s=30.0)

    async def go():
        server._on_signal(signal.SIGTERM)
        server._on_signal(signal.SIGINT)
        await asyncio.sleep(0.3)

    asyncio.run(go())
    assert engine.drains == [30.0, 0.0] and server.should_exit and server.exit_code == 0
    server.engine_died("the engine core exited with code -9")
    assert server.exit_code == 1 and server.should_exit


def test_the_stats_line_speaks_while_a_request_is_open_in_the_frontend_only():
    from types import SimpleNamespace

    from labkit.serve.server import StatsLine

    engine = SimpleNamespace(totals={"prompt_tokens": 0, "generation_tokens": 0, "prefix_queries": 0,
                                     "prefix_hits": 0},
                             stats={"running": 0, "waiting": 0, "free_blocks": 10, "num_blocks": 10}, num_live=1)
    line = StatsLine(engine, now=0.0)
    text = line.next(10.0)
    assert text is not None and "Running: 0 reqs, Waiting: 0 reqs" in text


async def _answer(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_the_header_deadline_is_the_header_timeout_not_the_body_timeout():
    """A client that sends half its headers is answered 408 within --header-timeout, however long --body-timeout
    is."""
    uvicorn = pytest.importorskip("uvicorn")

    from labkit.serve.server import DeadlineH11Protocol

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    port = sock.getsockname()[1]
    http = DeadlineH11Protocol.with_timeouts(header_timeout_s=0.3, body_timeout_s=30.0)
    server = uvicorn.Server(uvicorn.Config(_answer, http=http, log_level="error", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.settimeout(3.0)
            t0 = time.monotonic()
            c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            reply = c.recv(4096)
            took = time.monotonic() - t0
        assert reply.startswith(b"HTTP/1.1 408") and b"--header-timeout" in reply, reply
        assert took < 2.0
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
