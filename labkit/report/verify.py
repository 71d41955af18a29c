"""`labkit report verify ARCHIVE`: check an evidence archive after the fact, on any machine, without a GPU.

It trusts only the archive: nothing it reads, hashes or prints comes from the verifier's own disk (except the
project's case files, which a trace is re-validated against by name).

0. The archive is read member by member, twice: first up to its manifest (evidence/manifest.json, at most
   MAX_MANIFEST_BYTES), then to write out only the files the manifest lists, each at the size it records,
   judged from its header before its data is read. At most MAX_MEMBERS members and MAX_BYTES bytes, a
   GNU long-name or PAX header at most MAX_HEADER_BYTES (tarfile reads those whole before it yields the member
   they name: a 200 MiB one was read into memory), only regular files and folders, every name a relative path
   inside `evidence/` (an absolute name, a `..`, a link, a device, a name given twice, a file the manifest
   does not list or lists at another size: each is a difference, and nothing of it is extracted).
1. Every file of the manifest is in the archive with the recorded size and sha256, every manifest name is a
   relative path inside the archive's evidence folder, and the archive holds nothing the manifest does not
   list.
2. Every trace's event log is validated again against its case (`labkit trace check LOG --case NAME`): the
   verdict must be the one its check.json states.
3. Every logits check is judged again from its collections' arrays (`labkit logits-check compare`) with
   the thresholds it recorded: verdict, row statuses and worst distances (and an fp8-kv check's cost of FP8)
   must be the ones it states.

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
from pathlib import Path, PurePosixPath

from labkit.errors import LabkitError
from labkit.report.archive import ARCHIVE_ROOT, sha256_file
from labkit.report.results import Unreadable, load_json, parse_json_bytes, summarise

# Above what `labkit report` writes (a real model's full-vocabulary logits rows are 0.6 MB each: a few suites
# of them make a few GB), below what would fill a disk. A member declared past the cap is never read.
MAX_MEMBERS = 20_000
MAX_BYTES = 4 << 30
# A name (GNU long name, PAX path) is at most a few KiB; a PAX header of a few records. The manifest lists at
# most MAX_MEMBERS files in about 200 bytes each.
MAX_HEADER_BYTES = 64 << 10
MAX_MANIFEST_BYTES = 64 << 20
MANIFEST = f"{ARCHIVE_ROOT}/manifest.json"


class _HeaderTooLarge(Exception):
    pass


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile's member header, with the extended headers (GNU long name/link, PAX) refused past
    MAX_HEADER_BYTES before tarfile reads them (it reads one whole, into memory, to name the next member).
    _proc_member is the hook tarfile documents for subclasses."""

    def _proc_member(self, tarfile_):
        if self.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                         tarfile.SOLARIS_XHDTYPE) and self.size > MAX_HEADER_BYTES:
            kind = "a GNU long-name" if self.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK) \
                else "a PAX"
            raise _HeaderTooLarge(f"{kind} header declares {self.size} bytes (the verifier's cap: "
                                  f"{MAX_HEADER_BYTES}): not read")
        return super()._proc_member(tarfile_)


@dataclass
class Verification:
    files: int = 0
    traces: int = 0
    logits: int = 0
    problems: list[tuple[str, str]] = field(default_factory=list)   # (file in the archive, what differs)
    unread: set[str] = field(default_factory=set)  # listed files not written out (a difference said why)

    def differ(self, name: str, why: str) -> None:
        # Names come from the archive: a newline or an escape sequence in one must not forge a line of output.
        self.problems.append((_printable(name), why))

    def to_dict(self) -> dict:
        return {"files_checked": self.files, "traces_revalidated": self.traces, "logits_rejudged": self.logits,
                "verdict": "FAIL" if self.problems else "PASS",
                "differences": [{"file": f, "what": w} for f, w in self.problems]}


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text))


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


def _load(path: Path):
    """load_json, with the ValueError json raises past Python's integer-digits limit made Unreadable too: the
    file is the archive's, and a file that cannot be read differs."""
    try:
        return load_json(path)
    except ValueError as exc:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise Unreadable(f"not readable JSON ({exc})") from None


def inside_name(name) -> PurePosixPath | None:
    """`name` as a relative path with no `..`, `.` or empty part (what a name in the archive may be), or None."""
    if not isinstance(name, str) or "\\" in name or "\x00" in name:
        return None
    if any(part in ("", ".", "..") for part in name.split("/")):  # "" also catches "/abs", "a//b", "a/"
        return None
    return PurePosixPath(name)


def _kind(member: tarfile.TarInfo) -> str:
    for test, what in ((member.issym, "a symbolic link"), (member.islnk, "a hard link"),
                       (member.ischr, "a character device"), (member.isblk, "a block device"),
                       (member.isfifo, "a FIFO")):
        if test():
            return what
    return "not a regular file"


def _members(archive: Path, v: Verification, max_members: int, max_bytes: int):
    """The archive's members in order (a stream: each header is judged before its data is read), within the
    caps; a cap reached is a difference and ends the iteration (the caller sees `v.problems` grow)."""
    count = total = 0
    with tarfile.open(archive, "r|*", tarinfo=_BoundedTarInfo) as tar:
        for member in tar:
            count += 1
            total += member.size
            if count > max_members:
                v.differ(archive.name, f"more than {max_members} members (the verifier's cap): not a "
                         "`labkit report` archive")
                return
            if total > max_bytes:
                # Judged from the header: the data of a member past the cap is never read or written.
                v.differ(archive.name, f"its members hold more than {max_bytes} bytes (the verifier's cap; "
                         f"{member.name} alone declares {member.size})")
                return
            yield tar, member


def _read_manifest(archive: Path, v: Verification, max_members: int, max_bytes: int) -> bytes | None:
    """The manifest's bytes (the first pass: nothing is written), or None (a difference says why)."""
    for tar, member in _members(archive, v, max_members, max_bytes):
        if member.name != MANIFEST or not member.isfile():
            continue
        if member.size > MAX_MANIFEST_BYTES:
            v.differ("manifest.json", f"declares {member.size} bytes (the verifier's cap: {MAX_MANIFEST_BYTES}): "
                     "not read")
            return None
        return tar.extractfile(member).read()
    if not v.problems:
        v.differ(archive.name, f"no {MANIFEST}: not an archive `labkit report` wrote")
    return None


def _sizes(manifest: dict) -> dict[str, int | None]:
    """What the manifest records of each file it names: name in the archive -> bytes (None: no byte count)."""
    entries = manifest.get("files")
    out: dict[str, int | None] = {}
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, dict) and isinstance(e.get("file"), str):
            n = e.get("bytes")
            out.setdefault(f"{ARCHIVE_ROOT}/{e['file']}", n if isinstance(n, int) and not isinstance(n, bool)
                           and n >= 0 else None)
    return out


def _extract(archive: Path, into: Path, v: Verification, max_members: int = MAX_MEMBERS,
             max_bytes: int = MAX_BYTES) -> tuple[Path, dict] | None:
    """Write the archive's evidence/ files into `into`, one member at a time, within the caps and at the sizes
    the manifest records; every member that is not plain, listed evidence is a difference and is not written.
    (the evidence folder, the manifest), or None when the archive cannot be used."""
    try:
        raw = _read_manifest(archive, v, max_members, max_bytes)
        if raw is None:
            return None
        try:
            manifest = parse_json_bytes(raw)
            if not isinstance(manifest, dict):
                raise Unreadable("not a JSON object")
        except Unreadable as exc:
            v.differ("manifest.json", f"cannot read it: {exc}")
            return None
        sizes = _sizes(manifest)
        sizes[MANIFEST] = len(raw)
        seen: set[str] = set()
        for tar, member in _members(archive, v, max_members, max_bytes):
            name = member.name
            rel = inside_name(name.rstrip("/") if member.isdir() else name)
            if rel is None or rel.parts[0] != ARCHIVE_ROOT:
                v.differ(name, f"a member outside {ARCHIVE_ROOT}/ (an absolute name, `..`, or another "
                         "folder): not read")
                continue
            if member.isdir():
                continue
            if not member.isfile():
                v.differ(name, f"{_kind(member)}: only regular files are evidence; not read")
                continue
            if name in seen:
                v.differ(name, "in the archive more than once")
                continue
            seen.add(name)
            short = name[len(ARCHIVE_ROOT) + 1:]
            if name not in sizes:
                v.differ(short, "in the archive but not in the manifest")
                continue
            if sizes[name] is None:
                v.unread.add(short)
                v.differ(short, "the manifest gives no byte count for it: not read")
                continue
            if member.size != sizes[name]:
                v.unread.add(short)
                v.differ(short, f"declares {member.size} bytes, the manifest says {sizes[name]}: not read")
                continue
            try:
                # (Judged above: a regular file under evidence/. The data filter too, where this Python has
                # it: 3.11.4 and later.)
                tar.extract(member, into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
            except OSError as exc:  # a name this file system cannot hold (too long, say): that file only
                v.unread.add(short)
                v.differ(short, f"cannot be written here to check it ({exc.strerror or exc})")
        if v.problems and any(f == archive.name for f, _ in v.problems):
            return None
    except _HeaderTooLarge as exc:
        v.differ(archive.name, str(exc))
        return None
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        v.differ(archive.name, f"cannot read the archive ({type(exc).__name__}: {exc})")
        return None
    return into / ARCHIVE_ROOT, manifest


def _within(base: Path, path: Path) -> bool:
    try:
        path.resolve().relative_to(base.resolve())
    except (ValueError, OSError):
        return False
    return True


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
        rel = inside_name(name)
        path = base / rel if rel is not None else None
        if path is None or not _within(base, path):
            # Never looked up: `/etc/hostname` or `../x` would be read from the verifier's own disk.
            v.differ("manifest.json", f"names {name!r}"[:200] + f", not a relative path inside the archive's "
                     f"{ARCHIVE_ROOT}/ folder")
            continue
        if name in listed:
            v.differ(name, "listed in the manifest more than once")
            continue
        listed.add(name)
        v.files += 1
        if name in v.unread:
            continue  # its difference is said already
        try:
            present = path.is_file()
        except OSError as exc:  # a name no file system here can hold (300 characters, say)
            v.differ(name, f"cannot be looked up here ({exc.strerror or exc}): not in the archive as written")
            continue
        if not present:
            v.differ(name, "listed in the manifest but missing from the archive")
            continue
        got = sha256_file(path)
        if got != entry.get("sha256"):
            v.differ(name, f"sha256 {got[:16]}..., the manifest says {str(entry.get('sha256'))[:16]}...")
        elif path.stat().st_size != entry.get("bytes"):
            v.differ(name, f"{path.stat().st_size} bytes, the manifest says {str(entry.get('bytes'))[:40]}")
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
            d = _load(path)
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
    from labkit.trace.cases import list_cases

    for path, d in _results(base, "trace"):
        log = path.parent / Path(str(_dict(d.get("files")).get("events") or "events.jsonl")).name
        if not log.is_file() or not _within(base, log):
            v.differ(path.relative_to(base).as_posix(), "its event log is not in the archive: cannot re-validate")
            continue
        name = log.relative_to(base).as_posix()
        out = tmp / f"replay-{v.traces}.json"
        case = d.get("case")
        if case is not None and case not in list_cases():
            # A path would be read from the verifier's disk: only the project's own cases are trusted.
            v.differ(name, f"its case {str(case)[:80]!r} is not one of this project's cases (workloads/cases/): "
                     "cannot re-validate")
            continue
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
        files = [Path(f"{c}.json"), Path(f"{c}.npz")]
        if all(f.is_file() and _within(base, f) for f in files):
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
        names = ["lhs", "rhs"] + [s for s in ("truth", "reference", "baseline", "baseline_reference")
                                  if _dict(d.get(s)).get("prefix")]
        sides = [_collection(base, runs_root, path, _dict(d.get(s)).get("prefix")) for s in names]
        if None in sides:
            v.differ(name, "its logits collections (PREFIX.json + .npz) are not in the archive: cannot re-judge")
            continue
        args = ["compare", "--out", str(tmp / f"logits-{v.logits}.json")]
        for side, prefix in zip(names, sides):
            args += [f"--{side.replace('_', '-')}", str(prefix)]
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
            pairs = [(key, _dict(again_s.get(key)).get("value"), _dict(stated_s.get(key)).get("value"))
                     for key in ("worst_max_abs", "worst_rel_l2")]
            if "kv_cost" in d:  # the fp8-kv suite's cost of FP8
                pairs.append(("kv_cost.ratio", _dict(again.get("kv_cost")).get("ratio"),
                              _dict(d["kv_cost"]).get("ratio")))
            for key, a, b in pairs:
                if not _close(a, b):
                    v.differ(name, f"re-judged from its arrays: {key} {a}, the file says {b}")
                    break


def verify(archive: Path, max_members: int = MAX_MEMBERS, max_bytes: int = MAX_BYTES) -> Verification:
    if not archive.is_file():
        raise LabkitError(f"report verify: no such archive {archive}")
    v = Verification()
    with tempfile.TemporaryDirectory(prefix="labkit-verify-") as tmp_dir:
        tmp = Path(tmp_dir)
        got = _extract(archive, tmp / "x", v, max_members, max_bytes)
        if got is None:
            return v
        base, manifest = got
        _check_files(base, manifest, v)
        _revalidate_traces(base, tmp, v)
        runs_root = manifest.get("runs") if isinstance(manifest.get("runs"), str) else None
        _rejudge_logits(base, runs_root, tmp, v)
    return v
