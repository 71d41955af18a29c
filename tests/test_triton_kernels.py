"""Our Triton kernels against the torch reference backend. On a CPU-only machine they run in Triton's
interpreter (TRITON_INTERPRET=1, set in conftest.py), so CI checks the same kernel source the GPU runs."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from engine.backends import torch_ref  # noqa: E402
from engine.context import Context  # noqa: E402
from engine.kernels.decode_attention import paged_decode  # noqa: E402
from engine.kernels.kv_write import store_kvcache  # noqa: E402
from engine.kernels.prefill_attention import varlen_prefill  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Triton's CPU interpreter has no bfloat16 (numpy lacks it): half precision is checked as float16 there.
HALF = torch.bfloat16 if DEVICE == "cuda" else torch.float16


def _pool(num_blocks, block_size, kv_heads, head_dim, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    return k.to(DEVICE), v.to(DEVICE)


def _tables(lengths, block_size, num_blocks, seed=1):
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, width = [], max(-(-n // block_size) for n in lengths)
    for n in lengths:
        need = -(-n // block_size)
        row, perm = perm[:need], perm[need:]
        tables.append(row + [-1] * (width - need))
    return torch.tensor(tables, dtype=torch.int32, device=DEVICE)


def test_store_kvcache_writes_rows_and_skips_minus_one():
    k_cache, v_cache = _pool(4, 4, 2, 16, torch.float32)
    before_k = k_cache.clone()
    qkv = torch.randn(3, (4 + 2 + 2) * 16, device=DEVICE)
    k = qkv[:, 64:96].view(3, 2, 16)  # strided views, as the model passes them
    v = qkv[:, 96:].view(3, 2, 16)
    slots = torch.tensor([5, -1, 14], dtype=torch.int32, device=DEVICE)
    store_kvcache(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(-1, 2, 16), v_cache.view(-1, 2, 16)
    assert torch.equal(flat_k[5], k[0]) and torch.equal(flat_v[14], v[2])
    untouched = [i for i in range(16) if i not in (5, 14)]
    assert torch.equal(flat_k[untouched], before_k.view(-1, 2, 16)[untouched])


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-5), (HALF, 2e-2)])
@pytest.mark.parametrize("block_size, lengths, splits", [
    (16, [1, 17, 40, 64], 1),
    (16, [1, 17, 40, 64], 3),
    (4, [5, 9, 130], 4),
    (256, [300, 2, 256], 2),
])
def test_paged_decode_matches_reference(dtype, tol, block_size, lengths, splits):
    heads, kv_heads, head_dim = 4, 2, 32
    num_blocks = sum(-(-n // block_size) for n in lengths) + 3
    k_cache, v_cache = _pool(num_blocks, block_size, kv_heads, head_dim, dtype)
    tables = _tables(lengths, block_size, num_blocks)
    q = torch.randn(len(lengths), heads, head_dim).to(dtype).to(DEVICE)
    ctx_lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    ctx = Context(is_prefill=False, context_lens=ctx_lens, block_tables=tables, context_lens_host=lengths)
    ref = torch_ref.decode(q, k_cache, v_cache, ctx, head_dim ** -0.5)
    out = paged_decode(q, k_cache, v_cache, tables, ctx_lens, head_dim ** -0.5, splits, block_n=16)
    assert (out.float() - ref.float()).abs().max().item() < tol
    if block_size % 16 == 0:  # the page-aligned tiling reads the same keys
        tiled = paged_decode(q, k_cache, v_cache, tables, ctx_lens, head_dim ** -0.5, splits, block_n=16,
                             page_tiles=True)
        assert (tiled.float() - ref.float()).abs().max().item() < tol


def test_paged_decode_padding_rows_are_zero():
    k_cache, v_cache = _pool(4, 16, 2, 32, torch.float32)
    tables = torch.tensor([[0, 1], [-1, -1]], dtype=torch.int32, device=DEVICE)
    q = torch.randn(2, 4, 32, device=DEVICE)
    out = paged_decode(q, k_cache, v_cache, tables, torch.tensor([20, 0], dtype=torch.int32, device=DEVICE),
                       0.2, 2, block_n=16)
    assert torch.isfinite(out).all() and out[1].abs().max().item() == 0


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 3e-5), (HALF, 3e-2)])
@pytest.mark.parametrize("paged", [True, False])
def test_varlen_prefill_matches_reference(dtype, tol, paged):
    heads, kv_heads, head_dim, block_size = 4, 2, 32, 16
    # (cached, new) per sequence: a fresh prompt, a chunk after a cached prefix, a one-token tail.
    shapes = [(0, 37), (48, 20), (16, 1), (0, 5)] if paged else [(0, 37), (0, 70), (0, 1)]
    lengths = [c + n for c, n in shapes]
    num_blocks = sum(-(-n // block_size) for n in lengths) + 2
    k_cache, v_cache = _pool(num_blocks, block_size, kv_heads, head_dim, dtype)
    tables = _tables(lengths, block_size, num_blocks)
    total_new = sum(n for _, n in shapes)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(total_new, heads, head_dim, generator=g).to(dtype).to(DEVICE)
    k = torch.randn(total_new, kv_heads, head_dim, generator=g).to(dtype).to(DEVICE)
    v = torch.randn(total_new, kv_heads, head_dim, generator=g).to(dtype).to(DEVICE)
    slots, cu_q, cu_k = [], [0], [0]
    for i, (c, n) in enumerate(shapes):
        slots += [int(tables[i, p // block_size]) * block_size + p % block_size for p in range(c, c + n)]
        cu_q.append(cu_q[-1] + n)
        cu_k.append(cu_k[-1] + c + n)
    slot_t = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
    torch_ref.store_kvcache(k, v, k_cache, v_cache, slot_t)
    cu_q_t = torch.tensor(cu_q, dtype=torch.int32, device=DEVICE)
    cu_k_t = torch.tensor(cu_k, dtype=torch.int32, device=DEVICE)
    ctx = Context(is_prefill=True, cu_seqlens_q=cu_q_t, cu_seqlens_k=cu_k_t, cu_seqlens_q_host=cu_q,
                  cu_seqlens_k_host=cu_k, block_tables=tables if paged else None,
                  max_seqlen_q=max(n for _, n in shapes))
    scale = head_dim ** -0.5
    ref = torch_ref.prefill(q, k, v, k_cache, v_cache, ctx, scale)
    out = varlen_prefill(q, k, v, k_cache if paged else None, v_cache if paged else None,
                         tables if paged else None, cu_q_t, cu_k_t, ctx.max_seqlen_q, scale, block_m=16, block_n=16)
    assert (out.float() - ref.float()).abs().max().item() < tol


def test_gumbel_argmax_greedy_rows_are_argmax_and_sampled_rows_follow_the_distribution():
    from engine.kernels.sampling import gumbel_argmax

    g = torch.Generator().manual_seed(7)
    logits = (torch.randn(3, 300, generator=g) * 3).to(DEVICE)
    greedy = gumbel_argmax(logits, torch.zeros(3, device=DEVICE), seed=1, block=128)
    assert greedy.tolist() == logits.argmax(-1).tolist()
    probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
    n = 800  # Triton's CPU interpreter runs one program per row: keep this small
    rows = probs.log().expand(n, 4).contiguous().to(DEVICE)
    drawn = gumbel_argmax(rows, torch.ones(n, device=DEVICE), seed=3, block=4)
    freq = torch.bincount(drawn.cpu(), minlength=4).float() / n
    assert torch.allclose(freq, probs, atol=0.05)
    again = gumbel_argmax(rows[:50], torch.ones(50, device=DEVICE), seed=3, block=4)
    assert torch.equal(drawn[:50], again)  # the seed fixes the draw
    hot = gumbel_argmax(rows[:100], torch.full((100,), 50.0, device=DEVICE), seed=4, block=4)
    assert len(set(hot.tolist())) == 4  # a high temperature flattens the distribution


def test_gumbel_argmax_draw_does_not_depend_on_how_the_vocabulary_is_split():
    from engine.kernels.sampling import gumbel_argmax

    g = torch.Generator().manual_seed(11)
    logits = (torch.randn(4, 1000, generator=g) * 2).to(DEVICE)
    logits[3, 517] = logits[3, 901] = 50.0  # a tie: the first index must win in every split
    temps = torch.tensor([0.0, 0.7, 1.3, 0.0], device=DEVICE)
    draws = [gumbel_argmax(logits, temps, seed=9, block=64, num_chunks=c).tolist() for c in (1, 3, 16)]
    assert draws[0] == draws[1] == draws[2]
    assert draws[0][0] == logits[0].argmax().item() and draws[0][3] == 517
    other = gumbel_argmax(logits, temps, seed=10, block=64, num_chunks=3).tolist()
    assert other[0] == draws[0][0] and other[3] == 517  # greedy rows ignore the seed


def test_gumbel_argmax_all_minus_inf_row_gives_index_zero_like_torch():
    from engine.kernels.sampling import gumbel_argmax

    logits = torch.full((1, 300), float("-inf"), device=DEVICE)
    assert gumbel_argmax(logits, torch.zeros(1, device=DEVICE), seed=1, block=64, num_chunks=4).tolist() == [0]
