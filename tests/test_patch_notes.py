"""`labkit patch` (list / apply / revert on a copy of the project) and `labkit notes` (a note from a template)."""
from __future__ import annotations

import os
import re
import shutil
import tarfile
from pathlib import Path

import pytest

from .helpers import run_cli

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A copy of engine/, patches/, notes/ and workloads/ as the project root, outside any git checkout."""
    root = tmp_path / "proj"
    for part in ("engine", "patches", "notes", "workloads"):
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
    assert "slots = [t[p // bs] * bs + p % bs" in text
    runner.write_text(text.replace("slots = [t[p // bs] * bs + p % bs", "slots = [t[p // bs]*bs + p % bs"))
    broken = runner.read_bytes()
    code, _, err = run_cli(["patch", "apply", "fault-slot-in-wrong-block"], capsys)
    assert code == 2 and "does not apply cleanly" in err and len(err.strip().splitlines()) == 1
    assert runner.read_bytes() == broken
    code, out, err = run_cli(["patch", "show", "exp-chunk-any-sequence"], capsys)
    assert code == 0 and "experiment" in out and "diff --git" in out


def test_notes_new_fills_the_facts_and_never_overwrites(project, capsys, tmp_path):
    code, out, err = run_cli(["notes", "new", "trace", "--title", "Why does R2 wait in step 3?"], capsys)
    assert code == 0, err
    notes = list((project / "notes").glob("*-trace-*.md"))  # notes/ is tracked; runs/ is not
    assert len(notes) == 1 and notes[0].name.endswith("-trace-why-does-r2-wait-in-step-3.md")
    assert not (tmp_path / "runs" / "notes").exists()
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


def test_notes_init_writes_one_note_per_lab_and_keeps_what_a_user_wrote(project, capsys, tmp_path):
    from labkit.report.plan import load_plan

    labs = load_plan()
    mine = project / "notes" / "trace-chunk.md"
    mine.write_text("# my own chunk note, no markers left\n")
    code, out, err = run_cli(["notes", "init"], capsys)
    assert code == 0, err
    assert mine.read_text() == "# my own chunk note, no markers left\n"
    for lab in labs:
        text = (project / "notes" / f"{lab.id}.md").read_text()
        if lab.id != "trace-chunk":
            assert text.startswith(f"# {lab.title}") and "TODO" in text and lab.command.splitlines()[0] in text
            assert all(q in text for q in lab.questions)
    before = (project / "notes" / "trace-A.md").read_text()
    (project / "notes" / "trace-A.md").write_text(before.replace("TODO", "observed: R1 4/3 after step 1", 1))
    edited = (project / "notes" / "trace-A.md").read_text()
    code, out, _ = run_cli(["notes", "init"], capsys)
    assert code == 0 and f"kept {len(labs)}" in " ".join(out.split())
    assert (project / "notes" / "trace-A.md").read_text() == edited
    code, _, err = run_cli(["notes", "init", "--lab", "no-such-lab"], capsys)
    assert code == 2 and "no-such-lab" in err
    # The report lists the notes that still hold TODO, and gives each lab its note's state (over one result: a
    # folder of none is refused).
    (tmp_path / "runs").mkdir(exist_ok=True)
    assert run_cli(["principles", "slots", "--out", tmp_path / "runs" / "principles" / "slots.json"], capsys)[0] == 0
    code, _, err = run_cli(["report", "--runs", tmp_path / "runs", "--out", tmp_path / "report"], capsys)
    assert code == 0, err
    md = (tmp_path / "report" / "report.md").read_text()
    todo = md.split("## Notes still holding TODO", 1)[1].split("##", 1)[0]
    assert "notes/trace-A.md" in todo and "notes/trace-chunk.md" not in todo
    assert re.search(r"\| trace-chunk \| MISSING \|[^\n]*\| written \|", md)
    assert re.search(r"\| trace-B \| MISSING \|[^\n]*\| \d+ TODO \|", md)
    with tarfile.open(tmp_path / "report" / "evidence.tar.gz") as tar:
        assert "evidence/notes/trace-chunk.md" in tar.getnames()


def test_notes_machine_line_names_the_visible_gpus_without_torch(tmp_path, monkeypatch):
    from labkit.notes import machine

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0, GPU-aa11-22, NVIDIA H200\\n1, GPU-bb33-44, NVIDIA H100\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert machine() == "NVIDIA H200 x2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert machine() == "NVIDIA H100 x1"
    # by UUID, whole or a unique prefix, as CUDA reads them; a MIG instance is a slice of these GPUs
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bb33-44")
    assert machine() == "NVIDIA H100 x1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa,1")
    assert machine() == "NVIDIA H200 x2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-0123-4567")
    assert machine() == "NVIDIA H200 x2"
    # CUDA stops at the first entry it cannot read: nothing before it, nothing visible
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    assert machine().startswith("CPU (")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert machine().startswith("CPU (")


def test_patch_list_at_80_columns_breaks_no_word(capsys, monkeypatch):
    from labkit.patch import index

    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli(["patch", "list"], capsys)
    assert code == 0, err
    assert all(len(line) <= 80 for line in out.splitlines())
    shown = set(out.split())
    for e in index():
        assert e.name[:-6] in shown
        for word in (e.what + " " + e.how).split():
            assert word in shown, word     # a folded cell shows "lifecyc" and "le" instead
