"""Linear layers that know their tensor-parallel shard. Each parameter carries a `weight_loader` that
copies its rank's slice out of a full checkpoint tensor."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import all_reduce, tp_rank, tp_size
from ..kernel_choice import SMALL_GEMM_MAX_ROWS


def _divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"tensor_parallel_size: {what} ({numerator}) is not divisible by {denominator}")
    return numerator // denominator


class LinearBase(nn.Module):
    """`kernels`: the engine's KernelChoice (custom_kernels: our GEMV for decode-sized batches)."""

    def __init__(self, input_size: int, output_size: int, bias: bool, tp_dim: int | None, kernels):
        super().__init__()
        self.tp_dim = tp_dim
        self.tp_rank = tp_rank()
        self.tp_size = tp_size()
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)
        # Decode-sized batches in CUDA graphs: our split-K GEMV keeps every SM reading the weight where
        # cuBLAS's tiles leave most idle (docs/perf.md); chosen at construction, like the fused elementwise kernels.
        self._small_gemm = kernels.custom_kernels

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        # Only inside CUDA graphs: launched eagerly from Python, two Triton launches cost more host time
        # than cuBLAS's one, and an eager step is host-bound at these sizes anyway.
        if self._small_gemm and x.shape[0] <= SMALL_GEMM_MAX_ROWS and x.dim() == 2 \
                and torch.cuda.is_current_stream_capturing():
            from ..kernels.small_gemm import small_matmul

            return small_matmul(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor):
        raise NotImplementedError


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; no communication."""

    def __init__(self, input_size: int, output_size: int, kernels, bias: bool = False):
        super().__init__(input_size, _divide(output_size, tp_size(), "output size"), bias, 0, kernels)

    def weight_loader(self, param, loaded):
        shard = param.data.size(self.tp_dim)
        param.data.copy_(loaded.narrow(self.tp_dim, self.tp_rank * shard, shard))

    def forward(self, x):
        return self.matmul(x)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections stored as one (gate_up)."""

    def __init__(self, input_size: int, output_sizes: list[int], kernels, bias: bool = False):
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), kernels, bias)

    def weight_loader(self, param, loaded, shard_id: int):
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        target = param.data.narrow(self.tp_dim, offset, size)
        target.copy_(loaded.chunk(self.tp_size, self.tp_dim)[self.tp_rank])


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections as one matrix; each rank holds its heads of each."""

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: int, kernels,
                 bias: bool = False):
        size = tp_size()
        self.head_size = head_size
        self.num_heads = _divide(total_num_heads, size, "num_attention_heads")
        self.num_kv_heads = _divide(total_num_kv_heads, size, "num_key_value_heads")
        output_size = (total_num_heads + 2 * total_num_kv_heads) * head_size
        super().__init__(hidden_size, output_size, kernels, bias)

    def weight_loader(self, param, loaded, shard_id: str):
        q = self.num_heads * self.head_size
        kv = self.num_kv_heads * self.head_size
        offset, size = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[shard_id]
        target = param.data.narrow(self.tp_dim, offset, size)
        target.copy_(loaded.chunk(self.tp_size, self.tp_dim)[self.tp_rank])


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial results are summed with an all-reduce."""

    def __init__(self, input_size: int, output_size: int, kernels, bias: bool = False):
        super().__init__(_divide(input_size, tp_size(), "input size"), output_size, bias, 1, kernels)

    def weight_loader(self, param, loaded):
        if param.data.dim() == 1:  # bias: added once, on rank 0's partial sum
            param.data.copy_(loaded if self.tp_rank == 0 else torch.zeros_like(loaded))
            return
        shard = param.data.size(self.tp_dim)
        param.data.copy_(loaded.narrow(self.tp_dim, self.tp_rank * shard, shard))

    def forward(self, x):
        return all_reduce(self.matmul(x))
