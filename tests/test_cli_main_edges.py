# ruff: noqa: F811 - the probe fixture is imported from test_cli.py
"""The entry point's edges, as a user sees them: an error with no message still says something, control
characters are shown escaped, a long path in a reason stays whole in a terminal, only LABKIT_DEBUG=1 shows a
traceback, the reason wraps only when stderr is a terminal, results record the in-process command line (and
only for that run), and usage lines write required arguments bare."""
from __future__ import annotations

import os
import shutil
import sys

import pytest

from labkit import cli, output
from labkit.errors import LabkitError

from .helpers import run_cli
from .test_cli import _raise, probe_command as probe  # noqa: F401 - a fixture, under this file's name


def test_an_error_without_a_message_still_says_so(probe, capsys):
    probe["fn"] = _raise(LabkitError(""))
    code, _, err = run_cli(["probe"], capsys)
    assert (code, err) == (2, "labkit: (no message)\n")


def test_control_characters_in_a_reason_are_shown_escaped_without_quotes(probe, capsys):
    probe["fn"] = _raise(LabkitError("bad value \x1b[31mred"))
    code, _, err = run_cli(["probe"], capsys)
    assert (code, err) == (2, "labkit: bad value \\x1b[31mred\n")


def test_a_long_path_in_a_terminal_reason_is_never_cut():
    path = "/work/labkit/runs/" + "x" * 60 + "/check.json"
    lines = cli.reason_lines(f"cannot read {path}: no such file", 40).splitlines()
    assert any(path in line for line in lines)


def test_only_labkit_debug_1_shows_the_traceback(probe, capsys, monkeypatch):
    monkeypatch.setenv("LABKIT_DEBUG", "0")
    probe["fn"] = _raise(RuntimeError("kaboom"))
    code, out, err = run_cli(["probe"], capsys)
    assert code == 2 and "Traceback" not in out + err
    assert err == "labkit: RuntimeError: kaboom (set LABKIT_DEBUG=1 for the traceback)\n"


def _envelope_argv() -> list[str]:
    return output.envelope("probe", device="cpu", model_dir=None, evidence="simulated")["argv"]


def test_results_record_the_in_process_command_line_and_only_during_that_run(probe, capsys):
    seen = {}
    probe["fn"] = lambda: seen.setdefault("argv", _envelope_argv())
    code, _, err = run_cli(["probe"], capsys)
    assert code == 0, err
    assert seen["argv"] == ["labkit", "probe"]
    assert _envelope_argv() == list(sys.argv)           # the next result, outside main(), is not stamped "probe"


def _reason_at(monkeypatch, capsys, probe, *, stderr_tty: bool, stdout_tty: bool) -> str:
    monkeypatch.setattr(shutil, "get_terminal_size", lambda *a, **k: os.terminal_size((40, 24)))
    probe["fn"] = _raise(LabkitError("the model folder /work/labkit/models/tiny does not hold a config.json"))
    with pytest.raises(SystemExit):
        monkeypatch.setattr(sys.stderr, "isatty", lambda: stderr_tty)
        monkeypatch.setattr(sys.stdout, "isatty", lambda: stdout_tty)
        cli.main(["probe"])
    return capsys.readouterr().err


def test_the_reason_wraps_when_stderr_is_a_terminal_whatever_stdout_is(monkeypatch, capsys, probe):
    err = _reason_at(monkeypatch, capsys, probe, stderr_tty=True, stdout_tty=False)
    assert len(err.splitlines()) > 1 and all(len(line) <= 40 for line in err.splitlines())
    err = _reason_at(monkeypatch, capsys, probe, stderr_tty=False, stdout_tty=True)
    assert len(err.splitlines()) == 1


def test_usage_writes_required_arguments_bare_and_optional_ones_in_brackets(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run_cli(["bench", "compare", "--help"], capsys)
    assert code == 0
    usage = " ".join(out.split())
    assert "A.json B.json" in usage and "[A.json]" not in usage
    code, out, _ = run_cli(["model", "info", "--help"], capsys)
    assert code == 0
    assert "[DIR]" in " ".join(out.split())
