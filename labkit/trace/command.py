"""`labkit trace`: run a case through the engine with tracing on, show each step, judge it.

    labkit trace --case chunk                 # run, table, validate; exit 1 on a mismatch
    labkit trace --case chunk --wide          # the table with every model input, for a wide terminal
    labkit trace --case lifecycle --max-num-batched-tokens 100   # an experiment: the case is a diff
    labkit trace check runs/trace-chunk/events.jsonl --case chunk   # re-validate a saved log
    labkit trace diff BEFORE.jsonl AFTER.jsonl   # two runs side by side, first divergence marked
    labkit trace --url http://127.0.0.1:8000 --seconds 10   # a running server's steps (serve --live-trace), every
                                                           # invariant checked on them

The table: a line per step (its phase, the tokens it computed out of the budget, free KV blocks before and
after), under it a line per request: what the row computes (prefill, prefill chunk, decode; a step may mix
them), its new tokens, the KV it holds before and after the forward out of its length, its outputs and the
token sampled, its status and blocks. It fits an 80-column terminal; --wide gives the raw counts and the
model inputs (positions, cu_seqlens, context lens) in one row per step.

Verdicts: every invariant always gates (FAIL, exit 1). The case's expected states gate too, unless
the run was meant to change them: an override (an engine option that changes the schedule:
--max-num-batched-tokens, --kvcache-block-size, --scheduling-policy, --max-num-seqs, --num-kvcache-blocks,
--enforce-eager/--no-enforce-eager, --tensor-parallel-size), an engine that differs from its git HEAD (a patch
applied), or
--expect-changes. Then the states the run did not reach are shown as a diff and the verdict is
CHANGED (exit 0); for an engine edit the text says that a change meant to keep behaviour is judged
with --no-expect-changes (a FAIL there). An engine outside a git checkout cannot be compared with HEAD: it counts as
unchanged (and says so), so pass --expect-changes after changing it. --no-expect-changes makes the
case's states gate whatever changed (the mutation script uses it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from labkit.engine_args import EngineArgs
from labkit.errors import LabkitError
from labkit.narrow import fit, hanging
from labkit.options import (
    AsyncSchedulingOption,
    Device,
    DeviceOption,
    EnforceEagerOption,
    JsonOption,
    KvcacheBlockSizeOption,
    KvCacheDtypeOption,
    MaxNumBatchedTokensOption,
    MaxNumSeqsOption,
    ModelOption,
    NumKvcacheBlocksOption,
    Out,
    SchedulingPolicyOption,
    TensorParallelSizeOption,
    check_url,
)
from labkit.output import (
    EXIT_CANNOT_RUN,
    EXIT_FAIL,
    EXIT_PASS,
    configuration_suffix,
    envelope,
    evidence_for,
    finish,
    print_json,
    resolve_device,
    runs_dir,
    write_json,
)
from labkit.trace.cases import Case, list_cases, load_case
from labkit.trace.events import EventLog, read_jsonl, seq_entries
from labkit.trace.run import engine_changes
from labkit.trace.tables import case_mismatch, compact_steps, config_differences, diff_rows, steps_table, write_tsv
from labkit.trace.validate import Report, change_text, validate, validate_log

app = typer.Typer(help="Run a traced case, show every step, and check it against expected states.\n\n"
                       "An engine option (Engine panel) overrides the case's value: the run is then an experiment, "
                       "its differences from the case are shown as a diff and the verdict is CHANGED (exit 0). "
                       "Every invariant always gates (FAIL, exit 1). --device left out: the case's engine.device, "
                       "else auto.\n\n"
                       "--url URL --seconds N records a running server's steps instead (labkit serve --live-trace) "
                       "and checks every invariant on them.\n\n"
                       "Example: labkit trace --case chunk --max-num-batched-tokens 100",
                  invoke_without_command=True, no_args_is_help=False)


# What a live window prints of its steps (every step is in its steps.tsv and events.jsonl): a running server takes
# hundreds of steps a second with hundreds of rows each (the H200's lab plan: 4,651 steps in 10 s, the terminal
# table alone 100 s of the trace's time).
LIVE_STEPS_SHOWN = 4
LIVE_ROWS_SHOWN = 16


def _print_steps(events: list[dict], console: Console, title: str, wide: bool = False,
                 last_steps: int | None = None, max_rows: int | None = None) -> None:
    """Every step's rows, or (a live window) its last `last_steps` steps with at most `max_rows` rows each, and a
    line saying what was left out and where it is."""
    if wide:
        _print_steps_wide(events, console, title, last_steps)
        return
    console.print(Text(title, style="bold"))
    steps = compact_steps(events)
    left_out = max(0, len(steps) - last_steps) if last_steps is not None else 0
    steps = steps[left_out:]
    cut = {st["step"]: max(0, len(st["rows"]) - max_rows) if max_rows is not None else 0 for st in steps}
    header = ("id", "row", "new", "KV cached", "outputs", "status", "blocks")
    cells = {st["step"]: [_compact_cells(r) for r in st["rows"][:len(st["rows"]) - cut[st["step"]]]]
             for st in steps}
    # One grid per step, all with the same column widths, so the step's own line sits between them and the
    # columns still line up down the whole run.
    widths = [max([cell_len(h)] + [cell_len(row[i]) for rows in cells.values() for row in rows])
              for i, h in enumerate(header)]

    def grid(rows, style=None):
        table = Table(box=None, show_header=False, padding=(0, 1), pad_edge=True, collapse_padding=True)
        for i, w in enumerate(widths):
            table.add_column(min_width=w, justify="right" if i in (2, 6) else "left")
        for row in rows:
            table.add_row(*row, style=style)
        return table

    console.print(grid([header], style="bold dim"))
    for st in steps:
        console.print(Text(_step_line(st), style="bold"))
        console.print(grid(cells[st["step"]]))
        if cut[st["step"]]:
            console.print(Text(f"  ... {cut[st['step']]} more row(s) of step {st['step']}", style="dim"))
    if left_out or any(cut.values()):
        console.print(Text(f"(the last {len(steps)} of {left_out + len(steps)} steps shown, at most {max_rows} rows "
                           f"each: every step is in steps.tsv)", style="dim"))


def _step_line(st: dict) -> str:
    parts = [f"step {st['step']}", str(st["phase"]),
             f"{st['tokens']} of {st['budget']} tokens" if st["budget"] is not None else f"{st['tokens']} tokens"]
    if st["execution"] == "graph":
        parts.append(f"CUDA graph, batch {st['graph_batch']}")
    parts.append(f"free blocks {_dash(st['free_before'])} → {_dash(st['free_after'])}")
    return " · ".join(parts)


def _compact_cells(r: dict) -> list[str]:
    if r["cached_after"] is not None:
        kv = f"{r['cached_before']} → {r['cached_after']} of {r['total']}"
    else:
        kv = "-"
    if r["accepted"] is True:
        outs = f"{r['outputs']} (+{r['token']})"
    elif r["accepted"] is False:
        outs = f"{r['outputs']} (dropped)"
    else:
        outs = _dash(r["outputs"])
    return [r["id"], r["kind"], str(r["new"]), kv, outs, _dash(r["status"]), _dash(r["blocks"])]


def _shown(path: Path) -> str:
    """A path as short as it can be said: relative to the working folder when it is inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _dash(v) -> str:
    return "-" if v is None else str(v)


def _print_steps_wide(events: list[dict], console: Console, title: str, last_steps: int | None = None) -> None:
    table = Table(title=title, show_lines=False, header_style="bold")
    for col in ("step", "phase", "scheduled (id total/cached/sched/blocks)", "model inputs", "preempted",
                "after postprocess (id total/cached/outputs status blocks)", "free"):
        table.add_column(col, overflow="fold")
    rows = steps_table(events)
    left_out = max(0, len(rows) - last_steps) if last_steps is not None else 0
    if left_out:
        table.caption = f"the last {len(rows) - left_out} of {len(rows)} steps: every step is in steps.tsv"
    for row in rows[left_out:]:
        table.add_row(str(row["step"]), str(row["phase"]), row["scheduled"], row["inputs"], row["preempted"],
                      row["after"], str(row["free"]))
    console.print(table)


_STYLE = {"PASS": "green", "CHANGED": "yellow", "RECORDED": "cyan", "FAIL": "red"}


def _steps_past_the_case(report: Report, case: Case | None) -> str:
    """The steps a run took after the last step its case expects ("" when none or nothing to say): no
    expectation covers them, so without this line a longer run looks like a shorter diff."""
    last = max((x["step"] for x in (case.expect or []) if isinstance(x.get("step"), int)), default=None) \
        if case is not None else None
    if last is None or report.steps <= last:
        return ""
    extra = f"step {last + 1}" if report.steps == last + 1 else f"steps {last + 1}-{report.steps}"
    return f"  {extra}: not in the case (its expected states end at step {last}; the run took {report.steps})"


def _print_report(report: Report, console: Console, case: Case | None = None) -> None:
    failures = report.gating_failures
    for check in failures[:20]:
        console.print(f"[red]FAIL[/red] {check.message}", markup=True, highlight=False)
    if len(failures) > 20:
        console.print(f"... and {len(failures) - 20} more failures")
    changes = report.changes
    if changes:
        head = ("changed from the case" if report.verdict == "CHANGED" or report.expect_changes
                else "[red]differs from the case[/red] (changes were not expected; --expect-changes if they were)")
        console.print(f"{head}: {len(changes)} difference(s)")
        by_step: dict[str, list[str]] = {}
        for c in changes:
            where, what = change_text(c).split(": ", 1)
            by_step.setdefault(where, []).append(what)
        first = change_text(changes[0])
        console.print(hanging("first cause ", f"({report.why_changes or 'no reason recorded'}): {first}; the "
                              "differences below start there"))
        # A line per step, its differences wrapped under their start: at 80 columns a step's line takes several.
        for where, whats in by_step.items():
            console.print(hanging(f"  {where}: ", "; ".join(whats)))
        past = _steps_past_the_case(report, case)
        if past:
            where, what = past.split(": ", 1)
            console.print(hanging(f"{where}: ", what))
    console.print(f"[{_STYLE[report.verdict]}]{report.summary()}[/]")


# Overrides that must not change a single state: the run is judged strictly against the case (an FP8 pool
# changes the numbers, never the schedule: the cases fix their block counts).
_STATE_NEUTRAL = ("async_scheduling", "kv_cache_dtype")


def changes_expected(overrides: EngineArgs, flag: bool | None) -> tuple[bool, str]:
    """Whether a run is meant to differ from its case, and why (shown beside the verdict)."""
    if flag is not None:
        return flag, "--expect-changes" if flag else "--no-expect-changes: the case's states gate"
    given = overrides.described(skip=_STATE_NEUTRAL)
    changed, how = engine_changes()
    why = []  # (an edited engine first: a summary that has to shorten the reason keeps it)
    if changed:
        why.append(how)
    if given:
        why.append("override " + ", ".join(given))
    if why:
        return True, "; ".join(why)
    if changed is None:
        return False, f"engine changes unknown ({how}): judged as unchanged; --expect-changes after changing it"
    return False, ""


def _device(flag: Optional[Device], case: Case) -> str:
    """--device when given, else the case's engine.device (a case written for the CPU runs there), else auto.
    A case that asks for cuda on a machine without one cannot run: said so, naming the case's key."""
    if flag is not None:
        return resolve_device(flag)
    asked = case.engine.get("device", "auto")
    try:
        return resolve_device(asked)
    except LabkitError:
        raise LabkitError(f"{case.path or case.name}: engine.device: {asked!r}, but no CUDA GPU is visible to "
                          "torch (give --device cpu to run it here)") from None


def _outputs(out_dir: Path, events: list[dict], report: Report, env: dict, extra: dict) -> dict:
    tsv = write_tsv(events, out_dir / "steps.tsv")
    result = finish(env, verdict=report.verdict, passed=report.passed, judged=report.judged, report=report.to_dict(),
                    files={"events": str(out_dir / "events.jsonl"), "tsv": str(tsv)}, **extra)
    write_json(out_dir / "check.json", result)
    (out_dir / "check.md").write_text(check_markdown(result, report), encoding="utf-8")
    return result


def check_markdown(result: dict, report: Report) -> str:
    """check.json's twin for a person: the verdict, its counts, the differences from the case or the failures."""
    # A live window has no case: it is named by the server it recorded.
    what = result.get("case") or (f"--url {result.get('url')}" if result.get("live") else "?")
    lines = [f"# trace {what}: {report.verdict}", "",
             f"{report.summary()}", "",
             f"- command: `{' '.join(result.get('argv') or [])}`",
             f"- device: {(result.get('device') or {}).get('type')} ({(result.get('device') or {}).get('name')}), "
             f"evidence {result.get('evidence')}",
             f"- commit: {result.get('git_head')}{' (dirty)' if result.get('git_dirty') else ''}",
             f"- steps: {report.steps}; files: events.jsonl (the log), steps.tsv, check.json", ""]
    if report.changes:
        lines += [f"## Differences from the case ({len(report.changes)})", ""]
        lines += [f"- {change_text(c)}" for c in report.changes] + [""]
    failures = report.gating_failures
    if failures:
        lines += [f"## Failures ({len(failures)})", ""] + [f"- {c.message}" for c in failures[:50]] + [""]
    return "\n".join(lines)


@app.callback()
def trace(
    ctx: typer.Context,
    case: Optional[str] = typer.Option(None, "--case", help="Case name in workloads/cases/ or a YAML path."),
    url: Optional[str] = typer.Option(None, "--url", help="Instead of a case: record a running server's engine "
                                      "steps (labkit serve --live-trace) for --seconds into events.jsonl and "
                                      "check every invariant on them."),
    seconds: float = typer.Option(10.0, "--seconds", min=0.1, max=3600.0, help="With --url: how long to record."),
    model: ModelOption = None,
    device: DeviceOption = None,  # None: the case's engine.device, else auto (_device)
    out: Out("Output folder (default: runs/trace-CASE, then -OPTION-VALUE for each option given that changes the "
             "run, e.g. runs/trace-chunk-max-num-batched-tokens-100).") = None,
    shapes: bool = typer.Option(False, "--shapes", help="Also record model_shape events for layer 0."),
    perfetto: Optional[Path] = typer.Option(None, "--perfetto",
                                            help="Write a Chrome trace-event JSON for ui.perfetto.dev."),
    max_num_batched_tokens: MaxNumBatchedTokensOption = None,
    max_num_seqs: MaxNumSeqsOption = None,
    kvcache_block_size: KvcacheBlockSizeOption = None,
    num_kvcache_blocks: NumKvcacheBlocksOption = None,
    scheduling_policy: SchedulingPolicyOption = None,
    enforce_eager: EnforceEagerOption = None,
    tensor_parallel_size: TensorParallelSizeOption = None,
    async_scheduling: AsyncSchedulingOption = None,
    kv_cache_dtype: KvCacheDtypeOption = None,
    expect_changes: Optional[bool] = typer.Option(
        None, "--expect-changes/--no-expect-changes",
        help="Whether this run is meant to differ from the case's expected states (default: yes with an "
             "override or an engine that differs from git HEAD). Differences are then a diff, verdict CHANGED."),
    list_: bool = typer.Option(False, "--list", help="List the shipped cases and exit."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No per-step table."),
    wide: bool = typer.Option(False, "--wide", help="The per-step table with every model input (positions, "
                                                     "cu_seqlens, context lens), for a wide terminal."),
    as_json: JsonOption = False,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    console = Console(quiet=as_json)
    if list_:
        for name in list_cases():
            c = load_case(name)
            # The description's continuation lines indented under its start, not back under the names.
            console.print(hanging(f"{name}: ", f"{c.about}{'' if c.judged else ' (recorded, not judged)'}",
                                  label_style="bold"))
        raise typer.Exit(EXIT_PASS)
    if url is not None:
        if case is not None:
            raise LabkitError("trace: give --case or --url, not both")
        url = check_url("--url", url)
        given = EngineArgs.given(ctx, device=None).given_flags() + [
            flag for flag, v in (("--shapes", shapes or None), ("--model", model), ("--device", device),
                                 ("--expect-changes" if expect_changes else "--no-expect-changes", expect_changes))
            if v is not None]
        if given:
            raise LabkitError(f"{', '.join(given)}: settings of a run this command makes; with --url the server "
                              "runs already (set them on labkit serve)")
        _trace_url(url, seconds, out, console, as_json, quiet, wide, perfetto)
    if ctx.get_parameter_source("seconds").name == "COMMANDLINE":
        raise LabkitError("--seconds: how long --url records a running server; a --case run takes its own steps")
    if case is None:
        raise LabkitError("trace: give --case NAME|PATH (see labkit trace --list) or --url URL")
    from labkit.model import resolve_model
    from labkit.trace.perfetto import write_perfetto
    from labkit.trace.run import run_case

    the_case = load_case(case)
    model_dir = resolve_model(model)
    dev = _device(device, the_case)
    out_dir = out or runs_dir() / f"trace-{the_case.name}{configuration_suffix(skip=('case',))}"
    # The engine settings given override the case's (the device is the run's own, not the case's).
    overrides = EngineArgs.given(ctx, device=None)
    env = envelope("trace", device=dev, model_dir=model_dir, evidence=evidence_for(dev))
    expected, why = changes_expected(overrides, expect_changes)
    run = run_case(the_case, model_dir, out_dir / "events.jsonl", overrides=overrides.kwargs(), device=dev,
                   shapes=shapes,
                   context={"expect_changes": expected, "why_changes": why, "case": the_case.name})
    report = validate(run.events, the_case, expect_changes=expected, why_changes=why)
    if not quiet:
        _print_steps(run.events, console, f"case {the_case.name}: {the_case.about}", wide)
    if shapes:
        _print_shapes(run.events, console)
    extra = {"case": the_case.name, "engine": run.engine_kwargs, "num_kvcache_blocks": run.num_kvcache_blocks,
             "wall_s": run.wall_s, "steps": report.steps}
    if perfetto is not None:
        extra["files_perfetto"] = str(write_perfetto(run.events, perfetto))
    result = _outputs(out_dir, run.events, report, env, extra)
    if as_json:
        print_json(result)
    _print_report(report, console, the_case)
    if why and report.verdict != "CHANGED":
        console.print(f"({why})", markup=False, highlight=False)
    console.print(f"wrote {_shown(out_dir)}/: events.jsonl (the log), steps.tsv, check.json and check.md"
                  + (f"; perfetto {_shown(perfetto)}" if perfetto else ""), markup=False, highlight=False)
    raise typer.Exit(EXIT_PASS if report.passed else EXIT_FAIL)


def _trace_url(url: str, seconds: float, out: Path | None, console: Console, as_json: bool, quiet: bool,
               wide: bool, perfetto: Path | None) -> None:
    """--url: record a live window, validate it, write the run's files; exits."""
    from labkit.trace.live import record
    from labkit.trace.perfetto import write_perfetto

    out_dir = out or runs_dir() / "trace-live"
    console.print(f"recording {url}'s engine steps for {seconds:g} s ...", highlight=False)
    events = record(url, seconds, out_dir / "events.jsonl")
    report = validate(events)
    start = next((e for e in events if e.get("event") == "run_start"), {})
    device = start.get("device", "cpu")
    env = envelope("trace", device=device, model_dir=(start.get("model") or {}).get("path"),
                   evidence="gpu-measured" if str(device).startswith("cuda") else "cpu-executed")
    opened = next((e for e in events if e.get("event") == "live_state" and e.get("kind") == "open"), {})
    steps = sorted({e["step"] for e in events if e.get("event") == "after_postprocess"})
    extra = {"live": True, "url": url, "seconds": seconds, "steps": len(steps),
             "first_step": steps[0] if steps else None, "last_step": steps[-1] if steps else None,
             "live_at_open": len(seq_entries(opened)),
             "policy": (start.get("config") or {}).get("scheduling_policy"),
             "tp": start.get("tp_size"), "case": None}
    if perfetto is not None:
        extra["files_perfetto"] = str(write_perfetto(events, perfetto))
    if not quiet and steps:
        _print_steps(events, console, f"{url}: steps {steps[0]}-{steps[-1]} of the running server", wide,
                     last_steps=LIVE_STEPS_SHOWN, max_rows=LIVE_ROWS_SHOWN)
    result = _outputs(out_dir, events, report, env, extra)
    if as_json:
        print_json(result)
    _print_report(report, console)
    console.print(f"{len(steps)} steps, {extra['live_at_open']} requests live when the window opened; wrote "
                  f"{_shown(out_dir)}/: events.jsonl, steps.tsv, check.json", markup=False, highlight=False)
    if not steps:
        # Nothing ran, so nothing was checked: a PASS here would vouch for steps no one saw.
        Console(stderr=True).print(f"trace --url: no engine step ran in the {seconds:g} s window, so nothing was "
                                   "checked; record while the server has requests to run (or a longer --seconds)",
                                   markup=False, highlight=False)
        raise typer.Exit(EXIT_CANNOT_RUN)
    raise typer.Exit(EXIT_PASS if report.passed else EXIT_FAIL)


def _print_shapes(events: list[dict], console: Console) -> None:
    start = next((e for e in events if e["event"] == "run_start"), {})
    size = start.get("tp_size", 1)
    title = "model shapes (layer 0), first step of each phase"
    if size and size > 1:
        title += f"; rank {start.get('tp_rank', 0)} of tensor_parallel_size={size} (per-rank shapes)"
    table = Table(title=title, header_style="bold")
    for col in ("step", "module", "shape"):
        table.add_column(col)
    phases_seen = set()
    phase_of = {e["step"]: e["phase"] for e in events if e["event"] == "scheduled"}
    last = "logits_shard" if any(e["event"] == "model_shape" and e["module"] == "logits_shard" for e in events) \
        else "logits"
    for e in events:
        if e["event"] != "model_shape":
            continue
        phase = phase_of.get(e["step"])
        if phase in phases_seen:
            continue
        if e["module"] == last:
            phases_seen.add(phase)
        table.add_row(str(e["step"]), e["module"], str(e["shape"]))
    console.print(table)
    if start.get("kv_bytes_per_token") is not None:
        console.print(f"KV cache: {start['kv_bytes_per_token']} bytes ({start['kv_bytes_per_token'] / 1024:g} KiB) "
                      f"per token per rank, {start.get('num_kvcache_blocks')} blocks of {start.get('block_size')}")


@app.command("check")
def check(
    log: Path = typer.Argument(..., metavar="LOG", help="A saved events.jsonl."),
    case: Optional[str] = typer.Option(None, "--case", help="Judge against this case's expectations too."),
    out: Out("Where to write the check JSON (default: check-replay.json beside the log).") = None,
    expect_changes: Optional[bool] = typer.Option(
        None, "--expect-changes/--no-expect-changes",
        help="Whether the run was meant to differ from the case (default: what the run decided, from the "
             "log's trace_context event; no when the log has none). Differences are then a diff, verdict CHANGED."),
    as_json: JsonOption = False,
) -> None:
    """Re-validate a saved log without running a model.

    Example: labkit trace check runs/trace-chunk/events.jsonl --case chunk
    """
    console = Console(quiet=as_json)
    if not log.is_file():
        raise LabkitError(f"trace check: no such log {log}")
    the_case = load_case(case) if case else None
    # Streamed: a step's events are read when it is checked (a million-line log in bounded memory).
    events = EventLog.from_file(log)
    if expect_changes is None:   # judge the way the run was judged (what it was meant to change travels in the log)
        ctx = events.trace_context or {}
        expect_changes, why = bool(ctx.get("expect_changes")), str(ctx.get("why_changes") or "")
    else:
        why = "--expect-changes" if expect_changes else "--no-expect-changes: the case's states gate"
    report = validate_log(events, the_case, expect_changes=expect_changes, why_changes=why)
    start = events.run_start
    model_dir = (start.get("model") or {}).get("path")
    env = envelope("trace check", device=start.get("device", "cpu"), model_dir=model_dir, evidence="simulated")
    result = finish(env, verdict=report.verdict, passed=report.passed, judged=report.judged,
                    report=report.to_dict(), log=str(log), case=the_case.name if the_case else None)
    write_json(out or log.with_name("check-replay.json"), result)
    if as_json:
        print_json(result)
    _print_report(report, console, the_case)
    raise typer.Exit(EXIT_PASS if report.passed else EXIT_FAIL)


@app.command("diff")
def diff(
    log_a: Path = typer.Argument(..., metavar="LOG_A", help="The first event log (before)."),
    log_b: Path = typer.Argument(..., metavar="LOG_B", help="The second event log (after)."),
) -> None:
    """Two event logs of a case side by side, step by step, with the first divergence marked (a view: exit 0).

    Example: labkit trace diff runs/before/events.jsonl runs/trace-chunk/events.jsonl
    """
    a, b = read_jsonl(log_a), read_jsonl(log_b)
    console = Console()
    mismatch = case_mismatch(a, b)
    if mismatch:
        console.print(Text(f"warning: {mismatch}: not two runs of one case, so the steps below compare unrelated "
                           "states", style="yellow"))
    for line in config_differences(a, b):
        console.print(f"config: {line}", markup=False, highlight=False)
    rows, first = diff_rows(a, b)
    console.print(hanging("A = ", str(log_a)))
    console.print(hanging("B = ", str(log_b)))
    marks, sides = {}, {}
    for r in rows:
        marks[r["step"]] = (f"<- first divergence: {', '.join(r['differs'])}" if r["step"] == first
                            else ("differs: " + ", ".join(r["differs"]) if r["differs"] else ""))
        sides[r["step"]] = []
        for side in (r["a"], r["b"]):
            if side is None:
                sides[r["step"]] += ["(no such step)", ""]
            else:
                sides[r["step"]] += [f"{side['phase']} {side['scheduled']}" + (
                    f" preempted {side['preempted']}" if side["preempted"] else ""),
                    f"{side['outputs']} free {side['free']}"]
    # Headers wrap at their spaces, cells at theirs ("R1:64 R2:96"); where even that does not fit, a block per step.
    table = Table(header_style="bold")
    table.add_column("step", justify="right")
    for side in ("A", "B"):
        table.add_column(f"{side} phase, scheduled, preempted")
        table.add_column(f"{side} outputs, free")
    table.add_column("")
    for r in rows:
        style = "bold yellow" if r["step"] == first else ("yellow" if r["differs"] else None)
        table.add_row(str(r["step"]), *sides[r["step"]], marks[r["step"]], style=style)
    if fit(table, console):
        console.print(table)
    else:
        for r in rows:
            style = "bold yellow" if r["step"] == first else ("yellow" if r["differs"] else "")
            console.print(Text(f"step {r['step']} {marks[r['step']]}".rstrip(), style=style or "bold"))
            cells = sides[r["step"]]
            console.print(hanging("  A: ", "; ".join(c for c in cells[:2] if c)))
            console.print(hanging("  B: ", "; ".join(c for c in cells[2:] if c)))
    console.print("scheduled as id:tokens, outputs as id:count=last token (done: finished)", style="dim")
    if first is None:
        console.print(f"the two runs go through the same {len(rows)} steps (phase, scheduled, preempted, "
                      "outputs, free blocks)")
    else:
        console.print(f"first divergence at step {first}")
    raise typer.Exit(EXIT_PASS)
