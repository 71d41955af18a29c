"""Timestamps taken inside the fused decode step's programs (LABKIT_DECODE_PROBE=1; CUDA only; off by default).

A profile gives each kernel's interval; at batch 1 what a layer costs is inside them: a kernel ends 3-6 us after
its predecessor although its weights were loaded under it (docs/perf.md, sessions 26-28). With the probe on, each
program of the fused GEMV and attention kernels writes, at points of its own run, the GPU's global nanosecond
timer (`%globaltimer`, comparable across SMs) and its SM's id into a slot of a device buffer:

    start     its first instruction (when the program became resident)
    loaded    its weight tile usable (the GEMV at one row; attention: its first tile's K)
    released  past the PDL wait (the previous kernel done and its writes visible)
    input     its input made (the summed partials, residual and norm; attention: q normed and rotated)
    new_kv    attention: this token's K/V made and stored (the program whose split holds it)
    v_loaded  attention: its first tile's V usable
    tiles     attention: the older keys' tiles done (online softmax, both dot products)
    summed    its sums done (the GEMV's products; attention: the newest token merged in)
    end       its stores issued

A stamp waits for the values it follows (an input operand of the timer's asm), so "loaded" means the data have
arrived, not that the loads were issued. That dependency costs a reduction over the tile, which the probe alone
pays (its numbers are not the engine's timing), and as "loaded" comes before the PDL wait, a probed program waits
only once its weights are in: its "released" is never before its "loaded". Each launch of a step gets its own
region of the buffer, named by `label`; a CUDA graph replays into the regions its capture was given, so after a
replay the regions hold that step's timeline. scripts/layer_probe.py drives a batch-1 decode with it and prints
where a layer's time goes.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

ENABLED = os.environ.get("LABKIT_DECODE_PROBE", "0")
if ENABLED not in ("0", "1"):
    raise ValueError(f"LABKIT_DECODE_PROBE: 0 or 1, got {ENABLED!r}")
POINTS = ("start", "loaded", "released", "input", "new_kv", "v_loaded", "tiles", "summed", "end")
SLOTS = 16           # a program's int64 slots: the points in this order, then spares; its SM in the last
SM_SLOT = 15
_CAPACITY = 1 << 23  # int64 slots in the buffer (64 MiB): ~18 fused forward passes of Qwen3-0.6B at one row


@triton.jit
def stamp(probe_ptr, program, point: tl.constexpr, dep):
    """Write the global timer into this program's slot `point`, once dep (a float32 scalar) is computed."""
    t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,f", [dep], dtype=tl.int64, is_pure=False,
                                  pack=1)
    tl.store(probe_ptr + program * 16 + point, t)  # (16: SLOTS)


@triton.jit
def stamp_sm(probe_ptr, program):
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,f", [0.0], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(probe_ptr + program * 16 + 15, sm.to(tl.int64))  # (SM_SLOT)


@dataclass
class Region:
    label: str       # which kernel of which layer ("L3 gate_up")
    pass_id: int     # the forward pass that launched it
    offset: int      # its first slot in the buffer
    programs: int


class Probe:
    """The buffer and the regions handed out: a new pass at each fused forward (begin_pass), a region a launch."""

    def __init__(self):
        self.buffer: torch.Tensor | None = None
        self.regions: list[Region] = []
        self.pass_id = -1
        self.used = 0

    def begin_pass(self) -> None:
        self.pass_id += 1

    def region(self, label: str, programs: int, device: torch.device) -> torch.Tensor:
        """A zeroed slice of the buffer for one launch of `programs` programs."""
        if self.buffer is None:
            self.buffer = torch.zeros(_CAPACITY, dtype=torch.int64, device=device)
        n = programs * SLOTS
        if self.used + n > _CAPACITY:
            raise RuntimeError("LABKIT_DECODE_PROBE: the probe's buffer is full (probe fewer forward passes)")
        self.regions.append(Region(label, self.pass_id, self.used, programs))
        view = self.buffer[self.used:self.used + n]
        self.used += n
        return view

    def read(self, pass_id: int) -> list[tuple[Region, list[list[int]]]]:
        """Each region of a pass with its programs' slots, [programs][SLOTS], as the device holds them now."""
        host = self.buffer.cpu() if self.buffer is not None else torch.zeros(0, dtype=torch.int64)
        return [(r, host[r.offset:r.offset + r.programs * SLOTS].view(r.programs, SLOTS).tolist())
                for r in self.regions if r.pass_id == pass_id]


PROBE = Probe()


def launch_args(label: str, programs: int, device: torch.device, fallback: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(probe pointer, PROBE constexpr) for a launch: a region of the buffer with the probe on (CUDA only: the
    interpreter runs no inline asm), else fallback (never written) and 0."""
    if ENABLED != "1" or device.type != "cuda":
        return fallback, 0
    return PROBE.region(label, programs, device), 1


def grid_programs(grid: tuple) -> int:
    n = 1
    for g in grid:
        n *= int(g)
    return n


def summarize(regions: list[tuple[Region, list[list[int]]]]) -> list[dict]:
    """Per launch of a pass, in launch order: each point's earliest, median and latest time over its programs, in
    microseconds from the pass's earliest start, the SMs its programs ran on, and "phases": the median over its
    programs of each one's own time from a point to the next. A point a kernel does not stamp repeats the one
    before it (a phase of 0)."""
    starts = [s[0] for _, slots in regions for s in slots if s[0] > 0]
    if not starts:
        raise ValueError("the probe holds no timestamps for this pass (was the step run on CUDA with the probe on?)")
    t0 = min(starts)
    rows = []
    for region, slots in regions:
        live = [s for s in slots if s[0] > 0]
        row = {"label": region.label, "programs": region.programs, "ran": len(live),
               "sms": len({s[SM_SLOT] for s in live})}
        filled = []
        for s in live:  # (a point the program did not stamp: the one before it)
            f = [s[0]]
            for v in s[1:len(POINTS)]:
                f.append(v if v > 0 else f[-1])
            filled.append(f)
        for i, point in enumerate(POINTS):
            times = sorted((f[i] - t0) / 1000.0 for f in filled)
            row[point] = (times[0], times[len(times) // 2], times[-1]) if times else None
        # each phase (one point to the next) as its programs took it: the median of their own durations
        row["phases"] = {f"{a}>{b}": statistics.median((f[i + 1] - f[i]) / 1000.0 for f in filled) if filled else None
                         for i, (a, b) in enumerate(zip(POINTS, POINTS[1:]))}
        rows.append(row)
    return rows

