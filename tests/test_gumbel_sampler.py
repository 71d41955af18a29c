"""The one-pass Gumbel-max sampler (engine/kernels/gumbel_sampler.py) in Triton's interpreter on a CPU (conftest.py),
greedy rows, the distribution drawn, a draw
independent of the vocabulary's split and of the batch, ties, an all -inf row."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_gumbel_argmax_greedy_rows_are_argmax_and_sampled_rows_follow_the_distribution():
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


def test_gumbel_argmax_draw_does_not_depend_on_how_the_vocabulary_is_split():
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


def test_gumbel_argmax_all_minus_inf_row_gives_index_zero_like_torch():
    from engine.kernels.gumbel_sampler import gumbel_argmax

    logits = torch.full((1, 300), float("-inf"), device=DEVICE)
    seeds = torch.ones(1, dtype=torch.int64, device=DEVICE)
    assert gumbel_argmax(logits, torch.zeros(1, device=DEVICE), seeds, block=64, num_chunks=4).tolist() == [0]


def test_the_chunk_count_follows_the_programs_an_sm(monkeypatch):
    """LABKIT_GUMBEL_PER_SM: a row's chunks cover every SM that many times (never a chunk under one block)."""
    from engine.kernels import gumbel_sampler

    assert gumbel_sampler.num_chunks_for(256, 151936, 1024, 132, per_sm=2) == 2
    assert gumbel_sampler.num_chunks_for(256, 151936, 1024, 132, per_sm=16) == 9
    assert gumbel_sampler.num_chunks_for(1, 151936, 1024, 132, per_sm=16) == 149  # one chunk a block at most
    monkeypatch.setattr(gumbel_sampler, "PROGRAMS_PER_SM", 8)
    assert gumbel_sampler.num_chunks_for(256, 151936, 1024, 132) == 5
