"""What the loader makes of a checkpoint (engine/loader.py, the shard-aware layers): a tensor missing from it is
refused by name, packed shards (q/k/v, gate/up) included, and a model with attention biases (Qwen3's
attention_bias) computes Transformers' logits, with the same logits when two tensor-parallel ranks share it
(row-parallel o_proj adds its bias once, on rank 0's partial sum)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM, SamplingParams
from engine.sampler import TeacherForcing

SMALL = dict(device="cpu", enforce_eager=True, max_model_len=256, max_num_batched_tokens=256, max_num_seqs=4,
             kvcache_block_size=16, num_kvcache_blocks=32)


def _copy_with(tiny_model, dst: Path, change) -> Path:
    """The tiny checkpoint with its tensors changed by change(tensors, config)."""
    shutil.copytree(tiny_model, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    change(tensors, cfg)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("name, named", [
    ("model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.qkv_proj.weight:v"),
    ("model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.gate_up_proj.weight:1"),
    ("model.layers.1.input_layernorm.weight", "model.layers.1.input_layernorm.weight"),
])
def test_a_checkpoint_missing_one_tensor_is_refused_naming_it(tiny_model, tmp_path, name, named):
    path = _copy_with(tiny_model, tmp_path / "m", lambda t, cfg: t.pop(name))
    with pytest.raises(ValueError, match="lacks 1 tensors") as err:
        LLM(str(path), **SMALL)
    assert named in str(err.value)


def _with_biases(tensors, cfg):
    cfg["attention_bias"] = True
    gen = torch.Generator().manual_seed(7)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}.self_attn."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            rows = tensors[p + proj + ".weight"].shape[0]
            tensors[p + proj + ".bias"] = torch.rand(rows, generator=gen) - 0.5


def _first_logits(llm, prompts) -> list[torch.Tensor]:
    rows = []

    def choose(plan, logits):
        rows.append(logits.float().clone())
        return [100 for _ in plan.sample_rows]

    llm.sampling = TeacherForcing(choose)
    for p in prompts:
        llm.add_request(p, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    while not llm.is_finished():
        llm.step()
    return rows


def test_attention_biases_give_transformers_logits_on_one_rank_and_on_two(tiny_model, tmp_path):
    from transformers import Qwen3ForCausalLM

    path = _copy_with(tiny_model, tmp_path / "bias", _with_biases)
    prompts = [list(range(100, 130)), [42, 43, 44, 45]]
    hf = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        want = torch.stack([hf(torch.tensor([p]), use_cache=False).logits[0, -1] for p in prompts])
    logits = {}
    for tp in (1, 2):
        llm = LLM(str(path), tensor_parallel_size=tp, **SMALL)
        try:
            logits[tp] = _first_logits(llm, prompts)
        finally:
            llm.exit()
    first = logits[1][0]  # the prefill step: one row a prompt, in order
    assert first.shape == want.shape and (first - want).abs().max().item() < 1e-4
    assert len(logits[2]) == len(logits[1])
    for a, b in zip(logits[1], logits[2]):
        assert (a - b).abs().max().item() < 1e-4


def _without_rope_theta(tensors, cfg):
    cfg.pop("rope_theta", None)
    cfg.pop("rope_parameters", None)
    cfg.pop("rope_scaling", None)


def test_a_config_without_rope_theta_takes_transformers_default(tiny_model, tmp_path):
    from transformers import Qwen3ForCausalLM

    path = _copy_with(tiny_model, tmp_path / "m", _without_rope_theta)
    prompt = list(range(100, 160))  # (long enough for the rotation's base to show in the logits)
    hf = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        want = hf(torch.tensor([prompt]), use_cache=False).logits[0, -1]
    llm = LLM(str(path), **SMALL)
    try:
        got = _first_logits(llm, [prompt])[0][0]
    finally:
        llm.exit()
    assert (got - want).abs().max().item() < 1e-4
