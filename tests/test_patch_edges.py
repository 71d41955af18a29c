"""`labkit patch` at its edges: the state `list --json` reports (applies / applied / conflicts) under the names the
other commands take, the error a refused apply names, `show` printing the diff as it is, the 160-column switch
between table and blocks, `prove` refusing a NAME with --all, and the index's caught-by column."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
SLOT = "fault-slot-in-wrong-block"
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A copy of engine/ and patches/ as the project root, outside any git checkout."""
    root = tmp_path / "proj"
    for part in ("engine", "patches"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("LAB_ROOT", str(root))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.setenv("RUNS_DIR", str(tmp_path / "runs"))
    return root


def _states(capsys) -> dict[str, str]:
    code, out, err = run_cli(["patch", "list", "--json"], capsys)
    assert code == 0, err
    return {row["name"]: row["state"] for row in json.loads(out)}


def _break_slot_context(project: Path) -> None:
    runner = project / "engine" / "runner.py"
    text = runner.read_text()
    assert "slots = [t[p // bs] * bs + p % bs" in text
    runner.write_text(text.replace("slots = [t[p // bs] * bs + p % bs", "slots = [t[p // bs]*bs + p % bs"))


@needs_git
def test_list_json_names_each_patch_as_apply_takes_it_and_tells_applied_applies_and_conflicts(project, capsys):
    states = _states(capsys)
    assert sorted(states) == sorted(p.stem for p in (project / "patches").glob("*.patch"))
    assert set(states.values()) == {"applies"}
    code, _, err = run_cli(["patch", "apply", SLOT], capsys)
    assert code == 0, err
    assert _states(capsys)[SLOT] == "applied"
    assert run_cli(["patch", "revert", SLOT], capsys)[0] == 0
    _break_slot_context(project)
    states = _states(capsys)
    assert states[SLOT] == "conflicts"
    assert states["fault-causal-mask-dropped"] == "applies"


@needs_git
def test_a_refused_apply_names_the_file_and_line_git_could_not_patch(project, capsys):
    _break_slot_context(project)
    code, _, err = run_cli(["patch", "apply", SLOT], capsys)
    assert code == 2
    assert "does not apply cleanly" in err and "patch failed: engine/runner.py:" in err


@needs_git
def test_show_prints_the_diff_as_it_is_and_whether_it_is_applied(project, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    diff = (project / "patches" / f"{SLOT}.patch").read_text()
    code, out, err = run_cli(["patch", "show", SLOT], capsys)
    assert code == 0, err
    assert f"{SLOT}.patch (fault, applies)" in out
    shown = [line.rstrip() for line in out.splitlines()]
    for line in diff.splitlines():
        assert line.rstrip() in shown, line          # brackets in code are text, not markup
    assert run_cli(["patch", "apply", SLOT], capsys)[0] == 0
    code, out, _ = run_cli(["patch", "show", SLOT + ".patch"], capsys)
    assert code == 0 and f"{SLOT}.patch (fault, applied)" in out


@needs_git
@pytest.mark.parametrize("columns, table", [(159, False), (160, True)])
def test_patch_list_is_one_table_from_160_columns(project, capsys, monkeypatch, columns, table):
    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, err = run_cli(["patch", "list"], capsys)
    assert code == 0, err
    header = any(cells == ["patch", "kind", "state", "what it changes", "how to see it"]
                 for cells in ([c.strip() for c in line.split("┃")[1:-1]] for line in out.splitlines()))
    assert header == table
    assert (SLOT in out) and all(len(line) <= columns for line in out.splitlines())


def test_prove_refuses_a_name_together_with_all(project, capsys, monkeypatch):
    from labkit import patch_prove

    def prove(*args, **kwargs):   # refused before any proof starts (a proof takes minutes)
        raise RuntimeError("a proof started")

    monkeypatch.setattr(patch_prove, "prove", prove)
    code, _, err = run_cli(["patch", "prove", SLOT, "--all"], capsys)
    assert code == 2 and "one patch NAME or --all" in err


def test_every_fault_in_the_index_names_the_check_that_catches_it():
    from labkit.patch import index

    faults = [e for e in index() if e.kind == "fault"]
    assert faults and all(e.caught_by.split()[0] in ("trace", "test", "logits") for e in faults)
    slot = next(e for e in faults if e.name == f"{SLOT}.patch")
    assert slot.caught_by == "trace C slots"
