"""The fused decode GEMV at one row with its weight tile in shared memory (Gluon, cp.async), for the launches
LABKIT_DECODE_SMEM_GEMV names (default: all but o_proj, measured on the device; docs/perf.md, session 38): the
same launches, grids and arithmetic as decode_layer.gemv's one-row programs.

Why: decode_layer's one-row programs hold their whole weight tile in registers while they wait for the previous
kernel (PDL), up to 255 registers a thread (gate/up: two programs fill an SM), so a kernel's programs cannot start
on an SM before its predecessor's leave, and each kernel's weight stream starts at a boundary (docs/perf.md,
sessions 28-32). Here each program issues its tile as 16-byte cp.async copies into shared memory (LDGSTS: no
register holds a weight in flight), one commit group a 256-column chunk, all before its PDL wait; then it makes
its input and sums chunk by chunk as the groups land. scripts/smem_chain.py measures the same design on the four
GEMVs alone.

Inputs as gemv's: x [1, K] in the model dtype, or float32 partials [S, 1, K] summed in split order and rounded,
plus the residual (rounded sum, written once as the new residual stream), RMSNorm (whole rows: one split), SiLU
(gate rows then up rows, N rows apart). Output: model-dtype y [1, N], or float32 partials [split, 1, N]. Not
served here (decode_layer's kernels take them): two or more rows, the probe. Attention's split parts as the input
(o_proj at one row) are merged as decode_layer's o_proj merges them, the context length read before the wait.
The float32 sums run in another order than the Triton program's (each thread's 8 columns a chunk, chunk after
chunk, then across the lanes): a last-bit matter, as between any two GEMV tilings.

Triton's interpreter does not run Gluon: on a CPU tests/test_smem_gemv.py compiles the kernel for sm_90 (reading
its SASS) and runs its source in tests/gluon_emulator.py against the launch's arithmetic; on the device
scripts/gemv_bench.py checks it under the knob against a float32 reference.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

# Triton 3.6 (the device's) names the copy async_copy_global_to_shared; later versions async_load
_copy = getattr(cp, "async_load", None) or cp.async_copy_global_to_shared

CHUNK = 256  # columns a chunk: a warp's 32 lanes x 8 16-bit values (16-byte copies); one commit group, one wait
_CW = gl.constexpr(CHUNK)


@gluon.jit
def _gdc_wait():
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _gdc_launch_dependents():
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _as_chunks_36(buf, KC: gl.constexpr, L: gl.constexpr):
    return buf._reinterpret(gl.float32, [KC, _CW], L)


@gluon.jit
def _as_chunks_39(buf, KC: gl.constexpr, L: gl.constexpr):
    return buf.reinterpret(gl.float32, [KC, _CW], L)


# A float32 [KC, 256] buffer stored whole (a rank-2 layout) seen as KC chunks (rank 1, same bytes: no swizzle), for
# .index(c); Triton 3.6 (the device's) names it _reinterpret, later versions reinterpret
_as_chunks = _as_chunks_39 if hasattr(gl.shared_memory_descriptor, "reinterpret") else _as_chunks_36


@gluon.jit
def _rnd(x, DT: gl.constexpr):
    return x.to(DT).to(gl.float32)


@gluon.jit
def _merged_chunk(acc_ptr, ml_ptr, ctx, cols, S: gl.constexpr, D: gl.constexpr, BN: gl.constexpr,
                  DT: gl.constexpr):
    """Attention's output at `cols` merged from its S split parts, acc [1, H, S, D] and (max, sum) pairs
    ml [1, H, S, 2]: decode_layer._merged_rows' arithmetic for one row (a part read only where its split holds
    keys, known from the context length ctx; the parts weighed and summed in split order)."""
    span = gl.cdiv(gl.cdiv(ctx, BN), S) * BN  # keys a split covers
    first = (cols // D) * S                   # the column's head's first part
    col = cols % D
    none = cols * 0
    m_max = none.to(gl.float32) - float("inf")
    for s in gl.static_range(S):
        m_max = gl.maximum(m_max, gl.load(ml_ptr + (first + s) * 2, mask=none + s * span < ctx, other=float("-inf")))
    num = none.to(gl.float32)
    den = none.to(gl.float32)
    for s in gl.static_range(S):
        live = none + s * span < ctx
        m = gl.load(ml_ptr + (first + s) * 2, mask=live, other=float("-inf"))
        w = gl.where(m > float("-inf"), gl.exp2(m - m_max), 0.0)
        num += gl.load(acc_ptr + (first + s) * D + col, mask=live, other=0.0) * w
        den += gl.load(ml_ptr + (first + s) * 2 + 1, mask=live, other=0.0) * w
    return _rnd(num / gl.where(den > 0, den, 1.0), DT)  # (the merge kernel stores the model dtype)


@gluon.jit
def _input_chunk(x_ptr, part_ptr, res_ptr, ml_ptr, ctx, cols, K, S_IN: gl.constexpr, RESIDUAL: gl.constexpr,
                 ATTN_S: gl.constexpr, ATTN_D: gl.constexpr, ATTN_BN: gl.constexpr, DT: gl.constexpr):
    """The input at `cols` as decode_layer._x_rows makes it for one row: x, or S_IN partials summed in order and
    rounded, or attention's ATTN_S split parts merged (part_ptr: their acc), plus the residual (rounded)."""
    if ATTN_S > 0:
        x = _merged_chunk(part_ptr, ml_ptr, ctx, cols, ATTN_S, ATTN_D, ATTN_BN, DT)
    elif S_IN == 0:
        x = gl.load(x_ptr + cols).to(gl.float32)
    else:
        x = gl.load(part_ptr + cols)  # (0 + the first partial: the reduce kernel's first sum, exactly)
        for s in gl.static_range(1, S_IN):
            x += gl.load(part_ptr + s * K + cols)
        x = _rnd(x, DT)
    if RESIDUAL:
        x = _rnd(x + gl.load(res_ptr + cols).to(gl.float32), DT)
    return x


@gluon.jit
def _smem_gemv_kernel(w_ptr, x_ptr, part_ptr, res_ptr, res_out_ptr, nw_ptr, y_ptr, ml_ptr, ctx_ptr, eps,
                      N: gl.constexpr, K: gl.constexpr, R: gl.constexpr, KC: gl.constexpr, S_IN: gl.constexpr,
                      RESIDUAL: gl.constexpr, NORM: gl.constexpr, SILU: gl.constexpr, PARTIALS: gl.constexpr,
                      ATTN_S: gl.constexpr, ATTN_D: gl.constexpr, ATTN_BN: gl.constexpr, USE_PDL: gl.constexpr,
                      TRIGGER: gl.constexpr, num_warps: gl.constexpr):
    """Program (pid_n, pid_k): rows [pid_n R, +R) of W over columns [pid_k KC 256, +KC 256); the up rows (SILU)
    N rows after the gate rows. N and K are compile-time: every row's start is then known 16-byte aligned, which
    the 16-byte copies need. TRIGGER as decode_layer's (0: let the successor launch at the end, 1: after the
    wait, 2: at the start)."""
    BL: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])  # 16 bytes a thread a row
    XL: gl.constexpr = gl.SliceLayout(0, BL)  # a chunk of the input: every warp holds it whole
    SH: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])  # a warp reads 512 contiguous bytes: no conflicts
    SH1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])  # chunks of a row (norm weights, the input)
    DT: gl.constexpr = w_ptr.dtype.element_ty
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    if USE_PDL:
        if TRIGGER == 2:
            _gdc_launch_dependents()
    k0 = pid_k * (KC * _CW)
    rows = gl.arange(0, R, layout=gl.SliceLayout(1, BL))
    cols = gl.arange(0, _CW, layout=XL)
    out_rows = pid_n * R + rows
    offs = out_rows.to(gl.int64)[:, None] * K + (k0 + cols)[None, :]
    # Nothing copied here depends on the previous kernel: these copies stream under its tail with PDL.
    wbuf = gl.allocate_shared_memory(DT, [KC, R, _CW], SH)
    if SILU:
        ubuf = gl.allocate_shared_memory(DT, [KC, R, _CW], SH)
    if NORM:
        # the norm weights first, a group of their own: landed whenever any chunk's group has (groups land in order)
        nbuf = gl.allocate_shared_memory(nw_ptr.dtype.element_ty, [KC, _CW], SH1)
        for c in gl.static_range(KC):
            _copy(nbuf.index(c), nw_ptr + k0 + c * _CW + cols)
        cp.commit_group()
    for c in gl.static_range(KC):
        _copy(wbuf.index(c), w_ptr + offs + c * _CW, cache_modifier=".cg")
        if SILU:
            _copy(ubuf.index(c), w_ptr + N * K + offs + c * _CW, cache_modifier=".cg")
        cp.commit_group()
    ctx = 0
    if ATTN_S > 0:
        ctx = gl.load(ctx_ptr)  # (the row's context length: the step's input, written before the chain began)
    if USE_PDL:
        _gdc_wait()
        if TRIGGER == 1:
            _gdc_launch_dependents()
    if NORM:
        # The whole row (one split: k0 is 0) made at once, a warp a chunk, kept in shared memory, and its
        # statistics. Made chunk by chunk (every warp the whole chunk), the new residual's store sat between the
        # chunks and the compiler kept each chunk's loads behind it: KC round trips to the L2, ~2 us of q/k/v's
        # 5.7 (docs/perf.md, session 38).
        chunk = gl.arange(0, KC, layout=gl.SliceLayout(1, BL))
        at = chunk[:, None] * _CW + cols[None, :]
        xr = _input_chunk(x_ptr, part_ptr, res_ptr, ml_ptr, ctx, at, K, S_IN, RESIDUAL, ATTN_S, ATTN_D, ATTN_BN, DT)
        if RESIDUAL:
            if (pid_n == 0) & (pid_k == 0):  # the new residual stream, written once
                gl.store(res_out_ptr + at, xr.to(DT))
        rstd = gl.rsqrt(gl.sum(gl.sum(xr * xr, axis=1), axis=0) / K + eps)
        xbuf = _as_chunks(gl.allocate_shared_memory(gl.float32, [KC, _CW], SH, xr), KC, SH1)
    acc = gl.zeros([R, _CW], gl.float32, BL)
    if SILU:
        acc_u = gl.zeros([R, _CW], gl.float32, BL)
    for c in gl.static_range(KC):
        if NORM:
            xc = xbuf.index(c).load(XL)
        else:
            xc = _input_chunk(x_ptr, part_ptr, res_ptr, ml_ptr, ctx, k0 + c * _CW + cols, K, S_IN, RESIDUAL, ATTN_S,
                              ATTN_D, ATTN_BN, DT)
        cp.wait_group(KC - 1 - c)  # chunk c's group is the oldest still counted: landed at KC - 1 - c left
        if NORM:
            xc = _rnd(_rnd(xc * rstd, DT) * nbuf.index(c).load(XL).to(gl.float32), DT)
        acc += wbuf.index(c).load(BL).to(gl.float32) * xc[None, :]
        if SILU:
            acc_u += ubuf.index(c).load(BL).to(gl.float32) * xc[None, :]
    y = gl.sum(acc, axis=1)
    if USE_PDL:
        if TRIGGER == 0:
            _gdc_launch_dependents()
    if SILU:
        g = _rnd(y, DT)
        u = _rnd(gl.sum(acc_u, axis=1), DT)
        s = _rnd(g / (1.0 + gl.exp(-g)), DT)  # F.silu's result is a model-dtype tensor
        gl.store(y_ptr + out_rows, (s * u).to(DT))
    elif PARTIALS:
        gl.store(y_ptr + pid_k * N + out_rows, y)
    else:
        gl.store(y_ptr + out_rows, y.to(DT))


def launch(grid: tuple[int, int], w, x, partials, residual, res_out, norm_weight, y, N: int, K: int, eps: float,
           *, block_n: int, ks: int, s_in: int, silu: bool, partials_out: bool, use_pdl: bool, trigger: int,
           launch_kwargs: dict, attn=None) -> None:
    """One launch on decode_layer.gemv's grid (tiles of block_n rows, K ranges of ks columns). attn: attention's
    split parts (decode_layer.AttnParts) as the input, merged as they are read (partials: their acc)."""
    _smem_gemv_kernel[grid](
        w, x if x is not None else w, partials if partials is not None else w,
        residual if residual is not None else w, res_out, norm_weight if norm_weight is not None else w, y,
        attn.ml if attn is not None else w, attn.context_lens if attn is not None else w,
        float(eps), **meta(N, K, block_n, ks, s_in=s_in, residual=residual is not None,
                           norm=norm_weight is not None, silu=silu, partials_out=partials_out, use_pdl=use_pdl,
                           trigger=trigger, attn=(attn.acc.shape[2], attn.acc.shape[3], attn.block_n)
                           if attn is not None else (0, 0, 0)),
        enable_fp_fusion=False, **launch_kwargs)


def meta(N: int, K: int, block_n: int, ks: int, *, s_in: int, residual: bool, norm: bool, silu: bool,
         partials_out: bool, use_pdl: bool, trigger: int, attn: tuple = (0, 0, 0)) -> dict:
    """The kernel's compile-time arguments (what launch passes and the tests compile); attn: (splits, head_dim,
    keys a tile) of attention's parts as the input, 0s for none."""
    return dict(N=N, K=K, R=block_n, KC=ks // CHUNK, S_IN=s_in, RESIDUAL=residual, NORM=norm, SILU=silu,
                PARTIALS=partials_out, ATTN_S=attn[0], ATTN_D=attn[1], ATTN_BN=attn[2], USE_PDL=use_pdl,
                TRIGGER=trigger, num_warps=4)


MAX_TILE_BYTES = 128 * 1024  # a program's weights in shared memory (an H100's or H200's SM has 228 KiB)


def serves(M: int, N: int, K: int, ks: int, block_n: int, elem_bytes: int, *, dense: bool, norm: bool, silu: bool,
           probe: bool) -> bool:
    """Does this launch fit the kernel: one row, 16-bit weights (a lane's 8 columns: one 16-byte copy), whole tiles
    of rows, whole 256-column chunks, a tile of at most MAX_TILE_BYTES, rows K apart (dense), the norm over one
    split of a power-of-two count of chunks (the row is made whole at once, a tensor [chunks, 256]), no probe?"""
    tile = block_n * ks * elem_bytes * (2 if silu else 1)
    chunks = ks // CHUNK
    return (M == 1 and elem_bytes == 2 and N % block_n == 0 and ks % CHUNK == 0 and K % ks == 0
            and tile <= MAX_TILE_BYTES and dense and (not norm or (ks == K and chunks & (chunks - 1) == 0))
            and not probe)
