"""The decode step of small batches (<= 16 rows, inside decode CUDA graphs) as five kernels a layer
(engine/kernels/decode_layer.py says which), in place of the modules' forward passes, which launch twelve.

The same weights, in the same order of operations, as Qwen3ForCausalLM.forward: between kernels the residual
stream travels as it does there, and the projections that end a sublayer (o_proj, down_proj) hand their
split-K partials, unsummed, to the next kernel, which sums them where it adds the residual. Taken when the
engine's KernelChoice.fused_decode is on (CUDA, our kernels, one rank: the partials are a rank's own, and a
tensor-parallel step sums across ranks between those kernels) and the step is a decode graph's."""
from __future__ import annotations

import torch

from .context import get_context
from .device import num_sms
from .kernels import probe
from .kernels.decode_layer import (
    MAX_ROWS,
    O_PROJ_PDL,
    gemv,
    merges_in_gemv,
    partials_norm,
    qkv_attention,
    split_for,
)


def applies(ctx, rows: int) -> bool:
    """This forward pass is a decode graph's (captured, or its warm-up) of at most MAX_ROWS rows."""
    return ctx.prefill is None and ctx.decode is not None and ctx.decode.num_splits is not None and rows <= MAX_ROWS


def forward(model, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Qwen3Model.forward's hidden states for a decode step, through the fused kernels."""
    ctx = get_context()
    dec = ctx.decode
    sms = num_sms(input_ids.device, 132)
    hidden = model.embed_tokens(input_ids)
    residual, partials = hidden, None
    probe.PROBE.begin_pass()  # (LABKIT_DECODE_PROBE: this pass's launches get regions of their own)
    for i, layer in enumerate(model.layers):
        attn, ffn = layer.self_attn, layer.mlp
        ln = layer.input_layernorm
        if partials is None:  # the first layer: its input is the embedding, which is also the residual
            qkv = gemv(attn.qkv_proj.weight, x=hidden, norm_weight=ln.weight, eps=ln.eps, label=f"L{i} qkv",
                       proj="qkv")
        else:
            qkv, residual = gemv(attn.qkv_proj.weight, partials=partials, residual=residual, norm_weight=ln.weight,
                                 eps=ln.eps, label=f"L{i} qkv", proj="qkv")
        a = attn.attn
        o = qkv_attention(qkv, positions, attn.rotary_emb.cos_sin_cache, attn.q_norm.weight, attn.k_norm.weight,
                          attn.q_norm.eps, ctx.slot_mapping, a.k_cache, a.v_cache, dec.block_tables,
                          dec.context_lens, a.scale, dec.num_splits, attn.num_heads, attn.num_kv_heads,
                          a.k_scale, a.v_scale, merge=not merges_in_gemv(len(input_ids), dec.num_splits),
                          label=f"L{i} attention")
        w_o = attn.o_proj.weight
        partials = gemv(w_o, x=o, split=split_for(w_o.shape[0], w_o.shape[1], sms), pdl=O_PROJ_PDL,
                        label=f"L{i} o_proj", proj="o_proj")
        ln = layer.post_attention_layernorm
        w_gu, w_d = ffn.gate_up_proj.weight, ffn.down_proj.weight
        split = split_for(w_d.shape[0], w_d.shape[1], sms)
        h, residual = gemv(w_gu, partials=partials, residual=residual, norm_weight=ln.weight, eps=ln.eps, silu=True,
                           label=f"L{i} gate_up", proj="gate_up")
        partials = gemv(w_d, x=h, split=split, label=f"L{i} down", proj="down")
    return partials_norm(partials, residual, model.norm.weight, model.norm.eps)
