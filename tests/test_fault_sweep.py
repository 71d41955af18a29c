"""Issue 22's fault sweep in the slow tier: `labkit serve --tensor-parallel-size 2 --device cpu` stopped at a sweep of
moments
(0.2 s after its start to ready, and again under load) by each fault (SIGTERM, SIGINT, SIGHUP or SIGKILL to the
frontend, SIGKILL to the engine core, SIGKILL to a tensor-parallel worker). After each: the exit status
docs/serving.md documents, no process, no /dev/shm segment and no socket folder left, every client answered
(scripts/fault_sweep.py says how each is judged). Each trial prints a line and, when it fails, the command
that replays it."""
from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import load_script

pytest.importorskip("fastapi")
pytest.importorskip("zmq")

REPO = Path(__file__).resolve().parents[1]
MOMENTS = [0.2, 1.0, 2.5, "ready", "load"]  # seconds after the start (importing, loading), then served
GRACE_S = 10.0


def _sweep():
    return load_script("fault_sweep", "labkit_fault_sweep")


@pytest.mark.slow
@pytest.mark.parametrize("at", MOMENTS, ids=str)
def test_a_fault_at_any_moment_leaves_nothing_and_ends_as_documented(tiny_model, at, capsys):
    sweep = _sweep()
    results = []
    for fault in sweep.FAULTS:
        r = sweep.trial(tiny_model, 2, "cpu", at, fault, GRACE_S)
        results.append(r)
        with capsys.disabled():
            print(f"\nfault sweep: {sweep.line(r)}  [{r['replay']}]", flush=True)
    failed = [f"{sweep.line(r)}\n  replay: {r['replay']}\n  log: {r['log']}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    if at == "load":  # the clients were really streaming when the fault came
        assert all(r["clients"] for r in results if r["fault"] != "frontend-SIGKILL")


def test_a_process_gone_while_its_tasks_are_listed_has_no_children(monkeypatch):
    """The watcher walks /proc while the server's processes exit: a process whose task folder vanishes as it is
    listed (FileNotFoundError from the listing, as CI met in session 31) has no children, and the walk goes on."""
    import os

    sweep = _sweep()
    real_glob = Path.glob

    def vanishing(self, pattern):
        if str(self).startswith("/proc/") and str(self).endswith("/task"):
            raise FileNotFoundError(2, "No such file or directory", str(self))
        return real_glob(self, pattern)
    monkeypatch.setattr(Path, "glob", vanishing)
    assert sweep.children(os.getpid()) == []
    assert sweep.descendants(os.getpid()) == set()


def test_the_documented_exit_statuses():
    # What the sweep holds the server to (docs/serving.md, "Overload, shutdown, failure").
    expected = _sweep().expected_exit
    for sig in ("SIGTERM", "SIGINT", "SIGHUP"):
        assert expected(f"frontend-{sig}", handled=True, ready=False) == {0}
        assert expected(f"frontend-{sig}", handled=True, ready=True) == {0}
    assert expected("frontend-SIGKILL", handled=True, ready=True) == {-9}
    for target in ("core", "worker"):
        assert expected(f"{target}-SIGKILL", handled=True, ready=False) == {2}  # could not start
        assert expected(f"{target}-SIGKILL", handled=True, ready=True) == {1}   # died while serving


@pytest.mark.slow
def test_the_sweep_sends_sigint_to_a_server_that_can_take_it_when_run_as_a_background_job(tiny_model, tmp_path):
    """A shell's background job (`bash .ci/run &`) starts with SIGINT ignored, which the server would inherit and
    honour: the sweep gives its servers SIGINT at its default (a fresh-clone CI failed frontend-SIGINT at 0.2 s)."""
    import subprocess
    import sys

    parent = ("import signal, subprocess, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
              "sys.exit(subprocess.run([sys.executable, 'scripts/fault_sweep.py', '--model', sys.argv[1], "
              "'--tensor-parallel-size', '2', '--device', 'cpu', '--at', '0.2', '--faults', 'frontend-SIGINT'])"
              ".returncode)")
    res = subprocess.run([sys.executable, "-c", parent, tiny_model], cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0 and "1 trials, 0 failed" in res.stdout, res.stdout[-2000:] + res.stderr[-1000:]
