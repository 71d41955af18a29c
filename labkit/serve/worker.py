"""EngineWorker: one thread owns one `engine.LLM`; everything else only sends it messages.

The owner thread builds the engine, then loops: take messages (submit, cancel, stop) -> admit the
pending submissions -> `llm.step()` -> hand each live request the completion tokens it has not seen
yet. Requests therefore join and leave the engine only at step boundaries, and no other thread ever
touches the engine (the tokenizer included: callers pass token ids).

Events reach a request's asyncio queue through `loop.call_soon_threadsafe`:

    admitted   the engine accepted the request (prompt_tokens, seq_id)
    tokens     newly accepted completion token ids, with the owner's monotonic clock (t_ns)
    finished   finish_reason: "stop" | "length" | "abort"
    error      error_type "invalid_request" (the engine refused it: ValueError, message names the
               argument), "engine_error" (the engine loop failed: the worker is now unhealthy) or
               "shutdown" (the worker closed)

Lifecycle rules: a cancelled request leaves the scheduler (waiting or running) and its KV blocks go
back to the pool before the next step; an unexpected exception in the loop fails every in-flight and
pending request with an error event and leaves the worker unhealthy (it stops stepping); overload is
refused at submit time (`Overloaded`) when `max_queue` requests are already waiting to run.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import queue
import threading
import time
import traceback
from typing import Any

from engine import LLM, SamplingParams
from engine.sequence import SequenceStatus


class WorkerError(Exception):
    """Base of the errors `submit` raises."""


class Overloaded(WorkerError):
    """Too many requests are waiting to run (HTTP 503)."""


class Unhealthy(WorkerError):
    """The worker is not running: not started, closed, or its engine loop failed (HTTP 503)."""


@dataclasses.dataclass
class Event:
    type: str  # admitted | tokens | finished | error
    t_ns: int
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    error_type: str | None = None
    message: str | None = None
    prompt_tokens: int | None = None
    seq_id: int | None = None


class RequestHandle:
    """The caller's side of one request: an async stream of Events (consume it on `loop`)."""

    def __init__(self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams,
                 loop: asyncio.AbstractEventLoop):
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.sampling_params = sampling_params
        self.loop = loop
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.t_submit_ns = time.monotonic_ns()
        self.done = False  # set by the consumer once it saw finished/error
        # Owner-thread state.
        self._seq_id: int | None = None
        self._sent = 0
        self._closed = False

    async def next_event(self) -> Event:
        ev = await self.queue.get()
        if ev.type in ("finished", "error"):
            self.done = True
        return ev

    def __aiter__(self):
        return self

    async def __anext__(self) -> Event:
        if self.done:
            raise StopAsyncIteration
        return await self.next_event()

    # Called from the owner thread only.
    def _push(self, ev: Event) -> bool:
        if self._closed:
            return False
        if ev.type in ("finished", "error"):
            self._closed = True
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, ev)
            return True
        except RuntimeError:  # the consumer's loop is closed: nobody listens any more
            self._closed = True
            return False


class EngineWorker:
    """Owns one LLM in a background thread. `start()` builds it (errors re-raised in the caller).

    model / engine_kwargs: what `LLM(model, **engine_kwargs)` gets. max_queue: how many requests may wait
    to run (not yet admitted, or admitted but still in the scheduler's waiting queue) before `submit`
    raises Overloaded.
    """

    def __init__(self, model: str, *, max_queue: int = 256, name: str = "worker-0", step_log_size: int = 10000,
                 **engine_kwargs: Any):
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise ValueError(f"max_queue: must be an integer >= 1, got {max_queue!r}")
        self.model = str(model)
        self.engine_kwargs = engine_kwargs
        self.max_queue = max_queue
        self.name = name
        self.llm: LLM | None = None
        self.tokenizer = None
        self.max_model_len: int | None = None
        self.total_blocks: int | None = None
        self.error: str | None = None  # the fatal error, once the loop failed
        # Recent steps: {step, phase, batch, tokens, wall_s, t_ns}.
        self.step_log: collections.deque[dict] = collections.deque(maxlen=step_log_size)
        self.max_batch = 0
        self.num_steps = 0
        self._cmds: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._num_pending = 0        # submitted, not yet admitted (nor cancelled)
        self._engine_waiting = 0     # in the scheduler's waiting queue after the last iteration
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._stopping = False
        self._paused = threading.Event()
        self._ids = itertools.count()
        self._stats: dict = {}
        self._device_info: dict = {}
        # Owner-thread state.
        self._pending: collections.deque[RequestHandle] = collections.deque()
        self._live: dict[str, RequestHandle] = {}

    # --- lifecycle -----------------------------------------------------------------------------------
    def start(self, timeout: float | None = None) -> "EngineWorker":
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._main, name=f"labkit-{self.name}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"{self.name}: the engine did not start within {timeout} s")
        if self._start_error is not None:
            raise self._start_error
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Stop the loop (in-flight requests get a "shutdown" error), exit the engine, join the thread."""
        if self._thread is None or self._stopping:
            if self._thread is not None:
                self._thread.join(timeout)
            return
        self._stopping = True
        self._paused.clear()
        self._cmds.put(("stop", None))
        self._thread.join(timeout)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    @property
    def healthy(self) -> bool:
        return (self._thread is not None and self._thread.is_alive() and self._ready.is_set()
                and self.error is None and not self._stopping)

    def pause(self) -> None:
        """Hold admission and stepping (cancels are still handled): a lab and test hook."""
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()
        self._cmds.put(("wake", None))

    # --- the caller's side (any thread; submit inside a running event loop) ---------------------------
    def num_queued(self) -> int:
        with self._lock:
            return self._num_pending + self._engine_waiting

    def submit(self, prompt_ids: list[int], sampling_params: SamplingParams, request_id: str | None = None,
               loop: asyncio.AbstractEventLoop | None = None) -> RequestHandle:
        """Queue a request; its events arrive on the returned handle. Raises Overloaded / Unhealthy."""
        if not self.healthy:
            raise Unhealthy(self._unhealthy_reason())
        loop = loop or asyncio.get_running_loop()
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        handle = RequestHandle(rid, list(prompt_ids), sampling_params, loop)
        with self._lock:
            queued = self._num_pending + self._engine_waiting
            if queued >= self.max_queue:
                raise Overloaded(f"server overloaded: {queued} requests are waiting (--max-queue {self.max_queue})")
            self._num_pending += 1
        self._cmds.put(("submit", handle))
        return handle

    def cancel(self, request_id: str) -> None:
        """Abort a request at the next step boundary (a no-op when it has already finished)."""
        self._cmds.put(("cancel", request_id))

    def stats(self) -> dict:
        """A snapshot written by the owner after each iteration (safe to read from any thread)."""
        s = dict(self._stats)
        s["queued"] = self.num_queued()
        s["healthy"] = self.healthy
        return s

    def _unhealthy_reason(self) -> str:
        if self.error is not None:
            return f"engine failed: {self.error}"
        if self._stopping:
            return "the worker is shutting down"
        if self._thread is None or not self._ready.is_set():
            return "the worker is not started"
        return "the worker loop is not running"

    # --- the owner thread ----------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self.llm = LLM(self.model, **self.engine_kwargs)
            self.tokenizer = self.llm.tokenizer
            # For load clients, in /health: the evidence kind of a measurement, the ids a prompt may use.
            dev = self.llm.model_runner.device
            self._device_info = {"device": str(dev), "device_name": None,
                                 "vocab_size": self.llm.config.hf_config.vocab_size}
            if dev.type == "cuda":
                import torch

                self._device_info["device_name"] = torch.cuda.get_device_name(dev)
            self.max_model_len = self.llm.config.max_model_len
            self.total_blocks = self.llm.scheduler.block_manager.num_free_blocks
            self._snapshot()
        except BaseException as exc:  # noqa: BLE001 - re-raised in start()
            self._start_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - any failure of the loop makes the worker unhealthy
            self.error = f"{type(exc).__name__}: {exc}"
            self._traceback = traceback.format_exc()
            self._fail_all("engine_error", f"engine failed: {self.error}")
        finally:
            if self.error is None:
                self._fail_all("shutdown", "the server is shutting down")
            try:
                self.llm.exit()
            except Exception:  # noqa: BLE001 - exit is best effort on the way out
                pass

    def _has_work(self) -> bool:
        return bool(self._live) and not self.llm.is_finished()

    def _loop(self) -> None:
        llm = self.llm
        while True:
            idle = self._paused.is_set() or (not self._pending and not self._has_work())
            if self._drain(block=idle):
                return
            if self._paused.is_set():
                continue
            self._admit()
            if self._has_work():
                self._step()
            self._snapshot()

    def _drain(self, block: bool) -> bool:
        """Handle every queued message; True when asked to stop."""
        try:
            cmd = self._cmds.get(timeout=0.05) if block else self._cmds.get_nowait()
        except queue.Empty:
            return False
        while True:
            kind, arg = cmd
            if kind == "stop":
                return True
            if kind == "submit":
                self._pending.append(arg)
            elif kind == "cancel":
                self._abort(arg)
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return False

    def _admit(self) -> None:
        llm = self.llm
        while self._pending:
            h = self._pending.popleft()
            with self._lock:
                self._num_pending -= 1
            if h.request_id in self._live:
                h._push(Event("error", time.monotonic_ns(), error_type="invalid_request",
                              message=f"request_id: {h.request_id!r} is already in flight"))
                continue
            try:
                seq_id = llm.add_request(h.prompt_ids, h.sampling_params, request_id=h.request_id)
            except ValueError as exc:
                h._push(Event("error", time.monotonic_ns(), error_type="invalid_request", message=str(exc)))
                continue
            h._seq_id = seq_id
            self._live[h.request_id] = h
            h._push(Event("admitted", time.monotonic_ns(), prompt_tokens=len(h.prompt_ids), seq_id=seq_id))
        with self._lock:
            self._engine_waiting = len(llm.scheduler.waiting)

    def _step(self) -> None:
        llm = self.llm
        sched = llm.scheduler
        # Which waiting sequences a prefill step touches: their computed count changes.
        before = [(s, s.num_cached_tokens, s.num_tokens) for s in sched.waiting]
        t0 = time.perf_counter()
        _, num_tokens = llm.step()
        wall = time.perf_counter() - t0
        t_ns = time.monotonic_ns()
        if num_tokens > 0:
            phase = "prefill"
            batch = sum(1 for s, c, n in before if s.num_cached_tokens != c or s.num_tokens != n
                        or s.status != SequenceStatus.WAITING)
        else:
            phase, batch = "decode", -num_tokens
        self.num_steps += 1
        self.max_batch = max(self.max_batch, batch)
        self.step_log.append({"step": llm.step_count, "phase": phase, "batch": batch,
                              "tokens": abs(num_tokens), "wall_s": wall, "t_ns": t_ns})
        for rid, h in list(self._live.items()):
            seq = llm.get_sequence(h._seq_id)
            n = seq.num_completion_tokens
            if n > h._sent:
                new = tuple(seq.token_ids[seq.num_prompt_tokens + h._sent:])
                h._sent = n
                if not h._push(Event("tokens", t_ns, token_ids=new)) and not seq.is_finished:
                    self._abort(rid)  # the consumer is gone
                    continue
            if seq.is_finished:
                h._push(Event("finished", t_ns, finish_reason=seq.finish_reason))
                self._forget(rid)
        with self._lock:
            self._engine_waiting = len(sched.waiting)

    def _abort(self, request_id: str) -> None:
        """Take a request out of the engine (or out of the pending queue); the engine frees its KV blocks."""
        for h in self._pending:
            if h.request_id == request_id:
                self._pending.remove(h)
                with self._lock:
                    self._num_pending -= 1
                h._push(Event("finished", time.monotonic_ns(), finish_reason="abort"))
                return
        h = self._live.get(request_id)
        if h is None:
            return
        llm = self.llm
        sched = llm.scheduler
        seq = llm.get_sequence(h._seq_id)
        llm.abort(h._seq_id)  # traced as "aborted" when tracing is on
        h._push(Event("finished", time.monotonic_ns(), finish_reason=seq.finish_reason or "abort"))
        self._forget(request_id)
        with self._lock:
            self._engine_waiting = len(sched.waiting)

    def _forget(self, request_id: str) -> None:
        h = self._live.pop(request_id)
        # The engine keeps every sequence until generate() collects it; a server must drop them itself.
        self.llm.forget(h._seq_id)

    def _fail_all(self, error_type: str, message: str) -> None:
        t = time.monotonic_ns()
        for h in list(self._pending) + list(self._live.values()):
            h._push(Event("error", t, error_type=error_type, message=message))
        self._pending.clear()
        self._live.clear()
        with self._lock:
            self._num_pending = 0
            self._engine_waiting = 0
        # Submissions that raced the failure.
        while True:
            try:
                kind, arg = self._cmds.get_nowait()
            except queue.Empty:
                break
            if kind == "submit":
                arg._push(Event("error", t, error_type=error_type, message=message))
        self._snapshot()

    def _snapshot(self) -> None:
        llm = self.llm
        if llm is None:
            return
        sched = llm.scheduler
        self._stats = {"steps": self.num_steps, "max_batch": self.max_batch, "live": len(self._live),
                       "pending": len(self._pending), "waiting": len(sched.waiting), "running": len(sched.running),
                       "free_blocks": sched.block_manager.num_free_blocks, "total_blocks": self.total_blocks,
                       **self._device_info}
