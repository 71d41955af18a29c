"""Which captured CUDA graph a step replays (engine/graph_dispatch.py), on the CPU: the rules are plain Python over
the sizes the runner captured, so they are checked here without a GPU (tests/test_graph_fallback.py runs the same
dispatch through the runner's input preparation)."""
from __future__ import annotations

import pytest

from engine import LLM
from engine.batch_plan import BatchPlan
from engine.graph_dispatch import MIXED_PREFILL_ROWS, SHORT_CONTEXT, GraphDispatch, decode_buckets
from engine.mixed_graphs import buckets


def _plan(num_decodes: int, prefills: list[int]) -> BatchPlan:
    n = num_decodes + len(prefills)
    new = [1] * num_decodes + prefills
    return BatchPlan(list(range(n)), [str(i) for i in range(n)], num_decodes, [5] * n, new, [5 + k for k in new],
                     [0] * sum(new), [[i] for i in range(n)])


def test_decode_buckets_are_nanos():
    assert decode_buckets(20) == [1, 2, 4, 8, 16]
    assert decode_buckets(3) == [1, 2]
    assert decode_buckets(512)[:6] == [1, 2, 4, 8, 16, 32] and decode_buckets(512)[-1] == 512


def test_a_decode_step_takes_the_smallest_bucket_that_holds_it_or_runs_eagerly():
    d = GraphDispatch(decode=(1, 2, 4, 8, 16))
    assert [d.key(_plan(n, [])) for n in (1, 3, 8, 9, 16)] == [(1, None), (4, None), (8, None), (16, None),
                                                               (16, None)]
    assert d.key(_plan(17, [])) is None                      # larger than every bucket: eager
    assert GraphDispatch().key(_plan(1, [])) is None         # nothing captured (CPU, enforce_eager)


def test_a_step_with_prefill_rows_replays_a_mixed_graph_only_when_they_were_captured():
    decode_only = GraphDispatch(decode=(1, 2, 4, 8))
    assert decode_only.key(_plan(2, [30])) is None and decode_only.key(_plan(0, [30])) is None
    mixed = GraphDispatch(decode=(1, 2, 4, 8), mixed_rows=(0, 8, 32), mixed_tokens=(512, 2048))
    assert mixed.key(_plan(2, [30, 100])) == (8, 512)
    assert mixed.key(_plan(0, [600])) == (0, 2048)
    assert mixed.key(_plan(2, [1] * (MIXED_PREFILL_ROWS + 1))) is None


def test_the_one_split_graph_serves_short_contexts_of_the_buckets_that_have_it():
    d = GraphDispatch(decode=(1, 2, 4), short=frozenset({1, 2}))
    assert d.one_split(2, [SHORT_CONTEXT, 3])
    assert not d.one_split(2, [SHORT_CONTEXT + 1, 3])      # one long context: the split graph
    assert not d.one_split(4, [3, 3])                      # no one-split graph for this bucket


# --- every edge, through the runner's input preparation (issue 35, "checks that missed": a mixed step that
# exactly filled a graph bucket could fall back to eager execution, which costs only speed, so no output test saw
# it). The runner holds the dispatch of what the engine would capture for its limits (decode_buckets for decode,
# mixed_graphs.buckets for mixed steps; no graph is replayed on the CPU); for every bucket a step one below it,
# exactly at it and one over it, and the empty edges (no decode rows in a mixed step, a plan with no rows): the
# step takes the smallest graph that holds it, and runs eagerly only when none does.
MAX_SEQS = 40          # decode buckets [1, 2, 4, 8, 16, 32]; mixed decode rows [0, 8, 32, 40]
BUDGET = 600           # mixed prefill tokens [512, 600]
BLOCK = 16
MIXED_ROWS, MIXED_TOKENS = buckets(MAX_SEQS, BUDGET)


@pytest.fixture(scope="module")
def runner(tiny_model):
    llm = LLM(tiny_model, enforce_eager=True, device="cpu", scheduling_policy="mixed", max_num_seqs=MAX_SEQS,
              max_num_batched_tokens=BUDGET, max_model_len=1024, kvcache_block_size=BLOCK, num_kvcache_blocks=64)
    runner = llm.model_runner
    eager = runner.dispatch
    runner.dispatch = GraphDispatch(decode=tuple(decode_buckets(MAX_SEQS)), mixed_rows=tuple(MIXED_ROWS),
                                    mixed_tokens=tuple(MIXED_TOKENS))   # as if captured: nothing is replayed
    yield runner
    runner.dispatch = eager
    llm.exit()


def plan(decodes: int, prefill: list[int]) -> BatchPlan:
    """`decodes` decode rows (3 tokens, 2 cached), then one prefill row per entry of `prefill` computing that
    many tokens of a new prompt; every row in blocks of its own."""
    n = decodes + len(prefill)
    starts = [2] * decodes + [0] * len(prefill)
    new = [1] * decodes + list(prefill)
    total = [3] * decodes + list(prefill)
    tables, nxt = [], 0
    for t in total:
        k = -(-t // BLOCK)
        tables.append(list(range(nxt, nxt + k)))
        nxt += k
    return BatchPlan(list(range(n)), [str(i) for i in range(n)], decodes, starts, new, total,
                     [100] * sum(new), tables)


def dispatch(runner, p: BatchPlan):
    """What the step replays: ("graph", decode bucket, prefill bucket or None) or ("eager",)."""
    inputs = runner.step_inputs(p)
    if inputs.execution == "eager":
        assert inputs.graph_batch is None
        return ("eager",)
    return ("graph", inputs.graph_batch, inputs.graph_prefill)


def smallest(sizes: list[int], n: int) -> int | None:
    return next((s for s in sizes if s >= n), None)


def edges(sizes: list[int], low: int) -> list[int]:
    return sorted({n for s in sizes for n in (s - 1, s, s + 1) if n >= low})


def test_the_simulated_buckets_are_the_engines():
    assert decode_buckets(MAX_SEQS) == [1, 2, 4, 8, 16, 32]
    assert buckets(MAX_SEQS, BUDGET) == ([0, 8, 32, 40], [512, 600])


@pytest.mark.parametrize("n", edges(decode_buckets(MAX_SEQS), 1))
def test_a_decode_step_takes_the_smallest_bucket_that_holds_it(runner, n):
    want = smallest(decode_buckets(MAX_SEQS), n)
    assert dispatch(runner, plan(n, [])) == (("graph", want, None) if want is not None else ("eager",)), n


def test_a_step_with_no_rows_replays_nothing(runner):
    """(Before: the decode graph of one row, for nothing. No scheduler makes such a plan; the dispatch must not
    depend on that.)"""
    assert runner.graph_key(plan(0, [])) is None
    assert GraphDispatch(decode=(1, 2, 4)).key(plan(0, [])) is None


@pytest.mark.parametrize("d", edges(MIXED_ROWS, 0))
@pytest.mark.parametrize("tokens", edges(MIXED_TOKENS, 1) + [1])
def test_a_mixed_step_takes_the_smallest_graph_that_holds_it(runner, d, tokens):
    """d decode rows and one prefill row of `tokens` tokens (the budget's edge included: a step that exactly
    fills the largest graph replays it)."""
    dd, pp = smallest(MIXED_ROWS, d), smallest(MIXED_TOKENS, tokens)
    want = ("graph", dd, pp) if dd is not None and pp is not None else ("eager",)
    assert dispatch(runner, plan(d, [tokens])) == want, (d, tokens)


@pytest.mark.parametrize("rows", [1, MIXED_PREFILL_ROWS - 1, MIXED_PREFILL_ROWS, MIXED_PREFILL_ROWS + 1])
def test_a_mixed_step_with_up_to_MIXED_PREFILL_ROWS_prefill_rows_replays_a_graph(runner, rows):
    want = ("graph", 8, 512) if rows <= MIXED_PREFILL_ROWS else ("eager",)
    assert dispatch(runner, plan(3, [10] * rows)) == want, rows


def test_a_prefill_only_step_under_mixed_takes_a_graph_with_no_decode_rows(runner):
    assert dispatch(runner, plan(0, [512])) == ("graph", 0, 512)
    assert dispatch(runner, plan(0, [300, 300])) == ("graph", 0, 600)
    assert dispatch(runner, plan(0, [300, 301])) == ("eager",)


def test_without_captured_graphs_every_step_is_eager(tiny_model):
    llm = LLM(tiny_model, enforce_eager=True, device="cpu", max_num_seqs=8, max_model_len=256,
              kvcache_block_size=BLOCK, num_kvcache_blocks=32)
    try:
        for p in (plan(1, []), plan(8, []), plan(2, [5]), plan(0, [5])):
            assert dispatch(llm.model_runner, p) == ("eager",)
    finally:
        llm.exit()
