"""`labkit shapes`: the per-rank numbers worked out by hand for a small config."""
from __future__ import annotations

import pytest

from labkit.errors import LabkitError
from labkit.shapes import per_rank_shapes

# 2 layers, hidden 16, 4 q heads and 2 kv heads of 8, vocab 32, intermediate 24, bfloat16 (2 bytes).
CFG = {"hidden_size": 16, "vocab_size": 32, "intermediate_size": 24, "num_attention_heads": 4,
       "num_key_value_heads": 2, "num_hidden_layers": 2, "head_dim": 8, "dtype": "bfloat16"}


def test_kv_bytes_per_token_count_k_and_v_on_every_layer():
    t = per_rank_shapes(CFG, 2)
    # K and V (2) x 2 layers x kv heads x head_dim 8 x 2 bytes
    assert t["kv_bytes_per_token"]["full"] == 2 * 2 * 2 * 8 * 2 == 128
    assert t["kv_bytes_per_token"]["rank"] == 2 * 2 * 1 * 8 * 2 == 64


def test_collectives_are_the_embedding_and_two_per_layer():
    assert per_rank_shapes(CFG, 2)["collectives_per_step"] == {"all_reduce": 1 + 2 * 2, "gather": 1}
    assert per_rank_shapes(CFG, 1)["collectives_per_step"] == {"all_reduce": 0, "gather": 0}


def test_eight_ranks_is_allowed_and_nine_is_not():
    cfg = dict(CFG, num_attention_heads=8, num_key_value_heads=8, vocab_size=64, intermediate_size=32)
    assert per_rank_shapes(cfg, 8)["heads"]["kv"]["rank"] == 1
    with pytest.raises(LabkitError):
        per_rank_shapes(cfg, 9)
    with pytest.raises(LabkitError):
        per_rank_shapes(cfg, 0)


def test_a_tied_lm_head_is_not_counted_twice():
    untied = per_rank_shapes(dict(CFG, tie_word_embeddings=False), 1)["param_bytes_per_rank"]
    tied = per_rank_shapes(dict(CFG, tie_word_embeddings=True), 1)["param_bytes_per_rank"]
    # the lm_head is vocab x hidden = 32 x 16 parameters of 2 bytes, held once when tied
    assert untied - tied == 32 * 16 * 2


def test_vocab_slices_are_half_open_and_cover_the_vocabulary():
    # 32 ids over 2 ranks: [0, 16) and [16, 32), as `labkit shapes` prints them
    assert per_rank_shapes(CFG, 2)["vocab_ranges"] == [[0, 16], [16, 32]]
