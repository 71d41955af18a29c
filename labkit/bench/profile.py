"""`labkit bench --profile`: where a step's wall time goes, from a torch.profiler trace of a window of steps.

The run
-------
After the bench's warm-up and timed repeats, the engine runs the workload once more (timed repeat 0's
requests, each prompt's first id shifted by one so no block is in the prefix cache) through its public step
API. torch.profiler (CPU activity; CUDA too on a GPU) records steps skip+1 .. skip+N of that run; the
profiler starts recording one step earlier and throws that step away (its first step carries the
profiler's own start-up), then the run stops and its requests are aborted. labkit wraps each step in a
`labkit::step I` range; the engine marks its phases with `engine::*` ranges (engine/profiling.py: free
when no profiler is recording). Tensor-parallel workers are other processes: only rank 0 is recorded.

The table (three partitions of the window's wall time, each checked to sum to its whole)
------------------------------------------------------------------------------------------
wall = from the start of the window's first step to the end of its last. Every instant of it is given to
  - host: what the Python thread was doing, by its innermost range: scheduling (engine::schedule), input
    preparation (engine::prepare: the host lists; engine::upload: their copy to the device), forward
    (engine::forward: kernel launches or graph replay; on the CPU the model's compute itself), sampling
    (engine::sample), postprocess (engine::postprocess), waiting on the GPU (CUDA synchronize calls and
    device-to-host copies, wherever they happen), the rest of step() (the engine's Python around the phases)
    and between steps (the bench's loop and the profiler's step marker);
  - GPU (CUDA runs): the kernel family running at that instant (KERNEL_FAMILIES, matched on the kernel's
    name, first pattern wins; memcpy and memset activities are "copies / memset"; instants where kernels
    of two streams overlap are shared equally between them), or idle when no kernel runs;
  - GPU idle, again by what the host was doing meanwhile.
Each part is also split by the step it falls in (prefill steps, decode steps, between steps).
CHECK_TOLERANCE: the parts must sum to their whole within max(1 us, 0.01% of it).

Kernels a token and one layer in time (CUDA runs)
-------------------------------------------------
Every GPU activity (kernel, copy, memset) counts in the step whose host range holds its start (between steps
otherwise); kernels per decode token = the decode steps' activities / their tokens (per step too), and the GPU
idle share of the decode steps beside the window's. The layer timeline: in the decode step of median length,
the activities in start order; a decoder layer is one period of the sequence of kernel names that repeats most
(the longest run of whole periods; the smallest period on a tie), taken where the repetition begins, so it may
start a kernel or two into the layer. Each kernel is kept with its start (from the period's first), duration,
name and family: the gaps between them are the time no kernel of the layer ran.
"""
from __future__ import annotations

import gzip
import json
import re
import shutil
import tempfile
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.bench.timing import StepTime, is_cuda, run_steps, step_stats
from labkit.errors import LabkitError

DEFAULT_STEPS = 32
DEFAULT_SKIP = 1
GZIP_OVER_BYTES = 8 << 20      # traces larger than this are written as .trace.json.gz (Perfetto reads both)
STEP_RANGE = "labkit::step"    # labkit's range around each llm.step(); the engine's ranges are engine::*
CHECK_TOLERANCE_US = 1.0
CHECK_TOLERANCE_FRACTION = 1e-4
TOP_KERNELS = 15
TOP_UNCLASSIFIED = 10

# Host rows: (key, label, what it holds).
HOST_ROWS: tuple[tuple[str, str, str], ...] = (
    ("scheduling", "scheduling", "engine::schedule (Scheduler.schedule)"),
    ("input_prep", "input preparation", "engine::prepare (the host lists), engine::upload (their copy to the device)"),
    ("forward", "forward", "engine::forward: kernel launches or the graph replay, and the LM head; on a CPU the "
                           "compute itself"),
    ("sampling", "sampling", "engine::sample"),
    ("postprocess", "postprocess", "engine::postprocess (Scheduler.postprocess)"),
    ("gpu_wait", "waiting on the GPU", "CUDA synchronize calls and device-to-host memcpy calls, in whichever phase"),
    ("step_rest", "rest of step()", "LLMEngine.step's own Python around the phases (labkit::step minus the above)"),
    ("between", "between steps", "the bench's loop and the profiler's step marker"),
)
ENGINE_RANGES = {"engine::schedule": "scheduling", "engine::prepare": "input_prep", "engine::upload": "input_prep",
                 "engine::forward": "forward", "engine::sample": "sampling", "engine::postprocess": "postprocess"}
# CUDA runtime/driver calls during which the host thread waits for the device: synchronizes, and memcpy calls
# whose copy (the GPU activity with the same correlation id) goes device to host: a copy to pageable memory
# returns only when it is done, after the kernels before it. Host-to-device copies return at once.
GPU_SYNC = re.compile(r"Synchronize")
HOST_COPY = re.compile(r"^cu(da)?Memcpy")

# GPU rows, in the order the table shows them; "idle" closes the partition.
FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("attention_decode", "attention, decode", ""),
    ("attention_prefill", "attention, prefill", ""),
    ("gemm", "GEMM", "cuBLAS and our Triton GEMV"),
    ("norm_rope_act", "norms / RoPE / act.", "and any other elementwise or reduce kernel"),
    ("sampler", "sampler", ""),
    ("kv_write", "KV write", ""),
    ("copy_memset", "copies / memset", ""),
    ("other", "other", "see the unclassified kernels"),
)
IDLE = ("idle", "idle", "no kernel or copy running on any stream")
# (family, pattern): matched case-insensitively against the kernel name, in this order; the first match wins.
# Our Triton kernels go by their function names (engine/kernels/*.py: _rms_norm_kernel, _silu_and_mul_kernel,
# _qk_norm_rope_kernel, ...); inductor's triton_{poi,red,per}_fused_* names stay for profiles of older commits.
KERNEL_FAMILIES: tuple[tuple[str, str], ...] = (
    # (_qkv_attention_kernel: the fused decode step's attention, with its q/k norm, RoPE and KV write)
    ("attention_decode", r"_qkv_attention_kernel|_decode_split_kernel|_decode_merge_kernel|flash_fwd_splitkv"
                         r"|flash_decod|paged_decode"),
    ("attention_prefill", r"_prefill_kernel|flash_fwd_kernel|fmha|flash_attn|cudnn.*sdpa|attention"),
    ("kv_write", r"_store_kv_kernel|store_kvcache|reshape_and_cache"),
    ("sampler", r"_gumbel_chunk_kernel|_pick_chunk_kernel|gumbel|softmax|argmax|exponential|distribution_"
                r"|topk|sort|multinomial|cumsum"),
    # (_mlp_kernel: session 27's MLP in one launch, since removed: its recorded traces still read as GEMMs)
    ("gemm", r"_small_gemm_kernel|_split_k_reduce_kernel|_mlp_kernel|gemm|gemv|nvjet|cublas|cutlass|xmma|wgmma"
             r"|splitkreduce|matmul|triton_tem_"),
    ("norm_rope_act", r"_qk_norm_rope_kernel|_partials_norm_kernel|triton_(poi|red|per)_fused|rms_?norm"
                      r"|layer_?norm|rsqrt|rotary|rope|silu|gelu|swiglu|act_and_mul"),
    ("copy_memset", r"memcpy|memset|copy_kernel|direct_copy|catarraybatchedcopy|fill|copy"),
    ("norm_rope_act", r"elementwise_kernel|reduce_kernel"),
)
_COMPILED_FAMILIES = tuple((family, re.compile(pattern, re.IGNORECASE)) for family, pattern in KERNEL_FAMILIES)
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def classify_kernel(name: str, category: str = "kernel") -> str:
    """The family of a GPU activity by its name (KERNEL_FAMILIES); "other" when nothing matches."""
    if category in ("gpu_memcpy", "gpu_memset"):
        return "copy_memset"
    for family, pattern in _COMPILED_FAMILIES:
        if pattern.search(name):
            return family
    return "other"


# ------------------------------------------------------------------------------------------ the run

@dataclass(frozen=True)
class ProfileRequest:
    steps: int = DEFAULT_STEPS
    skip: int = DEFAULT_SKIP


def check_request(steps: int | None, skip: int | None, profile: bool) -> ProfileRequest | None:
    """The flags as a request (None without --profile); bad values raise LabkitError (one line, exit 2)."""
    if not profile:
        given = [flag for flag, v in (("--profile-steps", steps), ("--profile-skip", skip)) if v is not None]
        if given:
            raise LabkitError(f"{given[0]}: only with --profile")
        return None
    if steps is not None and steps < 1:
        raise LabkitError(f"--profile-steps: must be >= 1, got {steps}")
    if skip is not None and skip < 0:
        raise LabkitError(f"--profile-skip: must be >= 0, got {skip}")
    return ProfileRequest(DEFAULT_STEPS if steps is None else steps, DEFAULT_SKIP if skip is None else skip)


def profile_prompts(prompts: list[list[int]], vocab_size: int) -> list[list[int]]:
    """Each prompt with its first id shifted by one: the same lengths, but no block the timed repeats cached."""
    return [[(p[0] + 1) % vocab_size] + p[1:] for p in prompts]


@dataclass
class ProfiledRun:
    trace_path: Path          # a temporary file; write_outputs moves it beside the bench JSON
    steps: list[StepTime]     # every step of the profiled run (the window is a part of them)
    request: ProfileRequest
    activities: list[str]


def profile_run(llm: Any, prompts: list[list[int]], params: list[Any], device: str,
                request: ProfileRequest) -> ProfiledRun:
    """Run the requests under torch.profiler, recording steps skip+1 .. skip+steps (see the module doc)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    cuda = is_cuda(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    trace_path = Path(tempfile.mkdtemp(prefix="labkit-profile-")) / "trace.json"
    exported: list[bool] = []

    def ready(prof) -> None:
        prof.export_chrome_trace(str(trace_path))
        exported.append(True)

    # The step before the window is the profiler's warm-up (recorded, then dropped); none when skip is 0.
    sched = schedule(wait=max(request.skip - 1, 0), warmup=min(request.skip, 1), active=request.steps, repeat=1)
    last = request.skip + request.steps
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*warmup.*")  # skip 0: torch warns that it has no warm-up
        prof = profile(activities=activities, schedule=sched, on_trace_ready=ready, record_shapes=False,
                       with_stack=False)
        with prof:
            def after(i: int) -> bool:
                prof.step()
                return i >= last

            times = run_steps(llm, prompts, params, around_step=lambda i: record_function(f"{STEP_RANGE} {i}"),
                              after_step=after)
            if cuda:
                torch.cuda.synchronize()
    if not exported:
        raise LabkitError(f"--profile-skip: the profiled run had {len(times)} step(s), none of them after the "
                          f"{request.skip} skipped; lower --profile-skip")
    return ProfiledRun(trace_path, times, request, ["cpu"] + (["cuda"] if cuda else []))


# ------------------------------------------------------------------------------------------ the analysis

@dataclass
class _Interval:
    start: float
    end: float
    label: str


def _events(trace: dict) -> list[dict]:
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise LabkitError("profile: the trace has no traceEvents list")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
            and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]


def _step_index(name: str) -> int | None:
    prefix = STEP_RANGE + " "
    if name.startswith(prefix) and name[len(prefix):].isdigit():
        return int(name[len(prefix):])
    return None


def _correlation(e: dict):
    args = e.get("args")
    return args.get("correlation") if isinstance(args, dict) else None


def analyze(trace: dict, steps: list[StepTime], cuda: bool, layers: int | None = None) -> dict:
    """The table (module doc) from a Chrome trace of the window and the run's steps (their phases); `layers`:
    the model's decoder layers, recorded beside the repetition the layer timeline finds."""
    events = _events(trace)
    by_index = {s.index: s for s in steps}
    step_events = [e for e in events
                   if e.get("cat") == "user_annotation" and _step_index(str(e.get("name"))) in by_index]
    if not step_events:
        raise LabkitError(f"profile: the trace holds no {STEP_RANGE} range of the run's steps")
    thread = (step_events[0].get("pid"), step_events[0].get("tid"))
    window = sorted(((float(e["ts"]), float(e["ts"]) + float(e["dur"]), by_index[_step_index(e["name"])])
                     for e in step_events if (e.get("pid"), e.get("tid")) == thread), key=lambda x: x[0])
    w0, w1 = window[0][0], max(end for _, end, _ in window)
    wall = w1 - w0

    def clip(start: float, end: float) -> tuple[float, float] | None:
        s, e = max(start, w0), min(end, w1)
        return (s, e) if e > s else None

    steps_iv = [_Interval(s, e, st.phase) for s, e, st in window]
    to_host = {_correlation(e) for e in events if e.get("cat") == "gpu_memcpy" and "DtoH" in str(e.get("name"))}
    to_host.discard(None)
    host_iv: list[_Interval] = []
    for e in events:
        if (e.get("pid"), e.get("tid")) != thread:
            continue
        name, cat = str(e.get("name")), e.get("cat")
        label = None
        if cat == "user_annotation":
            label = ENGINE_RANGES.get(name) or ("step_rest" if _step_index(name) in by_index else None)
        elif cat in ("cuda_runtime", "cuda_driver") and (
                GPU_SYNC.search(name) or (HOST_COPY.search(name) and _correlation(e) in to_host)):
            label = "gpu_wait"
        span = clip(float(e["ts"]), float(e["ts"]) + float(e["dur"])) if label else None
        if span:
            host_iv.append(_Interval(*span, label))
    gpu_iv: list[_Interval] = []
    activities: list[tuple[float, float, str, str]] = []   # (start, end, name, family), unclipped, in the window
    kernels: dict[str, dict] = {}
    for e in events:
        cat = e.get("cat")
        if cat not in GPU_CATEGORIES:
            continue
        name = str(e.get("name"))
        family = classify_kernel(name, cat)
        span = clip(float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        if not span:
            continue
        gpu_iv.append(_Interval(*span, family))
        activities.append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), name, family))
        k = kernels.setdefault(name, {"name": name, "family": family, "calls": 0, "us": 0.0})
        k["calls"] += 1
        k["us"] += span[1] - span[0]

    host, gpu, idle_by_host = _sweep(w0, w1, steps_iv, host_iv, gpu_iv)
    window_info = _window_summary(window, wall)
    table: dict[str, Any] = {
        "wall_ms": wall / 1000,
        "window": window_info,
        "host": _rows(HOST_ROWS, host, wall),
        "gpu": None,
        "gpu_idle_by_host": None,
        "top_kernels": None,
        "unclassified": None,
        "gpu_note": None if cuda else "CPU run: no CUDA activity was recorded; the GPU parts are n/a.",
    }
    if cuda:
        table["gpu"] = _rows(FAMILIES + (IDLE,), gpu, wall)
        idle = sum(gpu.get(IDLE[0], {}).values())
        table["gpu_idle_by_host"] = _rows(HOST_ROWS, {k: {"all": v} for k, v in idle_by_host.items()}, idle,
                                          phases=False)
        busy = wall - idle
        ranked = sorted(kernels.values(), key=lambda k: -k["us"])
        table["gpu_busy_ms"] = busy / 1000
        table["kernels"] = sum(k["calls"] for k in ranked)
        table["top_kernels"] = [_kernel_row(k, busy) for k in ranked[:TOP_KERNELS]]
        table["unclassified"] = [_kernel_row(k, busy) for k in ranked if k["family"] == "other"][:TOP_UNCLASSIFIED]
        if not kernels:
            table["gpu_note"] = "CUDA run, but the trace holds no kernel: the GPU parts are empty."
        table.update(_per_token(window, activities, table["gpu"]))
        table["layer_timeline"] = layer_timeline(window, activities, layers)
    table["checks"] = _checks(table)
    return table


def _step_of(window: list[tuple[float, float, StepTime]], t: float) -> int | None:
    """The window position of the step whose host range holds instant t, or None (between steps)."""
    for i, (s, e, _) in enumerate(window):
        if s <= t < e:
            return i
    return None


def _per_token(window: list[tuple[float, float, StepTime]], activities: list[tuple], gpu_rows: list[dict]) -> dict:
    """Kernels per decode token and step, activities by phase, and the GPU's idle share in the decode steps."""
    by_phase = {"prefill": 0, "decode": 0, "between": 0}
    for start, *_ in activities:
        i = _step_of(window, start)
        by_phase["between" if i is None else window[i][2].phase] += 1
    decode = [(e - s, st) for s, e, st in window if st.phase == "decode"]
    tokens = sum(st.new_tokens for _, st in decode)
    decode_ms = sum(d for d, _ in decode) / 1000
    idle = next(r for r in gpu_rows if r["part"] == IDLE[0])
    return {
        "kernels_by_phase": by_phase,
        "kernels_per_decode_token": by_phase["decode"] / tokens if tokens else None,
        "kernels_per_decode_step": by_phase["decode"] / len(decode) if decode else None,
        "gpu_idle_pct": idle["pct"],
        "decode_gpu_idle_pct": 100 * idle["by_phase_ms"]["decode"] / decode_ms if decode_ms else None,
    }


def repeating_block(names: list[str]) -> tuple[int, int, int] | None:
    """(start, period, repeats) of the longest run of whole periods of a repeating sequence of names (at least two
    repeats; the smallest period on a tie), or None when nothing repeats."""
    n = len(names)
    best: tuple[int, int, int] | None = None
    for period in range(1, n // 2 + 1):
        run = 0
        for i in range(n - period + 1):
            if i < n - period and names[i] == names[i + period]:
                run += 1
                continue
            repeats = (run + period) // period   # positions i-run .. i-1 match their next period
            if repeats >= 2 and (best is None or repeats * period > best[2] * best[1]):
                best = (i - run, period, repeats)
            run = 0
    return best


def layer_timeline(window: list[tuple[float, float, StepTime]], activities: list[tuple], layers: int | None
                   ) -> dict | None:
    """One decoder layer's kernels in time, from the decode step of median length (module doc); None when the
    window has no decode step with kernels."""
    decode = sorted((e - s, i) for i, (s, e, st) in enumerate(window) if st.phase == "decode")
    for _, i in decode[len(decode) // 2:] + decode[:len(decode) // 2][::-1]:  # the median, then its neighbours
        mine = sorted((a for a in activities if _step_of(window, a[0]) == i), key=lambda a: (a[0], a[1]))
        if mine:
            break
    else:
        return None
    s0, e0, st = window[i]
    block = repeating_block([a[2] for a in mine])
    out = {"step": st.index, "step_ms": (e0 - s0) / 1000, "step_kernels": len(mine), "model_layers": layers}
    if block is None:
        return {**out, "found": False, "note": "no repeating kernel sequence in the step: no layer to show"}
    start, period, repeats = block
    layer = mine[start:start + period]
    t0 = layer[0][0]
    busy = _union([(a[0], a[1]) for a in layer])
    span = max(a[1] for a in layer) - t0
    return {**out, "found": True, "period": period, "repeats": repeats, "first": start,
            "span_us": span, "busy_us": busy, "gap_us": span - busy,
            "kernels": [{"name": a[2], "family": a[3], "start_us": a[0] - t0, "dur_us": a[1] - a[0]} for a in layer]}


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    for s, e in sorted(spans):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def _sweep(w0: float, w1: float, steps: list[_Interval], host: list[_Interval], gpu: list[_Interval]):
    """Walk the window from boundary to boundary; give each piece to the innermost host range, to the
    kernels running (shared equally) or idle, and to the phase of the step it is in."""
    points = []  # (time, order, kind, index): ends (order 0) before starts (order 1) at the same instant
    for kind, ivs in (("s", steps), ("h", host), ("g", gpu)):
        for i, iv in enumerate(ivs):
            points.append((iv.start, 1, kind, i))
            points.append((iv.end, 0, kind, i))
    points.append((w1, 0, "end", -1))
    points.sort()
    active = {"s": set(), "h": set(), "g": set()}
    host_acc: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    gpu_acc: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    idle_by_host: dict[str, float] = defaultdict(float)
    t = w0
    for when, order, kind, i in points:
        if when > t:
            dt = when - t
            phase = steps[next(iter(active["s"]))].label if active["s"] else "between"
            if active["h"]:
                inner = max(active["h"], key=lambda j: (host[j].start, -host[j].end, j))
                where = host[inner].label
            else:
                where = "between" if phase == "between" else "step_rest"
            host_acc[where][phase] += dt
            if active["g"]:
                share = dt / len(active["g"])
                for j in active["g"]:
                    gpu_acc[gpu[j].label][phase] += share
            else:
                gpu_acc[IDLE[0]][phase] += dt
                idle_by_host[where] += dt
            t = when
        if kind == "end":
            break
        (active[kind].add if order == 1 else active[kind].discard)(i)
    return host_acc, gpu_acc, idle_by_host


def _rows(rows: tuple[tuple[str, str, str], ...], acc: dict, whole: float, phases: bool = True) -> list[dict]:
    out = []
    for key, label, _ in rows:
        parts = acc.get(key, {})
        us = sum(parts.values())
        row = {"part": key, "label": label, "ms": us / 1000, "pct": 100 * us / whole if whole else 0.0}
        if phases:
            row["by_phase_ms"] = {p: parts.get(p, 0.0) / 1000 for p in ("prefill", "decode", "between")}
        out.append(row)
    return out


def _kernel_row(k: dict, busy_us: float) -> dict:
    return {"name": k["name"], "family": k["family"], "calls": k["calls"], "ms": k["us"] / 1000,
            "mean_us": k["us"] / k["calls"], "pct_of_busy": 100 * k["us"] / busy_us if busy_us else 0.0}


def _window_summary(window: list[tuple[float, float, StepTime]], wall_us: float) -> dict:
    decode = [(e - s, st) for s, e, st in window if st.phase == "decode"]
    prefill = [(e - s, st) for s, e, st in window if st.phase == "prefill"]
    decode_us = sum(d for d, _ in decode)
    decode_tokens = sum(st.new_tokens for _, st in decode)
    batches = [st.batch_size for _, st in decode]
    return {
        "first_step": window[0][2].index,
        "last_step": window[-1][2].index,
        "steps": len(window),
        "prefill_steps": len(prefill),
        "decode_steps": len(decode),
        "prefill_tokens": sum(st.computed_tokens for _, st in prefill),
        "decode_tokens": decode_tokens,
        "decode_batch": [min(batches), max(batches)] if batches else None,
        "wall_ms": wall_us / 1000,
        "prefill_step_ms_mean": sum(d for d, _ in prefill) / len(prefill) / 1000 if prefill else None,
        "decode_step_ms_mean": decode_us / len(decode) / 1000 if decode else None,
        "decode_ms_per_token": decode_us / decode_tokens / 1000 if decode_tokens else None,
    }


def tolerance_ms(whole_ms: float) -> float:
    return max(CHECK_TOLERANCE_US / 1000, CHECK_TOLERANCE_FRACTION * whole_ms)


def _checks(table: dict) -> list[dict]:
    """Each partition sums to its whole (the parts are measured piece by piece, the whole end to end)."""
    wall = table["wall_ms"]
    pairs = [("host parts = wall", table["host"], wall)]
    if table["gpu"] is not None:
        idle = next(r["ms"] for r in table["gpu"] if r["part"] == IDLE[0])
        pairs += [("GPU families + idle = wall", table["gpu"], wall),
                  ("GPU idle by host phase = GPU idle", table["gpu_idle_by_host"], idle)]
    out = []
    for name, rows, whole in pairs:
        total = sum(r["ms"] for r in rows)
        tol = tolerance_ms(whole)
        out.append({"check": name, "sum_ms": total, "whole_ms": whole, "diff_ms": total - whole,
                    "tolerance_ms": tol, "ok": abs(total - whole) <= tol})
    return out


# ------------------------------------------------------------------------------------------ outputs

def load_trace(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise LabkitError(f"profile: cannot read the trace {path}: {e}") from None


def finish_profile(run: ProfiledRun, json_path: Path, context: dict) -> dict:
    """Analyse the run's trace, move the trace beside the bench JSON (gzip when large) and write the table
    as JSON and Markdown. Returns the table (its "files" name the three outputs). context["num_hidden_layers"]:
    the model's layers, for the layer timeline."""
    trace = load_trace(run.trace_path)
    cuda = "cuda" in run.activities
    table = analyze(trace, run.steps, cuda, context.get("num_hidden_layers"))
    trace_path = json_path.with_suffix(".trace.json")
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    if run.trace_path.stat().st_size > GZIP_OVER_BYTES:
        trace_path = trace_path.with_suffix(".json.gz")
        with open(run.trace_path, "rb") as src, gzip.open(trace_path, "wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        shutil.copyfile(run.trace_path, trace_path)
    shutil.rmtree(run.trace_path.parent, ignore_errors=True)
    for stale in {json_path.with_suffix(".trace.json"), json_path.with_suffix(".trace.json.gz")} - {trace_path}:
        stale.unlink(missing_ok=True)
    table_path, md_path = json_path.with_suffix(".profile.json"), json_path.with_suffix(".profile.md")
    table = {
        **context,
        "profiler": {"activities": run.activities, "skip": run.request.skip, "steps": run.request.steps,
                     "run_steps": len(run.steps), "run": step_stats(run.steps)},
        **table,
        "tolerance": f"max({CHECK_TOLERANCE_US:g} us, {CHECK_TOLERANCE_FRACTION * 100:g}% of the whole)",
        "kernel_families": [{"family": f, "pattern": p} for f, p in KERNEL_FAMILIES],
        "files": {"trace": str(trace_path), "json": str(table_path), "md": str(md_path)},
    }
    table_path.write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    md_path.write_text(markdown(table), encoding="utf-8")
    return table


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.3f}"


def _row_lines(rows: list[dict], per_step: int, phases: bool = True) -> list[str]:
    out = []
    for r in rows:
        cells = [r["label"], _ms(r["ms"]), f"{r['pct']:.1f}"]
        if phases:
            cells += [_ms(r["by_phase_ms"][p]) for p in ("prefill", "decode", "between")]
            cells.append(f"{r['ms'] * 1000 / per_step:,.1f}" if per_step else "-")
        out.append("| " + " | ".join(cells) + " |")
    return out


def summary_lines(t: dict) -> list[str]:
    """The window in a few words (also printed on the console)."""
    w = t["window"]
    batch = "" if not w["decode_batch"] else f", decode batch {w['decode_batch'][0]}-{w['decode_batch'][1]}"
    lines = [f"window: steps {w['first_step']}-{w['last_step']} of the profiled run ({w['prefill_steps']} prefill, "
             f"{w['decode_steps']} decode{batch}), wall {t['wall_ms']:,.3f} ms"]
    if w["decode_ms_per_token"] is not None:
        lines.append(f"decode: {w['decode_step_ms_mean']:,.3f} ms per step, {w['decode_ms_per_token']:,.4f} ms per "
                     f"token (profiled; the timed repeats run without the profiler)")
    if t.get("gpu") is not None:
        idle = next(r for r in t["gpu"] if r["part"] == IDLE[0])
        lines.append(f"GPU: busy {t['gpu_busy_ms']:,.3f} ms ({100 - idle['pct']:.1f}%), idle {idle['ms']:,.3f} ms "
                     f"({idle['pct']:.1f}%), {t['kernels']:,} kernels/copies")
        if t.get("kernels_per_decode_token") is not None:
            idle_d = t.get("decode_gpu_idle_pct")
            lines.append(f"decode steps: {t['kernels_per_decode_token']:,.1f} kernels per token "
                         f"({t['kernels_per_decode_step']:,.1f} per step), GPU idle "
                         + ("n/a" if idle_d is None else f"{idle_d:.1f}%") + " of their time")
        lt = t.get("layer_timeline") or {}
        if lt.get("found"):
            of = f" (the model has {lt['model_layers']})" if lt.get("model_layers") else ""
            lines.append(f"one decoder layer (step {lt['step']}; {lt['period']} kernels repeating {lt['repeats']} "
                         f"times{of}): {lt['span_us']:,.1f} us, kernels {lt['busy_us']:,.1f} us, gaps "
                         f"{lt['gap_us']:,.1f} us")
    return lines


def markdown(t: dict) -> str:
    steps = t["window"]["steps"]
    head = ("| {what} | ms | % of {whole} | in prefill steps ms | in decode steps ms | between steps ms "
            "| us per step |\n| --- | --- | --- | --- | --- | --- | --- |")
    lines = [f"# labkit bench --profile: {t.get('workload', '?')}", ""]
    lines += [f"- {s}" for s in summary_lines(t)]
    lines += [f"- trace: `{t['files']['trace']}` (open in https://ui.perfetto.dev or chrome://tracing)",
              f"- parts sum to their whole within {t['tolerance']}: "
              + "; ".join(f"{c['check']}: {'ok' if c['ok'] else 'NOT OK'} ({c['diff_ms']:+.4f} ms)"
                          for c in t["checks"]),
              "", "## Host: what the Python thread was doing", "", head.format(what="host phase", whole="wall")]
    lines += _row_lines(t["host"], steps)
    lines += ["", "Host phases: " + "; ".join(f"**{label}**: {what}" for _, label, what in HOST_ROWS) + "."]
    lines += ["", "## GPU: what the device was running", ""]
    if t["gpu"] is None:
        lines.append(t["gpu_note"] or "n/a")
    else:
        if t["gpu_note"]:
            lines += [t["gpu_note"], ""]
        lines.append(head.format(what="kernel family", whole="wall"))
        lines += _row_lines(t["gpu"], steps)
        notes = [f"**{label}**: {what}" for _, label, what in FAMILIES + (IDLE,) if what]
        lines += ["", "Families by kernel name (patterns at the end); " + "; ".join(notes) + "."]
        lines += ["", "## GPU idle, by what the host was doing meanwhile", "",
                  "| host phase | ms | % of idle |", "| --- | --- | --- |"]
        lines += _row_lines(t["gpu_idle_by_host"], steps, phases=False)
        for title, rows in (("Top kernels", t["top_kernels"]),
                            ("Unclassified kernels (family other)", t["unclassified"])):
            lines += ["", f"## {title}", "", "| kernel | family | calls | ms | mean us | % of GPU busy |",
                      "| --- | --- | --- | --- | --- | --- |"]
            lines += [f"| `{k['name'][:120]}` | {k['family']} | {k['calls']:,} | {k['ms']:,.3f} | {k['mean_us']:,.2f} "
                      f"| {k['pct_of_busy']:.1f} |" for k in rows] or ["| (none) | | | | | |"]
    lt = t.get("layer_timeline") or {}
    if lt.get("found"):
        lines += ["", f"## One decoder layer in time (decode step {lt['step']}, kernels {lt['first']}-"
                      f"{lt['first'] + lt['period'] - 1} of its {lt['step_kernels']})", "",
                  "| # | start us | duration us | gap before us | family | kernel |",
                  "| --- | --- | --- | --- | --- | --- |"]
        end = None
        for n, k in enumerate(lt["kernels"]):
            gap = "-" if end is None else f"{k['start_us'] - end:,.2f}"
            end = k["start_us"] + k["dur_us"] if end is None else max(end, k["start_us"] + k["dur_us"])
            lines.append(f"| {n} | {k['start_us']:,.2f} | {k['dur_us']:,.2f} | {gap} | {k['family']} | "
                         f"`{k['name'][:80]}` |")
    elif lt:
        lines += ["", f"One decoder layer: {lt.get('note')}."]
    lines += ["", "## Kernel families (first matching pattern wins, case-insensitive)", "",
              "| family | pattern |", "| --- | --- |"]
    lines += [f"| {k['family']} | `{k['pattern'].replace('|', '&#124;')}` |" for k in t["kernel_families"]]
    lines.append("")
    return "\n".join(lines)
