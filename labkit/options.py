"""The options the commands share, each declared once: flag name, type, choices, limits and help.

A command takes one as a typed parameter, e.g. `device: DeviceOption = Device.auto` or
`tp: TpOption = None` (None: the command's own default, say a case's or a workload's value, which
its help names). The engine's options take their choices and limits from engine/config.py, so a
new scheduling policy or attention backend reaches every command's --help and is checked the same
way everywhere. They are listed in an "Engine" panel of each command's help.
"""
from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from engine.config import ATTENTION_BACKENDS, DEVICES, DTYPES, KV_CACHE_DTYPES, MAX_TENSOR_PARALLEL_SIZE
from engine.policies import POLICIES


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


ENGINE = "Engine"  # the help panel of the options that configure the engine

# ---- the engine (Config fields); None leaves the field to the command's default
ModelOption = Annotated[Optional[str], typer.Option(
    "--model", metavar="DIR", rich_help_panel=ENGINE,
    help="Model folder (default: $MODEL_DIR, else the embedded tiny model).")]
DeviceOption = Annotated[Device, typer.Option(
    "--device", rich_help_panel=ENGINE, help="Where the engine runs; auto: cuda when a GPU is visible, else cpu.")]
TpOption = Annotated[Optional[int], typer.Option(
    "--tp", min=1, max=MAX_TENSOR_PARALLEL_SIZE, metavar="N", rich_help_panel=ENGINE,
    help="tensor_parallel_size: ranks (GPUs, or CPU processes).")]
EagerOption = Annotated[Optional[bool], typer.Option(
    "--eager/--graph", rich_help_panel=ENGINE, help="enforce_eager: eager execution, or CUDA graphs for decode.")]
PolicyOption = Annotated[Optional[Policy], typer.Option(
    "--policy", rich_help_panel=ENGINE, help="scheduling_policy.")]
DTypeOption = Annotated[Optional[DType], typer.Option(
    "--dtype", rich_help_panel=ENGINE, help="Weights and activations; auto: the checkpoint's dtype.")]
AttentionOption = Annotated[Optional[Attention], typer.Option(
    "--attention", rich_help_panel=ENGINE, help="attention_backend.")]
BudgetOption = Annotated[Optional[int], typer.Option(
    "--budget", min=1, metavar="N", rich_help_panel=ENGINE, help="max_num_batched_tokens: tokens per step.")]
MaxNumSeqsOption = Annotated[Optional[int], typer.Option(
    "--max-num-seqs", min=1, metavar="N", rich_help_panel=ENGINE, help="max_num_seqs: sequences per step.")]
MaxModelLenOption = Annotated[Optional[int], typer.Option(
    "--max-model-len", min=1, metavar="N", rich_help_panel=ENGINE,
    help="max_model_len: prompt and output tokens of one sequence.")]
BlockSizeOption = Annotated[Optional[int], typer.Option(
    "--block-size", min=1, metavar="N", rich_help_panel=ENGINE, help="kvcache_block_size: tokens per KV block.")]
AsyncSchedulingOption = Annotated[Optional[bool], typer.Option(
    "--async-scheduling/--no-async-scheduling", rich_help_panel=ENGINE,
    help="async_scheduling: launch the planned next decode step before this one's ids reach the host, kept only "
         "if the real schedule matches (engine default: on; states are the same either way).")]
KvCacheDtypeOption = Annotated[Optional[KvCacheDtype], typer.Option(
    "--kv-cache-dtype", rich_help_panel=ENGINE,
    help="kv_cache_dtype: the KV pool's element type; auto: the model dtype; fp8: E4M3 with per-tensor scales, "
         "half the bytes a token and twice the blocks (triton or torch attention).")]
NumBlocksOption = Annotated[Optional[int], typer.Option(
    "--num-blocks", min=1, metavar="N", rich_help_panel=ENGINE,
    help="num_kvcache_blocks (default: sized from free memory).")]

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
