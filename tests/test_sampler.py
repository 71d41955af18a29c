import pytest
import torch

from engine.sampler import Sampler
from engine.sampling_params import SamplingParams


def _logits(batch=4, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, vocab, generator=g) * 3


def test_greedy_is_argmax():
    logits = _logits()
    out = Sampler()(logits, torch.zeros(4), greedy_rows="all")
    assert out.tolist() == Sampler()(logits, torch.zeros(4)).tolist()
    assert out.tolist() == logits.argmax(-1).tolist()


def test_top_k_only_draws_from_the_k_best():
    logits = _logits(batch=2)
    sampler = Sampler(seed=1)
    top3 = logits.topk(3, dim=-1).indices
    seen = [set(), set()]
    for _ in range(300):
        out = sampler(logits, torch.full((2,), 5.0), top_ks=torch.tensor([3, 3]))
        for i, t in enumerate(out.tolist()):
            assert t in top3[i].tolist()
            seen[i].add(t)
    assert all(len(s) == 3 for s in seen)  # high temperature: all three show up


def test_top_p_keeps_the_smallest_covering_prefix():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    sampler = Sampler(seed=2)
    drawn = {sampler(logits, torch.ones(1), top_ps=torch.tensor([0.75])).item() for _ in range(300)}
    assert drawn == {0, 1}  # 0.5 < 0.75 needs the second token; 0.8 >= 0.75 stops there
    drawn = {sampler(logits, torch.ones(1), top_ps=torch.tensor([0.4])).item() for _ in range(100)}
    assert drawn == {0}


def test_mixed_batch_greedy_and_sampled_rows():
    logits = _logits(batch=2, vocab=1000)
    sampler = Sampler(seed=3)
    outs = [sampler(logits, torch.tensor([0.0, 1.0])).tolist() for _ in range(50)]
    assert all(o[0] == logits[0].argmax().item() for o in outs)
    assert len({o[1] for o in outs}) > 1


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.7, 0.2, 0.1])
    sampler = Sampler(seed=4)
    n = 4000
    out = sampler(probs.log().expand(n, 3).contiguous(), torch.ones(n))
    freq = torch.bincount(out, minlength=3).float() / n
    assert torch.allclose(freq, probs, atol=0.03)


@pytest.mark.parametrize("kwargs, name", [
    ({"temperature": -0.1}, "temperature"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"top_k": -2}, "top_k"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
])
def test_bad_sampling_params_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_temperature_reshapes_the_distribution():
    """p ** (1 / T), renormalised: T = 0.5 sharpens [0.7, 0.2, 0.1] to about [0.91, 0.07, 0.02], T = 2
    flattens it to about [0.51, 0.27, 0.19]. (A sampler that drops the temperature draws [0.7, 0.2, 0.1].)"""
    probs = torch.tensor([0.7, 0.2, 0.1])
    n = 4000
    for temperature in (0.5, 2.0):
        sampler = Sampler(seed=5)
        out = sampler(probs.log().expand(n, 3).contiguous(), torch.full((n,), temperature))
        freq = torch.bincount(out, minlength=3).float() / n
        want = probs ** (1 / temperature)
        assert torch.allclose(freq, want / want.sum(), atol=0.03), (temperature, freq)


def test_top_p_drops_a_token_once_the_mass_before_it_reaches_top_p_exactly():
    """Four equal logits: each token has mass 0.25 exactly, so top_p 0.5 keeps two tokens and 0.75 three:
    the third token's preceding mass (0.5) already reaches 0.5."""
    logits = torch.zeros(1, 4)
    for top_p, kept in ((0.5, 2), (0.75, 3)):
        sampler = Sampler(seed=6)
        drawn = {sampler(logits, torch.ones(1), top_ps=torch.tensor([top_p])).item() for _ in range(300)}
        assert len(drawn) == kept, (top_p, drawn)


@pytest.mark.parametrize("temperature", [1e-39, 1e-44, 1e-46, 0.5e-5])
def test_a_temperature_too_small_to_divide_by_samples_greedily(tiny_model, temperature):
    """Below MIN_TEMPERATURE (1e-5) a row is greedy, in LLM.generate as on the server (the same sampler): before,
    1e-39 and 1e-44 gave id 0 for every token and 1e-46 sampled at random."""
    import warnings

    from engine import LLM

    llm = LLM(tiny_model, device="cpu", enforce_eager=True, max_model_len=128, num_kvcache_blocks=16)
    prompts = [[100 + i for i in range(9)], [300, 301, 302]]
    greedy = [o["token_ids"]
              for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny = [o["token_ids"] for o in llm.generate(prompts, SamplingParams(temperature=temperature, max_tokens=8),
                                                     use_tqdm=False)]
    llm.exit()
    assert tiny == greedy and len(set(greedy[0])) > 1


def test_top_p_too_small_for_float32_keeps_the_top_token():
    logits = _logits(batch=3, vocab=40)
    out = Sampler(seed=7)(logits, torch.ones(3), top_ps=torch.tensor([1e-300, 1e-45, 1e-9]).double().float())
    assert out.tolist() == logits.argmax(-1).tolist()


def test_a_huge_temperature_is_uniform_without_warnings(tiny_model):
    import warnings

    from engine import LLM

    llm = LLM(tiny_model, device="cpu", enforce_eager=True, max_model_len=128, num_kvcache_blocks=16, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outs = llm.generate([[100, 101, 102]] * 4, SamplingParams(temperature=1e308, max_tokens=16, ignore_eos=True),
                            use_tqdm=False)
    llm.exit()
    tokens = [t for o in outs for t in o["token_ids"]]
    assert len(set(tokens)) > 40  # 64 draws from a 2,048-token vocabulary, near uniform: few repeats


def test_keyed_uniform_never_draws_zero_even_where_the_hash_is_zero():
    """The row-seeded uniforms are (k + 0.5) / 2**24 for the hash's top 24 bits k: strictly inside (0, 1), so
    -log(u) is finite for every token. Seed 1 hashes to k = 0 at index 1,744,052 (found by search): without the
    half step that token's Gumbel noise would be infinite and the token never drawn."""
    from engine.sampler import _shr, keyed_uniform

    u = keyed_uniform(torch.tensor([1, 2]), 1_744_053)
    assert u[0, 1_744_052].item() == pytest.approx(0.5 / (1 << 24), rel=1e-6)
    assert 0 < u.min().item() and u.max().item() < 1
    # Every value sits at the centre of its 2**-24 cell (the hash's top 24 bits, read back).
    k = u * (1 << 24) - 0.5
    assert torch.equal(k, k.round()) and int(k.min()) >= 0 and int(k.max()) < (1 << 24)
    assert _shr(torch.tensor([-1]), 40).item() == (1 << 24) - 1   # the logical shift keeps 24 bits
