"""Running the server: engine core up, HTTP up, and a shutdown that loses nobody's stream.

SIGTERM, SIGINT, SIGHUP or SIGQUIT: stop admitting (503 + Retry-After), let in-flight requests finish for up
to `drain_s` seconds, end the rest with an error event and [DONE] (a 503 body when not streaming), stop
uvicorn, stop the engine core (which exits its engine: TP workers stopped, shared memory unlinked),
exit 0. A second signal skips the wait. A dead engine core (or one silent for --engine-timeout) is logged
with its cause and the server exits 1, so a supervisor can restart it rather than a server answering 503
forever.

The listening socket is bound by the command before the engine loads and handed to uvicorn, so the port
checked is the port served: nothing can take it in between.

Connections speak uvicorn's h11 protocol with a deadline on reading each request (DeadlineH11Protocol):
uvicorn itself never times out a client that is still sending.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import threading
import time

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from labkit.engine_args import EngineArgs
from labkit.errors import LabkitError
from labkit.serve.engine_client import EngineClient
from labkit.serve.http import ServeSettings, build_app
from labkit.serve.metrics import ServerMetrics
from labkit.serve.protocol import APIError

log = logging.getLogger("labkit.serve")
# SIGHUP (the terminal closed) and SIGQUIT (Ctrl-\) would otherwise end the process at once: streams cut
# without an error event, the engine core and its socket folder left behind. A SIGHUP already ignored when we
# start (`nohup labkit serve`) stays ignored: the user asked the server to outlive its terminal.
SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
                if not (s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN))


class LabServer(uvicorn.Server):
    """uvicorn's server with our signal handling: drain first, never re-raise the signal afterwards
    (uvicorn's default would kill the process before the engine core is stopped)."""

    def __init__(self, config: uvicorn.Config, engine: EngineClient, drain_s: float):
        super().__init__(config)
        self.engine = engine
        self.drain_s = drain_s
        self.exit_code = 0
        self._draining: asyncio.Task | None = None

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            yield
        finally:
            for sig in SIGNALS:
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self._draining is None:
            log.warning("labkit serve: %s: draining (%d in flight, up to %g s), then stopping", name,
                        self.engine.num_live, self.drain_s)
            self._draining = asyncio.ensure_future(self._drain_then_exit(self.drain_s))
        else:
            log.warning("labkit serve: %s again: cancelling what is left now", name)
            asyncio.ensure_future(self._drain_then_exit(0.0))

    async def _drain_then_exit(self, drain_s: float) -> None:
        cancelled = await self.engine.drain(drain_s)
        if cancelled:
            log.warning("labkit serve: cancelled %d request(s) still running at the end of the drain", cancelled)
        await asyncio.sleep(0.1)  # let the streams write their last event
        self.should_exit = True

    def engine_died(self, reason: str) -> None:
        log.error("labkit serve: stopping: the engine is gone (%s)", reason)
        self.exit_code = 1
        self.should_exit = True


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines on the client's half of each request. uvicorn times out only an
    idle keep-alive connection, and any byte restarts that timer, so a client sending its request line and
    headers a byte every few seconds (slowloris), or never finishing them, held a connection forever, and so
    did one trickling a body the app had answered without reading (a 404, a 400 over --max-body-bytes):
    uvicorn drains such a body for as long as it keeps coming. A body the app reads is bounded in http.py
    (--body-timeout: a 408, before anything reaches the engine).

    The headers must be in within header_timeout_s of the connection being ready for a request (opened, or
    the previous response sent); an unread body within body_timeout_s of the response. Past that: a 408
    (when part of a request had come) and the connection is closed. Only h11: httptools would need the
    same hooks again, and `http=` pins this class whichever is installed."""

    header_timeout_s = 30.0
    body_timeout_s = 30.0

    @classmethod
    def with_timeouts(cls, header_timeout_s: float, body_timeout_s: float) -> type:
        return type(cls.__name__, (cls,), {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s})

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: str | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._sync_deadline()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._sync_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._sync_deadline()

    def connection_lost(self, exc) -> None:
        self._set_phase(None)
        super().connection_lost(exc)

    def _sync_deadline(self) -> None:
        # Called after every state change h11 can make: the phase depends on both halves of the exchange.
        client, server = self.conn.their_state, self.conn.our_state
        if self.transport.is_closing():
            phase = None
        elif client is h11.IDLE and server is h11.IDLE:
            phase = "headers"
        elif client is h11.SEND_BODY and server in (h11.DONE, h11.MUST_CLOSE):
            phase = "body"
        else:  # a request being served (the app reads its own body) or the connection past use
            phase = None
        if phase != self._phase:
            self._set_phase(phase)

    def _set_phase(self, phase: str | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._phase = phase
        if phase is not None:
            timeout = self.header_timeout_s if phase == "headers" else self.body_timeout_s
            self._deadline = self.loop.call_later(timeout, self._expired, phase)

    def _expired(self, phase: str) -> None:
        self._deadline, self._phase = None, None
        if self.transport.is_closing():
            return
        if phase == "headers" and self.conn.trailing_data[0]:
            err = APIError(408, f"headers: the request line and headers were not received within "
                           f"{self.header_timeout_s:g} s (--header-timeout)")
            body = json.dumps(err.body()).encode()
            try:
                out = self.conn.send(h11.Response(status_code=408, reason=b"Request Timeout", headers=[
                    (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close")]))
                out += self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage())
                self.transport.write(out)
            except h11.LocalProtocolError:
                pass  # h11 will not answer in this state: just close
        self.transport.close()


async def serve_async(model: str, engine_args: EngineArgs, settings: ServeSettings, *, sock: socket.socket,
                      max_queue: int, drain_s: float, log_level: str, trace_path: str | None,
                      engine_timeout_s: float = 10.0, stats_interval_s: float = 10.0, access_log: bool = False,
                      log_iterations: bool = False, step_stream: list[str] | None = None, worker_id: str = "",
                      kv_events: str | None = None, kv_events_topic: str = "", live_trace: bool = False,
                      vllm_metric_names: bool = False, on_ready=None) -> int:
    """Start the core, serve on `sock` (bound, listening) until a signal or the core's death; the exit
    status."""
    metrics = ServerMetrics(settings.model_name, vllm_names=vllm_metric_names)
    engine = EngineClient(model, engine_args, metrics=metrics, max_queue=max_queue, trace_path=trace_path,
                          engine_timeout_s=engine_timeout_s, log_iterations=log_iterations,
                          step_stream=step_stream, worker_id=worker_id, kv_events=kv_events,
                          kv_events_topic=kv_events_topic, live_trace=live_trace)
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    # A signal while the engine loads: stop loading, clean up, exit.
    for sig in SIGNALS:
        loop.add_signal_handler(sig, task.cancel)
    try:
        await engine.start()
    except asyncio.CancelledError:
        log.warning("labkit serve: interrupted while the engine was starting")
        return 0
    except Exception as exc:
        # Refused its configuration, or its core or a worker died (killed, out of memory) before anyone was
        # served: the server never ran. (Dying while serving is exit 1: see LabServer.engine_died.)
        raise LabkitError(f"the engine could not start: {exc}", 2) from exc
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
    stats = None
    try:
        app = build_app(engine, settings)
        http = DeadlineH11Protocol.with_timeouts(settings.header_timeout_s, settings.body_timeout_s)
        config = uvicorn.Config(app, http=http, log_level=log_level, access_log=access_log,
                                timeout_graceful_shutdown=5, lifespan="off")
        if access_log:
            # One line per request whatever --log-level says of uvicorn's own messages.
            logging.getLogger("uvicorn.access").setLevel(logging.INFO)
        server = LabServer(config, engine, drain_s)
        engine.on_dead = server.engine_died
        announce = asyncio.ensure_future(_when_started(server, lambda: on_ready(engine))) if on_ready else None
        if stats_interval_s > 0:
            stats = asyncio.ensure_future(_log_stats(engine, stats_interval_s))
        try:
            await server.serve(sockets=[sock])
        except SystemExit:  # uvicorn's way of saying it could not start
            return 2
        if announce is not None:
            announce.cancel()
        if not server.started:
            return 2
        return server.exit_code
    finally:
        if stats is not None:
            stats.cancel()
        await engine.close()


class StatsLine:
    """vLLM's periodic engine line: throughput over the last interval, running and waiting requests, KV cache
    usage and the interval's prefix cache hit rate. Idle intervals after the first are not logged."""

    def __init__(self, engine: EngineClient, now: float):
        self.engine = engine
        self._t, self._totals = now, dict(engine.totals)
        self._was_idle = True

    def next(self, now: float) -> str | None:
        e = self.engine
        totals, stats = dict(e.totals), e.stats
        dt = max(now - self._t, 1e-9)
        d = {k: totals[k] - self._totals[k] for k in totals}
        self._t, self._totals = now, totals
        idle = not any(d.values()) and not stats["running"] and not stats["waiting"] and not e.num_live
        if idle and self._was_idle:
            return None
        self._was_idle = idle
        usage = 1.0 - stats["free_blocks"] / stats["num_blocks"] if stats["num_blocks"] else 0.0
        hit = d["prefix_hits"] / d["prefix_queries"] if d["prefix_queries"] else 0.0
        return (f"labkit serve: Avg prompt throughput: {d['prompt_tokens'] / dt:.1f} tokens/s, "
                f"Avg generation throughput: {d['generation_tokens'] / dt:.1f} tokens/s, "
                f"Running: {stats['running']} reqs, Waiting: {stats['waiting']} reqs, "
                f"KV cache usage: {100 * usage:.1f}%, Prefix cache hit rate: {100 * hit:.1f}%")


async def _log_stats(engine: EngineClient, interval_s: float) -> None:
    line = StatsLine(engine, time.monotonic())
    while True:
        await asyncio.sleep(interval_s)
        text = line.next(time.monotonic())
        if text is not None:
            log.info("%s", text)


async def _when_started(server: uvicorn.Server, callback) -> None:
    while not server.started:
        await asyncio.sleep(0.05)
    callback()


def setup_logging() -> None:
    logger = logging.getLogger("labkit.serve")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
