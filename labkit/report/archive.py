"""What travels in the evidence archive, its sha256 manifest, and the provenance a reviewer needs to rebuild
the runs: the patches applied to engine/, the engine's diff against the commit, and every package version.

Archive layout (everything under evidence/):
    report.md, report.html, manifest.json      the report (the manifest lists every other file's sha256)
    runs/...                                   each result, its Markdown twin, its folder (event log, TSV,
                                               logits arrays), and files the report could not read
    notes/*.md                                 the lab notes
    provenance/engine.diff, packages.txt       `git diff HEAD -- engine/`, name==version of every package
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import subprocess
import tarfile
from pathlib import Path

from labkit.output import project_root
from labkit.report.results import Gathered, Result

ARCHIVE_ROOT = "evidence"
LOG_SUFFIXES = (".log",)  # server and tool logs: only with --with-logs (large, machine paths)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _collections(r: Result) -> list[Path]:
    """The two logits collections (PREFIX.json + PREFIX.npz) a compare was judged from."""
    out = []
    for side in ("lhs", "rhs"):
        prefix = (r.data.get(side) or {}).get("prefix") if isinstance(r.data.get(side), dict) else None
        if not isinstance(prefix, str):
            continue
        p = Path(prefix)
        for base in (p, r.path.parent / p.name):
            found = [Path(f"{base}{ext}") for ext in (".json", ".npz") if Path(f"{base}{ext}").is_file()]
            if found:
                out += found
                break
    return out


def run_files(root: Path, gathered: Gathered, dest: Path, with_logs: bool) -> list[Path]:
    """Every file under runs/ that travels: a result with the files that share its name (X.md,
    X.requests.jsonl), its folder when it has one of its own, the logits collections a check used, and every
    file the report could not read (the reviewer should see what it was)."""
    files: set[Path] = set()
    for r in gathered.results:
        p = r.path
        if p.parent == root:
            siblings = [f for f in root.iterdir() if f.name.startswith(p.stem + ".")]
        else:
            siblings = list(p.parent.iterdir())
        files.update(siblings)
        files.update(_collections(r))
        files.add(p)
    files.update(root / rel for rel, _ in gathered.unreadable if (root / rel).exists())
    keep = []
    for f in files:
        f = f.resolve() if f.is_symlink() else f
        if not f.is_file() or dest in f.parents or root not in f.parents:
            continue
        if f.suffix in LOG_SUFFIXES and not with_logs:
            continue
        keep.append(f)
    return sorted(set(keep))


def note_files() -> list[Path]:
    return sorted(p for p in (project_root() / "notes").glob("*.md") if p.is_file())


def _git(*args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(project_root()), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(dest: Path) -> tuple[list[Path], dict]:
    """Write provenance/engine.diff and provenance/packages.txt into dest; return them and what the manifest
    says of them (commit, whether the engine differs from it, the state of every patch)."""
    folder = dest / "provenance"
    folder.mkdir(parents=True, exist_ok=True)
    info: dict = {}
    top = _git("rev-parse", "--show-toplevel")
    own = top is not None and top.returncode == 0 and Path(top.stdout.strip()).resolve() == project_root().resolve()
    diff = _git("diff", "HEAD", "--", "engine/") if own else None
    if diff is not None and diff.returncode == 0:
        text = diff.stdout
        info["engine_diff"] = {"file": "provenance/engine.diff", "changed": bool(text.strip()),
                               "against": (_git("rev-parse", "HEAD").stdout or "").strip() or None}
    else:
        text = "# not a git checkout of labkit: no diff of engine/ against a commit could be taken\n"
        info["engine_diff"] = {"file": "provenance/engine.diff", "changed": None, "against": None}
    (folder / "engine.diff").write_text(text, encoding="utf-8")
    info["patches"] = _patch_states()
    packages = sorted({f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                       if d.metadata["Name"]}, key=str.lower)
    (folder / "packages.txt").write_text("\n".join(packages) + "\n", encoding="utf-8")
    info["packages_file"] = "provenance/packages.txt"
    return [folder / "engine.diff", folder / "packages.txt"], info


def _patch_states() -> list[dict] | str:
    """Every patch of patches/ and whether it is applied to engine/ now (`labkit patch list`'s states)."""
    try:
        from labkit import patch

        return [{"name": e.name, "kind": e.kind, "state": patch.state(e)} for e in patch.index()]
    except Exception as exc:  # noqa: BLE001 - no git, no patches folder: say so, keep the report
        return f"unknown ({type(exc).__name__}: {exc})"


def manifest_entries(pairs: list[tuple[Path, str]]) -> list[dict]:
    return [{"file": name, "bytes": path.stat().st_size, "sha256": sha256_file(path)} for path, name in pairs]


# Deflate's fastest level. The logits arrays of a lab plan's checks are gigabytes of bfloat16 values stored as
# float32, which tarfile's default (9) packed at ~1 MB/s: on the H200 (session 13) the report of a whole plan was
# still archiving after 300 s. Level 1 packs the same arrays ~47x faster into an archive ~18% larger.
ARCHIVE_COMPRESSLEVEL = 1


def write_archive(archive: Path, pairs: list[tuple[Path, str]], advance=None) -> None:
    """Pack the pairs (file, name under evidence/) into archive, whole or not at all; advance(bytes) after each."""
    tmp = archive.with_name(f".{archive.name}.tmp")
    with tarfile.open(tmp, "w:gz", compresslevel=ARCHIVE_COMPRESSLEVEL) as tar:
        for path, name in pairs:
            tar.add(path, arcname=f"{ARCHIVE_ROOT}/{name}", recursive=False)
            if advance is not None:
                advance(path.stat().st_size)
    tmp.replace(archive)
