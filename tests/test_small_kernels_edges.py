"""Blind spots of a mutation screen (session 22) in two Triton kernels (Triton's interpreter on a CPU-only machine): the
q/k norm + RoPE kernel on heads whose RMS is below eps and on head counts that are not powers of two, and the
small GEMM's split-K heuristic as its docstring states it."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from engine.kernels.qk_norm_rope import qk_norm_rope  # noqa: E402
from engine.kernels.small_gemm import small_gemm_config, small_matmul  # noqa: E402
from engine.layers import fused  # noqa: E402
from engine.layers.rope import RotaryEmbedding  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6


def _qk(qkv, positions, heads, kv_heads, head_dim, qw, kw):
    table = RotaryEmbedding(head_dim, 64, 1e6).cos_sin_cache.to(DEVICE)
    out = qk_norm_rope(qkv, positions, table, qw, kw, EPS, heads, kv_heads, head_dim)
    q = qkv[:, :heads * head_dim].view(-1, heads, head_dim)
    k = qkv[:, heads * head_dim:(heads + kv_heads) * head_dim].view(-1, kv_heads, head_dim)
    return out, fused.qk_norm_rope(q, k, qw, kw, EPS, table[positions.long()])


def test_qk_norm_rope_uses_eps_on_zero_and_tiny_heads():
    """A head of zeros stays zeros (not NaN) and a head far below eps's scale is damped as the reference damps
    it: the kernel adds eps to the mean square, as fused.rms_norm and Transformers do."""
    heads, kv_heads, head_dim = 2, 2, 16
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(3, (heads + 2 * kv_heads) * head_dim, generator=g)
    qkv[0] = 0.0
    qkv[1] *= 1e-5  # mean square 1e-10, four orders below eps
    qw, kw = 1 + 0.3 * torch.randn(head_dim, generator=g), 1 + 0.3 * torch.randn(head_dim, generator=g)
    (q, k), (ref_q, ref_k) = _qk(qkv.to(DEVICE), torch.tensor([0, 5, 9], device=DEVICE), heads, kv_heads,
                                 head_dim, qw.to(DEVICE), kw.to(DEVICE))
    for out, ref in ((q, ref_q), (k, ref_k)):
        assert torch.isfinite(out).all()
        assert (out[0] == 0).all()
        assert torch.allclose(out, ref, rtol=1e-5, atol=1e-9)
        assert out[1].abs().max() < 1e-1 * ref[2].abs().max()  # damped, not scaled up to unit RMS


@pytest.mark.parametrize("heads, kv_heads", [(6, 3), (3, 1)])
def test_qk_norm_rope_with_head_counts_that_are_not_powers_of_two(heads, kv_heads):
    """Qwen3 head counts per rank need not be powers of two (40 heads over 8 KV heads; a 2-rank split of 6): the
    kernel's head tile is padded to one, and the padding lanes may neither read nor write past the tensors."""
    from tests.kernel_bounds import bounds_checked

    head_dim = 16
    g = torch.Generator().manual_seed(4)
    qkv = (torch.randn(4, (heads + 2 * kv_heads) * head_dim, generator=g) * 3).to(DEVICE)
    qw = (1 + 0.3 * torch.randn(head_dim, generator=g)).to(DEVICE)
    kw = (1 + 0.3 * torch.randn(head_dim, generator=g)).to(DEVICE)
    with bounds_checked():
        (q, k), (ref_q, ref_k) = _qk(qkv, torch.tensor([1, 2, 30, 63], device=DEVICE), heads, kv_heads, head_dim,
                                     qw, kw)
    assert q.shape == (4, heads, head_dim) and k.shape == (4, kv_heads, head_dim)
    assert torch.allclose(q, ref_q, rtol=1e-5, atol=1e-6) and torch.allclose(k, ref_k, rtol=1e-5, atol=1e-6)


def _documented_split(N, K, num_sms):
    """small_gemm_config's docstring, written out: block_k 128 or the next power of two >= K (at least 16);
    block_n 64 or less for a narrow N; no split when the row tiles fill a quarter of the SMs; else the largest
    power of two <= 8 with tiles * split <= num_sms and no more splits than K tiles."""
    block_k = min(128, max(16, triton.next_power_of_2(K)))
    block_n = min(64, max(16, triton.next_power_of_2(N)))
    tiles, k_tiles = triton.cdiv(N, block_n), triton.cdiv(K, block_k)
    if tiles >= num_sms // 4:
        return block_n, block_k, 1
    split = max(s for s in (1, 2, 4, 8) if tiles * s <= num_sms and s <= k_tiles)
    return block_n, block_k, split


@pytest.mark.parametrize("num_sms", [132, 108, 16])
def test_small_gemm_split_follows_its_documented_rule(num_sms):
    for N in (16, 100, 256, 1000, 1024, 2048, 2047, 2112, 2176, 4096):
        for K in (16, 64, 200, 1024, 4096):
            cfg = small_gemm_config(1, N, K, num_sms)
            assert (cfg["block_n"], cfg["block_k"], cfg["split_k"]) == _documented_split(N, K, num_sms), (N, K)


@pytest.mark.parametrize("knobs", [dict(block_n=8), dict(block_k=8), dict(block_n=48), dict(block_k=96)])
def test_small_matmul_refuses_tiles_tl_dot_cannot_take(knobs):
    x, w = torch.randn(2, 64, device=DEVICE), torch.randn(32, 64, device=DEVICE)
    with pytest.raises(ValueError, match="powers of two >= 16"):
        small_matmul(x, w, **knobs)
