"""The lab plan as a person runs it: every command line of workloads/labs.yaml is one the CLI accepts (flags that
exist, values they take), scripts/run_lab_plan.py runs the plan's own lines into one folder, and
scripts/gpu_session.sh deletes only what it made."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tarfile
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


def test_the_plan_runner_runs_each_labs_own_lines_into_one_folder(tmp_path, capsys):
    """The dry run lists every line the runner would run, `runs/` paths moved into the folder given; labs that
    need two GPUs, write nothing yet, or start a server that never returns are left out, each with why."""
    runs = tmp_path / "runs"
    assert run_lab_plan.main(["--runs", str(runs), "--gpus", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "left out logits-tp: needs 2 GPUs, this machine has 1" in lines
    assert any(line.startswith("left out replicas-vs-tp: needs 2 GPUs") for line in lines)
    assert any(line.startswith("left out service-lifecycle: no command writes") for line in lines)
    assert "bench-offline: labkit bench --workload nano --device cuda --repeats 3" in lines
    assert (f"graph-vs-eager: labkit bench --workload fixed --device cuda --enforce-eager "
            f"--out {runs}/bench-fixed-eager.json") in lines
    assert not any(" runs/" in line for line in lines if not line.startswith("left out"))
    # Timed labs run after the untimed ones, never beside them.
    order = [line.split(":")[0] for line in lines if not line.startswith("left out")]
    assert order.index("trace-A") < order.index("bench-offline")
    assert order.index("logits-kv") < order.index("graph-vs-eager")
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
