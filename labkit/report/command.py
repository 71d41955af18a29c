"""`labkit report` and `labkit report verify`: the commands (the work lives in the package's modules)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.padding import Padding
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from labkit.errors import LabkitError
from labkit.notes import lab_note_path, note_state, todo_count, user_notes
from labkit.options import JsonOption, Out
from labkit.output import (
    EVIDENCE_KINDS,
    EXIT_CANNOT_RUN,
    EXIT_FAIL,
    EXIT_PASS,
    envelope,
    finish,
    print_json,
    runs_dir,
    write_json,
)
from labkit.report import archive as arch, render
from labkit.report.plan import load_plan, plan_path
from labkit.report.render import VERDICT_COLORS, markdown, page, pictures
from labkit.report.results import attach, gather
from labkit.report.status import assign, caveats
from labkit.report.verify import verify

app = typer.Typer(invoke_without_command=True, no_args_is_help=False)


# The terminal width from which the labs are one table that spells out the evidence each short lab needs.
WIDE_REPORT = 120


def _style(verdict: str) -> str:
    return f"bold {VERDICT_COLORS.get(verdict, 'white')}"


@app.callback()
def report(
    ctx: typer.Context,
    runs: Optional[Path] = typer.Option(None, "--runs", help="Folder of results (default: $RUNS_DIR or runs/)."),
    out: Out("Report folder (default: RUNS/report).") = None,
    title: str = typer.Option("labkit evidence report", "--title", help="The report's title."),
    with_logs: bool = typer.Option(False, "--with-logs", help="Also archive *.log files (server and tool logs)."),
    as_json: JsonOption = False,
) -> None:
    """Every lab of the plan with its verdict and evidence: report.md, report.html, manifest.json, evidence.tar.gz.

    Exit 1 when a file under runs/ cannot be read (UNREADABLE); exit 2, writing nothing, when the folder holds
    no labkit result at all; else 0. Where several results answer a lab (another device, another option), the
    report shows the strongest evidence, then the one nearest the lab's own command, then the one written where
    that command writes (its --out), then the newest, and says which it took. `labkit report verify ARCHIVE`
    re-checks an archive.

    Example: labkit report --runs runs --out runs/report
    """
    if ctx.invoked_subcommand is not None:
        return
    root = (runs if runs is not None else runs_dir()).resolve()
    if not root.is_dir():
        raise LabkitError(f"report: {root} is not a folder of results")
    dest = (out if out is not None else root / "report").resolve()
    if dest == root or dest in root.parents:
        raise LabkitError(f"report: --out {dest} would hold the results it reports on; give a folder inside or "
                          "beside the runs folder (default: RUNS/report)")
    labs = load_plan()
    gathered = gather(root, exclude=dest)
    if not gathered.results and not gathered.unreadable:
        # A report of nothing would be every lab MISSING and an archive of no evidence: say so instead.
        raise LabkitError(f"report: {root} holds no labkit result (no JSON written by a labkit command); "
                          "run a lab's command first (`labkit doctor`), or give the folder that holds them "
                          "with --runs", code=EXIT_CANNOT_RUN)
    attach(gathered, root)
    notes = {lab.id: note_state(lab_note_path(lab.id)) for lab in labs}
    todo = [p.name for p in user_notes() if todo_count(p)]
    statuses = assign(labs, gathered.results, notes)
    warn = caveats(statuses, gathered, todo)
    pics, figures_note = pictures(gathered, statuses)

    dest.mkdir(parents=True, exist_ok=True)
    (dest / "report.md").write_text(markdown(title, statuses, gathered, warn, todo, figures_note), encoding="utf-8")
    (dest / "report.html").write_text(page(title, statuses, gathered, warn, todo, pics, figures_note), encoding="utf-8")
    prov_files, prov = arch.provenance(dest)
    pairs = [(dest / "report.md", "report.md"), (dest / "report.html", "report.html")]
    pairs += [(f, f.relative_to(dest).as_posix()) for f in prov_files]
    pairs += [(f, f"runs/{f.relative_to(root).as_posix()}") for f in arch.run_files(root, gathered, dest, with_logs)]
    pairs += [(f, f"notes/{f.name}") for f in arch.note_files()]

    # A report is as strong as its weakest result.
    kinds = [r.evidence for r in gathered.results]
    weakest = max(kinds, key=EVIDENCE_KINDS.index) if kinds else "static-estimate"
    exit_code = EXIT_FAIL if gathered.unreadable else EXIT_PASS
    result = finish(
        envelope("report", device="cpu", model_dir=None, evidence=weakest),
        title=title, runs=str(root), plan={"file": str(plan_path()), "sha256": arch.sha256_file(plan_path())},
        labs=[s.to_dict() for s in statuses], results=[r.row() for r in gathered.results],
        unreadable=[{"file": f, "reason": why} for f, why in gathered.unreadable], other_json=gathered.other,
        caveats=warn, notes_with_todo=todo, figures_note=figures_note,
        pictures=[{"title": p.title, "source": p.source, "drawn": p.png is not None, "note": p.note} for p in pics],
        provenance=prov, files=arch.manifest_entries(pairs), exit_code=exit_code)
    manifest = write_json(dest / "manifest.json", result)
    tarball = dest / "evidence.tar.gz"
    _pack(tarball, pairs + [(manifest, "manifest.json")], quiet=as_json)

    if as_json:
        print_json(result)
    else:
        _print(statuses, gathered, warn, figures_note, dest, tarball, manifest, len(pairs))
    if gathered.unreadable:
        f, why = gathered.unreadable[0]
        more = f" (and {len(gathered.unreadable) - 1} more)" if len(gathered.unreadable) > 1 else ""
        raise LabkitError(f"report: {f} is UNREADABLE: {why}{more}; the report lists it", code=EXIT_FAIL)
    raise typer.Exit(EXIT_PASS)


# A plan's folder holds gigabytes of logits arrays (3 GB on the H200, session 13): packing them takes a minute,
# shown as a bar on stderr; a small folder packs at once, without one.
PROGRESS_BYTES = 64 << 20


def _pack(tarball: Path, pairs: list[tuple[Path, str]], quiet: bool) -> None:
    total = sum(path.stat().st_size for path, _ in pairs)
    if quiet or total < PROGRESS_BYTES:
        arch.write_archive(tarball, pairs)
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("packing the evidence archive", total=total)
        arch.write_archive(tarball, pairs, advance=lambda n: bar.advance(task, n))


def _print(statuses, gathered, warn, figures_note, dest, tarball, manifest, n_files) -> None:
    console = Console()
    narrow = console.width < WIDE_REPORT
    if narrow:
        # A line per lab, its headline indented below at the full width: as a table column in 80 columns the
        # headline was a column of single words, and a long word in it (an arrivals file's path) was cut.
        # "(needs gpu-measured)" beside each result would crowd the line: a mark, explained once below.
        console.print(Text("labs of the plan", style="italic"))
        id_width = max((len(s.lab.id) for s in statuses), default=0)
        verdict_width = max((len(s.verdict) for s in statuses), default=0)
        for s in statuses:
            ev = "-" if s.evidence is None else s.evidence + ("*" if s.evidence_short else "")
            console.print(Text.assemble((s.lab.id.ljust(id_width), "bold"), "  ",
                                        (s.verdict.ljust(verdict_width), _style(s.verdict)), "  ", ev))
            console.print(Padding(Text(s.headline()), (0, 0, 0, 2), expand=False))
            if s.which():
                console.print(Padding(Text(s.which(), style="dim"), (0, 0, 0, 2), expand=False))
            if any(x.result is None for x in s.slots):
                _print_commands(console, render.command_lines(s.lab.command))
    else:
        table = Table(title="labs of the plan", title_justify="left")
        for col in ("lab", "verdict", "evidence"):
            table.add_column(col)
        table.add_column("headline", ratio=1)
        for s in statuses:
            if s.evidence is None:
                ev = "-"
            elif s.evidence_short:
                ev = f"{s.evidence} (needs {s.lab.evidence})"
            else:
                ev = s.evidence
            headline = Text(s.headline())
            if s.which():
                headline.append(f" ({s.which()})", style="dim")
            table.add_row(s.lab.id, Text(s.verdict, style=_style(s.verdict)), ev, headline)
        console.print(table)
        howto = render.missing_howto(statuses)
        if howto:
            console.print(Text(render.HOWTO_TITLE, style="italic"))
            for lab, _, cmds, why in howto:
                console.print(Text(lab + (f" ({why})" if why else ""), style="bold"))
                _print_commands(console, cmds)
    if narrow and any(s.evidence_short for s in statuses):
        console.print("* weaker evidence than the lab needs (the caveats below say which labs need what)")
    for f, why in gathered.unreadable:
        console.print(Text.assemble(("UNREADABLE ", _style("UNREADABLE")), f"{f}: {why}"))
    for c in warn:
        console.print(Text(f"caveat: {c}", style="yellow"))
    if figures_note:
        console.print(Text(f"no pictures: {figures_note}", style="yellow"))
    console.print(f"wrote {dest / 'report.md'}, {dest / 'report.html'}, {manifest} and {tarball} ({n_files} files); "
                  f"manifest sha256 {arch.sha256_file(manifest)}")


def command_screen_lines(line: str, width: int) -> list[str]:
    """One command of the plan as lines that paste into a shell: its comment first (`# in a terminal of its
    own`), then the command, broken before an option with a trailing backslash where it is wider than `width`."""
    text, _, comment = line.partition("#")
    out = [f"# {comment.strip()}"] if comment.strip() else []
    words, groups = text.split(), []
    while words:  # an option keeps its value beside it
        take = 2 if words[0].startswith("-") and len(words) > 1 and not words[1].startswith("-") else 1
        groups.append(" ".join(words[:take]))
        words = words[take:]
    current = ""
    for group in groups:
        if current and len(current) + len(group) + 3 > width:
            out.append(current + " \\")
            current = "  " + group
        else:
            current = f"{current} {group}" if current else group
    return out + [current] if current else out


def _print_commands(console: Console, lines: list[str]) -> None:
    """A lab's commands under it ("run: " before the first), each pasteable as shown."""
    for i, line in enumerate(lines):
        for j, part in enumerate(command_screen_lines(line, console.width - 7)):
            style = "dim" if part.startswith("#") else ""
            console.print(Text.assemble("  run: " if i == 0 and j == 0 else " " * 7, (part, style)), soft_wrap=True)


@app.command("verify")
def verify_cmd(
    archive: Path = typer.Argument(..., metavar="ARCHIVE", help="An evidence.tar.gz written by `labkit report`."),
    as_json: JsonOption = False,
) -> None:
    """Re-check an evidence archive: its sha256s, trace logs and logits checks (no GPU needed).

    Every file's sha256 against the manifest; every trace log re-validated against its case;
    every logits check re-judged from its arrays. Exit 1 naming the first file that differs.

    Example: labkit report verify runs/report/evidence.tar.gz
    """
    v = verify(archive)
    if as_json:
        print_json({"archive": str(archive), **v.to_dict()})
    else:
        console = Console()
        for name, why in v.problems:
            console.print(Text.assemble(("DIFFERS ", _style("FAIL")), f"{name}: {why}"))
        console.print(f"{archive}: {v.files} files checked against the manifest, {v.traces} trace log(s) re-validated, "
                      f"{v.logits} logits check(s) re-judged from their arrays")
        if not v.problems:
            console.print(Text("PASS: the archive holds what its manifest and results say", style=_style("PASS")))
    if v.problems:
        name, why = v.problems[0]
        more = f" (and {len(v.problems) - 1} more)" if len(v.problems) > 1 else ""
        raise LabkitError(f"report verify: {name} differs: {why}{more}", code=EXIT_FAIL)
    raise typer.Exit(EXIT_PASS)
