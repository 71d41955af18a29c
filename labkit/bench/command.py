"""`labkit bench`: offline throughput of the engine, a Transformers baseline, and B/A comparisons.

    labkit bench --workload fixed                        # same as `labkit bench run --workload fixed`
    labkit bench --workload nano --num-requests 8 --device cpu
    labkit bench --workload nano --backend hf --hf-batch 64
    labkit bench compare runs/A.json runs/B.json --variable eager   # spread, bootstrap interval, "within noise"
    labkit bench --workload batch1                       # decode ms per token at batch 1 (steps timed one by one)
    labkit bench --workload nano --no-custom-kernels     # cuBLAS + compiled torch ops instead of our Triton kernels
    labkit bench --workload batch1 --profile             # + torch.profiler trace and a where-the-time-goes table

Writes runs/bench-WORKLOAD-BACKEND[-eager|-graph].json (or --out FILE) and a Markdown twin
(.md beside it), and prints a table; --profile adds FILE.profile.json / .profile.md (the table of
labkit/bench/profile.py) and FILE.trace.json[.gz] (Perfetto / chrome://tracing). Exit 0 on success,
2 when it cannot run.
"""
# No `from __future__ import annotations`: the default command reuses run()'s evaluated signature.

import enum
import inspect
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from labkit.bench import compare as cmp
from labkit.bench.offline import Stepper
from labkit.bench.profile import DEFAULT_SKIP, DEFAULT_STEPS, check_request, finish_profile, summary_lines
from labkit.bench.workloads import Workload, draw, list_workloads, load_workload
from labkit.engine_args import EngineArgs
from labkit.errors import LabkitError
from labkit.narrow import fit, log_console
from labkit.options import (
    AsyncSchedulingOption,
    AttentionBackendOption,
    Backend,
    BackendOption,
    CustomKernelsOption,
    Device,
    DeviceOption,
    DTypeOption,
    EnforceEagerOption,
    FusedDecodeOption,
    GpuMemoryUtilizationOption,
    JsonOption,
    KvcacheBlockSizeOption,
    KvCacheDtypeOption,
    MaxModelLenOption,
    MaxNumBatchedTokensOption,
    MaxNumSeqsOption,
    ModelOption,
    NumKvcacheBlocksOption,
    NumRequestsOption,
    Out,
    SchedulingPolicyOption,
    TensorParallelSizeOption,
    WorkloadOption,
)
from labkit.output import (
    configuration_suffix,
    device_info,
    envelope,
    evidence_for,
    finish,
    knobs_text,
    print_json,
    resolve_device,
    runs_dir,
    write_json,
)

app = typer.Typer(invoke_without_command=True, no_args_is_help=False)


class RichStepper(Stepper):
    """One progress line per phase (init, warm-up, repeats) on stderr; silent when not a terminal."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.task = None

    def start(self, label: str, total: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=self.progress.tasks[-1].total)
        self.task = self.progress.add_task(label, total=max(total, 0))

    def advance(self, n: int = 1) -> None:
        if self.task is not None:
            self.progress.advance(self.task, n)


def _progress() -> Progress:
    console = Console(stderr=True)
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=False, refresh_per_second=4,
                    disable=not console.is_terminal)


def _enum(v: Any) -> Any:
    return v.value if isinstance(v, enum.Enum) else v


# ---------------------------------------------------------------------------------------- run

def run(
    ctx: typer.Context,
    workload: WorkloadOption = "fixed",
    backend: BackendOption = Backend.engine,
    model: ModelOption = None,
    device: DeviceOption = Device.auto,
    dtype: DTypeOption = None,
    enforce_eager: EnforceEagerOption = None,
    attention_backend: AttentionBackendOption = None,
    tensor_parallel_size: TensorParallelSizeOption = None,
    max_num_seqs: MaxNumSeqsOption = None,
    max_num_batched_tokens: MaxNumBatchedTokensOption = None,
    kvcache_block_size: KvcacheBlockSizeOption = None,
    max_model_len: MaxModelLenOption = None,
    num_kvcache_blocks: NumKvcacheBlocksOption = None,
    scheduling_policy: SchedulingPolicyOption = None,
    gpu_memory_utilization: GpuMemoryUtilizationOption = None,
    custom_kernels: CustomKernelsOption = None,
    async_scheduling: AsyncSchedulingOption = None,
    kv_cache_dtype: KvCacheDtypeOption = None,
    fused_decode: FusedDecodeOption = None,
    warmup: Optional[int] = typer.Option(None, "--warmup", min=0, help="Warm-up rounds (default: the workload's)."),
    repeats: Optional[int] = typer.Option(None, "--repeats", min=1, help="Timed repeats (default: the workload's)."),
    num_requests: NumRequestsOption = None,
    hf_batch: int = typer.Option(64, "--hf-batch", min=1, help="Prompts per transformers generate batch (hf)."),
    profile: bool = typer.Option(False, "--profile",
                                 help="After the timed repeats, one more run under torch.profiler: writes a trace "
                                      "and a table of where the window's wall time goes (docs/perf.md)."),
    profile_steps: Optional[int] = typer.Option(None, "--profile-steps",
                                                help=f"Steps in the profiled window (default {DEFAULT_STEPS})."),
    profile_skip: Optional[int] = typer.Option(None, "--profile-skip",
                                               help=f"Steps of the profiled run before the window (default "
                                                    f"{DEFAULT_SKIP}: the prefill of batch1)."),
    out: Out("JSON path (default: runs/bench-WORKLOAD-BACKEND[-eager|-graph][-OPTION-VALUE...].json, one "
             "-OPTION-VALUE per other option given); a .md twin goes beside it.") = None,
    list_: bool = typer.Option(False, "--list", help="List the shipped workloads and exit."),
    as_json: JsonOption = False,
) -> None:
    """Run a workload through the engine (or Transformers) and report throughput.

    Engine options left out take the workload's values, else the engine's defaults.
    --enforce-eager/--no-enforce-eager left out (and not in the workload): graph on cuda, eager on cpu.
    --backend hf refuses Engine options: they are the engine backend's alone.

    Example: labkit bench run --workload nano --num-requests 8 --device cpu
    """
    console = Console(quiet=as_json)
    if list_:
        for name in list_workloads():
            w = load_workload(name)
            console.print(Text.assemble((name, "bold"), f": {w.about}"))
        raise typer.Exit(0)

    profile_request = check_request(profile_steps, profile_skip, profile)
    w = load_workload(workload)
    w = w.scaled(num_requests)
    if warmup is not None:
        w.warmup.rounds = warmup
    if repeats is not None:
        w.repeats = repeats
    backend_name = _enum(backend)
    # The engine settings given override the workload's (the device is the run's own: --device).
    overrides = EngineArgs.given(ctx, device=None)
    if backend_name == "hf":
        given = [f for f, name in zip(overrides.given_flags(), overrides.kwargs()) if name != "dtype"]
        if given:
            raise LabkitError(f"{', '.join(given)}: engine settings; --backend hf does not use them")
        if profile_request is not None:
            raise LabkitError("--profile: profiles the engine; --backend hf does not support it")
        if w.timing != "generate":
            raise LabkitError(f"--workload {w.name}: timing {w.timing} drives the engine step by step; "
                              "--backend hf times generate calls only")

    from labkit.model import resolve_model

    model_dir = Path(resolve_model(model))
    dev = resolve_device(device)
    env = envelope("bench", device=dev, model_dir=model_dir, evidence=evidence_for(dev))

    with _progress() as progress:
        stepper = RichStepper(progress)
        if backend_name == "engine":
            from labkit.bench.offline import measure_engine

            m = measure_engine(w, model_dir, dev, overrides, stepper, profile=profile_request)
        else:
            from labkit.bench.hf import measure_hf

            hf_dtype = _enum(dtype) or w.engine.get("dtype") or "auto"
            m = measure_hf(w, model_dir, dev, hf_dtype, hf_batch, stepper)

    env["device"] = device_info(m["run_device"])
    env["evidence"] = evidence_for(m["run_device"])
    result = build_result(env, w, backend_name, m)
    json_path = out if out is not None else runs_dir() / default_name(w, backend_name, m, configuration_suffix(
        skip=("workload", "backend", "eager")))
    md_path = json_path.with_suffix(".md")
    result["files"] = {"json": str(json_path), "md": str(md_path)}
    table = None
    if m.get("profile") is not None:
        table = finish_profile(m["profile"], json_path, {"workload": w.name, "bench": str(json_path),
                                                         "device": env["device"], "execution": m.get("execution"),
                                                         "num_hidden_layers": _num_layers(model_dir)})
        # What the report shows of a profile (labkit/report/labs.py): kept in the bench JSON itself.
        result["profile"] = {"window": table["window"], "checks": table["checks"], "files": table["files"],
                             **{k: table.get(k) for k in PROFILE_SUMMARY}}
        result["files"].update({f"profile_{k}": v for k, v in table["files"].items()})
    write_json(json_path, result)
    md_path.write_text(markdown(result), encoding="utf-8")
    print_result(result, console)
    if table is not None:
        print_profile(table, console)
    console.print(f"wrote {json_path} and {md_path}" + ("" if table is None else
                  f"; profile {table['files']['json']}, {table['files']['md']}, {table['files']['trace']}"))
    if as_json:
        print_json(result)
    raise typer.Exit(0)


# The profile's figures the bench JSON repeats (labkit/bench/profile.py): kernels a token, idle shares, a layer.
PROFILE_SUMMARY = ("kernels", "gpu_busy_ms", "kernels_by_phase", "kernels_per_decode_token", "kernels_per_decode_step",
                   "gpu_idle_pct", "decode_gpu_idle_pct", "layer_timeline", "gpu_note")


def _num_layers(model_dir: Path) -> Optional[int]:
    import json

    try:
        n = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8")).get("num_hidden_layers")
    except (OSError, ValueError, AttributeError):
        return None
    return n if isinstance(n, int) else None


def print_profile(t: dict, console: Console) -> None:
    """The profile table's host and GPU partitions (the .profile.md has the rest)."""
    for line in summary_lines(t):
        console.print(line)
    parts = [("host phase", t["host"])] + ([("kernel family", t["gpu"])] if t["gpu"] is not None else [])
    for what, rows in parts:
        table = Table(title=f"profile: {what} (% of the window's wall time)", title_justify="left")
        for col in (what, "ms", "%", "prefill ms", "decode ms", "between ms"):
            table.add_column(col, justify="left" if col == what else "right")
        for r in rows:
            table.add_row(r["label"], f"{r['ms']:,.3f}", f"{r['pct']:.1f}",
                          *(f"{r['by_phase_ms'][p]:,.3f}" for p in ("prefill", "decode", "between")))
        fit(table, console)
        console.print(table)
    if t["gpu"] is None:
        console.print(Text(f"note: {t['gpu_note']}", style="yellow"))
    for c in t["checks"]:
        if not c["ok"]:
            console.print(Text(f"warning: {c['check']}: off by {c['diff_ms']:+.4f} ms (tolerance "
                               f"{c['tolerance_ms']:.4f})", style="red"))


def default_name(w: Workload, backend: str, m: dict, options: str = "") -> str:
    """bench-WORKLOAD-BACKEND[-eager|-graph], then `options` (the suffix of the other options given): a run of
    another configuration is a record of its own."""
    mode = ""
    if backend == "engine":
        mode = "-eager" if (m.get("engine") or {}).get("enforce_eager") else "-graph"
    return f"bench-{w.name}-{backend}{mode}{options}.json"


def build_result(env: dict, w: Workload, backend: str, m: dict) -> dict:
    """The bench JSON: envelope, the comparable config, and the measurement."""
    engine = m.get("engine")
    hf = m.get("hf")
    config = {
        "backend": backend,
        "workload": w.params(),
        "model_config_sha256": env["model"]["config_sha256"],
        "device": {"type": env["device"].get("type"), "name": env["device"].get("name")},
        "dtype": m["dtype"],
        "engine": engine,
        "hf": {"batch": hf["batch"], "attn_implementation": hf["attn_implementation"]} if hf else None,
    }
    totals = draw(w)
    notes = []
    if env["evidence"] != "gpu-measured":
        notes.append("CPU run: it shows the bench executes; its throughput says nothing about a GPU.")
    if m.get("prompt_ids_folded"):
        notes.append(f"prompt ids folded modulo the model's vocab_size {m['vocab_size']} "
                     f"(the workload draws from {list(w.token_range)}); token counts are unchanged.")
    if not w.vary_seed and w.repeats > 1:
        notes.append("every repeat runs identical prompts (vary_seed: false): repeats after the first may hit "
                     "the prefix cache on full blocks.")
    if engine is not None and engine.get("enforce_eager") is False and m.get("execution") == "eager":
        notes.append("graph execution was asked for (enforce_eager false) but the engine ran eager.")
    if w.scaled_from:
        notes.append(f"scaled down: the first {w.requests} of the workload's {w.scaled_from} requests.")
    return finish(
        env,
        status="ok",
        backend=backend,
        workload=w.to_dict() | {"totals": {"prompt_tokens": totals.prompt_tokens,
                                           "output_tokens": totals.output_tokens}},
        config=config,
        engine=engine,
        engine_requested=m.get("engine_requested"),
        hf=hf,
        execution=m.get("execution"),
        tracing=False,
        init_s=m["init_s"],
        init_wall_s=m["init_wall_s"],
        graph_capture_s=m["graph_capture_s"],
        startup_s=m.get("startup_s"),  # (the engine's phases; the Transformers baseline has none)
        warmup_s=m["warmup_s"],
        warmup_rounds=m["warmup_rounds"],
        runs=m["runs"],
        median=m["median"],
        kv_blocks=m["kv_blocks"],
        peak_memory=m["peak_memory"],
        vocab_size=m["vocab_size"],
        prompt_ids_folded=m["prompt_ids_folded"],
        notes=notes,
    )


def _f(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def _gib(n: Optional[int]) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def _kv_dtype_note(kv_cache_dtype: str | None) -> str:
    if kv_cache_dtype in (None, "auto"):
        return ""
    return f" ({kv_cache_dtype} pool: 1 byte an element, twice the blocks of a 16-bit pool)"


def _summary_rows(r: dict) -> list[tuple[str, str]]:
    w, dev = r["workload"], r["device"]
    eng = r.get("engine") or {}
    mode = r["execution"]
    if eng:
        asked = "eager" if eng.get("enforce_eager") else "graph"
        # Only a mismatch is news: graphs asked for (or the GPU default) but an eager run.
        mode = (f"{mode}{'' if asked == mode else f' (asked: {asked})'}, attention {eng.get('attention_backend')}, "
                f"tp {eng.get('tensor_parallel_size')}")
        if "custom_kernels" in eng:
            # Config asks; only a CUDA device runs them (engine/kernel_choice.py): on a CPU they are not on.
            on_gpu = (dev.get("type") or "").startswith("cuda")
            mode += (f", custom kernels {'on' if eng['custom_kernels'] else 'off'}" if on_gpu
                     else ", custom kernels off (CUDA only)")
    peak = r["peak_memory"]
    return [
        ("workload", f"{w['name']}: {w['requests']} requests, prompt {w['prompt_len']}, output {w['output_len']}, "
                     f"seed {w['seed']}" + (f", timing {w['timing']}" if "timing" in w else "")),
        ("backend", f"{r['backend']}: {mode}"),
        ("device", f"{dev.get('type')} ({dev.get('name') or '?'}), {r['evidence']}"),
        ("dtype", r["config"]["dtype"]),
        ("init s", _f(r["init_s"])),
        ("graph capture s", _f(r["graph_capture_s"])),
        ("warm-up s", f"{_f(r['warmup_s'])} ({len(r['warmup_rounds'])} round(s))"),
        ("kv blocks", _f(r["kv_blocks"]) + _kv_dtype_note(eng.get("kv_cache_dtype"))),
        ("peak memory", ", ".join(f"rank {p['rank']}: {_gib(p['peak_bytes'])}" for p in peak["per_rank"])
         + (" (torch.cuda.max_memory_allocated)" if peak["source"].startswith("torch")
            else " (max RSS of the process)")),
    ]


RUN_COLUMNS = ("repeat", "reqs", "prompt tok", "out tok", "wall s", "out tok/s", "total tok/s")
DECODE_COLUMNS = ("decode steps", "decode ms/token")


def _runs_table(r: dict, cols: tuple[str, ...], title: str = "timed runs") -> Table:
    """A row per timed repeat and the median's, with the columns `cols` of RUN_COLUMNS + DECODE_COLUMNS."""
    table = Table(title=title, title_justify="left")
    for col in cols:
        table.add_column(col, justify="right")
    med = r["median"]
    for x in r["runs"] + [med]:
        cells = {"repeat": "median" if x is med else str(x["repeat"]), "wall s": _f(x["wall_s"]),
                 "out tok/s": _f(x["output_throughput"], 1), "total tok/s": _f(x["total_token_throughput"], 1),
                 "decode ms/token": _f(x.get("decode_ms_per_token"), 4)}
        if x is not med:
            cells |= {"reqs": _f(x["requests"]), "prompt tok": _f(x["prompt_tokens"]),
                      "out tok": _f(x["output_tokens"]), "decode steps": _f(x.get("decode_steps"))}
        table.add_row(*(cells.get(c, "") for c in cols), style="bold" if x is med else None)
    return table


def print_result(r: dict, console: Console) -> None:
    table = Table(title=f"labkit bench: {r['workload']['name']} ({r['backend']})", show_header=False,
                  title_justify="left")
    table.add_column("what", style="bold", no_wrap=True)
    table.add_column("value")
    for what, value in _summary_rows(r):
        table.add_row(what, Text(value))
    fit(table, console)
    console.print(table)
    per_token = "decode_ms_per_token" in r["median"]
    runs = _runs_table(r, RUN_COLUMNS + (DECODE_COLUMNS if per_token else ()))
    if not fit(runs, console) and per_token:
        # Nine columns do not fit: the decode figures get a table of their own.
        runs = _runs_table(r, RUN_COLUMNS)
        fit(runs, console)
        console.print(runs)
        runs = _runs_table(r, ("repeat",) + DECODE_COLUMNS, "decode per timed run")
    console.print(runs)
    for note in r["notes"]:
        console.print(Text(f"note: {note}", style="yellow"))


def markdown(r: dict) -> str:
    lines = [f"# labkit bench: {r['workload']['name']} ({r['backend']})", ""]
    lines += ["| what | value |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in _summary_rows(r)]
    per_token = "decode_ms_per_token" in r["median"]
    extra_head = " decode steps | decode ms/token |" if per_token else ""
    lines += ["", "| repeat | requests | prompt tokens | output tokens | wall s | output tok/s | total tok/s |"
              + extra_head, "| --- " * (9 if per_token else 7) + "|"]
    for x in r["runs"]:
        extra = f" {x['decode_steps']} | {_f(x['decode_ms_per_token'], 4)} |" if per_token else ""
        lines.append(f"| {x['repeat']} | {x['requests']} | {x['prompt_tokens']} | {x['output_tokens']} | "
                     f"{x['wall_s']:.4f} | {x['output_throughput']:.1f} | {x['total_token_throughput']:.1f} |" + extra)
    med = r["median"]
    extra = f" | **{med['decode_ms_per_token']:.4f}** |" if per_token else ""
    lines.append(f"| **median** | | | | {med['wall_s']:.4f} | **{med['output_throughput']:.1f}** | "
                 f"{med['total_token_throughput']:.1f} |" + extra)
    if r.get("profile"):
        files = r["profile"]["files"]
        lines += ["", f"Profile (one more run after the timed repeats): table `{files['md']}`, "
                      f"trace `{files['trace']}`."]
    if r["notes"]:
        lines += [""] + [f"- {n}" for n in r["notes"]]
    import json

    lines += ["", "## Config (what `labkit bench compare` checks)", "", "```json",
              json.dumps(r["config"], indent=2), "```",
              "", f"Engine knobs: {knobs_text(r.get('knobs', {}))}.",
              "", f"git head {r.get('git_head')} (dirty: {r.get('git_dirty')}); started {r['started_at']}, "
                  f"ended {r['ended_at']}; command: `{' '.join(r['argv'])}`", ""]
    return "\n".join(lines)


app.command("run")(run)


def _default(ctx: typer.Context, **kwargs: Any) -> None:
    if ctx.invoked_subcommand is not None:
        return
    run(ctx, **kwargs)


# `labkit bench --workload fixed` runs without the `run` word: the group callback takes run()'s options.
_sig = inspect.signature(run, eval_str=True)
_default.__signature__ = _sig  # (its first parameter is the context)
app.callback(invoke_without_command=True, help=(
    "Offline throughput of the engine (or the Transformers baseline), online load against `labkit serve`, and B/A "
    "comparisons. Without a subcommand it runs `bench run` with these options.\n\n"
    "Example: labkit bench --workload nano --num-requests 8 --device cpu"))(_default)


# ------------------------------------------------------------------------------------ load

from labkit.bench.load_command import load as _load  # noqa: E402

app.command("load")(_load)


# ------------------------------------------------------------------------------------ compare

@app.command("compare")
def compare_cmd(
    a: Path = typer.Argument(..., metavar="A.json", help="The baseline bench (or bench load) JSON."),
    b: Path = typer.Argument(..., metavar="B.json", help="The same with the variable changed."),
    variable: str = typer.Option(..., "--variable", "-v",
                                 help="What differs: eager, tp, backend, attention, policy, block_size, budget, "
                                      "max_num_seqs, dtype, code, ... (load runs: also rate, max_concurrency, "
                                      "server) or a config key (engine.max_model_len)."),
    allow_single: bool = typer.Option(False, "--allow-single", help="Compare even when a side has a single "
                                      "repeat (or completed request): the ratio then has no interval."),
    out: Out("JSON path (default: runs/bench-compare-VARIABLE.json); a .md twin is written beside it.") = None,
    as_json: JsonOption = False,
) -> None:
    """B/A of two bench runs: median output tok/s (load runs: median e2el), each side's spread, a bootstrap interval.

    "within noise" when the interval holds 1.0.

    Example: labkit bench compare runs/eager.json runs/graph.json --variable eager
    """
    da, db = cmp.load_bench(a), cmp.load_bench(b)
    res = cmp.compare(da, db, variable, a_name=str(a), b_name=str(b), allow_single=allow_single)
    evidence = cmp.weakest_evidence(da, db)
    env = envelope("bench compare", device="cpu", model_dir=None, evidence=evidence)
    env["device"] = da.get("device")
    env["model"] = da.get("model")
    result = finish(env, **res, a=cmp.side(da, a), b=cmp.side(db, b))
    json_path = out if out is not None else runs_dir() / f"bench-compare-{variable}.json"
    md_path = json_path.with_suffix(".md")
    result["files"] = {"json": str(json_path), "md": str(md_path)}
    write_json(json_path, result)
    md_path.write_text(cmp.markdown(result), encoding="utf-8")

    # Logs and pipes: wide enough for the spread table on one line per metric.
    console = log_console(140, quiet=as_json)
    if res["values"]["a"]:
        fields = Table(title=f"labkit bench compare --variable {variable}", title_justify="left")
        for col in ("field", "A", "B"):
            fields.add_column(col, justify="right" if col != "field" else "left")
        for k in res["values"]["a"]:
            fields.add_row(Text(k, style="cyan"), Text(cmp._fmt(res["values"]["a"][k])),
                           Text(cmp._fmt(res["values"]["b"][k])))
        fit(fields, console)
        console.print(fields)
    table = Table(title=f"spread over the {res['samples_are']} (min / median / max) and B/A of the medians",
                  title_justify="left")
    for col in ("metric", "A", "B", "B/A"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    for mt in res["metrics"].values():
        table.add_row(mt["label"], cmp._spread_text(mt["a"]), cmp._spread_text(mt["b"]), mt["text"])
    fit(table, console)
    console.print(table)
    once = Table(title="measured once per run (no spread, no interval)", title_justify="left")
    for col in ("figure", "A", "B", "B/A"):
        once.add_column(col, justify="right" if col != "figure" else "left")
    for name, mt in res["single_measurements"].items():
        once.add_row(name, cmp._short(mt["a"]), cmp._short(mt["b"]),
                     "-" if mt["ratio"] is None else f"{mt['ratio']:.3f}")
    fit(once, console)
    console.print(once)
    style = "bold" if res["within_noise"] is False else "bold yellow"
    console.print(Text.assemble((res["headline"], style), f"  ({evidence})"))
    if res["same_value"]:
        console.print(Text("note: the variable has the same value in both runs", style="yellow"))
    console.print(f"wrote {json_path} and {md_path}")
    if as_json:
        print_json(result)
    raise typer.Exit(0)
