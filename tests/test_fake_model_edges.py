"""The fake checkpoints at their edges, where the recorded hashes (tests/test_fake_model_identity.py: the presets'
configs and the tiny float32 weights) do not look: a float16 or bfloat16 variant's bytes and header, an untied
head, the qwen3-0.6b preset's own init scales, the stop tokens and chat template the tokenizer files give, and a
write that fails half way."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from labkit import fake_model
from labkit.fake_model import make_fake_model, preset_config, special_token_ids


def _header(path: Path) -> tuple[int, dict]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return 8 + n, json.loads(raw[8:8 + n])


@pytest.mark.parametrize("dtype, label, torch_dtype", [("float16", "F16", torch.float16),
                                                        ("bfloat16", "BF16", torch.bfloat16)])
def test_a_half_precision_checkpoint_holds_its_dtypes_bytes_under_its_label(tmp_path, dtype, label, torch_dtype):
    from safetensors.torch import load_file

    folder = make_fake_model("tiny", tmp_path / dtype, overrides={"dtype": dtype})
    weights = folder / "model.safetensors"
    start, header = _header(weights)
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert {v["dtype"] for v in tensors.values()} == {label}
    end = max(v["data_offsets"][1] for v in tensors.values())
    assert weights.stat().st_size == start + end == start + 2 * sum(math.prod(v["shape"]) for v in tensors.values())
    loaded = load_file(weights)
    assert all(t.dtype == torch_dtype for t in loaded.values())
    # the same draw as the float32 model, rounded
    cfg = json.loads((folder / "config.json").read_text())
    name = "model.layers.0.self_attn.q_proj.weight"
    f32 = fake_model.make_tensor(name, tuple(loaded[name].shape), "proj", {**cfg, "dtype": "float32"}, 0)
    assert torch.equal(loaded[name], f32.to(torch_dtype))


def test_an_untied_checkpoint_stores_its_head_in_the_embeddings_shape(tmp_path):
    folder = make_fake_model("tiny", tmp_path / "untied", overrides={"tie_word_embeddings": False})
    _, header = _header(folder / "model.safetensors")
    cfg = json.loads((folder / "config.json").read_text())
    assert header["lm_head.weight"]["shape"] == header["model.embed_tokens.weight"]["shape"] \
        == [cfg["vocab_size"], cfg["hidden_size"]]


def test_the_06b_preset_draws_its_weights_with_its_own_calmer_scales():
    cfg = preset_config("qwen3-0.6b", overrides={"num_hidden_layers": 1, "vocab_size": 4096})
    init = cfg["labkit_fake"]["init"]
    assert init["out_gain"] == 1.0 and init["qk_norm_mean"] == 0.5
    specs = {name: (shape, kind) for name, shape, kind in fake_model.tensor_specs(cfg)}
    o_name = "model.layers.0.self_attn.o_proj.weight"
    o = fake_model.make_tensor(o_name, *specs[o_name], cfg, 0).float()
    half_width = math.sqrt(3) * init["out_gain"] / math.sqrt(specs[o_name][0][1])
    assert o.abs().max() <= half_width * 1.01 and o.abs().max() > half_width * 0.9
    q_name = "model.layers.0.self_attn.q_norm.weight"
    q = fake_model.make_tensor(q_name, *specs[q_name], cfg, 0).float()
    assert abs(q.mean().item() - 0.5) < 0.05 and (q - 0.5).abs().max() <= 0.125 * 1.01


def test_the_tokenizer_files_stop_a_chat_reply_at_im_end_and_text_at_endoftext(tiny_model):
    from engine.tokenizer import Tokenizer

    endoftext, im_start, im_end = special_token_ids()
    folder = Path(tiny_model)
    generation = json.loads((folder / "generation_config.json").read_text())
    assert sorted(generation["eos_token_id"]) == sorted([im_end, endoftext])
    tok = Tokenizer(folder)
    assert tok.eos_token_id == im_end
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_write_that_fails_half_way_leaves_no_weights_and_no_config(tmp_path, monkeypatch):
    real = fake_model.make_tensor
    calls = []

    def fails_on_the_third(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 3:
            raise OSError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(fake_model, "make_tensor", fails_on_the_third)
    out = tmp_path / "model"
    with pytest.raises(OSError, match="disk full"):
        make_fake_model("tiny", out)
    assert not (out / "model.safetensors").exists() and not (out / "config.json").exists()
