"""`labkit logits-check`: teacher-forced logits of the engine against a reference, row by row.

    labkit logits-check collect --backend engine --suite baseline --out runs/logits-baseline/engine
    labkit logits-check collect --backend hf     --suite baseline --out runs/logits-baseline/hf
    labkit logits-check compare --lhs runs/logits-baseline/engine --rhs runs/logits-baseline/hf \\
        --out runs/logits-baseline/check.json                       # exit 1 on FAIL
    labkit logits-check run --suite baseline                        # both sides + compare, one go

Suites (labkit/logits/suites.py has the exact composition): baseline (15 rows), graph (126),
prefix (6), tp (15; TP=2 vs TP=1), kv (49 rows + new K/V per layer per step; engine vs engine).
A collection only records (status COLLECTED); only `compare` judges.
"""
from __future__ import annotations

import enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from labkit.options import Backend, DType, Attention
from labkit.errors import LabkitError
from labkit.logits import compare as cmp
from labkit.logits.collect import (Collection, collect_engine, collect_hf, prefix_of, read_collection,
                                  write_collection)
from labkit.logits.suites import SUITES, get_suite
from labkit.model import resolve_model
from labkit.output import (EXIT_FAIL, EXIT_PASS, Device, envelope, finish, resolve_device, runs_dir,
                           write_json)

app = typer.Typer(help="Teacher-forced logits of the engine against Transformers (or TP=2 / another execution).",
                  no_args_is_help=True)


class Execution(str, enum.Enum):
    eager = "eager"
    graph = "graph"


SuiteName = enum.Enum("SuiteName", {name: name for name in SUITES}, type=str)

_SUITE_HELP = ("Suite: " + ", ".join(f"{s.name} ({s.rows} rows)" for s in SUITES.values())
               + "; tp compares TP=2 with TP=1, kv adds the new K/V per layer (engine vs engine). "
               "labkit/logits/suites.py lists each suite's cases.")


def _console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:  # logs and pipes: wide enough for the worst-rows table
        console = Console(highlight=False, width=120)
    return console


def _val(x):
    return None if x is None else getattr(x, "value", x)


def _check_tp(tp: int) -> None:
    if tp < 1:
        raise LabkitError(f"--tp must be >= 1, got {tp}")


def _collect(backend: str, suite_name: str, model_dir: Path, device: str, dtype: str, execution: str | None,
             attention: str | None, tp: int, seed: int, hf_model=None, console: Console | None = None) -> Collection:
    suite = get_suite(suite_name)
    progress = (lambda msg: console.print(f"  [dim]{backend}: {msg}[/dim]")) if console else None
    if backend == "engine":
        return collect_engine(suite, model_dir, device=device, dtype=dtype, execution=execution or "eager",
                              attention=attention or "auto", tp=tp, seed=seed, progress=progress)
    if tp != 1:
        raise LabkitError(f"--tp {tp}: the hf backend runs Transformers on one device (TP=1 only)")
    if execution not in (None, "eager"):
        raise LabkitError("--execution graph: the hf backend has no graph path (it always recomputes eagerly)")
    if attention not in (None, "auto"):
        raise LabkitError(f"--attention {attention}: the hf backend always uses attn_implementation='eager'")
    return collect_hf(suite, model_dir, device=device, dtype=dtype, seed=seed, model=hf_model, progress=progress)


def _print_collection(col: Collection, js: Path, npz: Path, console: Console) -> None:
    m = col.meta
    paths = cmp.code_path_text(m["code_path"])
    kv = f", K/V of {m['kv']['tokens']} tokens" if "kv" in m else ""
    console.print(f"[bold]COLLECTED[/bold] suite {m['suite']['name']} ({m['backend']}, {m['dtype']}, "
                  f"{m['device'].get('type')}): {len(m['rows'])} rows{kv}; code path: {paths}")
    if m.get("requested", {}).get("execution") == "graph" and not any(
            st.get("execution") == "graph" for st in m.get("steps", [])):
        console.print(Text("  note: --execution graph was asked for, but every step ran eager (no graph replay "
                           "on this device/build); the JSON records the path each step actually took"),
                      style="yellow")
    console.print(Text(f"  wrote {js} and {npz} in {m['wall_s']:.1f} s"))


def _print_result(result: dict, console: Console) -> None:
    s, th = result["summary"], result["thresholds"]
    table = Table(title=f"logits-check {result['suite']}: worst rows (lhs {result['lhs']['backend']} vs "
                        f"rhs {result['rhs']['backend']})", header_style="bold")
    for col in ("row", "request", "step", "path", "ctx", "max|diff|", "rel-L2", "top-1", "status"):
        table.add_column(col, no_wrap=col != "request")
    for r in cmp.worst_rows(result["rows"]):
        style = {"FAIL": "red", "REVIEW": "yellow", "PASS": "green"}[r["status"]]
        path = r["execution"] or "-"
        if path == "hf-full-recompute":
            path = "hf"
        if r.get("graph_batch") is not None:
            path += f"/{r['graph_batch']}"
        step = "-" if r["step"] is None else f"{r['step']} {(r['phase'] or '')[:3]}"
        top = str(r["top1_lhs"]) if r["top1_agree"] else f"{r['top1_lhs']}/{r['top1_rhs']}"
        table.add_row(str(r["index"]), f"{r['request_id']}#{r['output_index']}", step, path, str(r["context_len"]),
                      f"{r['max_abs']:.2e}", f"{r['rel_l2']:.2e}", top, Text(r["status"], style=style))
    console.print(table)
    console.print(f"rows {s['rows']}: pass {s['passed']}, review {s['review']}, fail {s['failed']}; "
                  f"top-1 agree {s['top1_agree']}/{s['rows']}; worst max|diff| {s['worst_max_abs']['value']:.3g}, "
                  f"worst rel-L2 {s['worst_rel_l2']['value']:.3g} (thresholds {th['max_abs']:g} / {th['rel_l2']:g}, "
                  f"{th['dtype_basis']})")
    kv = result["kv"]
    if kv.get("compared"):
        console.print(f"new K/V: {kv['tokens']} tokens, {len(kv['steps'])} steps, worst max|diff| "
                      f"{kv['worst_max_abs']:.3g} (threshold {th['kv_max_abs']:g}), failed steps {kv['failed_steps']}")
    for note in result["notes"]:
        console.print(Text(f"note: {note}"), style="yellow")
    if s["first_failure"]:
        console.print(Text(f"first failing row: {s['first_failure']}"), style="red")
    if kv.get("first_failure"):
        console.print(Text(f"first failing K/V step: {kv['first_failure']}"), style="red")
    if s["first_review"]:
        console.print(Text(f"first REVIEW row: {s['first_review']}"), style="yellow")
    style = {"PASS": "bold green", "REVIEW": "bold black on yellow", "FAIL": "bold white on red"}[result["verdict"]]
    console.print(Text(f" VERDICT: {result['verdict']} ", style=style))
    if result["verdict"] == "REVIEW":
        console.print(Text(f"REVIEW: {s['review']} row(s) within the thresholds changed top-1 where the reference's "
                           f"top two logits are no further apart than the measured error; read those rows before "
                           f"accepting (exit code 0)"), style="bold yellow")


def _compare_and_write(lhs: Collection, rhs: Collection, lhs_prefix: Path, rhs_prefix: Path, out: Path,
                       max_abs, rel_l2, kv_max_abs, console: Console) -> dict:
    body = cmp.compare(lhs, rhs, max_abs=max_abs, rel_l2=rel_l2, kv_max_abs=kv_max_abs)
    lm, rm = lhs.meta, rhs.meta
    evidence = "gpu-measured" if lm.get("evidence") == rm.get("evidence") == "gpu-measured" else "cpu-executed"
    model_path = (lm.get("model") or {}).get("path")
    model_dir = model_path if model_path and Path(model_path).is_dir() else None
    env = envelope("logits-check compare", device="cpu", model_dir=model_dir, evidence=evidence)
    env["device"] = lm.get("device")
    env["model"] = lm.get("model")
    result = finish(env, **body, lhs=cmp.side_summary(lhs, lhs_prefix), rhs=cmp.side_summary(rhs, rhs_prefix),
                    exit_code=EXIT_FAIL if body["verdict"] == "FAIL" else EXIT_PASS)
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
    suite: SuiteName = typer.Option(..., "--suite", help=_SUITE_HELP),
    backend: Backend = typer.Option(Backend.engine, "--backend", help="engine (paged KV, scheduler) or hf "
                                    "(Transformers, whole prefix recomputed each step)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output PREFIX: writes PREFIX.json and PREFIX.npz "
                                       "(default: runs/logits-SUITE/BACKEND)."),
    execution: Optional[Execution] = typer.Option(None, "--execution", help="Engine: eager or graph (default eager)."),
    attention: Optional[Attention] = typer.Option(None, "--attention", help="Engine attention backend (default auto)."),
    tp: int = typer.Option(1, "--tp", help="Engine tensor_parallel_size."),
    device: Device = typer.Option(Device.auto, "--device", help="auto, cpu or cuda."),
    dtype: DType = typer.Option(DType.auto, "--dtype", help="auto (the model's), float32, bfloat16 or float16."),
    model: Optional[str] = typer.Option(None, "--model", help="Model folder (default: $MODEL_DIR or the tiny model)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the forced continuation ids (stored in the JSON)."),
) -> None:
    """Walk a suite's fixed token path with one backend and save every accepted step's logits row."""
    _check_tp(tp)
    suite_name = _val(suite)
    dev = resolve_device(device)
    model_dir = resolve_model(model)
    prefix = prefix_of(out) if out is not None else runs_dir() / f"logits-{suite_name}" / backend.value
    console = _console()
    col = _collect(backend.value, suite_name, model_dir, dev, dtype.value, _val(execution), _val(attention), tp, seed,
                   console=console)
    js, npz = write_collection(col, prefix)
    _print_collection(col, js, npz, console)


@app.command("compare")
def compare_cmd(
    lhs: Path = typer.Option(..., "--lhs", help="Collection PREFIX under test (e.g. the engine)."),
    rhs: Path = typer.Option(..., "--rhs", help="Reference collection PREFIX (rel-L2 divides by its norm)."),
    max_abs: Optional[float] = typer.Option(None, "--max-abs", help="Per-row max |diff| gate "
                                            "(default by dtype: bf16 0.5, float32 1e-4)."),
    rel_l2: Optional[float] = typer.Option(None, "--rel-l2", help="Per-row ||a-b||/||b|| gate "
                                           "(default by dtype: bf16 0.02, float32 1e-5)."),
    kv_max_abs: Optional[float] = typer.Option(None, "--kv-max-abs", help="New-K/V max |diff| gate for kv "
                                               "collections (default by dtype: bf16 0.1, float32 1e-4)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Report FILE (JSON; a Markdown twin goes next to it "
                                       "with .md; default: runs/logits-check.json)."),
) -> None:
    """Compare two collections row by row; exit 1 on FAIL (REVIEW exits 0 but says so)."""
    left, right = read_collection(lhs), read_collection(rhs)
    target = out if out is not None else runs_dir() / "logits-check.json"
    result = _compare_and_write(left, right, prefix_of(lhs), prefix_of(rhs), target, max_abs, rel_l2, kv_max_abs,
                                _console())
    _finish_exit(result)


@app.command("run")
def run_cmd(
    suite: SuiteName = typer.Option(..., "--suite", help=_SUITE_HELP),
    out: Optional[Path] = typer.Option(None, "--out", help="Output folder (default: runs/logits-SUITE)."),
    execution: Optional[Execution] = typer.Option(None, "--execution", help="Engine side: eager or graph."),
    attention: Optional[Attention] = typer.Option(None, "--attention", help="Engine side attention backend."),
    tp: Optional[int] = typer.Option(None, "--tp", help="Engine side tensor_parallel_size "
                                     "(default 1; the tp suite's default is 2, against 1)."),
    ref_execution: Execution = typer.Option(Execution.eager, "--ref-execution",
                                            help="kv suite: the reference engine's execution."),
    ref_attention: Optional[Attention] = typer.Option(None, "--ref-attention", help="kv suite: the reference "
                                                      "engine's attention backend (default: the same as --attention)."),
    device: Device = typer.Option(Device.auto, "--device", help="auto, cpu or cuda."),
    dtype: DType = typer.Option(DType.auto, "--dtype", help="auto (the model's), float32, bfloat16 or float16."),
    model: Optional[str] = typer.Option(None, "--model", help="Model folder (default: $MODEL_DIR or the tiny model)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the forced continuation ids."),
    max_abs: Optional[float] = typer.Option(None, "--max-abs", help="Per-row max |diff| gate (default by dtype)."),
    rel_l2: Optional[float] = typer.Option(None, "--rel-l2", help="Per-row rel-L2 gate (default by dtype)."),
    kv_max_abs: Optional[float] = typer.Option(None, "--kv-max-abs", help="New-K/V max |diff| gate (default by dtype)."),
) -> None:
    """Collect both sides (engine vs hf; tp: TP=2 vs TP=1; kv: engine vs engine) and compare them."""
    suite_name = _val(suite)
    s = get_suite(suite_name)
    dev = resolve_device(device)
    model_dir = resolve_model(model)
    folder = Path(out) if out is not None else runs_dir() / f"logits-{suite_name}"
    console = _console()
    exe, att = _val(execution), _val(attention)
    if s.reference == "tp":
        tp_l = 2 if tp is None else tp
        _check_tp(tp_l)
        if tp_l == 1:
            raise LabkitError("--tp 1: the tp suite compares TP>1 against TP=1; give --tp 2 (or more)")
        plan = [("engine", f"tp{tp_l}", exe, att, tp_l), ("engine", "tp1", exe, att, 1)]
    elif s.reference == "engine":
        _check_tp(tp or 1)
        ref_att = _val(ref_attention) or att
        plan = [("engine", "engine", exe, att, tp or 1), ("engine", "engine-ref", ref_execution.value, ref_att, 1)]
    else:
        _check_tp(tp or 1)
        plan = [("engine", "engine", exe, att, tp or 1), ("hf", "hf", None, None, 1)]
    cols, prefixes = [], []
    for backend, name, e, a, t in plan:
        console.print(f"[bold]collect[/bold] {name}: backend {backend}" + (f", execution {e or 'eager'}, attention "
                      f"{a or 'auto'}, TP {t}" if backend == "engine" else ""))
        col = _collect(backend, suite_name, model_dir, dev, dtype.value, e, a, t, seed, console=console)
        js, npz = write_collection(col, folder / name)
        _print_collection(col, js, npz, console)
        cols.append(col)
        prefixes.append(folder / name)
    result = _compare_and_write(cols[0], cols[1], prefixes[0], prefixes[1], folder / "check.json", max_abs, rel_l2,
                                kv_max_abs, console)
    _finish_exit(result)
