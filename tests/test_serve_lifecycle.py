"""`labkit serve lifecycle`: the judges on hand-made observations (each fails on what it must catch, the idle
baseline above all), a scenario that hangs past its deadline, the exit codes and one-line errors, and the whole
command on the tiny model on the CPU as a user runs it (every scenario PASS, the table in 80 columns, the result
picked up by the report's service-lifecycle lab)."""
from __future__ import annotations

import asyncio
import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.serve import lifecycle as L

from .helpers import run_cli

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

pytestmark = pytest.mark.timeout(600)
REPO = Path(__file__).resolve().parents[1]
IDLE = {"ok": True, "seconds": 0.2, "problems": [], "holders": {}}
LEAK = {"ok": False, "seconds": 5.0, "problems": ["1 request(s) running in the engine", "12 of 2048 KV blocks in use"],
        "holders": {"lifecycle-cancel-1": 2900}}


def _done(rid: str, **kw) -> dict:
    return {"rid": rid, "status": 200, "tokens": 8, "chunks": 8, "finish_reason": "length", "error": None,
            "done": True, **kw}


# Observations of scenarios that held, as the command records them.
HELD = {
    "cancel-running": {"victim": _done("lifecycle-cancel-1", tokens=3, finish_reason=None, done=False),
                       "abort_counted": True, "late_tokens": 1, "engine_tokens": 5, "others": [_done("other")],
                       "baseline": IDLE},
    "cancel-waiting": {"waited": True, "victim": _done("lifecycle-waiting-1", tokens=0, finish_reason=None, done=False),
                       "engine_tokens": 0, "abort_counted": True, "others": [_done("ahead")], "baseline": IDLE},
    "overload": {"queue_full": True, "health_s": [0.004, 0.1], "health_errors": 0,
                 "excess": [{"status": 503, "type": "overloaded_error", "seconds": 0.05}] * 4,
                 "others": [_done("ahead"), _done("queued")], "baseline": IDLE},
    "slow-consumer": {"fast": {"requests": 30, "tokens": 480, "errors": [], "max_gap_s": 0.1},
                      "slow": _done("slow", tokens_after_pause=900, chunks_after_pause=700), "baseline": IDLE},
    "shutdown": {"stream": _done("inflight", tokens=900, finish_reason=None,
                                 error="the server is shutting down; the request was cancelled"),
                 "exit_code": 0, "exit_s": 2.8, "restart": {"served": True, "seconds": 6.0}, "baseline": IDLE},
}


def judged(name: str, **changes) -> list[str]:
    o = copy.deepcopy(HELD[name])
    o.update(changes)
    return L.JUDGES[name](o)


# --- the judges --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", L.SCENARIOS)
def test_a_scenario_that_held_passes_and_says_what_it_saw_in_one_line(name):
    assert judged(name) == []
    line = L.observed(name, copy.deepcopy(HELD[name]))
    assert "\n" not in line and "idle again in 0.20 s" in line


@pytest.mark.parametrize("name", L.SCENARIOS)
def test_every_scenario_fails_when_the_server_does_not_come_back_to_idle(name):
    """Whatever else held, KV blocks still in use after the scenario fail it, naming them and their holder."""
    problems = judged(name, baseline=LEAK)
    assert len(problems) == 1, problems
    assert "12 of 2048 KV blocks in use" in problems[0] and "lifecycle-cancel-1 (2900 KV tokens)" in problems[0]
    assert judged(name, baseline=None) == ["the baseline was never checked"]


def test_cancel_running_is_judged_by_its_abort_and_no_output_after_it_never_a_token_count():
    assert judged("cancel-running", late_tokens=L.LATE_ROWS_MAX, engine_tokens=40) == []
    [late] = judged("cancel-running", late_tokens=2888)
    assert "lifecycle-cancel-1 got 2888 tokens in engine steps after its abort" in late
    assert "unknown" in judged("cancel-running", late_tokens=None)[0]
    assert "no abort" in judged("cancel-running", abort_counted=False)[0]
    [other] = judged("cancel-running", others=[_done("other", finish_reason=None, error="boom", done=False)])
    assert other.startswith("the other request other did not finish normally: error: boom")


def test_cancel_waiting_fails_on_any_token_for_the_cancelled_request():
    assert "got 2 tokens" in judged("cancel-waiting", victim=_done("w", tokens=2))[0]
    assert "the engine produced 1 tokens" in judged("cancel-waiting", engine_tokens=1)[0]
    assert "no request was seen waiting" in judged("cancel-waiting", waited=False)[0]


def test_overload_fails_unless_every_excess_request_is_a_prompt_503():
    admitted = [{"status": 200, "seconds": 3.4}] + [{"status": 503, "type": "overloaded_error", "seconds": 0.05}] * 3
    problems = judged("overload", excess=admitted)
    assert problems[0] == "1 of 4 excess requests got HTTP 200, not 503 overloaded_error"
    assert "waited over" in problems[1]
    assert "got HTTP 500" in judged("overload", excess=[{"status": 500, "seconds": 0.1}])[0]
    assert "got ReadTimeout" in judged("overload", excess=[{"status": None, "error": "ReadTimeout", "seconds": 60}])[0]
    assert "/health took 2.50 s" in judged("overload", health_s=[0.01, 2.5])[0]
    assert "/health failed 3 times" in judged("overload", health_errors=3)[0]
    assert "never seen full" in judged("overload", queue_full=False)[0]


def test_a_slow_consumer_must_not_stall_the_other_client_and_must_end_with_a_reason():
    assert "stopped for 2.90 s" in judged("slow-consumer", fast={"tokens": 10, "errors": [], "max_gap_s": 2.9})[0]
    cut = _done("slow", finish_reason=None, done=False)
    assert "did not end with a reason: cut without" in judged("slow-consumer", slow=cut)[0]


def test_shutdown_needs_a_reason_on_the_stream_exit_0_and_a_restart_that_serves():
    truncated = _done("inflight", finish_reason=None, done=False)
    assert "did not end with a reason and [DONE]" in judged("shutdown", stream=truncated)[0]
    assert "exited 1 after SIGTERM" in judged("shutdown", exit_code=1)[0]
    assert "had not exited" in judged("shutdown", exit_code=None)[0]
    assert "did not serve a request: port taken" in judged("shutdown", restart={"error": "port taken"})[0]


def test_the_baseline_is_no_request_anywhere_and_every_block_free():
    idle = {"status": "ok", "running": 0, "waiting": 0, "live": 0, "queued": 0, "free_blocks": 64, "num_blocks": 64}
    assert L.baseline_problems(idle) == []
    assert L.baseline_problems({**idle, "live": 1, "free_blocks": 60}) == ["1 request(s) open in the frontend",
                                                                          "4 of 64 KV blocks in use"]
    assert L.baseline_problems({**idle, "status": "unhealthy", "error": "the server is shutting down"}) == [
        "/health says 'unhealthy': the server is shutting down"]


def test_a_scenario_that_hangs_fails_at_its_deadline_naming_where(tmp_path):
    async def hangs(o):
        o["stage"] = "waiting for the abort in the server's books"
        await asyncio.sleep(60)

    r = asyncio.run(L.run_scenario("cancel-running", hangs, L.Server("main", [], tmp_path), deadline_s=0.2))
    assert r["verdict"] == "FAIL" and r["seconds"] < 5
    assert r["observed"] == "did not end within 0.2 s, at: waiting for the abort in the server's books"


def test_the_report_headline_counts_the_scenarios_and_names_the_first_failure():
    from labkit.report.results import _lifecycle

    scenarios = [{"name": n, "verdict": "PASS", "observed": "fine"} for n in L.SCENARIOS]
    assert _lifecycle({"verdict": "PASS", "scenarios": scenarios}) == ("PASS", L.headline(scenarios))
    scenarios[2] = {"name": "overload", "verdict": "FAIL", "observed": "4 of 4 excess requests got HTTP 200"}
    verdict, text = _lifecycle({"verdict": "FAIL", "scenarios": scenarios})
    assert verdict == "FAIL" and text.startswith("4/5 scenarios hold: cancel-running PASS, cancel-waiting PASS, "
                                                 "overload FAIL")
    assert text.endswith("; overload: 4 of 4 excess requests got HTTP 200")


def test_the_table_fits_80_columns_with_every_word_whole():
    import io

    from rich.console import Console

    long = "; ".join(judged("cancel-running", late_tokens=2888, baseline=LEAK, abort_counted=False))
    scenarios = [{"name": n, "verdict": "FAIL" if n == "cancel-running" else "PASS",
                  "observed": long if n == "cancel-running" else L.observed(n, copy.deepcopy(HELD[n]))}
                 for n in L.SCENARIOS]
    console = Console(file=io.StringIO(), width=80, color_system=None)
    L.print_table({"verdict": "FAIL", "scenarios": scenarios, "headline": L.headline(scenarios)}, console)
    out = console.file.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 80
    words = set(out.split())
    for s in scenarios:
        assert all(w in words for w in s["observed"].split()), s["name"]


# --- the command -------------------------------------------------------------------------------------------------
def test_bad_inputs_are_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    code, _, err = run_cli(["serve", "lifecycle", "--model", str(tmp_path / "nope"), "--device", "cpu"], capsys)
    assert code == 2 and "does not exist" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["serve", "lifecycle", "--scenario", "cancel"], capsys)
    assert code == 2 and "cancel-running" in err and "Traceback" not in err
    monkeypatch.setitem(sys.modules, "uvicorn", None)      # not installed
    code, _, err = run_cli(["serve", "lifecycle"], capsys)
    assert code == 2 and err.strip() == "labkit: labkit serve needs uvicorn: pip install 'labkit[serve]'"


def _closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_a_scenario_past_its_deadline_is_a_fail_exit_1_and_its_server_is_stopped(tiny_model, tmp_path, capsys,
                                                                                  monkeypatch):
    monkeypatch.setattr(L, "SCENARIO_S", 0.1)
    out = tmp_path / "runs" / "lc.json"
    code, stdout, _ = run_cli(["serve", "lifecycle", "--model", tiny_model, "--device", "cpu", "--scenario",
                               "overload", "--out", str(out)], capsys)
    r = json.loads(out.read_text())
    assert code == 1 and r["verdict"] == "FAIL" and [s["name"] for s in r["scenarios"]] == ["overload"]
    assert r["scenarios"][0]["observed"] == "did not end within 0.1 s, at: checking the idle baseline before it"
    assert r["servers"][0]["name"] == "tight" and r["servers"][0]["exit_code"] == 0
    assert _closed(r["servers"][0]["port"])
    assert "0/1 scenarios hold: overload FAIL" in stdout


def test_every_scenario_holds_on_the_cpu_and_the_report_shows_the_lab(tiny_model, tmp_path):
    """The real command, as a user runs it (a process, 80 columns), then `labkit report` over its runs folder."""
    runs = tmp_path / "runs"
    env = {**os.environ, "COLUMNS": "80", "RUNS_DIR": str(runs)}
    done = subprocess.run([sys.executable, "-m", "labkit", "serve", "lifecycle", "--model", tiny_model, "--device",
                           "cpu"], cwd=REPO, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout + done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 80, done.stdout
    [path] = runs.glob("serve-lifecycle*.json")      # (-model-tiny: not the default model)
    r = json.loads(path.read_text())
    assert r["command"] == "serve lifecycle" and r["verdict"] == "PASS" and r["evidence"] == "cpu-executed"
    assert [(s["name"], s["verdict"]) for s in r["scenarios"]] == [(n, "PASS") for n in L.SCENARIOS], \
        [s["observed"] for s in r["scenarios"]]
    assert path.with_suffix(".md").read_text().startswith("# serve lifecycle: PASS")
    assert [s["name"] for s in r["servers"]] == ["main", "tight", "main-restarted"]
    assert all(s["exit_code"] == 0 and _closed(s["port"]) for s in r["servers"]), r["servers"]
    o = {s["name"]: s["observations"] for s in r["scenarios"]}
    assert o["cancel-waiting"]["victim"]["tokens"] == 0 and o["overload"]["excess"][0]["status"] == 503
    assert o["shutdown"]["restart"]["port"] == r["servers"][0]["port"]     # the same port, freed by the exit

    report = subprocess.run([sys.executable, "-m", "labkit", "report", "--runs", str(runs), "--out",
                             str(tmp_path / "report")], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stdout + report.stderr
    labs = {lab["lab"]: lab for lab in json.loads((tmp_path / "report" / "manifest.json").read_text())["labs"]}
    lab = labs["service-lifecycle"]
    assert lab["verdict"] == "PASS" and lab["headline"].startswith("5/5 scenarios hold: cancel-running PASS"), lab
