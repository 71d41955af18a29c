"""The lab plan as a person runs it: every command line of workloads/labs.yaml is one the CLI accepts (flags that
exist, values they take), scripts/run_lab_plan.py runs the plan's own lines into one folder, and
scripts/gpu_session.sh deletes only what it made."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import run_lab_plan  # noqa: E402


def _parse(args: list[str]) -> None:
    """Parse `labkit ARGS` down to the command it names, as the CLI would, without running it; raises the
    CLI's usage error for an option that does not exist or a value it does not take."""
    import typer.main

    from labkit import cli

    command = typer.main.get_command(cli.app)
    ctx = command.make_context("labkit", list(args))
    while hasattr(command, "resolve_command"):
        rest = [*getattr(ctx, "_protected_args", getattr(ctx, "protected_args", [])), *ctx.args]
        if not rest:
            break
        name, command, rest = command.resolve_command(ctx, rest)
        ctx = command.make_context(name, rest, parent=ctx)


def test_every_command_line_of_the_plan_is_one_the_cli_accepts():
    """A renamed flag (engine options take their Config names) must be renamed in the plan too."""
    from labkit.report.plan import load_plan
    from labkit.report.render import command_lines

    bad = []
    for lab in load_plan():
        for line in command_lines(lab.command):
            tokens = shlex.split(line.partition("#")[0])
            args = [t.replace("URL_GPU0,URL_GPU1", "http://a:1,http://b:2").replace("URL_TP2", "http://c:3")
                    for t in tokens[1:]]
            try:
                _parse(args)
            except Exception as exc:  # noqa: BLE001 - click's usage errors
                bad.append(f"{lab.id}: {line}: {type(exc).__name__}: {getattr(exc, 'message', exc)}")
    assert not bad, "\n".join(bad)
    with pytest.raises(Exception, match="No such option"):
        _parse(["trace", "--case", "A", "--no-such-flag", "1"])


def _repeats(tokens: list[str]) -> int:
    """The repeats a `labkit bench` line asks for: its --repeats, else its workload's."""
    from labkit.bench.workloads import load_workload

    if "--repeats" in tokens:
        return int(tokens[tokens.index("--repeats") + 1])
    return load_workload(tokens[tokens.index("--workload") + 1]).repeats


def plan_compares_refused(plan) -> list[str]:
    """Each `bench compare A B` line whose A or B is written by a bench line of one sample and that does not pass
    --allow-single: the CLI refuses it (exit 2), so the lab's compare is never written."""
    from labkit.report.render import command_lines

    bad = []
    for lab in plan:
        lines = [shlex.split(line.partition("#")[0]) for line in command_lines(lab.command)]
        writes = {t[t.index("--out") + 1]: t for t in lines if t[1:2] == ["bench"] and "--out" in t}
        for t in lines:
            if t[1:3] != ["bench", "compare"] or "--allow-single" in t:
                continue
            singles = [f for f in t[3:5] if f in writes and _repeats(writes[f]) < 2]
            if singles:
                bad.append(f"{lab.id}: {' '.join(t)}: {', '.join(singles)} has one repeat")
    return bad


def test_every_compare_line_of_the_plan_takes_the_samples_its_benches_write():
    """A lab that times a side once must say --allow-single, else its compare exits 2 (session 14: bench-hf on
    the H200, after its Transformers side went to one repeat)."""
    from labkit.report.plan import load_plan

    plan = load_plan()
    assert plan_compares_refused(plan) == []
    lab = next(lab for lab in plan if lab.id == "bench-hf")
    planted = lab.command.replace(" --allow-single", "").replace("--repeats 2 --out runs/bench-nano-hf",
                                                                    "--repeats 1 --out runs/bench-nano-hf")
    assert plan_compares_refused([type(lab)(**{**vars(lab), "command": planted})])


def test_the_plan_runner_runs_each_labs_own_lines_into_one_folder(tmp_path, capsys):
    """The dry run lists every line the runner would run, `runs/` paths moved into the folder given; labs that
    need two GPUs, write nothing yet, or start a server that never returns are left out, each with why."""
    runs = tmp_path / "runs"
    assert run_lab_plan.main(["--runs", str(runs), "--gpus", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "left out logits-tp: needs 2 GPUs, this machine has 1" in lines
    assert any(line.startswith("left out replicas-vs-tp: needs 2 GPUs") for line in lines)
    assert f"service-lifecycle: labkit serve lifecycle --out {runs}/serve-lifecycle.json" in lines
    assert "bench-offline: labkit bench --workload nano --device cuda --repeats 3" in lines
    assert (f"graph-vs-eager: labkit bench --workload fixed --device cuda --enforce-eager "
            f"--out {runs}/bench-fixed-eager.json") in lines
    assert not any(" runs/" in line for line in lines if not line.startswith("left out"))
    # Timed labs run after the untimed ones, never beside them.
    order = [line.split(":")[0] for line in lines if not line.startswith("left out")]
    assert order.index("trace-A") < order.index("bench-offline")
    assert order.index("logits-kv") < order.index("graph-vs-eager")
    # serve lifecycle starts servers that size their KV cache from the GPU memory left: alone, as the timed ones.
    assert order.index("trace-A") < order.index("service-lifecycle")
    assert run_lab_plan.main(["--runs", str(runs), "--only", "no-such-lab", "--dry-run"]) == 2
    plan_lab = run_lab_plan.Lab(id="x", title="t",
                                command="labkit serve --port 9   # its own terminal\nlabkit serve client",
                                evidence="cpu-executed", slots=[])
    assert run_lab_plan.planned(plan_lab, 1)[0] == []


def _gpu_session(out: Path, model: str, **env) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_session.sh"), "labs"], cwd=ROOT, text=True,
                          capture_output=True, timeout=300,
                          env={**os.environ, "PATH": path, "OUT": str(out), "FAKE_MODEL": model, **env})


def test_gpu_session_runs_labs_into_one_folder_and_deletes_only_what_it_made(tiny_model, tmp_path):
    """Pointed at a folder of results, the script packs what it made and deletes only that: the doctor result
    and the log already there stay."""
    out = tmp_path / "session"
    (out / "runs").mkdir(parents=True)
    (out / "logs").mkdir()
    before = {"runs/doctor.json": json.dumps({"command": "doctor", "evidence": "cpu-executed", "status": "PASS"}),
              "runs/trace-chunk/check.json": "{}", "logs/earlier.log": "kept"}
    for name, text in before.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    done = _gpu_session(out, str(tiny_model), LABS_ONLY="principles-slots")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rc=0 python3 scripts/run_lab_plan.py" in done.stdout, done.stdout
    for name, text in before.items():
        assert (out / name).read_text() == text, name
    made = [p for p in out.rglob("*") if p.is_file() and p.relative_to(out).as_posix() not in before]
    assert [p.name for p in made] == ["reports.tgz"], made
    with tarfile.open(out / "reports.tgz") as tar:
        names = tar.getnames()
    assert {"report/report.md", "report/manifest.json", "runs/principles/slots.json", "runs/doctor.json"} <= set(names)


def test_a_lab_that_starts_its_own_server_is_planned_with_it(tmp_path, capsys):
    """Issue 35: live-invariants (a server, then a load, a trace and a watch against it as URL_SERVER) runs on one
    GPU: planned with its server first, timed (it holds a load), its lines with the URL filled in. Labs naming
    other placeholders, or a server no other line talks to, stay left out."""
    labs = {lab.id: lab for lab in run_lab_plan.load_plan()}
    lines, why = run_lab_plan.planned(labs["live-invariants"], 1)
    assert why == "" and [t[0] for t in lines] == ["serve", "bench", "trace", "watch"], (lines, why)
    assert run_lab_plan.serves(lines) and not run_lab_plan.serves(lines[1:])
    assert "placeholder" in run_lab_plan.planned(labs["replicas-vs-tp"], 2)[1]

    def lab(command: str) -> run_lab_plan.Lab:
        return run_lab_plan.Lab(id="x", title="t", command=command, evidence="cpu-executed", slots=[])

    ok = "labkit serve --policy mixed   # URL_SERVER\nlabkit trace --url URL_SERVER --seconds 1"
    assert run_lab_plan.planned(lab(ok), 1)[0] == [["serve", "--policy", "mixed"],
                                                   ["trace", "--url", "URL_SERVER", "--seconds", "1"]]
    for left_out in ("labkit serve\nlabkit bench load --url URL_SERVER --behind URL_GPU0",   # another placeholder
                     "labkit bench load --url URL_SERVER",                                   # no server to fill it
                     "labkit serve",                                                         # a bare server
                     "labkit serve\nlabkit serve client",                                    # nothing names it
                     "labkit doctor\nlabkit serve\nlabkit trace --url URL_SERVER",           # not the first line
                     "labkit serve --host URL_SERVER\nlabkit trace --url URL_SERVER"):       # the server names it
        assert run_lab_plan.planned(lab(left_out), 1)[0] == [], left_out

    runs = tmp_path / "runs"
    assert run_lab_plan.main(["--runs", str(runs), "--gpus", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert not any(line.startswith("left out live-invariants") for line in out)
    live = [line for line in out if line.startswith("live-invariants: ")]
    assert live == [
        "live-invariants: labkit serve --policy mixed --live-trace --step-stream --port PORT --host 127.0.0.1   "
        "# in the background until the lines after it end, each 3 s after the one before",
        "live-invariants: labkit bench load --workload nano --rate 16 --url http://127.0.0.1:PORT "
        f"--out {runs}/live-load-mixed.json",
        f"live-invariants: labkit trace --url http://127.0.0.1:PORT --seconds 10 --out {runs}/trace-live-mixed",
        "live-invariants: labkit watch http://127.0.0.1:PORT --seconds 10"], live
    # Timed: after every untimed lab.
    order = [line.split(":")[0] for line in out if not line.startswith("left out")]
    assert order.index("trace-A") < order.index("live-invariants")
    assert any(line.startswith("left out replicas-vs-tp: needs 2 GPUs") for line in out)
    assert not any(line.startswith("left out service-lifecycle") for line in out)


def _left(runs: Path) -> dict[int, str]:
    """Processes (besides this one) whose environment names this runs folder: every command the runner started,
    the server's engine core among them; pid -> command line."""
    mark = f"RUNS_DIR={runs}".encode()
    out = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if int(proc.name) != os.getpid() and mark in (proc / "environ").read_bytes().split(b"\0"):
                out[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            pass
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_plan_runner_runs_a_server_lab_end_to_end(tiny_model, tmp_path, monkeypatch, capsys):
    """A lab of a server and two lines against it, run on the CPU with the tiny model: the server answers on a
    port of the runner's choosing, the load and the trace (3 s later, while it runs) write their results, the
    server is stopped (exit 0 on SIGTERM) and leaves no process, and the report runs over the folder."""
    pytest.importorskip("httpx")
    command = ("labkit serve --device cpu --enforce-eager --max-model-len 1024 --max-num-batched-tokens 1024 "
               "--max-num-seqs 16 --live-trace --log-stats-interval 0   # URL_SERVER: where it listens\n"
               # 16 requests at 2 a second: still arriving when the trace's window opens 3 s in (at rate inf the
               # load was over by then, and the empty window passed until session 17 made that exit 2)
               "labkit bench load --workload fixed --num-requests 16 --rate 2 --url URL_SERVER --out runs/x.json\n"
               "labkit trace --url URL_SERVER --seconds 2 --out runs/trace-x   # while that load runs\n")
    lab = run_lab_plan.Lab(id="server-lab", title="t", command=command, evidence="cpu-executed", slots=[])
    monkeypatch.setattr(run_lab_plan, "load_plan", lambda: [lab])
    monkeypatch.setenv("MODEL_DIR", tiny_model)
    runs, logs = tmp_path / "runs", tmp_path / "logs"
    rc = run_lab_plan.main(["--runs", str(runs), "--logs", str(logs), "--gpus", "1", "--server-timeout", "240"])
    out = capsys.readouterr().out
    logs_text = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(logs.glob("*")))
    assert rc == 0, out + logs_text
    done = [line for line in out.splitlines() if line.startswith("rc=")]
    assert [line.split()[0] for line in done] == ["rc=0"] * 4, out + logs_text
    # The load and the trace end in either order; the server's line comes once both have, the report's last.
    ran = [line.split(": ", 1)[1] for line in done]
    load, trace = sorted(ran[:2])
    assert ran[2].startswith("labkit serve --device cpu") and " --host 127.0.0.1" in ran[2]
    assert ran[3].startswith("labkit report --runs")
    url = f"http://127.0.0.1:{ran[2].split('--port ')[1].split()[0]}"
    assert load.startswith(f"labkit bench load --workload fixed --num-requests 16 --rate 2 --url {url} ")
    assert trace.startswith(f"labkit trace --url {url} ")
    assert json.loads((runs / "x.json").read_text())["command"] == "bench load"
    assert (runs / "trace-x" / "events.jsonl").is_file()
    assert json.loads((runs / "trace-x" / "check.json").read_text())["verdict"] == "PASS"  # steps, all checked
    assert (runs / "report" / "report.md").is_file()
    assert len(list(logs.glob("server-lab-*.log"))) == 3
    end = time.monotonic() + 10   # the server has been waited for; its core goes with it
    while (left := _left(runs)) and time.monotonic() < end:
        time.sleep(0.2)
    for pid in left:   # a runner that left its server running: stop it here, then fail
        os.kill(pid, signal.SIGKILL)
    assert left == {}, left
