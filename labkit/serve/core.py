"""The engine core: one process that owns one `engine.LLM` and does nothing but step it.

The HTTP frontend (frontend.py) lives in another process, so per-token frontend work (JSON, SSE framing,
detokenisation, asyncio) never competes with the engine loop for a GIL. The two talk over two ZeroMQ
PUSH/PULL sockets on ipc:// paths in a private folder, one msgpack message at a time:

    frontend -> core   ["add", request_id, prompt_ids, {temperature, max_tokens, ignore_eos, top_k, top_p}]
                       ["abort", [request_id, ...]]
                       ["stop"]                        abort everything, exit the engine, exit 0
    core -> frontend   ["ready", info]                 info: limits, device, model, tp (see EngineCore.info)
                       ["start_failed", message]
                       ["step", step]                  once per engine step, for every request at once:
                           {"n": step number, "phase": "prefill"|"decode"|"mixed", "batch": sequences,
                            "tokens": tokens computed, "prefill": [prefill rows, their tokens] (the rest are
                            decode rows, one token each), "wall_s": seconds,
                            "out": [[request_id, token_id|None, finish_reason|None], ...]  (only rows with news),
                            "queued": [[request_id, seconds waited before its first schedule, prompt tokens],
                                       ...]  (each request once, in the step that first schedules any of it:
                                       a prefill step, or a mixed step's prefill rows),
                            "stats": [waiting, running, free_blocks, total_blocks, preempted,
                                      prefix_queries, prefix_hits],
                            "ahead": [steps launched while the one before ran, rows wasted on sequences
                                      that had stopped or been aborted] since the last step (async scheduling)}
                       ["stats", stats]                the same stats after adds/aborts while idle
                       ["rejected", request_id, message]      add_request refused it (ValueError)
                       ["failed", [request_id, ...], message] a step raised; those requests were aborted
                       ["fatal", message]              the engine cannot go on; the process exits 1
                       ["alive"]                       every HEARTBEAT_S from a thread of its own, busy or
                                                       idle, until the engine has exited

Whatever one request does, it fails that request only: add_request's refusal is "rejected"; a step that
raises takes its own batch out (engine.StepFailed) and the loop carries on. Only a fatal StepFailed (dead
tensor-parallel workers) or an error outside a step ends the process. The core also exits when the
frontend's process is gone (its parent pid changes), so a killed server never leaves an engine behind.
The heartbeat is how the frontend tells a long step from a core that no longer runs (stopped, wedged).
"""
from __future__ import annotations

import os
import threading
import time
import traceback

from engine import LLM, SamplingParams
from engine.step_result import StepFailed
from labkit.engine_args import EngineArgs
from labkit.serve.step_stream import STEP_TOPIC, QueueBook, step_record

IDLE_POLL_MS = 100
# A file to append one JSON line per engine step to (the step message without its token rows, plus the
# monotonic time): what a load did step by step, for finding where a slow run's time went.
STEP_LOG_ENV = "LABKIT_STEP_LOG"
HEARTBEAT_S = 1.0


class EngineCore:
    """The loop body, free of sockets (tests drive it in-process): `handle(msg)` for each incoming
    message, then `step()` while `has_work`; both return the messages to send."""

    def __init__(self, llm: LLM, publisher=None, worker_id: str = "", kv_events=None, live_trace=None,
                 step_records: bool = True):
        self.llm = llm
        # --live-trace: the engine's tracer (live_trace.LiveTracer), whose windows `labkit trace --url` records
        self.live_trace = live_trace
        # --kv-events: the prefix cache's changes go out after each step in vLLM's schema (kv_events.py)
        self.kv_events = kv_events
        if kv_events is not None:
            llm.enable_kv_events()
            kv_events.block_size = llm.config.kvcache_block_size
            kv_events.cleared()
        # --step-stream: each step's record (step_stream.py) goes out on this PUB socket; None costs nothing.
        self.publisher = publisher if step_records else None
        self.worker_id = worker_id
        self.queue = QueueBook() if self.publisher is not None else None
        self.live: dict[str, int] = {}          # request_id -> seq_id
        # seq_id -> (request_id, monotonic time it was added, prompt tokens) until a step first schedules it (keyed
        # by seq_id: a request_id may come back once its first request has finished)
        self.unscheduled: dict[int, tuple[str, float, int]] = {}
        self.stopping = False
        self._ahead_seen = (0, 0)               # async scheduling's steps ahead / wasted rows already reported

    def info(self) -> dict:
        llm = self.llm
        cfg = llm.config
        dev = llm.device
        from labkit.output import device_info  # the name every JSON of labkit gives this device (CPU too)

        info = {"limits": llm.limits.to_dict(), "device": str(dev), "device_name": device_info(dev).get("name"),
                "tp": cfg.tensor_parallel_size, "model": os.path.abspath(cfg.model), "eos": cfg.eos,
                "block_size": cfg.kvcache_block_size, "num_blocks": cfg.num_kvcache_blocks,
                "max_num_seqs": cfg.max_num_seqs, "policy": cfg.scheduling_policy,
                "enforce_eager": cfg.enforce_eager, "async_scheduling": cfg.async_scheduling,
                "startup_s": {k: round(v, 4) for k, v in llm.startup_seconds.items()}}
        return info

    @property
    def has_work(self) -> bool:
        # (With async scheduling a step may still be on the device after its last request left: it commits.)
        return not self.llm.is_finished()

    def stats(self) -> list:
        s = self.llm.stats()
        return [s["waiting"], s["running"], s["free_blocks"], s["num_blocks"], 0, 0, 0]

    def handle(self, msg: list) -> list:
        kind = msg[0]
        if kind == "add":
            return self._add(*msg[1:])
        if kind == "abort":
            for rid in msg[1]:
                self._abort(rid)
            if self.kv_events is not None:
                self.kv_events.publish(self.llm.take_kv_events())
            return []
        if kind == "trace" and self.live_trace is not None:   # ["trace", "open"|"close", token]
            (self.live_trace.open if msg[1] == "open" else self.live_trace.close)(msg[2])
            return []
        if kind == "stop":
            self.stopping = True
            for rid in list(self.live):
                self._abort(rid)
            return []
        return [["rejected", None, f"unknown message {kind!r}"]]

    def _add(self, rid: str, prompt_ids: list[int], params: dict) -> list:
        if rid in self.live:
            return [["rejected", rid, f"request_id: {rid!r} is already in flight"]]
        try:
            seq_id = self.llm.add_request(prompt_ids, SamplingParams(**params), request_id=rid)
        except Exception as exc:  # noqa: BLE001 - any refusal fails this request only
            msg = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            return [["rejected", rid, msg]]
        self.live[rid] = seq_id
        self.unscheduled[seq_id] = (rid, time.monotonic(), len(prompt_ids))
        if self.queue is not None:
            self.queue.added(len(prompt_ids))
        return []

    def _abort(self, rid: str) -> None:
        seq_id = self.live.pop(rid, None)
        if seq_id is not None:
            self._forget_unscheduled(seq_id)
            self.llm.abort(seq_id)
            self.llm.forget(seq_id)

    def _forget_unscheduled(self, seq_id: int) -> None:
        first = self.unscheduled.pop(seq_id, None)
        if self.queue is not None:
            if first is not None:
                self.queue.scheduled(first[2])
            self.queue.preempted.pop(seq_id, None)

    def step(self) -> list:
        llm = self.llm
        t0 = time.monotonic()
        try:
            r = llm.step()
        except StepFailed as exc:
            if exc.fatal:
                raise
            for rid, seq_id in zip(exc.request_ids, exc.seq_ids):
                if self.live.get(rid) == seq_id:
                    del self.live[rid]
                    self._forget_unscheduled(seq_id)
                    llm.forget(seq_id)
            if self.kv_events is not None:
                self.kv_events.publish(llm.take_kv_events())
            if self.live_trace is not None:
                self.live_trace.flush()
            return [["failed", exc.request_ids, str(exc)]]
        wall = time.monotonic() - t0
        # Queue time and prompt tokens, once per request, in the step that first schedules it whatever its phase
        # (under mixed most requests start in a mixed step), and before the rows below may finish it (a request
        # can finish in its first step).
        queued = []
        unscheduled = self.unscheduled
        if unscheduled:
            for seq_id in r.seq_ids:
                first = unscheduled.pop(seq_id, None)
                if first is not None:
                    queued.append([first[0], t0 - first[1], first[2]])
                    if self.queue is not None:
                        self.queue.scheduled(first[2])
        out = []
        live = self.live
        for rid, seq_id, tok, reason in zip(r.request_ids, r.seq_ids, r.token_ids, r.finish_reasons):
            if tok is None and reason is None:
                continue
            out.append([rid, tok, reason])
            if reason is not None and live.get(rid) == seq_id:
                del live[rid]
                llm.forget(seq_id)
                if self.queue is not None:
                    self.queue.preempted.pop(seq_id, None)
        stats = [r.num_waiting, r.num_running, r.num_free_blocks, r.num_blocks, len(r.preempted),
                 r.prefix_cache_queries, r.prefix_cache_hits]
        counts = llm.async_stats
        ahead = [counts["launched_ahead"] - self._ahead_seen[0], counts["wasted_rows"] - self._ahead_seen[1]]
        self._ahead_seen = (counts["launched_ahead"], counts["wasted_rows"])
        if self.publisher is not None:
            self._publish(r, wall, ahead)
        if self.kv_events is not None:
            self.kv_events.publish(llm.take_kv_events())
        if self.live_trace is not None:
            self.live_trace.flush()
        decodes = r.num_decodes
        return [["step", {"n": r.step, "phase": r.phase, "batch": r.batch_size, "tokens": r.num_computed_tokens,
                          "prefill": [r.batch_size - decodes, r.num_computed_tokens - decodes],
                          "wall_s": wall, "out": out, "queued": queued, "stats": stats, "ahead": ahead}]]


    def _publish(self, r, wall: float, ahead: list[int]) -> None:
        """The step's record on the step stream (--step-stream)."""
        book, llm = self.queue, self.llm
        if book.preempted:      # preempted requests scheduled again leave the queue
            for seq_id in r.seq_ids:
                book.preempted.pop(seq_id, None)
        preempted = []
        for seq_id in r.preempted:
            seq = llm.get_sequence(seq_id)
            preempted.append(seq.request_id)
            book.preempted[seq_id] = seq.num_tokens
        self.publisher.publish(STEP_TOPIC, step_record(r, wall, self.publisher.next_counter(STEP_TOPIC), book, ahead,
                                                       preempted, self.worker_id))


def core_main(model: str, engine_args: EngineArgs, in_addr: str, out_addr: str, parent_pid: int,
              trace_path: str | None = None, streams: dict | None = None) -> None:
    """Body of the engine-core process (spawned by the frontend): an engine with the settings `engine_args` (the
    command's, as one typed value: labkit/engine_args.py). `streams` (None: all off): {"steps": the
    endpoints the step stream's PUB socket binds, "worker_id": the records' worker_id, "kv_events": the endpoint
    the KV events' PUB socket binds, "kv_events_topic": their topic}."""
    import signal

    import msgpack
    import zmq

    from engine.tp_workers import die_with_parent

    # Owned by the frontend from here on: killed with it even while the engine is still loading (the loop's
    # parent check below only runs once it has loaded).
    die_with_parent(parent_pid)

    # Shutdown is the frontend's to decide: it sends "stop" (or disappears, which we notice). A terminal's
    # hang-up or quit reaches the whole process group; the frontend drains on those too.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.connect(in_addr)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 5000)
    push.setsockopt(zmq.SNDHWM, 0)  # never block the engine on a slow reader
    push.connect(out_addr)
    pack = msgpack.Packer(use_bin_type=True).pack

    def send(msg) -> None:
        push.send(pack(msg), copy=False)

    code = 0
    llm = None
    publisher = kv_publisher = None
    beating = threading.Event()
    streams = streams or {}
    try:
        try:
            engine_kwargs = engine_args.kwargs()
            if streams.get("steps"):
                from labkit.serve.step_stream import Publisher

                try:
                    publisher = Publisher(ctx, streams["steps"], hwm=streams.get("hwm", 2000))
                except zmq.ZMQError as exc:
                    raise ValueError(f"--step-stream: cannot bind {', '.join(streams['steps'])}: {exc}") from None
            if streams.get("kv_events"):
                from labkit.serve.kv_events import KVEventPublisher

                try:  # bound before the engine loads: a taken port fails the start at once
                    kv_publisher = KVEventPublisher(ctx, streams["kv_events"], 0, streams.get("kv_events_topic", ""))
                except zmq.ZMQError as exc:
                    raise ValueError(f"--kv-events: cannot bind {streams['kv_events']}: {exc}") from None
            live_trace = None
            if trace_path is not None:
                from engine.trace import JsonlTracer

                engine_kwargs = {**engine_kwargs, "tracer": JsonlTracer(trace_path)}
            elif streams.get("live_trace"):
                from labkit.serve.live_trace import LiveTracer

                live_trace = LiveTracer(publisher)
                engine_kwargs = {**engine_kwargs, "tracer": live_trace}
            llm = LLM(model, **engine_kwargs)
            core = EngineCore(llm, publisher, streams.get("worker_id", ""), kv_publisher, live_trace,
                              step_records=streams.get("step_records", True))
            send(["ready", core.info()])
            threading.Thread(target=_heartbeat, args=(ctx, out_addr, beating), name="labkit-core-heartbeat",
                             daemon=True).start()
        except Exception as exc:  # noqa: BLE001 - reported to the frontend, which exits 2
            send(["start_failed", str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"])
            code = 2
            return
        code = _loop(core, pull, send, parent_pid)
    except Exception as exc:  # noqa: BLE001 - anything else is fatal: say why, exit non-zero
        send(["fatal", f"{type(exc).__name__}: {exc}", traceback.format_exc()])
        code = 1
    finally:
        if llm is not None:
            try:
                llm.exit()
            except Exception:  # noqa: BLE001 - best effort on the way out
                traceback.print_exc()
        beating.set()
        for pub in (publisher, kv_publisher):
            if pub is not None:
                pub.close()
        pull.close(linger=0)
        push.close()
        ctx.term()
        os._exit(code)


def _heartbeat(ctx, out_addr: str, stop: threading.Event) -> None:
    """["alive"] every HEARTBEAT_S on a socket of its own (zmq sockets are not shared between threads)."""
    import msgpack
    import zmq

    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 4)  # a frontend that reads nothing needs no pile of heartbeats
    sock.connect(out_addr)
    beat = msgpack.packb(["alive"])
    try:
        while not stop.wait(HEARTBEAT_S):
            try:
                sock.send(beat, zmq.NOBLOCK)
            except zmq.Again:
                pass
    finally:
        sock.close(linger=0)


def _loop(core: EngineCore, pull, send, parent_pid: int) -> int:
    import msgpack
    import zmq

    unpack = msgpack.unpackb
    step_log = _open_step_log()
    poller = zmq.Poller()
    poller.register(pull, zmq.POLLIN)
    next_parent_check = 0.0
    while True:
        busy = core.has_work
        events = dict(poller.poll(0 if busy else IDLE_POLL_MS))
        changed = False
        while pull in events:
            for msg in core.handle(unpack(pull.recv(), raw=False)):
                send(msg)
            changed = True
            if core.stopping:
                return 0
            try:
                events = {pull: zmq.POLLIN} if pull.poll(0) else {}
            except zmq.ZMQError:
                events = {}
        if core.has_work:
            for msg in core.step():
                send(msg)
                if step_log is not None and msg[0] == "step":
                    _log_step(step_log, msg[1])
        elif changed:
            send(["stats", core.stats()])
        now = time.monotonic()
        if now >= next_parent_check:
            next_parent_check = now + 1.0
            if os.getppid() != parent_pid:
                return 0  # the frontend is gone: nobody will ever read our output
            # A TP worker that died while the engine idles: fatal now (the frontend exits 1), not at the
            # next request, which would find a broken engine behind a /health that says ok.
            core.llm.check_alive()


def _open_step_log():
    path = os.environ.get(STEP_LOG_ENV)
    # line-buffered: the core ends with os._exit
    return open(path, "a", buffering=1, encoding="utf-8") if path else None


def _log_step(f, step: dict) -> None:
    import json

    row = {k: v for k, v in step.items() if k != "out"}
    row["t"] = time.monotonic()
    row["new_tokens"] = sum(1 for o in step["out"] if o[1] is not None)
    f.write(json.dumps(row, separators=(",", ":")) + "\n")
