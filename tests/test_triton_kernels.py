"""Our Triton kernels against the torch reference backend. On a CPU-only machine they run in Triton's
interpreter (TRITON_INTERPRET=1, set in conftest.py), so CI checks the same kernel source the GPU runs."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from engine.backends import torch_ref  # noqa: E402
from engine.context import DecodeMeta, PrefillMeta  # noqa: E402
from engine.kernels.decode_attention import paged_decode  # noqa: E402
from engine.kernels.kv_write import store_kvcache  # noqa: E402
from engine.kernels.prefill_attention import varlen_prefill  # noqa: E402
from engine.kv_layout import token_major  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Triton's CPU interpreter has no bfloat16 (numpy lacks it): half precision is checked as float16 there.
HALF = torch.bfloat16 if DEVICE == "cuda" else torch.float16


def _pool(num_blocks, block_size, kv_heads, head_dim, dtype, seed=0):
    """A layer's K and V caches in the engine's layout: [blocks, kv_heads, block_size, head_dim]."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num_blocks, kv_heads, block_size, head_dim, generator=g).to(dtype)
    v = torch.randn(num_blocks, kv_heads, block_size, head_dim, generator=g).to(dtype)
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


def test_store_kvcache_writes_rows_head_major_and_skips_minus_one():
    block_size = 4
    k_cache, v_cache = _pool(4, block_size, 2, 16, torch.float32)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    qkv = torch.randn(3, (4 + 2 + 2) * 16, device=DEVICE)
    k = qkv[:, 64:96].view(3, 2, 16)  # strided views, as the model passes them
    v = qkv[:, 96:].view(3, 2, 16)
    slots = torch.tensor([5, -1, 14], dtype=torch.int32, device=DEVICE)
    store_kvcache(k, v, k_cache, v_cache, slots)
    # Slot 5 is block 1, offset 1; slot 14 is block 3, offset 2: each head's row sits in that head's run.
    for token, (blk, off) in ((0, (1, 1)), (2, (3, 2))):
        for h in range(2):
            assert torch.equal(k_cache[blk, h, off], k[token, h]) and torch.equal(v_cache[blk, h, off], v[token, h])
    written = torch.zeros(4, 2, block_size, dtype=torch.bool, device=DEVICE)
    written[1, :, 1] = written[3, :, 2] = True
    assert torch.equal(k_cache[~written], before_k[~written]) and torch.equal(v_cache[~written], before_v[~written])


def test_store_kvcache_matches_the_reference_writer():
    k_cache, v_cache = _pool(6, 16, 2, 32, torch.float32)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    k, v = torch.randn(2, 40, 2, 32, device=DEVICE)
    slots = torch.randperm(96)[:40].to(torch.int32).to(DEVICE)
    slots[7] = -1
    store_kvcache(k, v, k_cache, v_cache, slots)
    torch_ref.store_kvcache(k, v, ref_k, ref_v, slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


def _decode_case(dtype, block_size, lengths, heads, kv_heads, head_dim=32):
    num_blocks = sum(-(-n // block_size) for n in lengths) + 3
    k_cache, v_cache = _pool(num_blocks, block_size, kv_heads, head_dim, dtype)
    tables = _tables(lengths, block_size, num_blocks)
    q = torch.randn(len(lengths), heads, head_dim).to(dtype).to(DEVICE)
    ctx_lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    ctx = DecodeMeta(len(lengths), ctx_lens, tables, lengths)
    ref = torch_ref.decode(q, k_cache, v_cache, ctx, head_dim ** -0.5)
    return q, k_cache, v_cache, tables, ctx_lens, ref


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-5), (HALF, 2e-2)])
@pytest.mark.parametrize("block_size, lengths, splits, heads, kv_heads", [
    (16, [1, 17, 40, 64], 1, 4, 2),     # partial last blocks, one split: the kernel writes the output itself
    (16, [1, 17, 40, 64], 3, 4, 2),     # split-K with a merge; a split of the 1-token row is empty
    (16, [33, 7], 2, 8, 2),             # 4 query heads per KV head
    (16, [20, 50], 2, 2, 2),            # no grouping
    (4, [5, 9, 130], 4, 4, 2),          # blocks smaller than a tile: per-row block lookups
    (256, [300, 2, 256], 2, 4, 2),      # the engine's block size, a full block and a partial second one
])
def test_paged_decode_matches_reference(dtype, tol, block_size, lengths, splits, heads, kv_heads):
    q, k_cache, v_cache, tables, ctx_lens, ref = _decode_case(dtype, block_size, lengths, heads, kv_heads)
    scale = q.shape[-1] ** -0.5
    # Tiles inside a block (when 16 divides it), tiles across blocks, per-row lookups inside a block, tiles
    # copied through tensor descriptors.
    tilings = [dict(block_n=16)]
    if dtype == torch.float32:  # the interpreter is slow: the other tilings once per shape
        tilings.append(dict(block_n=32))
        if block_size % 16 == 0:
            tilings += [dict(block_n=16, page_tiles=False), dict(block_n=16, tma=True)]
    for knobs in tilings:
        out = paged_decode(q, k_cache, v_cache, tables, ctx_lens, scale, splits, **knobs)
        assert (out.float() - ref.float()).abs().max().item() < tol, knobs


def test_paged_decode_reads_the_token_major_layout_through_strides():
    """The kernel takes cache strides: the old token-major pool (what kernel_bench.py times as the "before")
    holding the same values gives the same output."""
    q, k_cache, v_cache, tables, ctx_lens, ref = _decode_case(torch.float32, 16, [17, 40], 4, 2)
    k_old = token_major(k_cache).contiguous()  # [blocks, block_size, kv_heads, head_dim] in memory
    v_old = token_major(v_cache).contiguous()
    out = paged_decode(q, token_major(k_old), token_major(v_old), tables, ctx_lens, 0.17, 2, block_n=16)
    new = paged_decode(q, k_cache, v_cache, tables, ctx_lens, 0.17, 2, block_n=16)
    assert torch.equal(out, new)


@pytest.mark.parametrize("splits", [1, 2])
def test_paged_decode_padding_rows_are_zero(splits):
    k_cache, v_cache = _pool(4, 16, 2, 32, torch.float32)
    tables = torch.tensor([[0, 1], [-1, -1]], dtype=torch.int32, device=DEVICE)
    q = torch.randn(2, 4, 32, device=DEVICE)
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    paged_decode(q, k_cache, v_cache, tables, torch.tensor([20, 0], dtype=torch.int32, device=DEVICE),
                 0.2, splits, out=out, block_n=16)
    assert torch.isfinite(out).all() and out[1].abs().max().item() == 0


def test_paged_decode_refuses_bad_knobs():
    q, k_cache, v_cache, tables, ctx_lens, _ = _decode_case(torch.float32, 16, [5], 4, 2)
    with pytest.raises(ValueError, match="page_tiles"):
        paged_decode(q, k_cache, v_cache, tables, ctx_lens, 0.2, 1, block_n=32, page_tiles=True)
    with pytest.raises(ValueError, match="num_splits"):
        paged_decode(q, k_cache, v_cache, tables, ctx_lens, 0.2, 0)
    with pytest.raises(ValueError, match="tma"):  # descriptors need the contiguous pool
        paged_decode(q, token_major(token_major(k_cache).contiguous()), v_cache, tables, ctx_lens, 0.2, 1,
                     block_n=16, tma=True)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 3e-5), (HALF, 3e-2)])
@pytest.mark.parametrize("paged, block_size", [(True, 16), (True, 4), (False, 16)])
def test_varlen_prefill_matches_reference(dtype, tol, paged, block_size):
    heads, kv_heads, head_dim = 4, 2, 32
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
    store_kvcache(k, v, k_cache, v_cache, slot_t)
    cu_q_t = torch.tensor(cu_q, dtype=torch.int32, device=DEVICE)
    cu_k_t = torch.tensor(cu_k, dtype=torch.int32, device=DEVICE)
    ctx = PrefillMeta(cu_q_t, cu_k_t, max(n for _, n in shapes), max(c + n for c, n in shapes),
                      tables if paged else None, cu_q, cu_k)
    scale = head_dim ** -0.5
    ref = torch_ref.prefill(q, k, v, k_cache, v_cache, ctx, scale)
    out = varlen_prefill(q, k, v, k_cache if paged else None, v_cache if paged else None,
                         tables if paged else None, cu_q_t, cu_k_t, ctx.max_seqlen_q, scale, block_m=16, block_n=16)
    assert (out.float() - ref.float()).abs().max().item() < tol


def test_step_input_pointers_are_not_specialised_on_alignment():
    """A CUDA graph's step inputs are views at arbitrary offsets of one buffer, an eager step's are separate
    16-byte-aligned uploads: specialised on alignment, the first eager step after start-up compiled a new
    variant mid-run (a 0.7 s stall, docs/perf.md session 11). Every kernel that reads them opts out."""
    import inspect

    from engine.kernels import decode_attention, kv_write, prefill_attention, qk_norm_rope

    if "do_not_specialize_on_alignment" not in inspect.signature(triton.jit).parameters:
        pytest.skip("this Triton has no do_not_specialize_on_alignment")
    want = {decode_attention._decode_split_kernel: {"block_tables_ptr", "context_lens_ptr"},
            prefill_attention._prefill_kernel: {"block_tables_ptr", "cu_q_ptr", "cu_k_ptr"},
            kv_write._store_kv_kernel: {"slot_ptr"}, qk_norm_rope._qk_norm_rope_kernel: {"pos_ptr"}}
    for kernel, names in want.items():
        given = getattr(kernel, "do_not_specialize_on_alignment", None)  # a JITFunction (GPU)
        if given is None:  # Triton's interpreter keeps the jit keywords as they were given
            given = kernel.kwargs.get("do_not_specialize_on_alignment", [])
        assert names <= set(given), kernel
