"""`labkit patch`: the experiment and fault patches in patches/ (git apply format), listed with their state,
applied and reverted on the project's engine.

    labkit patch list                     # every patch: kind, what it changes, applied / applies / conflicts
    labkit patch show NAME                # the index entry and the diff
    labkit patch apply NAME               # git apply, after a dry run; refuses a patch that does not apply
    labkit patch revert NAME              # git apply -R, after a dry run

NAME is the file name with or without `.patch`. The index is the table in patches/README.md (name, kind,
what it changes, how to see it). Exit 0 on success, 2 when a patch is unknown or does not apply cleanly.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from labkit.errors import LabkitError
from labkit.output import JSON_OPTION, print_json, project_root

app = typer.Typer(help="List, apply and revert the experiment and fault patches in patches/.", no_args_is_help=True)


@dataclass
class PatchEntry:
    name: str
    path: Path
    kind: str = "-"
    what: str = "-"
    how: str = "-"


def patch_dir() -> Path:
    return project_root() / "patches"


def index() -> list[PatchEntry]:
    """Every *.patch file, with its row of patches/README.md where there is one."""
    rows: dict[str, tuple[str, str, str]] = {}
    readme = patch_dir() / "README.md"
    if readme.is_file():
        for line in readme.read_text(encoding="utf-8").splitlines():
            m = re.match(r"^\|\s*([\w.-]+\.patch)\s*\|(.*)\|\s*$", line)
            if m:
                cells = [c.strip() for c in m.group(2).split("|")]
                cells += ["-"] * (3 - len(cells))
                rows[m.group(1)] = (cells[0], cells[1], cells[2])
    out = []
    for path in sorted(patch_dir().glob("*.patch")):
        kind, what, how = rows.get(path.name, ("-", "-", "-"))
        out.append(PatchEntry(path.name, path, kind, what, how))
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


@app.command("list")
def list_cmd(as_json: bool = JSON_OPTION) -> None:
    """Every patch with its kind, what it changes, and whether it is applied now."""
    if as_json:
        print_json([{"name": e.name[:-6], "kind": e.kind, "state": state(e), "what": e.what, "how": e.how} for e in index()])
        return
    table = Table(title=f"patches in {patch_dir()}", title_justify="left")
    for col in ("patch", "kind", "state"):
        table.add_column(col, no_wrap=True)
    for col in ("what it changes", "how to see it"):
        table.add_column(col, overflow="fold")
    for e in index():
        st = state(e)
        table.add_row(e.name[:-6], e.kind, f"[{'yellow' if st == 'applied' else 'red' if st == 'conflicts' else 'green'}]"
                      f"{st}[/]", e.what, e.how)
    Console().print(table)


@app.command("show")
def show_cmd(name: str = typer.Argument(..., help="Patch name (with or without .patch).")) -> None:
    """The index entry and the diff."""
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
def apply_cmd(name: str = typer.Argument(..., help="Patch name (with or without .patch).")) -> None:
    """Apply a patch to the project's engine (after a dry run)."""
    _apply(name, reverse=False)


@app.command("revert")
def revert_cmd(name: str = typer.Argument(..., help="Patch name (with or without .patch).")) -> None:
    """Take an applied patch back out (after a dry run)."""
    _apply(name, reverse=True)
