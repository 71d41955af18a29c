"""What a traced run is given and how it is judged (labkit/trace/run.py, labkit/trace/command.py): the engine settings
from the case, the command's overrides (an option not given leaves the case's value) and the device; which
changes under engine/ count as an edit (bytecode does not), how many files the reason names; and an engine
known to be its HEAD's is no reason to expect changes."""
from __future__ import annotations

import subprocess

import pytest

import labkit.trace.command as command
from labkit.engine_args import EngineArgs
from labkit.trace import run
from labkit.trace.cases import parse_case


def _case(**engine):
    return parse_case({"name": "x", "engine": engine, "requests": [{"id": "A", "prompt": {"tokens": [1, 2]}}]})


def test_the_case_keeps_its_settings_where_an_option_was_not_given():
    kw = run.engine_kwargs(_case(max_num_seqs=4), {"max_num_seqs": None, "max_num_batched_tokens": 64}, "cpu")
    assert kw["max_num_seqs"] == 4 and kw["max_num_batched_tokens"] == 64 and kw["enforce_eager"] is True


def test_a_device_given_replaces_the_cases_and_auto_leaves_it():
    assert run.engine_kwargs(_case(device="cpu"), {}, "auto")["device"] == "cpu"
    assert run.engine_kwargs(_case(device="cpu"), {}, "cuda")["device"] == "cuda"
    assert run.engine_kwargs(_case(), {}, "auto")["device"] == "auto"


def _git_says(monkeypatch, porcelain: str):
    monkeypatch.setattr(run.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=porcelain, stderr=""))


def test_bytecode_under_engine_is_not_an_edit(monkeypatch):
    _git_says(monkeypatch, "?? engine/__pycache__/\n?? engine/kernels/x.cpython-312.pyc\n")
    assert run.engine_changes() == (False, "engine/ is HEAD's")
    _git_says(monkeypatch, " M engine/runner.py\n?? engine/__pycache__/\n")
    changed, how = run.engine_changes()
    assert changed is True and how.endswith(": runner.py")


@pytest.mark.parametrize("n, tail", [(5, ""), (6, " and 1 more"), (8, " and 3 more")])
def test_the_reason_names_five_changed_files_and_counts_the_rest(monkeypatch, n, tail):
    _git_says(monkeypatch, "".join(f" M engine/f{i}.py\n" for i in range(n)))
    changed, how = run.engine_changes()
    assert changed is True
    assert how.endswith("f0.py, f1.py, f2.py, f3.py, f4.py" + tail)


def test_an_engine_that_is_heads_is_no_reason_to_expect_changes(monkeypatch):
    monkeypatch.setattr(command, "engine_changes", lambda: (False, "engine/ is HEAD's"))
    assert command.changes_expected(EngineArgs(), None) == (False, "")
    expect, why = command.changes_expected(EngineArgs(max_num_seqs=2), None)
    assert expect is True and why == "override --max-num-seqs 2"
    monkeypatch.setattr(command, "engine_changes", lambda: (True, "engine/ differs from HEAD: a.py"))
    assert command.changes_expected(EngineArgs(), None) == (True, "engine/ differs from HEAD: a.py")
