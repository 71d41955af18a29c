"""Host to device: the runner's one path for a step's inputs (model inputs, attention metadata, sampling
settings, the decode graphs' input buffer).

Each call packs its host lists into one reusable host buffer, pinned on CUDA so the copy is asynchronous
(it neither waits for the forward pass still running nor makes the host wait), and moves them with a
single copy. The host buffer may be refilled only once the previous copy out of it has finished; an event
recorded after each copy guards that (tensor-parallel workers never otherwise wait for their device).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from .profiling import phase

_ALIGN = 8  # bytes: every part starts where a view of any dtype may start
_NUMPY = {torch.int32: np.int32, torch.int64: np.int64, torch.float32: np.float32}


class Staging:
    def __init__(self, device: torch.device):
        self.device = device
        self._cuda = device.type == "cuda"
        self._host: torch.Tensor | None = None      # uint8; pinned on CUDA
        self._host_np: np.ndarray | None = None     # the same memory, for filling from Python lists
        self._dev: torch.Tensor | None = None       # uint8; what upload() returns views of
        self._copied = None                         # CUDA event: the last copy has left the host buffer

    def reserve(self, nbytes: int) -> None:
        """Make the host buffer at least `nbytes` now (so a hot loop never allocates pinned memory)."""
        self._wait_copied()
        if self._host is None or self._host.numel() < nbytes:
            size = max(nbytes, 4096, 2 * (0 if self._host is None else self._host.numel()))
            self._host = torch.empty(size, dtype=torch.uint8, pin_memory=self._cuda)
            self._host_np = self._host.numpy()

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

    def release(self) -> None:
        """Drop both buffers (after warm-up, so the KV pool is sized as if they had never been allocated)."""
        self._wait_copied()
        self._host = self._host_np = self._dev = None

    def _copy(self, dst: torch.Tensor, capacity: int, fill: Callable[[np.ndarray], int]) -> None:
        self.reserve(capacity)
        n = fill(self._host_np)
        dst[:n].copy_(self._host[:n], non_blocking=True)
        if self._cuda:
            if self._copied is None:
                self._copied = torch.cuda.Event()
            self._copied.record()

    def _wait_copied(self) -> None:
        if self._copied is not None:
            self._copied.synchronize()  # never overwrite host memory a pending copy still reads
