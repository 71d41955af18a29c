"""tests/gluon_emulator.py: a Gluon kernel's source run on the CPU, and the misuses it must report (a chunk read
while its copy group may be in flight, anything the previous kernel writes read before the PDL wait, a store
before it)."""
from __future__ import annotations

import pytest
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

from engine.kernels.smem_gemv import _copy, _gdc_wait

from .gluon_emulator import EmulationError, emulate


@gluon.jit
def _doubled(src_ptr, dst_ptr, WAIT_AT: gl.constexpr, PDL_AT: gl.constexpr, N: gl.constexpr):
    """dst[program's N] = 2 * src, src copied through shared memory in two chunks of N/2 (two groups)."""
    L: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    S: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    H: gl.constexpr = N // 2
    base = gl.program_id(0) * N
    cols = gl.arange(0, H, layout=L)
    buf = gl.allocate_shared_memory(src_ptr.dtype.element_ty, [2, H], S)
    if PDL_AT == 0:
        _gdc_wait()
    for c in gl.static_range(2):
        _copy(buf.index(c), src_ptr + base + c * H + cols)
        cp.commit_group()
    if PDL_AT == 1:
        _gdc_wait()
    for c in gl.static_range(2):
        cp.wait_group(WAIT_AT - c)
        gl.store(dst_ptr + base + c * H + cols, buf.index(c).load(L) * 2)


@pytest.mark.parametrize("wait_at, pdl_at, dependent, error", [
    (1, 0, ("src_ptr",), None),            # chunk c read with 1-c groups left in flight: its own landed
    (1, 1, (), None),                      # (src written before the chain: copied before the wait)
    (2, 0, ("src_ptr",), "shared chunk 0 read while its copy group 0 may be in flight"),
    (1, 1, ("src_ptr",), "a cp.async copy of src_ptr before the PDL wait"),
    (1, 2, (), "a store to dst_ptr before the PDL wait"),
])
def test_the_emulator_runs_a_kernel_and_reports_its_misuses(wait_at, pdl_at, dependent, error):
    src = torch.arange(64, dtype=torch.float32)
    dst = torch.zeros(64)
    k = emulate(_doubled, dependent=dependent)
    if error is None:
        k[(2,)](src, dst, WAIT_AT=wait_at, PDL_AT=pdl_at, N=32, launch_pdl=True)
        assert torch.equal(dst, 2 * src)
        assert [p.events for p in k.programs] == [["wait"], ["wait"]]
    else:
        with pytest.raises(EmulationError, match=error):
            k[(2,)](src, dst, WAIT_AT=wait_at, PDL_AT=pdl_at, N=32, launch_pdl=True)


def test_without_pdl_nothing_waits():
    src = torch.arange(64, dtype=torch.float32)
    dst = torch.zeros(64)
    emulate(_doubled, dependent=("src_ptr",))[(2,)](src, dst, WAIT_AT=1, PDL_AT=2, N=32)
    assert torch.equal(dst, 2 * src)
