"""small_matmul against torch. On a CPU-only machine it runs in Triton's interpreter (conftest.py sets
TRITON_INTERPRET=1), so shapes stay small."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from engine.kernels.small_gemm import MAX_SMALL_M, small_gemm_config, small_matmul  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The interpreter has no bfloat16 (numpy lacks it): half precision is checked as float16 there.
HALF = torch.bfloat16 if DEVICE == "cuda" else torch.float16


def _inputs(M, N, K, dtype, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(N, K, generator=g) * K ** -0.5).to(dtype).to(DEVICE)
    b = torch.randn(N, generator=g).to(dtype).to(DEVICE) if bias else None
    return x, w, b


def _reference(x, w, b):
    ref = x.double() @ w.double().T
    return ref + b.double() if b is not None else ref


def _check(out, ref, dtype):
    assert out.dtype == dtype and out.shape == ref.shape
    err = (out.double() - ref).abs()
    if dtype == torch.float32:
        assert err.max().item() <= 1e-5 * (1 + ref.abs().max().item())
    else:
        # One rounding of the output to 16 bits (inputs are already 16-bit, accumulation is float32).
        eps = 2 ** -8 if dtype == torch.bfloat16 else 2 ** -11
        assert (err <= eps * ref.abs() + 1e-3).all(), err.max().item()


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
@pytest.mark.parametrize("M", [1, 3, 16])
@pytest.mark.parametrize("N, K, block_k", [(200, 72, 32), (64, 256, 64)])
@pytest.mark.parametrize("split_k", [1, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_small_matmul_matches_torch(dtype, M, N, K, block_k, split_k, bias):
    x, w, b = _inputs(M, N, K, dtype, bias)
    out = small_matmul(x, w, b, block_n=16 if N % 64 else 32, block_k=block_k, split_k=split_k)
    _check(out, _reference(x, w, b), dtype)


def test_default_config_odd_shape_and_strided_rows():
    # Strided row views (a slice of a wider buffer), odd N and K, defaults from the heuristic.
    g = torch.Generator().manual_seed(5)
    xbuf = torch.randn(5, 100, generator=g).to(DEVICE)
    wbuf = torch.randn(37, 120, generator=g).to(DEVICE)
    x, w = xbuf[:, 3:93], wbuf[:, :90]
    b = torch.randn(37, generator=g).to(DEVICE)
    _check(small_matmul(x, w, b), _reference(x, w, b), torch.float32)


def test_empty_trailing_split_and_m_above_max():
    # 5 K tiles over 4 splits leaves the last split empty; M > MAX_SMALL_M takes a second row tile.
    x, w, b = _inputs(MAX_SMALL_M + 3, 40, 80, torch.float32, True, seed=2)
    out = small_matmul(x, w, b, block_n=16, block_k=16, split_k=4)
    _check(out, _reference(x, w, b), torch.float32)


def test_split_k_is_deterministic():
    x, w, b = _inputs(3, 96, 512, torch.float32, True, seed=1)
    first = small_matmul(x, w, b, block_n=32, block_k=32, split_k=4)
    second = small_matmul(x, w, b, block_n=32, block_k=32, split_k=4)
    assert torch.equal(first, second)


@pytest.mark.parametrize("N, K, split", [(4096, 1024, 1), (1024, 2048, 8), (6144, 1024, 1), (1024, 3072, 8)])
def test_config_for_qwen3_0_6b_follows_the_h200_sweep(N, K, split):
    # The sweep (docs/perf.md): 64 x 128 tiles; split K only where 64-wide row tiles leave SMs idle.
    cfg = small_gemm_config(1, N, K, 132)
    assert (cfg["block_n"], cfg["block_k"], cfg["split_k"]) == (64, 128, split)
    assert triton.cdiv(N, 64) * split <= 132 or split == 1
    assert K % (split * cfg["block_k"]) == 0  # every split covers whole tiles


def test_config_does_not_split_below_one_tile():
    cfg = small_gemm_config(1, 200, 72, 132)
    assert cfg["split_k"] == 1 and cfg["block_k"] == 128
    cfg = small_gemm_config(1, 1024, 64, 132)
    assert cfg["block_k"] == 64 and cfg["split_k"] == 1
    cfg = small_gemm_config(1, 151936, 1024, 132)  # lm_head: enough row tiles at block_n = 64
    assert cfg["block_n"] == 64 and cfg["split_k"] == 1
