"""Tensor parallel worker processes: rank 0 drives ranks 1..N-1 through a shared-memory channel.

Processes. Rank 0 is the engine's own process (tokenizer, scheduler, sampling, tracer). `TensorParallel`
spawns ranks 1..N-1; each joins the process group (gloo on the CPU, NCCL on CUDA, see
device.collective_backend; engine/rendezvous.py for how), builds its own ModelRunner on `cuda:{rank}`
(or the CPU) and then executes what rank 0 asks, in the order rank 0 asks it, so that the collectives
inside the model always match. The group is torch.distributed's default one, and a process has only
one: a second tensor-parallel engine in the same process is refused with a ValueError until the first
has exited; engines in different processes are isolated by Config.dist_init_addr and Config.shm_name
(both unique by default).

Control channel: CPU metadata only, tensors move through the collectives. One SharedMemory block of
`Config.shm_size` bytes named `Config.shm_name`:

    [0, 16)                      header: payload length (uint32), call number (uint32), 8 spare bytes
    [16, 16 + length)            pickle of the message: a BatchPlan (run this step), a RankQuery (answer
                                 fn(runner) in the reply slot), or EXIT
    last 4096 * (N-1) bytes      one reply slot per worker: length (uint32), call number (uint32), pickle

plus two one-way pipes per worker (multiprocessing.Pipe(duplex=False)): `wake` (rank 0 -> worker: a call
is waiting; one byte) and `done` (worker -> rank 0: that call is finished and its reply, if asked for,
written; during start-up, "joined the group" and then "runner built"). Rank 0 writes a call only after
every worker's `done` for the previous one, so a worker never reads a half-overwritten call; in the
steady state the wait costs nothing, because the previous call ended in a collective with rank 0. Pipes
rather than multiprocessing.Event: an Event cannot outlive a waiter's death (Event.set() blocks forever
in notify_all waiting for the killed sleeper to acknowledge, and a process killed while holding the
Event's lock blocks every later set()), whereas a pipe turns a dead peer into EOF / BrokenPipeError
right away, in both directions.

Start-up. Rank 0 waits for each worker to join the group and then to build its runner, polling the
worker processes all along (inside the rendezvous too: rendezvous.WatchedStore), so a worker that dies
during start-up is reported within a fraction of a second, with its rank, exit code and, if it raised,
its error; the waits themselves are bounded by rendezvous.start_timeout_s. (On gloo that holds at any
point, since a collective with a dead peer fails at once; NCCL connects at the first collective, in the
runner build, and a worker dying after it joined but before that collective leaves rank 0 waiting in
NCCL.) A failed start
cleans up like a failed call (below): no process group, worker, shared memory or atexit hook is left,
and the next engine in the process starts normally. Test hook: LABKIT_TP_WORKER_FAIL=STAGE[:exit|:hang] in
rank 0's environment makes every worker raise (with `:exit`, vanish with exit code 3; with `:hang`, wait
forever) at STAGE:
`start` (before the rendezvous), `join` (connected to the store, before joining the group) or `runner`
(before building its runner). A worker dies with rank 0 whatever it is doing (a parent-death signal).

Failure. Before each call rank 0 checks that every worker process is alive; a collective that fails or
times out (Config.dist_timeout_s) on rank 0 makes it look again. Either way it stops the other workers,
destroys the process group, unlinks the shared memory and raises
RuntimeError("tensor parallel worker rank N died (exit code X)") instead of hanging (a live worker that
stops answering gives "... failed on rank 0 (<the timeout>); the workers were stopped" after
dist_timeout_s). A worker that raises writes the error into its reply slot before it exits (code 1), so
rank 0 can quote it. A worker whose rank 0 has died sees its wake pipe close and exits on its own; Python's
resource tracker then unlinks the shared memory.
"""
from __future__ import annotations

import atexit
import copy
import os
import pickle
import struct
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from .config import TP_REPLY_SLOT_BYTES as REPLY_SLOT_BYTES
from .device import collective_backend
from .distributed import set_tp
from .rendezvous import (
    WatchedStore,
    connect_store,
    destroy_group,
    init_group,
    serve_store,
    set_group_timeout,
    socket_env,
    start_timeout_s,
)
from .runner import ModelRunner

HEADER_BYTES = 16
_ERROR_CALL = 0xFFFFFFFF  # call number of a reply slot holding a worker's dying words
# Environment every rank gets before NCCL starts: no NVLink multicast (NVLS) in NCCL, torch symmetric memory
# or NVSHMEM; on shared lab hosts a program using it can take the GPUs out of service.
NCCL_SAFETY_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
FAIL_ENV = "LABKIT_TP_WORKER_FAIL"  # test hook, see the module docstring
# What a worker does after each start-up message on its `done` pipe ("joined", "ready": then it serves calls).
_JOINING = "joining the process group"
_STAGE_AFTER = {b"j": "building the model runner", b"r": None}
_FAIL_EXIT_CODE = 3


# --- what a rank can report about itself -------------------------------------------------------------
def rank_memory(runner) -> dict:
    """Peak memory of this rank: the CUDA allocator's peak on a GPU, the process's max RSS on the CPU."""
    dev = runner.device
    if dev.type == "cuda":
        return {"rank": runner.rank, "device": str(dev), "peak_bytes": int(torch.cuda.max_memory_allocated(dev)),
                "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(dev)),
                "source": "torch.cuda.max_memory_allocated"}
    return {"rank": runner.rank, "device": str(dev), "peak_bytes": _peak_rss(), "peak_reserved_bytes": None,
            "source": "peak resident set size of the rank's process (VmHWM)"}


def _peak_rss() -> int:
    # VmHWM belongs to this process's address space; ru_maxrss would carry the spawning parent's peak
    # over into a freshly spawned worker (Linux keeps it across execve).
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) * (1 if sys.platform == "darwin" else 1024)


def reset_rank_memory(runner) -> None:
    if runner.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(runner.device)


@dataclass(frozen=True)
class RankQuery:
    """Ask every worker for `fn(its runner)` (a module-level function, so it pickles by name)."""
    fn: Callable


EXIT = "exit"  # the message that ends a worker


# --- the shared-memory channel -----------------------------------------------------------------------
class _Channel:
    def __init__(self, shm, world_size: int):
        self.shm = shm
        self.size = shm.size
        self.reply_base = self.size - REPLY_SLOT_BYTES * (world_size - 1)
        self.capacity = self.reply_base - HEADER_BYTES  # bytes a call may take

    def write_call(self, payload: bytes, call_no: int) -> None:
        buf = self.shm.buf
        buf[HEADER_BYTES:HEADER_BYTES + len(payload)] = payload
        struct.pack_into("<II", buf, 0, len(payload), call_no)

    def read_call(self) -> tuple[int, tuple]:
        n, call_no = struct.unpack_from("<II", self.shm.buf, 0)
        return call_no, pickle.loads(bytes(self.shm.buf[HEADER_BYTES:HEADER_BYTES + n]))

    def _slot(self, rank: int) -> int:
        return self.reply_base + REPLY_SLOT_BYTES * (rank - 1)

    def write_reply(self, rank: int, call_no: int, value) -> None:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > REPLY_SLOT_BYTES - 8:
            data = pickle.dumps(("error", f"reply of {len(data)} bytes does not fit the {REPLY_SLOT_BYTES - 8}-byte "
                                          "reply slot"), protocol=pickle.HIGHEST_PROTOCOL)
        at = self._slot(rank)
        self.shm.buf[at + 8:at + 8 + len(data)] = data
        struct.pack_into("<II", self.shm.buf, at, len(data), call_no)

    def read_reply(self, rank: int) -> tuple[int, object]:
        at = self._slot(rank)
        n, call_no = struct.unpack_from("<II", self.shm.buf, at)
        if n == 0 or n > REPLY_SLOT_BYTES - 8:
            return 0, None
        try:
            return call_no, pickle.loads(bytes(self.shm.buf[at + 8:at + 8 + n]))
        except Exception:
            return 0, None


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 2000 else text[:2000] + "..."


# --- the worker side ---------------------------------------------------------------------------------
def _fail_point(stage: str) -> None:
    """The test hook: fail here if FAIL_ENV names this start-up stage."""
    where, _, how = os.environ.get(FAIL_ENV, "").partition(":")
    if where == stage:
        if how == "exit":
            os._exit(_FAIL_EXIT_CODE)
        if how == "hang":  # a start-up that never ends (a rendezvous or a build that waits forever)
            while True:
                time.sleep(3600)
        raise RuntimeError(f"{FAIL_ENV}={where}: failing at start-up stage {stage!r}")


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent exits (Linux prctl PR_SET_PDEATHSIG), from whatever it is doing;
    a parent already gone before the call ends it at once. (A TP worker's parent is rank 0; the server's
    engine core's is its frontend.)"""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # (1: PR_SET_PDEATHSIG)
    except (OSError, AttributeError):  # (not Linux: the pipe and the start-up timeout still end it)
        return
    if os.getppid() != parent_pid:
        os._exit(_FAIL_EXIT_CODE)


def _worker_main(config, rank: int, backend: str, shm_name: str, wake, done) -> None:
    """Body of a worker process (rank >= 1): join the group, build the runner, serve rank 0's calls.
    `wake` / `done`: this worker's ends of its two pipes (read / write)."""
    import multiprocessing as mp
    import signal
    from multiprocessing.shared_memory import SharedMemory

    # Owned by rank 0 from the first line: when rank 0 dies (a crash, SIGKILL, a signal in the middle of
    # start-up) the kernel kills this worker too. Its pipe only tells a worker that reads it; one still joining
    # the group or building its runner would otherwise wait out the start-up timeout (minutes) with the
    # shared memory held.
    die_with_parent(mp.parent_process().pid)
    # Ctrl-C is rank 0's to handle: it then tells the workers to exit (or they see its pipe close).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    world = config.tensor_parallel_size
    shm = channel = runner = None
    failed = False
    try:
        shm = SharedMemory(name=shm_name)
        channel = _Channel(shm, world)
        _fail_point("start")
        if backend == "nccl":
            torch.cuda.set_device(rank)
        else:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        start_s = start_timeout_s(config)
        store = connect_store(config.dist_init_addr, world, start_s)
        _fail_point("join")
        init_group(backend, store, world, rank, start_s)
        done.send_bytes(b"j")  # joined
        _fail_point("runner")
        runner = ModelRunner(config, rank)
        done.send_bytes(b"r")  # ready
        set_group_timeout(config.dist_timeout_s)
        while True:
            try:
                wake.recv_bytes()
            except EOFError:
                return  # rank 0 is gone: nobody will ever call again
            call_no, msg = channel.read_call()
            if msg == EXIT:
                return
            if isinstance(msg, RankQuery):
                channel.write_reply(rank, call_no, ("ok", msg.fn(runner)))
            else:
                runner.execute(msg)  # a BatchPlan: the same step rank 0 runs, on this rank's shard
            done.send_bytes(b"d")
    except BaseException as exc:  # noqa: BLE001 - report anything, then die with a non-zero code
        failed = True
        traceback.print_exc()
        if channel is not None:
            try:
                channel.write_reply(rank, _ERROR_CALL, ("error", _error_text(exc)))
            except Exception:
                pass
    finally:
        if runner is not None and not failed:
            try:
                runner.exit()
            except Exception:
                pass
        destroy_group(abort=failed)
        if shm is not None:
            channel = None
            try:
                shm.close()
            except Exception:
                pass
    if failed:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


# --- the rank 0 side ---------------------------------------------------------------------------------
class TensorParallel:
    """Rank 0's handle on the workers: spawns them, joins the group with them, broadcasts runner calls,
    notices when one dies, and cleans everything up (idempotently) on exit or failure."""

    JOIN_TIMEOUT_S = 10.0

    def __init__(self, config, device: torch.device):
        from multiprocessing.shared_memory import SharedMemory

        import torch.multiprocessing as mp

        self.world = n = config.tensor_parallel_size
        self.timeout_s = float(config.dist_timeout_s)
        self.start_timeout_s = start_timeout_s(config)
        self.shm_name = config.shm_name
        self.shm_size = config.shm_size
        self.backend = backend = collective_backend(device)
        self.procs: list = []
        self.wake: list = []  # rank 0's write ends, one per worker
        self.done: list = []  # rank 0's read ends
        self._pending: list[bool] = []  # a `done` is owed by this worker
        self._stages: list[str | None] = []  # what each worker is doing during start-up (None: serving calls)
        self.shm = None
        self.channel: _Channel | None = None
        self.store = None
        self._watched: WatchedStore | None = None
        self.call_no = 0
        self.closed = False
        self.broken: str | None = None
        if dist.is_initialized():
            raise ValueError("tensor_parallel_size: this process already has a torch.distributed process group "
                             "(another tensor-parallel engine still running?); exit it first or run this engine "
                             "in its own process")
        if device.type == "cuda" and torch.cuda.device_count() < n:
            raise ValueError(f"tensor_parallel_size: {n} ranks need {n} GPUs, {torch.cuda.device_count()} visible")
        atexit.register(self.shutdown)
        try:
            # The rendezvous socket first: a bad or taken address is refused before anything else exists.
            self.store, config.dist_init_addr = serve_store(config.dist_init_addr, n, self.start_timeout_s)
            for key, value in {**NCCL_SAFETY_ENV, **socket_env(config.dist_init_addr)}.items():
                os.environ.setdefault(key, value)  # inherited by every spawned worker
            try:
                self.shm = SharedMemory(name=self.shm_name, create=True, size=self.shm_size)
            except FileExistsError:
                raise ValueError(f"shm_name: shared memory {self.shm_name!r} already exists (another engine uses "
                                 "it); leave shm_name unset for a unique one") from None
            self.channel = _Channel(self.shm, n)
            self._spawn(config, device, mp.get_context("spawn"))
            if device.type == "cuda":
                torch.cuda.set_device(0)
            # gloo waits in the store for every worker's address: watch the workers meanwhile. NCCL's
            # init_process_group does not wait (it connects at the first collective): plain store.
            store = self.store
            if backend == "gloo":
                store = self._watched = WatchedStore(self.store, self._raise_if_a_worker_died, self.start_timeout_s)
            try:
                init_group(backend, store, n, 0, self.start_timeout_s)
            except Exception as exc:
                raise self.fail("joining the process group", exc) from exc
            self._wait_done(_JOINING, self.start_timeout_s)
            self._pending = [True] * (n - 1)  # each worker's "ready"
        except BaseException:
            self.shutdown(graceful=False)
            raise

    def _spawn(self, config, device: torch.device, ctx) -> None:
        worker_config = copy.copy(config)
        worker_config.tracer = None
        worker_config.device = device.type
        for rank in range(1, self.world):
            wake_r, wake_w = ctx.Pipe(duplex=False)
            done_r, done_w = ctx.Pipe(duplex=False)
            self.wake.append(wake_w)
            self.done.append(done_r)
            self._pending.append(True)  # its "joined"
            self._stages.append(_JOINING)
            p = ctx.Process(target=_worker_main, name=f"labkit-tp{rank}",
                            args=(worker_config, rank, self.backend, self.shm_name, wake_r, done_w))
            try:
                p.start()
            finally:
                # Only the worker may hold its ends: then its death reads as EOF / a broken pipe here.
                wake_r.close()
                done_w.close()
            self.procs.append(p)

    # --- liveness ---------------------------------------------------------------------------------
    def _dead(self, grace_s: float = 0.0) -> list[tuple[int, int]]:
        deadline = time.monotonic() + grace_s
        while True:
            dead = [(rank, p.exitcode) for rank, p in enumerate(self.procs, 1) if p.exitcode is not None]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.02)

    def _raise_if_a_worker_died(self) -> None:
        """WatchedStore's check: ends the rendezvous at once (fail() then names the worker)."""
        if self._dead():
            raise RuntimeError("a tensor parallel worker died during the rendezvous")

    def _received(self, rank: int, message: bytes) -> None:
        if message in _STAGE_AFTER:
            self._stages[rank - 1] = _STAGE_AFTER[message]

    def _death_message(self, dead: list[tuple[int, int]]) -> str:
        rank, code = dead[0]
        # How far it got by its own account: rank 0 may not have read its last messages yet (a worker
        # can finish joining and die while rank 0 is still inside init_process_group).
        try:
            while self.done[rank - 1].poll():
                self._received(rank, self.done[rank - 1].recv_bytes())
        except (EOFError, OSError):
            pass
        msg = f"tensor parallel worker rank {rank} died (exit code {code})"
        if self._stages[rank - 1] is not None:
            msg += f" while {self._stages[rank - 1]}"
        call_no, reply = self.channel.read_reply(rank) if self.channel is not None else (0, None)
        if call_no == _ERROR_CALL and isinstance(reply, tuple) and reply[0] == "error":
            msg += f": {reply[1]}"
        return msg

    def fail(self, what: str, exc: BaseException | None = None) -> RuntimeError:
        """Tear everything down after a failure and return the error to raise."""
        # A worker that dies closes its sockets (failing our collective) a moment before it can be reaped;
        # a loaded machine can stretch that moment.
        dead = self._dead(grace_s=3.0 if exc is not None else 0.0)
        if dead:
            msg = self._death_message(dead)
        elif exc is not None:
            msg = f"tensor parallel: {what} failed on rank 0 ({_error_text(exc)}); the workers were stopped"
        else:
            msg = f"tensor parallel: {what}; the workers were stopped"
        if exc is not None:
            # The failed call's frames hold the store (torch's init_process_group) or tensors: let them go
            # now, not when the caller drops this error, so that the rendezvous port is closed on return.
            traceback.clear_frames(exc.__traceback__)
        self.broken = msg
        self.shutdown(graceful=False)
        return RuntimeError(msg)

    def check_alive(self) -> None:
        if self.broken is not None:
            raise RuntimeError(self.broken)
        if self.closed:
            raise RuntimeError("tensor parallel: the engine has exited")
        dead = self._dead()
        if dead:
            raise self._raise_dead(dead)

    def _raise_dead(self, dead) -> RuntimeError:
        msg = self._death_message(dead)
        self.broken = msg
        self.shutdown(graceful=False)
        return RuntimeError(msg)

    def _wait_done(self, what: str, timeout_s: float | None = None) -> None:
        """Collect every worker's `done` for the outstanding call (one message each)."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        for rank, conn in enumerate(self.done, 1):
            if not self._pending[rank - 1]:
                continue
            while True:
                try:
                    if conn.poll(0.05):
                        self._received(rank, conn.recv_bytes())
                        break
                except (EOFError, OSError):
                    raise self._raise_dead(self._dead(grace_s=5.0) or [(rank, None)]) from None
                dead = self._dead()
                if dead:
                    raise self._raise_dead(dead)
                if time.monotonic() > deadline:
                    raise self.fail(f"worker rank {rank} did not finish {what} within {limit:g} s"
                                    + (" (dist_timeout_s)" if timeout_s is None else ""))
            self._pending[rank - 1] = False

    def _post(self, payload: bytes) -> None:
        self.call_no = (self.call_no + 1) % _ERROR_CALL
        self.channel.write_call(payload, self.call_no)
        for rank, conn in enumerate(self.wake, 1):
            try:
                conn.send_bytes(b"w")
            except OSError:  # BrokenPipeError: the worker is gone
                raise self._raise_dead(self._dead(grace_s=5.0) or [(rank, None)]) from None
            self._pending[rank - 1] = True

    # --- calls ------------------------------------------------------------------------------------
    def execute(self, plan, local):
        """Run `plan` (a BatchPlan's worker view) on every worker and `local()` (rank 0's part) here."""
        return self._call(plan, local)

    def ask(self, fn: Callable) -> list:
        """fn(runner) on every worker: their answers, rank 1 first."""
        self._call(RankQuery(fn), None)
        what = getattr(fn, "__name__", "a query")
        self._wait_done(f"the {what!r} query")
        answers = []
        for rank in range(1, self.world):
            call_no, value = self.channel.read_reply(rank)
            if call_no != self.call_no or not isinstance(value, tuple):
                raise self.fail(f"worker rank {rank} answered {what!r} with no reply")
            if value[0] != "ok":
                raise self.fail(f"worker rank {rank} could not answer {what!r}: {value[1]}")
            answers.append(value[1])
        return answers

    def _call(self, msg, local):
        self.check_alive()
        payload = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        what = type(msg).__name__
        if len(payload) > self.channel.capacity:
            raise ValueError(f"shm_size: a {what} needs {len(payload)} bytes of shared memory but "
                             f"shm_size={self.shm_size} leaves {self.channel.capacity} bytes for a call "
                             f"(the rest holds {self.world - 1} reply slot(s) of {REPLY_SLOT_BYTES}); "
                             "raise shm_size")
        self._wait_done("the previous call")
        self._post(payload)
        if local is None:
            return None
        try:
            return local()
        except Exception as exc:
            raise self.fail(f"the {what} call", exc) from exc
        except BaseException:  # KeyboardInterrupt mid-call: the ranks are out of step for good
            self.broken = f"tensor parallel: the {what} call was interrupted; the workers were stopped"
            self.shutdown(graceful=False)
            raise

    def wait_ready(self) -> None:
        """After rank 0 built its runner: wait for the workers' runners, then leave start-up."""
        self._wait_done("building its model runner", self.start_timeout_s)
        set_group_timeout(self.timeout_s)
        if self._watched is not None:
            self._watched.unwatch()

    # --- exit -------------------------------------------------------------------------------------
    def shutdown(self, graceful: bool = True) -> None:
        """Stop the workers, destroy the process group, close the store, close and unlink the shared
        memory. Idempotent."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.shutdown)
        try:
            if graceful and self.procs and self.broken is None and not self._dead():
                try:
                    self._wait_done("the previous call", timeout_s=min(self.timeout_s, self.JOIN_TIMEOUT_S))
                    self._post(pickle.dumps(EXIT))
                except Exception:
                    graceful = False
            for p in self.procs:
                p.join(self.JOIN_TIMEOUT_S if graceful else 0.5)
            for p in self.procs:
                if p.is_alive():
                    p.terminate()
                    p.join(1.0)
                if p.is_alive():
                    p.kill()
                    p.join(2.0)
        finally:
            for conn in self.wake + self.done:
                conn.close()
            destroy_group(abort=not graceful or self.broken is not None)
            if self._watched is not None:
                self._watched.unwatch()  # it points back here
            self.store = self._watched = None
            set_tp(0, 1)
            self.channel = None
            if self.shm is not None:
                try:
                    self.shm.close()
                except Exception:
                    pass
                try:
                    self.shm.unlink()
                except FileNotFoundError:
                    pass
                self.shm = None
