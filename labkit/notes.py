"""`labkit notes`: lab notes in notes/ (tracked by git, unlike runs/), one per lab of the plan
(workloads/labs.yaml) or one per question from a template in notes/templates/.

    labkit notes init                              # notes/LAB.md for every lab of the plan: its command, the
                                                   # evidence it needs, its questions, TODO markers
    labkit notes list                              # the templates, and every lab's note: none / N TODO / written
    labkit notes new trace --title "why does R2 wait in step 3?"
                                                   # -> notes/2026-11-29-trace-why-does-r2-wait-in-step-3.md

A note is never overwritten: `init` keeps every note that exists, `new` refuses an existing path. The report
lists the notes that still hold TODO. Exit 0 on success, 2 on an unknown template, lab or an existing note.
"""
from __future__ import annotations

import datetime as _dt
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from labkit.errors import LabkitError
from labkit.options import Out
from labkit.output import device_info, git_dirty, git_head, project_root

app = typer.Typer(help="Lab notes in notes/: one per lab of the plan (init), or one from a template (new).\n\n"
                       "Example: labkit notes new trace --title \"why does R2 wait in step 3?\"",
                  no_args_is_help=True)

TODO = "TODO"


def notes_dir() -> Path:
    return project_root() / "notes"


def templates() -> dict[str, Path]:
    return {p.stem: p for p in sorted((notes_dir() / "templates").glob("*.md"))}


def lab_note_path(lab_id: str) -> Path:
    return notes_dir() / f"{lab_id}.md"


def user_notes() -> list[Path]:
    """Every note a user writes or fills in (notes/*.md but the README)."""
    return [p for p in sorted(notes_dir().glob("*.md")) if p.stem.lower() != "readme"]


def todo_count(path: Path) -> int:
    try:
        return path.read_text(encoding="utf-8", errors="replace").count(TODO)
    except OSError:
        return 0


def note_state(path: Path) -> str:
    """none / N TODO / written."""
    if not path.is_file():
        return "none"
    n = todo_count(path)
    return f"{n} TODO" if n else "written"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "note"


def machine() -> str:
    """The GPUs nvidia-smi lists (asking torch would import it: seconds, for one line of a note), else the CPU."""
    gpus = _nvidia_smi_names()
    if gpus:
        return f"{gpus[0]} x{len(gpus)}"
    cpu = device_info("cpu")
    return f"CPU ({cpu['name']}, {cpu['count']} cores)"


def _nvidia_smi_names() -> list[str]:
    """The names of the GPUs this process may use: nvidia-smi's, narrowed to CUDA_VISIBLE_DEVICES where it is set
    (entries by index or by UUID or a UUID's prefix, as CUDA takes them; an entry nvidia-smi cannot resolve, such
    as a MIG instance's, leaves the list whole: the GPUs are still these)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        done = subprocess.run([exe, "--query-gpu=index,uuid,name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [[part.strip() for part in line.split(",", 2)] for line in done.stdout.splitlines() if line.strip()] \
        if done.returncode == 0 else []
    rows = [r for r in rows if len(r) == 3]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not rows:
        return [name for _, _, name in rows]
    names = []
    for entry in filter(None, (e.strip() for e in visible.split(","))):
        found = [name for index, uuid, name in rows if entry == index or (entry.startswith("GPU-")
                                                                          and uuid.startswith(entry))]
        if len(found) != 1:
            return [name for _, _, name in rows] if entry.startswith("MIG-") else names
        names.append(found[0])
    return names


def render(template: str, title: str | None, today: str, machine_text: str, commit: str) -> str:
    """The template with its title placeholder and its date/machine/commit line filled in."""
    lines = template.splitlines()
    if lines and title:
        # A function replacement: the title is text, never a pattern (`\1`, `\n`, `\g<0>` stay as typed),
        # and a heading is one line.
        heading = " ".join(title.split())
        lines[0] = re.sub(r"<[^>]*>", lambda _: heading, lines[0], count=1)
    for i, line in enumerate(lines):
        if line.startswith("- Date"):
            lines[i] = f"{line.rstrip()} {today}; {machine_text}; {commit}"
            break
    return "\n".join(lines) + "\n"


def lab_note(lab) -> str:
    """The note a lab of the plan starts from: what to run, what evidence counts, its questions, TODO markers."""
    command = "\n".join(f"      {line}" for line in lab.command.strip().splitlines())
    lines = [
        f"# {lab.title}",
        "",
        f"Lab `{lab.id}`. Evidence it needs: {lab.evidence}. Replace every {TODO} with what",
        "you observed. Where you did not run something, write \"not run\" and why, never the expected value.",
        "",
        f"- Date, machine (GPU or CPU), commit: {TODO}",
        "- Command(s):",
        "",
        command,
        "",
        f"- Result file(s) under runs/ and their verdicts: {TODO}",
        "",
        "## Prediction (before running)",
        "",
        TODO,
        "",
        "## Questions",
        "",
    ]
    for i, q in enumerate(lab.questions, 1):
        lines += [f"{i}. {q}", "", f"   {TODO}", ""]
    lines += ["## Conclusion", "",
              f"- What the result shows (evidence kind, file, figure, under which conditions): {TODO}",
              f"- What it does not show: {TODO}", ""]
    if lab.view is not None:  # an optimisation lab (labkit/report/views.py): the trade in two lines
        lines[-1:-1] = [f"- What it bought (the figure and its interval, from the report's {lab.id} section): {TODO}",
                        f"- What it cost (numbers: the logits verdict and distance; memory; code to keep): {TODO}"]
    return "\n".join(lines)


def _write_new(path: Path, text: str) -> None:
    # "x": never overwrite, even when the file appears between the check and the write.
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("x", encoding="utf-8") as fh:
        fh.write(text)


@app.command("init")
def init_cmd(
    lab: Optional[list[str]] = typer.Option(None, "--lab", metavar="LAB",
                                            help="Only this lab (repeatable; default: every lab)."),
) -> None:
    """Write notes/LAB.md for every lab of the plan that has no note yet (existing notes are kept as they are).

    Example: labkit notes init --lab environment
    """
    from labkit.report.plan import load_plan

    labs = load_plan()
    if lab:
        known = {x.id for x in labs}
        unknown = [x for x in lab if x not in known]
        if unknown:
            raise LabkitError(f"notes: no lab {', '.join(map(repr, unknown))} in the plan "
                              f"(known: {', '.join(sorted(known))})")
        labs = [x for x in labs if x.id in lab]
    wrote, kept = [], []
    for x in labs:
        path = lab_note_path(x.id)
        try:
            _write_new(path, lab_note(x))
            wrote.append(path)
        except FileExistsError:
            kept.append(path)
    console = Console()
    console.print(f"wrote {len(wrote)} note(s) into {notes_dir()}; kept {len(kept)} that exist"
                  + (f" ({', '.join(p.name for p in kept[:8])}{' ...' if len(kept) > 8 else ''})" if kept else ""))


@app.command("list")
def list_cmd() -> None:
    """The templates, and the note of every lab of the plan with its state.

    Example: labkit notes list
    """
    from labkit.report.plan import load_plan

    console = Console()
    table = Table(title=f"note templates in {notes_dir() / 'templates'} (labkit notes new NAME)", title_justify="left")
    table.add_column("template")
    table.add_column("title line")
    for name, path in templates().items():
        first = path.read_text(encoding="utf-8").splitlines()[:1]
        table.add_row(name, first[0].lstrip("# ") if first else "")
    console.print(table)
    labs = Table(title="lab notes (labkit notes init)", title_justify="left")
    for col in ("lab", "note", "state"):
        labs.add_column(col)
    for x in load_plan():
        path = lab_note_path(x.id)
        labs.add_row(x.id, str(path.relative_to(project_root())), note_state(path))
    console.print(labs)


@app.command("new")
def new_cmd(
    kind: str = typer.Argument(..., metavar="TEMPLATE", help="Template: trace, logits, bench or optimisation "
                               "(labkit notes list)."),
    title: Optional[str] = typer.Option(None, "--title", help="The question or change the note is about."),
    out: Out("Note path (default: notes/DATE-TEMPLATE-TITLE.md).") = None,
) -> None:
    """Copy a template to a new note with today's date, this machine and the commit filled in.

    Example: labkit notes new bench --title "does --max-num-batched-tokens 4096 help decode?"
    """
    found = templates()
    if kind not in found:
        raise LabkitError(f"notes: no template {kind!r} (known: {', '.join(found) or 'none'})")
    today = _dt.date.today().isoformat()
    path = out if out is not None else notes_dir() / f"{today}-{kind}-{_slug(title or kind)}.md"
    head = git_head()
    commit = "commit unknown" if head is None else f"commit {head[:12]}" + (" (dirty)" if git_dirty() else "")
    text = render(found[kind].read_text(encoding="utf-8"), title, today, machine(), commit)
    try:
        _write_new(path, text)
    except FileExistsError:
        raise LabkitError(f"notes: {path} already exists; choose another --title or --out "
                          "(notes are never overwritten)") from None
    Console().print(f"wrote {path}")
