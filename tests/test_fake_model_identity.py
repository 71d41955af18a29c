"""The fake checkpoints are the same bytes wherever they are made: every figure this project records (the H200's
benches and logits checks, the CPU's) names its model by config.json's sha256, and the weights are drawn from
that config and the seed alone. The config hashes below are the ones the H200 runs recorded (docs/gpu-runs: every
bench of the qwen3-0.6b preset, and the tiny model's logits check); the tiny weights' hash is this machine's,
which fake_model.py's docstring states a CUDA build gives too. A change to a preset, its init scales or the draw
changes them: that is a new model, and every recorded figure stops applying to it."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from labkit.fake_model import _dumps, preset_config

# sha256 of config.json as the H200 runs recorded it (run_start / bench "config_sha256").
RECORDED = {"qwen3-0.6b": "074a650054f738e5570f077b15a045f8073dd273c30a441e0e78c6041ca9baeb",
            "tiny": "2306eaf031038d75ad6cb57ed9ac9b881bc6d400b9e09db1922bb3557c8c7b9c"}
TINY_WEIGHTS = "60ecdee2e77694fd11d204a68939c48172a5ce119efd8a4231f1f4fa286604ac"


@pytest.mark.parametrize("preset", sorted(RECORDED))
def test_each_presets_config_is_the_one_the_device_runs_recorded(preset):
    assert hashlib.sha256(_dumps(preset_config(preset, 0)).encode()).hexdigest() == RECORDED[preset]


def test_the_tiny_models_files_are_the_recorded_bytes(tiny_model):
    folder = Path(tiny_model)
    assert hashlib.sha256((folder / "config.json").read_bytes()).hexdigest() == RECORDED["tiny"]
    assert hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest() == TINY_WEIGHTS


@pytest.mark.parametrize("overrides, name", [({"vocab_size": 2049}, "vocab_size"), ({"vocab_size": 2046}, "vocab_size"),
                                             ({"num_key_value_heads": 3}, "num_key_value_heads"),
                                             ({"dtype": "int8"}, "dtype")])
def test_a_preset_a_checkpoint_cannot_have_is_refused(overrides, name):
    """An odd vocabulary (two ranks could not split it), one smaller than the tokenizer's, heads the KV heads do
    not divide, a dtype safetensors is not written in."""
    with pytest.raises(ValueError, match=name):
        preset_config("tiny", 0, overrides)
