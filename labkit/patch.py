"""`labkit patch`: the experiment and fault patches in patches/ (git apply format), listed with their state,
applied and reverted on the project's engine.

    labkit patch list                     # every patch: kind, what it changes, applied / applies / conflicts
    labkit patch show NAME                # the index entry and the diff
    labkit patch apply NAME               # git apply, after a dry run; refuses a patch that does not apply
    labkit patch revert NAME              # git apply -R, after a dry run
    labkit patch prove --all              # every fault: its check passes without it and fails with it

NAME is the file name with or without `.patch`. The index is the table in patches/README.md (name, kind,
what it changes, how to see it, caught by). Exit 0 on success, 2 when a patch is unknown or does not
apply cleanly; `prove` exits 1 when a fault is not proven caught (labkit/patch_prove.py says how).
"""
from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from labkit.errors import LabkitError
from labkit.narrow import fit, log_console
from labkit.options import JsonOption, Out
from labkit.output import print_json, project_root

app = typer.Typer(help="List, apply and revert the experiment and fault patches in patches/.\n\n"
                       "Example: labkit patch apply fault-slot-off-by-one",
                  no_args_is_help=True)
PatchName = Annotated[str, typer.Argument(metavar="NAME", help="Patch name (with or without .patch).")]


@dataclass
class PatchEntry:
    name: str
    path: Path
    kind: str = "-"
    what: str = "-"
    how: str = "-"
    caught_by: str = ""     # the check that catches a fault: `trace CASE INVARIANT`, `test NODEID`, `logits SUITE`


def patch_dir() -> Path:
    return project_root() / "patches"


def index() -> list[PatchEntry]:
    """Every *.patch file, with its row of patches/README.md where there is one."""
    rows: dict[str, list[str]] = {}
    readme = patch_dir() / "README.md"
    if readme.is_file():
        for line in readme.read_text(encoding="utf-8").splitlines():
            m = re.match(r"^\|\s*([\w.-]+\.patch)\s*\|(.*)\|\s*$", line)
            if m:
                cells = [c.strip() for c in m.group(2).split("|")]
                rows[m.group(1)] = (cells + ["-"] * 3)[:3] + (cells[3:4] or [""])
    out = []
    for path in sorted(patch_dir().glob("*.patch")):
        kind, what, how, caught_by = rows.get(path.name, ["-", "-", "-", ""])[:4]
        out.append(PatchEntry(path.name, path, kind, what, how, caught_by.replace("`", "").strip()))
    return out


def find(name: str) -> PatchEntry:
    entries = index()
    want = name if name.endswith(".patch") else name + ".patch"
    for e in entries:
        if e.name == want:
            return e
    known = ", ".join(e.name[:-6] for e in entries) or "none"
    raise LabkitError(f"patch: no patch named {name!r} in {patch_dir()} (known: {known})")


def _git_apply(entry: PatchEntry, *flags: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "apply", *flags, str(entry.path)], cwd=project_root(), capture_output=True,
                              text=True, timeout=60)
    except FileNotFoundError:
        raise LabkitError("patch: git is not installed (it applies the patches)") from None


def state(entry: PatchEntry) -> str:
    """applied (it reverts cleanly), applies (it applies cleanly), or conflicts."""
    if _git_apply(entry, "-R", "--check").returncode == 0:
        return "applied"
    if _git_apply(entry, "--check").returncode == 0:
        return "applies"
    return "conflicts"


def _first_error(proc: subprocess.CompletedProcess) -> str:
    lines = [x for x in (proc.stderr or proc.stdout or "").splitlines() if x.strip()]
    return lines[0].strip() if lines else f"git apply exited {proc.returncode}"


# The terminal width from which `patch list` and `patch prove` are one table; narrower, each patch is a
# block of lines.
WIDE_LIST = 160
_STATE_STYLE = {"applied": "yellow", "conflicts": "red", "applies": "green"}


@app.command("list")
def list_cmd(as_json: JsonOption = False) -> None:
    """Every patch with its kind, what it changes, and whether it is applied now.

    Example: labkit patch list
    """
    if as_json:
        print_json([{"name": e.name[:-6], "kind": e.kind, "state": state(e), "what": e.what, "how": e.how}
                    for e in index()])
        return
    console = Console()
    entries = [(e, state(e)) for e in index()]
    if console.width >= WIDE_LIST:
        table = Table(title=f"patches in {patch_dir()}", title_justify="left")
        for col in ("patch", "kind", "state"):
            table.add_column(col, no_wrap=True)
        for col in ("what it changes", "how to see it"):
            table.add_column(col, overflow="fold")
        for e, st in entries:
            table.add_row(e.name[:-6], e.kind, Text(st, style=_STATE_STYLE.get(st, "")), e.what, e.how)
        console.print(table)
        return
    # Narrower: a block per patch, its two sentences at the full width (in table columns they fold mid-word).
    console.print(Text(f"patches in {patch_dir()}", style="italic"))
    for e, st in entries:
        _print_block(console, Text.assemble((e.name[:-6], "bold"), f"  {e.kind}  ", (st, _STATE_STYLE.get(st, ""))),
                     [("what", e.what), ("see", e.how)])


def _print_block(console: Console, head: Text, rows: list[tuple[str, str | Text]]) -> None:
    """A patch as a block of lines: its head, then each (label, text) indented, the text wrapped on spaces at
    the full width (in table columns it folds mid-word)."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, style="dim")
    grid.add_column()
    for label, text in rows:
        grid.add_row(f"  {label}", text)
    console.print(head)
    console.print(grid)


@app.command("show")
def show_cmd(name: PatchName) -> None:
    """The index entry and the diff.

    Example: labkit patch show fault-slot-off-by-one
    """
    e = find(name)
    console = Console()
    console.print(f"[bold]{e.name}[/] ({e.kind}, {state(e)})\n  what: {e.what}\n  see:  {e.how}\n")
    console.print(e.path.read_text(encoding="utf-8"), markup=False, highlight=False)


def _apply(name: str, reverse: bool) -> None:
    e = find(name)
    flags = ("-R",) if reverse else ()
    if reverse and state(e) != "applied":
        raise LabkitError(f"patch: {e.name} is not applied, nothing to revert")
    if not reverse and state(e) == "applied":
        raise LabkitError(f"patch: {e.name} is already applied (labkit patch revert {e.name[:-6]})")
    dry = _git_apply(e, *flags, "--check")
    if dry.returncode:
        raise LabkitError(f"patch: {e.name} does not {'revert' if reverse else 'apply'} cleanly: {_first_error(dry)}")
    done = _git_apply(e, *flags)
    if done.returncode:
        raise LabkitError(f"patch: git apply {' '.join(flags)} failed: {_first_error(done)}")
    verb = "reverted" if reverse else "applied"
    Console().print(f"{verb} {e.name}" + ("" if reverse else f"; see it with: {e.how}"))


@app.command("apply")
def apply_cmd(name: PatchName) -> None:
    """Apply a patch to the project's engine (after a dry run).

    Example: labkit patch apply fault-slot-off-by-one
    """
    _apply(name, reverse=False)


@app.command("revert")
def revert_cmd(name: PatchName) -> None:
    """Take an applied patch back out (after a dry run).

    Example: labkit patch revert fault-slot-off-by-one
    """
    _apply(name, reverse=True)


@app.command("prove")
def prove_cmd(
    name: Optional[str] = typer.Argument(None, metavar="NAME",
                                         help="A fault patch (with or without .patch); or --all."),
    all_: bool = typer.Option(False, "--all", help="Every fault patch in the index."),
    jobs: int = typer.Option(2, "--jobs", "-j", min=1, help="Checks run at the same time."),
    out: Out("Folder for prove.json (default: runs/patch-prove).") = None,
) -> None:
    """Each fault's check passes on the clean engine and fails with the patch (in temporary trees, on CPU).

    Example: labkit patch prove fault-slot-off-by-one
    """
    from labkit import patch_prove
    from labkit.model import default_model_dir, resolve_model
    from labkit.output import EXIT_FAIL, EXIT_PASS, envelope, finish, runs_dir, write_json

    if (name is None) == (not all_):
        raise LabkitError("patch prove: give one patch NAME or --all")
    entries = [e for e in index() if e.kind == "fault"] if all_ else [find(name)]
    if not all_ and entries[0].kind != "fault":
        raise LabkitError(f"patch prove: {entries[0].name} is {entries[0].kind!r}, not a fault: there is nothing "
                          "to catch (an experiment changes what a case expects; see `labkit trace` CHANGED)")
    if not entries:
        raise LabkitError(f"patch prove: no fault patches in {patch_dir()}/README.md")
    console = log_console(WIDE_LIST)  # a CI log without COLUMNS gets the table
    model = resolve_model(default_model_dir())
    env = envelope("patch prove", device="cpu", model_dir=model, evidence="cpu-executed")
    t0 = time.perf_counter()
    with patch_prove.work_dir() as work:
        console.print(f"proving {len(entries)} fault patch(es) in {work}, {jobs} check(s) at a time ...")
        proofs, facts = patch_prove.prove(entries, project_root(), model, Path(work), jobs,
                                          progress=lambda msg: console.print(f"  [dim]{msg}[/dim]"))
    wall = time.perf_counter() - t0
    caught = sum(p.result == "CAUGHT" for p in proofs)
    verdict = "PASS" if caught == len(proofs) else "FAIL"
    print_proofs(proofs, facts, console)
    if facts["note"]:
        console.print(f"note: {facts['note']}")
    result = finish(env, verdict=verdict, passed=verdict == "PASS", proofs=[p.to_dict() for p in proofs],
                    wall_s=round(wall, 1), **facts)
    path = write_json((out or runs_dir() / "patch-prove") / "prove.json", result)
    style = "green" if verdict == "PASS" else "red"
    console.print(f"[{style}]{verdict}[/]: {caught} of {len(proofs)} fault patch(es) proven caught "
                  f"({wall:.0f} s); {path}")
    raise typer.Exit(EXIT_PASS if verdict == "PASS" else EXIT_FAIL)


def print_proofs(proofs, facts: dict, console: Console) -> None:
    """The proofs: a table from WIDE_LIST columns on, else a line per patch and its result, and its check,
    runs and why below it."""
    title = (f"fault patches against {facts['engine_source']}"
             + (f" {facts['commit'][:12]}" if facts["commit"] else ""))
    if console.width >= WIDE_LIST:
        table = Table(title=title, title_justify="left")
        for col in ("patch", "caught by", "clean", "patched", "result"):
            table.add_column(col, no_wrap=col in ("patch", "result"), overflow="fold")
        table.add_column("why", overflow="fold")
        for p in proofs:
            table.add_row(p.patch, p.check or "-", _run_cell(p.clean), _run_cell(p.patched),
                          Text(p.result, style=_result_style(p.result)), Text(p.why[:160]))
        fit(table, console)
        console.print(table)
        return
    # Narrower: the six columns fold the check's node id and the why mid-word.
    console.print(Text(title, style="italic"))
    for p in proofs:
        _print_block(console, Text.assemble((p.patch, "bold"), "  ", (p.result, _result_style(p.result))),
                     [("check", Text(p.check or "-")),
                      ("runs", f"clean {_run_cell(p.clean)}, patched {_run_cell(p.patched)}"),
                      ("why", Text(p.why or "-"))])


def _result_style(result: str) -> str:
    return "green" if result == "CAUGHT" else "red"


def _run_cell(run) -> str:
    if run is None:
        return "-"
    return ("timed out" if run.rc is None else "passes" if run.rc == 0 else "fails" if run.rc == 1
            else f"exit {run.rc}") + f" ({run.seconds:.0f} s)"
