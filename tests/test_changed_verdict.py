"""CHANGED says what it means. With an uncommitted edit under engine/, `labkit trace` takes the case's expected
states as a diff, so a refactor that breaks the schedule would end CHANGED with exit 0. The verdict text then
names the changed files and says that a change meant to keep behaviour is judged with --no-expect-changes,
where it FAILs; the report carries the same sentence for CHANGED traces.

(tests/test_trace.py::test_engine_change_is_detected_by_git_and_unknown_without_it applies a real patch in a
real git tree; here the git answer is given, so the runs stay in-process.)"""
from __future__ import annotations

import json

import pytest

from .helpers import run_cli

SENTENCE = "a change meant to keep behaviour is judged with --no-expect-changes (a FAIL there)"


def _engine_differs(monkeypatch, files: str):
    import labkit.trace.command as command

    monkeypatch.setattr(command, "engine_changes", lambda: (True, f"engine/ differs from HEAD: {files}"))


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_an_engine_edit_that_changes_states_says_how_to_judge_a_refactor(tiny_model, tmp_path, capsys,
                                                                         monkeypatch):
    _engine_differs(monkeypatch, "scheduler.py, block_manager.py")
    runs = tmp_path / "runs"
    # lifecycle under budget 100 moves R2 to step 2: a schedule that differs from the case, every invariant kept.
    code, out, err = run_cli(["trace", "--case", "lifecycle", "--max-num-batched-tokens", "100", "--model", tiny_model,
                              "--device", "cpu", "-q", "--out", str(runs / "trace-lifecycle")], capsys)
    text = _flat(out)
    assert code == 0, out + err
    assert "CHANGED" in text and "engine/ differs from HEAD: scheduler.py, block_manager.py" in text
    assert SENTENCE in text
    log = runs / "trace-lifecycle" / "events.jsonl"

    # A replay is judged as the run was, with the same words; judged strictly, the same log FAILs.
    code, out, _ = run_cli(["trace", "check", str(log), "--case", "lifecycle", "--out", str(tmp_path / "r.json")],
                           capsys)
    assert code == 0 and SENTENCE in _flat(out)
    code, out, _ = run_cli(["trace", "check", str(log), "--case", "lifecycle", "--no-expect-changes",
                            "--out", str(tmp_path / "r2.json")], capsys)
    assert code == 1 and "FAIL" in out and SENTENCE not in _flat(out)

    code, _, err = run_cli(["report", "--runs", str(runs), "--out", str(tmp_path / "report")], capsys)
    assert code == 0, err
    labs = {lab["lab"]: lab for lab in json.loads((tmp_path / "report" / "manifest.json").read_text())["labs"]}
    lifecycle = labs["trace-lifecycle"]
    assert lifecycle["verdict"] == "CHANGED"
    assert "every invariant held" in lifecycle["headline"] and "scheduler.py" in lifecycle["headline"]
    assert lifecycle["headline"].endswith(SENTENCE)
    assert SENTENCE in (tmp_path / "report" / "report.md").read_text()


def test_an_override_alone_is_an_experiment_and_gets_no_refactor_advice(tiny_model, tmp_path, capsys,
                                                                        monkeypatch):
    import labkit.trace.command as command

    monkeypatch.setattr(command, "engine_changes", lambda: (False, "engine/ is HEAD's"))
    code, out, err = run_cli(["trace", "--case", "lifecycle", "--max-num-batched-tokens", "100", "--model", tiny_model,
                              "--device", "cpu", "-q", "--out", str(tmp_path / "o")], capsys)
    assert code == 0, out + err
    assert "CHANGED" in out and "override --max-num-batched-tokens 100" in _flat(out) and SENTENCE not in _flat(out)


@pytest.mark.parametrize("files", ["scheduler.py", ", ".join(f"file_with_a_long_name_{i}.py" for i in range(5))
                                   + " and 7 more"])
def test_the_report_never_cuts_the_sentence_off(tiny_model, tmp_path, capsys, monkeypatch, files):
    _engine_differs(monkeypatch, files)
    runs = tmp_path / "runs"
    code, out, err = run_cli(["trace", "--case", "lifecycle", "--max-num-batched-tokens", "100", "--model", tiny_model,
                              "--device", "cpu", "-q", "--out", str(runs / "trace-lifecycle")], capsys)
    assert code == 0, out + err
    code, _, err = run_cli(["report", "--runs", str(runs), "--out", str(tmp_path / "report")], capsys)
    assert code == 0, err
    labs = {lab["lab"]: lab for lab in json.loads((tmp_path / "report" / "manifest.json").read_text())["labs"]}
    headline = labs["trace-lifecycle"]["headline"]
    assert headline.endswith(SENTENCE) and "engine/ differs from HEAD: " in headline
    assert len(headline) <= 240
