"""The one-pass Gumbel-max sampler (engine/kernels/gumbel_sampler.py) in Triton's interpreter on a CPU (conftest.py),
at one Philox call an element and at one for four (LABKIT_GUMBEL_RNG): greedy rows, the distribution drawn, a draw
independent of the vocabulary's split and of the batch, ties, an all -inf row."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(params=[1, 4], ids=["rng1", "rng4"])
def rng(request, monkeypatch):
    """LABKIT_GUMBEL_RNG: one Philox call an element, or one for four."""
    from engine.kernels import gumbel_sampler

    monkeypatch.setattr(gumbel_sampler, "RNG_PER_CALL", request.param)
    return request.param


def test_gumbel_argmax_greedy_rows_are_argmax_and_sampled_rows_follow_the_distribution(rng):
    from engine.kernels.gumbel_sampler import gumbel_argmax

    g = torch.Generator().manual_seed(7)
    logits = (torch.randn(3, 300, generator=g) * 3).to(DEVICE)
    seeds = torch.arange(400, device=DEVICE) * 7919 + 3
    greedy = gumbel_argmax(logits, torch.zeros(3, device=DEVICE), seeds[:3], block=128)
    assert greedy.tolist() == logits.argmax(-1).tolist()
    probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
    n = 400  # Triton's CPU interpreter runs one program per row: keep this small (one standard error is ~0.025)
    rows = probs.log().expand(n, 4).contiguous().to(DEVICE)
    drawn = gumbel_argmax(rows, torch.ones(n, device=DEVICE), seeds[:n], block=4)
    freq = torch.bincount(drawn.cpu(), minlength=4).float() / n
    assert torch.allclose(freq, probs, atol=0.06)
    again = gumbel_argmax(rows[:50], torch.ones(50, device=DEVICE), seeds[:50], block=4)
    assert torch.equal(drawn[:50], again)  # a row's seed fixes its draw, whatever else is in the batch
    hot = gumbel_argmax(rows[:100], torch.full((100,), 50.0, device=DEVICE), seeds[100:200], block=4)
    assert len(set(hot.tolist())) == 4  # a high temperature flattens the distribution


def test_gumbel_argmax_draw_does_not_depend_on_how_the_vocabulary_is_split(rng):
    from engine.kernels.gumbel_sampler import gumbel_argmax

    g = torch.Generator().manual_seed(11)
    logits = (torch.randn(4, 1000, generator=g) * 2).to(DEVICE)
    logits[3, 517] = logits[3, 901] = 50.0  # a tie: the first index must win in every split
    temps = torch.tensor([0.0, 0.7, 1.3, 0.0], device=DEVICE)
    seeds = torch.tensor([9, 10, 11, 12], device=DEVICE)
    draws = [gumbel_argmax(logits, temps, seeds, block=64, num_chunks=c).tolist() for c in (1, 3, 16)]
    assert draws[0] == draws[1] == draws[2]
    assert draws[0][0] == logits[0].argmax().item() and draws[0][3] == 517
    other = gumbel_argmax(logits, temps, seeds + 1, block=64, num_chunks=3).tolist()
    assert other[0] == draws[0][0] and other[3] == 517  # greedy rows ignore the seed


def test_gumbel_argmax_all_minus_inf_row_gives_index_zero_like_torch(rng):
    from engine.kernels.gumbel_sampler import gumbel_argmax

    logits = torch.full((1, 300), float("-inf"), device=DEVICE)
    seeds = torch.ones(1, dtype=torch.int64, device=DEVICE)
    assert gumbel_argmax(logits, torch.zeros(1, device=DEVICE), seeds, block=64, num_chunks=4).tolist() == [0]


def test_four_uniforms_a_philox_call_cover_every_element_once(monkeypatch):
    """LABKIT_GUMBEL_RNG=4: element i of a block takes lane i % LANES's uniform number i // LANES. Flat logits
    make the draw the argmax of the noise alone: over many seeds every element of a 64-element vocabulary must be
    drawn (an element left out, or two sharing one lane's uniform, shows as a gap or a skew)."""
    from engine.kernels import gumbel_sampler

    monkeypatch.setattr(gumbel_sampler, "RNG_PER_CALL", 4)
    n = 1024
    flat = torch.zeros(n, 64, device=DEVICE)
    drawn = gumbel_sampler.gumbel_argmax(flat, torch.ones(n, device=DEVICE),
                                         torch.arange(n, device=DEVICE) * 104729 + 1, block=64, num_chunks=1)
    counts = torch.bincount(drawn.cpu(), minlength=64)
    assert (counts > 0).all() and counts.max().item() < 3 * n / 64, counts.tolist()
    monkeypatch.setattr(gumbel_sampler, "RNG_PER_CALL", 1)
    other = gumbel_sampler.gumbel_argmax(flat, torch.ones(n, device=DEVICE),
                                         torch.arange(n, device=DEVICE) * 104729 + 1, block=64, num_chunks=1)
    # another noise stream, but for the first quarter of a block (lane i, uniform 0: counter i in both): other tokens
    assert (other != drawn).float().mean().item() > 0.75
