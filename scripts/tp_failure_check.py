"""Tensor-parallel failures on real ranks: a worker killed mid-run, and workers that die during start-up, must
each turn into a clear error within seconds, leave no worker process, process group or shared memory behind,
and leave the process able to build the next engine, which must generate what the first one did.

    python3 scripts/tp_failure_check.py --model DIR --device cuda --out tp-failures.json   # NCCL, two GPUs
    python3 scripts/tp_failure_check.py --model DIR --device cpu --out tp-failures.json    # gloo

Exit 0 when every check passes, 1 when one fails, 2 when it cannot run. Start-up failures use the worker's
test hook LABKIT_TP_WORKER_FAIL=start|join|runner[:exit] (engine/tp_workers.py).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

# Within this many seconds an error counts as "within seconds" (spawning a worker alone takes a few).
PROMPT = [101, 102, 103, 104, 105]


def _workers() -> list:
    return [p for p in multiprocessing.active_children() if p.name.startswith("labkit-tp")]


def _shm() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("labkit-*")} if Path("/dev/shm").is_dir() else set()


def _leftovers(shm_before: set[str]) -> list[str]:
    import torch.distributed as dist

    out = []
    if _workers():
        out.append(f"worker processes alive: {[p.pid for p in _workers()]}")
    if _shm() - shm_before:
        out.append(f"shared memory left: {sorted(_shm() - shm_before)}")
    if dist.is_available() and dist.is_initialized():
        out.append("a torch.distributed process group is still initialised")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--within-s", type=float, default=30.0, help="an error must arrive within this many seconds")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from engine import LLM, SamplingParams

    kw = dict(device=args.device, tensor_parallel_size=2, max_model_len=512, max_num_batched_tokens=512,
              max_num_seqs=8, kvcache_block_size=256 if args.device == "cuda" else 16, num_kvcache_blocks=16,
              enforce_eager=True)
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    checks: list[dict] = []
    shm_before = _shm()

    def record(name: str, ok: bool, **fields) -> None:
        checks.append({"check": name, "verdict": "PASS" if ok else "FAIL", **fields})
        print(f"{'PASS' if ok else 'FAIL'} {name}: {json.dumps(fields)[:300]}", flush=True)

    llm = LLM(args.model, **kw)
    want = llm.generate([PROMPT], sp, use_tqdm=False)[0]["token_ids"]
    llm.exit()
    record("baseline", not _leftovers(shm_before), tokens=want, leftovers=_leftovers(shm_before))

    # A worker killed while the engine is stepping.
    llm = LLM(args.model, **kw)
    llm.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    llm.step()
    victim = _workers()[0]
    os.kill(victim.pid, signal.SIGKILL)
    t0 = time.monotonic()
    err = None
    try:
        for _ in range(1000):
            llm.step()
    except RuntimeError as exc:
        err = str(exc)
    took = time.monotonic() - t0
    llm.exit()
    left = _leftovers(shm_before)
    record("worker killed mid-run", err is not None and "died" in err and took < args.within_s and not left,
           seconds=round(took, 2), error=err, leftovers=left)

    # Workers that die during start-up: before the rendezvous, in it, while building their runner.
    for hook in ("start:exit", "join:exit", "runner:exit"):
        os.environ["LABKIT_TP_WORKER_FAIL"] = hook
        t0 = time.monotonic()
        err = None
        try:
            LLM(args.model, **kw).exit()
        except (RuntimeError, ValueError) as exc:
            err = str(exc)
        took = time.monotonic() - t0
        del os.environ["LABKIT_TP_WORKER_FAIL"]
        left = _leftovers(shm_before)
        record(f"worker dies at start-up ({hook})", err is not None and took < args.within_s and not left,
               seconds=round(took, 2), error=err, leftovers=left)

    # The process is still good for the next engine: same tokens as at the start.
    llm = LLM(args.model, **kw)
    again = llm.generate([PROMPT], sp, use_tqdm=False)[0]["token_ids"]
    llm.exit()
    record("next engine after the failures", again == want and not _leftovers(shm_before), tokens=again)

    ok = all(c["verdict"] == "PASS" for c in checks)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": args.device, "verdict": "PASS" if ok else "FAIL",
                                              "within_s": args.within_s, "checks": checks}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # noqa: BLE001 - one line, exit 2: the check could not run
        print(f"tp_failure_check: could not run: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(2)
