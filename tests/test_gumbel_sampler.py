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
    monkeypatch.setattr(gumbel_sampler, "PROGRAMS_PER_SM", 4)
    assert gumbel_sampler.num_chunks_for(256, 151936, 1024, 132) == 3


def _mix32_reference(x):
    """lowbias32 in numpy's wrapping uint32 arithmetic: an implementation apart from the kernel's."""
    import numpy as np

    x = np.asarray(x, dtype=np.uint32)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x7FEB352D)
        x = x ^ (x >> np.uint32(15))
        x = x * np.uint32(0x846CA68B)
        x = x ^ (x >> np.uint32(16))
    return x


def _hash_noise_reference(seed: int, vocab: int):
    """The hash noise's Gumbel values for one row: -log(E), E = -log(1 - v), v = (the index's word + 1/2) / 2^32
    from two keyed mixes of the index, in float64."""
    import numpy as np

    k1 = _mix32_reference(np.uint32(seed & 0xFFFFFFFF) ^ np.uint32(0x9E3779B9))
    k2 = _mix32_reference(np.uint32((seed >> 32) & 0xFFFFFFFF) ^ _mix32_reference(np.uint32(seed & 0xFFFFFFFF)
                                                                                ^ np.uint32(0x85EBCA6B)))
    bits = _mix32_reference(_mix32_reference(np.arange(vocab, dtype=np.uint32) ^ k1) ^ k2)
    v = np.minimum((bits.astype(np.float64) + 0.5) * 2.0**-32, 1 - 2.0**-24)
    return torch.from_numpy(-np.log(-np.log1p(-v)))


def test_hash_noise_draws_what_an_independent_reference_of_its_hash_draws():
    """LABKIT_GUMBEL_NOISE=hash: each row's draw is argmax(logits / T + G) with G computed here in numpy (float64)
    from the same mixer and keys, so a wrong constant, shift, key or log in the kernel changes the ids."""
    from engine.kernels.gumbel_sampler import gumbel_argmax

    g = torch.Generator().manual_seed(5)
    rows, vocab = 24, 700
    logits = torch.randn(rows, vocab, generator=g) * 2
    temps = torch.rand(rows, generator=g) + 0.5
    seeds = torch.randint(0, 2**62, (rows,), generator=g)
    seeds[:4] = torch.tensor([0, 1, 2**32, 2**32 + 1])  # keys that differ only in one half of the seed
    want = [int((logits[r].double() / temps[r].item() + _hash_noise_reference(int(seeds[r]), vocab)).argmax())
            for r in range(rows)]
    got = gumbel_argmax(logits.to(DEVICE), temps.to(DEVICE), seeds.to(DEVICE), block=128, num_chunks=3,
                        noise="hash").tolist()
    assert got == want
    assert len(set(want[:4])) > 1  # the four near-equal seeds draw apart


def test_hash_noise_follows_the_distribution_and_splits_alike():
    from engine.kernels.gumbel_sampler import gumbel_argmax

    probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
    n = 400
    rows = probs.log().expand(n, 4).contiguous().to(DEVICE)
    seeds = torch.arange(n, device=DEVICE) * 7919 + 3  # consecutive-ish seeds, as a server's rows have
    drawn = gumbel_argmax(rows, torch.ones(n, device=DEVICE), seeds, block=4, noise="hash")
    freq = torch.bincount(drawn.cpu(), minlength=4).float() / n
    assert torch.allclose(freq, probs, atol=0.06)
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(3, 1000, generator=g) * 2).to(DEVICE)
    temps = torch.tensor([0.0, 0.8, 1.2], device=DEVICE)
    s3 = torch.tensor([4, 5, 6], device=DEVICE)
    draws = [gumbel_argmax(logits, temps, s3, block=64, num_chunks=c, noise="hash").tolist() for c in (1, 5)]
    assert draws[0] == draws[1] and draws[0][0] == logits[0].argmax().item()
    with pytest.raises(ValueError, match="noise"):
        gumbel_argmax(logits, temps, s3, noise="xorshift")


def test_hash_noise_uniforms_are_uniform_across_indices_and_across_seeds():
    """The design itself (the kernel equals this reference above): uniforms from 2,000 seeds x 256 indices
    fill 16 bins evenly, and so does each single index across the seeds (index 0 once drew one word for every
    seed under 2^32)."""
    import numpy as np

    seeds = (list(range(1000)) + [s << 32 for s in range(1, 501)]
             + [(s * 0x9E3779B97F4A7C15) % 2**62 for s in range(500)])
    g = np.stack([_hash_noise_reference(s, 256).numpy() for s in seeds])
    u = np.exp(-np.exp(-g))  # back to the uniforms
    bins = np.histogram(u, bins=16, range=(0, 1))[0]
    expected = u.size / 16
    assert ((bins - expected) ** 2 / expected).sum() < 40  # chi-square, 15 dof: p ~ 5e-4 at 40
    for index in (0, 1, 255):
        col = np.histogram(u[:, index], bins=8, range=(0, 1))[0]
        assert ((col - len(seeds) / 8) ** 2 / (len(seeds) / 8)).sum() < 30, index  # 7 dof
