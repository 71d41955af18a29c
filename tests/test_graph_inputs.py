"""The decode graphs' input staging (one flat buffer, one copy through engine/staging.py), checked on the host:
what the graph reads through its views after fill_graph_inputs, including padding rows and a smaller batch
after a larger one."""
from __future__ import annotations

import pytest
import torch

from engine.runner import StepInputs, fill_graph_inputs, graph_input_size, graph_input_views
from engine.staging import Staging


def _decode(ids, positions, slots, ctx, tables, bucket):
    return StepInputs(input_ids=ids, positions=positions, slot_mapping=slots, context_lens=ctx,
                      block_tables=tables, execution="graph", graph_batch=bucket)


def test_views_see_the_step_and_padding_rows_write_nothing():
    max_bs, max_blocks = 8, 5
    staging = Staging(torch.device("cpu"))
    # Stale device memory: only the uploaded prefix may be trusted.
    dev = torch.full((graph_input_size(max_bs, max_blocks),), 12345, dtype=torch.int32)
    v = graph_input_views(dev, max_bs, max_blocks)
    copied = []

    def upload(step):
        def fill(host):
            copied.append(fill_graph_inputs(host, step, max_bs, max_blocks))
            return copied[-1]
        staging.upload_into(dev, fill)

    upload(_decode([11, 12, 13], [300, 4, 77], [1299, 515, 2076], [301, 5, 78], [[4, 2], [2, -1], [8, -1]],
                   bucket=4))
    assert v["input_ids"][:3].tolist() == [11, 12, 13]
    assert v["positions"][:3].tolist() == [300, 4, 77]
    assert v["slot_mapping"][:4].tolist() == [1299, 515, 2076, -1]  # the padding row writes no KV
    assert v["context_lens"][:4].tolist() == [301, 5, 78, 0]  # ... and attends to nothing
    assert v["block_tables"][:3, :2].tolist() == [[4, 2], [2, -1], [8, -1]]

    assert (dev[copied[0]:] == 12345).all()  # the copy stops after the last table row in use

    upload(_decode([21], [9], [2057], [10], [[8]], bucket=1))
    assert copied[1] < copied[0]  # the copy shrinks with the batch
    assert v["input_ids"][:1].tolist() == [21] and v["slot_mapping"][:1].tolist() == [2057]
    assert v["context_lens"][:1].tolist() == [10] and v["block_tables"][0, 0].item() == 8


def test_padding_rows_never_carry_another_uploads_bytes():
    """The staging host buffer is shared with every other upload (sampler settings, prefill inputs): a
    padding row of a bucket must read a valid token at a valid position, not what was staged before.
    (On the H200 a batch of 254 in bucket 256 read floats as positions: an out-of-bounds RoPE gather.)"""
    max_bs, max_blocks = 16, 3
    staging = Staging(torch.device("cpu"))
    staging.upload(temperatures=([0.6] * 64, torch.float32), cu_seqlens_q=(list(range(10**6, 10**6 + 64)), torch.int32))
    dev = torch.zeros(graph_input_size(max_bs, max_blocks), dtype=torch.int32)
    step = _decode([5, 6, 7], [40, 41, 42], [100, 101, 102], [41, 42, 43], [[0], [1], [2]], bucket=16)
    staging.upload_into(dev, lambda host: fill_graph_inputs(host, step, max_bs, max_blocks))
    v = graph_input_views(dev, max_bs, max_blocks)
    assert v["input_ids"][:16].tolist() == [5, 6, 7] + [0] * 13
    assert v["positions"][:16].tolist() == [40, 41, 42] + [0] * 13
    assert v["slot_mapping"][:16].tolist() == [100, 101, 102] + [-1] * 13
    assert v["context_lens"][:16].tolist() == [41, 42, 43] + [0] * 13


def test_a_drawing_graphs_temperatures_and_seeds_reach_their_views_and_nothing_else():
    """A decode graph that draws its tokens (LABKIT_GRAPH_SAMPLE_BS) reads each row's temperature and seed from
    the same buffer: every part keeps its own values, padding rows draw greedily from seed 0, and a 63-bit
    seed arrives whole. An odd max_bs still leaves these parts and the tables 16-byte aligned (Triton compiles
    another kernel for a pointer that is not)."""
    max_bs, max_blocks = 5, 2
    staging = Staging(torch.device("cpu"))
    staging.upload(temperatures=([7.5] * 64, torch.float32), seeds=([-1] * 64, torch.int64))  # stale bytes
    dev = torch.full((graph_input_size(max_bs, max_blocks),), 777, dtype=torch.int32)
    v = graph_input_views(dev, max_bs, max_blocks)
    for name in ("temperatures", "seeds", "block_tables"):
        view = v[name]
        assert (view.data_ptr() - dev.data_ptr()) % 16 == 0, name
    big = 2**63 - 2
    step = _decode([5, 6, 7], [40, 41, 42], [100, 101, 102], [41, 42, 43], [[0, 3], [1, -1], [2, -1]], bucket=4)
    staging.upload_into(dev, lambda host: fill_graph_inputs(host, step, max_bs, max_blocks,
                                                            ([0.0, 0.7, 1e6], [big, 12, 0])))
    assert v["temperatures"][:4].tolist() == [0.0, pytest.approx(0.7), 1e6, 0.0]
    assert v["seeds"][:4].tolist() == [big, 12, 0, 0]
    assert v["input_ids"][:4].tolist() == [5, 6, 7, 0]
    assert v["context_lens"][:4].tolist() == [41, 42, 43, 0]
    assert v["block_tables"][:3].tolist() == [[0, 3], [1, -1], [2, -1]]
    # (without a draw they hold whatever the host buffer held: a graph that draws then draws ids nobody reads)
    staging.upload_into(dev, lambda host: fill_graph_inputs(host, _decode([9], [1], [5], [2], [[4]], bucket=1),
                                                            max_bs, max_blocks))
    assert v["input_ids"][0].item() == 9 and v["block_tables"][0, 0].item() == 4


def test_a_graph_captured_with_an_order_reads_the_buckets_rows_longest_first():
    """LABKIT_DECODE_ORDER=longest-first (engine/decode_order.py): the order view holds a permutation of the whole
    bucket, the longest contexts first, ties in batch order, the padding rows last (rows past the bucket are never
    read)."""
    max_bs, max_blocks = 8, 3
    staging = Staging(torch.device("cpu"))
    dev = torch.full((graph_input_size(max_bs, max_blocks),), 7, dtype=torch.int32)
    v = graph_input_views(dev, max_bs, max_blocks)
    step = _decode([1, 2, 3, 4, 5], [9, 99, 4, 99, 30], [0] * 5, [10, 100, 5, 100, 31], [[0], [1], [2], [3], [4]],
                   bucket=8)
    staging.upload_into(dev, lambda host: fill_graph_inputs(host, step, max_bs, max_blocks, order=True))
    assert v["order"].tolist() == [1, 3, 4, 0, 2, 5, 6, 7]
    step = _decode([1, 2, 3], [0, 50, 9], [0] * 3, [1, 51, 10], [[0], [1], [2]], bucket=4)
    staging.upload_into(dev, lambda host: fill_graph_inputs(host, step, max_bs, max_blocks, order=True))
    assert v["order"][:4].tolist() == [1, 2, 0, 3]


@pytest.mark.parametrize("decode_order", [True, False])
def test_a_decode_graph_captures_its_order_from_the_buffer_the_step_fills(decode_order):
    """The order a graph's attention reads is the graph input buffer's order view (what fill_graph_inputs writes
    each replay), not a copy; without a launch order the graph captures none."""
    from engine.runner import ModelRunner

    max_bs, max_blocks = 8, 3
    r = ModelRunner.__new__(ModelRunner)
    buf = torch.zeros(graph_input_size(max_bs, max_blocks), dtype=torch.int32)
    r.graph_vars = graph_input_views(buf, max_bs, max_blocks)
    r.decode_order = decode_order
    meta = r.graph_decode_meta(4, 2)
    assert meta.num_rows == 4 and meta.num_splits == 2
    step = _decode([1, 2, 3], [0, 50, 9], [0] * 3, [1, 51, 10], [[0], [1], [2]], bucket=4)
    Staging(torch.device("cpu")).upload_into(
        buf, lambda host: fill_graph_inputs(host, step, max_bs, max_blocks, order=decode_order))
    assert meta.context_lens.tolist() == [1, 51, 10, 0]
    if decode_order:
        assert meta.order.tolist() == [1, 2, 0, 3]
    else:
        assert meta.order is None
