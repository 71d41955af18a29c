"""The paged KV pool's memory layout, in one place.

The runner's pool is [2 (K, V), layers, blocks, kv_heads, block_size, head_dim]; a layer's k_cache and v_cache
are [blocks, kv_heads, block_size, head_dim] views of it. Head-major inside a block: the block_size rows of one KV
head are one contiguous run (256 x 128 bf16 = 64 KiB), so a decode program serving one (sequence, KV head) streams
whole runs. (Token-major blocks, [block_size, kv_heads, head_dim], made that program read head_dim-sized pieces a
token row apart: 256 bytes every 2 KiB for Qwen3-0.6B.)

Slots are unchanged: slot = block * block_size + offset names one token position of the pool. Kernels take the
cache strides as arguments, so a token-major view (token_major) is read correctly too; that view is what
flash-attn's paged API and slot-indexed reads in PyTorch want, and it costs no copy.
"""
from __future__ import annotations


def pool_shape(layers: int, blocks: int, block_size: int, kv_heads: int, head_dim: int) -> tuple[int, ...]:
    return (2, layers, blocks, kv_heads, block_size, head_dim)


def token_major(cache):
    """A layer cache [blocks, kv_heads, block_size, head_dim] (or a whole pool, any leading dims) as a
    [..., blocks, block_size, kv_heads, head_dim] view: indexing it with (block, offset) gives a token's rows."""
    return cache.transpose(-3, -2)


def read_slots(pool, slots):
    """The K and V rows of every layer at the given slots: [2, layers, len(slots), kv_heads, head_dim]."""
    block_size = pool.shape[-2]
    return token_major(pool)[:, :, slots // block_size, slots % block_size]
