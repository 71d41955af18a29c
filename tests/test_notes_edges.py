"""`labkit notes`: a note's state, its file name, its numbered questions and its filled-in date line."""
from __future__ import annotations

from types import SimpleNamespace

from labkit import notes


def test_a_note_with_one_todo_left_is_not_written(tmp_path):
    one, none, two = tmp_path / "one.md", tmp_path / "none.md", tmp_path / "two.md"
    one.write_text("# x\n\nTODO\n")
    none.write_text("# x\n\ndone\n")
    two.write_text("TODO TODO\n")
    assert notes.note_state(one) == "1 TODO"
    assert notes.note_state(two) == "2 TODO"
    assert notes.note_state(none) == "written"
    assert notes.note_state(tmp_path / "missing.md") == "none"


def test_a_long_title_makes_a_file_name_of_sixty_characters():
    assert notes._slug("Why Does R2 wait?") == "why-does-r2-wait"
    assert notes._slug("a" * 100) == "a" * 60
    assert notes._slug("???") == "note"


def test_a_lab_note_numbers_its_questions_from_one():
    lab = SimpleNamespace(id="lab-x", title="Lab X", evidence="cpu-executed", command="labkit smoke\n",
                          questions=["first?", "second?"], view=None)
    lines = notes.lab_note(lab).splitlines()
    assert "1. first?" in lines and "2. second?" in lines
    assert not any(line.startswith("0. ") for line in lines)


def test_the_date_line_gets_date_machine_and_commit_in_that_order():
    text = notes.render("# <title>\n\n- Date, machine, commit:\n", "my question", "2026-01-02", "CPU (x, 2 cores)",
                        "commit abc")
    lines = text.splitlines()
    assert lines[0] == "# my question"
    assert lines[2] == "- Date, machine, commit: 2026-01-02; CPU (x, 2 cores); commit abc"


def test_notes_init_counts_what_it_wrote_and_what_it_kept(tmp_path, monkeypatch, capsys):
    import shutil
    from pathlib import Path

    from labkit.report.plan import load_plan

    from .helpers import run_cli

    repo = Path(__file__).resolve().parents[1]
    root = tmp_path / "proj"
    shutil.copytree(repo / "workloads", root / "workloads")
    (root / "notes").mkdir()
    monkeypatch.setenv("LAB_ROOT", str(root))
    first, second, third = [lab.id for lab in load_plan()][:3]
    (root / "notes" / f"{first}.md").write_text("mine\n")
    code, out, err = run_cli(["notes", "init", "--lab", first, "--lab", second, "--lab", third], capsys)
    assert code == 0, err
    flat = " ".join(out.split())
    assert "wrote 2 note(s)" in flat and "kept 1 that exist" in flat
    assert (root / "notes" / f"{first}.md").read_text() == "mine\n"
    assert (root / "notes" / f"{second}.md").is_file() and (root / "notes" / f"{third}.md").is_file()
