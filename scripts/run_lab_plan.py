"""Run the lab plan (workloads/labs.yaml) as a person following it would, every lab's own commands into one runs
folder, then `labkit report` over that folder: every lab the machine can run should show its own command's result.

    python3 scripts/run_lab_plan.py --runs OUT/runs [--report OUT/report] [--logs OUT/logs] [--gpus 1]
                                    [--only LAB,...] [--skip LAB,...] [--jobs 6] [--server-timeout 600]
                                    [--dry-run]

Each command line of a lab runs as written (`labkit ...` as `python3 -m labkit ...`, from the project root, so
`workloads/...` paths hold), with RUNS_DIR set to --runs and every `runs/...` path of the line rewritten to lie
under --runs. A lab whose first line starts a server (`labkit serve [OPTIONS]`) and whose other lines name it
as URL_SERVER runs as a person with terminals would: the server in the background (`--port P` appended, a free
port, and `--host 127.0.0.1` unless given; its own log); once `GET /health` answers 200 (within
--server-timeout seconds, else rc 124 for the lab and the server stopped), its other lines side by side, each
started 3 s after the one before (a trace "while that load runs"), URL_SERVER filled in as
http://127.0.0.1:P, each with its own timeout and log; when they have all ended, the server stopped (SIGTERM,
SIGKILL after 30 s), its exit code a line of its own (`labkit serve` exits 0 on SIGTERM).

Left out, and said so: labs whose results no command writes yet (`producer` in the plan), labs needing more
GPUs than --gpus (`gpus` in the plan), lines that name any other placeholder (URL_GPU0, URL_TP2) or start a
server no other line of the lab talks to. Labs that time nothing (traces, logits checks, doctor, principles)
run --jobs at a time, as scripts/gpu_session.sh's evidence mode does (each case or suite sets a small KV pool);
labs that time something or start servers of their own (bench, bench load, serve lifecycle; a server lab with a
load among its lines) run alone after them, one command at a time (a server lab's lines side by side).

One line per command on stdout: "rc=N SECONDS lab: command" (its output in --logs; a server's line once it has
stopped). Exit 0 when every command ran and the report was written (a command's own exit 1, a failed check, is
the report's to show), 2 when a command could not run or timed out, or the report could not be written.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from labkit.report.plan import Lab, load_plan  # noqa: E402
from labkit.report.render import command_lines  # noqa: E402

# Commands whose figures are timings, or that start servers of their own (`serve lifecycle`: a server sizes its KV
# cache from the GPU memory left): never beside another command.
TIMED = ("bench", "serve")
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b")   # URL_GPU0, URL_TP2
TIMEOUT_S = {"bench": 420, "logits-check": 300, "trace": 180}
SERVER = "URL_SERVER"                   # a lab's own server, started by its first line
STAGGER_S = 3.0                         # between the starts of the lines that talk to it
STOP_S = 30.0                           # SIGTERM, then SIGKILL after this long


def starts_server(tokens: list[str]) -> bool:
    """`labkit serve` itself (with or without options), not one of its subcommands (`labkit serve client`)."""
    return tokens[:2] == ["labkit", "serve"] and (len(tokens) == 2 or tokens[2].startswith("-"))


def serves(lines: list[list[str]]) -> bool:
    """A lab planned with a server: its first line starts it (planned() let it in only so)."""
    return bool(lines) and starts_server(["labkit", *lines[0]])


def planned(lab: Lab, gpus: int) -> tuple[list[list[str]], str]:
    """The lab's command lines as argument lists (`labkit` dropped), or [] and why it is left out."""
    if lab.producer:
        return [], f"no command writes its result yet ({lab.producer})"
    if lab.gpus > gpus:
        return [], f"needs {lab.gpus} GPUs, this machine has {gpus}"
    texts = [line.partition("#")[0].strip() for line in command_lines(lab.command)]
    served = bool(texts) and starts_server(shlex.split(texts[0]))
    talks_to_it = served and any(SERVER in PLACEHOLDER.findall(text) for text in texts[1:])
    lines = []
    for i, text in enumerate(texts):
        names = set(PLACEHOLDER.findall(text))
        if names and not (i > 0 and talks_to_it and names == {SERVER}):
            return [], f"{text!r} names a placeholder to fill in by hand"
        tokens = shlex.split(text)
        if starts_server(tokens) and not (i == 0 and talks_to_it):
            return [], "starts a server that serves until stopped (a terminal of its own)"
        lines.append(tokens[1:])
    return lines, ""


def filled(tokens: list[str], url: str) -> list[str]:
    """URL_SERVER in a line's arguments replaced by the lab's server."""
    pattern = re.compile(rf"\b{SERVER}\b")
    return [pattern.sub(url, t) for t in tokens]


def server_args(tokens: list[str], port: int | str) -> list[str]:
    """The serve line on the port given, on the loopback address unless it names its own host."""
    host = [] if any(t == "--host" or t.startswith("--host=") for t in tokens) else ["--host", "127.0.0.1"]
    return [*tokens, "--port", str(port), *host]


def into(tokens: list[str], runs: Path) -> list[str]:
    """`runs/...` paths of a plan line moved under the runs folder given."""
    return [str(runs / t[len("runs/"):]) if t.startswith("runs/") else t for t in tokens]


def shown(args: list[str]) -> str:
    return "labkit " + " ".join(shlex.quote(a) for a in args)


def log_path(logs: Path, lab: str, text: str) -> Path:
    return logs / f"{lab}-{abs(hash(text)) % 10**8:08d}.log"


def run_line(lab: str, tokens: list[str], runs: Path, logs: Path, env: dict) -> tuple[int, float, str]:
    args = into(tokens, runs)
    text = shown(args)
    log = log_path(logs, lab, text)
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


def healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> bool:
    """Poll GET URL/health until it answers 200 (True), the server exits or the time runs out (False)."""
    import httpx

    end = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < end:
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    return False


def stop(proc: subprocess.Popen) -> int:
    """SIGTERM (a drain, then exit 0), SIGKILL if it is still there after STOP_S; its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def run_server_lab(lab: Lab, lines: list[list[str]], runs: Path, logs: Path, env: dict,
                   startup_s: float) -> list[int]:
    """The first line as a background server on a free loopback port, the others against it (URL_SERVER filled
    in) side by side, each STAGGER_S after the one before; then the server stopped, its exit code its own line."""
    from engine.config import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = into(server_args(lines[0], port), runs)
    text = shown(args)
    start = time.monotonic()
    codes: list[int] = []
    with log_path(logs, lab.id, text).open("w") as fh:
        fh.write(f"$ {text}\n")
        fh.flush()
        proc = subprocess.Popen([sys.executable, "-m", "labkit", *args], cwd=REPO, env=env, stdout=fh,
                                stderr=subprocess.STDOUT)
        ready = False
        try:
            ready = healthy(url, proc, startup_s)
            if ready:
                with ThreadPoolExecutor(max_workers=len(lines) - 1) as pool:
                    running = []
                    for i, tokens in enumerate(lines[1:]):
                        if i:
                            time.sleep(STAGGER_S)
                        running.append(pool.submit(run_line, lab.id, filled(tokens, url), runs, logs, env))
                    codes = [job.result()[0] for job in running]
        finally:
            exited = proc.poll()
            rc = stop(proc)
    took = time.monotonic() - start
    if not ready:
        # Its other lines never ran: not ready in time is a timeout; an exit before it was ready, even a clean
        # one, a command that could not run.
        rc = 124 if exited is None else (rc if rc not in (0, 1) else 2)
        print(f"rc={rc} {took:.0f}s {lab.id}: {text}   # not ready at {url}/health; {len(lines) - 1} line(s) after "
              f"it not run", flush=True)
        return [rc]
    print(f"rc={rc} {took:.0f}s {lab.id}: {text}", flush=True)
    return [*codes, rc]


def run_lab(lab: Lab, lines: list[list[str]], runs: Path, logs: Path, env: dict, startup_s: float = 600.0) -> list[int]:
    if serves(lines):
        return run_server_lab(lab, lines, runs, logs, env, startup_s)
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
    ap.add_argument("--server-timeout", type=float, default=600.0,
                    help="Seconds a lab's server may take to answer /health (then rc 124 and it is stopped).")
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
            if serves(lines):
                print(f"{lab.id}: {shown(into(server_args(lines[0], 'PORT'), runs))}   # in the background until "
                      f"the lines after it end, each {STAGGER_S:.0f} s after the one before")
                lines = [filled(tokens, "http://127.0.0.1:PORT") for tokens in lines[1:]]
            for tokens in lines:
                print(f"{lab.id}: {shown(into(tokens, runs))}")
        return 0

    runs.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RUNS_DIR": str(runs), "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    codes: list[int] = []
    with ThreadPoolExecutor(max_workers=max(a.jobs, 1)) as pool:
        for done in pool.map(lambda item: run_lab(item[0], item[1], runs, logs, env, a.server_timeout), untimed):
            codes += done
    for lab, lines in timed:
        codes += run_lab(lab, lines, runs, logs, env, a.server_timeout)
    rc, _, _ = run_line("report", ["report", "--runs", str(runs), "--out", str(report)], runs, logs, env)
    could_not_run = [c for c in codes if c not in (0, 1)]
    if could_not_run or rc not in (0, 1):
        print(f"run_lab_plan: {len(could_not_run)} command(s) could not run or timed out; report exit {rc} "
              f"(logs in {logs})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
