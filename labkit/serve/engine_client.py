"""The frontend's handle on the engine-core process (core.py): start it, send it requests and aborts,
route each step's outputs to the requests they belong to, notice when it dies, stop it.

Everything here runs on the server's asyncio loop. One message arrives per engine step for all requests;
`_on_step` appends each request's new token to its RequestStream and wakes its consumer, which takes
everything that piled up since it last looked (so a consumer that falls behind catches up in one chunk
instead of one chunk per token).

Request lifecycle as the frontend sees it: submit -> (tokens ...) -> finished(reason) | failed(error).
Cancelling (client gone, shutdown) ends the stream here at once and tells the core to abort it; the core
frees its KV blocks before its next step.

A core that stops answering (stopped, wedged, swapped to death) is noticed: it sends a heartbeat every
second from a thread of its own, and when nothing at all has come from it for `engine_timeout_s` the
frontend kills it and treats it as dead (open requests fail, /health 503, the server exits 1).
"""
from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from engine.request_limits import RequestLimits
from labkit.engine_args import EngineArgs
from labkit.serve.metrics import ServerMetrics
from labkit.serve.protocol import APIError

log = logging.getLogger("labkit.serve")
SOCKET_DIR_PREFIX = "labkit-serve-"
# A core silent this long while it is being stopped is not stopping: it is killed rather than waited for.
STOP_SILENCE_S = 3.0
# Seconds between the frontend's summaries on the step stream (totals, latency percentiles).
SUMMARY_INTERVAL_S = 1.0


def socket_dir_owner(path: Path) -> int | None:
    """The frontend pid a socket folder's name says made it (labkit-serve-PID-random), or None."""
    pid, sep, _ = path.name[len(SOCKET_DIR_PREFIX):].partition("-")
    return int(pid) if path.name.startswith(SOCKET_DIR_PREFIX) and sep and pid.isdigit() else None


def sweep_socket_dirs(root: str | os.PathLike | None = None) -> list[Path]:
    """Remove the socket folders of frontends that are gone (killed with -9, a power cut): their pid no longer
    runs. Only this user's folders are looked at; returns what was removed."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{SOCKET_DIR_PREFIX}*-*"):
        pid = socket_dir_owner(path)
        try:
            if pid is None or not path.is_dir() or path.is_symlink() or path.stat().st_uid != os.getuid():
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except OSError:  # PermissionError: the pid runs, as another user's process; gone meanwhile
            continue
    return removed


class RequestStream:
    """One request's outputs as they arrive; `wait()` returns what piled up since the last call."""

    __slots__ = ("rid", "prompt_len", "t_arrival", "t_first", "t_last", "num_out", "_new", "reason", "error",
                 "_event", "closed")

    def __init__(self, rid: str, prompt_len: int):
        self.rid = rid
        self.prompt_len = prompt_len
        self.t_arrival = time.monotonic()
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.num_out = 0
        self._new: list[int] = []
        self.reason: str | None = None      # finish_reason once finished
        self.error: APIError | None = None   # set when it failed
        self._event = asyncio.Event()
        self.closed = False                 # finished, failed or cancelled: no more outputs

    async def wait(self) -> tuple[list[int], bool]:
        """(new token ids, done). done: `reason` or `error` says how it ended."""
        if not self._new and not self.closed:
            self._event.clear()
            await self._event.wait()
        new, self._new = self._new, []
        return new, self.closed and not self._new

    def _add(self, token_id: int) -> None:
        self._new.append(token_id)
        self.num_out += 1
        self._event.set()

    def _end(self, reason: str | None = None, error: APIError | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        self.reason, self.error = reason, error
        self._event.set()


class EngineClient:
    """Owns the engine-core process. `await start()`, then `submit` / `abort`; `await close()` at the end.

    max_queue: requests that may wait for their first token before `submit` answers 503 (Overloaded).
    engine_timeout_s: how long the core may send nothing (not even its heartbeat) before it is declared dead.
    on_dead(reason): called once if the core dies while serving (the server then exits non-zero).
    """

    RETRY_AFTER_S = 1

    def __init__(self, model: str, engine_args: EngineArgs, *, metrics: ServerMetrics, max_queue: int = 256,
                 trace_path: str | None = None, on_dead: Callable[[str], None] | None = None,
                 engine_timeout_s: float = 10.0, log_iterations: bool = False,
                 step_stream: list[str] | None = None, worker_id: str = "", kv_events: str | None = None,
                 kv_events_topic: str = "", live_trace: bool = False):
        self.model = model
        self.engine_args = engine_args
        self.metrics = metrics
        self.max_queue = max_queue
        self.trace_path = trace_path
        self.on_dead = on_dead
        self.engine_timeout_s = engine_timeout_s
        self.log_iterations = log_iterations  # vLLM's per-iteration line (iteration_line) for every step
        # --step-stream: None = off; else the endpoints (besides this frontend's own) the core's PUB socket binds
        self.step_stream = step_stream
        self.worker_id = worker_id
        self.kv_events, self.kv_events_topic = kv_events, kv_events_topic   # --kv-events ENDPOINT (None: off)
        self.live_trace = live_trace          # --live-trace: windows of the engine's event log at /v1/trace
        self.hub = None                       # the frontend's end of the core's stream (stream_hub.StreamHub)
        self._summary: asyncio.Task | None = None
        self.info: dict = {}
        self.limits: RequestLimits | None = None
        self.tokenizer = None
        self.dead: str | None = None         # why the core is gone, once it is
        self.draining = False
        self.stats = {"waiting": 0, "running": 0, "free_blocks": 0, "num_blocks": 0, "steps": 0, "max_batch": 0,
                      "step_seconds": 0.0, "steps_launched_ahead": 0, "wasted_rows": 0}
        # Running totals the periodic stats line takes differences of (prometheus counters are not for reading).
        self.totals = {"prompt_tokens": 0, "generation_tokens": 0, "prefix_queries": 0, "prefix_hits": 0}
        self._live: dict[str, RequestStream] = {}
        self._no_token_yet = 0               # live requests still waiting for their first token
        self._proc = None
        self._dir: str | None = None
        self._ctx = self._push = self._pull = None
        self._reader: asyncio.Task | None = None
        self._watchdog: asyncio.Task | None = None
        self._heard = 0.0                    # monotonic time of the core's last message of any kind
        self._closing = False
        self._fatal: str | None = None

    # --- lifecycle ---------------------------------------------------------------------------------
    async def start(self, timeout_s: float | None = None) -> None:
        """Spawn the core and wait until its engine is built. ValueError on a refused engine argument,
        RuntimeError when it dies or fails to start."""
        live_trace = self.live_trace
        import msgpack
        import zmq
        import zmq.asyncio

        from labkit.serve.core import core_main

        # Mode 700: only this user can reach the sockets. The pid in the name says whose folder it is, so the
        # next start can sweep the folders of frontends that were killed before they could remove theirs.
        sweep_socket_dirs()
        self._dir = tempfile.mkdtemp(prefix=f"{SOCKET_DIR_PREFIX}{os.getpid()}-")
        in_addr, out_addr = f"ipc://{self._dir}/in", f"ipc://{self._dir}/out"
        stream_addr = f"ipc://{self._dir}/stream"
        streams = {"worker_id": self.worker_id}
        if self.step_stream is not None or live_trace:
            # One PUB socket for both; step records only with --step-stream. A live trace must lose nothing.
            streams["steps"] = [stream_addr, *(self.step_stream or [])]
            streams["step_records"] = self.step_stream is not None
            streams["live_trace"] = live_trace
            if live_trace:
                streams["hwm"] = 0
        if self.kv_events is not None:
            streams["kv_events"], streams["kv_events_topic"] = self.kv_events, self.kv_events_topic
        self._ctx = zmq.asyncio.Context()
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.bind(in_addr)
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, 0)
        self._pull.bind(out_addr)
        self._pack = msgpack.Packer(use_bin_type=True).pack
        ctx = multiprocessing.get_context("spawn")
        # Not a daemon: the core spawns tensor-parallel workers of its own.
        self._proc = ctx.Process(target=core_main, name="labkit-engine-core",
                                 args=(self.model, self.engine_args, in_addr, out_addr, os.getpid(),
                                       self.trace_path, streams))
        self._proc.start()
        loop = asyncio.get_running_loop()
        tokenizer = loop.run_in_executor(None, self._load_tokenizer)
        try:
            first = await self._first_message(timeout_s)
            if first[0] == "start_failed":
                raise ValueError(first[1])
            self.info = first[1]
            self.limits = RequestLimits(**self.info["limits"])
            self.stats["free_blocks"] = self.stats["num_blocks"] = self.info["num_blocks"]
            self.tokenizer = await tokenizer
        except BaseException:
            # A start that failed or was interrupted (a signal while the engine loads): the core is killed at
            # once. It reads "stop" only once loaded, and nothing it holds needs an orderly stop (its TP workers
            # die with it, its shared memory goes with its resource tracker).
            await self._stop_core(timeout_s=0.0)
            self._close_sockets()
            raise
        self._heard = time.monotonic()
        self._reader = asyncio.create_task(self._read_loop(), name="labkit-engine-outputs")
        self._watchdog = asyncio.create_task(self._watch(), name="labkit-engine-watchdog")
        loop.add_reader(self._proc.sentinel, self._on_core_exit)
        if "steps" in streams:
            from labkit.serve.stream_hub import StreamHub

            self.hub = StreamHub(self._ctx, stream_addr, self.metrics)
            self._summary = asyncio.create_task(self._summaries(), name="labkit-stream-summary")
        self.metrics.healthy.set(1)

    def _load_tokenizer(self):
        from engine.tokenizer import Tokenizer

        return Tokenizer(self.model)

    async def _first_message(self, timeout_s: float | None):
        import msgpack

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if await self._pull.poll(200):
                msg = msgpack.unpackb(await self._pull.recv(), raw=False)
                if msg[0] != "alive":  # the heartbeat's socket may overtake "ready" if we read late
                    return msg
                continue
            if not self._proc.is_alive():
                raise RuntimeError(f"the engine core exited with code {self._proc.exitcode} while starting "
                                   "(its output is above)")
            if deadline is not None and time.monotonic() > deadline:
                raise RuntimeError(f"the engine did not start within {timeout_s:g} s")

    @property
    def healthy(self) -> bool:
        return self.dead is None and not self._closing and self._proc is not None and self._proc.is_alive()

    async def drain(self, timeout_s: float) -> int:
        """Stop admitting; wait up to timeout_s for in-flight requests; fail the rest. Returns how many
        were cancelled."""
        self.draining = True
        self.metrics.healthy.set(0)
        await self._close_streams()  # watchers' streams never end by themselves
        deadline = time.monotonic() + timeout_s
        while self._live and time.monotonic() < deadline and self.dead is None:
            await asyncio.sleep(0.05)
        left = list(self._live)
        for rid in left:
            self._fail(rid, APIError(503, "the server is shutting down; the request was cancelled",
                                     "service_unavailable"))
        if left and self.dead is None:
            await self._send_if_read(["abort", left])
        return len(left)

    async def close(self, timeout_s: float = 60.0) -> None:
        """Stop the core (it aborts what is left, exits its engine and TP workers) and free everything."""
        self._closing = True
        self.metrics.healthy.set(0)
        for rid in list(self._live):
            self._fail(rid, APIError(503, "the server is shutting down", "service_unavailable"))
        if self._proc is not None:
            try:
                asyncio.get_running_loop().remove_reader(self._proc.sentinel)
            except (ValueError, OSError):
                pass
        await self._close_streams()
        await self._stop_core(timeout_s)
        for task in (self._watchdog, self._reader):
            if task is None:
                continue
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - it is being torn down
                pass
        self._close_sockets()

    async def _stop_core(self, timeout_s: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.is_alive() and self.dead is None:
            # A PUSH send waits for a reader: a core that has closed its socket but not yet exited (its last
            # message lingering, as after a refused engine argument) would never take it. Bounded, then signals.
            await self._send_if_read(["stop"], min(1.0, timeout_s))
            deadline = time.monotonic() + timeout_s
            # The core heart-beats until it has exited its engine; one that falls silent will not stop.
            self._heard = max(self._heard, time.monotonic())
            while proc.is_alive() and time.monotonic() < deadline \
                    and time.monotonic() - self._heard < STOP_SILENCE_S:
                await asyncio.sleep(0.05)
        if proc.is_alive():
            # The core ignores SIGTERM (shutdown is the frontend's to decide), so straight to SIGKILL, which also
            # ends a stopped process.
            log.warning("labkit serve: the engine core did not stop; killing it")
            proc.kill()
        await asyncio.to_thread(proc.join, 5.0)

    async def trace_window(self, token: str, open_: bool) -> None:
        """Open or close a window of the engine's event log (--live-trace): the core marks it in its stream."""
        await self._send_if_read(["trace", "open" if open_ else "close", token])

    async def _close_streams(self) -> None:
        if self._summary is not None:
            self._summary.cancel()
            self._summary = None
        if self.hub is not None:
            hub, self.hub = self.hub, None
            await hub.close()

    async def _summaries(self) -> None:
        """Once a second: the frontend's totals and latencies (live_summary.py) into the step stream, for whoever
        reads it (taken every second all the same, so a latency window is always the last 10 s)."""
        from labkit.serve.live_summary import LiveSummary
        from labkit.serve.step_stream import STEP_TOPIC

        summary = LiveSummary(self.metrics.registry)
        while True:
            await asyncio.sleep(SUMMARY_INTERVAL_S)
            record = summary.snapshot()
            hub = self.hub
            if hub is not None and hub.subs.get(STEP_TOPIC):
                record["live"], record["queued"] = self.num_live, self.num_waiting
                hub.broadcast(STEP_TOPIC, record)

    def _close_sockets(self) -> None:
        for sock in (self._push, self._pull):
            if sock is not None:
                sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
        self._push = self._pull = self._ctx = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    # --- requests ----------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return self._no_token_yet

    @property
    def num_live(self) -> int:
        return len(self._live)

    async def submit(self, rid: str, prompt_ids: list[int], params: dict) -> RequestStream:
        if self.dead is not None:
            raise APIError(503, f"the engine is not running: {self.dead}", "service_unavailable")
        if self.draining or self._closing:
            raise APIError(503, "the server is shutting down", "service_unavailable",
                           {"Retry-After": str(self.RETRY_AFTER_S)})
        if rid in self._live:
            raise APIError(400, f"request_id: {rid!r} is already in flight")
        if self._no_token_yet >= self.max_queue:
            raise APIError(503, f"server overloaded: {self._no_token_yet} requests are waiting "
                                f"(--max-queue {self.max_queue})", "overloaded_error",
                           {"Retry-After": str(self.RETRY_AFTER_S)})
        stream = RequestStream(rid, len(prompt_ids))
        self._live[rid] = stream
        self._no_token_yet += 1
        try:
            await self._send(["add", rid, prompt_ids, params])
        except Exception as exc:  # noqa: BLE001 - nobody took it: the core went away after the check above
            self._end(rid)
            raise APIError(503, "the engine is not running (it did not take the request)",
                           "service_unavailable") from exc
        return stream

    def abort(self, stream: RequestStream) -> None:
        """Nobody will read this request's output (the client went away, its response failed): end the stream
        now, drop the request in the core. A stream that has ended already is left alone, so a late abort
        never touches a newer request that reuses its id."""
        if self._live.get(stream.rid) is stream:
            self._end(stream.rid, reason="abort")
            asyncio.ensure_future(self._send_if_read(["abort", [stream.rid]]))

    async def _send(self, msg, timeout_s: float = 5.0) -> None:
        """Hand a message to the core. With SNDHWM 0 a send waits only when no core is connected to read it
        (it exited, or closed its socket on the way out): then it gives up after timeout_s."""
        await asyncio.wait_for(self._push.send(self._pack(msg), copy=False), timeout_s)

    async def _send_if_read(self, msg, timeout_s: float = 5.0) -> None:
        """`_send` for messages that only matter to a core that is still there (abort, stop)."""
        try:
            await self._send(msg, timeout_s)
        except Exception:  # noqa: BLE001 - the socket is gone, or no core reads it any more
            pass

    def _end(self, rid: str, reason: str | None = None, error: APIError | None = None) -> RequestStream | None:
        stream = self._live.pop(rid, None)
        if stream is None:
            return None
        if stream.t_first is None:
            self._no_token_yet -= 1
        stream._end(reason, error)
        self.metrics.finished(reason or "error")
        return stream

    def _fail(self, rid: str, error: APIError) -> None:
        self._end(rid, error=error)

    # --- the core's messages -----------------------------------------------------------------------
    async def _read_loop(self) -> None:
        import msgpack

        unpack = msgpack.unpackb
        pull = self._pull
        handlers = {"step": self._on_step, "stats": self._on_stats, "rejected": self._on_rejected,
                    "failed": self._on_failed, "fatal": self._on_fatal, "alive": _ignore}
        while True:
            msg = unpack(await pull.recv(), raw=False)
            self._heard = time.monotonic()
            try:
                handlers[msg[0]](*msg[1:])
            except Exception:  # noqa: BLE001 - a bug here must not stop every other request's output
                log.exception("labkit serve: could not handle the engine's %r message", msg[0])

    def _on_step(self, step: dict) -> None:
        now = time.monotonic()
        m = self.metrics
        live = self._live
        itl = m.itl.observe
        delivered = 0
        for rid, token, reason in step["out"]:
            stream = live.get(rid)
            if stream is None:
                continue  # cancelled here already
            if token is not None:
                if stream.t_first is None:
                    stream.t_first = now
                    self._no_token_yet -= 1
                    m.ttft.observe(now - stream.t_arrival)
                else:
                    itl(now - stream.t_last)
                stream.t_last = now
                stream._add(token)
                delivered += 1
            if reason is not None:
                m.e2el.observe(now - stream.t_arrival)
                self._end(rid, reason=reason)
        prompt_tokens = 0
        for _rid, waited, num_prompt in step["queued"]:  # the core's count: the stream may be gone already
            m.queue_time.observe(waited)
            prompt_tokens += num_prompt
        if prompt_tokens:
            m.prompt_tokens.inc(prompt_tokens)
            self.totals["prompt_tokens"] += prompt_tokens
        m.generation_tokens.inc(delivered)
        self.totals["generation_tokens"] += delivered
        m.steps.inc()
        self._on_stats(step["stats"])
        s = self.stats
        s["steps"] += 1
        s["step_seconds"] += step["wall_s"]
        ahead, wasted = step.get("ahead", (0, 0))
        s["steps_launched_ahead"] += ahead
        s["wasted_rows"] += wasted
        m.async_step(ahead, wasted)
        if step["batch"] > s["max_batch"]:
            s["max_batch"] = step["batch"]
        if self.log_iterations:
            log.info("%s", iteration_line(step))

    def _on_stats(self, stats: list) -> None:
        waiting, running, free, total, preempted, queries, hits = stats
        s = self.stats
        s["waiting"], s["running"], s["free_blocks"], s["num_blocks"] = waiting, running, free, total
        m = self.metrics
        m.waiting.set(waiting)
        m.running.set(running)
        m.kv_usage.set(1.0 - free / total if total else 0.0)
        if preempted:
            m.preemptions.inc(preempted)
        if queries:
            m.prefix_queries.inc(queries)
            self.totals["prefix_queries"] += queries
        if hits:
            m.prefix_hits.inc(hits)
            self.totals["prefix_hits"] += hits

    def _on_rejected(self, rid: str, message: str) -> None:
        self._fail(rid, APIError(400, message))

    def _on_failed(self, rids: list[str], message: str) -> None:
        log.error("labkit serve: %s", message)
        for rid in rids:
            self._fail(rid, APIError(500, f"the engine failed on this request: {message}", "engine_error"))

    def _on_fatal(self, message: str, tb: str = "") -> None:
        self._fatal = message
        if tb:
            log.error("labkit serve: the engine core failed:\n%s", tb.rstrip())

    def _on_core_exit(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            loop.remove_reader(self._proc.sentinel)
        except (ValueError, OSError):
            pass
        if self._closing:
            return
        # Let the reader take the core's last words ("fatal") before deciding what to say.
        loop.call_later(0.2, self._declare_dead)

    async def _watch(self) -> None:
        period = min(1.0, self.engine_timeout_s / 4)
        last = time.monotonic()
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            if now - last > max(2 * period, 1.0):
                # This loop itself was held up (the frontend stopped, a long GC): the core's messages may be
                # waiting unread in the socket, so its silence is not evidence yet.
                self._heard = max(self._heard, now - period)
            last = now
            self.check_heartbeat(now)

    def check_heartbeat(self, now: float) -> bool:
        """Declare the core dead (and kill it) when it has sent nothing for engine_timeout_s; True if so."""
        silent = now - self._heard
        if self._closing or self.dead is not None or silent <= self.engine_timeout_s:
            return False
        pid = getattr(self._proc, "pid", None)
        self._fatal = (f"the engine core (pid {pid}) has not answered for {silent:.1f} s "
                       f"(--engine-timeout {self.engine_timeout_s:g})")
        try:
            self._proc.kill()  # a stopped or wedged core would never read a "stop"
        except (OSError, AttributeError):
            pass
        self._declare_dead()
        return True

    def _declare_dead(self) -> None:
        if self._closing or self.dead is not None:
            return
        self._proc.join(1.0)
        self.dead = self._fatal or f"the engine core exited with code {self._proc.exitcode}"
        self.metrics.healthy.set(0)
        log.error("labkit serve: %s", self.dead)
        for rid in list(self._live):
            self._fail(rid, APIError(500, f"the engine failed: {self.dead}", "engine_error"))
        if self.on_dead is not None:
            self.on_dead(self.dead)


def iteration_line(step: dict) -> str:
    """vLLM's per-iteration log line (`--enable-logging-iteration-details`, vLLM pull request 31193), with its
    context (prefill rows: a chunk or a whole prompt, re-prefills after preemption included) and generation
    (decode rows, one token each) requests and tokens, the step's time in the engine core, and the KV cache use
    it left."""
    rows, tokens = step.get("prefill", (0, 0))
    decodes = step["batch"] - rows
    _, _, free, total = step["stats"][:4]
    usage = 1.0 - free / total if total else 0.0
    return (f"labkit serve: Iteration({step['n']}): {rows} context requests, {tokens} context tokens, {decodes} "
            f"generation requests, {decodes} generation tokens, iteration elapsed time: {1e3 * step['wall_s']:.2f} "
            f"ms, KV cache usage: {100 * usage:.1f}%")


def _ignore(*_args) -> None:
    """The core's heartbeat: receiving it is all it is for."""
