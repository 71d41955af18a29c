"""A mixed step's CUDA graph (engine/mixed_graphs.py) holds a padded copy of the step: decode rows padded up to
D, prefill tokens up to P, prefill rows up to ROWS. There are no graphs on the CPU, so this replays the padded
layout eagerly (the torch reference backend, reading the same buffer the graph reads) and asks for the logits
of the unpadded eager step: the padding must change nothing, and the sampling rows must map to the right rows."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from engine.context import Context, DecodeMeta, PrefillMeta, reset_context, set_context
from engine.graph_dispatch import GraphDispatch
from engine.mixed_graphs import ROWS, MixedGraphs, buckets


def test_buckets_cover_the_limits():
    assert buckets(512, 2048) == ([0, 8, 32, 64, 128, 256, 512], [512, 2048])
    assert buckets(20, 8192) == ([0, 8, 20], [512, 2048, 8192])
    assert buckets(4, 300) == ([0, 4], [300])


def _replay_eagerly(graphs: MixedGraphs, runner, plan, inputs, key):
    """What the graph for `key` computes, run eagerly from the filled buffer."""
    host = np.zeros(graphs.buf.numel(), dtype=np.int32)
    n = graphs.fill(host, inputs, key)
    graphs.buf[:n] = torch.from_numpy(host[:n])
    d, p = key
    v, w, t = graphs.view, graphs.max_blocks, d + p
    cu_q, cu_k = v["cu_q"].tolist(), v["cu_k"].tolist()
    decode = None if not d else DecodeMeta(d, v["context_lens"][:d], v["decode_tables"][:d * w].view(d, w),
                                           v["context_lens"][:d].tolist())
    prefill = PrefillMeta(v["cu_q"], v["cu_k"], p, max(b - a for a, b in zip(cu_k, cu_k[1:])),
                          v["prefill_tables"].view(ROWS, w), cu_q, cu_k)
    set_context(Context(v["slots"][:t], decode, prefill))
    try:
        hidden = runner.model(v["ids"][:t].long(), v["positions"][:t].long())
    finally:
        reset_context()
    rows = graphs.logits_rows(inputs, runner.logits_rows(plan), key)
    set_context(Context(logits_indices=None if rows is None else torch.tensor(rows)))
    try:
        return runner.model.compute_logits(hidden)
    finally:
        reset_context()


@pytest.mark.parametrize("key", [None, (8, 64), (16, 128)], ids=["smallest", "padded", "more-padded"])
def test_a_padded_mixed_step_gives_the_eager_steps_logits(tiny_model, key):
    llm = LLM(tiny_model, device="cpu", enforce_eager=True, scheduling_policy="mixed", max_num_batched_tokens=40,
              kvcache_block_size=16, num_kvcache_blocks=64, max_model_len=256, async_scheduling=False)
    runner = llm.model_runner
    graphs = MixedGraphs(runner.model, runner.device, 16, 128, -(-256 // 16), llm.config.hf_config.hidden_size,
                         runner.dtype, lambda d: 1)
    graphs.rows, graphs.tokens = [0, 4, 8, 16], [32, 64, 128]
    seen = []
    execute = runner.execute

    @torch.inference_mode()
    def both(plan):
        launched = execute(plan)  # the eager step (it also writes this step's KV)
        if plan.phase == "mixed":
            inputs = runner.step_inputs(plan)
            k = key or GraphDispatch(mixed_rows=tuple(graphs.rows), mixed_tokens=tuple(graphs.tokens)).mixed_key(
                plan.num_decodes, len(inputs.input_ids) - plan.num_decodes, len(plan) - plan.num_decodes)
            eager = runner._logits(plan, inputs, None)  # again, eagerly: the KV it rewrites is the same
            padded = _replay_eagerly(graphs, runner, plan, inputs, k)
            seen.append((k, plan.num_decodes, (padded - eager).abs().max().item()))
        return launched

    runner.execute = both
    prompts = [[100 + i for i in range(n)] for n in (5, 9, 70)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    llm.exit()
    assert len(seen) >= 2 and any(d > 1 for _, d, _ in seen)
    assert all(diff < 1e-5 for _, _, diff in seen), seen
    if key is None:
        assert all(k[0] >= d for k, d, _ in seen)


def test_a_step_no_graph_holds_runs_eagerly():
    graphs = GraphDispatch(mixed_rows=(0, 8, 32), mixed_tokens=(512, 2048))
    assert graphs.mixed_key(3, 600, 2) == (8, 2048)
    assert graphs.mixed_key(0, 100, 1) == (0, 512)
    assert graphs.mixed_key(33, 100, 1) is None                 # more decode rows than the largest graph
    assert graphs.mixed_key(3, 2049, 1) is None                 # more prefill tokens
    assert graphs.mixed_key(3, 100, ROWS + 1) is None           # more prefill rows
    assert GraphDispatch(decode=(1, 2, 4)).mixed_key(1, 10, 1) is None   # no mixed graphs captured
