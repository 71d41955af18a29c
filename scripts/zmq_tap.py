"""Subscribe to ZeroMQ PUB endpoints (a server's --step-stream-zmq and --kv-events) and count what arrives: what a
router or a planner attached to them would take. Used by scripts/gpu_session.sh issue34 (the streams' cost with
their readers attached); stops after --seconds or on SIGINT and writes the counts as JSON.

    python scripts/zmq_tap.py tcp://127.0.0.1:5560 tcp://127.0.0.1:5557 --seconds 60 --out taps.json
"""
from __future__ import annotations

import argparse
import json
import signal
import time

import msgpack
import zmq


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("endpoints", nargs="+")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    ctx = zmq.Context()
    poller = zmq.Poller()
    socks = {}
    for ep in args.endpoints:
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(ep)
        poller.register(s, zmq.POLLIN)
        socks[s] = {"endpoint": ep, "messages": 0, "bytes": 0, "gaps": 0, "last": None, "decoded": 0}
    stop = []
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    end = time.monotonic() + args.seconds
    while not stop and time.monotonic() < end:
        for s, _ in poller.poll(100):
            frames = s.recv_multipart()
            c = socks[s]
            c["messages"] += 1
            c["bytes"] += sum(len(f) for f in frames)
            n = int.from_bytes(frames[1], "big")
            if c["last"] is not None and n > c["last"] + 1:
                c["gaps"] += n - c["last"] - 1
            c["last"] = n
            msgpack.unpackb(frames[2], raw=False)   # what a reader does with each
            c["decoded"] += 1
    with open(args.out, "w") as f:
        json.dump([{k: v for k, v in c.items() if k != "last"} for c in socks.values()], f, indent=1)
    for s in socks:
        s.close(linger=0)
    ctx.term()


if __name__ == "__main__":
    main()
