"""`labkit report verify ARCHIVE`: check an evidence archive after the fact, on any machine, without a GPU.

1. Every file of the manifest is in the archive with the recorded size and sha256, and the archive holds
   nothing the manifest does not list.
2. Every trace's event log is validated again against its case (`labkit trace check LOG --case NAME`): the
   verdict must be the one its check.json states.
3. Every logits check is judged again from the two collections' arrays (`labkit logits-check compare`) with
   the thresholds it recorded: verdict, row statuses and worst distances must be the ones it states.

Exit 0 when all of it holds, 1 naming the first file that differs (every difference is printed), 2 when the
archive is not there.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from labkit.errors import LabkitError
from labkit.report.archive import ARCHIVE_ROOT, sha256_file
from labkit.report.results import Unreadable, load_json, summarise


@dataclass
class Verification:
    files: int = 0
    traces: int = 0
    logits: int = 0
    problems: list[tuple[str, str]] = field(default_factory=list)   # (file in the archive, what differs)

    def differ(self, name: str, why: str) -> None:
        self.problems.append((name, why))

    def to_dict(self) -> dict:
        return {"files_checked": self.files, "traces_revalidated": self.traces, "logits_rejudged": self.logits,
                "verdict": "FAIL" if self.problems else "PASS",
                "differences": [{"file": f, "what": w} for f, w in self.problems]}


def _invoke(app, args: list[str]) -> int:
    """Run a labkit sub-command in this process, as the CLI would (standalone: usage errors exit 2), its printing
    swallowed; its exit code. A LabkitError it raises propagates."""
    import typer.main

    command = typer.main.get_command(app)
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        try:
            command.main(args=args, prog_name="labkit", standalone_mode=True)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    return 0


def _extract(archive: Path, into: Path, v: Verification) -> Path | None:
    try:
        with tarfile.open(archive, "r:*") as tar:
            tar.extractall(into, filter="data")
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        v.differ(archive.name, f"cannot read the archive ({type(exc).__name__}: {exc})")
        return None
    base = into / ARCHIVE_ROOT
    if not base.is_dir():
        v.differ(archive.name, f"no {ARCHIVE_ROOT}/ folder: not an archive `labkit report` wrote")
        return None
    return base


def _check_files(base: Path, manifest: dict, v: Verification) -> None:
    entries = manifest.get("files")
    if not isinstance(entries, list):
        v.differ("manifest.json", "no `files` list")
        return
    listed = set()
    for entry in entries:
        name = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            v.differ("manifest.json", f"a files entry without a file name: {entry!r}"[:200])
            continue
        listed.add(name)
        path = base / name
        v.files += 1
        if not path.is_file():
            v.differ(name, "listed in the manifest but missing from the archive")
            continue
        got = sha256_file(path)
        if got != entry.get("sha256"):
            v.differ(name, f"sha256 {got[:16]}..., the manifest says {str(entry.get('sha256'))[:16]}...")
        elif path.stat().st_size != entry.get("bytes"):
            v.differ(name, f"{path.stat().st_size} bytes, the manifest says {entry.get('bytes')}")
    for path in sorted(base.rglob("*")):
        name = path.relative_to(base).as_posix()
        if path.is_file() and name != "manifest.json" and name not in listed:
            v.differ(name, "in the archive but not in the manifest")


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _results(base: Path, command: str) -> list[tuple[Path, dict]]:
    out = []
    for path in sorted((base / "runs").rglob("*.json")):
        try:
            d = load_json(path)
        except Unreadable:
            continue
        if isinstance(d, dict) and d.get("command") == command:
            out.append((path, d))
    return out


def _verdict(path: Path, d: dict) -> str:
    try:
        return summarise(path, path.name, d).verdict
    except Unreadable as exc:
        return f"UNREADABLE ({exc})"


def _revalidate_traces(base: Path, tmp: Path, v: Verification) -> None:
    from labkit.trace import command as trace_cmd

    for path, d in _results(base, "trace"):
        log = path.parent / Path(str(_dict(d.get("files")).get("events") or "events.jsonl")).name
        name = log.relative_to(base).as_posix()
        if not log.is_file():
            v.differ(path.relative_to(base).as_posix(), "its event log is not in the archive: cannot re-validate")
            continue
        out = tmp / f"replay-{v.traces}.json"
        case = d.get("case")
        args = ["check", str(log), "--out", str(out)] + (["--case", case] if isinstance(case, str) and case else [])
        v.traces += 1
        try:
            _invoke(trace_cmd.app, args)
            replay = json.loads(out.read_text(encoding="utf-8"))
        except (LabkitError, OSError, ValueError) as exc:
            v.differ(name, f"could not re-validate against case {d.get('case')}: {exc}")
            continue
        stated, again = _verdict(path, d), _verdict(out, replay)
        if stated != again:
            first = _dict(_dict(replay.get("report")).get("first_failure")).get("message")
            v.differ(name, f"re-validated against case {d.get('case')}: {again}, its check.json says {stated}"
                     + (f" (first failure: {first})" if first else ""))


def _collection(base: Path, runs_root: str | None, compare_path: Path, prefix: str | None) -> Path | None:
    if not isinstance(prefix, str):
        return None
    p = Path(prefix)
    candidates = []
    if runs_root:
        try:
            candidates.append(base / "runs" / p.relative_to(runs_root))
        except ValueError:
            pass
    candidates.append(compare_path.parent / p.name)
    for c in candidates:
        if Path(f"{c}.json").is_file() and Path(f"{c}.npz").is_file():
            return c
    return None


def _close(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or (math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12))
    return a == b


def _row_verdicts(check: dict) -> list:
    rows = check.get("rows")
    return [r.get("verdict") or r.get("status") for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _rejudge_logits(base: Path, runs_root: str | None, tmp: Path, v: Verification) -> None:
    from labkit.logits import command as logits_cmd

    for path, d in _results(base, "logits-check compare"):
        name = path.relative_to(base).as_posix()
        names = ["lhs", "rhs"] + [s for s in ("truth", "reference") if _dict(d.get(s)).get("prefix")]
        sides = [_collection(base, runs_root, path, _dict(d.get(s)).get("prefix")) for s in names]
        if None in sides:
            v.differ(name, "its logits collections (PREFIX.json + .npz) are not in the archive: cannot re-judge")
            continue
        args = ["compare", "--out", str(tmp / f"logits-{v.logits}.json")]
        for side, prefix in zip(names, sides):
            args += [f"--{side}", str(prefix)]
        th = _dict(d.get("thresholds"))
        if _dict(d.get("gate")).get("rule") == "fixed":
            # The same gate, and the thresholds the user gave (defaults are re-derived from the dtype).
            args += ["--gate", "fixed"]
            given = _dict(th.get("given"))
            for key, flag in (("max_abs", "--max-abs"), ("rel_l2", "--rel-l2"), ("kv_max_abs", "--kv-max-abs")):
                if given.get(key) and isinstance(th.get(key), (int, float)):
                    args += [flag, repr(th[key])]
        v.logits += 1
        try:
            _invoke(logits_cmd.app, args)
            again = json.loads((tmp / f"logits-{v.logits - 1}.json").read_text(encoding="utf-8"))
        except (LabkitError, OSError, ValueError) as exc:
            v.differ(name, f"could not re-judge from its arrays: {exc}")
            continue
        stated_s, again_s = _dict(d.get("summary")), _dict(again.get("summary"))
        if again.get("verdict") != d.get("verdict"):
            v.differ(name, f"re-judged from its arrays: {again.get('verdict')}, the file says {d.get('verdict')}")
        elif _row_verdicts(again) != _row_verdicts(d):
            v.differ(name, "re-judged from its arrays: row statuses differ from the file's")
        else:
            for key in ("worst_max_abs", "worst_rel_l2"):
                a, b = _dict(again_s.get(key)).get("value"), _dict(stated_s.get(key)).get("value")
                if not _close(a, b):
                    v.differ(name, f"re-judged from its arrays: {key} {a}, the file says {b}")
                    break


def verify(archive: Path) -> Verification:
    if not archive.is_file():
        raise LabkitError(f"report verify: no such archive {archive}")
    v = Verification()
    with tempfile.TemporaryDirectory(prefix="labkit-verify-") as tmp_dir:
        tmp = Path(tmp_dir)
        base = _extract(archive, tmp / "x", v)
        if base is None:
            return v
        try:
            manifest = load_json(base / "manifest.json")
            if not isinstance(manifest, dict):
                raise Unreadable("not a JSON object")
        except Unreadable as exc:
            v.differ("manifest.json", f"cannot read it: {exc}")
            return v
        _check_files(base, manifest, v)
        _revalidate_traces(base, tmp, v)
        runs_root = manifest.get("runs") if isinstance(manifest.get("runs"), str) else None
        _rejudge_logits(base, runs_root, tmp, v)
    return v
