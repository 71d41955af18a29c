"""A small decode graph that also runs the LM head and draws the tokens (LABKIT_GRAPH_SAMPLE_BS), checked on the
host with a stand-in for the captured graph (no graph is captured on the CPU): which steps let the graph draw,
what it is given to draw from, and what the step hands on. The captured kernels themselves are the ones the
eager path runs (the LM head, engine/kernels/gumbel_sampler.py); the device call compares the two paths' ids."""
from __future__ import annotations

import types

import torch

from engine.batch_plan import BatchPlan
from engine.graph_dispatch import GraphDispatch
from engine.runner import ModelRunner, graph_input_size, graph_input_views
from engine.sampler import DeviceSampling, TeacherForcing, row_seeds
from engine.sampling_params import SamplingParams
from engine.staging import Staging

VOCAB, MAX_BS, MAX_BLOCKS = 11, 4, 3


class _FakeGraph:
    """Replays as a drawing graph would: logits row i = i + the input id, ids = what the buffer asked for."""

    def __init__(self, runner, bs):
        self.runner, self.bs, self.seen = runner, bs, []
        self.logits = torch.zeros(bs, VOCAB)
        self.ids = torch.zeros(bs, dtype=torch.int64)

    def replay(self):
        gv = self.runner.graph_vars
        self.seen.append((gv["temperatures"][:self.bs].tolist(), gv["seeds"][:self.bs].tolist()))
        self.logits.copy_(torch.arange(VOCAB).float()[None, :] + gv["input_ids"][:self.bs, None].float())
        self.ids.copy_(gv["seeds"][:self.bs] % VOCAB)


def _runner(head_bs: int, gumbel: bool = True):
    r = ModelRunner.__new__(ModelRunner)
    r.rank, r.world_size, r.block_size = 0, 1, 4
    r.kernels = types.SimpleNamespace(prefill_block_tables=False)
    r.staging = Staging(torch.device("cpu"))
    r.sampling = r._device_sampling = DeviceSampling(5, torch.device("cpu"), r.staging, gumbel)
    r._graph_inputs = torch.zeros(graph_input_size(MAX_BS, MAX_BLOCKS), dtype=torch.int32)
    r.graph_vars = graph_input_views(r._graph_inputs, MAX_BS, MAX_BLOCKS)
    r.graph_vars["outputs"] = torch.zeros(MAX_BS, 2)
    r.model = types.SimpleNamespace(compute_logits=lambda hidden: torch.full((len(hidden), VOCAB), -1.0))
    r.graph_max_bs, r.graph_max_blocks = MAX_BS, MAX_BLOCKS
    r.decode_order = False
    r.dispatch = GraphDispatch((1, 2, 4))
    r.graphs = {bs: _FakeGraph(r, bs) for bs in (1, 2, 4)}
    r.short_graphs = {}
    r.graph_heads = {g: (g.logits, g.ids) for bs, g in r.graphs.items() if bs <= head_bs}
    r._sampled, r._num_sampled, r.drawn = None, 0, None
    return r


def _decode_plan(n, params):
    return BatchPlan(list(range(n)), [str(i) for i in range(n)], n, [5 + i for i in range(n)], [1] * n,
                     [6 + i for i in range(n)], [3 + i for i in range(n)], [[i, 4 + i] for i in range(n)],
                     sampling=params)


def test_a_drawing_graph_draws_from_each_rows_temperature_and_seed():
    r = _runner(head_bs=4)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=7), SamplingParams()]
    plan = _decode_plan(3, params)
    launched = r.execute(plan)
    temps, seeds = r.graphs[4].seen[-1]
    want = row_seeds(5, [0, 1, 2], [6, 7, 8], params)
    assert temps[:3] == [0.0, torch.tensor(0.8).item(), 1.0] and seeds[:3] == want
    assert temps[3] == 0.0 and seeds[3] == 0  # the padding row: greedy, seed 0
    # the step hands on the graph's ids (no draw after the replay), for this step's rows only
    assert launched.token_ids() == [s % VOCAB for s in want]


class _DrawsAfter(DeviceSampling):
    """DeviceSampling that records the logits it is asked to draw from (and draws token 0)."""

    def __call__(self, plan, logits):
        self.calls.append(logits.clone())
        return torch.zeros(len(plan.sample_rows), dtype=torch.int64)


def _spy(r):
    spy = _DrawsAfter(5, torch.device("cpu"), r.staging, r._device_sampling.gumbel_kernel)
    spy.calls = []
    r.sampling = r._device_sampling = spy
    return spy


def test_a_step_the_graph_may_not_draw_is_drawn_after_it_from_the_graphs_logits():
    r = _runner(head_bs=4)
    spy = _spy(r)
    assert r.execute(_decode_plan(2, [SamplingParams()] * 2)).token_ids() and not spy.calls  # the graph drew
    launched = r.execute(_decode_plan(3, [SamplingParams(top_k=3)] + [SamplingParams()] * 2))  # not the kernel's
    assert len(spy.calls) == 1 and spy.calls[0].shape == (3, VOCAB)  # (the graph of 4: its padding row left out)
    assert spy.calls[0][:, 0].tolist() == [3.0, 4.0, 5.0]  # the graph's own logits, this step's rows
    assert launched.token_ids() == [0, 0, 0]


def test_a_host_strategy_keeps_its_own_copy_of_the_graphs_logits():
    r = _runner(head_bs=4)
    kept = []
    r.sampling = TeacherForcing(lambda plan, logits: (kept.append(logits), [0] * len(plan.sample_rows))[1])
    r.execute(_decode_plan(1, [SamplingParams()]))
    r.execute(_decode_plan(1, [SamplingParams()]))  # the same graph replays: its logits are overwritten
    assert kept[0][0, 0].item() == 3.0 and kept[0].data_ptr() != r.graphs[1].logits.data_ptr()
    assert r.drawn is None  # a host strategy never takes the graph's ids


def test_no_draw_above_the_size_nor_without_the_kernel():
    r = _runner(head_bs=2)  # 3 rows replay the graph of 4, which only runs the model
    spy = _spy(r)
    r.execute(_decode_plan(3, [SamplingParams()] * 3))
    assert r.graphs[4].seen and r.drawn is None
    assert len(spy.calls) == 1 and spy.calls[0].shape == (3, VOCAB) and (spy.calls[0] == -1).all()  # LM head after
    r = _runner(head_bs=4, gumbel=False)  # the graph runs the LM head; the torch sampler draws after it
    spy = _spy(r)
    r.execute(_decode_plan(1, [SamplingParams()]))
    assert len(spy.calls) == 1 and r.drawn is None

