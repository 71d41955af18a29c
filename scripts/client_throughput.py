"""How many streamed tokens per second can `labkit bench load`'s client take in? (a measurement, not a test)

Starts tests/fake_sse_server.py (plain asyncio, pre-built chunks: nearly free) in a child process and runs
the load client against it: --streams requests at once, each streaming --tokens tokens; the fake server
steps like an engine (every stream gets --tokens-per-step tokens per step, a lagging stream's tokens are
coalesced into one event). Prints wall time, the client process's CPU seconds, and events and tokens per
second of wall and per CPU second (what one core of the client can parse).

    python scripts/client_throughput.py --streams 256 --tokens 500
    python scripts/client_throughput.py --url http://127.0.0.1:8000     # a real server instead
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.config import free_port  # noqa: E402
from labkit.bench import load as L  # noqa: E402


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a child process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait(url: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            L.server_info(url)
            return
        except Exception:  # noqa: BLE001 - not up yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--tokens-per-step", type=int, default=1, help="tokens each stream gets per fake step")
    ap.add_argument("--step-ms", type=float, default=0.0, help="fake server's pause between steps (0: none)")
    ap.add_argument("--client", default=None, help="force a client library (httpx or aiohttp)")
    ap.add_argument("--url", default=None, help="measure against this server instead of the fake one")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    proc = None
    url = args.url
    if url is None:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "tests.fake_sse_server", "--port", str(port),
                                 "--tokens-per-step", str(args.tokens_per_step), "--step-ms", str(args.step_ms)],
                                cwd=ROOT)
        url = f"http://127.0.0.1:{port}"
        _wait(url)
    try:
        arrivals = [L.Arrival(t=0.0, prompt=[101, 102, 103], max_tokens=args.tokens, id=f"r{i}")
                    for i in range(args.streams)]
        for rep in range(args.repeats):
            server0 = _cpu_s(proc.pid) if proc else 0.0
            wall0, cpu0 = time.perf_counter(), time.process_time()
            outs = L.run_load([url], arrivals, temperature=0.0, ignore_eos=True, client=args.client)
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            server_cpu = f" fake_server_cpu={_cpu_s(proc.pid) - server0:.2f}s" if proc else ""
            bad = [o.error for o in outs if not o.ok]
            tokens = sum(o.output_tokens for o in outs)
            events = sum(len(o.chunk_tokens) for o in outs)
            print(f"run {rep + 1}: client={L.client_name(args.client)} streams={args.streams} tokens={tokens:,} "
                  f"events={events:,} wall={wall:.2f}s client_cpu={cpu:.2f}s{server_cpu} | "
                  f"{tokens / wall:,.0f} tok/s wall, {events / cpu:,.0f} events/s and {tokens / cpu:,.0f} tok/s "
                  f"per client CPU second" + (f" | {len(bad)} failed: {bad[0]}" if bad else ""), flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
