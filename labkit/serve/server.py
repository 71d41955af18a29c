"""Running the server: engine core up, HTTP up, and a shutdown that loses nobody's stream.

SIGTERM or SIGINT: stop admitting (503 + Retry-After), let in-flight requests finish for up to
`drain_s` seconds, end the rest with an error event and [DONE] (a 503 body when not streaming), stop
uvicorn, stop the engine core (which exits its engine: TP workers stopped, shared memory unlinked),
exit 0. A second signal skips the wait. A dead engine core is logged with its cause and the server
exits 1, so a supervisor can restart it rather than a server answering 503 forever.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading

import uvicorn

from labkit.serve.engine_client import EngineClient
from labkit.serve.http import ServeSettings, build_app
from labkit.serve.metrics import ServerMetrics

log = logging.getLogger("labkit.serve")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


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


async def serve_async(model: str, engine_kwargs: dict, settings: ServeSettings, *, host: str, port: int,
                      max_queue: int, drain_s: float, log_level: str, trace_path: str | None,
                      on_ready=None) -> int:
    """Start the core, serve until a signal or the core's death; returns the exit status."""
    metrics = ServerMetrics(settings.model_name)
    engine = EngineClient(model, engine_kwargs, metrics=metrics, max_queue=max_queue, trace_path=trace_path)
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
    try:
        app = build_app(engine, settings)
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                                timeout_graceful_shutdown=5, lifespan="off")
        server = LabServer(config, engine, drain_s)
        engine.on_dead = server.engine_died
        announce = asyncio.ensure_future(_when_started(server, lambda: on_ready(engine))) if on_ready else None
        await server.serve()
        if announce is not None:
            announce.cancel()
        if not server.started:
            return 2
        return server.exit_code
    finally:
        await engine.close()


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
