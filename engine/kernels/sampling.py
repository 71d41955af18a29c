"""Gumbel-max sampling in one pass over the logits: argmax(logits / T + Gumbel noise), greedy rows (T <= 0)
take argmax(logits). The softmax normaliser does not change an argmax, so this draws from softmax(logits / T)
exactly as the torch sampler's argmax(p / E) does, reading each logit once instead of ~6 full passes."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gumbel_argmax_kernel(logits_ptr, stride_row, temps_ptr, out_ptr, seed, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    t = tl.load(temps_ptr + row)
    greedy = t <= 0.0
    inv_t = tl.where(greedy, 1.0, 1.0 / tl.where(greedy, 1.0, t))
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK], tl.int32)
    for start in range(0, vocab, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        mask = idx < vocab
        x = tl.load(logits_ptr + row * stride_row + idx, mask=mask, other=float("-inf")).to(tl.float32)
        u = tl.rand(seed, row * vocab + idx)
        u = tl.minimum(tl.maximum(u, 1e-20), 1.0 - 1e-7)
        gumbel = -tl.log(-tl.log(u))
        score = tl.where(greedy, x, x * inv_t + gumbel)
        score = tl.where(mask, score, float("-inf"))
        better = score > best
        best = tl.where(better, score, best)
        best_idx = tl.where(better, idx, best_idx)
    # The first index wins ties, as torch.argmax does.
    top = tl.max(best, axis=0)
    cand = tl.where(best == top, best_idx, vocab)
    tl.store(out_ptr + row, tl.min(cand, axis=0))


def gumbel_argmax(logits: torch.Tensor, temperatures: torch.Tensor, seed: int, block: int = 4096) -> torch.Tensor:
    """logits [rows, vocab] (any float dtype), temperatures [rows] float32; returns int64 token ids."""
    rows, vocab = logits.shape
    assert logits.stride(-1) == 1
    out = torch.empty(rows, dtype=torch.int32, device=logits.device)
    if rows:
        _gumbel_argmax_kernel[(rows,)](logits, logits.stride(0), temperatures, out, seed, vocab,
                                       BLOCK=min(block, triton.next_power_of_2(vocab)))
    return out.long()
