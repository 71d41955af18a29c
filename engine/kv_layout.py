"""The paged KV pool's memory layout, in one place.

The runner's pool is [2 (K, V), layers, blocks, kv_heads, block_size, head_dim]; a layer's k_cache and v_cache
are [blocks, kv_heads, block_size, head_dim] views of it. Head-major inside a block: the block_size rows of one KV
head are one contiguous run (256 x 128 bf16 = 64 KiB), so a decode program serving one (sequence, KV head) streams
whole runs. (Token-major blocks, [block_size, kv_heads, head_dim], made that program read head_dim-sized pieces a
token row apart: 256 bytes every 2 KiB for Qwen3-0.6B.)

Slots are unchanged: slot = block * block_size + offset names one token position of the pool. Kernels take the
cache strides as arguments, so a token-major view (token_major) is read correctly too; that view is what
flash-attn's paged API and slot-indexed reads in PyTorch want, and it costs no copy.

V transposed (every FP8 pool unless LABKIT_FP8_V_TRANSPOSED=0): the V half of the pool holds each (block, KV head) as
[head_dim, block_size], the keys contiguous, and a layer's v_cache is a strided view of it with the usual logical
shape [blocks, kv_heads, block_size, head_dim] (strides: the row 1, the head dimension block_size). Why: p.V takes
V as its second operand with the keys as the reduction; stored keys-contiguous, an 8-bit V is read like K (ldmatrix,
a few registers), where head_dim-contiguous it is read from shared memory a byte at a time, which took the e4m3
decode kernel to ~200 registers a thread, two programs an SM (docs/perf.md, session 18). Every reader and writer
takes V's strides from its view, and torch indexing through the view puts each value in its place.
"""
from __future__ import annotations

import os

# Read once at import, like the kernels' knobs (labkit/output.py records it with them). On by default since session
# 19: nano FP8 went from 28.4k/29.5k to 34.8k/35.0k tok/s on the H200 (docs/perf.md); 0 gives the old layout.
_V_KNOB = os.environ.get("LABKIT_FP8_V_TRANSPOSED", "1")
if _V_KNOB not in ("0", "1"):
    raise ValueError(f"LABKIT_FP8_V_TRANSPOSED: 0 or 1, got {_V_KNOB!r}")
FP8_V_TRANSPOSED = _V_KNOB == "1"


def pool_shape(layers: int, blocks: int, block_size: int, kv_heads: int, head_dim: int) -> tuple[int, ...]:
    return (2, layers, blocks, kv_heads, block_size, head_dim)


def _keys_contiguous(v):
    """V's memory (any leading dims, then [block_size, head_dim] as allocated) seen as the keys-contiguous view:
    the same logical shape, each [head_dim, block_size] run transposed."""
    return v.view(*v.shape[:-2], v.shape[-1], v.shape[-2]).transpose(-1, -2)


def layer_caches(pool, layer: int, v_transposed: bool = False):
    """A layer's (k_cache, v_cache), each logically [blocks, kv_heads, block_size, head_dim]; with v_transposed, V is
    the keys-contiguous view described above."""
    v = pool[1, layer]
    return pool[0, layer], _keys_contiguous(v) if v_transposed else v


def v_transposed(v_cache) -> bool:
    """Whether a V cache view (logically [..., block_size, head_dim]) has its keys contiguous."""
    return v_cache.stride(-2) == 1 and v_cache.shape[-2] > 1 and v_cache.stride(-1) != 1


def token_major(cache):
    """A layer cache [blocks, kv_heads, block_size, head_dim] (or a whole pool, any leading dims) as a
    [..., blocks, block_size, kv_heads, head_dim] view: indexing it with (block, offset) gives a token's rows."""
    return cache.transpose(-3, -2)


def read_slots(pool, slots, v_transposed: bool = False):
    """The K and V rows of every layer at the given slots: [2, layers, len(slots), kv_heads, head_dim]."""
    import torch

    block_size = pool.shape[-2]
    blocks, offsets = slots // block_size, slots % block_size
    v = _keys_contiguous(pool[1]) if v_transposed else pool[1]
    return torch.stack([token_major(pool[0])[:, blocks, offsets], token_major(v)[:, blocks, offsets]])
