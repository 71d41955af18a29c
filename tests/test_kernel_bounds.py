"""Every attention kernel touches only its tensors, in either pool layout, when a batch holds what a CUDA graph's
batch holds: a padding row (context 0, slot -1, a table of -1), a short row beside a long one (a table padded with
-1), more splits than a short row has tiles. Session 19's first nano run over a keys-contiguous V died on the H200
with an illegal address: the fused decode layer loaded its first tile, unmasked, from table entry -1 of a padding
row. The interpreter had read that memory without complaint; tests/kernel_bounds.py makes it refuse."""
from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")

from engine.kernels.decode_attention import paged_decode  # noqa: E402
from engine.kernels.decode_layer import qkv_attention  # noqa: E402
from engine.kernels.kv_write import store_kvcache  # noqa: E402
from engine.kernels.prefill_attention import varlen_prefill  # noqa: E402
from engine.kv_layout import layer_caches  # noqa: E402
from engine.kv_quant import FP8  # noqa: E402
from tests.kernel_bounds import bounds_checked  # noqa: E402

# The interpreter's check (conftest.py interprets where there is no GPU); on a GPU the kernels fault by themselves.
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs Triton's interpreter")
HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, BLOCKS = 4, 2, 16, 32, 8
LAYOUTS = ["float32", "fp8", "fp8-v-keys-contiguous"]
# a long row (3 blocks), a short one (1 block, then -1), a padding row (context 0, no block)
CONTEXTS = [70, 5, 0]
TABLES = [[3, 0, 6], [7, -1, -1], [-1, -1, -1]]


def _caches(layout):
    pool = torch.zeros(2, 1, BLOCKS, KV_HEADS, BLOCK_SIZE, HEAD_DIM, dtype=torch.float32 if layout == "float32"
                       else FP8)
    k, v = layer_caches(pool, 0, layout == "fp8-v-keys-contiguous")
    g = torch.Generator().manual_seed(1)
    k.copy_(torch.randn(k.shape, generator=g).to(k.dtype))
    v.copy_(torch.randn(v.shape, generator=g).to(v.dtype))
    return k, v


def _tables():
    return torch.tensor(TABLES, dtype=torch.int32), torch.tensor(CONTEXTS, dtype=torch.int32)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("block_n", [16, 64])  # 16: page tiles (unmasked over a keys-contiguous V); 64: masked
def test_the_fused_decode_layer_stays_inside_its_tensors(layout, splits, block_n):
    k_cache, v_cache = _caches(layout)
    tables, ctx = _tables()
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(3, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=g)
    positions = (ctx - 1).clamp(min=0)
    slots = torch.tensor([tables[b, max(n - 1, 0) // BLOCK_SIZE] * BLOCK_SIZE + (n - 1) % BLOCK_SIZE if n else -1
                          for b, n in enumerate(CONTEXTS)], dtype=torch.int32)
    cos_sin = torch.randn(128, HEAD_DIM, generator=g)
    norm = torch.ones(HEAD_DIM)
    with bounds_checked():
        out = qkv_attention(qkv, positions, cos_sin, norm, norm, 1e-6, slots, k_cache, v_cache, tables, ctx,
                            HEAD_DIM ** -0.5, splits, HEADS, KV_HEADS, block_n=block_n)
    assert torch.isfinite(out[:2]).all()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("block_n", [16, 64])
def test_paged_decode_stays_inside_its_tensors(layout, splits, block_n):
    k_cache, v_cache = _caches(layout)
    tables, ctx = _tables()
    q = torch.randn(3, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(3))
    with bounds_checked():
        out = paged_decode(q, k_cache, v_cache, tables, ctx, HEAD_DIM ** -0.5, splits, block_n=block_n)
    assert torch.isfinite(out[:2]).all()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("block_n", [16, 64])
def test_the_kv_write_and_paged_prefill_stay_inside_their_tensors(layout, block_n):
    k_cache, v_cache = _caches(layout)
    shapes = [(32, 9), (0, 5)]  # (cached, new): a prefix hit, then a fresh short prompt
    tables = torch.tensor([[3, 0], [7, -1]], dtype=torch.int32)
    total = sum(n for _, n in shapes)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(total, h, HEAD_DIM, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS))
    slots, cu_q, cu_k = [], [0], [0]
    for i, (c, n) in enumerate(shapes):
        slots += [int(tables[i, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE for p in range(c, c + n)]
        cu_q.append(cu_q[-1] + n)
        cu_k.append(cu_k[-1] + c + n)
    slots[-1] = -1  # a row that writes nothing
    with bounds_checked():
        store_kvcache(k, v, k_cache, v_cache, torch.tensor(slots, dtype=torch.int32))
        out = varlen_prefill(q, k, v, k_cache, v_cache, tables, torch.tensor(cu_q, dtype=torch.int32),
                             torch.tensor(cu_k, dtype=torch.int32), 9, HEAD_DIM ** -0.5, block_m=16,
                             block_n=block_n)
    assert torch.isfinite(out).all()


def test_the_check_refuses_a_read_before_a_tensor():
    """The check itself: a kernel told to read one element before its input is stopped, and one that stays
    inside passes."""
    import triton.language as tl

    @triton.jit
    def _shifted_copy(src, dst, shift, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(dst + i, tl.load(src + i + shift))

    src, dst = torch.arange(8.0), torch.zeros(8)
    with bounds_checked():
        _shifted_copy[(1,)](src, dst, 0, N=8)
        with pytest.raises(Exception, match="_shifted_copy: load of 1 lane"):  # (the interpreter wraps it)
            _shifted_copy[(1,)](src, dst, -1, N=8)
    assert torch.equal(dst, src)
