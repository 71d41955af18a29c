"""Vocab-parallel embedding and LM head: each rank holds a contiguous slice of the vocabulary."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..context import get_context
from ..distributed import all_reduce, gather_to_rank0, tp_rank, tp_size


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.tp_rank = tp_rank()
        self.tp_size = tp_size()
        if num_embeddings % self.tp_size:
            raise ValueError(f"tensor_parallel_size: vocab_size ({num_embeddings}) is not divisible by {self.tp_size}")
        self.num_embeddings = num_embeddings
        self.shard_size = num_embeddings // self.tp_size
        self.vocab_start = self.shard_size * self.tp_rank
        self.vocab_end = self.vocab_start + self.shard_size
        self.weight = nn.Parameter(torch.empty(self.shard_size, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor):
        param.data.copy_(loaded.narrow(0, self.vocab_start, self.shard_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(x, self.weight)
        mask = (x >= self.vocab_start) & (x < self.vocab_end)
        y = F.embedding(mask * (x - self.vocab_start), self.weight)
        return all_reduce(mask.unsqueeze(1) * y)


class ParallelLMHead(VocabParallelEmbedding):
    def forward(self, x: torch.Tensor) -> torch.Tensor | None:
        indices = get_context().logits_indices
        if indices is not None:
            # Only the rows that sample predict a token: each one's last position.
            x = x[indices].contiguous()
        logits = F.linear(x, self.weight)
        return gather_to_rank0(logits, dim=-1)
