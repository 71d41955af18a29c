"""`labkit patch` (list / apply / revert on a copy of the project) and `labkit notes` (a note from a template)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from .helpers import run_cli

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A copy of engine/, patches/ and notes/ as the project root, outside any git checkout."""
    root = tmp_path / "proj"
    for part in ("engine", "patches", "notes"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("LAB_ROOT", str(root))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.setenv("RUNS_DIR", str(tmp_path / "runs"))
    return root


def test_patch_apply_and_revert_round_trip(project, capsys):
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    runner = project / "engine" / "runner.py"
    before = runner.read_bytes()
    code, out, err = run_cli(["patch", "list"], capsys)
    assert code == 0, err
    flat = " ".join(out.split())
    assert "fault-slot-in-wrong-block" in flat and "applied" not in flat.replace("applies", "")
    code, out, err = run_cli(["patch", "apply", "fault-slot-in-wrong-block"], capsys)
    assert code == 0, err
    assert runner.read_bytes() != before and "labkit trace --case C" in " ".join(out.split())
    code, out, _ = run_cli(["patch", "list"], capsys)
    assert re.search(r"fault-slot-in-wrong-block\S*\s.*?applied", " ".join(out.split()))
    code, _, err = run_cli(["patch", "apply", "fault-slot-in-wrong-block.patch"], capsys)
    assert code == 2 and "already applied" in err
    code, _, err = run_cli(["patch", "revert", "fault-slot-in-wrong-block"], capsys)
    assert code == 0, err
    assert runner.read_bytes() == before
    code, _, err = run_cli(["patch", "revert", "fault-slot-in-wrong-block"], capsys)
    assert code == 2 and "not applied" in err


def test_patch_refuses_unknown_and_conflicting_patches(project, capsys):
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    code, _, err = run_cli(["patch", "apply", "no-such"], capsys)
    assert code == 2 and "no-such" in err and "fault-slot-in-wrong-block" in err
    runner = project / "engine" / "runner.py"
    text = runner.read_text()
    # Break the context the slot patch needs: it must refuse and leave the file as it was.
    runner.write_text(text.replace("slot_mapping = [seq.block_table[-1] * bs", "slot_mapping = [seq.block_table[-1]*bs"))
    broken = runner.read_bytes()
    code, _, err = run_cli(["patch", "apply", "fault-slot-in-wrong-block"], capsys)
    assert code == 2 and "does not apply cleanly" in err and len(err.strip().splitlines()) == 1
    assert runner.read_bytes() == broken
    code, out, err = run_cli(["patch", "show", "exp-chunk-any-sequence"], capsys)
    assert code == 0 and "experiment" in out and "diff --git" in out


def test_notes_new_fills_the_facts_and_never_overwrites(project, capsys, tmp_path):
    code, out, err = run_cli(["notes", "new", "trace", "--title", "Why does R2 wait in step 3?"], capsys)
    assert code == 0, err
    notes = list((tmp_path / "runs" / "notes").glob("*.md"))
    assert len(notes) == 1 and notes[0].name.endswith("-trace-why-does-r2-wait-in-step-3.md")
    text = notes[0].read_text()
    assert text.startswith("# Trace note: Why does R2 wait in step 3?")
    date_line = next(line for line in text.splitlines() if line.startswith("- Date"))
    assert re.search(r"\d{4}-\d\d-\d\d; (CPU|.+ x\d+)", date_line) and "commit" in date_line
    code, _, err = run_cli(["notes", "new", "trace", "--title", "Why does R2 wait in step 3?"], capsys)
    assert code == 2 and "already exists" in err and notes[0].read_text() == text
    code, _, err = run_cli(["notes", "new", "poem"], capsys)
    assert code == 2 and "trace" in err
    code, out, _ = run_cli(["notes", "list"], capsys)
    assert code == 0 and {"bench", "logits", "trace"} <= set(out.split())
