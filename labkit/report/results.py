"""Reading what lies under runs/: every JSON file is a labkit result (recognised by its envelope), an input
of another result (a logits collection), a file of another tool (a Perfetto trace), or UNREADABLE with the
reason. A result's verdict is the one it carries (`verdict`, else the fields its command has always written);
the report never recomputes or upgrades it."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from labkit.errors import LabkitError
from labkit.output import EVIDENCE_KINDS

VERDICTS = ("PASS", "REVIEW", "FAIL", "CHANGED", "RECORDED", "MISSING", "UNREADABLE")
# Worst first: a lab made of several results takes the worst of their verdicts.
SEVERITY = ("FAIL", "UNREADABLE", "MISSING", "REVIEW", "CHANGED", "RECORDED", "PASS")
# Commands whose JSON is an input of another result, not a result of its own.
INPUT_COMMANDS = ("logits-check collect", "report")


class Unreadable(Exception):
    """A file the report needs but cannot read; the message is the reason."""


@dataclass
class Result:
    path: Path
    rel: str
    data: dict
    command: str
    kind: str
    verdict: str
    headline: str
    evidence: str
    device: str | None
    git_head: str | None
    git_dirty: bool | None
    started_at: str
    # Files beside the result that its pictures and checks read: "events" (a trace's log), "records" (bench
    # load's per-request lines); filled by attach().
    attached: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict:
        """What the manifest keeps of a result."""
        return {"file": self.rel, "command": self.command, "kind": self.kind, "verdict": self.verdict,
                "headline": self.headline, "evidence": self.evidence, "device": self.device,
                "git_head": self.git_head, "git_dirty": self.git_dirty, "started_at": self.started_at}


@dataclass
class Gathered:
    results: list[Result] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)   # (path under runs/, reason)
    other: list[str] = field(default_factory=list)                    # JSON that is not a labkit result


def worst(verdicts: list[str]) -> str:
    return min(verdicts, key=SEVERITY.index) if verdicts else "MISSING"


# --- reading ---------------------------------------------------------------------------------------------


def load_json(path: Path) -> Any:
    """The parsed JSON of a file, or Unreadable naming why not (never another exception)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise Unreadable(f"cannot read: {exc.strerror or exc}") from None
    return parse_json_bytes(raw)


def parse_json_bytes(raw: bytes) -> Any:
    """load_json for bytes already read (a member of an archive)."""
    if not raw.strip():
        raise Unreadable("empty file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unreadable(f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    try:
        return json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        cut = "; the file looks truncated" if not text.rstrip().endswith(("}", "]")) else ""
        raise Unreadable(f"not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno}){cut}") from None
    except RecursionError:
        raise Unreadable("JSON nested too deeply to read") from None
    except ValueError as exc:  # past Python's integer-digits limit, say
        raise Unreadable(f"not readable JSON ({exc})") from None


MAX_INT_DIGITS = 300  # a float holds up to 1.8e308: beyond, a number cannot be shown, plotted or compared


def _bounded_int(digits: str) -> int:
    """An integer of the file, refused (Unreadable) past MAX_INT_DIGITS: labkit writes nothing near it, and one
    such number must not stop the whole report when it is formatted or plotted."""
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise Unreadable(f"an integer of {len(digits.lstrip('-'))} digits (at most {MAX_INT_DIGITS} are read)")
    return int(digits)


def read_events(path: Path):
    """A trace's event log, or Unreadable naming the first bad line: checked whole now, then read again as a
    stream by each picture that iterates it (labkit.trace.events.EventFile), never held whole in memory."""
    from labkit.trace.events import EventFile

    try:
        return EventFile(path)
    except LabkitError as exc:
        raise Unreadable(str(exc).replace(f"{path}:", "line ").replace(str(path), "").strip()) from None
    except RecursionError:
        raise Unreadable("a line is nested too deeply to read") from None
    except UnicodeDecodeError as exc:
        raise Unreadable(f"not UTF-8 text (offset {exc.start})") from None


def read_records(path: Path) -> list[dict]:
    """A JSONL file of records (bench load's per-request file), or Unreadable naming the first bad line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise Unreadable(f"cannot read: {exc}") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            raise Unreadable(f"line {n}: not valid JSON") from None
        if not isinstance(rec, dict):
            raise Unreadable(f"line {n}: not a JSON object")
        out.append(rec)
    return out


# --- verdicts and headlines per kind of result --------------------------------------------------------------


def _num(v: Any, spec: str = ",.1f") -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return format(v, spec)
    return "-"


def _carried(d: dict) -> str | None:
    v = d.get("verdict")
    if v is None:
        return None
    if v not in VERDICTS:
        raise Unreadable(f"verdict {v!r} is not one of {', '.join(VERDICTS)}")
    return v


def _from_passed(d: dict, judged: bool = True) -> str:
    """Commands that wrote `passed` before the verdict field: FAIL whenever something failed; PASS only when
    something was judged; RECORDED when there was nothing to judge against."""
    passed = d.get("passed")
    if passed is False:
        return "FAIL"
    if passed is True:
        return "PASS" if judged else "RECORDED"
    raise Unreadable("no `verdict` and no `passed` field")


def _trace(d: dict) -> tuple[str, str]:
    rep = d.get("report") or {}
    verdict = _carried(d) or _from_passed(d, judged=bool(d.get("judged")))
    head = f"case {d.get('case')}, {d.get('steps', rep.get('steps'))} steps"
    if verdict == "CHANGED":
        return verdict, _changed_trace(head, rep)
    counts = rep.get("counts") or {}
    ran = sum(c.get("passed", 0) + c.get("failed", 0) for c in counts.values())
    failed = sum(c.get("failed", 0) for c in counts.values())
    text = f"{head}, {ran - failed}/{ran} checks hold"
    first = rep.get("first_failure") or {}
    if first:
        text += f"; first failure at step {first.get('step')}: {first.get('message', '')}"
    return verdict, text[:240]


def _live_trace(d: dict) -> tuple[str, str]:
    """A window of a running server's engine steps (labkit trace --url): judged by every invariant."""
    rep = d.get("report") or {}
    verdict = _carried(d) or _from_passed(d)
    counts = rep.get("counts") or {}
    ran = sum(c.get("passed", 0) + c.get("failed", 0) for k, c in counts.items() if k in ("invariant", "policy"))
    failed = sum(c.get("failed", 0) for k, c in counts.items() if k in ("invariant", "policy"))
    text = (f"{d.get('url')}: steps {d.get('first_step')}-{d.get('last_step')} ({d.get('steps')}) over "
            f"{d.get('seconds')} s, policy {d.get('policy')}, tp {d.get('tp')}, {d.get('live_at_open')} requests live "
            f"at the start; {ran - failed}/{ran} invariant checks hold")
    first = rep.get("first_failure") or {}
    if first:
        text += f"; first failure at step {first.get('step')}: {first.get('message', '')}"
    return verdict, text[:240]


def _changed_trace(head: str, rep: dict) -> str:
    """A CHANGED trace: its missed expectations are a diff, not failures; what made it an experiment; and, for an
    engine edit, how to judge it strictly. Only the reason is shortened to fit, never that sentence."""
    from labkit.trace.validate import changed_means

    why = str(rep.get("why_changes") or "")
    means = changed_means(why)
    text = f"{head}, every invariant held, {len(rep.get('changes') or [])} difference(s) from the case"
    tail = f"; {means}" if means else ""
    room = 240 - len(text) - len(tail) - 3
    if why:
        text += f" ({why if len(why) <= room else why[:max(room - 3, 0)] + '...'})"
    return text + tail


def _logits(d: dict) -> tuple[str, str]:
    verdict = _carried(d)
    if verdict is None:
        raise Unreadable("a logits check without a `verdict` field")
    s = d.get("summary") or {}
    worst_abs = (s.get("worst_max_abs") or {}).get("value")
    worst_rel = (s.get("worst_rel_l2") or {}).get("value")
    rows = s.get("rows")
    return verdict, (f"suite {d.get('suite')}: {rows} rows (review {s.get('review', 0)}, fail {s.get('failed', 0)}), "
                     f"worst max-abs {_num(worst_abs, '.3g')}, rel-L2 {_num(worst_rel, '.3g')}, "
                     f"top-1 {s.get('top1_agree')}/{rows}")


def _bench(d: dict) -> tuple[str, str]:
    verdict = _carried(d) or ("RECORDED" if d.get("status") == "ok" else "FAIL")
    m = d.get("median") or {}
    w = d.get("workload") or {}
    return verdict, (f"{w.get('name')} via {d.get('backend')} ({d.get('execution')}): "
                     f"{_num(m.get('output_throughput'))} output tok/s, median of {len(d.get('runs') or [])}")


def _compare(d: dict) -> tuple[str, str]:
    if d.get("headline"):  # says "within noise" instead of a ratio the spread cannot support
        return _carried(d) or "RECORDED", f"--variable {d.get('variable')}: {d['headline']}"
    return _carried(d) or "RECORDED", f"--variable {d.get('variable')}: B/A {_num(d.get('ratio'), '.3f')}x"


def _load(d: dict) -> tuple[str, str]:
    m = d.get("metrics") or {}
    verdict = _carried(d) or ("RECORDED" if d.get("status") == "ok" else "FAIL")
    ttft, tpot = (m.get("ttft_ms") or {}).get("median"), (m.get("tpot_ms") or {}).get("median")
    src = (d.get("config") or {}).get("source") or {}
    what = src.get("arrivals") or f"{(src.get('workload') or {}).get('name')} at rate {src.get('rate')}"
    good = f", goodput {_num(m.get('goodput'), '.2f')} req/s" if "goodput" in m else ""
    server = (d.get("config") or {}).get("server") or {}
    # (--scheduling-policy: the flag's name before it took its field's)
    policy = server.get("--scheduling-policy") or server.get("--policy") or (d.get("server") or {}).get("policy")
    per_class = "".join(f"; {c}: itl p99 {_num(((s.get('itl_ms') or {}).get('p99')))} ms, ttft p99 "
                        f"{_num(((s.get('ttft_ms') or {}).get('p99')))} ms"
                        for c, s in (m.get("classes") or {}).items() if isinstance(s, dict))
    return verdict, (f"{what}{f' (policy {policy})' if policy else ''}: {m.get('completed')}/{m.get('requests')} "
                     f"done, {_num(m.get('output_throughput'))} tok/s, median ttft {_num(ttft)} ms, tpot "
                     f"{_num(tpot, '.2f')} ms{good}{per_class}")


def _shapes(d: dict) -> tuple[str, str]:
    checks = d.get("checks")
    verdict = _carried(d) or _from_passed(d, judged=isinstance(checks, list) and bool(checks))
    text = f"tp {d.get('tensor_parallel_size')}, {d.get('source')}"
    if isinstance(checks, list) and checks:
        text += f": {sum(bool(c.get('passed')) for c in checks)}/{len(checks)} shapes agree with the engine"
    else:
        text += ": static table (no --check)"
    return verdict, text


def _status(d: dict) -> tuple[str, str]:
    status = d.get("status")
    verdict = _carried(d) or (status if status in ("PASS", "FAIL") else None)
    if verdict is None:
        raise Unreadable(f"status {status!r} is not a verdict")
    counts = d.get("counts")
    if isinstance(counts, dict) and counts:  # doctor's rows by status, as a person reads them: "PASS 9, WARN 2"
        return verdict, ", ".join(f"{k} {v}" for k, v in counts.items())
    return verdict, (f"{counts}" if counts else f"token ids {d.get('token_ids')}" if "token_ids" in d else "")


def _principles(d: dict) -> tuple[str, str]:
    verdict = _carried(d)
    if verdict is None:
        raise Unreadable("a principles result without a `verdict` field")
    return verdict, str(d.get("headline") or "")


def _lifecycle(d: dict) -> tuple[str, str]:
    """`serve lifecycle`: each scenario's verdict, and the first failure's reason."""
    verdict = _carried(d)
    if verdict is None:
        raise Unreadable("a serve lifecycle result without a `verdict` field")
    scenarios = [s for s in d.get("scenarios") or [] if isinstance(s, dict)]
    held = sum(s.get("verdict") == "PASS" for s in scenarios)
    text = f"{held}/{len(scenarios)} scenarios hold: " + ", ".join(f"{s.get('name')} {s.get('verdict')}"
                                                                   for s in scenarios)
    failed = next((s for s in scenarios if s.get("verdict") != "PASS"), None)
    if failed is not None:
        text += f"; {failed.get('name')}: {failed.get('observed', '')}"
    return verdict, text[:240]


def _other(d: dict) -> tuple[str, str]:
    return _carried(d) or "RECORDED", str(d.get("headline") or d.get("status") or "")


# command prefix -> (section title, summariser); the first matching prefix wins.
KINDS: list[tuple[str, str, Callable[[dict], tuple[str, str]]]] = [
    ("principles", "Principles", _principles),
    ("trace live", "Live traces (trace --url)", _live_trace),   # (a trace result with live: true)
    ("trace check", "Trace replays", _trace),
    ("trace", "Traced cases", _trace),
    ("logits-check compare", "Logits checks", _logits),
    ("bench compare", "Bench comparisons", _compare),
    ("bench load", "Load benchmarks", _load),
    ("bench", "Offline benchmarks", _bench),
    ("shapes", "Tensor-parallel shapes", _shapes),
    ("serve lifecycle", "Service lifecycle", _lifecycle),
    ("smoke", "Smoke runs", _status),
    ("doctor", "Doctor", _status),
]
SECTIONS = [title for _, title, _ in KINDS] + ["Other results"]


def _kind(command: str) -> tuple[str, Callable[[dict], tuple[str, str]]]:
    for prefix, title, fn in KINDS:
        if command == prefix or command.startswith(prefix + " "):
            return title, fn
    return "Other results", _other


def is_input(command: str) -> bool:
    return any(command == c or command.startswith(c + " ") for c in INPUT_COMMANDS)


def summarise(path: Path, rel: str, d: dict) -> Result:
    """A result's row; Unreadable when its envelope or its kind's fields are not what labkit writes."""
    command = d["command"]
    evidence = d.get("evidence")
    if evidence not in EVIDENCE_KINDS:
        raise Unreadable(f"evidence {evidence!r} is not one of {', '.join(EVIDENCE_KINDS)}")
    kind, fn = _kind("trace live" if command == "trace" and d.get("live") is True else command)
    try:
        verdict, headline = fn(d)
    except Unreadable:
        raise
    except (AttributeError, KeyError, TypeError, ValueError, ArithmeticError) as exc:
        raise Unreadable(f"a {command!r} result with unexpected content ({type(exc).__name__}: {exc})") from None
    dev = d.get("device") if isinstance(d.get("device"), dict) else {}
    head = d.get("git_head")
    return Result(path=path, rel=rel, data=d, command=command, kind=kind, verdict=verdict, headline=headline,
                  evidence=evidence, device=dev.get("name") or dev.get("type"),
                  git_head=head if isinstance(head, str) else None, git_dirty=d.get("git_dirty"),
                  started_at=str(d.get("started_at") or ""))


def gather(root: Path, exclude: Path | None = None) -> Gathered:
    """Every JSON file below `root` (except those under `exclude`), sorted by path."""
    out = Gathered()
    for path in sorted(root.rglob("*.json")):
        if exclude is not None and (exclude == path.parent or exclude in path.parents):
            continue
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        try:
            d = load_json(path)
            if not isinstance(d, dict):
                raise Unreadable(f"a JSON {type(d).__name__}, not a result object")
            if "command" not in d:
                out.other.append(rel)  # e.g. a Perfetto trace written with --perfetto
                continue
            if not isinstance(d["command"], str):
                raise Unreadable("`command` is not a string")
            if is_input(d["command"]):
                continue
            out.results.append(summarise(path, rel, d))
        except Unreadable as exc:
            out.unreadable.append((rel, str(exc)))
    return out


def companion(result: Result, key: str, default_name: str) -> Path | None:
    """A file a result names in its `files` (event log, per-request records): looked for beside the result
    first (the runs/ folder may have moved), then at the recorded path."""
    files = result.data.get("files") if isinstance(result.data.get("files"), dict) else {}
    recorded = files.get(key)
    names = [Path(recorded).name] if isinstance(recorded, str) else []
    names.append(default_name)
    for name in names:
        if name and (result.path.parent / name).is_file():
            return result.path.parent / name
    if isinstance(recorded, str) and Path(recorded).is_file():
        return Path(recorded)
    return None


def attach(gathered: Gathered, root: Path) -> None:
    """Read the event log of every trace and the per-request records of every load run; a file that is named
    but cannot be read joins the UNREADABLE list (a missing one is only noted: it was not archived)."""
    for r in gathered.results:
        if r.command in ("trace", "trace check"):
            key, name, reader = "events", "events.jsonl", read_events
            if r.command == "trace check" and isinstance(r.data.get("log"), str):
                name = Path(r.data["log"]).name
        elif r.command == "bench load":
            key, name, reader = "requests", r.path.with_suffix(".requests.jsonl").name, read_records
        else:
            continue
        path = companion(r, key, name)
        if path is None:
            continue
        try:
            r.attached[key] = reader(path)
        except Unreadable as exc:
            rel = path.relative_to(root).as_posix() if root in path.parents else str(path)
            gathered.unreadable.append((rel, str(exc)))
