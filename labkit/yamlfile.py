"""Named YAML inputs (workloads/cases/NAME.yaml, workloads/bench/NAME.yaml): find one by name or path, read it."""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import yaml

from labkit.errors import LabkitError


def names_in(dirs: list[Path]) -> list[str]:
    found: set[str] = set()
    for d in dirs:
        if d.is_dir():
            found.update(p.stem for p in d.glob("*.yaml"))
    return sorted(found)


def resolve(name_or_path: str | os.PathLike, dirs: list[Path], what: str) -> Path:
    """A value with a slash or a .yaml ending, or an existing file, is a path; anything else a NAME."""
    s = str(name_or_path)
    p = Path(s).expanduser()
    if "/" in s or os.sep in s or s.endswith((".yaml", ".yml")) or p.is_file():
        if not p.is_file():
            raise LabkitError(f"{what} file not found: {s}")
        return p
    for d in dirs:
        if (d / f"{s}.yaml").is_file():
            return d / f"{s}.yaml"
    names = names_in(dirs)
    where = f"not a file, nor a name in {', '.join(map(str, dirs))}"
    close = difflib.get_close_matches(s, names, n=3, cutoff=0.6)
    if close:
        raise LabkitError(f"unknown {what} {s!r} ({where}); did you mean {' or '.join(map(repr, close))}?")
    raise LabkitError(f"unknown {what} {s!r} ({where}); known: {', '.join(names) or 'none'}")


def read(path: Path, what: str):
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise LabkitError(f"{path}: cannot read the {what} file: {e}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise LabkitError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
