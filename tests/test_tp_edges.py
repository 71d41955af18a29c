"""Tensor parallel corners no other test reached (session 22's mutation screen): the collectives between two real
ranks, the rendezvous helpers (start-up limit, loopback pinning, IPv6 addresses, the watched store), the
shared-memory channel's exact limits, a failure on rank 0 while it builds its runner, a hung worker inside
a collective, a second engine in one process, and what an exited engine leaves behind."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import sys
import time
import uuid

import pytest
import torch.distributed as dist

from engine import LLM, SamplingParams
from engine.config import TP_REPLY_SLOT_BYTES
from engine.distributed import tp_size

pytestmark = pytest.mark.timeout(120)
SMALL = dict(device="cpu", enforce_eager=True, max_model_len=512, max_num_batched_tokens=256, max_num_seqs=8,
             kvcache_block_size=16, num_kvcache_blocks=64)


def _tp_children() -> list:
    return [p for p in multiprocessing.active_children() if p.name.startswith("labkit-tp")]


def _shm_exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm/{name}")


# --- an engine that stays up ---------------------------------------------------------------------------
def _reply_of(size: int):
    """A value whose reply pickle (("ok", value)) takes exactly `size` bytes."""
    n = size
    while len(pickle.dumps(("ok", b"x" * n), protocol=pickle.HIGHEST_PROTOCOL)) > size:
        n -= 1
    assert len(pickle.dumps(("ok", b"x" * n), protocol=pickle.HIGHEST_PROTOCOL)) == size
    return b"x" * n


def _fills_the_reply_slot(runner):
    return _reply_of(TP_REPLY_SLOT_BYTES - 8)


def _overflows_the_reply_slot_a_little(runner):
    return _reply_of(TP_REPLY_SLOT_BYTES - 4)


OWN_NCCL_IFNAME = "user-own-ifname"
SHM_SIZE = 3 * TP_REPLY_SLOT_BYTES  # one reply slot (TP=2): a call may take 2 slots less the 16-byte header


def test_a_running_engine_keeps_user_settings_its_limits_and_the_process_to_itself(tiny_model, monkeypatch):
    # (One engine for several checks: a process holds one tensor-parallel engine at a time.)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", OWN_NCCL_IFNAME)  # the user's own setting
    llm = LLM(tiny_model, tensor_parallel_size=2, shm_size=SHM_SIZE,
              **{**SMALL, "max_model_len": 2048, "max_num_batched_tokens": 2048, "num_kvcache_blocks": 160})
    try:
        # The engine sets the socket interfaces only where the user has not.
        assert os.environ["NCCL_SOCKET_IFNAME"] == OWN_NCCL_IFNAME

        # A call may take all of shm_size but the header and the one reply slot: one step here prefills 1,500
        # ids of 3 pickled bytes each, more than a reply slot's worth, well within the two a call may take.
        prompt = [300 + i % 1700 for i in range(1500)]
        size = len(pickle.dumps(prompt, protocol=pickle.HIGHEST_PROTOCOL))
        assert TP_REPLY_SLOT_BYTES < size < SHM_SIZE - TP_REPLY_SLOT_BYTES - 16 - 2048
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
        assert len(out[0]["token_ids"]) == 2

        # A reply that fills its slot to the last byte comes back whole.
        assert llm.executor.per_rank(_fills_the_reply_slot)[1] == _reply_of(TP_REPLY_SLOT_BYTES - 8)

        # A second tensor-parallel engine in this process is refused before it starts anything; this one
        # carries on.
        with pytest.raises(ValueError, match="tensor_parallel_size: this process already has a torch.distributed"):
            LLM(tiny_model, tensor_parallel_size=2, **SMALL)
        assert len(_tp_children()) == 1
        assert llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False)
        llm.check_alive()
    finally:
        llm.exit()


def test_a_reply_too_large_for_its_slot_is_refused_by_name(tiny_model):
    llm = LLM(tiny_model, tensor_parallel_size=2, **SMALL)
    name = llm.config.shm_name
    try:
        with pytest.raises(RuntimeError, match=r"^tensor parallel: worker rank 1 could not answer "
                                               r"'_overflows_the_reply_slot_a_little': reply of 4092 bytes does not "
                                               r"fit the 4088-byte reply slot; the workers were stopped$"):
            llm.executor.per_rank(_overflows_the_reply_slot_a_little)
        with pytest.raises(RuntimeError, match="could not answer"):  # the engine stays failed
            llm.check_alive()
        assert not _tp_children() and not _shm_exists(name)
    finally:
        llm.exit()


# --- rank 0 failing while it builds its runner (the workers are already up) ---------------------------
@pytest.mark.parametrize("error", [ValueError, RuntimeError])
def test_rank_0_failing_to_build_its_runner_stops_the_workers(tiny_model, monkeypatch, error):
    def fails(config, *args):
        raise error("planted on rank 0")

    monkeypatch.setattr("engine.executor.ModelRunner", fails)  # rank 0 only: the workers import it afresh
    shm = f"labkit-test-{uuid.uuid4().hex[:8]}"
    # A ValueError is the user's (a bad setting): passed on as it is. Anything else is the engine's, and
    # says where it happened.
    expected = ("^planted on rank 0$" if error is ValueError else
                r"^tensor parallel: building the model runner failed on rank 0 \(RuntimeError: planted on "
                r"rank 0\); the workers were stopped$")
    with pytest.raises(error, match=expected):
        LLM(tiny_model, tensor_parallel_size=2, shm_name=shm, **SMALL)
    assert not _tp_children() and not _shm_exists(shm)
    assert not dist.is_initialized() and tp_size() == 1


# --- a worker that stops answering inside a collective ------------------------------------------------
@pytest.mark.timeout(60)
def test_a_worker_hung_inside_a_collective_fails_the_step_after_dist_timeout_s(tiny_model):
    llm = LLM(tiny_model, tensor_parallel_size=2, dist_timeout_s=2, **SMALL)
    proc, name = llm.executor.tp.procs[0], llm.config.shm_name
    try:
        assert llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2), use_tqdm=False)
        llm.peak_memory_per_rank()  # the worker has finished every call: the next one finds it waiting
        os.kill(proc.pid, signal.SIGSTOP)
        llm.add_request([5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        t0 = time.monotonic()
        # Rank 0 posts the step and enters the step's first collective, which the worker never joins: the
        # group's timeout (dist_timeout_s from start-up on, not the 300 s start-up limit) ends it.
        with pytest.raises(RuntimeError, match=r"the BatchPlan call failed on rank 0 .*the workers were stopped"):
            llm.step()
        assert time.monotonic() - t0 < 2 + 20
        assert not _shm_exists(name)
    finally:
        if proc.exitcode is None:
            os.kill(proc.pid, signal.SIGKILL)
        llm.exit()


# --- what an exited engine leaves ---------------------------------------------------------------------
def test_a_tp1_engine_shares_the_process_with_a_tp2_one_and_an_exited_engine_leaves_it_as_it_was(tiny_model):
    hook = sys.excepthook
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    solo = LLM(tiny_model, **SMALL)  # TP=1: no process group, no workers, no shared memory
    try:
        before = solo.generate([[1, 2, 3]], greedy, use_tqdm=False)[0]["token_ids"]
        assert not dist.is_initialized()
        llm = LLM(tiny_model, tensor_parallel_size=2, **SMALL)
        name = llm.config.shm_name
        assert llm.generate([[1, 2, 3]], greedy, use_tqdm=False)[0]["token_ids"] == before
        llm.exit()
        with pytest.raises(RuntimeError, match="^tensor parallel: the engine has exited$"):
            llm.check_alive()
        assert tp_size() == 1 and sys.excepthook is hook and not dist.is_initialized()
        assert not _tp_children() and not _shm_exists(name)
        assert solo.generate([[1, 2, 3]], greedy, use_tqdm=False)[0]["token_ids"] == before
        solo.check_alive()
    finally:
        solo.exit()
