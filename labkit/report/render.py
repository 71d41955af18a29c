"""report.md and report.html: the caveats first, then every lab of the plan with its verdict, evidence,
headline figures, commit and device, the files that could not be read, the notes still holding TODO, every
result by kind, and (HTML) the pictures, embedded as data URIs so the page stands alone."""
from __future__ import annotations

import base64
import html
from dataclasses import dataclass

from labkit.report import figures, views
from labkit.report.results import SECTIONS, Gathered, Result
from labkit.report.status import LabStatus

VERDICT_COLORS = {"PASS": "#1e7d32", "REVIEW": "#b26a00", "FAIL": "#b71c1c", "CHANGED": "#5e35b1",
                  "RECORDED": "#455a64", "MISSING": "#757575", "UNREADABLE": "#b71c1c"}


@dataclass
class Picture:
    title: str
    source: str            # the result (path under runs/) it is drawn from
    png: bytes | None
    note: str = ""         # why there is no picture


def load_policy(r: Result) -> str | None:
    """The scheduling policy a load run's server used: the --scheduling-policy it was started with (none: the engine's
    default, prefill_first), or what the server said of itself; None where neither is known."""
    config = r.data.get("config") if isinstance(r.data.get("config"), dict) else {}
    server = config.get("server") if isinstance(config.get("server"), dict) else {}
    given = server.get("--scheduling-policy") or server.get("--policy")  # (--policy: the flag's name before)
    if given:
        return str(given)
    said = (r.data.get("server") or {}).get("policy") if isinstance(r.data.get("server"), dict) else None
    if said:
        return str(said)
    return "prefill_first" if server.get("started") else None


def lab_pictures(statuses: list[LabStatus]) -> list[Picture]:
    """A picture per lab whose question is a comparison of its own results: load runs under two or more
    scheduling policies (load-policies, scheduling-under-arrivals) side by side, one column a policy."""
    out = []
    for s in statuses:
        runs = [(load_policy(r), r) for r in s.results if r.command == "bench load"]
        runs = [(p, r) for p, r in runs if p is not None and isinstance(r.data.get("metrics"), dict)]
        if len({p for p, _ in runs}) < 2:
            continue
        title = f"lab {s.lab.id}: {len(runs)} runs under {len({p for p, _ in runs})} policies"
        try:
            png = figures.policies_side_by_side([(p, r.data["metrics"]) for p, r in runs], title)
            out.append(Picture(title, ", ".join(r.rel for _, r in runs), png))
        except Exception as exc:  # noqa: BLE001 - odd content loses the picture, not the report
            figures.close_all()
            out.append(Picture(title, "", None, f"could not draw it ({type(exc).__name__}: {exc})"))
    return out


def pictures(gathered: Gathered, statuses: list[LabStatus] | None = None) -> tuple[list[Picture], str | None]:
    """Every picture the results allow (the labs' comparisons first), and why there are none (matplotlib
    missing) or None."""
    missing = figures.unavailable()
    if missing:
        return [], missing
    out = lab_pictures(statuses or [])
    for r in gathered.results:
        try:
            pics = _pictures_of(r)
        except Exception as exc:  # noqa: BLE001 - a result with odd content loses its picture, not the report
            pics = [Picture(f"{r.kind}: {r.rel}", r.rel, None, f"could not draw it ({type(exc).__name__}: {exc})")]
            figures.close_all()
        out += pics
    return out, None


def _pictures_of(r: Result) -> list[Picture]:
    if r.command == "trace" and r.data.get("live") is True:
        return []   # a window of a running server: hundreds of requests, no timeline a page can hold
    if r.command == "trace":
        title = f"trace {r.data.get('case')} ({r.rel})"
        if "events" not in r.attached:
            return [Picture(title, r.rel, None, "no readable event log beside the result")]
        events = r.attached["events"]
        pics = [Picture(title, r.rel, figures.trace_timeline(events, f"case {r.data.get('case')}"))]
        if r.verdict == "CHANGED":
            pics.append(_changed_picture(r, events))
        return pics
    if r.command == "logits-check compare":
        return [Picture(f"logits-check {r.data.get('suite')} ({r.rel})", r.rel, figures.logits_rows(r.data))]
    if r.command == "bench compare":
        return [Picture(f"bench compare --variable {r.data.get('variable')} ({r.rel})", r.rel,
                        figures.compare_repeats(r.data))]
    if r.command == "bench":
        return [Picture(f"bench {(r.data.get('workload') or {}).get('name')} ({r.rel})", r.rel,
                        figures.bench_repeats(r.data))]
    if r.command == "bench load":
        title = f"bench load ({r.rel})"
        if "requests" not in r.attached:
            return [Picture(title, r.rel, None, "no readable per-request file (.requests.jsonl) beside the result")]
        return [Picture(title, r.rel, figures.load_distributions(r.attached["requests"], r.headline[:90]))]
    return []


def _changed_picture(r: Result, events: list[dict]) -> Picture:
    """What the case expects against what the run did; the expected states come from the case file."""
    from labkit.errors import LabkitError
    from labkit.trace.cases import load_case

    name = r.data.get("case")
    title = f"trace {name}: expected against actual ({r.rel})"
    try:
        case = load_case(str(name))
    except LabkitError as exc:
        return Picture(title, r.rel, None, f"its case cannot be read here ({exc})")
    changes = (r.data.get("report") or {}).get("changes") or []
    return Picture(title, r.rel, figures.trace_changed(events, case.expect or [], changes, f"case {name}"))


def _commit(r: Result) -> str:
    return (r.git_head or "-")[:10] + (" (dirty)" if r.git_dirty else "")


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ") or "-"


def _counts(statuses: list[LabStatus]) -> str:
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s.verdict] = counts.get(s.verdict, 0) + 1
    return ", ".join(f"{n} {v}" for v, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
            + ["| " + " | ".join(r) + " |" for r in rows] + [""])


def _evidence_text(s: LabStatus) -> str:
    if s.evidence is None:
        return f"- (needs {s.lab.evidence})"
    return f"{s.evidence} (needs {s.lab.evidence})" if s.evidence_short else s.evidence


def _headline(s: LabStatus) -> str:
    """The headline, and which result it comes from where the report chose one or took another command's."""
    which = s.which()
    return s.headline() + (f" ({which})" if which else "")


HOWTO_TITLE = "How to produce what is MISSING"
OTHER_JSON = "JSON files that are not labkit results (not judged): "


def command_lines(command: str) -> list[str]:
    """A lab's commands, one per line as the plan writes them (with their comments: `labkit serve` says it runs
    in a terminal of its own). Never joined into one line: `labkit serve; labkit serve client` would wait forever
    for the first."""
    return [line.strip() for line in command.strip().splitlines() if line.strip()]


def missing_howto(statuses: list[LabStatus]) -> list[tuple[str, str, list[str], str]]:
    """(lab, evidence it needs, its command lines, why no command makes it yet) per lab MISSING a result."""
    return [(s.lab.id, s.lab.evidence, command_lines(s.lab.command), s.lab.producer or "") for s in statuses
            if any(x.result is None for x in s.slots)]


def markdown(title: str, statuses: list[LabStatus], gathered: Gathered, caveats: list[str],
             todo_notes: list[str], figures_note: str | None) -> str:
    lines = [f"# {title}", "", f"Labs: {_counts(statuses)} (of {len(statuses)} in the plan, workloads/labs.yaml).", ""]
    if caveats:
        lines += ["What weakens this evidence:", ""] + [f"- {c}" for c in caveats] + [""]
    if figures_note:
        lines += [f"No pictures: {figures_note}. report.html holds the tables only.", ""]
    lines += ["## Labs", ""] + _md_table(["lab", "verdict", "evidence", "headline", "commit", "device", "note"], [
        [s.lab.id, s.verdict, _evidence_text(s), _cell(_headline(s)), s.commits(), _cell(s.devices()), s.note]
        for s in statuses])
    for v in views.build(statuses):
        lines += [f"## {v.lab}: {v.title}", "", f"**{v.headline}**", ""]
        lines += _md_table(v.head, [[_cell(c) for c in row] for row in v.rows])
        lines += [f"- {_cell(x)}" for x in v.lines] + ["", f"Picture ({v.picture_title}): in report.html.", ""]
    if gathered.unreadable:
        lines += ["## UNREADABLE", ""] + _md_table(["file", "reason"], [[f"`{f}`", _cell(why)]
                                                                         for f, why in gathered.unreadable])
    if todo_notes:
        lines += ["## Notes still holding TODO", ""] + [f"- notes/{n}" for n in todo_notes] + [""]
    howto = missing_howto(statuses)
    if howto:
        lines += [f"## {HOWTO_TITLE}", ""]
        for lab, evidence, cmds, why in howto:
            lines.append(f"- {lab} ({evidence})" + (f" ({why})" if why else "") + ":")
            lines += [f"  - `{cmd}`" for cmd in cmds]
        lines.append("")
    lines += ["## Results", ""]
    for section in SECTIONS:
        rows = [r for r in gathered.results if r.kind == section]
        if not rows:
            continue
        lines += [f"### {section}", ""] + _md_table(["result", "verdict", "what", "evidence", "device", "commit"], [
            [f"`{r.rel}`", r.verdict, _cell(r.headline), r.evidence, _cell(r.device or "-"), _commit(r)] for r in rows])
    if gathered.other:
        lines += [OTHER_JSON + ", ".join(f"`{f}`" for f in gathered.other), ""]
    return "\n".join(lines)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.v { font-weight: bold; color: white; padding: 0.1em 0.4em; border-radius: 3px; white-space: nowrap; }
.caveats { background: #fff8e1; border-left: 4px solid #b26a00; padding: 0.5em 1em; }
figure { margin: 1em 0 2em; } figcaption { font-size: 0.9em; color: #555; }
img { max-width: 100%; }
code { font-size: 0.9em; }
"""


def _v(verdict: str) -> str:
    return f'<span class="v" style="background:{VERDICT_COLORS.get(verdict, "#555")}">{html.escape(verdict)}</span>'


def _table(head: list[str], rows: list[list[str]]) -> str:
    """rows hold HTML already escaped by the caller."""
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows]
    return "\n".join(out) + "</table>"


def page(title: str, statuses: list[LabStatus], gathered: Gathered, caveats: list[str], todo_notes: list[str],
         pics: list[Picture], figures_note: str | None) -> str:
    e = html.escape
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{e(title)}</title>"
             f"<style>{_CSS}</style></head><body>", f"<h1>{e(title)}</h1>",
             f"<p>Labs: {e(_counts(statuses))} (of {len(statuses)} in the plan, workloads/labs.yaml).</p>"]
    if caveats:
        parts.append('<div class="caveats"><p><b>What weakens this evidence</b></p><ul>'
                     + "".join(f"<li>{e(c)}</li>" for c in caveats) + "</ul></div>")
    if figures_note:
        parts.append(f'<p class="caveats">No pictures: {e(figures_note)}.</p>')
    parts.append("<h2>Labs</h2>")
    parts.append(_table(["lab", "verdict", "evidence", "headline", "commit", "device", "note"], [
        [f"{e(s.lab.id)}<br><small>{e(s.lab.title)}</small>", _v(s.verdict), e(_evidence_text(s)), e(_headline(s)),
         e(s.commits()), e(s.devices()), e(s.note)] for s in statuses]))
    for v in views.build(statuses, draw=figures_note is None):
        parts.append(f"<h2>{e(v.lab)}: {e(v.title)}</h2><p><b>{e(v.headline)}</b></p>")
        parts.append(_table(v.head, [[e(c) for c in row] for row in v.rows]))
        parts.append("<ul>" + "".join(f"<li>{e(x)}</li>" for x in v.lines) + "</ul>" if v.lines else "")
        if v.png is not None:
            data = base64.b64encode(v.png).decode("ascii")
            parts.append(f'<figure><img alt="{e(v.picture_title)}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{e(v.lab)}: {e(v.picture_title)}</figcaption></figure>")
        else:
            parts.append(f"<p>{e(v.picture_title)}: no picture ({e(v.note)})</p>")
    if gathered.unreadable:
        parts.append("<h2>UNREADABLE</h2>")
        parts.append(_table(["file", "reason"], [[f"<code>{e(f)}</code>", e(why)] for f, why in gathered.unreadable]))
    if todo_notes:
        parts.append("<h2>Notes still holding TODO</h2><ul>" + "".join(f"<li>notes/{e(n)}</li>" for n in todo_notes)
                     + "</ul>")
    howto = missing_howto(statuses)
    if howto:
        parts.append(f"<h2>{e(HOWTO_TITLE)}</h2><ul>" + "".join(
            f"<li>{e(lab)} ({e(evidence)})" + (f" ({e(why)})" if why else "") + ":<br>"
            + "<br>".join(f"<code>{e(cmd)}</code>" for cmd in cmds) + "</li>"
            for lab, evidence, cmds, why in howto) + "</ul>")
    if pics:
        parts.append("<h2>Pictures</h2>")
        for p in pics:
            if p.png is None:
                parts.append(f"<p><b>{e(p.title)}</b>: no picture ({e(p.note)})</p>")
                continue
            data = base64.b64encode(p.png).decode("ascii")
            parts.append(f'<figure><img alt="{e(p.title)}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{e(p.title)}</figcaption></figure>")
    parts.append("<h2>Results</h2>")
    for section in SECTIONS:
        rows = [r for r in gathered.results if r.kind == section]
        if rows:
            parts.append(f"<h3>{e(section)}</h3>")
            parts.append(_table(["result", "verdict", "what", "evidence", "device", "commit"], [
                [f"<code>{e(r.rel)}</code>", _v(r.verdict), e(r.headline), e(r.evidence), e(r.device or "-"),
                 e(_commit(r))] for r in rows]))
    if gathered.other:
        parts.append(f"<p>{e(OTHER_JSON)}" + ", ".join(f"<code>{e(f)}</code>" for f in gathered.other) + "</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
