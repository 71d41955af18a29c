"""`labkit report`: gather the results under runs/ into one evidence archive: a Markdown summary (one table per
kind of result, each row with its verdict or headline figure, evidence kind, device and commit), a manifest
with every file's sha256, and the files themselves in a .tar.gz.

    labkit report                          # runs/ -> runs/report/report.md, manifest.json, evidence.tar.gz
    labkit report --runs DIR --out DIR --with-logs --title "chunked prefill, before/after"

Results are recognised by their JSON envelope (`command`, `evidence`, ...). Logits arrays (.npz) and event
logs (.jsonl, .tsv) go into the archive only with --with-logs. The report flags what weakens the evidence:
results from different commits, a dirty tree, CPU results next to GPU ones. Exit 0 when the report is
written (whatever the results say; their verdicts are in it), 2 when there is nothing to report.
"""
from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from rich.table import Table

from labkit.errors import LabkitError
from labkit.output import EVIDENCE_KINDS, envelope, finish, runs_dir, write_json

LOG_SUFFIXES = (".npz", ".jsonl", ".tsv", ".log")


def _f(v: Any, spec: str = ",.1f") -> str:
    if v is None:
        return "-"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return format(v, spec)
    return str(v)


def _trace(d: dict) -> tuple[str, str]:
    rep = d.get("report") or {}
    first = rep.get("first_failure") or {}
    if d.get("verdict"):   # trace results carry their verdict (CHANGED included) since issue 12
        verdict = d["verdict"]
    elif not d.get("judged"):
        verdict = "RECORDED"
    else:
        verdict = "PASS" if d.get("passed") else "FAIL"
    detail = f"case {d.get('case')}, {d.get('steps')} steps"
    if first:
        detail += f"; first failure: {first.get('name')} at step {first.get('step')}: {first.get('message', '')}"[:200]
    return verdict, detail


def _logits(d: dict) -> tuple[str, str]:
    s = d.get("summary") or {}
    worst_abs = (s.get("worst_max_abs") or {}).get("value")
    worst_rel = (s.get("worst_rel_l2") or {}).get("value")
    return d.get("verdict") or "?", (f"suite {d.get('suite')}: {s.get('rows')} rows, worst max-abs {_f(worst_abs, '.3g')} "
                                     f"/ rel-L2 {_f(worst_rel, '.3g')}, top-1 {s.get('top1_agree')}/{s.get('rows')}")


def _bench(d: dict) -> tuple[str, str]:
    m = d.get("median") or {}
    w = d.get("workload") or {}
    return "ok" if d.get("status") == "ok" else str(d.get("status")), (
        f"{w.get('name')} via {d.get('backend')} ({d.get('execution')}): {_f(m.get('output_throughput'))} output tok/s "
        f"median of {len(d.get('runs') or [])}")


def _compare(d: dict) -> tuple[str, str]:
    r = d.get("ratio")
    return "ok", f"--variable {d.get('variable')}: B/A {_f(r, '.3f')}x"


def _load(d: dict) -> tuple[str, str]:
    m = d.get("metrics") or {}
    ttft, tpot = (m.get("ttft_ms") or {}).get("median"), (m.get("tpot_ms") or {}).get("median")
    src = (d.get("config") or {}).get("source") or {}
    what = src.get("arrivals") or f"{(src.get('workload') or {}).get('name')} at rate {src.get('rate')}"
    good = f", goodput {_f(m.get('goodput'), '.2f')} req/s" if "goodput" in m else ""
    return ("ok" if not m.get("failed") else f"{m.get('failed')} failed"), (
        f"{what}: {m.get('completed')}/{m.get('requests')} done, {_f(m.get('output_throughput'))} tok/s, "
        f"median ttft {_f(ttft, '.1f')} ms, tpot {_f(tpot, '.2f')} ms{good}")


def _status(d: dict) -> tuple[str, str]:
    return str(d.get("status") or "?"), ""


# command prefix -> (section title, summariser); the first matching prefix wins.
KINDS: list[tuple[str, str, Callable[[dict], tuple[str, str]]]] = [
    ("bench compare", "Bench comparisons", _compare),
    ("bench load", "Load benchmarks", _load),
    ("bench", "Offline benchmarks", _bench),
    ("logits-check compare", "Logits checks", _logits),
    ("trace", "Traced cases", _trace),
    ("smoke", "Smoke runs", _status),
    ("doctor", "Doctor", _status),
]


def _kind(command: str) -> Optional[tuple[str, Callable]]:
    for prefix, title, fn in KINDS:
        if command == prefix or command.startswith(prefix + " "):
            return title, fn
    return None


def collect(root: Path, exclude: Path | None = None) -> list[dict]:
    """Every result JSON below `root` (by its envelope), with its summary row."""
    found = []
    for path in sorted(root.rglob("*.json")):
        if exclude is not None and exclude in path.parents:
            continue
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(d, dict) or not isinstance(d.get("command"), str) or "evidence" not in d:
            continue
        kind = _kind(d["command"])
        if kind is None:  # collections (logits-check collect) are inputs of a compare, not results
            continue
        title, fn = kind
        verdict, detail = fn(d)
        dev = d.get("device") or {}
        found.append({"path": path, "kind": title, "command": d["command"], "verdict": verdict, "detail": detail,
                      "evidence": d.get("evidence"), "device": dev.get("name") or dev.get("type"),
                      "git_head": d.get("git_head"), "git_dirty": d.get("git_dirty"),
                      "started_at": d.get("started_at")})
    return found


def caveats(results: list[dict]) -> list[str]:
    out = []
    heads = sorted({r["git_head"] for r in results if r["git_head"]})
    if len(heads) > 1:
        out.append(f"results come from {len(heads)} commits ({', '.join(h[:10] for h in heads)}): "
                   "compare only results of one commit unless the commit is the variable")
    if any(r["git_head"] is None for r in results):
        out.append("some results have no commit (run outside a checkout or an archive without labkit/COMMIT)")
    dirty = [r for r in results if r["git_dirty"]]
    if dirty:
        out.append(f"{len(dirty)} result(s) ran on a tree with uncommitted changes: the commit alone does not "
                   "reproduce them")
    kinds = {r["evidence"] for r in results}
    if "gpu-measured" in kinds and len(kinds) > 1:
        out.append("GPU measurements sit next to CPU executions: CPU timings say nothing about the GPU")
    return out


def markdown(title: str, results: list[dict], notes: list[str], rel: Callable[[Path], str]) -> str:
    lines = [f"# {title}", ""]
    if notes:
        lines += ["What weakens this evidence:", ""] + [f"- {n}" for n in notes] + [""]
    for _, section, _ in KINDS:
        rows = [r for r in results if r["kind"] == section]
        if not rows:
            continue
        lines += [f"## {section}", "", "| result | verdict | what | evidence | device | commit |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            commit = (r["git_head"] or "-")[:10] + (" (dirty)" if r["git_dirty"] else "")
            lines.append(f"| `{rel(r['path'])}` | {r['verdict']} | {r['detail'] or '-'} | {r['evidence']} | "
                         f"{r['device'] or '-'} | {commit} |")
        lines.append("")
    return "\n".join(lines)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def run(
    runs: Optional[Path] = typer.Option(None, "--runs", help="Folder of results (default: $RUNS_DIR or runs/)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Report folder (default: RUNS/report)."),
    title: str = typer.Option("labkit evidence report", "--title", help="The report's title."),
    with_logs: bool = typer.Option(False, "--with-logs", help="Also archive event logs, TSVs, logits arrays, logs."),
) -> None:
    """Gather every result under runs/ into a Markdown summary, a sha256 manifest and a .tar.gz archive."""
    root = (runs if runs is not None else runs_dir()).resolve()
    if not root.is_dir():
        raise LabkitError(f"report: {root} is not a folder of results")
    dest = (out if out is not None else root / "report").resolve()
    results = collect(root, exclude=dest)
    if not results:
        raise LabkitError(f"report: no labkit results (JSON with a command/evidence envelope) under {root}")
    # Each result's folder-mates (its .md twin, event log, arrays) travel with it.
    files: set[Path] = set()
    for r in results:
        p = r["path"]
        siblings = p.parent.iterdir() if p.parent != root else [p.with_suffix(".md")]
        files.update(f for f in siblings if f.is_file() and (with_logs or f.suffix not in LOG_SUFFIXES))
        files.add(p)

    def rel(p: Path) -> str:
        return str(p.relative_to(root)) if root in p.parents or p == root else str(p)

    notes = caveats(results)
    dest.mkdir(parents=True, exist_ok=True)
    md = markdown(title, results, notes, rel)
    (dest / "report.md").write_text(md, encoding="utf-8")
    manifest = [{"file": rel(f), "bytes": f.stat().st_size, "sha256": _sha256(f)} for f in sorted(files)]
    # A report is as strong as its weakest result.
    kinds = [r["evidence"] for r in results if r["evidence"] in EVIDENCE_KINDS]
    weakest = max(kinds, key=EVIDENCE_KINDS.index) if kinds else "static-estimate"
    env = envelope("report", device="cpu", model_dir=None, evidence=weakest)
    result = finish(env, title=title, runs=str(root), results=[
        {k: (rel(v) if k == "path" else v) for k, v in r.items()} for r in results], caveats=notes, files=manifest)
    write_json(dest / "manifest.json", result)
    archive = dest / "evidence.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for f in sorted(files):
            tar.add(f, arcname=f"evidence/{rel(f)}")
        tar.add(dest / "report.md", arcname="evidence/report.md")
        tar.add(dest / "manifest.json", arcname="evidence/manifest.json")

    console = Console()
    table = Table(title=title, title_justify="left")
    for col in ("kind", "result", "verdict", "what"):
        table.add_column(col, overflow="fold")
    for r in results:
        table.add_row(r["kind"], rel(r["path"]), r["verdict"], r["detail"])
    console.print(table)
    for n in notes:
        console.print(f"[yellow]note:[/] {n}")
    console.print(f"wrote {dest / 'report.md'}, {dest / 'manifest.json'} and {archive} ({len(files)} files)")
    raise typer.Exit(0)
