"""Run the lab plan (workloads/labs.yaml) as a person following it would, every lab's own commands into one runs
folder, then `labkit report` over that folder: every lab the machine can run should show its own command's result.

    python3 scripts/run_lab_plan.py --runs OUT/runs [--report OUT/report] [--logs OUT/logs] [--gpus 1]
                                    [--only LAB,...] [--skip LAB,...] [--jobs 6] [--dry-run]

Each command line of a lab runs as written (`labkit ...` as `python3 -m labkit ...`, from the project root, so
`workloads/...` paths hold), with RUNS_DIR set to --runs and every `runs/...` path of the line rewritten to lie
under --runs. Left out, and said so: labs whose results no command writes yet (`producer` in the plan), labs
needing more GPUs than --gpus (`gpus` in the plan), lines that name a placeholder (URL_GPU0) or start a server
that never returns (`labkit serve`). Labs that time nothing (traces, logits checks, doctor, principles) run
--jobs at a time, as scripts/gpu_session.sh's evidence mode does (each case or suite sets a small KV pool);
labs that time something (bench, bench load) run alone, one command at a time, after them.

One line per command on stdout: "rc=N SECONDS lab: command" (its output in --logs). Exit 0 when every command
ran and the report was written (a command's own exit 1, a failed check, is the report's to show), 2 when a
command could not run or timed out, or the report could not be written.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from labkit.report.plan import Lab, load_plan  # noqa: E402
from labkit.report.render import command_lines  # noqa: E402

TIMED = ("bench",)                      # commands whose figures are timings: never beside another command
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b")   # URL_GPU0, URL_TP2
TIMEOUT_S = {"bench": 420, "logits-check": 300, "trace": 180}


def planned(lab: Lab, gpus: int) -> tuple[list[list[str]], str]:
    """The lab's command lines as argument lists (`labkit` dropped), or [] and why it is left out."""
    if lab.producer:
        return [], f"no command writes its result yet ({lab.producer})"
    if lab.gpus > gpus:
        return [], f"needs {lab.gpus} GPUs, this machine has {gpus}"
    lines = []
    for line in command_lines(lab.command):
        text = line.partition("#")[0].strip()
        if PLACEHOLDER.search(text):
            return [], f"{text!r} names a placeholder to fill in by hand"
        tokens = shlex.split(text)
        if tokens[:2] == ["labkit", "serve"] and (len(tokens) == 2 or tokens[2].startswith("-")):
            return [], "starts a server that serves until stopped (a terminal of its own)"
        lines.append(tokens[1:])
    return lines, ""


def into(tokens: list[str], runs: Path) -> list[str]:
    """`runs/...` paths of a plan line moved under the runs folder given."""
    return [str(runs / t[len("runs/"):]) if t.startswith("runs/") else t for t in tokens]


def run_line(lab: str, tokens: list[str], runs: Path, logs: Path, env: dict) -> tuple[int, float, str]:
    args = into(tokens, runs)
    text = "labkit " + " ".join(shlex.quote(a) for a in args)
    log = logs / f"{lab}-{abs(hash(text)) % 10**8:08d}.log"
    start = time.monotonic()
    try:
        with log.open("w") as fh:
            fh.write(f"$ {text}\n")
            fh.flush()
            rc = subprocess.run([sys.executable, "-m", "labkit", *args], cwd=REPO, env=env, stdout=fh,
                                stderr=subprocess.STDOUT, timeout=TIMEOUT_S.get(args[0], 300)).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    took = time.monotonic() - start
    print(f"rc={rc} {took:.0f}s {lab}: {text}", flush=True)
    return rc, took, text


def run_lab(lab: Lab, lines: list[list[str]], runs: Path, logs: Path, env: dict) -> list[int]:
    return [run_line(lab.id, tokens, runs, logs, env)[0] for tokens in lines]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, required=True, help="The one runs folder every command writes into.")
    ap.add_argument("--report", type=Path, default=None, help="Report folder (default: RUNS/report).")
    ap.add_argument("--logs", type=Path, default=None, help="Each command's output (default: RUNS/../lab-logs).")
    ap.add_argument("--gpus", type=int, default=None, help="GPUs this machine offers (default: what torch sees).")
    ap.add_argument("--only", default="", help="Comma-separated lab ids to run (default: every lab).")
    ap.add_argument("--skip", default="", help="Comma-separated lab ids to leave out.")
    ap.add_argument("--jobs", type=int, default=6, help="Untimed labs run this many at a time.")
    ap.add_argument("--dry-run", action="store_true", help="Print what would run and what is left out; run nothing.")
    a = ap.parse_args(argv)

    if a.gpus is None:
        try:
            import torch

            a.gpus = torch.cuda.device_count()
        except Exception:  # noqa: BLE001 - no torch: no GPU
            a.gpus = 0
    runs = a.runs.resolve()
    logs = (a.logs or runs.parent / "lab-logs").resolve()
    report = (a.report or runs / "report").resolve()
    only = {x for x in a.only.split(",") if x}
    skip = {x for x in a.skip.split(",") if x}
    labs = load_plan()
    unknown = (only | skip) - {lab.id for lab in labs}
    if unknown:
        print(f"run_lab_plan: no such lab in the plan: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2

    untimed, timed = [], []
    for lab in labs:
        if (only and lab.id not in only) or lab.id in skip:
            continue
        lines, why = planned(lab, max(a.gpus, 1))
        if not lines:
            print(f"left out {lab.id}: {why}", flush=True)
            continue
        (timed if any(tokens[0] in TIMED for tokens in lines) else untimed).append((lab, lines))
    if a.dry_run:
        for lab, lines in untimed + timed:
            for tokens in lines:
                print(f"{lab.id}: labkit {' '.join(shlex.quote(t) for t in into(tokens, runs))}")
        return 0

    runs.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RUNS_DIR": str(runs), "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    codes: list[int] = []
    with ThreadPoolExecutor(max_workers=max(a.jobs, 1)) as pool:
        for done in pool.map(lambda item: run_lab(item[0], item[1], runs, logs, env), untimed):
            codes += done
    for lab, lines in timed:
        codes += run_lab(lab, lines, runs, logs, env)
    rc, _, _ = run_line("report", ["report", "--runs", str(runs), "--out", str(report)], runs, logs, env)
    could_not_run = [c for c in codes if c not in (0, 1)]
    if could_not_run or rc not in (0, 1):
        print(f"run_lab_plan: {len(could_not_run)} command(s) could not run or timed out; report exit {rc} "
              f"(logs in {logs})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
