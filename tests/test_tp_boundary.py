"""What crosses the process boundary of a tensor-parallel step (issue 35, "checks that missed": an executor
that sent rank 0's whole plan, with every sequence's token lists and sampling settings, to the workers
passed every test, since nothing measured what crossed).

Two ranks on the CPU; every message rank 0 posts to the workers' shared-memory channel is recorded as the
bytes it posts (TensorParallel._post). Each step's message must be the plan's worker view: the same rows,
positions, new tokens and block tables rank 0 runs, and nothing of what only rank 0 needs (request ids,
sampling settings). Its size is bounded by those columns, so a decode step of long sequences stays small (a
few hundred bytes, not their tokens) and the whole run fits a shared-memory channel (shm_size) far smaller
than the sequences' tokens."""
from __future__ import annotations

import pickle

import pytest

from engine import LLM, SamplingParams
from engine.batch_plan import BatchPlan
from engine.runner import ModelRunner
from engine.tp_workers import TensorParallel

PROMPT_LEN = 1500
REQUESTS = 6
BLOCK = 64
# A call may take shm_size minus one 4 KiB reply slot: 16 KiB. The worker view of any step here takes under
# 7 KiB (the largest: a prefill chunk of 2048 new ids); a message carrying the six sequences' token lists
# (6 x ~1500 ids) would take ~27 KiB and be refused ("shm_size: a BatchPlan needs ... bytes").
SHM_SIZE = 20 << 10
WORKER_FIELDS = ("seq_ids", "num_decodes", "starts", "num_new", "num_tokens", "input_ids", "block_tables",
                 "from_previous", "step")


def _ints(plan: BatchPlan) -> int:
    """How many integers the worker view's columns hold."""
    return (4 * len(plan.seq_ids) + len(plan.input_ids) + sum(len(t) for t in plan.block_tables)
            + len(plan.from_previous or []))


def _bound(plan: BatchPlan) -> int:
    """Bytes a pickle of the columns may take: at most 6 an integer (a token id < 2**16 pickles in 3) and a
    fixed envelope; nothing that grows with a sequence's length but its block table."""
    return 256 + 6 * _ints(plan)


@pytest.fixture
def recorded(monkeypatch):
    """(what rank 0 posted to the workers, each as bytes; the plans rank 0 itself ran), in order."""
    posted: list[bytes] = []
    ran: list[BatchPlan] = []
    post, execute = TensorParallel._post, ModelRunner.execute

    def record_post(self, payload):
        posted.append(bytes(payload))
        return post(self, payload)

    def record_execute(self, plan):
        ran.append(plan)
        return execute(self, plan)

    # Rank 0 only: the workers are spawned processes that import the modules afresh.
    monkeypatch.setattr(TensorParallel, "_post", record_post)
    monkeypatch.setattr(ModelRunner, "execute", record_execute)
    return posted, ran


def test_each_step_sends_the_workers_their_part_of_the_plan_and_no_more(tiny_model, recorded):
    posted, ran = recorded
    llm = LLM(tiny_model, tensor_parallel_size=2, device="cpu", enforce_eager=True, max_model_len=2048,
              max_num_batched_tokens=2048, max_num_seqs=8, kvcache_block_size=BLOCK, shm_size=SHM_SIZE)
    try:
        start = len(posted)
        prompts = [[100 + (7 * i + j) % 1900 for j in range(PROMPT_LEN)] for i in range(REQUESTS)]
        params = [SamplingParams(temperature=0.8, max_tokens=4, ignore_eos=True, seed=i) for i in range(REQUESTS)]
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert all(len(o["token_ids"]) == 4 for o in outs)
    finally:
        llm.exit()
    sent = [pickle.loads(p) for p in posted[start:]]
    steps = [(p, m) for p, m in zip(posted[start:], sent) if isinstance(m, BatchPlan)]
    assert len(steps) == len(ran) and len(ran) >= 4 + 4  # prefill chunks, then decodes
    decodes = 0
    for (payload, view), plan in zip(steps, ran):
        for f in WORKER_FIELDS:
            assert getattr(view, f) == getattr(plan, f), f
        # Nothing only rank 0 needs: no names, no sampling settings.
        assert view.request_ids == [] and view.sampling is None and view.preempted == []
        assert plan.sampling is not None and plan.request_ids  # (what rank 0 kept)
        assert len(payload) <= _bound(view), (len(payload), _bound(view), plan.phase)
        if plan.phase == "decode":
            decodes += 1
            # Six rows of 1,500+ tokens each: their token ids would take 2-3 bytes each; the view, their tables.
            assert len(payload) < sum(plan.num_tokens) // 8, (len(payload), sum(plan.num_tokens))
    assert decodes >= 3
