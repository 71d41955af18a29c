"""Host to device: the runner's one path for a step's inputs (model inputs, attention metadata, sampling
settings, the decode graphs' input buffer).

Each call packs its host lists into one of a few reusable host buffers, pinned on CUDA so the copy is
asynchronous (it neither waits for the forward pass still running nor makes the host wait), and moves them
with a single copy. A host buffer may be refilled only once the copy out of it has finished; an event
recorded after each copy guards that (tensor-parallel workers never otherwise wait for their device).
The way back is `fetch`: a step's sampled ids, copied without a wait until the host needs them.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from .profiling import phase

# Bytes: every part starts where a view of any dtype may start, and 16-byte aligned because Triton compiles a
# separate variant of a kernel for pointers that are not: parts at 8 mod 16 built new kernels on first use.
_ALIGN = 16
_NUMPY = {torch.int32: np.int32, torch.int64: np.int64, torch.float32: np.float32}


# Host buffers in rotation: an upload may fill one while the copies out of the others are still queued
# behind the step in flight (with async scheduling the next step is staged while this one runs).
_RING = 3


class Staging:
    def __init__(self, device: torch.device):
        self.device = device
        self._cuda = device.type == "cuda"
        self._ring: list[_HostBuffer] = [_HostBuffer(self._cuda) for _ in range(_RING)]
        self._next = 0
        self._dev: torch.Tensor | None = None       # uint8; what upload() returns views of
        self._fetch = [_HostBuffer(self._cuda) for _ in range(2)]  # the sampled ids of this step and the next
        self._next_fetch = 0

    def reserve(self, nbytes: int) -> None:
        """Make every host buffer at least `nbytes` now (so a hot loop never allocates pinned memory)."""
        for buf in self._ring:
            buf.reserve(nbytes)

    @phase("engine::upload")
    def upload(self, **parts) -> dict[str, torch.Tensor]:
        """Named parts, each (values, dtype) with values a flat list, a list of equal-length rows (2-D) or
        None (left out), in one copy. Returns a device tensor per part: views of a buffer the next upload
        overwrites, which is safe for kernels already queued (the copy is ordered after them on the stream)."""
        layout, size = [], 0
        for name, (values, dtype) in parts.items():
            if values is None:
                continue
            shape = (len(values), len(values[0])) if values and isinstance(values[0], list) else (len(values),)
            nbytes = math.prod(shape) * dtype.itemsize
            layout.append((name, values, dtype, shape, size, nbytes))
            size += -(-nbytes // _ALIGN) * _ALIGN
        if self._dev is None or self._dev.numel() < size:
            self._dev = torch.empty(max(size, 4096, 2 * (0 if self._dev is None else self._dev.numel())),
                                    dtype=torch.uint8, device=self.device)

        def fill(host: np.ndarray) -> int:
            for _, values, dtype, shape, at, nbytes in layout:
                host[at:at + nbytes].view(_NUMPY[dtype]).reshape(shape)[...] = values
            return size

        self._copy(self._dev, size, fill)
        return {name: self._dev[at:at + nbytes].view(dtype).view(shape)
                for name, _, dtype, shape, at, nbytes in layout}

    @phase("engine::upload")
    def upload_into(self, dst: torch.Tensor, fill: Callable[[np.ndarray], int]) -> None:
        """`fill(view)` writes into a host view with dst's dtype and length and returns how many leading
        elements are needed; those are copied into `dst` (a fixed buffer, such as the decode graphs' inputs)."""
        itemsize = dst.element_size()
        flat = dst.view(-1).view(torch.uint8)
        self._copy(flat, flat.numel(),
                   lambda host: fill(host[:flat.numel()].view(_NUMPY[dst.dtype])) * itemsize)

    def fetch(self, values: torch.Tensor) -> "Fetch":
        """Start copying a small int64 device tensor (a step's sampled ids) to the host without waiting;
        `.tolist()` on the result waits for that copy alone. Two results may be outstanding at a time."""
        if not self._cuda:
            return Fetch(values.tolist())
        buf = self._fetch[self._next_fetch]
        self._next_fetch = (self._next_fetch + 1) % len(self._fetch)
        n = values.numel() * values.element_size()
        buf.wait()
        buf.reserve(n)
        buf.host[:n].copy_(values.view(-1).view(torch.uint8), non_blocking=True)
        buf.record()
        return Fetch(None, buf, values.numel())

    def release(self) -> None:
        """Drop the buffers (after warm-up, so the KV pool is sized as if they had never been allocated)."""
        for buf in self._ring + self._fetch:
            buf.drop()
        self._dev = None

    def _copy(self, dst: torch.Tensor, capacity: int, fill: Callable[[np.ndarray], int]) -> None:
        buf = self._ring[self._next]
        self._next = (self._next + 1) % len(self._ring)
        buf.wait()  # never overwrite host memory a pending copy still reads
        buf.reserve(capacity)
        n = fill(buf.np)
        dst[:n].copy_(buf.host[:n], non_blocking=True)
        buf.record()


class _HostBuffer:
    """One host buffer (pinned on CUDA) and an event marking when the last copy through it finished."""

    def __init__(self, pinned: bool):
        self.pinned = pinned
        self.host: torch.Tensor | None = None   # uint8
        self.np: np.ndarray | None = None       # the same memory, for filling from Python lists
        self.event = None

    def reserve(self, nbytes: int) -> None:
        if self.host is None or self.host.numel() < nbytes:
            self.wait()
            size = max(nbytes, 4096, 2 * (0 if self.host is None else self.host.numel()))
            self.host = torch.empty(size, dtype=torch.uint8, pin_memory=self.pinned)
            self.np = self.host.numpy()

    def record(self) -> None:
        if self.pinned:
            if self.event is None:
                self.event = torch.cuda.Event()
            self.event.record()

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()

    def drop(self) -> None:
        self.wait()
        self.host = self.np = None


class Fetch:
    """A step's sampled ids on their way to the host (Staging.fetch)."""

    __slots__ = ("_values", "_buf", "_n")

    def __init__(self, values: list | None, buf: _HostBuffer | None = None, n: int = 0):
        self._values, self._buf, self._n = values, buf, n

    def tolist(self) -> list[int]:
        if self._values is None:
            self._buf.wait()
            self._values = self._buf.np[:self._n * 8].view(np.int64).tolist()
        return self._values
