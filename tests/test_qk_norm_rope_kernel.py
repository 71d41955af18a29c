"""The fused qkv -> (q, k) norm+RoPE kernel against fused.qk_norm_rope, rounding points included. On CPU it
runs in Triton's interpreter, where half precision is float16 (no bfloat16 there)."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from engine.kernels.qk_norm_rope import qk_norm_rope  # noqa: E402
from engine.layers import fused  # noqa: E402
from engine.layers.rope import RotaryEmbedding  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HALF = torch.bfloat16 if DEVICE == "cuda" else torch.float16
MAX_POS, EPS = 512, 1e-6
POSITIONS = [7, 0, 300, 510, 42]
_TABLES: dict[int, torch.Tensor] = {}


def _table(head_dim):
    if head_dim not in _TABLES:
        _TABLES[head_dim] = RotaryEmbedding(head_dim, MAX_POS, 1e6).cos_sin_cache.to(DEVICE)
    return _TABLES[head_dim]


def _inputs(tokens, heads, kv_heads, head_dim, dtype, pos_dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    width = (heads + 2 * kv_heads) * head_dim
    # A column slice of a wider buffer: row stride > width, as when qkv is a view.
    wide = (torch.randn(tokens, width + 3 * head_dim, generator=g) * 3).to(dtype).to(DEVICE)
    qkv = wide[:, head_dim:head_dim + width]
    qw = (1 + 0.3 * torch.randn(head_dim, generator=g)).to(dtype).to(DEVICE)
    kw = (1 + 0.3 * torch.randn(head_dim, generator=g)).to(dtype).to(DEVICE)
    positions = torch.tensor(POSITIONS[:tokens], dtype=pos_dtype, device=DEVICE)
    return qkv, qw, kw, positions


def _reference(qkv, positions, qw, kw, heads, kv_heads, head_dim):
    q = qkv[:, :heads * head_dim].view(-1, heads, head_dim)
    k = qkv[:, heads * head_dim:(heads + kv_heads) * head_dim].view(-1, kv_heads, head_dim)
    return fused.qk_norm_rope(q, k, qw, kw, EPS, _table(head_dim)[positions])


def _check(out, ref):
    assert out.shape == ref.shape and out.dtype == ref.dtype and out.is_contiguous()
    diff = (out.float() - ref.float()).abs()
    # Errors are measured against each head's largest value: the norm's float32 sum runs in another
    # order than torch's, which now and then moves a normalised value by 1 ulp; RoPE's difference can
    # then cancel, so that ulp is large next to a small output.
    scale = ref.float().abs().amax(dim=-1, keepdim=True)
    if out.dtype == torch.float32:
        assert (diff <= 1e-6 * scale).all(), f"max diff {diff.max().item()}"
        return
    info = torch.finfo(out.dtype)
    ulp = info.eps * torch.exp2(torch.floor(torch.log2(scale.clamp_min(info.tiny))))
    assert (diff <= ulp).all(), f"more than 1 ulp off: max {diff.max().item()}"
    # Observed in float16 on the interpreter: ~1 element in 20,000 differs at all.
    assert (diff == 0).float().mean().item() >= 0.99


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
@pytest.mark.parametrize("tokens", [1, 5])
@pytest.mark.parametrize("heads, kv_heads, head_dim, pos_dtype", [
    (4, 2, 16, torch.int32),
    (4, 2, 64, torch.int64),
    (2, 2, 64, torch.int32),
    (2, 2, 16, torch.int64),
])
def test_matches_fused_reference(dtype, tokens, heads, kv_heads, head_dim, pos_dtype):
    qkv, qw, kw, positions = _inputs(tokens, heads, kv_heads, head_dim, dtype, pos_dtype)
    assert qkv.stride(0) > qkv.shape[1]
    q, k = qk_norm_rope(qkv, positions, _table(head_dim), qw, kw, EPS, heads, kv_heads, head_dim)
    ref_q, ref_k = _reference(qkv, positions, qw, kw, heads, kv_heads, head_dim)
    _check(q, ref_q)
    _check(k, ref_k)


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
def test_wrong_position_differs(dtype):
    heads, kv_heads, head_dim = 4, 2, 16
    qkv, qw, kw, positions = _inputs(5, heads, kv_heads, head_dim, dtype, torch.int64)
    q, k = qk_norm_rope(qkv, positions, _table(head_dim), qw, kw, EPS, heads, kv_heads, head_dim)
    ref_q, ref_k = _reference(qkv, positions + 1, qw, kw, heads, kv_heads, head_dim)
    for out, ref in ((q, ref_q), (k, ref_k)):
        # Every token's rotation moved by one step: far beyond the 1-ulp allowance.
        per_token = (out.float() - ref.float()).abs().amax(dim=(1, 2))
        assert (per_token > 1e-2).all()
