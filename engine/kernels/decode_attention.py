"""Paged decode attention (one query token per sequence), flash-decoding style.

Grid: (sequence, kv head, split). A program serves every query head of its KV head (GQA), so each KV
byte is read once per step; long contexts are split across programs and merged by a second kernel (with one
split the program normalises and writes the output itself: no merge launch, no float32 partials).
The number of splits is fixed by the caller (CUDA graphs need a fixed grid) and is a run-time argument, so a
new split count compiles nothing; each program works out its share of the sequence's actual context length on
the device, so nothing syncs with the host.

The caches are [num_blocks, kv_heads, block_size, head_dim] (engine/kv_layout.py): a tile of BLOCK_N rows of one
head inside one block is one contiguous run of BLOCK_N * head_dim elements. The kernel takes the cache strides, so
it reads any layout whose head_dim is contiguous (kernel_bench.py times the old token-major layout through the
same code), and V with its keys contiguous (an FP8 pool, unless LABKIT_FP8_V_TRANSPOSED=0). Then the tiles are read
unmasked (page tiles only): a tile past the context's end stays inside its block, whose other rows are finite (an
FP8 pool never holds a NaN: engine/kv_quant.py), and their scores are -inf, so they add zero. Masked, the keys-
contiguous loads lose their vector width; unmasked (and told the tile's alignment), the e4m3 kernel compiles to
~120 registers a thread against ~200 for head_dim-contiguous V (docs/perf.md, session 18).

Launch knobs (see DEFAULTS and scripts/kernel_bench.py, which sweeps them on the device):
  block_n     rows of K/V per loop iteration (a power of two >= 16);
  page_tiles  when block_size % block_n == 0 a tile never straddles a block: one block-table read per tile and
              addresses the compiler knows are contiguous (default: on whenever it applies);
  num_warps, num_stages  Triton's warps per program and software-pipelining depth (loads in flight);
  tma         page tiles copied by Hopper's tensor-memory engine (host tensor descriptors over the pool seen as
              [blocks * kv_heads * block_size, head_dim]) instead of per-thread loads;
  num_splits  programs per (sequence, KV head); the runner picks it per graph bucket with num_splits_for;
  fp8_dot     over an FP8 pool: "off" converts every e4m3 value to float16 for the dot products (two values an
              instruction: the conversions bound the kernel, docs/perf.md); "qk" quantises q to e4m3 (a scale per
              query head: amax / 448) and takes q.K^T on FP8 tensor cores, V still converted; "qkpv" also
              rounds the softmax weights p (in [0, 1], no scale) to e4m3 for p.V, as FlashAttention-3's FP8 does;
              "kq" is qk's products as K.q^T (the tile's keys as the MMA's rows: Hopper's warp-group FP8 MMA
              reads K from shared memory as stored) and "swap" also takes p.V as V^T.p^T (V still converted).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..kv_layout import v_transposed
from . import dot_precision, unaligned
from .kv_write import _e4m3

# The configuration the engine launches. From the H200 sweep of scripts/kernel_bench.py (docs/perf.md, 2026-11-30):
# best mean TB/s over 256x800,
# 256x2048 and the nano mix, +0.2 TB/s over block_n 64 / 3 stages.
DEFAULTS = {"block_n": 128, "num_warps": 4, "num_stages": 2}
# Over an FP8 pool (half the bytes a tile): the same until an FP8 sweep says otherwise (docs/perf.md, session 13),
# the dot products in float16 (fp8_dot "off").
FP8_DEFAULTS = {**DEFAULTS, "fp8_dot": "off"}
FP8_DOTS = ("off", "qk", "qkpv", "kq", "swap")


def _fp8_knobs(launch: str | None, dot: str | None) -> dict:
    """FP8_DEFAULTS with a device sweep's overrides: launch "block_n,num_warps,num_stages" (LABKIT_FP8_DECODE) and
    dot, one of FP8_DOTS (LABKIT_FP8_DOT)."""
    knobs = dict(FP8_DEFAULTS)
    if launch:
        try:
            n, w, st = (int(x) for x in launch.split(","))
        except ValueError:
            raise ValueError(f"LABKIT_FP8_DECODE: block_n,num_warps,num_stages (three integers), got {launch!r}") \
                from None
        knobs.update(block_n=n, num_warps=w, num_stages=st)
    if dot:
        if dot not in FP8_DOTS:
            raise ValueError(f"LABKIT_FP8_DOT: one of {', '.join(FP8_DOTS)}, got {dot!r}")
        knobs["fp8_dot"] = dot
    return knobs


# What an FP8 pool launches with, read once at import like the other knobs (a sweep runs a process a variant).
FP8_KNOBS = _fp8_knobs(os.environ.get("LABKIT_FP8_DECODE"), os.environ.get("LABKIT_FP8_DOT"))


# The step's small int inputs (tables, lengths, slots, positions) are views into one graph buffer in a CUDA graph
# and separate uploads in an eager step: their addresses align differently, and Triton compiles a variant per
# alignment. Not specialised, every step shares the variant compiled at start-up (docs/perf.md: the first eager
# mixed step of a `--budget 8192` server compiled one mid-run, a 0.7 s stall).
@triton.jit(do_not_specialize=["num_splits", "stride_bt"],
            **unaligned("block_tables_ptr", "context_lens_ptr", "order_ptr"))
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_desc, v_desc, block_tables_ptr, context_lens_ptr, order_ptr, out_ptr, acc_ptr,
    ml_ptr,
    num_splits, stride_qb, stride_qh, stride_ob, stride_oh, stride_bt,
    stride_block, stride_head, stride_row, stride_v_row, stride_v_d, scale_log2, v_scale,
    FP8: tl.constexpr, V_T: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE_TILES: tl.constexpr, TMA: tl.constexpr, PARTIALS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, FP8_DOT: tl.constexpr = 0, ORDERED: tl.constexpr = False,
):
    if ORDERED:
        # Programs launched KV heads first, the sequences in the order given (longest first: the long programs
        # start in the first wave instead of anywhere, so fewer run on alone at the end).
        kvh = tl.program_id(0)
        b = tl.load(order_ptr + tl.program_id(1))
        kv_heads = tl.num_programs(0)
    else:
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        kv_heads = tl.num_programs(1)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + b)
    # Each split covers a whole number of BLOCK_N tiles (so with PAGE_TILES it starts on a tile boundary).
    tiles = tl.cdiv(ctx, BLOCK_N)
    tiles_per_split = tl.cdiv(tiles, num_splits)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, ctx)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    rows = tl.arange(0, BLOCK_N)
    heads = kvh * GROUP + g
    gmask = g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0)
    # An FP8 pool is read in float16 (engine/kv_quant.py): e4m3 -> f16 is one Hopper instruction for two values,
    # where bf16 takes a second conversion each and bounds the kernel; q's bf16 values are exact in float16.
    CD: tl.constexpr = tl.float16 if FP8 and q_ptr.dtype.element_ty != tl.float32 else q_ptr.dtype.element_ty
    if FP8_DOT >= 1:
        # q in e4m3 too, a scale per query head (its amax on e4m3's largest value), so that q.K^T runs on FP8
        # tensor cores with K as stored; the scale multiplies the scores back.
        qf = q.to(tl.float32)
        q_s = tl.maximum(tl.max(tl.abs(qf), axis=1), 1e-30) / 448.0
        q = _e4m3(tl.clamp(qf / q_s[:, None], -448.0, 448.0))
        s_scale = (q_s * scale_log2)[:, None]
        q_t = tl.trans(q)
    else:
        q = q.to(CD)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    table = block_tables_ptr + b * stride_bt
    head_base = kvh * stride_head
    for n in range(start, end, BLOCK_N):
        offs = n + rows
        nmask = offs < end
        if TMA:
            # The pool as a 2-D [blocks * kv_heads * block_size, head_dim] tensor: the tile is one box of it,
            # copied by the tensor-memory engine. Rows past `end` hold other positions of this block.
            block = tl.load(table + n // BLOCK_SIZE)
            first_row = (block * kv_heads + kvh) * BLOCK_SIZE + n % BLOCK_SIZE
            k = k_desc.load([first_row, 0])
        else:
            if PAGE_TILES:
                # The tile lies inside one block: one table read, then BLOCK_N consecutive rows of this head.
                block = tl.load(table + n // BLOCK_SIZE).to(tl.int64)
                tile_base = block * stride_block + head_base
                if V_T:  # (the H200's Triton 3.6 does not see this alignment; without it V loads byte by byte)
                    in_block = tl.multiple_of(n % BLOCK_SIZE, BLOCK_N) + rows
                else:
                    in_block = n % BLOCK_SIZE + rows
            else:
                block = tl.load(table + offs // BLOCK_SIZE, mask=nmask, other=0).to(tl.int64)
                tile_base = block * stride_block + head_base
                in_block = offs % BLOCK_SIZE
            kv_off = (tile_base + in_block * stride_row)[:, None] + d[None, :]
            if V_T:
                v_off = (tile_base + in_block * stride_v_row)[:, None] + d[None, :] * stride_v_d
            else:  # (V's strides are K's)
                v_off = kv_off
            if PAGE_TILES and V_T:
                k = tl.load(k_cache_ptr + kv_off)
            else:
                k = tl.load(k_cache_ptr + kv_off, mask=nmask[:, None], other=0.0)
        if FP8_DOT >= 3:
            # K.q^T: the keys as the MMA's rows (a 64-row warp-group MMA reads the e4m3 tile from shared memory
            # as loaded), the group's few query rows its columns, instead of 16 padded query rows.
            s = tl.trans(tl.dot(k, q_t, out_dtype=tl.float32)) * s_scale
        elif FP8_DOT >= 1:
            s = tl.dot(q, tl.trans(k), out_dtype=tl.float32) * s_scale
        else:
            if FP8:  # e4m3 is exact in float16; the K scale is in scale_log2
                k = k.to(CD)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if TMA:
            v = v_desc.load([first_row, 0])
            v = tl.where(nmask[:, None], v, tl.zeros_like(v))  # p = 0 on those rows, but 0 * NaN is not 0
        elif PAGE_TILES and V_T:
            v = tl.load(v_cache_ptr + v_off)
        else:
            v = tl.load(v_cache_ptr + v_off, mask=nmask[:, None], other=0.0)
        if FP8_DOT == 2:  # p in [0, 1]: e4m3 without a scale (below 2^-9 it rounds to zero)
            acc = acc * alpha[:, None] + tl.dot(_e4m3(p), v, out_dtype=tl.float32)
        elif FP8_DOT == 4:  # V^T.p^T: the same products as below, the head dimension as the MMA's rows
            acc = acc * alpha[:, None] + tl.trans(tl.dot(tl.trans(v.to(CD)), tl.trans(p.to(CD)),
                                                         input_precision=DOT_PRECISION))
        else:
            if FP8:
                v = v.to(CD)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    if FP8:
        acc = acc * v_scale
    if PARTIALS:
        base = (b * kv_heads * GROUP + heads) * num_splits + split
        tl.store(acc_ptr + base[:, None] * HEAD_DIM + d[None, :], acc, mask=gmask[:, None])
        tl.store(ml_ptr + base * 2, m_i, mask=gmask)
        tl.store(ml_ptr + base * 2 + 1, l_i, mask=gmask)
    else:
        # One split: this program saw every key. A padded row (context 0) has l = 0 and writes zeros.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=gmask[:, None])


@triton.jit(do_not_specialize=["num_splits"])
def _decode_merge_kernel(acc_ptr, ml_ptr, out_ptr, num_splits, stride_ob, stride_oh,
                         NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr,
                         USE_PDL: tl.constexpr = False, EARLY: tl.constexpr = False):
    b = tl.program_id(0)
    h = tl.program_id(1)
    if USE_PDL:  # (the fused decode chain: everything read here is the split kernel's, so wait first)
        tl.extra.cuda.gdc_wait()
        if EARLY:
            tl.extra.cuda.gdc_launch_dependents()
    s = tl.arange(0, SPLITS_PAD)
    smask = s < num_splits
    d = tl.arange(0, HEAD_DIM)
    base = (b * NUM_HEADS + h) * num_splits
    m = tl.load(ml_ptr + (base + s) * 2, mask=smask, other=float("-inf"))
    l = tl.load(ml_ptr + (base + s) * 2 + 1, mask=smask, other=0.0)
    m_max = tl.max(m, axis=0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)  # a padded row (context 0) has no keys at all
    w = tl.where(smask & (m > float("-inf")), tl.exp2(m - m_safe), 0.0)
    acc = tl.load(acc_ptr + (base + s)[:, None] * HEAD_DIM + d[None, :], mask=smask[:, None], other=0.0)
    num = tl.sum(acc * w[:, None], axis=0)
    den = tl.sum(l * w, axis=0)
    out = num / tl.where(den > 0, den, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty))


MAX_SPLITS = 64


def longest_first(context_lens: torch.Tensor) -> torch.Tensor:
    """The rows by descending context length (int32, on their device), for paged_decode's order
    (engine/decode_order.py says why)."""
    from ..decode_order import longest_first as host_order

    return torch.from_numpy(host_order(context_lens.tolist())).to(context_lens.device)


def num_splits_for(batch: int, num_kv_heads: int, max_context: int, num_sms: int,
                   block_n: int = DEFAULTS["block_n"]) -> int:
    """Enough programs to fill the GPU about twice, but never more splits than tiles of the longest context."""
    want = -(-2 * num_sms // max(1, batch * num_kv_heads))
    return max(1, min(want, -(-max_context // block_n), MAX_SPLITS))


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, scale: float, num_splits: int, out: torch.Tensor | None = None,
                 block_n: int | None = None, page_tiles: bool | None = None, num_warps: int | None = None,
                 num_stages: int | None = None, tma: bool | None = None, k_scale: float = 1.0,
                 v_scale: float = 1.0, fp8_dot: str | None = None, order: torch.Tensor | None = None) -> torch.Tensor:
    """q: [batch, heads, head_dim]; caches [num_blocks, kv_heads, block_size, head_dim] with head_dim contiguous
    (any other strides, the block and head strides equal for K and V; V's keys may be contiguous instead:
    engine/kv_layout.py), in q's dtype or float8_e4m3fn (read with k_scale / v_scale:
    engine/kv_quant.py); block_tables [batch, max_blocks] int32 (-1 padded); context_lens
    [batch] int32 (0 = padding row: its output is zeros). Knobs left None take DEFAULTS; page_tiles None means
    "whenever block_size % block_n == 0"; tma (page tiles of contiguous caches only) loads tiles through tensor
    descriptors (Hopper's bulk tensor copies; Triton's interpreter emulates them); fp8_dot (FP8 pools only): one
    of FP8_DOTS, None for FP8_KNOBS'; order: int32 [batch], a permutation of the rows, the order in which their
    programs are launched (longest_first gives one), all KV heads of a row together."""
    batch, num_heads, head_dim = q.shape
    _, num_kv_heads, block_size, _ = k_cache.shape
    group = num_heads // num_kv_heads
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    knobs = FP8_KNOBS if fp8 else DEFAULTS
    fp8_dot = knobs.get("fp8_dot", "off") if fp8_dot is None else fp8_dot
    if fp8_dot not in FP8_DOTS or (fp8_dot != "off" and not fp8):
        raise ValueError(f"fp8_dot: one of {FP8_DOTS}, and other than 'off' over an FP8 pool only; got {fp8_dot!r}")
    block_n = knobs["block_n"] if block_n is None else block_n
    num_warps = knobs["num_warps"] if num_warps is None else num_warps
    num_stages = knobs["num_stages"] if num_stages is None else num_stages
    tma = knobs.get("tma", False) if tma is None else tma
    if page_tiles is None:
        page_tiles = block_size % block_n == 0
    elif page_tiles and block_size % block_n:
        raise ValueError(f"page_tiles needs block_size ({block_size}) to be a multiple of block_n ({block_n})")
    if fp8_dot != "off" and min(block_n, head_dim) < 32:  # an FP8 MMA's reduction is 32 values deep
        raise ValueError(f"fp8_dot {fp8_dot!r} needs block_n and head_dim of at least 32, got {block_n}, {head_dim}")
    if tma and not (page_tiles and k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("tma needs page tiles (block_size a multiple of block_n) and contiguous caches")
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be 1..{MAX_SPLITS}, got {num_splits}")
    v_t = v_transposed(v_cache)
    if k_cache.stride()[:2] != v_cache.stride()[:2] or k_cache.stride(-1) != 1 or not (v_t or v_cache.stride(-1) == 1):
        raise ValueError(f"K and V caches need equal block and head strides, K a contiguous head_dim and V a "
                         f"contiguous head_dim or keys, got {k_cache.stride()} and {v_cache.stride()}")
    assert q.stride(-1) == 1 and block_tables.stride(-1) == 1
    if out is None:
        out = torch.empty_like(q)
    partials = num_splits > 1
    if partials:
        acc = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        ml = torch.empty(batch, num_heads, num_splits, 2, dtype=torch.float32, device=q.device)
    else:
        acc = ml = out  # never touched when PARTIALS is false
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        k_desc = TensorDescriptor.from_tensor(k_cache.view(-1, head_dim), [block_n, head_dim])
        v_desc = TensorDescriptor.from_tensor(v_cache.view(-1, head_dim), [block_n, head_dim])
    else:
        k_desc, v_desc = k_cache, v_cache  # never read when TMA is false
    log2e = 1.4426950408889634
    if order is not None:
        assert order.shape == (batch,) and order.dtype == torch.int32
    grid = (num_kv_heads, batch, num_splits) if order is not None else (batch, num_kv_heads, num_splits)
    _decode_split_kernel[grid](
        q, k_cache, v_cache, k_desc, v_desc, block_tables, context_lens,
        order if order is not None else context_lens, out, acc, ml,
        num_splits, q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(2), v_cache.stride(3),
        scale * log2e * k_scale, v_scale, FP8=fp8, V_T=v_t, FP8_DOT=FP8_DOTS.index(fp8_dot), GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, BLOCK_SIZE=block_size, ORDERED=order is not None,
        BLOCK_N=block_n, PAGE_TILES=page_tiles, TMA=tma, PARTIALS=partials, DOT_PRECISION=dot_precision(q.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )
    if partials:
        _decode_merge_kernel[(batch, num_heads)](
            acc, ml, out, num_splits, out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, SPLITS_PAD=triton.next_power_of_2(num_splits),
        )
    return out
