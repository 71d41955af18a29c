"""Which captured CUDA graph a step replays (engine/graph_dispatch.py), on the CPU: the rules are plain Python over
the sizes the runner captured, so they are checked here without a GPU (tests/test_graph_fallback.py runs the same
dispatch through the runner's input preparation)."""
from __future__ import annotations

from engine.batch_plan import BatchPlan
from engine.graph_dispatch import MIXED_PREFILL_ROWS, SHORT_CONTEXT, GraphDispatch, decode_buckets


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
