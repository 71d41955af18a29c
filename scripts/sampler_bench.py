"""The Gumbel-max sampler's kernel alone (engine/kernels/gumbel_sampler.py) at nano's shape: how its chunking,
block and warps move its time, each variant checked to draw the very ids the default draws (a draw depends on
each row's seed and the logit's index only, never on how the vocabulary is cut).

At batch 256 the default cuts each row in 2 chunks (2 programs an SM): 512 programs of ~76k logits, one
1,024-logit load in flight each. Session 5's profile put the sampler at 0.21 ms of nano's ~5 ms step, where its
78 MB of bf16 logits need ~0.02 ms at the memory's rate, and four uniforms a Philox call (fewer integer
instructions) did not shorten it (session 16): the guess is too few bytes in flight. Prediction (session 16,
before any run): 8-16 programs an SM take the kernel from ~0.2 to ~0.06-0.1 ms at 256 rows; at 1-16 rows the
default already has 17-264 chunks a row, and nothing moves by more than 10%.

    python scripts/sampler_bench.py [--rows 1 16 256] [--vocab 151936] [--variants "2,1024,4 8,1024,4 ..."]
        [--noises philox hash] [--out FILE.json] [--dry-run]

Variant: "programs an SM,block,warps". Each time is the median of --repeats CUDA-graph replays of --iters
calls (events around the replay), in microseconds a call. --dry-run: a small vocabulary on the CPU (Triton's
interpreter), the ids check only. Exit 0; 1 when a variant draws other ids than the default (named).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_VARIANTS = "2,1024,4 4,1024,4 8,1024,4 16,1024,4 4,2048,8 8,2048,8 16,2048,8 8,4096,8"


def parse_variant(text: str) -> tuple[int, int, int]:
    try:
        per_sm, block, warps = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"variant {text!r}: programs an SM,block,warps (three integers)") from None
    if per_sm < 1 or block < 16 or block & (block - 1) or warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"variant {text!r}: programs an SM >= 1, block a power of two >= 16, warps 1-16")
    return per_sm, block, warps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 256])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--noises", nargs="+", default=["hash"], choices=["hash", "philox"],
                    help="where the uniforms come from (LABKIT_GUMBEL_NOISE); each variant is checked against the "
                         "default variant of its own noise")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="CPU, a small vocabulary, ids checked, nothing timed")
    args = ap.parse_args(argv)
    try:
        variants = [parse_variant(v) for v in args.variants.split()]
    except ValueError as exc:
        print(f"sampler_bench: {exc}", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # (read when the kernels are defined: before the import)
    from engine.device import num_sms
    from engine.kernels.gumbel_sampler import gumbel_argmax, num_chunks_for
    from engine.kernels.timing import graph_ms

    dev = torch.device("cuda" if cuda else "cpu")
    vocab = args.vocab if cuda else min(args.vocab, 3000)
    sms = num_sms(dev, 132)
    g = torch.Generator().manual_seed(0)
    rows_out, wrong = [], []
    for rows in args.rows:
        # bf16 logits as the LM head leaves them (the interpreter has no bf16: float16 there)
        logits = (torch.randn(rows, vocab, generator=g) * 4).to(torch.bfloat16 if cuda else torch.float16).to(dev)
        temps = (torch.rand(rows, generator=g) + 0.5).to(dev)
        temps[::7] = 0.0  # some greedy rows, as nano's mix has none but a server's may
        seeds = torch.randint(0, 2**62, (rows,), generator=g).to(dev)
        for noise in args.noises:
            want = gumbel_argmax(logits, temps, seeds, noise=noise)
            for per_sm, block, warps in variants:
                chunks = num_chunks_for(rows, vocab, min(block, vocab), sms, per_sm=per_sm)

                def call(per_sm=per_sm, block=block, warps=warps, chunks=chunks, noise=noise):
                    return gumbel_argmax(logits, temps, seeds, block=block, num_chunks=chunks, num_warps=warps,
                                         noise=noise)

                same = torch.equal(call(), want)
                if not same:
                    wrong.append(f"{noise} {per_sm},{block},{warps} at {rows} rows")
                us = graph_ms(call, args.iters, args.repeats) * 1e3 if cuda else None
                rows_out.append({"rows": rows, "noise": noise, "per_sm": per_sm, "block": block, "warps": warps,
                                 "chunks": chunks, "same_ids": same, "us": us,
                                 "gb_per_s": None if us is None else rows * vocab * logits.element_size() / us / 1e3})
    print(f"{'rows':>5} {'noise':>6} {'per SM':>6} {'block':>6} {'warps':>5} {'chunks':>6} {'same ids':>8} "
          f"{'us':>9} {'GB/s':>7}")
    for r in rows_out:
        us = "-" if r["us"] is None else f"{r['us']:.1f}"
        gbs = "-" if r["gb_per_s"] is None else f"{r['gb_per_s']:.0f}"
        print(f"{r['rows']:>5} {r['noise']:>6} {r['per_sm']:>6} {r['block']:>6} {r['warps']:>5} {r['chunks']:>6} "
              f"{'yes' if r['same_ids'] else 'NO':>8} {us:>9} {gbs:>7}")
    if args.out:
        args.out.write_text(json.dumps({"device": str(dev), "vocab": vocab, "variants": rows_out,
                                        "ids_differ": wrong}, indent=1))
    if wrong:
        print("sampler_bench: other ids than the default's: " + ", ".join(wrong), file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
