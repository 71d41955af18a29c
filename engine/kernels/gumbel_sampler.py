"""Gumbel-max sampling in one pass over the logits: argmax(logits / T + Gumbel noise), greedy rows (T <= 0)
take argmax(logits). The softmax normaliser does not change an argmax, so this draws from softmax(logits / T)
exactly as the torch sampler's argmax(p / E) does, reading each logit once instead of ~6 full passes.

A row's vocabulary is split into chunks, each scanned by its own program, and a second kernel picks the
best chunk: at batch 1 a single program streaming 151,936 logits would run on one SM. Each element's
noise depends only on (its row's seed, index), so the draw is the same whatever the chunking, and a row's
draw does not depend on the other rows of the batch."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..device import num_sms
from ..env_knobs import int_knob

# Programs a row's chunks aim for, per SM (LABKIT_GUMBEL_PER_SM). A draw does not depend on it. On one H200
# (docs/perf.md, session 17) the hash noise at 256 rows took 71.6 us at 2, 63.4 at 8 and 61.6 at 16; 8 is what
# nano was measured with.
PROGRAMS_PER_SM = int_knob("LABKIT_GUMBEL_PER_SM", 8)
if PROGRAMS_PER_SM not in (1, 2, 4, 8, 16, 32):
    raise ValueError(f"LABKIT_GUMBEL_PER_SM: 1, 2, 4, 8, 16 or 32, got {PROGRAMS_PER_SM}")
# Where an element's uniform comes from (LABKIT_GUMBEL_NOISE). hash: two rounds of a 32-bit multiply-xorshift
# mixer over the index, keyed by the row's seed, and two hardware log2s: 41 instructions an element on sm_90.
# philox: tl.rand (one Philox4x32-10 call an element) and tl.log's polynomials: 118, the kernel before session 17.
# On one H200 the kernel at 256 rows moved 0.4 TB/s with philox, bound by its arithmetic; hash took it from 217 to
# 63 us and nano from 26,190 to 26,886 tok/s (+2.7%, two rounds each).
NOISES = ("hash", "philox")
NOISE = os.environ.get("LABKIT_GUMBEL_NOISE", "hash")
if NOISE not in NOISES:
    raise ValueError(f"LABKIT_GUMBEL_NOISE: hash or philox, got {NOISE!r}")


if os.environ.get("TRITON_INTERPRET") == "1":
    @triton.jit
    def _log2_approx(x):
        # Triton's interpreter (the CPU tests) has no libdevice: numpy's exact log2 there.
        return tl.math.log2(x)
else:
    @triton.jit
    def _log2_approx(x):
        # One MUFU.LG2 (~2^-22 relative error); tl.math.log2 compiles to a polynomial of ~13 FMAs.
        return libdevice.fast_log2f(x)


@triton.jit
def _mix32(x):
    # A 32-bit bijection with low bias (C. Wellons' "lowbias32" constants): every input bit moves every output
    # bit with probability near 1/2, so consecutive indices give unrelated words.
    x ^= x >> 16
    x *= 0x7FEB352D
    x ^= x >> 15
    x *= 0x846CA68B
    x ^= x >> 16
    return x


@triton.jit
def _gumbel_chunk_kernel(logits_ptr, stride_row, temps_ptr, seeds_ptr, best_ptr, idx_ptr, vocab, chunk, num_chunks,
                         BLOCK: tl.constexpr, HASH: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    t = tl.load(temps_ptr + row)
    seed = tl.load(seeds_ptr + row)
    greedy = t <= 0.0
    inv_t = tl.where(greedy, 1.0, 1.0 / tl.where(greedy, 1.0, t))
    # The row's two 32-bit keys (hash noise), so rows whose seeds differ in any bit hash every index differently.
    # k2 must not be a function of k1 alone: with k2 = mix(k1 ^ hi), index 0 of every seed under 2^32 cancelled
    # to the same word (the CPU test's distribution caught it).
    seed_lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = _mix32(seed_lo ^ 0x9E3779B9)
    k2 = _mix32(((seed >> 32) & 0xFFFFFFFF).to(tl.uint32) ^ _mix32(seed_lo ^ 0x85EBCA6B))
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK], 2147483647, tl.int32)
    lo = c * chunk
    hi = tl.minimum(lo + chunk, vocab)
    for start in range(lo, hi, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        mask = idx < hi
        x = tl.load(logits_ptr + row * stride_row + idx, mask=mask, other=float("-inf")).to(tl.float32)
        if HASH:
            bits = _mix32(_mix32(idx.to(tl.uint32) ^ k1) ^ k2)
            # v = (bits + 1/2) / 2^32: uniform on (0, 1), as fine as float32 allows near 0, where the winners'
            # exponential E = -ln(1 - v) lies (E ~ 1e-5 at 152k logits), and E from a series there: a log of
            # 1 - v would lose those digits (one near 1 is what rounds u to 1 in 24-bit uniforms).
            v = tl.minimum(bits.to(tl.float32) * 2.3283064e-10 + 1.1641532e-10, 0.99999994)
            # In base 2 (E / ln 2, and the noise -log2 E: the Gumbel score over ln 2 less a constant, so the same
            # argmax), each log one MUFU.LG2.
            e2 = tl.where(v < 0.0078125, v * (1.0 + v * (0.5 + v * 0.33333334)) * 1.4426950408889634,
                          -_log2_approx(1.0 - v))
            noise = -_log2_approx(e2)
            score = tl.where(greedy, x, x * (inv_t * 1.4426950408889634) + noise)
        else:
            u = tl.rand(seed, idx)
            u = tl.minimum(tl.maximum(u, 1e-20), 1.0 - 1e-7)
            gumbel = -tl.log(-tl.log(u))
            score = tl.where(greedy, x, x * inv_t + gumbel)
        score = tl.where(mask, score, float("-inf"))
        better = score > best  # a later element wins only when strictly larger: the first index wins ties
        best = tl.where(better, score, best)
        best_idx = tl.where(better, idx, best_idx)
    top = tl.max(best, axis=0)
    # The first index wins ties, as torch.argmax does (an all -inf chunk reports its first index).
    first = tl.min(tl.where(best == top, best_idx, 2147483647), axis=0)
    first = tl.where(first == 2147483647, lo, first)
    tl.store(best_ptr + row * num_chunks + c, top)
    tl.store(idx_ptr + row * num_chunks + c, first)


@triton.jit
def _pick_chunk_kernel(best_ptr, idx_ptr, out_ptr, num_chunks, BLOCK_C: tl.constexpr):
    # The chunk count is a runtime value: as a constexpr every batch size would compile its own kernel.
    row = tl.program_id(0)
    top = tl.full([BLOCK_C], float("-inf"), tl.float32)
    top_idx = tl.full([BLOCK_C], 2147483647, tl.int32)
    for c0 in range(0, num_chunks, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        mask = c < num_chunks
        best = tl.load(best_ptr + row * num_chunks + c, mask=mask, other=float("-inf"))
        idx = tl.load(idx_ptr + row * num_chunks + c, mask=mask, other=2147483647)
        # Chunks come in index order, so a later chunk only wins with a strictly larger score.
        better = (best > top) | ((best == top) & (idx < top_idx))
        top = tl.where(better, best, top)
        top_idx = tl.where(better, idx, top_idx)
    m = tl.max(top, axis=0)
    tl.store(out_ptr + row, tl.min(tl.where(top == m, top_idx, 2147483647), axis=0).to(tl.int64))


def num_chunks_for(rows: int, vocab: int, block: int, num_sms: int = 132, per_sm: int | None = None) -> int:
    """Enough programs to cover every SM per_sm times (default PROGRAMS_PER_SM), never a chunk smaller than one
    BLOCK."""
    per_sm = per_sm or PROGRAMS_PER_SM
    return max(1, min(-(-per_sm * num_sms // max(rows, 1)), -(-vocab // block)))


def gumbel_argmax(logits: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor, block: int = 1024,
                  num_chunks: int | None = None, num_warps: int = 4, noise: str | None = None) -> torch.Tensor:
    """logits [rows, vocab] (any float dtype), temperatures [rows] float32, seeds [rows] int64 (a row's
    noise); returns int64 token ids. block, num_chunks and num_warps change the speed, never the draw; noise
    (NOISES; default NOISE) is where the uniforms come from."""
    noise = noise or NOISE
    if noise not in NOISES:
        raise ValueError(f"noise: one of {NOISES}, got {noise!r}")
    rows, vocab = logits.shape
    assert logits.stride(-1) == 1
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if not rows:
        return out
    block = min(block, triton.next_power_of_2(vocab))
    if num_chunks is None:
        num_chunks = num_chunks_for(rows, vocab, block, num_sms(logits.device, 132))
    # Whole BLOCKs per chunk, so chunk boundaries never split a block of loads.
    chunk = triton.cdiv(triton.cdiv(vocab, num_chunks), block) * block
    num_chunks = triton.cdiv(vocab, chunk)
    best = torch.empty(rows, num_chunks, dtype=torch.float32, device=logits.device)
    idx = torch.empty(rows, num_chunks, dtype=torch.int32, device=logits.device)
    _gumbel_chunk_kernel[(rows, num_chunks)](logits, logits.stride(0), temperatures, seeds, best, idx, vocab, chunk,
                                             num_chunks, BLOCK=block, HASH=noise == "hash",
                                             num_warps=num_warps)
    _pick_chunk_kernel[(rows,)](best, idx, out, num_chunks, BLOCK_C=64)
    return out
