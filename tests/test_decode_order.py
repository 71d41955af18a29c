"""paged_decode's order (the rows' programs launched in a given order, longest context first): the same numbers
as the grid's own order, whatever the layout, split count or padding rows. On a CPU the kernel runs in Triton's
interpreter (conftest.py)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine.kernels.decode_attention import longest_first, paged_decode  # noqa: E402
from engine.kv_layout import layer_caches  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_longest_first_is_a_stable_descending_permutation():
    lens = torch.tensor([5, 40, 0, 40, 7], dtype=torch.int32)
    order = longest_first(lens)
    assert order.dtype == torch.int32 and order.tolist() == [1, 3, 4, 0, 2]


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("fp8, v_t", [(False, False), (True, False), (True, True)])
def test_an_ordered_launch_gives_each_row_its_own_output(splits, fp8, v_t):
    heads, kv_heads, head_dim, block_size = 4, 2, 32, 32
    lengths = [3, 70, 0, 33, 96]
    g = torch.Generator().manual_seed(0)
    dtype = torch.float8_e4m3fn if fp8 else torch.float32
    pool = (torch.randn(2, 1, 16, kv_heads, block_size, head_dim, generator=g) * 2).to(dtype).to(DEVICE)
    k, v = layer_caches(pool, 0, v_t)
    tables = torch.arange(15, dtype=torch.int32).view(5, 3).to(DEVICE)
    q = torch.randn(len(lengths), heads, head_dim, generator=g).to(DEVICE)
    ctx = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    kw = dict(block_n=16, k_scale=0.5, v_scale=0.25) if fp8 else dict(block_n=16)
    plain = paged_decode(q, k, v, tables, ctx, 0.2, splits, **kw)
    ordered = paged_decode(q, k, v, tables, ctx, 0.2, splits, order=longest_first(ctx), **kw)
    assert torch.equal(ordered, plain)
    assert plain[1].abs().sum() > 0 and torch.equal(plain[2], torch.zeros_like(plain[2]))
    assert longest_first(ctx).tolist() != list(range(len(lengths)))  # (a kernel mixing rank and row would show)
