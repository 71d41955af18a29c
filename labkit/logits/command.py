"""`labkit logits-check`: teacher-forced logits of the engine against a reference, row by row.

    labkit logits-check run --suite baseline --dtype bfloat16      # collect every side + compare, one go
    labkit logits-check collect --backend engine --suite baseline --dtype bfloat16 --out runs/lc/engine
    labkit logits-check collect --backend hf --suite baseline --dtype float32 --out runs/lc/truth
    labkit logits-check collect --backend hf --suite baseline --dtype bfloat16 --out runs/lc/hf-bf16
    labkit logits-check compare --lhs runs/lc/engine --rhs runs/lc/truth --reference runs/lc/hf-bf16
    labkit logits-check compare --lhs A --rhs B --truth runs/lc/truth --reference runs/lc/hf-bf16   # engine vs engine
    labkit logits-check compare --lhs A --rhs B --gate fixed       # fixed thresholds (bf16: 0.5 / 0.02), A against B
    labkit logits-check run --suite fp8-kv --dtype bfloat16        # FP8 KV cache: verdict + what it costs in numbers

Gates (labkit/logits/gates.py): anchored (default) judges each engine side by its distance to a float32
truth (Transformers float32) against the distance of Transformers' own run in the engine's dtype; fixed
compares lhs with rhs under fixed thresholds. Exit 1 on FAIL; REVIEW exits 0 and says so.

Suites (labkit/logits/suites.py has the exact composition): baseline (15 rows), graph (126),
prefix (6), tp (15; TP=2 vs TP=1), kv (49 rows + new K/V per layer per step; engine vs engine),
fp8-kv (277 rows; the engine with kv_cache_dtype fp8 against Transformers with e4m3 K/V, and the cost of FP8:
its distance to the truth over the model-dtype pool's, labkit/logits/cost.py).
A collection only records (status COLLECTED); only `compare` judges.
"""
from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from labkit.errors import LabkitError
from labkit.logits import compare as cmp, gates
from labkit.logits.collect import Collection, collect_engine, collect_hf, prefix_of, read_collection, write_collection
from labkit.logits.suites import SUITES, get_suite, is_fp8
from labkit.model import resolve_model
from labkit.narrow import fit, log_console
from labkit.options import (
    Attention,
    AttentionBackendOption,
    Backend,
    BackendOption,
    Device,
    DeviceOption,
    DType,
    DTypeOption,
    KvCacheDtypeOption,
    ModelOption,
    Out,
    TensorParallelSizeOption,
)
from labkit.output import (
    EXIT_FAIL,
    EXIT_PASS,
    configuration_suffix,
    envelope,
    finish,
    resolve_device,
    runs_dir,
    write_json,
)

app = typer.Typer(help="Teacher-forced logits of the engine against Transformers (or TP=2 / another execution).\n\n"
                       "Example: labkit logits-check run --suite baseline --device cpu",
                  no_args_is_help=True)


class Execution(str, enum.Enum):
    eager = "eager"
    graph = "graph"


class Gate(str, enum.Enum):
    anchored = "anchored"
    fixed = "fixed"


SuiteName = enum.Enum("SuiteName", {name: name for name in SUITES}, type=str)

_SUITE_HELP = ("Suite: " + ", ".join(f"{s.name} ({s.rows} rows)" for s in SUITES.values())
               + "; tp compares TP=2 with TP=1, kv adds the new K/V per layer (engine vs engine), fp8-kv judges "
               "kv_cache_dtype fp8 and states its cost. labkit/logits/suites.py lists each suite's cases.")
SuiteOption = Annotated[SuiteName, typer.Option("--suite", help=_SUITE_HELP)]
ExecutionOption = Annotated[Optional[Execution], typer.Option(
    "--execution", help="The engine side: eager or CUDA graphs (default eager).")]


def _console() -> Console:
    # Logs and pipes: wide enough for the worst-rows table; a terminal, or COLUMNS, is the width to fit.
    return log_console(150, highlight=False)


def _val(x):
    return None if x is None else getattr(x, "value", x)


def _collect(backend: str, suite_name: str, model_dir: Path, device: str, dtype: str, execution: str | None,
             attention: str | None, tp: int, seed: int, hf_model=None, console: Console | None = None,
             kv_cache_dtype: str = "auto") -> Collection:
    suite = get_suite(suite_name)
    progress = (lambda msg: console.print(f"  [dim]{backend}: {msg}[/dim]")) if console else None
    if backend == "engine":
        return collect_engine(suite, model_dir, device=device, dtype=dtype, execution=execution or "eager",
                              attention=attention or "auto", tp=tp, seed=seed, kv_cache_dtype=kv_cache_dtype,
                              progress=progress)
    if tp != 1:
        raise LabkitError(f"--tensor-parallel-size {tp}: the hf backend runs Transformers on one device (TP=1 only)")
    if execution not in (None, "eager"):
        raise LabkitError("--execution graph: the hf backend has no graph path (it always recomputes eagerly)")
    if attention not in (None, "auto"):
        raise LabkitError(f"--attention-backend {attention}: the hf backend always uses attn_implementation='eager'")
    return collect_hf(suite, model_dir, device=device, dtype=dtype, seed=seed, kv_cache_dtype=kv_cache_dtype,
                      model=hf_model, progress=progress)


def _print_collection(col: Collection, js: Path, npz: Path, console: Console) -> None:
    m = col.meta
    paths = cmp.code_path_text(m["code_path"])
    kv = f", K/V of {m['kv']['tokens']} tokens" if "kv" in m else ""
    fp8 = ", KV e4m3" if is_fp8(m.get("kv_cache_dtype")) else ""
    console.print(f"[bold]COLLECTED[/bold] suite {m['suite']['name']} ({m['backend']}, {m['dtype']}{fp8}, "
                  f"{m['device'].get('type')}): {len(m['rows'])} rows{kv}; code path: {paths}")
    if m.get("requested", {}).get("execution") == "graph" and not any(
            st.get("execution") == "graph" for st in m.get("steps", [])):
        console.print(Text("  note: --execution graph was asked for, but every step ran eager (no graph replay "
                           "on this device/build); the JSON records the path each step actually took"),
                      style="yellow")
    console.print(Text(f"  wrote {js} and {npz} in {m['wall_s']:.1f} s"))


_STYLE = {"FAIL": "red", "REVIEW": "yellow", "PASS": "green"}


def _row_cells(result: dict) -> tuple[list[str], list[list[str]]]:
    """The worst rows' header and cells: the figures of the table, and of the line per row that replaces it
    where the table does not fit."""
    g = result["gate"]
    anchored = g["rule"] == "anchored"
    head = ["row", "request", "step", "path", "ctx"]
    if anchored:
        head += ["ref to truth"] + [c for n in g["judged"] for c in (f"{n} to truth", f"{n} ratio")] + [
            "top-1 / truth"]
    else:
        head += ["max |diff|", "rel-L2", "top-1"]
    rows = []
    for r in cmp.worst_rows(result["rows"]):
        step = "-" if r["step"] is None else f"{r['step']} {(r['phase'] or '')[:3]}"
        cells = [str(r["index"]), f"{r['request_id']}#{r['output_index']}", step, cmp.path_text(r),
                 str(r["context_len"])]
        if anchored:
            ref = r["reference_to_truth"]
            cells.append("-" if ref is None else f"{ref['rel_l2']:.2e}")
            for n in g["judged"]:
                cells += [f"{r['to_truth'][n]['rel_l2']:.2e}", f"{r['to_truth'][n]['ratio']:.2f}x"]
            tops = "/".join(str(r["to_truth"][n]["top1"]) for n in g["judged"])
            cells.append(tops if r["top1_agree"] else f"{tops}/{r['truth_top1']}")
        else:
            top = str(r["top1_lhs"]) if r["top1_agree"] else f"{r['top1_lhs']}/{r['top1_rhs']}"
            cells += [f"{r['max_abs']:.2e}", f"{r['rel_l2']:.2e}", top]
        rows.append(cells + [r["status"]])
    return head + ["status"], rows


def _print_rows(result: dict, console: Console) -> None:
    """The worst rows: a table whose columns keep every figure whole (no vertical rules, headers wrapped at
    their spaces), or, where even that does not fit the terminal, a line per row naming each figure."""
    g = result["gate"]
    judged = ("judged " + " and ".join(g["judged"]) + " against the float32 truth" if g["rule"] == "anchored"
              else "lhs " + result["lhs"]["backend"] + " vs rhs " + result["rhs"]["backend"])
    title = f"logits-check {result['suite']}: worst rows ({judged})"
    head, rows = _row_cells(result)
    table = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, show_edge=False,
                  padding=(0, 1, 0, 0))
    for col in head:  # figures stay whole; headers wrap at their spaces
        table.add_column(Text(col, no_wrap=False), no_wrap=True, justify="right" if col in ("row", "ctx") else "left")
    for cells in rows:
        table.add_row(*cells[:-1], Text(cells[-1], style=_STYLE[cells[-1]]))
    if fit(table, console):
        console.print(table)
        return
    console.print(Text(title, style="italic"))
    for cells in rows:
        named = ", ".join(f"{h} {c}" for h, c in zip(head[2:-1], cells[2:-1]))
        console.print(Text.assemble((f"row {cells[0]} {cells[1]}", "bold"), f": {named} ",
                                    (cells[-1], _STYLE[cells[-1]])))


def _print_result(result: dict, console: Console) -> None:
    s, g, kv = result["summary"], result["gate"], result["kv"]
    _print_rows(result, console)
    console.print(Text(f"rule: {cmp.rule_text(g)}"))
    if g["rule"] == "anchored":
        console.print(f"rows {s['rows']}: pass {s['passed']}, review {s['review']}, fail {s['failed']}; top-1 = truth "
                      f"{s['top1_agree']}/{s['rows']} (near-tie flips {s['near_tie_flips']}); worst ratio "
                      f"{s['worst_ratio']['value']:.2f}x ({s['worst_ratio']['side']})")
        for name, o in s["overall"].items():
            console.print(Text(f"overall {name}: {o['status']}: {o['text']}"), style=_STYLE[o["status"]])
        if s.get("lhs_to_rhs"):
            m = s["lhs_to_rhs"]
            console.print(f"lhs vs rhs (for information): worst rel-L2 {m['worst_rel_l2']:.3g}, same top-1 "
                          f"{m['top1_agree']}/{s['rows']}")
        if kv.get("compared"):
            console.print(Text(f"new K/V: {kv['tokens']} tokens, {kv['status']}: failed steps {kv['failed_steps']}, "
                               f"REVIEW steps {kv['review_steps']}, worst ratio {kv['worst_ratio']:.2f}x"),
                          style=_STYLE[kv["status"]])
        c = result.get("kv_cost")
        if c is not None:
            b, q = c["baseline"], c["quantised"]
            console.print(Text(f"what FP8 costs: {c['text']}", style="bold"))
            console.print(Text(f"baseline (model-dtype pool) {b['verdict']}: rows pass {b['passed']}, review "
                               f"{b['review']}, fail {b['failed']}; {b['overall']['text']}"),
                          style=_STYLE[b["verdict"]])
            console.print(Text(f"quantised: {q['status']}: {q['text']}"), style=_STYLE.get(q["status"], "yellow"))
    else:
        th = result["thresholds"]
        console.print(f"rows {s['rows']}: pass {s['passed']}, review {s['review']}, fail {s['failed']}; "
                      f"top-1 same {s['top1_agree']}/{s['rows']}; worst max|diff| {s['worst_max_abs']['value']:.3g}, "
                      f"worst rel-L2 {s['worst_rel_l2']['value']:.3g} "
                      f"(thresholds {th['max_abs']:g} / {th['rel_l2']:g}, "
                      f"{th['dtype_basis']})")
        if kv.get("compared"):
            console.print(f"new K/V: {kv['tokens']} tokens, {len(kv['steps'])} steps, worst max|diff| "
                          f"{kv['worst_max_abs']:.3g} (threshold {th['kv_max_abs']:g}), "
                          f"failed steps {kv['failed_steps']}")
    if not kv.get("compared") and kv.get("reason"):
        console.print(Text(f"new K/V: not compared ({kv['reason']})"), style="dim")
    for note in result["notes"]:
        console.print(Text(f"note: {note}"), style="yellow")
    if s["first_failure"]:
        console.print(Text(f"first failure: {s['first_failure']}"), style="red")
    if kv.get("first_failure") and kv["first_failure"] not in (s["first_failure"] or ""):
        console.print(Text(f"first failing K/V step: {kv['first_failure']}"), style="red")
    if s["first_review"]:
        console.print(Text(f"first REVIEW: {s['first_review']}"), style="yellow")
    style = {"PASS": "bold green", "REVIEW": "bold black on yellow", "FAIL": "bold white on red"}[result["verdict"]]
    console.print(Text(f" VERDICT: {result['verdict']} ", style=style))
    console.print(Text(result["what_this_shows"]), style={"PASS": "", "REVIEW": "bold yellow", "FAIL": "red"}[
        result["verdict"]])


def _compare_and_write(cols: dict[str, Collection], prefixes: dict[str, Path], out: Path, gate: str,
                       thresholds: dict, console: Console) -> dict:
    """cols/prefixes: lhs, rhs and optionally truth, reference."""
    body = cmp.compare(cols["lhs"], cols["rhs"], gate=gate, truth=cols.get("truth"), reference=cols.get("reference"),
                       baseline=cols.get("baseline"), baseline_reference=cols.get("baseline_reference"), **thresholds)
    lm = cols["lhs"].meta
    evidence = ("gpu-measured" if all(c.meta.get("evidence") == "gpu-measured" for c in cols.values())
                else "cpu-executed")
    model_path = (lm.get("model") or {}).get("path")
    model_dir = model_path if model_path and Path(model_path).is_dir() else None
    env = envelope("logits-check compare", device="cpu", model_dir=model_dir, evidence=evidence)
    env["device"] = lm.get("device")
    env["model"] = lm.get("model")
    sides = {name: cmp.side_summary(cols[name], prefixes[name]) if name in cols else None
             for name in ("lhs", "rhs", "truth", "reference")}
    sides.update({name: cmp.side_summary(cols[name], prefixes[name])
                  for name in ("baseline", "baseline_reference") if name in cols})
    result = finish(env, **body, **sides, exit_code=EXIT_FAIL if body["verdict"] == "FAIL" else EXIT_PASS)
    out = Path(out)
    md = out.with_suffix(".md")
    write_json(out, result)
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(cmp.markdown(result), encoding="utf-8")
    _print_result(result, console)
    console.print(Text(f"wrote {out} and {md}"))
    return result


def _finish_exit(result: dict) -> None:
    raise typer.Exit(EXIT_FAIL if result["verdict"] == "FAIL" else EXIT_PASS)


# ------------------------------------------------------------------------------------------------


@app.command("collect")
def collect_cmd(
    suite: SuiteOption,
    backend: BackendOption = Backend.engine,
    out: Out("Output PREFIX: writes PREFIX.json and PREFIX.npz (default: runs/logits-SUITE[-OPTION-VALUE...]/BACKEND, "
             "one -OPTION-VALUE per option given that changes the run).") = None,
    execution: ExecutionOption = None,
    attention_backend: AttentionBackendOption = None,
    tensor_parallel_size: TensorParallelSizeOption = 1,
    device: DeviceOption = Device.auto,
    dtype: DTypeOption = DType.auto,
    model: ModelOption = None,
    seed: int = typer.Option(0, "--seed", help="Seed of the forced continuation ids (stored in the JSON)."),
    kv_cache_dtype: KvCacheDtypeOption = None,
) -> None:
    """Walk a suite's fixed token path with one backend and save every accepted step's logits row.

    The engine walks it with its paged KV cache and scheduler.
    hf (Transformers) recomputes the whole prefix each step (TP=1, eager attention only).
    --kv-cache-dtype fp8: the engine's pool is E4M3; Transformers' K/V go through the same e4m3 round trip
    before its eager attention (labkit/logits/hf_fp8.py).

    Example: labkit logits-check collect --suite baseline --backend hf --dtype float32
    """
    suite_name = _val(suite)
    dev = resolve_device(device)
    model_dir = resolve_model(model)
    prefix = (prefix_of(out) if out is not None else
              runs_dir() / f"logits-{suite_name}{configuration_suffix(skip=('suite', 'backend'))}" / backend.value)
    console = _console()
    col = _collect(backend.value, suite_name, model_dir, dev, dtype.value, _val(execution), _val(attention_backend),
                   tensor_parallel_size, seed, console=console, kv_cache_dtype=_val(kv_cache_dtype) or "auto")
    js, npz = write_collection(col, prefix)
    _print_collection(col, js, npz, console)


# (one option object, the default of both commands that take it: typer reads it, nothing changes it)
_GATE = typer.Option(Gate.anchored, "--gate", help="anchored (default): each engine side against a float32 truth, "
                        "measured by Transformers' own run in its dtype (labkit/logits/gates.py); fixed: lhs "
                        "against rhs under fixed thresholds (--max-abs, --rel-l2, --kv-max-abs).")


def _fixed_options():
    return (
        typer.Option(None, "--max-abs", help="--gate fixed: per-row max |diff| gate (default by dtype: bf16 0.5, "
                     "float32 1e-4)."),
        typer.Option(None, "--rel-l2", help="--gate fixed: per-row ||a-b||/||b|| gate (default by dtype: bf16 0.02, "
                     "float32 1e-5)."),
        typer.Option(None, "--kv-max-abs", help="--gate fixed: new-K/V max |diff| gate for kv collections (default "
                     "by dtype: bf16 0.1, float32 1e-4)."),
    )


_MAX_ABS, _REL_L2, _KV_MAX_ABS = _fixed_options()


@app.command("compare")
def compare_cmd(
    lhs: Path = typer.Option(..., "--lhs", help="Collection PREFIX under test (e.g. the engine)."),
    rhs: Path = typer.Option(..., "--rhs", help="anchored: the float32 truth (Transformers), or with --truth a second "
                             "judged collection (engine vs engine); fixed: the reference (rel-L2 divides by its "
                             "norm)."),
    truth: Optional[Path] = typer.Option(None, "--truth", help="anchored: a float32 Transformers collection; lhs and "
                                         "rhs are then both judged against it."),
    reference: Optional[Path] = typer.Option(None, "--reference", help="anchored: Transformers in the judged dtype "
                                             "(needed when a judged side is bf16/fp16; with --kv-cache-dtype fp8 "
                                             "for an FP8 side)."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="anchored, an FP8 lhs: the same engine with "
                                            "the model-dtype pool; judged too, and the cost of FP8 stated (the "
                                            "lhs's distance to the truth over its)."),
    baseline_reference: Optional[Path] = typer.Option(None, "--baseline-reference", help="Transformers in the "
                                                      "baseline's dtype, no quantisation (needed for bf16/fp16)."),
    gate: Gate = _GATE,
    max_abs: Optional[float] = _MAX_ABS,
    rel_l2: Optional[float] = _REL_L2,
    kv_max_abs: Optional[float] = _KV_MAX_ABS,
    out: Out("Report JSON (default: runs/logits-check.json); a .md twin goes beside it.") = None,
) -> None:
    """Compare collections row by row; exit 1 on FAIL (REVIEW exits 0 but says so).

    Example: labkit logits-check compare --lhs runs/lc/engine --rhs runs/lc/truth
    """
    paths = {"lhs": lhs, "rhs": rhs, "truth": truth, "reference": reference, "baseline": baseline,
             "baseline_reference": baseline_reference}
    cols = {name: read_collection(p) for name, p in paths.items() if p is not None}
    prefixes = {name: prefix_of(p) for name, p in paths.items() if p is not None}
    target = out if out is not None else runs_dir() / "logits-check.json"
    result = _compare_and_write(cols, prefixes, target, gate.value,
                                {"max_abs": max_abs, "rel_l2": rel_l2, "kv_max_abs": kv_max_abs}, _console())
    _finish_exit(result)


@app.command("run")
def run_cmd(
    suite: SuiteOption,
    out: Out("Output folder (default: runs/logits-SUITE, then -OPTION-VALUE for each option given that changes the "
             "run, e.g. runs/logits-baseline-dtype-bfloat16).") = None,
    execution: ExecutionOption = None,
    attention_backend: AttentionBackendOption = None,
    tensor_parallel_size: TensorParallelSizeOption = None,
    ref_execution: Execution = typer.Option(Execution.eager, "--ref-execution",
                                            help="kv suite: the second engine's execution."),
    ref_attention: Optional[Attention] = typer.Option(None, "--ref-attention", help="kv suite: the second "
                                                      "engine's attention backend (default: the same as "
                                                      "--attention-backend)."),
    device: DeviceOption = Device.auto,
    dtype: DTypeOption = DType.auto,
    model: ModelOption = None,
    seed: int = typer.Option(0, "--seed", help="Seed of the forced continuation ids."),
    gate: Gate = _GATE,
    max_abs: Optional[float] = _MAX_ABS,
    rel_l2: Optional[float] = _REL_L2,
    kv_max_abs: Optional[float] = _KV_MAX_ABS,
    kv_cache_dtype: KvCacheDtypeOption = None,
) -> None:
    """Collect every side of a suite and compare them: the usual way to run a logits check.

    anchored: the engine side(s), Transformers float32 (the truth) and, for a bf16/fp16 engine,
    Transformers in its dtype (the reference).
    fixed: engine vs Transformers in the engine's dtype (tp: TP=2 vs TP=1; kv: engine vs engine).
    --tensor-parallel-size is the engine side's (default 1; the tp suite's 2, against 1).
    FP8 KV cache (the fp8-kv suite, or --kv-cache-dtype fp8 on a suite judged against Transformers): the
    engine with fp8 (engine-fp8) and with the model-dtype pool (engine), the truth, Transformers in the
    engine's dtype with e4m3 K/V (hf-DTYPE-fp8, the FP8 side's reference) and without (hf-DTYPE); the check
    states FP8's cost: its distance to the truth over the model-dtype pool's.

    Example: labkit logits-check run --suite baseline --dtype bfloat16
    """
    suite_name = _val(suite)
    s = get_suite(suite_name)
    kv_dtype = _val(kv_cache_dtype) or s.kv_cache_dtype
    if is_fp8(s.kv_cache_dtype) and not is_fp8(kv_dtype):
        raise LabkitError(f"--kv-cache-dtype {kv_dtype}: the {suite_name} suite judges an FP8 KV cache; run another "
                          "suite for the model-dtype pool")
    fp8 = is_fp8(kv_dtype)
    if fp8 and s.reference != "hf":
        raise LabkitError(f"--kv-cache-dtype {kv_dtype}: the {suite_name} suite compares engines with each other; "
                          "an FP8 KV cache is judged against Transformers (the fp8-kv suite, or baseline, graph, "
                          "prefix, mixed)")
    if fp8 and gate == Gate.fixed:
        raise LabkitError("--gate fixed: an FP8 KV cache is judged by its distance to the float32 truth (the "
                          "anchored gate); fixed thresholds against Transformers cannot say what FP8 costs")
    if gate == Gate.anchored:  # refuse before minutes of collecting
        given = [n for n, v in (("--max-abs", max_abs), ("--rel-l2", rel_l2), ("--kv-max-abs", kv_max_abs))
                 if v is not None]
        if given:
            raise LabkitError(f"{', '.join(given)}: fixed thresholds belong to --gate fixed (the default gate, "
                              "anchored, judges against a float32 truth)")
    dev = resolve_device(device)
    model_dir = resolve_model(model)
    folder = Path(out) if out is not None else (
        runs_dir() / f"logits-{suite_name}{configuration_suffix(skip=('suite',))}")
    console = _console()
    exe, att, tp = _val(execution), _val(attention_backend), tensor_parallel_size
    if s.reference == "tp":
        tp_l = 2 if tp is None else tp
        if tp_l == 1:
            raise LabkitError("--tensor-parallel-size 1: the tp suite compares TP>1 against TP=1; give "
                              "--tensor-parallel-size 2 (or more)")
        plan = [("lhs", f"tp{tp_l}", exe, att, tp_l), ("rhs", "tp1", exe, att, 1)]
    elif s.reference == "engine":
        ref_att = _val(ref_attention) or att
        plan = [("lhs", "engine", exe, att, tp or 1), ("rhs", "engine-ref", ref_execution.value, ref_att, 1)]
    else:
        plan = [("lhs", "engine", exe, att, tp or 1)]
    cols: dict[str, Collection] = {}
    prefixes: dict[str, Path] = {}

    def collect(role: str, backend: str, name: str, dt: str, e=None, a=None, t=1, kv: str = "auto") -> None:
        console.print(f"[bold]collect[/bold] {name}: backend {backend}, dtype {dt}" + (
            f", {e or 'eager'}, attention {a or 'auto'}, TP={t}" if backend == "engine" else "")
            + (f", KV {kv}" if is_fp8(kv) else ""))
        col = _collect(backend, suite_name, model_dir, dev, dt, e, a, t, seed, console=console, kv_cache_dtype=kv)
        js, npz = write_collection(col, folder / name)
        _print_collection(col, js, npz, console)
        cols[role], prefixes[role] = col, folder / name

    if fp8:  # the FP8 engine is judged; the same engine with the model-dtype pool is its cost's denominator
        (_, _, e, a, t), = plan
        collect("lhs", "engine", "engine-fp8", dtype.value, e, a, t, kv_dtype)
        collect("baseline", "engine", "engine", dtype.value, e, a, t)
    else:
        for role, name, e, a, t in plan:
            collect(role, "engine", name, dtype.value, e, a, t)
    engine_dtype = cols["lhs"].meta["dtype"]
    if gate == Gate.fixed:
        if "rhs" not in cols:
            collect("rhs", "hf", "hf", dtype.value)
    else:
        collect("truth" if "rhs" in cols else "rhs", "hf", "hf-float32", "float32")
        if fp8:
            collect("reference", "hf", f"hf-{engine_dtype}-fp8", engine_dtype, kv=kv_dtype)
            if engine_dtype in gates.LOW_PRECISION:
                collect("baseline_reference", "hf", f"hf-{engine_dtype}", engine_dtype)
        elif engine_dtype in gates.LOW_PRECISION:
            collect("reference", "hf", f"hf-{engine_dtype}", engine_dtype)
    result = _compare_and_write(cols, prefixes, folder / "check.json", gate.value,
                                {"max_abs": max_abs, "rel_l2": rel_l2, "kv_max_abs": kv_max_abs}, console)
    _finish_exit(result)
