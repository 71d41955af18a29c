"""Which path a decode batch takes when CUDA graphs are captured: the smallest bucket that covers it, or
eager when none does (seed 001, B.5: with max_num_seqs 20 nano captures [1, 2, 4, 8, 16] and a batch
of 17 found no bucket: StopIteration).

There are no CUDA graphs on the CPU, so the captured buckets are simulated: the runner gets the dispatch of
the bucket list nano captures for max_num_seqs 20 (engine/graph_dispatch.py), and the test asks its host-side
input preparation which path each batch size takes (nothing is replayed). This is the check that catches
patches/fault-graph-bucket-no-fallback.patch.
"""
from __future__ import annotations

import pytest
import torch

from engine import LLM
from engine.batch_plan import BatchPlan
from engine.graph_dispatch import GraphDispatch

NANO_BUCKETS_FOR_20 = [1, 2, 4, 8, 16]   # [1, 2, 4, 8] + range(16, 20 + 1, 16)


@pytest.fixture(scope="module")
def runner(tiny_model):
    llm = LLM(tiny_model, enforce_eager=True, max_num_seqs=20, max_model_len=256, kvcache_block_size=16,
              num_kvcache_blocks=64, device="cpu")
    runner = llm.model_runner
    eager = runner.dispatch
    runner.dispatch = GraphDispatch(decode=tuple(NANO_BUCKETS_FOR_20))   # as if captured: nothing is replayed
    yield runner
    runner.dispatch = eager
    llm.exit()


def _decoding(n: int) -> BatchPlan:
    """A decode step of n sequences of 3 tokens (2 cached), each in a block of its own."""
    return BatchPlan(list(range(n)), [str(i) for i in range(n)], n, [2] * n, [1] * n, [3] * n,
                     [102 + i for i in range(n)], [[i] for i in range(n)])


@pytest.mark.parametrize("batch", [1, 3, 9, 16, 17, 20])
def test_decode_batch_takes_its_bucket_or_falls_back_to_eager(runner, batch):
    inputs = runner.step_inputs(_decoding(batch))
    if batch <= 16:
        want = min(b for b in NANO_BUCKETS_FOR_20 if b >= batch)
        assert (inputs.execution, inputs.graph_batch) == ("graph", want)
    else:   # no captured bucket holds 17..20 sequences: the same model runs eagerly
        assert (inputs.execution, inputs.graph_batch) == ("eager", None)
    assert len(inputs.input_ids) == batch and inputs.context_lens == [3] * batch


def test_the_warm_up_prefill_runs_before_any_graph_or_pool_setting(tiny_model):
    """The GPU sizes its KV pool after one largest prefill (ModelRunner.warmup_model); the same pass on the CPU:
    prompts without blocks, nothing written, one logits row each."""
    llm = LLM(tiny_model, enforce_eager=True, max_model_len=64, max_num_batched_tokens=128, kvcache_block_size=16,
              num_kvcache_blocks=16, device="cpu")
    before = llm.model_runner.kv_cache.clone()
    logits = llm.model_runner.largest_prefill()
    assert logits.shape == (2, llm.config.hf_config.vocab_size)   # two 64-token prompts fill the 128 budget
    assert torch.equal(llm.model_runner.kv_cache, before)
    llm.exit()
