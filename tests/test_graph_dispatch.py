"""Which step replays which CUDA graph, at every edge (issue 35, "checks that missed": a mixed step that exactly
filled a graph bucket could fall back to eager execution, which only costs speed, so no output test saw it).

The dispatch is plain Python: a plan's rows decide a graph key (ModelRunner.graph_key, through
ModelRunner.step_inputs, which says "graph" with its bucket or "eager"). There are no CUDA graphs on the
CPU, so the captured graphs are simulated as in tests/test_graph_fallback.py: the runner gets the buckets the
engine captures for its limits (SPEC 4: [1, 2, 4, 8] + range(16, max + 1, 16) for decode; engine/
mixed_graphs.buckets for mixed steps) with placeholder graphs, never replayed. For every bucket the test
asks for a step one below it, exactly at it and one over it, and for the empty edges (no decode rows in a
mixed step, and a plan with no rows at all): the step must take the smallest graph that holds it, and run
eagerly only when none does."""
from __future__ import annotations

import pytest

from engine import LLM
from engine.batch_plan import BatchPlan
from engine.mixed_graphs import ROWS, MixedGraphs, buckets

MAX_SEQS = 40          # decode buckets [1, 2, 4, 8, 16, 32]; mixed decode rows [0, 8, 32, 40]
BUDGET = 600           # mixed prefill tokens [512, 600]
BLOCK = 16


def decode_buckets(max_seqs: int) -> list[int]:
    """SPEC 4: nano-vLLM's decode graph sizes."""
    top = min(max_seqs, 512)
    return [b for b in (1, 2, 4, 8) if b <= top] + list(range(16, top + 1, 16))


@pytest.fixture(scope="module")
def runner(tiny_model):
    llm = LLM(tiny_model, enforce_eager=True, device="cpu", scheduling_policy="mixed", max_num_seqs=MAX_SEQS,
              max_num_batched_tokens=BUDGET, max_model_len=1024, kvcache_block_size=BLOCK, num_kvcache_blocks=64)
    runner = llm.model_runner
    runner.graph_bs = decode_buckets(MAX_SEQS)
    runner.graphs = {b: object() for b in runner.graph_bs}   # placeholders: never replayed
    mixed = MixedGraphs.__new__(MixedGraphs)                  # the dispatch needs only its sizes
    mixed.rows, mixed.tokens = buckets(min(MAX_SEQS, 512), BUDGET)
    runner.mixed_graphs = mixed
    yield runner
    runner.graphs, runner.mixed_graphs = {}, None
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
    want = smallest(runner.graph_bs, n)
    assert dispatch(runner, plan(n, [])) == (("graph", want, None) if want is not None else ("eager",)), n


def test_a_step_with_no_rows_replays_nothing(runner):
    """(Before: the decode graph of one row, for nothing. No scheduler makes such a plan; the dispatch must not
    depend on that.)"""
    assert runner.graph_key(plan(0, [])) is None


MIXED_ROWS, MIXED_TOKENS = buckets(MAX_SEQS, BUDGET)


@pytest.mark.parametrize("d", edges(MIXED_ROWS, 0))
@pytest.mark.parametrize("tokens", edges(MIXED_TOKENS, 1) + [1])
def test_a_mixed_step_takes_the_smallest_graph_that_holds_it(runner, d, tokens):
    """d decode rows and one prefill row of `tokens` tokens (the budget's edge included: a step that exactly
    fills the largest graph replays it)."""
    dd, pp = smallest(MIXED_ROWS, d), smallest(MIXED_TOKENS, tokens)
    want = ("graph", dd, pp) if dd is not None and pp is not None else ("eager",)
    assert dispatch(runner, plan(d, [tokens])) == want, (d, tokens)


@pytest.mark.parametrize("rows", [1, ROWS - 1, ROWS, ROWS + 1])
def test_a_mixed_step_with_up_to_ROWS_prefill_rows_replays_a_graph(runner, rows):
    want = ("graph", 8, 512) if rows <= ROWS else ("eager",)
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
