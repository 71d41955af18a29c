"""model_shape events: forward hooks on one decoder layer that report each module's output shape.

Hooks are registered only when a tracer asks for shapes, so the normal forward pass carries none.
With tensor parallel they sit on rank 0's model, so every shape is rank 0's (its heads, its shard of
the intermediate size); events carry tp_rank/tp_size. `logits` is the full row gathered on rank 0,
`logits_shard` the slice of the vocabulary this rank computed before the gather.

`rank_shapes(runner)` is the static side: what a rank really allocated (parameters, KV pool)."""
from __future__ import annotations

import re

import torch
from torch import nn

from .distributed import tp_rank, tp_size


def register_shape_hooks(model: nn.Module, tracer, layer: int = 0) -> list:
    decoder = model.model.layers[layer]
    attn = decoder.self_attn
    named = {
        "embed_tokens": model.model.embed_tokens,
        "qkv_proj": attn.qkv_proj,
        "o_proj": attn.o_proj,
        "gate_up_proj": decoder.mlp.gate_up_proj,
        "down_proj": decoder.mlp.down_proj,
        "lm_head": model.lm_head,
    }
    handles = []
    rank, size = tp_rank(), tp_size()

    def emit(module_name, shape, layer_index=layer):
        tracer.emit("model_shape", layer=layer_index, module=module_name, shape=list(shape), tp_rank=rank,
                    tp_size=size)

    for name, module in named.items():
        layer_index = None if name in ("embed_tokens", "lm_head") else layer

        def hook(mod, args, out, name=name, layer_index=layer_index):
            if isinstance(out, torch.Tensor):
                if name == "lm_head":
                    emit("logits", out.shape, layer_index)
                    emit("logits_shard", (out.shape[0], mod.weight.shape[0]), layer_index)
                else:
                    emit(name, out.shape, layer_index)
        handles.append(module.register_forward_hook(hook))

    def attn_hook(mod, args, out):
        q, k, v = args
        emit("q", q.shape)
        emit("k", k.shape)
        emit("v", v.shape)
        emit("attn_out", out.shape)
    handles.append(attn.attn.register_forward_hook(attn_hook))
    return handles


_LAYER = re.compile(r"\.layers\.(\d+)\.")


def rank_shapes(runner) -> dict:
    """What one rank allocated: every parameter's shape (layer 0 standing for all layers, which are
    checked to agree), its heads, and its KV pool."""
    params: dict[str, list[int]] = {}
    per_layer: dict[str, set] = {}
    for name, p in runner.model.named_parameters():
        m = _LAYER.search(name)
        if m is None:
            params[name] = list(p.shape)
            continue
        key = _LAYER.sub(".layers.N.", name, count=1)
        per_layer.setdefault(key, set()).add(tuple(p.shape))
    uniform = all(len(v) == 1 for v in per_layer.values())
    for key, shapes in per_layer.items():
        params[key] = list(next(iter(shapes))) if len(shapes) == 1 else sorted(list(s) for s in shapes)
    if runner.model.lm_head.weight is runner.model.model.embed_tokens.weight:
        params.setdefault("lm_head.weight", list(runner.model.lm_head.weight.shape))
    attn = runner.attn_layers[0]
    kv = runner.kv_cache
    return {
        "rank": runner.rank,
        "tp_size": runner.world_size,
        "device": str(runner.device),
        "params": params,
        "layers_uniform": uniform,
        "num_heads": attn.num_heads,
        "num_kv_heads": attn.num_kv_heads,
        "head_dim": attn.head_dim,
        "kv_cache": None if kv is None else list(kv.shape),
        "kv_bytes_per_token": runner.kv_block_bytes // runner.block_size,
    }
