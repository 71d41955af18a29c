"""Tensor parallel on the CPU (gloo): TP=2 against TP=1 on the tiny model, every traced case with two
ranks, a killed worker, a worker dying at start-up (and the engines after it), sockets on loopback only,
two engines side by side, the shared-memory limit, and `labkit shapes`."""
from __future__ import annotations

import gc
import json
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import torch.distributed as dist

from engine import LLM, SamplingParams
from engine.config import Config, free_port
from engine.distributed import tp_size
from engine.rendezvous import START_TIMEOUT_FLOOR_S
from engine.sampler import TeacherForcing
from engine.sequence import Sequence
from engine.step_result import StepFailed
from engine.tp_workers import FAIL_ENV, TensorParallel
from labkit.trace.cases import list_cases, load_case
from labkit.trace.run import run_case
from labkit.trace.validate import validate

REPO = Path(__file__).resolve().parents[1]
# A tensor parallel bug tends to hang rather than fail: bound every test here well below the suite's limit.
pytestmark = pytest.mark.timeout(120)
SMALL = dict(device="cpu", enforce_eager=True, max_model_len=512, max_num_batched_tokens=256, max_num_seqs=8,
             kvcache_block_size=16, num_kvcache_blocks=64)
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _prompts():
    # A prompt longer than the budget (chunked prefill), two sharing a prefix (prefix cache), a short one.
    shared = list(range(200, 296))
    return [list(range(100, 400)), shared + [7, 8, 9], shared + [10, 11, 12, 13], [42, 43, 44]]


@pytest.fixture(scope="module")
def tp1_tokens(tiny_model):
    llm = LLM(tiny_model, **SMALL)
    try:
        return [o["token_ids"] for o in llm.generate(_prompts(), GREEDY, use_tqdm=False)]
    finally:
        llm.exit()


def _shm_exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm/{name}")


def listening_addresses(pid: int) -> list[str]:
    """"HOST:PORT" of every TCP socket process `pid` listens on (its /proc fd links matched against the
    kernel's socket tables)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: TCP_LISTEN
                    found.append(_proc_address(cols[1]))
    return found


def _proc_address(hex_addr: str) -> str:
    import ipaddress

    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    # /proc prints the address as 32-bit words in host (little-endian) order.
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return f"{ip}:{int(port, 16)}"


def _is_loopback(address: str) -> bool:
    import ipaddress

    return ipaddress.ip_address(address.rpartition(":")[0]).is_loopback


def _nothing_listens_on(addr: str) -> bool:
    import socket

    host, _, port = addr.rpartition(":")
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) != 0


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"  # a zombie holds no resources (and is reaped by join)
    except FileNotFoundError:
        return True


def test_tp2_greedy_tokens_equal_tp1(tiny_model, tp1_tokens):
    llm = LLM(tiny_model, tensor_parallel_size=2, **SMALL)
    try:
        name = llm.config.shm_name
        assert _shm_exists(name)
        outs = llm.generate(_prompts(), GREEDY, use_tqdm=False)
        assert [o["token_ids"] for o in outs] == tp1_tokens
        mem = llm.peak_memory_per_rank()
        assert [m["rank"] for m in mem] == [0, 1] and all(m["peak_bytes"] > 0 for m in mem)
        pids = [p.pid for p in llm.executor.tp.procs]
        addr = llm.config.dist_init_addr  # the free loopback port the engine bound
        assert addr.startswith("127.0.0.1:") and not _nothing_listens_on(addr)
    finally:
        llm.exit()
    llm.exit()  # idempotent
    assert not _shm_exists(name) and all(_gone(pid) for pid in pids) and _nothing_listens_on(addr)


def _forced_logits(llm, prompts, steps=4):
    """Teacher forcing: feed token 100+step on every step; return each step's logits rows."""
    rows = []

    def choose(plan, logits):
        if plan.sample_rows:  # (a chunk alone samples nothing)
            rows.append(logits.float().clone())
        return [100 + len(rows) for _ in plan.sample_rows]

    llm.sampling = TeacherForcing(choose)
    for p in prompts:
        llm.add_request(p, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
    while not llm.is_finished():
        llm.step()
    return rows


def test_teacher_forced_logits_tp2_match_tp1(tiny_model):
    prompts = _prompts()
    a = LLM(tiny_model, **SMALL)
    try:
        ref = _forced_logits(a, prompts)
    finally:
        a.exit()
    b = LLM(tiny_model, tensor_parallel_size=2, **SMALL)
    try:
        got = _forced_logits(b, prompts)
    finally:
        b.exit()
    assert len(ref) == len(got) > 3
    for r, g in zip(ref, got):
        assert r.shape == g.shape and r.shape[1] == 2048
        assert (r - g).abs().max().item() < 1e-4


# Four cases cover what two ranks change (shapes, chunks, preemption, the balanced policy's alternation) in
# the default run; the slow run (CI) takes every case.
TP_QUICK_CASES = ("lifecycle", "chunk", "preempt", "balanced")


@pytest.mark.parametrize("name", [n if n in TP_QUICK_CASES else pytest.param(n, marks=pytest.mark.slow)
                                  for n in list_cases()])
def test_every_case_passes_with_two_ranks(name, tiny_model, tmp_path):
    case = load_case(name)
    run = run_case(case, Path(tiny_model), tmp_path / "events.jsonl", device="cpu", tensor_parallel_size=2,
                   shapes=name == "lifecycle")
    report = validate(run.events, case)
    assert report.ok, report.first_failure.message if report.first_failure else report.summary()
    start = next(e for e in run.events if e["event"] == "run_start")
    assert start["tp_size"] == 2 and start["tp_rank"] == 0 and start["config"]["tensor_parallel_size"] == 2
    if name == "lifecycle":  # rank 0's shapes: half the heads, half the vocabulary, half the KV
        step1 = {e["module"]: e for e in run.events if e["event"] == "model_shape" and e["step"] == 1}
        assert step1["qkv_proj"]["shape"] == [160, (2 + 2 * 1) * 32] and step1["qkv_proj"]["tp_size"] == 2
        assert step1["q"]["shape"] == [160, 2, 32] and step1["k"]["shape"] == [160, 1, 32]
        assert step1["gate_up_proj"]["shape"] == [160, 256] and step1["o_proj"]["shape"] == [160, 128]
        assert step1["logits"]["shape"] == [2, 2048] and step1["logits_shard"]["shape"] == [2, 1024]
        assert start["kv_bytes_per_token"] == 2 * 2 * 1 * 32 * 4


def test_a_killed_worker_raises_a_clear_error_and_leaves_nothing(tiny_model):
    llm = LLM(tiny_model, tensor_parallel_size=2, dist_timeout_s=120, **SMALL)
    name, proc = llm.config.shm_name, llm.executor.tp.procs[0]
    try:
        llm.add_request([5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        llm.step()
        os.kill(proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=r"tensor parallel worker rank 1 died \(exit code -9\)"):
            llm.step()
        assert time.monotonic() - t0 < 60  # seen as a death, not by waiting out the 120 s timeout
        assert not _shm_exists(name) and _gone(proc.pid)
        assert not [p for p in multiprocessing.active_children() if p.name.startswith("labkit-tp")]
        with pytest.raises(RuntimeError, match="rank 1 died"):  # the engine stays failed, it never hangs
            llm.step()
    finally:
        llm.exit()
    llm.exit()


def test_a_worker_dying_inside_a_collective_is_named_too(tiny_model, monkeypatch):
    # The worker dies after rank 0 has woken it: rank 0's collective fails (gloo: connection closed by
    # peer) and the engine still names the dead rank rather than passing the gloo error on.
    llm = LLM(tiny_model, tensor_parallel_size=2, dist_timeout_s=20, **SMALL)
    runner, proc, name = llm.model_runner, llm.executor.tp.procs[0], llm.config.shm_name
    try:
        llm.add_request([5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        llm.step()

        def dies_first(method):
            def call(*args):
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(5)
                return method(*args)
            return call

        # Rank 0's part of the next step (with async scheduling, of the step after it, whose failure the next
        # step() raises): the worker is gone by the time rank 0 enters the collective.
        monkeypatch.setattr(runner, "execute", dies_first(runner.execute))
        with pytest.raises(RuntimeError, match=r"tensor parallel worker rank 1 died \(exit code -9\)"):
            llm.step()
            llm.step()
        assert not _shm_exists(name)
    finally:
        llm.exit()


@pytest.mark.slow
def test_a_hung_worker_turns_into_an_error_after_dist_timeout_s(tiny_model):
    llm = LLM(tiny_model, tensor_parallel_size=2, dist_timeout_s=3, **SMALL)
    proc, name = llm.executor.tp.procs[0], llm.config.shm_name
    try:
        llm.add_request([5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        llm.step()
        os.kill(proc.pid, signal.SIGSTOP)  # alive, but never answers
        t0 = time.monotonic()
        # Depending on whether the stop lands before or after the worker acknowledged the last call, rank 0
        # notices it in the collective or while waiting for that acknowledgement: both name the timeout.
        # (With async scheduling the call in flight may be the step launched ahead: the next step() raises.)
        with pytest.raises(RuntimeError, match=r"(the \w+ call failed on rank 0|did not finish the previous "
                                               r"call within 3 s \(dist_timeout_s\)).*workers were stopped"):
            llm.step()
        assert time.monotonic() - t0 < 3 + 30  # dist_timeout_s took effect (the default is 60 s)
        assert not _shm_exists(name) and _gone(proc.pid)
    finally:
        if proc.exitcode is None:
            os.kill(proc.pid, signal.SIGKILL)
        llm.exit()


_RANK0 = textwrap.dedent("""
    import json, sys, time
    from engine import LLM
    if __name__ == "__main__":
        llm = LLM(sys.argv[1], tensor_parallel_size=2, **json.loads(sys.argv[2]))
        print(json.dumps({"shm_name": llm.config.shm_name, "pids": [p.pid for p in llm.executor.tp.procs],
                          "addr": llm.config.dist_init_addr}), flush=True)
        time.sleep(120)
""")


def test_an_engine_listens_on_loopback_only_and_its_workers_leave_when_rank_0_is_killed(tiny_model, tmp_path):
    # Rank 0 in a process of its own, so that every listening socket there is the engine's.
    script = tmp_path / "rank0.py"
    script.write_text(_RANK0)
    rank0 = subprocess.Popen([sys.executable, str(script), tiny_model, json.dumps(SMALL)], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    try:
        info = json.loads(rank0.stdout.readline())
        listening = {pid: listening_addresses(pid) for pid in [rank0.pid] + info["pids"]}
    finally:
        rank0.kill()
        rank0.wait()
    # The rendezvous store on rank 0, gloo's sockets on every rank: all on loopback, none on *:PORT.
    assert info["addr"] in listening[rank0.pid] and all(listening.values()), listening
    assert all(_is_loopback(a) for addrs in listening.values() for a in addrs), listening
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the worker sees its pipe close; Python's resource tracker unlinks
        if all(_gone(pid) for pid in info["pids"]) and not _shm_exists(info["shm_name"]):
            break
        time.sleep(0.1)
    assert all(_gone(pid) for pid in info["pids"]) and not _shm_exists(info["shm_name"])


_RANK0_STARTING = textwrap.dedent("""
    import json, sys
    from engine import LLM
    if __name__ == "__main__":
        LLM(sys.argv[1], tensor_parallel_size=2, **json.loads(sys.argv[2]))  # its workers never get ready
""")


def _spawned_children(pid: int) -> list[int]:
    """Processes multiprocessing spawned from `pid` (not its resource tracker)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
            continue
        if ppid == pid and b"spawn_main" in cmd and b"resource_tracker" not in cmd:
            found.append(int(entry))
    return found


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_worker_still_starting_dies_with_rank_0_and_leaves_no_shared_memory(tiny_model, tmp_path, sig):
    """Rank 0 killed while its worker is still in start-up (here: it never gets ready): the worker must not
    wait out the start-up timeout (it did, for about 10 minutes, holding the shared memory)."""
    script = tmp_path / "rank0.py"
    script.write_text(_RANK0_STARTING)
    env = {**os.environ, FAIL_ENV: "runner:hang"}
    rank0 = subprocess.Popen([sys.executable, str(script), tiny_model, json.dumps(SMALL)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not (workers := _spawned_children(rank0.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert workers, "no worker started"
        shm = [n for n in os.listdir("/dev/shm") if n.startswith(f"labkit-{rank0.pid}-")]
        time.sleep(2)  # well into its start-up (connected, joining, or hung before its runner)
        assert rank0.poll() is None and not any(_gone(p) for p in workers)
        os.kill(rank0.pid, sig)
        rank0.wait(timeout=30)
    finally:
        if rank0.poll() is None:
            rank0.kill()
            rank0.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (all(_gone(p) for p in workers) and not any(map(_shm_exists, shm))):
        time.sleep(0.1)
    assert all(_gone(p) for p in workers), "a worker outlived rank 0"
    assert not any(map(_shm_exists, shm)), shm


def _fails_on_workers(runner):
    if runner.rank:
        raise ZeroDivisionError("planted on a worker")
    return runner.rank


def test_a_worker_error_is_quoted(tiny_model):
    llm = LLM(tiny_model, tensor_parallel_size=2, **SMALL)
    try:
        with pytest.raises(RuntimeError, match=r"rank 1 died \(exit code 1\): ZeroDivisionError: planted on a worker"):
            llm.executor.per_rank(_fails_on_workers)
    finally:
        llm.exit()
    assert not _shm_exists(llm.config.shm_name)


# A worker failing at start-up, through FAIL_ENV (engine/tp_workers.py): vanishing before it reaches the
# store, vanishing once there (rank 0 is then inside init_process_group, waiting for its address), and
# raising while it builds its runner (rank 0 is then in a collective with it).
_START_FAILURES = {
    "start:exit": r"died \(exit code 3\) while joining the process group$",
    "join:exit": r"died \(exit code 3\) while joining the process group$",
    "runner": rf"died \(exit code 1\) while building the model runner: RuntimeError: {FAIL_ENV}=runner: failing",
}


def _fails_to_start_and_leaves_nothing(tiny_model, monkeypatch, hook: str) -> str:
    """Start a TP=2 engine whose worker fails at `hook`; check the error and that nothing is left behind.
    Returns the rendezvous address it used."""
    excepthook = sys.excepthook
    addr, shm = f"127.0.0.1:{free_port()}", f"labkit-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(FAIL_ENV, hook)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"^tensor parallel worker rank 1 {_START_FAILURES[hook]}"):
        LLM(tiny_model, tensor_parallel_size=2, dist_init_addr=addr, shm_name=shm, **SMALL)
    monkeypatch.delenv(FAIL_ENV)
    # Not by a timeout (the start-up one is START_TIMEOUT_FLOOR_S, 300 s, for the default dist_timeout_s of
    # 60 s): the time is the worker's spawn and imports, 1-20 s depending on the machine's load.
    assert time.monotonic() - t0 < START_TIMEOUT_FLOOR_S / 3
    assert not dist.is_initialized() and tp_size() == 1
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("labkit-tp")]
    assert not _shm_exists(shm) and _nothing_listens_on(addr)
    # Nothing holds on to the failed engine's handle (an atexit hook would, until the interpreter exits).
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is TensorParallel and o.shm_name == shm]
    assert sys.excepthook is excepthook
    return addr


@pytest.mark.parametrize("hook", ["start:exit", "runner"])
def test_a_worker_dying_at_start_up_is_reported_at_once_and_leaves_nothing(tiny_model, monkeypatch, hook):
    _fails_to_start_and_leaves_nothing(tiny_model, monkeypatch, hook)


def test_after_a_failed_start_the_next_engines_start_and_generate(tiny_model, tp1_tokens, monkeypatch):
    # torch numbers the default group before creating it and kept the number of a failed one: the next TP
    # engine in the process then looked for its fresh workers under another name until the timeout, and
    # so did every later one.
    addr = _fails_to_start_and_leaves_nothing(tiny_model, monkeypatch, "join:exit")
    for tp in (2, 1):
        llm = LLM(tiny_model, tensor_parallel_size=tp, dist_init_addr=addr, **SMALL)  # the port is free again
        try:
            assert [o["token_ids"] for o in llm.generate(_prompts(), GREEDY, use_tqdm=False)] == tp1_tokens
        finally:
            llm.exit()


_OTHER_ENGINE = textwrap.dedent("""
    import json, sys
    from engine import LLM, SamplingParams
    if __name__ == "__main__":
        llm = LLM(sys.argv[1], tensor_parallel_size=2, **json.loads(sys.argv[2]))
        print(json.dumps({"shm_name": llm.config.shm_name, "addr": llm.config.dist_init_addr}), flush=True)
        sys.stdin.readline()  # the other engine runs while this one is up
        outs = llm.generate(json.loads(sys.argv[3]), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                            use_tqdm=False)
        llm.exit()
        print(json.dumps([o["token_ids"] for o in outs]), flush=True)
""")


@pytest.mark.slow
def test_two_tp_engines_with_default_isolation_run_at_once(tiny_model, tp1_tokens, tmp_path):
    script = tmp_path / "other.py"
    script.write_text(_OTHER_ENGINE)
    a = LLM(tiny_model, tensor_parallel_size=2, **SMALL)
    other = subprocess.Popen([sys.executable, str(script), tiny_model, json.dumps(SMALL), json.dumps(_prompts())],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        b = json.loads(other.stdout.readline())
        assert b["shm_name"] != a.config.shm_name and b["addr"] != a.config.dist_init_addr
        assert _shm_exists(a.config.shm_name) and _shm_exists(b["shm_name"])
        assert [o["token_ids"] for o in a.generate(_prompts(), GREEDY, use_tqdm=False)] == tp1_tokens
        other.stdin.write("go\n")
        other.stdin.flush()
        assert json.loads(other.stdout.readline()) == tp1_tokens
        assert other.wait(60) == 0
        # One default process group per process: a second TP engine here is refused, clearly.
        with pytest.raises(ValueError, match="tensor_parallel_size: this process already has"):
            LLM(tiny_model, tensor_parallel_size=2, **SMALL)
        assert [o["token_ids"] for o in a.generate(_prompts(), GREEDY, use_tqdm=False)] == tp1_tokens
    finally:
        if other.poll() is None:
            other.kill()
        a.exit()
    assert not _shm_exists(a.config.shm_name) and not _shm_exists(b["shm_name"])


def test_an_address_or_name_in_use_is_refused_before_any_worker_starts(tiny_model):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ValueError, match=f"dist_init_addr: {addr} is already in use"):
            LLM(tiny_model, tensor_parallel_size=2, dist_init_addr=addr, **SMALL)
    with pytest.raises(ValueError, match="dist_init_addr: cannot listen on 192.0.2.1:0"):  # not this host's
        LLM(tiny_model, tensor_parallel_size=2, dist_init_addr="192.0.2.1:0", **SMALL)
    from multiprocessing.shared_memory import SharedMemory

    shm = SharedMemory(create=True, size=4096)
    try:
        with pytest.raises(ValueError, match=f"shm_name: shared memory '{shm.name.lstrip('/')}' already exists"):
            LLM(tiny_model, tensor_parallel_size=2, shm_name=shm.name.lstrip("/"), **SMALL)
    finally:
        shm.close()
        shm.unlink()
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("labkit-tp")]


def test_a_call_larger_than_the_shared_memory_is_refused(tiny_model):
    kw = {**SMALL, "max_model_len": 2048, "max_num_batched_tokens": 2048, "num_kvcache_blocks": 160}
    llm = LLM(tiny_model, tensor_parallel_size=2, shm_size=8192, **kw)
    name = llm.config.shm_name
    try:
        llm.add_request([100 + i % 1900 for i in range(1500)], SamplingParams(max_tokens=1))
        with pytest.raises(StepFailed, match=r"shm_size: a BatchPlan needs \d+ bytes .*shm_size=8192") as info:
            llm.step()
        assert not info.value.fatal and llm.is_finished()  # the request was taken out, its blocks freed
    finally:
        llm.exit()
    assert not _shm_exists(name)


def test_config_checks_divisibility_and_picks_unique_isolation(tiny_model):
    with pytest.raises(ValueError, match=r"tensor_parallel_size: num_key_value_heads \(2\) is not divisible by 4"):
        Config(tiny_model, tensor_parallel_size=4)
    with pytest.raises(ValueError, match=r"tensor_parallel_size: num_attention_heads \(4\) is not divisible by 3"):
        Config(tiny_model, tensor_parallel_size=3)
    with pytest.raises(ValueError, match="shm_size: must be at least"):
        Config(tiny_model, tensor_parallel_size=2, shm_size=4096)
    for bad in ("nowhere", "127.0.0.1:65536", ":80", "[::1]"):
        with pytest.raises(ValueError, match="dist_init_addr: expected HOST:PORT"):
            Config(tiny_model, dist_init_addr=bad)
    assert Config(tiny_model, dist_init_addr="[::1]:0").dist_init_addr == "[::1]:0"
    a, b = Config(tiny_model, tensor_parallel_size=2), Config(tiny_model, tensor_parallel_size=2)
    assert a.shm_name != b.shm_name and a.shm_name.startswith(f"labkit-{os.getpid()}-")
    # No port is picked (and left to race) in Config: the engine binds one when it starts.
    assert a.dist_init_addr is None and a.shm_size == 1 << 20 and a.dist_timeout_s == 60


def test_a_plan_travels_to_the_workers_without_its_sampling_settings_or_sequences(tiny_model):
    """The workers get the step as data: what to compute, never rank 0's Sequence objects or sampling settings."""
    from engine.scheduler import Scheduler

    cfg = Config(tiny_model, kvcache_block_size=256, num_kvcache_blocks=8)
    sched = Scheduler(cfg)
    seq = Sequence(list(range(1000)), SamplingParams(temperature=0.7, seed=3), 3, 256)
    sched.add(seq)
    plan = sched.schedule()
    w = pickle.loads(pickle.dumps(plan.for_workers()))
    assert (w.seq_ids, w.starts, w.num_new, w.num_tokens, w.block_tables) == ([3], [0], [1000], [1000], [[0, 1, 2, 3]])
    assert w.input_ids == list(range(1000)) and w.sampling is None and not hasattr(w, "seqs") and w.samples == [True]
    sched.commit(plan, [7])
    plan = sched.schedule()  # decode: one known token a row
    data = pickle.dumps(plan.for_workers())
    assert len(data) < 200 and pickle.loads(data).input_ids == [7]


def test_shapes_command_static_and_checked(tmp_path, capsys):
    from labkit import cli

    out = tmp_path / "static.json"
    with pytest.raises(SystemExit) as done:
        cli.main(["shapes", "--tensor-parallel-size", "2", "--preset", "qwen3-0.6b", "--out", str(out)])
    assert done.value.code in (0, None)
    data = json.loads(out.read_text())
    table = data["table"]
    assert data["evidence"] == "static-estimate" and data["command"] == "shapes"
    assert table["params"]["model.layers.N.self_attn.qkv_proj.weight"]["rank"] == [2048, 1024]
    assert table["params"]["model.layers.N.self_attn.o_proj.weight"]["rank"] == [1024, 1024]
    assert table["params"]["model.layers.N.mlp.gate_up_proj.weight"]["rank"] == [3072, 1024]
    assert table["params"]["model.layers.N.mlp.down_proj.weight"]["rank"] == [1024, 1536]
    assert table["params"]["model.embed_tokens.weight"]["rank"] == [75968, 1024]
    assert table["heads"]["q"]["rank"] == 8 and table["heads"]["kv"]["rank"] == 4
    assert table["kv_bytes_per_token"]["rank"] == 56 * 1024
    assert table["activations"]["logits_shard"] == ["N", 75968]
    with pytest.raises(SystemExit) as done:
        cli.main(["shapes", "--tensor-parallel-size", "4", "--preset", "tiny", "--out", str(tmp_path / "bad.json")])
    assert done.value.code == 2 and "tensor_parallel_size" in capsys.readouterr().err


def test_shapes_check_on_tiny_compares_every_rank(tiny_model, tmp_path):
    out = tmp_path / "check.json"
    res = subprocess.run([sys.executable, "-m", "labkit", "shapes", "--tensor-parallel-size", "2", "--check",
                          "--model", tiny_model,
                          "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    assert data["evidence"] == "cpu-executed" and data["passed"] is True and out.with_suffix(".md").is_file()
    assert [r["rank"] for r in data["ranks"]] == [0, 1] and all(c["passed"] for c in data["checks"])
    assert data["ranks"][1]["kv_cache"] == [2, 2, 4, 1, 16, 32]


def test_shapes_check_catches_a_mismatch():
    from labkit.fake_model import preset_config
    from labkit.shapes import compare, per_rank_shapes

    expected = per_rank_shapes(preset_config("tiny"), 2)
    rank = {"rank": 0, "tp_size": 2, "layers_uniform": True, "num_heads": 2, "num_kv_heads": 2, "head_dim": 32,
            "kv_bytes_per_token": 512, "kv_cache": [2, 2, 4, 1, 16, 32],
            "params": {k: v["rank"] for k, v in expected["params"].items()}}
    bad = [c for c in compare(expected, [rank, {**rank, "rank": 1}], 4, 16) if not c["passed"]]
    assert [(c["rank"], c["what"]) for c in bad] == [(0, "kv heads"), (1, "kv heads")]


@pytest.mark.slow
def test_async_scheduling_with_two_ranks_changes_no_step(tiny_model, monkeypatch):
    """Planned steps run on both ranks (rank 0 broadcasts the ids they read); kept or thrown away, every step and
    every token is what the same engine computes without async scheduling. (Rank 0 decides what is scheduled
    ahead: as on a GPU, decode steps replay graphs there.)"""
    import random

    from tests.conftest import replay_graphs

    replay_graphs(monkeypatch, "decodes")

    rng = random.Random(7)
    requests = [([rng.randrange(1, 250) for _ in range(rng.randrange(2, 40))],
                 SamplingParams(max_tokens=rng.randrange(2, 12), temperature=1.0)) for _ in range(6)]

    def run(async_scheduling, eos):
        llm = LLM(tiny_model, tensor_parallel_size=2, async_scheduling=async_scheduling, **SMALL)
        try:
            if eos is not None:
                llm.scheduler.eos = eos  # a token sampled often: some plans go wrong
            ids = [llm.add_request(p, sp) for p, sp in requests]
            steps = []
            while not llm.is_finished():
                r = llm.step()
                steps.append((r.phase, r.seq_ids, r.token_ids, r.finish_reasons, r.inputs.positions,
                              r.inputs.slot_mapping))
            return steps, [llm.get_sequence(i).completion_token_ids for i in ids], dict(llm.async_stats)
        finally:
            llm.exit()

    sync = run(False, None)
    counts: dict[int, int] = {}
    for out in sync[1]:
        for t in out:
            counts[t] = counts.get(t, 0) + 1
    eos = max(counts, key=counts.get)
    sync = run(False, eos)
    overlapped = run(True, eos)
    # The same tokens for every request; the steps differ only by the rows a late EOS wasted.
    assert overlapped[1] == sync[1]
    assert overlapped[2]["launched_ahead"] > 3 and overlapped[2]["wasted_rows"] > 0, overlapped[2]
    kept = [(p, [(s, t, f) for s, t, f in zip(ids, toks, fins) if t is not None or f is not None])
            for p, ids, toks, fins, _, _ in overlapped[0]]
    assert [k for k in kept if k[1]] == [(p, list(zip(i, t, f))) for p, i, t, f, _, _ in sync[0]]
