"""model_shape events: forward hooks on one decoder layer that report each module's output shape.

Hooks are registered only when a tracer asks for shapes, so the normal forward pass carries none."""
from __future__ import annotations

import torch
from torch import nn


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

    def emit(module_name, shape, layer_index=layer):
        tracer.emit("model_shape", layer=layer_index, module=module_name, shape=list(shape))

    for name, module in named.items():
        layer_index = None if name in ("embed_tokens", "lm_head") else layer

        def hook(mod, args, out, name=name, layer_index=layer_index):
            if isinstance(out, torch.Tensor):
                emit("logits" if name == "lm_head" else name, out.shape, layer_index)
        handles.append(module.register_forward_hook(hook))

    def attn_hook(mod, args, out):
        q, k, v = args
        emit("q", q.shape)
        emit("k", k.shape)
        emit("v", v.shape)
        emit("attn_out", out.shape)
    handles.append(attn.attn.register_forward_hook(attn_hook))
    return handles
