"""Bench workloads at their edges (labkit/bench/workloads.py): the seed of each timed repeat, a short warm-up
round, folding ids into a small vocabulary, the size limits, scaling a workload down twice; and the Transformers
baseline's batching and counting (labkit/bench/hf.py) on a stand-in model."""
from __future__ import annotations

import types

import pytest

from labkit.bench import hf
from labkit.bench.workloads import (
    MAX_ROUNDS,
    MAX_TOKENS,
    draw,
    draw_repeat,
    draw_warmup,
    fold_to_vocab,
    parse_workload,
)
from labkit.errors import LabkitError


def _w(**extra):
    return parse_workload({"requests": 6, "prompt_len": 3, "output_len": 10, **extra})


def test_timed_repeat_i_draws_with_seed_plus_i_when_seeds_vary():
    w = _w(seed=5, vary_seed=True)
    assert [draw_repeat(w, i).seed for i in range(3)] == [5, 6, 7]
    assert draw_repeat(w, 0).prompts == draw(w).prompts        # the first repeat is the workload's own draw
    fixed = _w(seed=5, vary_seed=False)
    assert [draw_repeat(fixed, i).seed for i in range(3)] == [5, 5, 5]


def test_a_short_warm_up_never_asks_more_requests_than_the_workload_has_and_caps_output():
    w = _w(warmup={"rounds": 1, "requests": 50, "output_len": 4})
    d = draw_warmup(w, 0)
    assert len(d) == 6 and d.max_tokens == [4] * 6


def test_a_warm_up_mapping_without_rounds_runs_one_round():
    assert _w(warmup={"requests": 2}).warmup.rounds == 1


def test_an_id_equal_to_the_vocabulary_size_is_folded():
    prompts, folded = fold_to_vocab([[1, 2, 8]], 8)     # ids 0..7 exist; 8 does not
    assert folded is True and prompts == [[1, 2, 0]]
    same, folded = fold_to_vocab([[1, 2, 7]], 8)
    assert folded is False and same == [[1, 2, 7]]


def test_the_size_limit_counts_the_longest_prompt_a_uniform_length_may_draw():
    # 32 requests of up to MAX_TOKENS / 16 tokens: 2 x MAX_TOKENS at the longest, though the shortest is 1 token.
    with pytest.raises(LabkitError, match="requests"):
        parse_workload({"requests": 32, "prompt_len": {"uniform": [1, MAX_TOKENS // 16]}, "output_len": 1})
    ok = parse_workload({"requests": 16, "prompt_len": {"uniform": [1, MAX_TOKENS // 16]}, "output_len": 1})
    assert ok.requests * ok.prompt_len.hi == MAX_TOKENS


def test_exactly_the_most_repeats_and_warm_up_rounds_are_taken():
    w = _w(repeats=MAX_ROUNDS, warmup=MAX_ROUNDS)
    assert w.repeats == MAX_ROUNDS and w.warmup.rounds == MAX_ROUNDS
    with pytest.raises(LabkitError, match="repeats"):
        _w(repeats=MAX_ROUNDS + 1)


def test_a_workload_scaled_down_twice_is_still_a_prefix_of_the_full_draw():
    w = parse_workload({"requests": 8, "prompt_len": {"uniform": [2, 9]}, "output_len": {"uniform": [1, 9]},
                        "seed": 3})
    full = draw(w)
    twice = w.scaled(5).scaled(2)
    assert twice.scaled_from == 8
    d = draw(twice)
    assert d.prompts == full.prompts[:2] and d.max_tokens == full.max_tokens[:2]


# ----------------------------------------------------------------------------- the Transformers baseline


def test_hf_batches_take_the_longest_outputs_first_keeping_ties_in_order():
    assert hf.batches([3, 9, 5, 9, 1], 2) == [[1, 3], [2, 0], [4]]


def test_hf_pads_with_the_smallest_eos_id_when_the_model_names_no_pad():
    cfg = types.SimpleNamespace(pad_token_id=None, eos_token_id=[7, 2, 5])
    model = types.SimpleNamespace(generation_config=types.SimpleNamespace(pad_token_id=None, eos_token_id=None),
                                  config=cfg)
    assert hf._pad_id(model) == 2


@pytest.mark.parametrize("version, kwarg", [("4.56.0", "dtype"), ("4.57.1", "dtype"), ("4.55.4", "torch_dtype"),
                                            ("3.99.0", "torch_dtype")])
def test_hf_takes_dtype_from_transformers_4_56_on(monkeypatch, version, kwarg):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setattr(transformers, "__version__", version)
    assert hf._dtype_kwarg() == kwarg


def test_hf_counts_a_request_up_to_and_including_its_first_eos():
    torch = pytest.importorskip("torch")
    EOS = 2

    class Model:
        config = types.SimpleNamespace(vocab_size=50, pad_token_id=0, eos_token_id=EOS)
        generation_config = types.SimpleNamespace(pad_token_id=0, eos_token_id=EOS)

        def generate(self, input_ids, attention_mask, **kw):
            # Row 0 says EOS as its third new token, row 1 never: each row generates max_new_tokens (5).
            new = torch.tensor([[9, 9, EOS, 9, 9], [9, 9, 9, 9, 9]])
            return torch.cat([input_ids, new[:input_ids.shape[0], :kw["max_new_tokens"]]], dim=1)

    w = parse_workload({"requests": 2, "prompt_len": 3, "output_len": 5, "ignore_eos": False, "temperature": 0})
    d = types.SimpleNamespace(prompts=[[4, 5, 6], [7, 8]], max_tokens=[5, 4])
    # Row 0: three tokens up to and including EOS. Row 1: its own max_tokens (4) of the batch's 5.
    assert hf.generate_draw(Model(), d, w, batch_size=2, device="cpu", seed=0) == 3 + 4
