"""Qwen3 for causal LM, built from the shard-aware layers. Shapes per token: hidden -> qkv (merged) ->
per-head q/k RMSNorm -> RoPE -> paged attention -> o_proj -> residual; RMSNorm -> gate_up (merged) ->
SiLU*up -> down_proj -> residual."""
from __future__ import annotations

import torch
from torch import nn

from .. import fused_decode
from ..context import get_context
from ..kernel_choice import KernelChoice
from ..layers import fused
from ..layers.activation import SiluAndMul
from ..layers.attention import Attention
from ..layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from ..layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from ..layers.norm import RMSNorm
from ..layers.rope import RotaryEmbedding


def _rope_theta(config) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        theta = params.get("rope_theta", 10000.0)
    return float(theta)


class Qwen3Attention(nn.Module):
    def __init__(self, config, kernels: KernelChoice):
        super().__init__()
        hidden = config.hidden_size
        self.head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
        self.qkv_proj = QKVParallelLinear(hidden, self.head_dim, config.num_attention_heads,
                                          config.num_key_value_heads, kernels,
                                          bias=getattr(config, "attention_bias", False))
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(config.num_attention_heads * self.head_dim, hidden, kernels,
                                        bias=getattr(config, "attention_bias", False))
        self.rotary_emb = RotaryEmbedding(self.head_dim, config.max_position_embeddings, _rope_theta(config))
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim ** -0.5, self.num_kv_heads,
                              kernels.backend)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, kernels)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, kernels)
        # Per-head q/k RMSNorm and RoPE straight from the qkv rows: our single Triton kernel (CUDA but
        # --eager), else plain torch.
        self._qk_kernel = kernels.fused_elementwise

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        if self._qk_kernel:
            from ..kernels.qk_norm_rope import qk_norm_rope

            q, k = qk_norm_rope(qkv, positions, self.rotary_emb.cos_sin_cache, self.q_norm.weight,
                                self.k_norm.weight, self.q_norm.eps, self.num_heads, self.num_kv_heads, self.head_dim)
            v = qkv[:, self.q_size + self.kv_size:].view(-1, self.num_kv_heads, self.head_dim)
            return self.o_proj(self.attn(q, k, v).flatten(1, -1))
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q, k = fused.qk_norm_rope(q, k, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps,
                                  self.rotary_emb.cos_sin_cache[positions])
        o = self.attn(q, k, v)
        return self.o_proj(o.flatten(1, -1))


class Qwen3MLP(nn.Module):
    def __init__(self, config, kernels: KernelChoice):
        super().__init__()
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"model: hidden_act {config.hidden_act!r} is not supported (only silu)")
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [config.intermediate_size] * 2, kernels)
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, kernels)
        self.act_fn = SiluAndMul(kernels)

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config, kernels: KernelChoice):
        super().__init__()
        self.self_attn = Qwen3Attention(config, kernels)
        self.mlp = Qwen3MLP(config, kernels)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)

    def forward(self, positions, hidden, residual):
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class Qwen3Model(nn.Module):
    def __init__(self, config, kernels: KernelChoice):
        super().__init__()
        # Small decode graphs through five fused kernels a layer (engine/fused_decode.py); bias-free layers only.
        self._fused_decode = kernels.fused_decode and not getattr(config, "attention_bias", False)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([Qwen3DecoderLayer(config, kernels) for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)

    def forward(self, input_ids, positions):
        if self._fused_decode and fused_decode.applies(get_context(), input_ids.shape[0]):
            return fused_decode.forward(self, input_ids, positions)
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class Qwen3ForCausalLM(nn.Module):
    # checkpoint name -> (our parameter name, shard id)
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config, kernels: KernelChoice):
        super().__init__()
        self.model = Qwen3Model(config, kernels)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, positions):
        return self.model(input_ids, positions)

    def compute_logits(self, hidden):
        return self.lm_head(hidden)
