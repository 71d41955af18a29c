"""Stop a starting server at every moment: nothing may outlive it.

    python3 scripts/fault_sweep.py --model DIR [--tp 2] [--device cpu] [--at 0.5 1 2 ...] [--json OUT]

For each moment (seconds after `labkit serve` was started) and each fault (SIGTERM or SIGKILL to the
frontend, SIGKILL to the engine core), a fresh server is started, the fault is delivered at that moment, and
the sweep then waits up to --grace seconds for every process the server started (the core, its TP workers,
seen at any time) to be gone, its shared memory (/dev/shm/labkit-CORE-*) to be unlinked and its socket
folder (/tmp/labkit-serve-PID-*) to be removed. A frontend killed with SIGKILL cannot remove its folder: the
next server's start sweeps it, and the sweep says so rather than failing. One line per trial, an 80-column
table at the end, exit 1 if anything was left. Issue 22 found a 10-minute window this way (a TP worker left
when the server was stopped 3.5 s into start-up); the moments that matter are those while the engine loads.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAULTS = ("frontend-SIGTERM", "frontend-SIGKILL", "core-SIGKILL")


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def descendants(pid: int) -> set[int]:
    seen, todo = set(), [pid]
    while todo:
        for c in children(todo.pop()):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def is_core(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"spawn_main" in cmd and b"resource_tracker" not in cmd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trial(model: str, tp: int, device: str, at: float, fault: str, grace: float) -> dict:
    log = tempfile.NamedTemporaryFile("w+", prefix="fault-sweep-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "labkit", "serve", "--model", model, "--device", device, "--tp", str(tp),
           "--port", str(free_port()), "--log-level", "warning"]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seen: set[int] = set()
    core = None
    while time.monotonic() - start < at and proc.poll() is None:
        seen |= descendants(proc.pid)
        core = core or next((c for c in children(proc.pid) if is_core(c)), None)
        time.sleep(0.02)
    if fault == "core-SIGKILL":  # no core yet at this moment: kill it as soon as it exists
        while core is None and proc.poll() is None and time.monotonic() - start < at + 120:
            core = next((c for c in children(proc.pid) if is_core(c)), None)
            time.sleep(0.01)
    at_actual = time.monotonic() - start
    delivered = proc.poll() is None
    if delivered:
        if fault == "core-SIGKILL":
            os.kill(core, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGTERM if fault == "frontend-SIGTERM" else signal.SIGKILL)
    end = time.monotonic() + grace
    while time.monotonic() < end and proc.poll() is None:
        seen |= descendants(proc.pid)
        core = core or next((c for c in children(proc.pid) if is_core(c)), None)
        time.sleep(0.02)
    if proc.poll() is None:  # the frontend itself did not exit: that is a finding too
        frontend_left = True
        proc.kill()
        proc.wait()
    else:
        frontend_left = False
    end = time.monotonic() + grace
    left = []
    while time.monotonic() < end:
        left = [p for p in seen if alive(p)]
        shm = [n for n in os.listdir("/dev/shm") if core and n.startswith(f"labkit-{core}-")]
        folders = [str(p) for p in Path(tempfile.gettempdir()).glob(f"labkit-serve-{proc.pid}-*")]
        if not left and not shm and (not folders or fault == "frontend-SIGKILL"):
            break
        time.sleep(0.1)
    for p in left:  # clean up after a failed trial, so the next one starts clean
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    log.close()
    result = {"at_s": at, "delivered_at_s": round(at_actual, 2), "fault": fault, "delivered": delivered, "frontend_exit": proc.returncode,
              "frontend_left": frontend_left, "processes_left": sorted(left), "shm_left": shm,
              "folder_left": folders, "seconds": round(time.monotonic() - start, 1), "log": log.name}
    result["ok"] = not frontend_left and not left and not shm and (not folders or fault == "frontend-SIGKILL")
    if result["ok"]:
        os.unlink(log.name)
    for f in folders if fault == "frontend-SIGKILL" else ():  # what the next start would sweep
        subprocess.run(["rm", "-rf", f], check=False)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--at", type=float, nargs="+", default=[0.5, 1.5, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0])
    ap.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    ap.add_argument("--grace", type=float, default=10.0, help="seconds everything has to go (default 10)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not Path(args.model, "config.json").is_file():
        print(f"fault_sweep: --model {args.model}: no config.json there", file=sys.stderr)
        return 2
    results = []
    for at in args.at:
        for fault in args.faults:
            r = trial(args.model, args.tp, args.device, at, fault, args.grace)
            results.append(r)
            what = "ok" if r["ok"] else f"LEFT {r['processes_left'] or ''}{r['shm_left'] or ''}{r['folder_left'] or ''}"
            when = f"at {r['delivered_at_s']:.1f} s" if r["delivered"] else "(the server had exited)"
            print(f"{at:5.1f} s  {fault:17s} {when:23s} {what}", flush=True)
    bad = [r for r in results if not r["ok"]]
    print(f"\n{len(results)} trials, {len(bad)} left something behind"
          + ("" if not bad else ": logs " + ", ".join(r["log"] for r in bad)))
    if args.json:
        args.json.write_text(json.dumps({"tp": args.tp, "device": args.device, "grace_s": args.grace,
                                         "trials": results}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
