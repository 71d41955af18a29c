"""Weights asked of the L2 ahead of their use by a kernel of its own, on a side stream of the decode graph.

At batch 1 the memory is idle through most of a layer: attention reads ~1 MB of KV in ~6 us, and each GEMV's
programs wait on their predecessor's end before their own loads finish (docs/perf.md, sessions 23-27). A small
kernel forked off the layer's chain after its q/k/v projection asks the L2 for the weights the layer's later
kernels (and the next layer's q/k/v) will read, with Hopper's bulk prefetch (`cp.async.bulk.prefetch.L2`: no
registers, no result, nothing waits for it), so those kernels read the L2 instead of DRAM. Session 25 issued the
same prefetch from inside the attention kernel, which then stayed open until its prefetch had gone out (+9-15%);
here the chain never waits for it: only the step's end joins the side stream. Numbers cannot change: a prefetch
writes nothing.

LABKIT_DECODE_L2_SIDE: which weights, "" (off, the default) or a "+"-joined subset of o (o_proj), gu (gate/up),
down, qkv (the next layer's q/k/v projection), asked for in the order the chain reads them.
LABKIT_DECODE_L2_SIDE_PROGRAMS: the side kernel's programs (each of 4 warps, one bulk prefetch a thread)."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

SIDE_WEIGHTS = ("o", "gu", "down", "qkv")
_side = os.environ.get("LABKIT_DECODE_L2_SIDE", "")
if _side and (len(set(_side.split("+"))) != len(_side.split("+")) or not set(_side.split("+")) <= set(SIDE_WEIGHTS)):
    raise ValueError(f"LABKIT_DECODE_L2_SIDE: empty or a +-joined subset of o, gu, down, qkv, got {_side!r}")
SIDE = tuple(name for name in SIDE_WEIGHTS if _side and name in _side.split("+"))
# Where the side stream forks: after the layer's q/k/v launch ("qkv": the prefetch streams beside attention) or
# after attention's ("attention": beside o_proj, whose weights PDL has already loaded under attention).
SIDE_AT = os.environ.get("LABKIT_DECODE_L2_SIDE_AT", "qkv")
if SIDE_AT not in ("qkv", "attention"):
    raise ValueError(f"LABKIT_DECODE_L2_SIDE_AT: qkv or attention, got {SIDE_AT!r}")
SIDE_PROGRAMS = int(os.environ.get("LABKIT_DECODE_L2_SIDE_PROGRAMS", "32"))
if SIDE_PROGRAMS not in (8, 16, 32, 64, 132):
    raise ValueError(f"LABKIT_DECODE_L2_SIDE_PROGRAMS: 8, 16, 32, 64 or 132, got {SIDE_PROGRAMS}")
MAX_BUFFERS = 4
_THREADS = 128


def side_weights(layers, i: int, names: tuple[str, ...]) -> list[torch.Tensor]:
    """The weights layer i's side kernel asks for, in the order the chain reads them: this layer's o_proj,
    gate/up and down, then the next layer's q/k/v projection (none after the last layer)."""
    layer = layers[i]
    own = {"o": layer.self_attn.o_proj.weight, "gu": layer.mlp.gate_up_proj.weight, "down": layer.mlp.down_proj.weight}
    ahead = [own[n] for n in ("o", "gu", "down") if n in names]
    if "qkv" in names and i + 1 < len(layers):
        ahead.append(layers[i + 1].self_attn.qkv_proj.weight)
    return ahead


@triton.jit
def _ranges(nbytes, part, parts, NT: tl.constexpr):
    """This program's share (part of parts) of nbytes as NT (offset, size) ranges, one a thread: offsets 16-byte
    aligned and sizes multiples of 16, as the bulk prefetch requires (nbytes is one), a zero size where a thread
    has nothing left. The programs' ranges tile [0, nbytes) without overlap."""
    share = tl.cdiv(tl.cdiv(nbytes, parts), 16) * 16
    lo = part.to(tl.int64) * share
    hi = tl.minimum(lo + share, nbytes)
    chunk = tl.cdiv(tl.cdiv(share, NT), 16) * 16
    offs = lo + tl.arange(0, NT).to(tl.int64) * chunk
    size = tl.minimum(tl.maximum(hi - offs, 0), chunk).to(tl.int32)
    return offs, size


@triton.jit
def _ask(ptr, nbytes, part, parts, NT: tl.constexpr):
    offs, size = _ranges(nbytes, part, parts, NT)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [ptr.to(tl.pointer_type(tl.int8)) + offs, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _l2_prefetch_kernel(p0, n0, p1, n1, p2, n2, p3, n3, NT: tl.constexpr):
    part = tl.program_id(0)
    parts = tl.num_programs(0)
    _ask(p0, n0, part, parts, NT)
    _ask(p1, n1, part, parts, NT)
    _ask(p2, n2, part, parts, NT)
    _ask(p3, n3, part, parts, NT)


def prefetch_args(tensors: list[torch.Tensor]) -> list:
    """The kernel's (pointer, bytes) pairs: each tensor's whole storage, then unused slots of 0 bytes."""
    if not tensors or len(tensors) > MAX_BUFFERS or not all(t.is_contiguous() for t in tensors):
        raise ValueError(f"l2_prefetch: 1 to {MAX_BUFFERS} contiguous tensors, got {len(tensors)}")
    if any(t.numel() * t.element_size() % 16 or t.data_ptr() % 16 for t in tensors):
        raise ValueError("l2_prefetch: each tensor 16-byte aligned and a multiple of 16 bytes (the bulk prefetch's)")
    pairs = [(t, t.numel() * t.element_size()) for t in tensors]
    pairs += [(tensors[0], 0)] * (MAX_BUFFERS - len(tensors))
    return [x for pair in pairs for x in pair]


def ask_l2(tensors: list[torch.Tensor], programs: int | None = None) -> None:
    """Launch the prefetch of tensors (CUDA only: a CPU has no L2 to fill, the interpreter no bulk prefetch) on
    the current stream."""
    args = prefetch_args(tensors)
    if tensors[0].device.type != "cuda":
        return
    _l2_prefetch_kernel[(programs or SIDE_PROGRAMS,)](*args, NT=_THREADS, num_warps=_THREADS // 32)


class SideStream:
    """The decode step's fork and join: ask(layers, i) forks the side stream off the chain's current point and
    launches layer i's prefetch there; join() makes the chain wait for the side stream (before a CUDA graph's
    capture ends, which requires every forked stream joined). Off CUDA, or with nothing to ask for, nothing."""

    def __init__(self, device: torch.device, names: tuple[str, ...] = SIDE):
        self.names = names
        self.stream = torch.cuda.Stream(device) if names and device.type == "cuda" else None
        self.forked = False

    def ask(self, layers, i: int) -> None:
        ahead = side_weights(layers, i, self.names) if self.names else []
        if self.stream is None or not ahead:
            return
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            ask_l2(ahead)
        self.forked = True

    def join(self) -> None:
        if self.forked:
            torch.cuda.current_stream().wait_stream(self.stream)
            self.forked = False
