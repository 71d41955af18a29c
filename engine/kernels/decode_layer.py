"""A decoder layer's decode step in five kernels (engine/fused_decode.py strings them together), for the small
batches of decode CUDA graphs (<= 16 rows):

    gemv(norm)  the previous layer's down_proj partials summed, the residual added (and kept), RMSNorm,
                then the merged q/k/v projection
    attention   q/k RMSNorm + RoPE from the qkv rows, this token's K/V written to the pool (quantised for an FP8
                pool), then paged decode attention over the context (plus decode_attention's merge kernel
                when the context is split, unless o_proj merges the parts: LABKIT_DECODE_MERGE_IN_GEMV)
    gemv        o_proj, split over K: float32 partials, never summed by a kernel of their own
    gemv(norm)  o_proj's partials summed, residual, RMSNorm, gate/up, SiLU(gate) * up in the epilogue
    gemv        down_proj, split over K: partials for the next layer's first kernel

against twelve kernels unfused (two norms, qk-norm-RoPE, KV write, SiLU*up and two split-K reduces of their
own). (The last two in one launch, down's programs waiting on counts of gate/up's tiles, was measured and
removed: docs/perf.md, session 27.) At batch 1 every kernel costs a launch, the
previous kernel's stragglers and its own first loads (docs/perf.md); the weights are 95% of the bytes.

Programmatic dependent launch (PDL, Hopper): each kernel loads what does not depend on the previous kernel (its
weight tile, norm weights) before `gdc_wait()`, so those loads overlap the previous kernel's tail, and lets its
successor launch (`gdc_launch_dependents()`) as soon as it has waited (LABKIT_DECODE_PDL picks another point:
at its start, at its end). A kernel writes nothing before it has waited, so a successor started early never
races a write. Off CUDA (Triton's interpreter) PDL is compiled out.

Numerics follow the unfused path (engine/layers/fused.py and the kernels it replaces): the partials summed in
split order in float32 and rounded to the model dtype, the residual sum rounded, RMSNorm's rounding points,
SiLU rounded before the product. What differs is the order of float32 sums: a GEMV program reduces its K range
in one pass (the unfused GEMV in 128-wide tiles), and the norm's sum of squares runs in its own tree; both are
float32 accumulations of the same products, a last-bit matter that logits-check judges (docs/perf.md).
"""
from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..env_knobs import int_knob
from ..kv_layout import v_transposed
from . import dot_precision
from .decode_attention import _decode_merge_kernel
from .kv_write import _quantize
from .probe import ENABLED as PROBE_ENABLED, grid_programs, launch_args, stamp, stamp_sm

# How the fused kernels use PDL on CUDA: "early" (wait, then let the successor launch at once), "late" (let it
# launch only at the end: PDL's prefetch without successors waiting on SMs), "first" (let it launch before this
# kernel's own loads: a chain of kernels, each holding its weight tile while it waits, runs as far ahead as the
# SMs have room for), "off". The default is the one measured best on the H200 (docs/perf.md); the variable exists
# for that measurement. "first" is safe for the same reason "early" is: what a kernel loads before its wait was
# written before the step's chain began (weights, the step's inputs, older KV rows), and it writes only after.
PDL_MODE = os.environ.get("LABKIT_DECODE_PDL", "early")
# Where a kernel lets its successor launch (the TRIGGER constexpr): at its end, after its wait, or at its start.
PDL_TRIGGER = {"late": 0, "early": 1, "first": 2}
if PDL_MODE not in (*PDL_TRIGGER, "off"):
    raise ValueError(f"LABKIT_DECODE_PDL: must be first, early, late or off, got {PDL_MODE!r}")
# Where o_proj alone lets its successor (gate/up) launch, when PDL is on ("": as LABKIT_DECODE_PDL says). "first"
# lets gate/up's programs launch, and load their weights, while attention still runs: a knob for measuring one
# kernel's prefetch depth (`first` for every kernel was 14% slower, session 23; for o_proj alone 8%, session 25).
O_PROJ_PDL = os.environ.get("LABKIT_DECODE_O_PROJ_PDL", "")
if O_PROJ_PDL not in ("", *PDL_TRIGGER):
    raise ValueError(f"LABKIT_DECODE_O_PROJ_PDL: must be first, early, late or empty, got {O_PROJ_PDL!r}")

# The merge kernel of a split context's parts (between attention and o_proj, where o_proj does not merge them) in
# the PDL chain ("1") or launched plainly ("0"); and the keys an attention program loads at a time. The chain
# saved 1.1% on the split path (one H200, session 13) and is part of session 24's measured default (docs/perf.md).
MERGE_PDL = os.environ.get("LABKIT_DECODE_MERGE_PDL", "1")
if MERGE_PDL not in ("0", "1"):
    raise ValueError(f"LABKIT_DECODE_MERGE_PDL: must be 0 or 1, got {MERGE_PDL!r}")
ATTN_BLOCK_N = int_knob("LABKIT_DECODE_BLOCK_N", 128)
if ATTN_BLOCK_N not in (16, 32, 64, 128):
    raise ValueError(f"LABKIT_DECODE_BLOCK_N: must be 16, 32, 64 or 128, got {ATTN_BLOCK_N}")
# The keys an attention program loads at a time when the context is split (default: LABKIT_DECODE_BLOCK_N's).
SPLIT_BLOCK_N = int_knob("LABKIT_DECODE_SPLIT_BLOCK_N", ATTN_BLOCK_N)
if SPLIT_BLOCK_N not in (16, 32, 64, 128):
    raise ValueError(f"LABKIT_DECODE_SPLIT_BLOCK_N: must be 16, 32, 64 or 128, got {SPLIT_BLOCK_N}")
# Where a split context's parts are merged at one row: "1" inside o_proj's GEMV, as it reads its input (no kernel
# between attention and o_proj, so o_proj launches while attention runs and streams its weights in under it), "0"
# in decode_attention's merge kernel. Only at one row and at most GEMV_MERGE_SPLITS splits: a tile of rows merges
# chunk by chunk, a chain of dependent loads (batch 4 +10% on an H100, session 24), and 32 splits unrolled take
# o_proj to 255 registers. With 4 splits of 128 keys at one row (engine/graph_dispatch.py) batch 1 took 0.877x
# the one-split engine's time on an H100, the same split with the merge kernel 0.951x (docs/perf.md, session 24).
MERGE_IN_GEMV = os.environ.get("LABKIT_DECODE_MERGE_IN_GEMV", "1")
if MERGE_IN_GEMV not in ("0", "1"):
    raise ValueError(f"LABKIT_DECODE_MERGE_IN_GEMV: must be 0 or 1, got {MERGE_IN_GEMV!r}")
GEMV_MERGE_SPLITS = 8
# When o_proj's GEMV, merging attention's parts, loads the rows' context lengths (which say which parts hold keys):
# "late" (after the PDL wait, so the parts' loads wait another round trip) or "early" (before it, with the weights:
# measured with NEW_KV above).
MERGE_CTX = os.environ.get("LABKIT_DECODE_MERGE_CTX", "early")
if MERGE_CTX not in ("early", "late"):
    raise ValueError(f"LABKIT_DECODE_MERGE_CTX: early or late, got {MERGE_CTX!r}")
# Where the attention kernel makes this token's K/V (norm, RoPE, the pool's store) in the program whose split holds
# it: "last" (after the older keys' tiles) or "first" (right after q's, so the two chains overlap). The same
# arithmetic either way. "first" with MERGE_CTX "early" took batch 1 from 0.7300 to 0.7234 ms a token (0.991x, an
# H100, four rounds; docs/perf.md, session 26).
NEW_KV = os.environ.get("LABKIT_DECODE_NEW_KV", "first")
if NEW_KV not in ("first", "last"):
    raise ValueError(f"LABKIT_DECODE_NEW_KV: first or last, got {NEW_KV!r}")

# Which one-row GEMVs run engine/kernels/smem_gemv.py's Gluon program, its weight tile copied into shared memory
# before the PDL wait (55-115 registers a thread, 3-9 programs an SM, against 255 and two), instead of the Triton
# programs below: the projections joined by commas, "qkv,gate_up,down" the default (all but o_proj); or a named
# route: "1" all four (o_proj merging attention's parts too); "split" o_proj and down, the launches that write split
# partials; "o_proj" or "down" that one; "0" none. Measured on an H100, batch 1, three rounds interleaved: session 38
# (the norm's row made at once) "qkv,gate_up,down" 0.965x "down" (0.6890 against 0.7143 ms), "1" 1.001x; session
# 35 (the row made chunk by chunk) against "0": "1" 1.152x, "split" 1.076x, "o_proj" 1.068x, "down" 0.994x. Beside
# attention o_proj's early-launched programs lose (docs/perf.md).
SMEM_GEMV = os.environ.get("LABKIT_DECODE_SMEM_GEMV", "qkv,gate_up,down")
SMEM_GEMV_ROUTES = {"0": (), "1": ("qkv", "o_proj", "gate_up", "down"), "split": ("o_proj", "down"),
                    "o_proj": ("o_proj",), "down": ("down",)}  # (the projections each choice sends to Gluon)


@functools.cache  # (read at every one-row launch an eager step makes)
def smem_route(knob: str) -> tuple[str, ...]:
    """The projections a LABKIT_DECODE_SMEM_GEMV value sends to Gluon: a named route, or projections joined by
    commas (qkv,gate_up,down: each once)."""
    if knob in SMEM_GEMV_ROUTES:
        return SMEM_GEMV_ROUTES[knob]
    names = knob.split(",")
    if set(names) <= set(SMEM_GEMV_ROUTES["1"]) and len(set(names)) == len(names):
        return tuple(names)
    raise ValueError(f"LABKIT_DECODE_SMEM_GEMV: one of {', '.join(SMEM_GEMV_ROUTES)}, or projections joined by "
                     f"commas, each once ({','.join(SMEM_GEMV_ROUTES['1'])}), got {knob!r}")


smem_route(SMEM_GEMV)  # (a bad value refused at import, by name)

MAX_ROWS = 16        # the largest batch the fused path serves (one tensor-core tile of rows)
# How a one-row GEMV program holds its weight tile: "k" as Triton lays out [rows, K range] (the warps split K, so
# each row's sum and the norm's statistics cross the warps through shared memory: 7 barriers and ~250 of q/k/v's
# ~900 instructions after the PDL wait, compiled for sm_90), or "rows" (the warps own whole rows, _one_row_tile:
# no barrier, 25 shuffles against 89, but each warp makes the whole input: q/k/v ~1,020 instructions after the
# wait, down ~590 against ~700 and 96 registers against 168), or "plain" (rows for the GEMVs without a norm: down,
# o_proj when it does not merge attention's parts). Measured on an H100 (docs/perf.md, session 29; three rounds):
# batch 1 rows 1.008x (the sums shrank, the inputs read by every warp grew more), plain 0.997x (not a measured win).
ROW_LAYOUT = os.environ.get("LABKIT_DECODE_ROW_LAYOUT", "k")
if ROW_LAYOUT not in ("k", "rows", "plain"):
    raise ValueError(f"LABKIT_DECODE_ROW_LAYOUT: k, rows or plain, got {ROW_LAYOUT!r}")
ROW_CHUNK = 256  # a warp's 32 lanes x 8 16-bit values: one 16-byte load a lane
# Up to FMA_ROWS rows (2-16; 1: none but the one row) a GEMV takes row by row through the one-row arithmetic
# instead of the tensor-core tile: its weight tile loaded whole before the PDL wait, as at one row, and each row's
# sums those of a one-row launch (a row's numbers do not depend on the batch). The tile loads K in chunks after the
# wait. Measured on an H100 (docs/perf.md, session 25; three rounds): 4 took batch 2 from 1.085 to 0.509 ms a token
# (0.47x) and batch 4 from 0.561 to 0.405 (0.72x); 8 and 16 took batch 8 to 1.77x and 16 to 3.25x (each row's pass
# over the tile, not the weights, is then the cost).
FMA_ROWS = int_knob("LABKIT_DECODE_FMA_ROWS", 4)
if FMA_ROWS not in (1, 2, 4, 8, 16):
    raise ValueError(f"LABKIT_DECODE_FMA_ROWS: 1, 2, 4, 8 or 16, got {FMA_ROWS}")
# The most rows whose split attention parts o_proj's GEMV merges (rows taken one at a time, each merged as one row
# is; more rows, or rows on the tile, get the merge kernel). 2 took batch 2 (two splits at short contexts) from
# 0.5087 to 0.5015 ms a token against 1 (0.986x, an H100, two calls; docs/perf.md, session 26).
MERGE_ROWS = int_knob("LABKIT_DECODE_MERGE_ROWS", 2)
if MERGE_ROWS not in (1, 2, 4):
    raise ValueError(f"LABKIT_DECODE_MERGE_ROWS: 1, 2 or 4, got {MERGE_ROWS}")


def _gemv_shape(text: str) -> tuple[int, int, int]:
    """LABKIT_DECODE_GEMV="rows,warps[,one_row_warps]": a GEMV program's weight rows, its warps, and its warps at
    batch 1 (a one-row input takes the FMA path, not the tensor-core tile; default: warps). A device sweep's knob."""
    try:
        vals = [int(x) for x in text.split(",")]
        if len(vals) not in (2, 3):
            raise ValueError
    except ValueError:
        raise ValueError(f"LABKIT_DECODE_GEMV: rows,warps[,one_row_warps] (integers), got {text!r}") from None
    rows, warps, one_row = vals[0], vals[1], vals[-1] if len(vals) == 3 else vals[1]
    if rows not in (16, 32, 64, 128) or any(w not in (1, 2, 4, 8, 16) for w in (warps, one_row)):
        raise ValueError(f"LABKIT_DECODE_GEMV: rows one of 16, 32, 64, 128 and warps one of 1-16 (powers of two), "
                         f"got {text!r}")
    return rows, warps, one_row


def _one_row_warps(name: str) -> int:
    """One GEMV's warps at batch 1 from the environment: 0 (LABKIT_DECODE_GEMV's) or a power of two up to 16."""
    warps = int_knob(name, 0)
    if warps not in (0, 1, 2, 4, 8, 16):
        raise ValueError(f"{name}: 0 (as LABKIT_DECODE_GEMV says) or 1-16 (powers of two), got {warps}")
    return warps


# Weight rows per program (a few hundred programs keep every SM streaming), its warps for a tile of 2-16 rows, and
# its warps at batch 1. Measured on the H200 (docs/perf.md, session 14): at batch 1 four warps take 0.743 ms a
# token against eight's 0.839 (-11%); at batch 16 four warps take 1.43 ms against 0.21 (the tile spills).
_BLOCK_N, _WARPS, _WARPS_ONE_ROW = _gemv_shape(os.environ.get("LABKIT_DECODE_GEMV", "16,8,4"))
# gate/up's warps at batch 1 (0: _WARPS_ONE_ROW's). Its one-row program holds 64 KiB of weights in registers: at
# 4 warps 255 registers a thread (32.8K a program, compiled for sm_90), at 8 warps 108 (28.7K), so one of its
# programs fits beside two of o_proj's and can load its weights before o_proj ends (scripts/gemv_spills.py). A
# device sweep's knob: 8 warps made batch 1 5% slower on an H100 (docs/perf.md, session 25).
GATE_UP_WARPS = _one_row_warps("LABKIT_DECODE_GATE_UP_WARPS")
# q/k/v's warps at batch 1 (0: _WARPS_ONE_ROW's). With every one-row GEMV at 8 warps, attention's 32 programs
# ran one an SM on 32 SMs, not two an SM on 16, and ended 2.6 us sooner after q/k/v (8.2 -> 5.5), while q/k/v's
# and o_proj's cross-warp sums cost more (batch 1 1.15x on an H100; docs/perf.md, session 30): q/k/v's programs
# at 64 registers a thread packed four an SM, leaving SMs free. q/k/v alone at 8 warps did the same for attention
# (5.7 us after q/k/v) but q/k/v, streaming from 92 SMs, ended 2.1 us later: batch 1 1.075x (session 30, call 3).
QKV_WARPS = _one_row_warps("LABKIT_DECODE_QKV_WARPS")
# The shared memory each decode attention program reserves at launch, in KiB (0: what the kernel uses, 72 KiB at
# Qwen3-0.6B's head size). Its programs hold 255 registers a thread (32K of an SM's 64K), so an SM whose q/k/v
# programs have left takes two of them, and at batch 1 attention's 32 programs ran two an SM on 16 SMs and ended
# 2.5 us later than one an SM on 32 (docs/perf.md, session 30). More than half an SM's 228 KiB lets one program
# an SM, without changing q/k/v's programs as QKV_WARPS did. Measured on H100s (session 31, 120 KiB): attention
# on 32 SMs and 1.3 us shorter, but batch 1 and 4 only 0.996x (gate/up's weight stream took up the time) and batch
# 16 1.023x (its 128 programs wait for 128 SMs): left off, a knob for the lab.
ATTN_SMEM_KIB = int_knob("LABKIT_DECODE_ATTN_SMEM", 0)
if not 0 <= ATTN_SMEM_KIB <= 200:  # (an H100's or H200's most a program is 227 KiB, less the kernel's static)
    raise ValueError(f"LABKIT_DECODE_ATTN_SMEM: KiB of shared memory a program, 0 (the kernel's own) to 200, "
                     f"got {ATTN_SMEM_KIB}")
# The fused decode attention's warps (4: measured since session 11). At 8 the tile's two tensor-core products
# split over twice the warps (116 registers a thread, compiled for sm_90). Measured on an H100 (session 31): batch
# 1 1.015x, batch 4 0.999x; left at 4, a knob for the lab.
ATTN_WARPS = int_knob("LABKIT_DECODE_ATTN_WARPS", 4)
if ATTN_WARPS not in (4, 8):
    raise ValueError(f"LABKIT_DECODE_ATTN_WARPS: 4 or 8, got {ATTN_WARPS}")

# The norm's statistics NORM_CHUNK columns at a time for a tile of 2-16 rows (0: whole rows at once; one row
# always takes whole rows, it holds little): the 16 x K float32 rows spill. On one H200 (docs/perf.md, session 15)
# 128-column chunks took batch 4 from 0.634 to 0.573 ms a token and batch 16 from 0.211 to 0.179; batch 1 equal.
NORM_CHUNK = int_knob("LABKIT_DECODE_NORM_CHUNK", 128)
if NORM_CHUNK not in (0, 64, 128, 256, 512):
    raise ValueError(f"LABKIT_DECODE_NORM_CHUNK: 0, 64, 128, 256 or 512, got {NORM_CHUNK}")
# A tile of 2-16 rows reads its weights and inputs K_CHUNK columns at a time after the PDL wait, instead of its
# whole K range before it (0): that range's 16-row tiles spill. On one H200 (docs/perf.md, session 16) 128 took
# batch 16 from 0.1785 to 0.1574 ms a token and left batch 4 at 0.573; 64 was slower (0.209 and 0.765).
# One row keeps the whole range (nothing spills there, and its loads overlap the previous kernel's tail).
K_CHUNK = int_knob("LABKIT_DECODE_K_CHUNK", 128)
if K_CHUNK not in (0, 32, 64, 128, 256):
    raise ValueError(f"LABKIT_DECODE_K_CHUNK: 0, 32, 64, 128 or 256, got {K_CHUNK}")


def _pdl(device: torch.device, mode: str = "") -> tuple[bool, int, dict]:
    """(USE_PDL, TRIGGER constexprs, launch kwargs) for a launch on this device; mode: this launch's trigger point
    instead of PDL_MODE's (when PDL is on)."""
    if device.type != "cuda" or PDL_MODE == "off":
        return False, 0, {}
    return True, PDL_TRIGGER[mode or PDL_MODE], {"launch_pdl": True}


def reserve_shared(compiled, nbytes: int) -> bool:
    """Make a compiled Triton kernel's later launches reserve at least nbytes of shared memory a program (its
    launcher passes packed_metadata's third field as the launch's dynamic size); True when it changed. The first
    launch has compiled it: a CUDA graph captured after a warm-up launch records the reservation."""
    warps, ctas, shared = compiled.packed_metadata
    if shared >= nbytes:
        return False
    if shared <= 48 * 1024 < nbytes:  # (Triton's loader raised the limit only for kernels that need more)
        import ctypes
        max_dynamic = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        rc = ctypes.CDLL("libcuda.so.1").cuFuncSetAttribute(ctypes.c_void_p(compiled.function), max_dynamic,
                                                              ctypes.c_int(nbytes))
        if rc != 0:
            raise RuntimeError(f"cuFuncSetAttribute({nbytes} bytes of shared memory): CUDA error {rc}")
    compiled.packed_metadata = (warps, ctas, nbytes)
    return True


@triton.jit
def _rnd(x, DT: tl.constexpr):
    return x.to(DT).to(tl.float32)


@triton.jit
def _merged_rows(acc_ptr, ml_ptr, ctx, rows, cols, mask, M, K,
                 S: tl.constexpr, D: tl.constexpr, BN: tl.constexpr, DT: tl.constexpr, UNROLL: tl.constexpr):
    """Attention's output at columns `cols` (head cols // D) of rows `rows` merged from its S split parts, acc
    [M, H, S, D] and (max, sum) pairs ml [M, H, S, 2]: decode_attention's merge kernel arithmetic, the parts summed
    in split order. A part is read only where its split holds keys, known from the context length (the attention
    kernel's own bounds: BN-key tiles, cdiv(tiles, S) of them a split; ctx: the rows' lengths, loaded by the
    caller), so no load waits for another. rows, ctx and cols broadcast against each other (rows and ctx along
    the rows' axis). UNROLL (one row): every part's loads issued at once; a tile of rows loops (unrolled, its
    loads spill)."""
    span = tl.cdiv(tl.cdiv(ctx, BN), S) * BN        # keys a split covers, per row
    row = (rows * (K // D) + cols // D) * S         # the (row, head)'s first part
    col = cols % D
    m_max = tl.full(row.shape, float("-inf"), tl.float32)
    num = tl.zeros(row.shape, tl.float32)
    den = tl.zeros(row.shape, tl.float32)
    if UNROLL:
        for s in tl.static_range(S):
            m_max = tl.maximum(m_max, _part_max(ml_ptr, row, s, mask & (s * span < ctx)))
        for s in tl.static_range(S):
            num, den = _part_add(acc_ptr, ml_ptr, row, col, s, mask & (s * span < ctx), m_max, num, den, D)
    else:
        for s in range(S):
            m_max = tl.maximum(m_max, _part_max(ml_ptr, row, s, mask & (s * span < ctx)))
        for s in range(S):
            num, den = _part_add(acc_ptr, ml_ptr, row, col, s, mask & (s * span < ctx), m_max, num, den, D)
    return _rnd(num / tl.where(den > 0, den, 1.0), DT)             # (the merge kernel stores the model dtype)


@triton.jit
def _part_max(ml_ptr, row, s, live):
    return tl.load(ml_ptr + (row + s) * 2, mask=live, other=float("-inf"))


@triton.jit
def _part_add(acc_ptr, ml_ptr, row, col, s, live, m_max, num, den, D: tl.constexpr):
    """Part s weighted by exp2(its max - the max): added to the numerator and the denominator (a part with no
    keys, or a padding row's, weighs 0)."""
    m = tl.load(ml_ptr + (row + s) * 2, mask=live, other=float("-inf"))
    w = tl.where(m > float("-inf"), tl.exp2(m - m_max), 0.0)
    num += tl.load(acc_ptr + (row + s) * D + col, mask=live, other=0.0) * w
    den += tl.load(ml_ptr + (row + s) * 2 + 1, mask=live, other=0.0) * w
    return num, den


@triton.jit
def _each_row(w, ON_GPU: tl.constexpr):
    """w as it is, through an opaque move on the GPU: a loop's float32 copy of its weight tile would otherwise be
    made once, before the loop (the compiler hoists the conversion), and held in registers: twice the tile's."""
    if ON_GPU:  # (a 32-bit register holds two 16-bit weights, or one float32)
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [w], dtype=w.dtype, is_pure=False,
                                         pack=2 if w.dtype.primitive_bitwidth == 16 else 1)
    return w


@triton.jit
def _row_ctx(ctx_all, offs_m, m):
    """Row m's context length out of the rows', as a [1] tensor."""
    return tl.sum(tl.where(offs_m == m, ctx_all, 0), axis=0) + tl.zeros([1], tl.int32)


@triton.jit
def _x_rows(x_ptr, part_ptr, res_ptr, ml_ptr, ctx, rows, cols, mask, M, K, stride_xm,
            S_IN: tl.constexpr, RESIDUAL: tl.constexpr, DT: tl.constexpr,
            ATTN_S: tl.constexpr, ATTN_D: tl.constexpr, ATTN_BN: tl.constexpr, UNROLL: tl.constexpr):
    """The GEMV's input at rows `rows` and columns `cols` (broadcasting against each other: [M, 1] and [1, K],
    or a rows-layout program's [warps, 1, 1, 1] and [1, 1, chunks, width]; ctx, the rows' context lengths, shaped
    as rows), float32 holding model-dtype values: x itself, or S_IN float32 partials summed in order (the unfused
    reduce kernel's sum), or attention's ATTN_S split parts merged (part_ptr: their acc; UNROLL: every part's
    loads at once), plus the residual (add_rms_norm's sum)."""
    if ATTN_S > 0:
        x = _merged_rows(part_ptr, ml_ptr, ctx, rows, cols, mask, M, K, ATTN_S, ATTN_D, ATTN_BN, DT, UNROLL)
    elif S_IN == 0:
        x = tl.load(x_ptr + rows * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    else:
        first = part_ptr + rows.to(tl.int64) * K + cols
        x = tl.load(first, mask=mask, other=0.0)  # (0 + the first partial: the reduce kernel's first sum, exactly)
        for s in tl.static_range(1, S_IN):
            x += tl.load(first + s * M * K, mask=mask, other=0.0)
        x = _rnd(x, DT)
    if RESIDUAL:
        r = tl.load(res_ptr + rows * K + cols, mask=mask, other=0.0).to(tl.float32)
        x = _rnd(x + r, DT)
    return x


@triton.jit
def _chunked(BLOCK_K: tl.constexpr, CW: tl.constexpr):
    """Columns 0..BLOCK_K-1 as [1, 1, BLOCK_K / CW, CW]: CW-wide chunks along the third axis."""
    return tl.arange(0, BLOCK_K // CW)[None, None, :, None] * CW + tl.arange(0, CW)[None, None, None, :]


@triton.jit
def _one_row_tile(w, wu, nw, x_ptr, part_ptr, res_ptr, res_out_ptr, ml_ptr, ctx_all, cols, writes_residual, M, K,
                  stride_xm, eps, S_IN: tl.constexpr, RESIDUAL: tl.constexpr, NORM: tl.constexpr,
                  SILU: tl.constexpr, DT: tl.constexpr, ATTN_S: tl.constexpr, ATTN_D: tl.constexpr,
                  ATTN_BN: tl.constexpr, probe_ptr, prog, PROBE: tl.constexpr):
    """One row's sums over a weight tile held as [G, BLOCK_N / G, chunks, CW] (G: the program's warps; cols: the K
    range's columns as [1, 1, chunks, CW]). Triton spreads a [BLOCK_N, K range] tile's warps along K (each warp a
    slice of every row), so each row's sum, and the input's norm statistics, cross the warps through shared
    memory, with barriers. Shaped so, a CW-wide chunk fills a warp's lanes (32 x 8 values: 16-byte loads) and
    each warp owns BLOCK_N / G whole rows: a row's sum is in-thread over the chunks, then within its warp. The
    input is read as [G, 1, chunks, CW], the same row once a warp, so it takes the tile's layout (each warp all
    of it) and its statistics need no other warp. The same products, summed in another float32 order. NORM needs
    the whole row in the range (one split). Returns (acc, acc_u) [BLOCK_N, 1] float32 (acc_u: the up rows' sums
    with SILU, else acc)."""
    G: tl.constexpr = w.shape[0]
    BN: tl.constexpr = w.shape[0] * w.shape[1]
    zero = tl.zeros([G, 1, 1, 1], tl.int32)   # the one row, once a warp
    ctx = zero + tl.reshape(ctx_all, (1, 1, 1, 1))
    x = _x_rows(x_ptr, part_ptr, res_ptr, ml_ptr, ctx, zero, cols, zero < M, M, K, stride_xm, S_IN, RESIDUAL, DT,
                ATTN_S, ATTN_D, ATTN_BN, True)
    if NORM:
        if RESIDUAL:
            if writes_residual:  # the new residual stream, written once (from the first warp's copy)
                tl.store(res_out_ptr + cols + zero, x.to(DT), mask=tl.arange(0, G)[:, None, None, None] == 0)
        rstd = tl.math.rsqrt(tl.sum(tl.sum(x * x, axis=2), axis=2) / K + eps)   # (in-thread over chunks first)
        x = _rnd(_rnd(x * rstd[:, :, None, None], DT) * nw, DT)
    if PROBE:
        stamp(probe_ptr, prog, 3, tl.sum(tl.ravel(x), axis=0))
    acc = tl.reshape(tl.sum(tl.sum(w.to(tl.float32) * x, axis=2), axis=2), (BN, ))[:, None]
    if SILU:
        acc_u = tl.reshape(tl.sum(tl.sum(wu.to(tl.float32) * x, axis=2), axis=2), (BN, ))[:, None]
    else:
        acc_u = acc
    return acc, acc_u


@triton.jit
def _gemv_kernel(
    w_ptr, x_ptr, part_ptr, res_ptr, res_out_ptr, nw_ptr, y_ptr, ml_ptr, ctx_ptr, probe_ptr, M, N, K, KS, stride_wn,
    stride_xm, up_rows, eps,
    S_IN: tl.constexpr, RESIDUAL: tl.constexpr, NORM: tl.constexpr, SILU: tl.constexpr, PARTIALS: tl.constexpr,
    EVEN: tl.constexpr, FULL_EVEN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_FULL: tl.constexpr,
    USE_PDL: tl.constexpr, TRIGGER: tl.constexpr, DOT_PRECISION: tl.constexpr, NORM_CHUNK: tl.constexpr,
    K_CHUNK: tl.constexpr, ATTN_S: tl.constexpr, ATTN_D: tl.constexpr, ATTN_BN: tl.constexpr,
    PER_ROW: tl.constexpr, CTX_EARLY: tl.constexpr, ON_GPU: tl.constexpr, ROW_CW: tl.constexpr,
    ROW_G: tl.constexpr, PROBE: tl.constexpr,
):
    """y = W @ f(x) for M <= 16 rows, one _gemv_program a (n tile, k split)."""
    _gemv_program(tl.program_id(0), tl.program_id(1), w_ptr, x_ptr, part_ptr, res_ptr, res_out_ptr, nw_ptr, y_ptr,
                  ml_ptr, ctx_ptr, M, N, K, KS, stride_wn, stride_xm, up_rows, eps, S_IN, RESIDUAL, NORM,
                  SILU, PARTIALS, EVEN, FULL_EVEN, BLOCK_M, BLOCK_N, BLOCK_K, K_FULL, USE_PDL, TRIGGER,
                  DOT_PRECISION, NORM_CHUNK, K_CHUNK, ATTN_S, ATTN_D, ATTN_BN, PER_ROW, CTX_EARLY, ON_GPU,
                  probe_ptr, PROBE, ROW_CW, ROW_G)


@triton.jit
def _gemv_program(
    pid_n, pid_k, w_ptr, x_ptr, part_ptr, res_ptr, res_out_ptr, nw_ptr, y_ptr, ml_ptr, ctx_ptr, M, N, K, KS,
    stride_wn, stride_xm, up_rows, eps,
    S_IN: tl.constexpr, RESIDUAL: tl.constexpr, NORM: tl.constexpr, SILU: tl.constexpr, PARTIALS: tl.constexpr,
    EVEN: tl.constexpr, FULL_EVEN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_FULL: tl.constexpr,
    USE_PDL: tl.constexpr, TRIGGER: tl.constexpr, DOT_PRECISION: tl.constexpr, NORM_CHUNK: tl.constexpr,
    K_CHUNK: tl.constexpr, ATTN_S: tl.constexpr, ATTN_D: tl.constexpr, ATTN_BN: tl.constexpr,
    PER_ROW: tl.constexpr, CTX_EARLY: tl.constexpr, ON_GPU: tl.constexpr, probe_ptr, PROBE: tl.constexpr,
    ROW_CW: tl.constexpr, ROW_G: tl.constexpr,
):
    """Program (pid_n, pid_k) of y = W @ f(x): it owns BLOCK_N rows of W and one KS-wide range of K, loaded whole
    before the wait (K_CHUNK 0: one row, or PER_ROW's rows, each then reduced as one row is), or K_CHUNK columns at
    a time after it (a tensor-core tile of rows: its whole range spills). PARTIALS stores float32 partials
    [splits, M, N]; else model-dtype y [M, N] (SILU: W holds gate rows then up rows, up_rows apart, and
    y = SiLU(gate) * up, N = up_rows). PROBE: timestamps into probe_ptr (probe.py).
    ROW_CW > 0 (one row, LABKIT_DECODE_ROW_LAYOUT=rows): the tile held as [ROW_G, BLOCK_N / ROW_G, K range /
    ROW_CW, ROW_CW], so that each of ROW_G warps owns whole rows and their sums need no other warp (_one_row_tile
    says why)."""
    DT: tl.constexpr = x_ptr.dtype.element_ty if PARTIALS else y_ptr.dtype.element_ty
    prog = pid_n * tl.num_programs(1) + pid_k  # (the probe's slot: unused, and compiled out, without it)
    if PROBE:
        stamp(probe_ptr, prog, 0, 0.0)
        stamp_sm(probe_ptr, prog)
    if USE_PDL:
        if TRIGGER == 2:
            tl.extra.cuda.gdc_launch_dependents()
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    kk = tl.arange(0, BLOCK_K)
    offs_k = pid_k * KS + kk
    # EVEN (the K range is the whole tile): no mask along the contiguous dimension, so loads are 16-byte wide.
    k_mask = (kk < KS) & (offs_k < K)
    w_mask = n_mask[:, None] if EVEN else n_mask[:, None] & k_mask[None, :]
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    if ATTN_S > 0 and CTX_EARLY:
        # the rows' context lengths (the step's input) before the wait: the parts' loads, masked by them, then
        # follow the wait at once instead of after another round trip
        ctx_all = tl.load(ctx_ptr + offs_m, mask=m_mask, other=0)
    if ROW_CW > 0:
        RG: tl.constexpr = BLOCK_N // ROW_G                                # a warp's rows
        cols = pid_k * KS + _chunked(BLOCK_K, ROW_CW)                      # [1, 1, chunks, ROW_CW]
        rows = (pid_n * BLOCK_N + tl.arange(0, ROW_G)[:, None, None, None] * RG
                + tl.arange(0, RG)[None, :, None, None])                   # [ROW_G, RG, 1, 1]: offs_n's
        w_rows = w_ptr + rows.to(tl.int64) * stride_wn + cols
        w_mask = rows < N
    if K_CHUNK == 0:
        # Nothing here depends on the previous kernel: these loads overlap its tail under PDL.
        w = tl.load(w_rows, mask=w_mask, other=0.0)
        if SILU:
            wu = tl.load(w_rows + up_rows * stride_wn, mask=w_mask, other=0.0)
        if NORM:
            if ROW_CW > 0:  # (once a warp: the tile's layout; see _one_row_tile)
                nw = tl.load(nw_ptr + cols + tl.zeros([ROW_G, 1, 1, 1], tl.int32)).to(tl.float32)
            else:
                nw = (tl.load(nw_ptr + offs_k) if EVEN else
                      tl.load(nw_ptr + offs_k, mask=k_mask, other=0.0)).to(tl.float32)
        if PROBE:
            if ROW_CW > 0:
                stamp(probe_ptr, prog, 1, tl.sum(tl.ravel(w.to(tl.float32)), axis=0))
            else:
                stamp(probe_ptr, prog, 1, tl.sum(tl.sum(w.to(tl.float32), axis=1), axis=0))
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        if TRIGGER == 1:
            tl.extra.cuda.gdc_launch_dependents()
    if PROBE:
        stamp(probe_ptr, prog, 2, 0.0)
    if ATTN_S > 0 and not CTX_EARLY:
        ctx_all = tl.load(ctx_ptr + offs_m, mask=m_mask, other=0)
    elif ATTN_S == 0:
        ctx_all = offs_m  # (no parts: never read)
    if ROW_CW > 0:
        acc, acc_u = _one_row_tile(w, wu if SILU else w, nw if NORM else w, x_ptr, part_ptr, res_ptr, res_out_ptr,
                                   ml_ptr, ctx_all, cols, (pid_n == 0) & (pid_k == 0), M, K, stride_xm, eps,
                                   S_IN, RESIDUAL, NORM, SILU, DT, ATTN_S, ATTN_D, ATTN_BN, probe_ptr, prog,
                                   PROBE)
    if PER_ROW:
        # BLOCK_M rows one at a time through the one-row arithmetic below, the weight tile shared
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        if SILU:
            acc_u = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        for m in range(0, M):  # (a loop, not unrolled: unrolled, every row's loads are hoisted and gate/up spills)
            om = m + tl.arange(0, 1)
            mm = om < M
            ctx_m = _row_ctx(ctx_all, offs_m, m)[:, None]
            xm = _x_rows(x_ptr, part_ptr, res_ptr, ml_ptr, ctx_m, om[:, None], offs_k[None, :],
                         mm[:, None] if EVEN else mm[:, None] & k_mask[None, :], M, K, stride_xm, S_IN, RESIDUAL,
                         DT, ATTN_S, ATTN_D, ATTN_BN, True)
            if NORM:
                full_mask = mm[:, None] if FULL_EVEN else mm[:, None] & (tl.arange(0, K_FULL) < K)[None, :]
                h = _x_rows(x_ptr, part_ptr, res_ptr, ml_ptr, ctx_m, om[:, None], tl.arange(0, K_FULL)[None, :],
                            full_mask, M, K, stride_xm, S_IN, RESIDUAL, DT, ATTN_S, ATTN_D, ATTN_BN, True)
                if RESIDUAL:
                    if (pid_n == 0) & (pid_k == 0):
                        tl.store(res_out_ptr + om[:, None] * K + tl.arange(0, K_FULL)[None, :], h.to(DT),
                                 mask=full_mask)
                rstd = tl.math.rsqrt(tl.sum(h * h, axis=1) / K + eps)
                xm = _rnd(_rnd(xm * rstd[:, None], DT) * nw[None, :], DT)
            sel = offs_m[None, :] == m
            acc = tl.where(sel, tl.sum(_each_row(w, ON_GPU).to(tl.float32) * xm, axis=1)[:, None], acc)
            if SILU:
                acc_u = tl.where(sel, tl.sum(_each_row(wu, ON_GPU).to(tl.float32) * xm, axis=1)[:, None], acc_u)
    if K_CHUNK == 0 and not PER_ROW and ROW_CW == 0:
        # Loaded before the statistics, as before K_CHUNK existed: loaded after them, the 16-row q/k/v and gate/up
        # tiles spill (538 and 6,070 spill loads against 2 and 84, compiled for sm_90; 14x slower on the H200).
        x_mask = m_mask[:, None] if EVEN else m_mask[:, None] & k_mask[None, :]
        x = _x_rows(x_ptr, part_ptr, res_ptr, ml_ptr, ctx_all[:, None], offs_m[:, None], offs_k[None, :], x_mask, M,
                    K, stride_xm, S_IN, RESIDUAL, DT, ATTN_S, ATTN_D, ATTN_BN, BLOCK_M == 1)
    if NORM and not PER_ROW and ROW_CW == 0:
        # The statistics need whole rows: every program reads them (a few KiB, from L2) and gets the same sums,
        # NORM_CHUNK columns at a time (K_FULL: all at once; fewer at 2-16 rows, whose 16 x K float32 would spill).
        ss = tl.zeros([BLOCK_M], tl.float32)
        for c in tl.static_range(0, K_FULL, NORM_CHUNK):
            kf = c + tl.arange(0, NORM_CHUNK)
            full_mask = m_mask[:, None] if FULL_EVEN else m_mask[:, None] & (kf < K)[None, :]
            h = _x_rows(x_ptr, part_ptr, res_ptr, ml_ptr, ctx_all[:, None], offs_m[:, None], kf[None, :], full_mask,
                        M, K, stride_xm, S_IN, RESIDUAL, DT, ATTN_S, ATTN_D, ATTN_BN, BLOCK_M == 1)
            if RESIDUAL:
                if (pid_n == 0) & (pid_k == 0):  # the new residual stream, written once
                    tl.store(res_out_ptr + offs_m[:, None] * K + kf[None, :], h.to(DT), mask=full_mask)
            ss += tl.sum(h * h, axis=1)
        rstd = tl.math.rsqrt(ss / K + eps)

    if K_CHUNK > 0:
        # tl.dot's accumulator carried across the chunks: the same products, summed in the same order as one
        # dot over the whole range.
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        if SILU:
            acc_u = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        for c in range(0, BLOCK_K, K_CHUNK):
            kc = c + tl.arange(0, K_CHUNK)
            offs_kc = pid_k * KS + kc
            kc_mask = (kc < KS) & (offs_kc < K)
            wc_mask = n_mask[:, None] if EVEN else n_mask[:, None] & kc_mask[None, :]
            wc_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_kc[None, :]
            wc = tl.load(wc_rows, mask=wc_mask, other=0.0)
            xc_mask = m_mask[:, None] if EVEN else m_mask[:, None] & kc_mask[None, :]
            xc = _x_rows(x_ptr, part_ptr, res_ptr, ml_ptr, ctx_all[:, None], offs_m[:, None], offs_kc[None, :],
                         xc_mask, M, K, stride_xm, S_IN, RESIDUAL, DT, ATTN_S, ATTN_D, ATTN_BN, BLOCK_M == 1)
            if NORM:
                nwc = tl.load(nw_ptr + offs_kc, mask=kc_mask, other=0.0).to(tl.float32)
                xc = _rnd(_rnd(xc * rstd[:, None], DT) * nwc[None, :], DT)
            xt = tl.trans(xc.to(wc.dtype))
            acc = tl.dot(wc, xt, acc, input_precision=DOT_PRECISION)
            if SILU:
                wuc = tl.load(wc_rows + up_rows * stride_wn, mask=wc_mask, other=0.0)
                acc_u = tl.dot(wuc, xt, acc_u, input_precision=DOT_PRECISION)
    elif not PER_ROW and ROW_CW == 0:
        if NORM:
            x = _rnd(_rnd(x * rstd[:, None], DT) * nw[None, :], DT)
        if PROBE:
            stamp(probe_ptr, prog, 3, tl.sum(tl.sum(x, axis=1), axis=0))
        if BLOCK_M == 1:
            acc = tl.sum(w.to(tl.float32) * x, axis=1)[:, None]                   # [BLOCK_N, 1]
            if SILU:
                acc_u = tl.sum(wu.to(tl.float32) * x, axis=1)[:, None]
        else:
            xt = tl.trans(x.to(w.dtype))                                           # [BLOCK_K, BLOCK_M]
            acc = tl.dot(w, xt, input_precision=DOT_PRECISION)
            if SILU:
                acc_u = tl.dot(wu, xt, input_precision=DOT_PRECISION)
    if PROBE:
        stamp(probe_ptr, prog, 7, tl.sum(tl.sum(acc, axis=1), axis=0))
    if USE_PDL:
        if TRIGGER == 0:
            tl.extra.cuda.gdc_launch_dependents()

    out_mask = n_mask[:, None] & m_mask[None, :]
    if SILU:
        g = _rnd(acc, DT)
        u = _rnd(acc_u, DT)
        s = _rnd(g / (1.0 + tl.exp(-g)), DT)  # F.silu's result is a model-dtype tensor
        tl.store(y_ptr + offs_m[None, :] * N + offs_n[:, None], (s * u).to(DT), mask=out_mask)
    elif not PARTIALS:
        tl.store(y_ptr + offs_m[None, :] * N + offs_n[:, None], acc.to(DT), mask=out_mask)
    else:
        tl.store(y_ptr + (pid_k * M + offs_m[None, :]).to(tl.int64) * N + offs_n[:, None], acc, mask=out_mask)
    if PROBE:
        stamp(probe_ptr, prog, 8, 0.0)


def split_for(N: int, K: int, num_sms: int, block_n: int | None = None) -> int:
    """Splits of K: the fewest that give every SM a program, among those that cut K into equal power-of-two
    ranges of at least 256 (whole tiles: unmasked, 16-byte loads); the most such splits if none reaches that.
    block_n: the GEMV's rows a program (default: the one gemv launches with)."""
    tiles = triton.cdiv(N, block_n or _BLOCK_N)
    even = [s for s in range(1, 17) if K % s == 0 and (K // s) & (K // s - 1) == 0 and K // s >= 256]
    if not even:
        return 1
    return next((s for s in even if tiles * s >= num_sms), even[-1])


def gemv_meta(M: int, N: int, K: int, split: int, *, s_in: int, residual: bool, norm: bool, silu: bool,
              partials_out: bool, dtype: torch.dtype, use_pdl: bool, trigger: int,
              attn: tuple[int, int, int] = (0, 0, 0), on_gpu: bool = True) -> tuple[tuple, dict]:
    """The fused GEMV's grid and compile-time arguments (num_warps among them) for an M x K input to N outputs
    in `split` K ranges: what gemv launches, and what tests/test_gemv_spills.py compiles for sm_90.
    attn: (splits, head_dim, block_n) of attention parts merged as the input (0s: none); on_gpu: compiled for CUDA,
    not interpreted (the per-row path's opaque move)."""
    ks = triton.cdiv(K, split)
    k_full = triton.next_power_of_2(K)
    block_k = max(16, triton.next_power_of_2(ks))
    per_row = 1 < M <= FMA_ROWS
    one = M == 1 or per_row  # (the one-row arithmetic: the weight tile whole before the wait, the FMA sums)
    warps = _WARPS if not one else (GATE_UP_WARPS or _WARPS_ONE_ROW) if silu else (
        (QKV_WARPS or _WARPS_ONE_ROW) if norm else _WARPS_ONE_ROW)
    meta = dict(
        S_IN=s_in, RESIDUAL=residual, NORM=norm, SILU=silu, PARTIALS=partials_out,
        EVEN=ks == triton.next_power_of_2(ks) and ks >= 16 and K % ks == 0,
        FULL_EVEN=K == triton.next_power_of_2(K), BLOCK_M=triton.next_power_of_2(M) if one else 16,
        BLOCK_N=_BLOCK_N, BLOCK_K=block_k, K_FULL=k_full, USE_PDL=use_pdl, TRIGGER=trigger,
        DOT_PRECISION=dot_precision(dtype), NORM_CHUNK=k_full if one else min(NORM_CHUNK or k_full, k_full),
        K_CHUNK=0 if one else min(K_CHUNK, block_k), ATTN_S=attn[0], ATTN_D=attn[1], ATTN_BN=attn[2],
        PER_ROW=per_row, CTX_EARLY=MERGE_CTX == "early", ON_GPU=on_gpu,
        ROW_CW=row_chunk(M, K, ks, block_k, norm, attn[0] > 0), ROW_G=min(warps, _BLOCK_N), num_warps=warps,
        enable_fp_fusion=False)
    return (triton.cdiv(N, _BLOCK_N), split), meta


def row_chunk(M: int, K: int, ks: int, block_k: int, norm: bool, attn: bool) -> int:
    """The ROW_CW constexpr: the chunk width of a one-row tile held with its warps on the rows (_one_row_tile),
    0 for the tile as loaded. Needs an unmasked K range (a power of two dividing K), an input that is not
    attention's parts (merged there, each warp would merge all of them: o_proj spills) and, with the norm, the
    whole row in the range."""
    if ROW_LAYOUT == "k" or M != 1 or ks != block_k or K % ks or (norm and ks != K) or attn:
        return 0
    if ROW_LAYOUT == "plain" and norm:
        return 0
    return min(block_k, ROW_CHUNK)


class AttnParts(NamedTuple):
    """A split attention's output before its merge (qkv_attention with merge=False): acc [M, H, S, D] and
    ml [M, H, S, 2] float32, and what says which splits hold keys (the context lengths, the key tile)."""
    acc: torch.Tensor
    ml: torch.Tensor
    context_lens: torch.Tensor
    block_n: int


def merges_in_gemv(rows: int, num_splits: int) -> bool:
    """Does o_proj's GEMV merge a split attention's parts (MERGE_IN_GEMV), or the merge kernel?"""
    return (MERGE_IN_GEMV == "1" and (rows == 1 or rows <= min(MERGE_ROWS, FMA_ROWS))
            and 1 < num_splits <= GEMV_MERGE_SPLITS)


def _smem_serves(dev: torch.device, M: int, N: int, K: int, ks: int, w: torch.Tensor, *, norm: bool, silu: bool,
                 one_dtype: bool, proj: str) -> bool:
    """Does this launch go to smem_gemv's Gluon program (its projection `proj` routed there by
    LABKIT_DECODE_SMEM_GEMV, CUDA, a launch it fits, its input and output in the weights' dtype: one_dtype)?"""
    if dev.type != "cuda" or not one_dtype or proj not in smem_route(SMEM_GEMV):
        return False
    try:
        from . import smem_gemv
    except ImportError:  # (a Triton without Gluon, which the default's route needs: its Triton program serves)
        return False
    return smem_gemv.serves(M, N, K, ks, _BLOCK_N, w.element_size(), dense=w.stride(0) == K, norm=norm, silu=silu,
                            probe=PROBE_ENABLED == "1")


def gemv(w: torch.Tensor, *, x: torch.Tensor | AttnParts | None = None, partials: torch.Tensor | None = None,
         residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
         silu: bool = False, split: int | None = None, dtype: torch.dtype | None = None, pdl: str = "",
         label: str = "gemv", proj: str = ""):
    """The fused decode GEMV. Input: x [M, K] in the model dtype, or attention's split parts (AttnParts, merged
    as decode_attention's merge kernel merges them and rounded to the model dtype), or partials [S, M, K]
    float32 (summed, rounded to `dtype`); plus residual [M, K] (then returns (y, new residual)); RMSNorm with
    norm_weight [K] first. w [N', K] (SILU: [2N, K], gate then up). Returns y [M, N] in the model dtype; with
    `split` given, float32 partials [split, M, N] for the next kernel to sum (one split included). pdl: where
    this launch lets its successor launch (first, early, late; "": LABKIT_DECODE_PDL's point); label: the
    launch's name in the in-kernel probe's timeline (LABKIT_DECODE_PROBE); proj: which of the layer's projections
    this is (qkv, o_proj, gate_up, down; "": none), for LABKIT_DECODE_SMEM_GEMV's route."""
    assert (x is None) != (partials is None)
    parts = x if isinstance(x, AttnParts) else None
    if parts is not None:
        M, H, S, D = parts.acc.shape
        assert parts.acc.is_contiguous() and parts.ml.is_contiguous() and parts.ml.shape == (M, H, S, 2)
        x, partials, K = None, parts.acc, H * D
        src = parts.acc
    else:
        src = x if x is not None else partials
        M, K = src.shape[-2], src.shape[-1]
    dtype = dtype or w.dtype
    assert M <= MAX_ROWS and w.shape[1] == K and w.stride(1) == 1 and src.stride(-1) == 1
    assert partials is None or partials.is_contiguous()
    assert residual is None or (residual.is_contiguous() and residual.shape == (M, K))
    assert split is None or not silu, "SiLU needs whole sums"
    partials_out = split is not None
    split = split or 1
    N = w.shape[0] // 2 if silu else w.shape[0]
    ks = triton.cdiv(K, split)
    dev = w.device
    y = torch.empty(M, N, dtype=dtype, device=dev) if not partials_out else \
        torch.empty(split, M, N, dtype=torch.float32, device=dev)
    res_out = torch.empty(M, K, dtype=dtype, device=dev) if residual is not None else y
    use_pdl, trigger, launch = _pdl(dev, pdl)
    if _smem_serves(dev, M, N, K, ks, w, norm=norm_weight is not None, silu=silu,
                    one_dtype=dtype == w.dtype and (x is None or x.dtype == w.dtype), proj=proj):
        from . import smem_gemv
        smem_gemv.launch((triton.cdiv(N, _BLOCK_N), split), w, x, partials, residual, res_out, norm_weight, y, N,
                         K, eps, block_n=_BLOCK_N, ks=ks, s_in=0 if partials is None or parts else partials.shape[0],
                         silu=silu, partials_out=partials_out, use_pdl=use_pdl, trigger=trigger,
                         launch_kwargs=launch, attn=parts)
        return (y, res_out) if residual is not None else y
    grid, meta = gemv_meta(M, N, K, split, s_in=0 if partials is None or parts else partials.shape[0],
                           residual=residual is not None, norm=norm_weight is not None, silu=silu,
                           partials_out=partials_out, dtype=dtype, use_pdl=use_pdl, trigger=trigger,
                           attn=(S, D, parts.block_n) if parts else (0, 0, 0), on_gpu=dev.type == "cuda")
    probe_ptr, probe_on = launch_args(label, grid_programs(grid), dev, w)
    _gemv_kernel[grid](
        w, x if x is not None else w, partials if partials is not None else w,
        residual if residual is not None else w, res_out, norm_weight if norm_weight is not None else w, y,
        parts.ml if parts else w, parts.context_lens if parts else w, probe_ptr,
        M, N, K, ks, w.stride(0), x.stride(0) if x is not None else K, N, float(eps), **meta, PROBE=probe_on,
        **launch)
    return (y, res_out) if residual is not None else y


@triton.jit
def _norm_rope(src, w_ptr, cos, sin, eps, rows, rmask, D: tl.constexpr, DT: tl.constexpr):
    """RMSNorm + neox RoPE of the heads at src + rows * D (two [len(rows), D/2] halves, float32 holding
    model-dtype values): engine/kernels/qk_norm_rope.py's arithmetic."""
    HALF: tl.constexpr = D // 2
    c = tl.arange(0, HALF)[None, :]
    mask = rmask[:, None] & (c < HALF)
    w1 = tl.load(w_ptr + c).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + c).to(tl.float32)
    x1 = tl.load(src + rows[:, None] * D + c, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + rows[:, None] * D + HALF + c, mask=mask, other=0.0).to(tl.float32)
    ms = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) * (1.0 / D)
    r = tl.math.rsqrt(ms + eps)[:, None]
    y1 = _rnd(_rnd(x1 * r, DT) * w1, DT)
    y2 = _rnd(_rnd(x2 * r, DT) * w2, DT)
    o1 = _rnd(y1 * cos, DT) - _rnd(y2 * sin, DT)
    o2 = _rnd(y2 * cos, DT) + _rnd(y1 * sin, DT)
    return _rnd(o1, DT), _rnd(o2, DT)


@triton.jit
def _new_kv(row, kw_ptr, cos, sin, eps, kvh, k_inv_scale, v_inv_scale, NQ: tl.constexpr, NK: tl.constexpr,
            HEAD_DIM: tl.constexpr, FP8: tl.constexpr, DT: tl.constexpr):
    """This token's k (normed, rotated) and v of KV head kvh from the qkv row, [1, HEAD_DIM] as stored (an FP8
    pool's e4m3 values: what every later step reads back)."""
    one = tl.arange(0, 1)
    k1, k2 = _norm_rope(row + NQ * HEAD_DIM, kw_ptr, cos, sin, eps, kvh + one, one < 1, HEAD_DIM, DT)
    k_new = tl.reshape(tl.permute(tl.join(k1, k2), (0, 2, 1)), (1, HEAD_DIM))
    v_new = tl.load(row + (NQ + NK + kvh) * HEAD_DIM + tl.arange(0, HEAD_DIM))[None, :].to(tl.float32)
    if FP8:  # (one return: Triton 3.6 compiles no return inside an if)
        k_new = _quantize(k_new, k_inv_scale)
        v_new = _quantize(v_new, v_inv_scale)
    else:
        k_new = k_new.to(DT)
        v_new = v_new.to(DT)
    return k_new, v_new


@triton.jit
def _store_kv(k_cache_ptr, v_cache_ptr, slot, kvh, k_new, v_new, stride_block, stride_head, stride_row,
              stride_v_row, stride_v_d, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, V_T: tl.constexpr):
    d = tl.arange(0, HEAD_DIM)
    dst = (slot // BLOCK_SIZE) * stride_block + kvh * stride_head
    tl.store(k_cache_ptr + dst + (slot % BLOCK_SIZE) * stride_row + d[None, :], k_new)
    if V_T:
        tl.store(v_cache_ptr + dst + (slot % BLOCK_SIZE) * stride_v_row + d[None, :] * stride_v_d, v_new)
    else:
        tl.store(v_cache_ptr + dst + (slot % BLOCK_SIZE) * stride_row + d[None, :], v_new)


@triton.jit
def _tile(k_cache_ptr, v_cache_ptr, table, head_base, n, end, stride_block, stride_row, stride_v_row, stride_v_d,
          BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_TILES: tl.constexpr,
          V_T: tl.constexpr):
    """The K and V rows [n, n + BLOCK_N) of one head, masked to positions < end (decode_attention's loads, also
    unmasked for page tiles of a keys-contiguous V)."""
    rows = tl.arange(0, BLOCK_N)
    d = tl.arange(0, HEAD_DIM)
    offs = n + rows
    nmask = offs < end
    if PAGE_TILES:
        # n < end in the loop; the first tile, loaded before the wait, may start past a row's end (a padding row,
        # a split past a short context), where the table holds -1 or nothing: read block 0 there, which the
        # unmasked keys-contiguous loads may touch (its values are never used: the caller skips that tile).
        block = tl.load(table + n // BLOCK_SIZE, mask=n < end, other=0).to(tl.int64)
        if V_T:  # (the H200's Triton 3.6 does not see this alignment: decode_attention.py)
            in_block = tl.multiple_of(n % BLOCK_SIZE, BLOCK_N) + rows
        else:
            in_block = n % BLOCK_SIZE + rows
    else:
        block = tl.load(table + offs // BLOCK_SIZE, mask=nmask, other=0).to(tl.int64)
        in_block = offs % BLOCK_SIZE
    tile_base = block * stride_block + head_base
    kv_off = (tile_base + in_block * stride_row)[:, None] + d[None, :]
    if V_T:
        v_off = (tile_base + in_block * stride_v_row)[:, None] + d[None, :] * stride_v_d
    else:  # (V's strides are K's)
        v_off = kv_off
    if PAGE_TILES and V_T:
        k = tl.load(k_cache_ptr + kv_off)
        v = tl.load(v_cache_ptr + v_off)
    else:
        k = tl.load(k_cache_ptr + kv_off, mask=nmask[:, None], other=0.0)
        v = tl.load(v_cache_ptr + v_off, mask=nmask[:, None], other=0.0)
    return k, v, nmask


@triton.jit
def _online(q, k, v, nmask, m_i, l_i, acc, scale_log2, DT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One tile of online softmax (decode_attention's loop body): returns the new (m, l, acc)."""
    s = tl.dot(q, tl.trans(k.to(DT)), input_precision=DOT_PRECISION) * scale_log2
    s = tl.where(nmask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a split with no old keys yet
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(DT), v.to(DT), input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["num_splits", "stride_bt"])
def _qkv_attention_kernel(
    qkv_ptr, stride_qkv, pos_ptr, cs_ptr, cs_stride, qw_ptr, kw_ptr, eps, slot_ptr,
    k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, out_ptr, acc_ptr, ml_ptr, probe_ptr,
    num_splits, stride_bt, stride_block, stride_head, stride_row, stride_v_row, stride_v_d, scale_log2, v_scale,
    k_inv_scale, v_inv_scale,
    NQ: tl.constexpr, NK: tl.constexpr, FP8: tl.constexpr, V_T: tl.constexpr, GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_TILES: tl.constexpr,
    PARTIALS: tl.constexpr, USE_PDL: tl.constexpr, TRIGGER: tl.constexpr, DOT_PRECISION: tl.constexpr,
    NEW_FIRST: tl.constexpr, PROBE: tl.constexpr,
):
    """decode_attention._decode_split_kernel with its inputs made here: q (this program's query heads) and this
    token's k normed and rotated from the qkv row. Keys and values of the older positions come from the pool;
    the newest token's, from registers, as stored (an FP8 pool's e4m3 values), by the program whose split
    holds it, which also writes them to the pool for later steps. Everything but the qkv row was written two
    or more kernels back (the step's inputs, the pool's older rows), so the first tile is loaded before the
    wait, under the previous kernel's tail. PROBE: timestamps into probe_ptr (probe.py)."""
    if USE_PDL:
        if TRIGGER == 2:
            tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    if PROBE:
        prog = (b * tl.num_programs(1) + kvh) * tl.num_programs(2) + split
        stamp(probe_ptr, prog, 0, 0.0)
        stamp_sm(probe_ptr, prog)
    HALF: tl.constexpr = HEAD_DIM // 2
    DT: tl.constexpr = qkv_ptr.dtype.element_ty
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    c = tl.arange(0, HALF)[None, :]
    gmask = g < GROUP
    heads = kvh * GROUP + g
    ctx = tl.load(context_lens_ptr + b)
    newest = ctx - 1
    tiles = tl.cdiv(ctx, BLOCK_N)
    tiles_per_split = tl.cdiv(tiles, num_splits)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, ctx)
    old_end = tl.minimum(end, newest)  # the older positions of this split: read from the pool
    pos = tl.load(pos_ptr + b).to(tl.int64)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    cos = _rnd(tl.load(cs_ptr + pos * cs_stride + c), DT)
    sin = _rnd(tl.load(cs_ptr + pos * cs_stride + HALF + c), DT)
    table = block_tables_ptr + b * stride_bt
    head_base = kvh * stride_head
    k0, v0, mask0 = _tile(k_cache_ptr, v_cache_ptr, table, head_base, start, old_end, stride_block, stride_row,
                          stride_v_row, stride_v_d, BLOCK_SIZE, BLOCK_N, HEAD_DIM, PAGE_TILES, V_T)
    if PROBE:
        stamp(probe_ptr, prog, 1, tl.sum(tl.sum(k0.to(tl.float32), axis=1), axis=0))
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        if TRIGGER == 1:
            tl.extra.cuda.gdc_launch_dependents()
    if PROBE:
        stamp(probe_ptr, prog, 2, 0.0)

    row = qkv_ptr + b.to(tl.int64) * stride_qkv
    q1, q2 = _norm_rope(row, qw_ptr, cos, sin, eps, heads, gmask, HEAD_DIM, DT)
    # An FP8 pool is read in float16 (decode_attention.py says why): q's model-dtype values are exact there.
    CD: tl.constexpr = tl.float16 if FP8 and DT != tl.float32 else DT
    q = tl.reshape(tl.permute(tl.join(q1, q2), (0, 2, 1)), (GROUP_PAD, HEAD_DIM)).to(CD)
    if PROBE:
        stamp(probe_ptr, prog, 3, tl.sum(tl.sum(q.to(tl.float32), axis=1), axis=0))
    holds_new = (start <= newest) & (newest < end)
    if NEW_FIRST:
        # this token's K/V made and stored before the older keys' tiles: its norm and RoPE overlap q's
        k_new, v_new = _new_kv(row, kw_ptr, cos, sin, eps, kvh, k_inv_scale, v_inv_scale, NQ, NK, HEAD_DIM, FP8, DT)
        if holds_new & (slot >= 0):
            _store_kv(k_cache_ptr, v_cache_ptr, slot, kvh, k_new, v_new, stride_block, stride_head, stride_row,
                      stride_v_row, stride_v_d, BLOCK_SIZE, HEAD_DIM, V_T)
        if PROBE:
            stamp(probe_ptr, prog, 4, tl.sum(tl.sum(k_new.to(tl.float32), axis=1), axis=0))
    if PROBE:
        stamp(probe_ptr, prog, 5, tl.sum(tl.sum(v0.to(tl.float32), axis=1), axis=0))
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    if start < old_end:
        m_i, l_i, acc = _online(q, k0, v0, mask0, m_i, l_i, acc, scale_log2, CD, DOT_PRECISION)
    for n in range(start + BLOCK_N, old_end, BLOCK_N):
        k, v, nmask = _tile(k_cache_ptr, v_cache_ptr, table, head_base, n, old_end, stride_block, stride_row,
                            stride_v_row, stride_v_d, BLOCK_SIZE, BLOCK_N, HEAD_DIM, PAGE_TILES, V_T)
        m_i, l_i, acc = _online(q, k, v, nmask, m_i, l_i, acc, scale_log2, CD, DOT_PRECISION)
    if PROBE:
        stamp(probe_ptr, prog, 6, tl.sum(l_i, axis=0))

    if holds_new:
        if not NEW_FIRST:
            k_new, v_new = _new_kv(row, kw_ptr, cos, sin, eps, kvh, k_inv_scale, v_inv_scale, NQ, NK, HEAD_DIM, FP8,
                                   DT)
            if slot >= 0:
                _store_kv(k_cache_ptr, v_cache_ptr, slot, kvh, k_new, v_new, stride_block, stride_head, stride_row,
                          stride_v_row, stride_v_d, BLOCK_SIZE, HEAD_DIM, V_T)
        kf = k_new.to(CD).to(tl.float32)
        vf = v_new.to(CD).to(tl.float32)
        s_new = tl.sum(q.to(tl.float32) * kf, axis=1) * scale_log2
        m_new = tl.maximum(m_i, s_new)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s_new - m_new)
        l_i = l_i * alpha + p
        acc = acc * alpha[:, None] + _rnd(p, CD)[:, None] * vf  # (the tiles' dot takes p in that dtype)
        m_i = m_new
    if FP8:
        acc = acc * v_scale
    if PROBE:
        stamp(probe_ptr, prog, 7, tl.sum(l_i, axis=0))
    if PARTIALS:
        base = (b * tl.num_programs(1) * GROUP + heads) * num_splits + split
        tl.store(acc_ptr + base[:, None] * HEAD_DIM + d[None, :], acc, mask=gmask[:, None])
        tl.store(ml_ptr + base * 2, m_i, mask=gmask)
        tl.store(ml_ptr + base * 2 + 1, l_i, mask=gmask)
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + b * (NQ * HEAD_DIM) + heads[:, None] * HEAD_DIM + d[None, :], out.to(DT),
                 mask=gmask[:, None])
    if PROBE:
        stamp(probe_ptr, prog, 8, 0.0)


def qkv_attention(qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, q_norm: torch.Tensor,
                  k_norm: torch.Tensor, eps: float, slots: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                  num_splits: int, num_heads: int, num_kv_heads: int, k_scale: float = 1.0, v_scale: float = 1.0,
                  block_n: int | None = None, merge: bool = True, label: str = "attention"
                  ) -> torch.Tensor | AttnParts:
    """qkv [B, (heads + 2 kv_heads) * head_dim] -> attention output [B, heads * head_dim]; writes each row's K/V
    at its slot (-1: none). Context lengths include the newest token (the one written here). A split context
    (num_splits > 1) without merge: its parts unmerged, for gemv to merge as it reads them."""
    batch = qkv.shape[0]
    head_dim = k_cache.shape[-1]
    block_size = k_cache.shape[2]
    group = num_heads // num_kv_heads
    block_n = block_n or (SPLIT_BLOCK_N if num_splits > 1 else ATTN_BLOCK_N)
    page_tiles = block_size % block_n == 0
    out = torch.empty(batch, num_heads * head_dim, dtype=qkv.dtype, device=qkv.device)
    partials = num_splits > 1
    if partials:
        acc = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=qkv.device)
        ml = torch.empty(batch, num_heads, num_splits, 2, dtype=torch.float32, device=qkv.device)
    else:
        acc = ml = out
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    use_pdl, trigger, launch = _pdl(qkv.device)
    probe_ptr, probe_on = launch_args(label, batch * num_kv_heads * num_splits, qkv.device, qkv)
    compiled = _qkv_attention_kernel[(batch, num_kv_heads, num_splits)](
        qkv, qkv.stride(0), positions, cos_sin, cos_sin.stride(0), q_norm, k_norm, float(eps), slots,
        k_cache, v_cache, block_tables, context_lens, out, acc, ml, probe_ptr, num_splits, block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(2), v_cache.stride(3),
        scale * 1.4426950408889634 * (k_scale if fp8 else 1.0), v_scale, 1.0 / k_scale, 1.0 / v_scale,
        NQ=num_heads, NK=num_kv_heads, FP8=fp8, V_T=v_transposed(v_cache), GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_N=block_n, PAGE_TILES=page_tiles, PARTIALS=partials,
        USE_PDL=use_pdl, TRIGGER=trigger, DOT_PRECISION=dot_precision(qkv.dtype), NEW_FIRST=NEW_KV == "first",
        PROBE=probe_on, num_warps=ATTN_WARPS, num_stages=2, enable_fp_fusion=False, **launch)
    if ATTN_SMEM_KIB and qkv.device.type == "cuda":
        reserve_shared(compiled, ATTN_SMEM_KIB * 1024)
    if partials and not merge:
        return AttnParts(acc, ml, context_lens, block_n)
    if partials:
        o3 = out.view(batch, num_heads, head_dim)
        merge_pdl = use_pdl and MERGE_PDL == "1"
        _decode_merge_kernel[(batch, num_heads)](
            acc, ml, o3, num_splits, o3.stride(0), o3.stride(1),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, SPLITS_PAD=triton.next_power_of_2(num_splits),
            USE_PDL=merge_pdl, EARLY=trigger >= 1 and merge_pdl, **(launch if merge_pdl else {}))
    return out


@triton.jit
def _partials_norm_kernel(part_ptr, res_ptr, w_ptr, out_ptr, M, K, eps, S_IN: tl.constexpr,
                          BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """The last layer's down_proj partials summed, plus the residual, then RMSNorm: the model's final norm."""
    m = tl.program_id(0)
    DT: tl.constexpr = out_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK)
    mask = cols < K
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    x = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(S_IN):
        x += tl.load(part_ptr + (s * M + m).to(tl.int64) * K + cols, mask=mask, other=0.0)
    x = _rnd(_rnd(x, DT) + tl.load(res_ptr + m * K + cols, mask=mask, other=0.0).to(tl.float32), DT)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / K + eps)
    tl.store(out_ptr + m * K + cols, (_rnd(x * rstd, DT) * w).to(DT), mask=mask)


def partials_norm(partials: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    S, M, K = partials.shape
    out = torch.empty(M, K, dtype=residual.dtype, device=residual.device)
    use_pdl, _, launch = _pdl(residual.device)
    _partials_norm_kernel[(M,)](partials, residual, weight, out, M, K, float(eps), S_IN=S,
                                BLOCK=triton.next_power_of_2(K), USE_PDL=use_pdl, num_warps=4,
                                enable_fp_fusion=False, **launch)
    return out
