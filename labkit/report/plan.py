"""The lab plan (workloads/labs.yaml): which labs there are, the command and evidence each needs,
and which result under runs/ answers it."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit import yamlfile
from labkit.errors import LabkitError
from labkit.output import EVIDENCE_KINDS, project_root

PLAN_FILE = Path("workloads") / "labs.yaml"
_ABSENT = object()


def plan_path() -> Path:
    return project_root() / PLAN_FILE


@dataclass
class Slot:
    """One result a lab needs: conditions on the result JSON and/or a glob on its path under runs/."""

    label: str
    match: dict[str, Any]
    file: str | None = None

    def accepts(self, data: dict, rel_path: str) -> bool:
        if self.file is not None and not fnmatch.fnmatch(rel_path, self.file):
            return False
        return all(_accepts(lookup(data, key), want) for key, want in self.match.items())


@dataclass
class Lab:
    id: str
    title: str
    command: str
    evidence: str
    slots: list[Slot]
    questions: list[str] = field(default_factory=list)
    producer: str | None = None
    gpus: int = 1            # GPUs its commands need
    view: str | None = None   # a section of its own in the report (labkit/report/views.py)


def lookup(data: Any, dotted: str) -> Any:
    """data["a"]["b"] for "a.b"; _ABSENT where a part is missing. Keys may hold dashes
    (config.server.--scheduling-policy)."""
    cur = data
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _ABSENT
        cur = cur[part]
    return cur


def _accepts(value: Any, want: Any) -> bool:
    options = want if isinstance(want, list) else [want]
    for w in options:
        if w is None and (value is _ABSENT or value is None):
            return True
        if value is not _ABSENT and w is not None and value == w:
            return True
    return False


def evidence_satisfies(have: str | None, need: str) -> bool:
    """gpu-measured answers every need; cpu-executed answers all but gpu-measured; and so on down the list."""
    if have not in EVIDENCE_KINDS:
        return False
    return EVIDENCE_KINDS.index(have) <= EVIDENCE_KINDS.index(need)


def _text(entry: dict, key: str, where: str, required: bool = True) -> str | None:
    v = entry.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, str) or not v.strip():
        raise LabkitError(f"{where}: `{key}` must be a non-empty string")
    return v.strip()


def _slot(entry: Any, where: str, index: int) -> Slot:
    if not isinstance(entry, dict):
        raise LabkitError(f"{where}: results[{index}] must be a mapping with `match` and/or `file`")
    match = entry.get("match") or {}
    if not isinstance(match, dict) or not all(isinstance(k, str) for k in match):
        raise LabkitError(f"{where}: results[{index}].match must map dotted field names to values")
    file = entry.get("file")
    if file is not None and not isinstance(file, str):
        raise LabkitError(f"{where}: results[{index}].file must be a glob string")
    if not match and file is None:
        raise LabkitError(f"{where}: results[{index}] matches every file; give `match` or `file`")
    label = entry.get("label") or str(match.get("command") or file)
    return Slot(str(label), match, file)


def parse(data: Any, source: str) -> list[Lab]:
    if not isinstance(data, dict) or not isinstance(data.get("labs"), list) or not data["labs"]:
        raise LabkitError(f"{source}: expected a mapping with a non-empty `labs` list")
    labs, seen = [], set()
    for i, entry in enumerate(data["labs"]):
        where = f"{source}: labs[{i}]"
        if not isinstance(entry, dict):
            raise LabkitError(f"{where} must be a mapping")
        lab_id = _text(entry, "id", where)
        where = f"{source}: lab {lab_id}"
        if lab_id in seen:
            raise LabkitError(f"{where}: the id is used twice")
        seen.add(lab_id)
        evidence = _text(entry, "evidence", where)
        if evidence not in EVIDENCE_KINDS:
            raise LabkitError(f"{where}: evidence must be one of {', '.join(EVIDENCE_KINDS)}, not {evidence!r}")
        results = entry.get("results")
        if not isinstance(results, list) or not results:
            raise LabkitError(f"{where}: `results` must list at least one result")
        questions = entry.get("questions") or []
        if not isinstance(questions, list) or not all(isinstance(q, str) for q in questions):
            raise LabkitError(f"{where}: `questions` must be a list of strings")
        gpus = entry.get("gpus", 1)
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
            raise LabkitError(f"{where}: `gpus` must be a whole number of GPUs, at least 1")
        view = _text(entry, "view", where, required=False)
        slots = [_slot(r, where, j) for j, r in enumerate(results)]
        if view is not None:
            from labkit.report.views import VIEWS

            if view not in VIEWS:
                raise LabkitError(f"{where}: view must be one of {', '.join(VIEWS)}, not {view!r}")
            lacking = [x for x in VIEWS[view].slots if x not in {slot.label for slot in slots}]
            if lacking:
                raise LabkitError(f"{where}: view {view} reads results labelled {', '.join(VIEWS[view].slots)}; "
                                  f"none is labelled {', '.join(lacking)}")
        labs.append(Lab(id=lab_id, title=_text(entry, "title", where), gpus=gpus, view=view,
                        command=_text(entry, "command", where), evidence=evidence,
                        slots=slots, questions=questions,
                        producer=_text(entry, "producer", where, required=False)))
    return labs


def load_plan(path: Path | None = None) -> list[Lab]:
    path = path or plan_path()
    if not path.is_file():
        raise LabkitError(f"lab plan {path} not found")
    return parse(yamlfile.read(path, "lab plan"), str(path))
