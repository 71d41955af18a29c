"""Out-of-bounds memory access in a Triton kernel, seen on the CPU.

On the GPU a kernel that reads before or past its tensors faults (an illegal address), or silently reads another
allocation; Triton's interpreter reads host memory and usually does neither, so a kernel test can pass over a
load no GPU survives. `bounds_checked()` makes the interpreter strict: every active lane of every load and store
must fall inside the storage of one of the tensors the launch was given (its whole storage: a view may reach the
rest of its pool)."""
from __future__ import annotations

import contextlib

import numpy as np


class OutOfBounds(AssertionError):
    pass


@contextlib.contextmanager
def bounds_checked():
    """Within this block, a Triton launch (interpreted) whose load or store touches an address outside every
    tensor argument's storage raises OutOfBounds naming the kernel, the access and the nearest storage."""
    from triton.runtime import interpreter as interp

    ranges: list[tuple[int, int]] = []
    kernel: list[str] = []
    init, load, store = (interp.GridExecutor._init_args_hst, interp.InterpreterBuilder.create_masked_load,
                         interp.InterpreterBuilder.create_masked_store)

    def _init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init(self, args_dev, kwargs)
        ranges.clear()
        for arg in [*args_hst, *kwargs_hst.values()]:
            if hasattr(arg, "untyped_storage"):
                storage = arg.untyped_storage()
                ranges.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
        kernel[:] = [getattr(self.fn, "__name__", str(self.fn))]
        return args_hst, kwargs_hst

    def check(what, ptrs, mask):
        addresses = np.asarray(ptrs.data, dtype=np.uint64)[np.broadcast_to(np.asarray(mask.data, bool),
                                                                          np.shape(ptrs.data))]
        if addresses.size == 0:
            return
        size = np.dtype(interp._get_np_dtype(ptrs.get_element_ty())).itemsize
        inside = np.zeros(addresses.shape, bool)
        for lo, hi in ranges:
            inside |= (addresses >= lo) & (addresses + size <= hi)
        if not inside.all():
            bad = int(addresses[~inside][0])
            near = min(ranges, key=lambda r: min(abs(bad - r[0]), abs(bad - r[1])))
            raise OutOfBounds(f"{kernel[0] if kernel else 'a kernel'}: {what} of {int((~inside).sum())} lane(s) "
                              f"outside its tensors, e.g. {bad - near[0]:+d} bytes from a storage of "
                              f"{near[1] - near[0]} bytes")

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        check("load", ptrs, mask)
        return load(self, ptrs, mask, other, cache_policy, is_volatile)

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        check("store", ptrs, mask)
        return store(self, ptrs, value, mask, cache_policy)

    interp.GridExecutor._init_args_hst = _init_args_hst
    interp.InterpreterBuilder.create_masked_load = create_masked_load
    interp.InterpreterBuilder.create_masked_store = create_masked_store
    try:
        yield
    finally:
        interp.GridExecutor._init_args_hst = init
        interp.InterpreterBuilder.create_masked_load = load
        interp.InterpreterBuilder.create_masked_store = store
