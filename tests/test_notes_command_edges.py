"""`labkit notes` at its edges: the GPUs a note names under CUDA_VISIBLE_DEVICES, a note without a title, the
commit on its date line, an optimisation lab's trade lines, what `init` and `list` print, which notes the report
counts as the user's."""
from __future__ import annotations

import datetime as _dt
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from labkit import notes

from .helpers import run_cli

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """notes/ and workloads/ copied as the project root, outside any git checkout."""
    root = tmp_path / "proj"
    for part in ("notes", "workloads"):
        shutil.copytree(REPO / part, root / part)
    monkeypatch.setenv("LAB_ROOT", str(root))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.setenv("RUNS_DIR", str(tmp_path / "runs"))
    return root


@pytest.fixture
def two_gpus(tmp_path, monkeypatch):
    """An nvidia-smi that lists an H200 (index 0) and an H100 (index 1)."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\nprintf '0, GPU-aa11-22, NVIDIA H200\\n1, GPU-ab33-44, NVIDIA H100\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")


@pytest.mark.parametrize("visible, expected", [
    ("GPU-a", None),              # a prefix of both UUIDs: CUDA cannot tell which, so it sees no GPU
    ("1,7", "NVIDIA H100 x1"),    # CUDA stops at 7, keeping the GPU before it
    ("", None),                   # set but empty: no GPU is visible
])
def test_the_machine_line_names_the_gpus_cuda_would_see(two_gpus, monkeypatch, visible, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    line = notes.machine()
    if expected is None:
        assert line.startswith("CPU ("), line
    else:
        assert line == expected


def test_a_note_without_a_title_keeps_the_placeholder_and_is_named_after_its_template(project, capsys):
    code, out, err = run_cli(["notes", "new", "trace"], capsys)
    assert code == 0, err
    today = _dt.date.today().isoformat()
    path = project / "notes" / f"{today}-trace-trace.md"
    assert path.is_file(), sorted(p.name for p in (project / "notes").iterdir())
    text = path.read_text()
    template = (project / "notes" / "templates" / "trace.md").read_text()
    assert text.splitlines()[0] == template.splitlines()[0]      # "# Trace note: <question>", to fill in
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_a_title_fills_only_the_first_placeholder_of_the_heading():
    text = notes.render("# <change> vs <baseline>\n\n- Date:\n", "fp8 KV", "2026-01-02", "CPU", "commit x")
    assert text == "# fp8 KV vs <baseline>\n\n- Date: 2026-01-02; CPU; commit x\n"


@pytest.mark.parametrize("dirty", [False, True])
def test_the_date_line_names_the_commit_by_twelve_characters_and_says_when_the_tree_is_dirty(
        project, capsys, monkeypatch, dirty):
    monkeypatch.setattr(notes, "git_head", lambda: "0123456789abcdef0123456789abcdef01234567")
    monkeypatch.setattr(notes, "git_dirty", lambda: dirty)
    out_path = project / "notes" / "n.md"
    code, _, err = run_cli(["notes", "new", "bench", "--title", "q", "--out", str(out_path)], capsys)
    assert code == 0, err
    date_line = next(line for line in out_path.read_text().splitlines() if line.startswith("- Date"))
    expected = "commit 0123456789ab" + (" (dirty)" if dirty else "")
    assert date_line.endswith("; " + expected), date_line


def test_only_an_optimisation_lab_asks_what_it_bought_and_what_it_cost():
    lab = dict(id="x", title="X", evidence="gpu-executed", command="labkit bench\n", questions=["why?"])
    plain = notes.lab_note(SimpleNamespace(**lab, view=None))
    trade = notes.lab_note(SimpleNamespace(**lab, view="fp8-kv"))
    assert "What it bought" not in plain and "What it cost" not in plain
    assert "What it bought" in trade and "What it cost" in trade
    # the trade lines belong to the conclusion, before its closing blank line
    assert trade.index("What it does not show") < trade.index("What it bought") < trade.index("What it cost")


@pytest.mark.parametrize("n_kept, ellipsis", [(8, False), (9, True)])
def test_notes_init_names_up_to_eight_kept_notes_and_marks_more(project, capsys, n_kept, ellipsis):
    from labkit.report.plan import load_plan

    ids = [lab.id for lab in load_plan()][:n_kept]
    for lab_id in ids:
        (project / "notes" / f"{lab_id}.md").write_text("mine\n")
    args = ["notes", "init"] + [a for lab_id in ids for a in ("--lab", lab_id)]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    flat = " ".join(out.split())
    assert "wrote 0 note(s)" in flat and f"kept {n_kept} that exist" in flat
    assert ("..." in flat) == ellipsis, flat


def test_notes_list_shows_each_templates_title_without_the_heading_marker(project, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run_cli(["notes", "list"], capsys)
    assert code == 0, err
    assert "Trace note: <question>" in out
    assert "# Trace note" not in out


def test_the_readme_of_notes_is_not_a_users_note(project):
    assert "TODO" in (project / "notes" / "README.md").read_text()
    (project / "notes" / "trace-A.md").write_text("TODO\n")
    assert [p.name for p in notes.user_notes()] == ["trace-A.md"]
