"""A checkpoint's config.json as the engine reads it, without transformers.

The fields the engine uses, each with the default transformers' Qwen3Config gives when a config.json leaves
it out (so a sparse config means what it means there); every other field of the file is kept as it is.
tests/test_tokenizer.py compares the result with AutoConfig on full and sparse configs.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

QWEN3_DEFAULTS = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
}  # (rope: engine/models/qwen3.py reads rope_theta, else rope_parameters or rope_scaling, else 10000)


def load_model_config(model: str | Path) -> SimpleNamespace:
    path = Path(model) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if data.get("model_type") == "qwen3":
        for key, value in QWEN3_DEFAULTS.items():
            data.setdefault(key, value)
        if data["num_key_value_heads"] is None:  # (Qwen3Config: null means one KV head per query head)
            data["num_key_value_heads"] = data["num_attention_heads"]
    return SimpleNamespace(**data)
