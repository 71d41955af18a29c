"""Named YAML inputs (workloads/cases/NAME.yaml, workloads/bench/NAME.yaml): find one by name or path, read it.

Read with libyaml's parser where pyyaml has it (yaml.CSafeLoader, several times faster on a big file), and
strictly: a key given twice in one mapping is an error naming its lines, not "the second wins".
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import yaml

from labkit.errors import LabkitError

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class DuplicateKeyError(yaml.constructor.ConstructorError):
    pass


class StrictLoader(_Base):
    """The safe loader (C where available) that refuses a mapping with a key given twice. A YAML merge (`<<`)
    may still be overridden by the mapping's own keys, as YAML says."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base constructor words that error
                    continue
                if first is not None:
                    a, b = first.line + 1, key_node.start_mark.line + 1
                    where = f"on line {a}" if a == b else f"on lines {a} and {b}"
                    raise DuplicateKeyError(None, None, f"key {key!r} given twice {where}", key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, StrictLoader.construct_yaml_map)


def load(text: str):
    """YAML text as Python values (StrictLoader)."""
    return yaml.load(text, Loader=StrictLoader)


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
        raw = path.read_bytes()
    except OSError as e:
        raise LabkitError(f"{path}: cannot read the {what} file: {e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LabkitError(f"{path}: the {what} file is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                          f"{e.start})") from None
    try:
        return load(text)
    except yaml.YAMLError as e:
        raise LabkitError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
