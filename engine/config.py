"""Engine configuration: nano-vLLM's fields and defaults, plus labkit's additions."""
from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import Any

from .policies import POLICIES, SchedulingPolicy, policy_class

# The shipped scheduling policies (engine/policies.py's registry; Config checks the registry itself, so a policy
# registered later is accepted too).
SCHEDULING_POLICIES = tuple(POLICIES)
ATTENTION_BACKENDS = ("auto", "flash_attn", "triton", "torch")
DEVICES = ("auto", "cuda", "cpu")
DTYPES = ("auto", "float32", "bfloat16", "float16")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # engine/kv_quant.py
# The largest tensor_parallel_size accepted: the GPUs of one host (labkit's --tp takes its limit from here).
MAX_TENSOR_PARALLEL_SIZE = 8
# Each tensor parallel worker answers rank 0 in a reply slot of this size at the end of the shared memory.
TP_REPLY_SLOT_BYTES = 4096


@dataclass
class Config:
    model: str
    # None: the policy's default_token_budget (nano-vLLM's 16384; mixed: MIXED_TOKEN_BUDGET, engine/policies.py).
    max_num_batched_tokens: int | None = None
    max_num_seqs: int = 512
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    kvcache_block_size: int = 256
    num_kvcache_blocks: int = -1
    # labkit additions
    device: str = "auto"
    attention_backend: str = "auto"
    scheduling_policy: str = "prefill_first"
    dtype: str = "auto"
    # The KV pool's element type (vLLM's name): "auto" = the model dtype; "fp8" (or "fp8_e4m3") = E4M3 with fp32
    # scales, quantised by the KV-write kernel and read inside the attention kernels (engine/kv_quant.py): half
    # the bytes a token, twice the blocks.
    kv_cache_dtype: str = "auto"
    # Our Triton split-K GEMV on CUDA for what cuBLAS does slowly at decode sizes (matmuls of <= 16 rows, inside
    # decode graphs; False: cuBLAS).
    # The rest of the kernel choices follow from the device and enforce_eager (engine/kernel_choice.py).
    custom_kernels: bool = True
    # With custom_kernels, decode graphs of <= 16 rows run each decoder layer as five fused kernels chained with
    # programmatic dependent launch (engine/fused_decode.py) instead of twelve; False: the separate kernels
    # (the "before" of the batch1-kernels lab). One rank only.
    fused_decode: bool = True
    # Async scheduling: schedule and launch the next step before this step's sampled ids reach the host (its
    # inputs read them on the device), so the device never waits for the host's commit and scheduling. Every
    # state is a synchronous engine's, except that an EOS learnt late costs that row one wasted token.
    async_scheduling: bool = True
    # KV pool budget when the pool is not sized from free GPU memory (CPU, or set explicitly).
    kvcache_memory_bytes: int = -1
    seed: int = 0
    # Instance isolation: None picks a free loopback port (bound when the workers start; the engine's
    # config then holds it) / a unique shared-memory name, so two engines on one host never share a
    # rendezvous address or a control channel.
    dist_init_addr: str | None = None
    shm_name: str | None = None
    # Tensor parallel control channel (rank 0 -> workers) and the collective timeout: a worker that stops
    # answering turns into an error after this long instead of a hang.
    shm_size: int = 1 << 20
    dist_timeout_s: float = 60.0
    tracer: Any = None
    hf_config: Any = field(default=None, repr=False)
    eos: int = -1

    def __post_init__(self):
        if not isinstance(self.model, (str, os.PathLike)) or not os.path.isdir(self.model):
            raise ValueError(f"model: {self.model!r} is not a model folder")
        self.model = os.fspath(self.model)
        _choice("scheduling_policy", self.scheduling_policy, tuple(POLICIES))
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = self.policy.default_token_budget
        _positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        _positive_int("max_num_seqs", self.max_num_seqs)
        _positive_int("max_model_len", self.max_model_len)
        _positive_int("kvcache_block_size", self.kvcache_block_size)
        _positive_int("tensor_parallel_size", self.tensor_parallel_size)
        if not 1 <= self.tensor_parallel_size <= MAX_TENSOR_PARALLEL_SIZE:
            raise ValueError(f"tensor_parallel_size: must be between 1 and {MAX_TENSOR_PARALLEL_SIZE}, "
                             f"got {self.tensor_parallel_size}")
        if not isinstance(self.num_kvcache_blocks, int) or (
                self.num_kvcache_blocks < 1 and self.num_kvcache_blocks != -1):
            raise ValueError("num_kvcache_blocks: must be -1 (size automatically) or >= 1, "
                             f"got {self.num_kvcache_blocks!r}")
        if isinstance(self.kvcache_memory_bytes, bool) or not isinstance(self.kvcache_memory_bytes, int) or (
                self.kvcache_memory_bytes < 1 and self.kvcache_memory_bytes != -1):
            raise ValueError(f"kvcache_memory_bytes: must be -1 (not set) or >= 1, got {self.kvcache_memory_bytes!r}")
        if not 0.0 < float(self.gpu_memory_utilization) <= 1.0:
            raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")
        _choice("device", self.device, DEVICES)
        _choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _choice("dtype", self.dtype, DTYPES)
        _choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        if self.kv_cache_dtype != "auto" and self.attention_backend == "flash_attn":
            # (engine/kernel_choice.py refuses it too, once the backend is resolved; here a file's settings are
            # refused as they are read, naming their key)
            raise ValueError(f"kv_cache_dtype: {self.kv_cache_dtype} needs attention_backend triton or torch "
                             "(flash_attn's kernels read the pool in the model dtype)")
        if self.hf_config is None:
            from .model_config import load_model_config

            try:
                self.hf_config = load_model_config(self.model)
            except ValueError as e:  # a broken config.json is the user's input, not our bug
                raise ValueError(f"model: {e}") from None
        model_type = getattr(self.hf_config, "model_type", None)
        if model_type != "qwen3":
            raise ValueError(f"model: model_type {model_type!r} is not supported (only qwen3)")
        self._check_tensor_parallel()
        self.max_model_len = min(self.max_model_len, self.hf_config.max_position_embeddings)

    @property
    def policy(self) -> type[SchedulingPolicy]:
        """The scheduling policy's class: what the runner must prepare for it (mixes_phases), its default budget."""
        return policy_class(self.scheduling_policy)

    def _check_tensor_parallel(self) -> None:
        tp = self.tensor_parallel_size
        hf = self.hf_config
        for name in ("num_attention_heads", "num_key_value_heads", "vocab_size", "intermediate_size"):
            value = getattr(hf, name, None)
            if isinstance(value, int) and value % tp:
                raise ValueError(f"tensor_parallel_size: {name} ({value}) is not divisible by {tp}")
        _positive_int("shm_size", self.shm_size)
        # Each worker has a reply slot at the end of the channel; calls get the rest.
        least = TP_REPLY_SLOT_BYTES * tp
        if self.shm_size < least:
            raise ValueError(f"shm_size: must be at least {least} bytes for tensor_parallel_size={tp}, "
                             f"got {self.shm_size}")
        if isinstance(self.dist_timeout_s, bool) or not isinstance(self.dist_timeout_s, (int, float)) \
                or not self.dist_timeout_s > 0:
            raise ValueError(f"dist_timeout_s: must be a number of seconds > 0, got {self.dist_timeout_s!r}")
        if self.dist_init_addr is not None:
            split_host_port(self.dist_init_addr)  # None: the engine binds a free loopback port when it starts
        if self.shm_name is None:
            self.shm_name = f"labkit-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        if not isinstance(self.shm_name, str) or not self.shm_name or "/" in self.shm_name:
            raise ValueError(f"shm_name: expected a name without '/', got {self.shm_name!r}")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0 and let the kernel choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def split_host_port(addr) -> tuple[str, int]:
    """("host", port) from "HOST:PORT" or "[IPv6]:PORT"; port 0 means any free port."""
    bad = ValueError(f"dist_init_addr: expected HOST:PORT or [IPv6]:PORT, got {addr!r}")
    if not isinstance(addr, str):
        raise bad
    host, sep, port = addr.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:  # a bare "::1:1234" reads as ::1 port 1234 and as ::1:1234 with no port: brackets decide
        raise bad
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise bad
    return host, int(port)


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: must be a positive integer, got {value!r}")


def _choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}: must be one of {', '.join(choices)}, got {value!r}")
