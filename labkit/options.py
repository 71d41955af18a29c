"""The options the commands share, each declared once: flag name, type, choices, limits and help.

A command takes one as a typed parameter, e.g. `device: DeviceOption = Device.auto` or
`tensor_parallel_size: TensorParallelSizeOption = None` (None: the command's own default, say a case's or a
workload's value, which its help names). The engine's options are Config fields: each flag is its field's name
with dashes (`flag(field)`, vLLM's convention), the command's parameter is named as the field, and
`EngineArgs.given(ctx.params)` (labkit/engine_args.py) gathers them into one typed value; their choices and
limits come from engine/config.py and engine/policies.py, so a new scheduling policy or attention backend
reaches every command's --help and is checked the same way everywhere. They are listed in an "Engine" panel of
each command's help (tests/test_cli.py checks every one against its field).
"""
from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from engine.config import ATTENTION_BACKENDS, DEVICES, DTYPES, KV_CACHE_DTYPES, MAX_TENSOR_PARALLEL_SIZE
from engine.policies import POLICIES
from labkit.engine_args import ENGINE_PANELS, flag


def _choices(name: str, values: tuple[str, ...]) -> type[enum.Enum]:
    """A str Enum whose members are engine Config values (member name = value), for typed choices."""
    return enum.Enum(name, {value: value for value in values}, type=str, module=__name__)


Device = _choices("Device", DEVICES)
DType = _choices("DType", DTYPES)
Attention = _choices("Attention", ATTENTION_BACKENDS)
Policy = _choices("Policy", tuple(POLICIES))
KvCacheDtype = _choices("KvCacheDtype", KV_CACHE_DTYPES)


class Backend(str, enum.Enum):
    """Who computes: our engine, or Transformers as the reference / baseline."""

    engine = "engine"
    hf = "hf"


# The help panels of the options that configure the engine, and of those only a CUDA run uses.
ENGINE, ENGINE_ON_GPU = ENGINE_PANELS

# ---- the engine (Config fields, flag(field) = the field with dashes); None leaves the field to the command's
# default. The old short names (labkit/engine_args.py OLD_NAMES) are still read; the help names them.
ModelOption = Annotated[Optional[str], typer.Option(
    "--model", metavar="DIR", rich_help_panel=ENGINE,
    help="Model folder (default: $MODEL_DIR, else the embedded tiny model).")]
DeviceOption = Annotated[Device, typer.Option(
    flag("device"), rich_help_panel=ENGINE, help="Where the engine runs; auto: cuda when a GPU is visible, else cpu.")]
TensorParallelSizeOption = Annotated[Optional[int], typer.Option(
    flag("tensor_parallel_size"), min=1, max=MAX_TENSOR_PARALLEL_SIZE, metavar="N", rich_help_panel=ENGINE,
    help="Ranks: GPUs, or CPU processes (or --tp).")]
EnforceEagerOption = Annotated[Optional[bool], typer.Option(
    flag("enforce_eager") + "/--no-" + flag("enforce_eager")[2:], rich_help_panel=ENGINE,
    help="Eager execution, or CUDA graphs for decode (or --eager/--graph).")]
SchedulingPolicyOption = Annotated[Optional[Policy], typer.Option(
    flag("scheduling_policy"), rich_help_panel=ENGINE, help="Which sequences each step serves (or --policy).")]
DTypeOption = Annotated[Optional[DType], typer.Option(
    flag("dtype"), rich_help_panel=ENGINE, help="Weights and activations; auto: the checkpoint's dtype.")]
AttentionBackendOption = Annotated[Optional[Attention], typer.Option(
    flag("attention_backend"), rich_help_panel=ENGINE,
    help="The attention kernels; auto: triton on CUDA, torch on a CPU (flash_attn only when named; or --attention).")]
MaxNumBatchedTokensOption = Annotated[Optional[int], typer.Option(
    flag("max_num_batched_tokens"), min=1, metavar="N", rich_help_panel=ENGINE,
    help="Tokens per step, the step's budget (or --budget).")]
MaxNumSeqsOption = Annotated[Optional[int], typer.Option(
    flag("max_num_seqs"), min=1, metavar="N", rich_help_panel=ENGINE, help="Sequences per step.")]
MaxModelLenOption = Annotated[Optional[int], typer.Option(
    flag("max_model_len"), min=1, metavar="N", rich_help_panel=ENGINE,
    help="Prompt and output tokens of one sequence.")]
KvcacheBlockSizeOption = Annotated[Optional[int], typer.Option(
    flag("kvcache_block_size"), min=1, metavar="N", rich_help_panel=ENGINE,
    help="Tokens per KV block (or --block-size).")]
NumKvcacheBlocksOption = Annotated[Optional[int], typer.Option(
    flag("num_kvcache_blocks"), min=1, metavar="N", rich_help_panel=ENGINE,
    help="KV blocks in the pool (default: sized from free memory; or --num-blocks).")]
AsyncSchedulingOption = Annotated[Optional[bool], typer.Option(
    flag("async_scheduling") + "/--no-" + flag("async_scheduling")[2:], rich_help_panel=ENGINE,
    help="Schedule the next step while a step that replays a CUDA graph runs, its inputs reading this step's "
         "tokens on the device (engine default: on; the states are a synchronous engine's, but for one wasted "
         "token when an EOS is learnt late).")]
KvCacheDtypeOption = Annotated[Optional[KvCacheDtype], typer.Option(
    flag("kv_cache_dtype"), rich_help_panel=ENGINE,
    help="The KV pool's element type; auto: the model dtype; fp8: E4M3 with per-tensor scales, half the bytes a "
         "token and twice the blocks (triton or torch attention).")]
GpuMemoryUtilizationOption = Annotated[Optional[float], typer.Option(
    flag("gpu_memory_utilization"), min=0.0, max=1.0, metavar="F", rich_help_panel=ENGINE_ON_GPU,
    help="Fraction F of GPU memory for weights + KV.")]
CustomKernelsOption = Annotated[Optional[bool], typer.Option(
    flag("custom_kernels") + "/--no-" + flag("custom_kernels")[2:], rich_help_panel=ENGINE_ON_GPU,
    help="Our Triton GEMV and q/k norm+RoPE kernels (engine default: on); off: cuBLAS and compiled torch ops.")]
FusedDecodeOption = Annotated[Optional[bool], typer.Option(
    flag("fused_decode") + "/--no-" + flag("fused_decode")[2:], rich_help_panel=ENGINE_ON_GPU,
    help="Decode graphs of <= 16 rows as five fused kernels a layer chained with PDL (engine default: on); off: "
         "the separate kernels.")]

# ---- what the commands read and write
# --json: stdout then holds the result JSON alone (the command builds its rich Console with quiet=as_json).
JsonOption = Annotated[bool, typer.Option(
    "--json", help="Print the result JSON on stdout instead of the summary.")]
WorkloadOption = Annotated[str, typer.Option(
    "--workload", "-w", metavar="NAME|YAML", help="A bench workload: nano, fixed (workloads/bench/NAME.yaml) or a "
    "YAML path.")]
NumRequestsOption = Annotated[Optional[int], typer.Option(
    "--num-requests", min=1, metavar="N", help="Keep the first N requests (scale a workload down, e.g. on CPU).")]
BackendOption = Annotated[Backend, typer.Option(
    "--backend", help="engine (ours) or hf (Transformers: the baseline and the reference).")]
MaxQueueOption = Annotated[Optional[int], typer.Option(
    "--max-queue", min=1, metavar="N", help="The server's limit of requests waiting for their first token; "
    "new ones beyond it get 503.")]


def Out(what: str) -> Any:
    """`--out PATH` for a command: `what` says what the command writes there and where by default."""
    return Annotated[Optional[Path], typer.Option("--out", metavar="PATH", help=what)]


def check_url(option: str, url: str) -> str:
    """A running server's address as a command takes it (`--url`, `watch URL`): http(s)://HOST[:PORT][/PATH],
    PORT 1-65535; returned without a trailing slash. LabkitError (exit 2) naming `option` otherwise."""
    from urllib.parse import urlsplit

    from labkit.errors import LabkitError

    expected = "expected http://HOST:PORT (or https://)"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise LabkitError(f"{option} {url!r}: not a URL ({exc}); {expected}") from None
    if parts.scheme not in ("http", "https"):
        raise LabkitError(f"{option} {url!r}: not an http:// or https:// URL; {expected}")
    if not parts.hostname:
        raise LabkitError(f"{option} {url!r}: no host; {expected}")
    if port is not None and not 1 <= port <= 65535:
        raise LabkitError(f"{option} {url!r}: port {port} is not in 1-65535")
    return url.rstrip("/")
