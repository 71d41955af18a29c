"""Running the server: engine core up, HTTP up, and a shutdown that loses nobody's stream.

SIGTERM, SIGINT, SIGHUP or SIGQUIT: stop admitting (503 + Retry-After), let in-flight requests finish for up
to `drain_s` seconds, end the rest with an error event and [DONE] (a 503 body when not streaming), stop
uvicorn, stop the engine core (which exits its engine: TP workers stopped, shared memory unlinked),
exit 0. A second signal skips the wait. A dead engine core (or one silent for --engine-timeout) is logged
with its cause and the server exits 1, so a supervisor can restart it rather than a server answering 503
forever.

The listening socket is bound by the command before the engine loads and handed to uvicorn, so the port
checked is the port served: nothing can take it in between.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time

import uvicorn

from labkit.serve.engine_client import EngineClient
from labkit.serve.http import ServeSettings, build_app
from labkit.serve.metrics import ServerMetrics

log = logging.getLogger("labkit.serve")
# SIGHUP (the terminal closed) and SIGQUIT (Ctrl-\) would otherwise end the process at once: streams cut
# without an error event, the engine core and its socket folder left behind.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


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


async def serve_async(model: str, engine_kwargs: dict, settings: ServeSettings, *, sock: socket.socket,
                      max_queue: int, drain_s: float, log_level: str, trace_path: str | None,
                      engine_timeout_s: float = 10.0, stats_interval_s: float = 10.0, access_log: bool = False,
                      on_ready=None) -> int:
    """Start the core, serve on `sock` (bound, listening) until a signal or the core's death; the exit
    status."""
    metrics = ServerMetrics(settings.model_name)
    engine = EngineClient(model, engine_kwargs, metrics=metrics, max_queue=max_queue, trace_path=trace_path,
                          engine_timeout_s=engine_timeout_s)
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
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
    stats = None
    try:
        app = build_app(engine, settings)
        config = uvicorn.Config(app, log_level=log_level, access_log=access_log, timeout_graceful_shutdown=5,
                                lifespan="off")
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
