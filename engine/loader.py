"""Load a safetensors checkpoint into the shard-aware model, merging q/k/v and gate/up on the way."""
from __future__ import annotations

import glob
import os

import torch
from safetensors import safe_open
from torch import nn


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor):
    param.data.copy_(loaded)


def load_model(model: nn.Module, path: str) -> None:
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(f"model: no *.safetensors files in {path}")
    mapping = getattr(model, "packed_modules_mapping", {})
    tied = getattr(model, "tie_word_embeddings", False)
    loaded_names: set[str] = set()
    for file in files:
        with safe_open(file, "pt", "cpu") as f:
            for name in f.keys():
                if tied and name == "lm_head.weight":
                    continue  # the head shares the embedding's storage
                for key, (packed, shard_id) in mapping.items():
                    if f".{key}." in name:
                        param_name = name.replace(f".{key}.", f".{packed}.")
                        param = _get(model, param_name, file)
                        param.weight_loader(param, f.get_tensor(name), shard_id)
                        loaded_names.add(f"{param_name}:{shard_id}")
                        break
                else:
                    param = _get(model, name, file)
                    getattr(param, "weight_loader", default_weight_loader)(param, f.get_tensor(name))
                    loaded_names.add(name)
    missing = []
    for name, _ in model.named_parameters():
        if name.endswith(("qkv_proj.weight", "qkv_proj.bias")):  # (a bias arrives in shards too)
            need = [f"{name}:{s}" for s in "qkv"]
        elif name.endswith(("gate_up_proj.weight", "gate_up_proj.bias")):
            need = [f"{name}:{s}" for s in (0, 1)]
        else:
            need = [name]
        missing += [n for n in need if n not in loaded_names]
    if missing:
        raise ValueError(f"model: checkpoint {path} lacks {len(missing)} tensors, e.g. {missing[:3]}")


def _get(model: nn.Module, name: str, file: str) -> nn.Parameter:
    try:
        return model.get_parameter(name)
    except AttributeError:
        raise ValueError(f"model: unexpected tensor {name!r} in {os.path.basename(file)}") from None
