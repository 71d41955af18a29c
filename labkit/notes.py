"""`labkit notes`: start a lab note from a template in notes/, with the facts a note needs to count as
evidence (date, machine, commit) already filled in.

    labkit notes list                              # the templates
    labkit notes new trace --title "why does R2 wait in step 3?"
                                                   # -> runs/notes/2026-11-29-trace-why-does-r2-wait-in-step-3.md

Exit 0 on success, 2 on an unknown template or when the note file already exists (never overwritten).
"""
from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from labkit.errors import LabkitError
from labkit.output import device_info, git_dirty, git_head, project_root, runs_dir

app = typer.Typer(help="Start a lab note from a template (trace, logits, bench), facts filled in.", no_args_is_help=True)


def templates() -> dict[str, Path]:
    return {p.stem: p for p in sorted((project_root() / "notes").glob("*.md")) if p.stem.lower() != "readme"}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "note"


def machine() -> str:
    gpu = device_info("auto")
    if gpu["type"] == "cuda":
        return f"{gpu['name']} x{gpu['count']}"
    return f"CPU ({gpu['name']}, {gpu['count']} cores)"


def render(template: str, title: str | None, today: str, machine_text: str, commit: str) -> str:
    """The template with its title placeholder and its date/machine/commit line filled in."""
    lines = template.splitlines()
    if lines and title:
        lines[0] = re.sub(r"<[^>]*>", title, lines[0], count=1)
    for i, line in enumerate(lines):
        if line.startswith("- Date"):
            lines[i] = f"{line.rstrip()} {today}; {machine_text}; {commit}"
            break
    return "\n".join(lines) + "\n"


@app.command("list")
def list_cmd() -> None:
    """The note templates and what each is for."""
    table = Table(title=f"note templates in {project_root() / 'notes'}", title_justify="left")
    table.add_column("template")
    table.add_column("title line")
    for name, path in templates().items():
        first = path.read_text(encoding="utf-8").splitlines()[:1]
        table.add_row(name, first[0].lstrip("# ") if first else "")
    Console().print(table)


@app.command("new")
def new_cmd(
    kind: str = typer.Argument(..., help="Template: trace, logits or bench (labkit notes list)."),
    title: Optional[str] = typer.Option(None, "--title", help="The question or change the note is about."),
    out: Optional[Path] = typer.Option(None, "--out", help="Note path (default: runs/notes/DATE-KIND-TITLE.md)."),
) -> None:
    """Copy a template to a new note with today's date, this machine and the commit filled in."""
    found = templates()
    if kind not in found:
        raise LabkitError(f"notes: no template {kind!r} (known: {', '.join(found) or 'none'})")
    today = _dt.date.today().isoformat()
    path = out if out is not None else runs_dir() / "notes" / f"{today}-{kind}-{_slug(title or kind)}.md"
    if path.exists():
        raise LabkitError(f"notes: {path} already exists; choose another --title or --out (notes are never overwritten)")
    head = git_head()
    commit = "commit unknown" if head is None else f"commit {head[:12]}" + (" (dirty)" if git_dirty() else "")
    text = render(found[kind].read_text(encoding="utf-8"), title, today, machine(), commit)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    Console().print(f"wrote {path}")
