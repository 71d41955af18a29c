"""Top-k and top-p reach the draw, through the engine as a user calls it, on the torch sampler and on the one-pass
Gumbel kernel's route (which cannot filter, so a filtering row must leave it): which rows count as filtering,
which draw may run inside a decode graph, and where greedy begins."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.sampler import MIN_TEMPERATURE, DeviceSampling, Sampler, effective_temperature
from engine.staging import Staging

from .test_graph_sampling import _decode_plan

PROMPTS = [[100 + i for i in range(9)], [300, 301, 302], [7, 8, 9, 10, 11]]


def _tokens(llm, params):
    return [o["token_ids"] for o in llm.generate(PROMPTS, params, use_tqdm=False)]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_top_k_1_and_a_tiny_top_p_draw_the_greedy_tokens_and_plain_sampling_does_not(tiny_model, backend,
                                                                                     monkeypatch):
    """At temperature 1 the tiny model's flat distributions make a draw differ from greedy at once; top_k=1, or a
    top_p below any token's mass, leaves only the top token. On the triton backend the engine's sampling rows go
    through the Gumbel kernel unless a row filters: a filter that is not seen would be drawn over the whole vocab."""
    if backend == "triton":
        pytest.importorskip("triton")
        from .test_engine_triton import _llm_choosing

        llm = _llm_choosing(monkeypatch, tiny_model, "triton", {"gumbel_sampler": True}, max_model_len=128,
                            num_kvcache_blocks=16)
    else:
        llm = LLM(tiny_model, device="cpu", enforce_eager=True, max_model_len=128, num_kvcache_blocks=16)
    n = dict(max_tokens=6, ignore_eos=True)
    greedy = _tokens(llm, SamplingParams(temperature=0, **n))
    sampled = _tokens(llm, SamplingParams(temperature=1.0, seed=3, **n))
    top_k = _tokens(llm, SamplingParams(temperature=1.0, seed=3, top_k=1, **n))
    top_p = _tokens(llm, SamplingParams(temperature=1.0, seed=3, top_p=1e-6, **n))
    # one filtering row beside two that do not: the filter holds for its row, the others still sample
    mixed = _tokens(llm, [SamplingParams(temperature=1.0, seed=3, **n), SamplingParams(temperature=1.0, seed=3,
                                                                                        top_k=1, **n),
                          SamplingParams(temperature=1.0, seed=3, **n)])
    llm.exit()
    assert sampled != greedy
    assert top_k == greedy and top_p == greedy
    assert mixed[1] == greedy[1] and mixed[0] == sampled[0] and mixed[2] == sampled[2]


def _sampling(gumbel: bool, seed: int = 5) -> DeviceSampling:
    return DeviceSampling(seed, torch.device("cpu"), Staging(torch.device("cpu")), gumbel)


@pytest.mark.parametrize("params, drawn_in_graph", [
    ([SamplingParams(), SamplingParams(temperature=0)], True),
    ([SamplingParams(top_k=0), SamplingParams(top_k=-1), SamplingParams(top_p=1.0)], True),  # (no filter)
    ([SamplingParams(), SamplingParams(top_k=1)], False),
    ([SamplingParams(top_k=2)], False),
    ([SamplingParams(), SamplingParams(top_p=0.9)], False),
    ([SamplingParams(top_p=0.999)], False),
])
def test_a_decode_graph_draws_only_rows_that_filter_nothing(params, drawn_in_graph):
    plan = _decode_plan(len(params), params)
    temps, seeds, filtering = _sampling(True).rows(plan)
    assert (filtering == []) == drawn_in_graph
    assert (_sampling(True).in_graph(plan) is not None) == drawn_in_graph
    assert _sampling(False).in_graph(plan) is None  # (without the Gumbel kernel nothing is drawn in the graph)


def test_top_k_0_beside_a_filtering_row_filters_nothing():
    """top_k <= 0 means no top-k (vLLM's -1, nano's 0), also where another row's top_k uploads the column."""
    logits = (-0.1 * torch.arange(8.0)).repeat(2, 1)  # every id possible, ids 0 and 1 the two best
    drawn = [set(), set()]
    for seed in range(200):
        ids = Sampler()(logits, torch.ones(2), top_ks=torch.tensor([0, 2]), seeds=torch.tensor([seed, seed + 999]))
        for row, i in enumerate(ids.tolist()):
            drawn[row].add(i)
    assert drawn[0] == set(range(8))
    assert drawn[1] == {0, 1}


def test_greedy_begins_below_min_temperature():
    """vLLM's _SAMPLING_EPS: a temperature below it is greedy, the eps itself still samples."""
    assert effective_temperature(MIN_TEMPERATURE) == MIN_TEMPERATURE
    assert effective_temperature(MIN_TEMPERATURE * 0.999) == 0.0
    assert effective_temperature(0.7) == 0.7


@pytest.mark.parametrize("params, by_torch", [
    ([SamplingParams(), SamplingParams(top_k=3), SamplingParams(top_p=0.5), SamplingParams(top_k=0, top_p=1.0)],
     [1, 2]),
    ([SamplingParams(top_k=-1), SamplingParams(top_k=0), SamplingParams(top_p=1.0)], []),
    ([SamplingParams(top_k=1, top_p=0.9)], [0]),
])
def test_under_the_gumbel_kernel_only_the_rows_that_filter_are_drawn_by_the_torch_sampler(params, by_torch,
                                                                                          monkeypatch):
    """Which sampler draws each row depends on that row's own parameters alone: the two draw different noise, so a
    row routed by its batch would change with what else runs beside it."""
    import engine.kernels.gumbel_sampler as gumbel

    seen = {}

    def kernel(logits, temperatures, seeds):
        seen["kernel"] = len(logits)
        return torch.arange(len(logits)) + 1000

    def torch_sampler(logits, temperatures, top_ks, top_ps, greedy_rows, seeds):
        seen["torch"] = (len(logits), None if top_ks is None else top_ks.tolist(),
                         None if top_ps is None else top_ps.tolist(), seeds.tolist())
        return torch.arange(len(logits)) + 2000

    monkeypatch.setattr(gumbel, "gumbel_argmax", kernel)
    sampling = _sampling(True)
    monkeypatch.setattr(sampling, "torch_sampler", torch_sampler)
    plan = _decode_plan(len(params), params)
    ids = sampling(plan, torch.zeros(len(params), 5)).tolist()
    want = [1000 + i for i in range(len(params))]
    for j, i in enumerate(by_torch):
        want[i] = 2000 + j
    assert ids == want and seen["kernel"] == len(params)
    if by_torch:
        n, top_ks, top_ps, seeds = seen["torch"]
        _, all_seeds, filtering = sampling.rows(plan)
        any_k = any(params[i].top_k > 0 for i in by_torch)
        any_p = any(params[i].top_p < 1.0 for i in by_torch)
        assert filtering == by_torch and n == len(by_torch) and seeds == [all_seeds[i] for i in by_torch]
        assert top_ks == ([params[i].top_k for i in by_torch] if any_k else None)
        assert top_ps == (pytest.approx([params[i].top_p for i in by_torch]) if any_p else None)
    else:
        assert "torch" not in seen


@pytest.mark.parametrize("gumbel", [False, True])
def test_a_greedy_row_that_filters_is_still_greedy_beside_sampled_rows(gumbel):
    """A greedy row (temperature 0) with a top-k beside sampled rows with one: the greedy row takes its argmax
    whatever the seed, on the torch sampler's 'some greedy rows' route."""
    logits = torch.tensor([[0.0, 0.3, 0.2, -5.0, -5.0, -5.0, -5.0, -5.0]] * 3)
    params = [SamplingParams(temperature=0, top_k=3), SamplingParams(temperature=1.0, top_k=3),
              SamplingParams(temperature=1.0, top_k=3)]
    drawn = set()
    plan = _decode_plan(3, params)
    for seed in range(40):
        ids = _sampling(gumbel, seed)(plan, logits.clone()).tolist()
        assert ids[0] == 1, ids
        drawn.update(ids[1:])
    assert drawn == {0, 1, 2}  # (the sampled rows do sample, inside their top 3)
