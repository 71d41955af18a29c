"""engine/staging.py, the runner's one host-to-device path, on the CPU: parts of several dtypes and shapes go
in one copy and come back as the right tensors, a later upload reuses the buffers, a larger one grows them."""
from __future__ import annotations

import torch

from engine.staging import Staging


def test_mixed_parts_come_back_with_their_dtype_shape_and_values():
    staging = Staging(torch.device("cpu"))
    got = staging.upload(ids=([5, 7, 2**40], torch.int64), cu=([0, 3], torch.int32), skipped=(None, torch.int32),
                         empty=([], torch.int32), tables=([[4, 2, -1], [8, -1, -1]], torch.int32),
                         temps=([0.0, 0.5, 1.25], torch.float32))
    assert set(got) == {"ids", "cu", "empty", "tables", "temps"}
    assert got["ids"].dtype == torch.int64 and got["ids"].tolist() == [5, 7, 2**40]
    assert got["cu"].dtype == torch.int32 and got["cu"].tolist() == [0, 3]
    assert got["empty"].shape == (0,)
    assert got["tables"].shape == (2, 3) and got["tables"].tolist() == [[4, 2, -1], [8, -1, -1]]
    assert got["temps"].dtype == torch.float32 and got["temps"].tolist() == [0.0, 0.5, 1.25]


def test_later_uploads_reuse_the_buffer_and_a_larger_one_grows_it():
    staging = Staging(torch.device("cpu"))
    first = staging.upload(a=([1, 2, 3], torch.int32))["a"]
    second = staging.upload(a=([9], torch.int32), b=([4, 5], torch.int64))
    assert second["a"].data_ptr() == first.data_ptr()  # same device buffer: no allocation per step
    assert second["a"].tolist() == [9] and second["b"].tolist() == [4, 5]
    big = list(range(5000))
    grown = staging.upload(a=(big, torch.int64), b=([[1, 2]] * 700, torch.int32))
    assert grown["a"].tolist() == big and grown["b"].shape == (700, 2) and grown["b"][-1].tolist() == [1, 2]


def test_every_part_starts_16_byte_aligned():
    """Triton builds a separate kernel variant for a pointer that is not 16-byte aligned: parts whose offset
    changed with the batch (8 mod 16) made the prefill kernel compile again on a bench's first timed repeat."""
    staging = Staging(torch.device("cpu"))
    for n in (1, 2, 3, 5):
        got = staging.upload(ids=(list(range(n)), torch.int64), cu=(list(range(n + 1)), torch.int32),
                             slots=(list(range(n)), torch.int32), tables=([[1] * n] * n, torch.int32),
                             temps=([0.5] * n, torch.float32))
        assert all(t.data_ptr() % 16 == 0 for t in got.values()), {k: t.data_ptr() % 16 for k, t in got.items()}


def test_fetch_returns_the_values():
    staging = Staging(torch.device("cpu"))
    assert staging.fetch(torch.tensor([3, 1, 2**40])).tolist() == [3, 1, 2**40]
