"""Decode attention over an FP8 pool against the bf16 pool on the device: TB/s of the cache bytes read, per
tile width and pipeline depth (issue 32: does the FP8 pool want other knobs than engine DEFAULTS?).

    python3 scripts/fp8_decode_sweep.py [--out FILE.json]"""
from __future__ import annotations

import argparse
import json

import torch

from engine.kernels.decode_attention import num_splits_for, paged_decode
from engine.kv_quant import FP8


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    dev = torch.device("cuda")
    heads, kv_heads, d, bs = 16, 8, 128, 256
    rows = []
    for batch, ctx in ((256, 800), (256, 2048)):
        blocks_per = -(-ctx // bs)
        nblocks = batch * blocks_per
        tables = torch.arange(nblocks, dtype=torch.int32, device=dev).view(batch, blocks_per)
        lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
        q = torch.randn(batch, heads, d, dtype=torch.bfloat16, device=dev)
        base = torch.randn(nblocks, kv_heads, bs, d, device=dev)
        for name, dtype in (("bf16", torch.bfloat16), ("fp8", FP8)):
            k = base.to(dtype)
            v = base.flip(0).to(dtype)
            nbytes = 2 * batch * ctx * kv_heads * d * k.element_size()
            grid = [(128, 2, 4, 1)] if name == "bf16" else [
                (bn, st, w, sp) for bn in (64, 128, 256) for st in (2, 3, 4) for w in (4, 8) for sp in (1, 2)]
            for block_n, stages, warps, mult in grid:
                splits = min(64, mult * num_splits_for(batch, kv_heads, ctx, 132, block_n))
                if splits > -(-ctx // block_n):
                    continue
                fn = lambda: paged_decode(q, k, v, tables, lens, 0.088, splits, block_n=block_n,  # noqa: E731
                                          num_stages=stages, num_warps=warps)
                try:
                    fn()
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - a knob set that does not compile is a result too
                    print(dict(batch=batch, ctx=ctx, kv=name, block_n=block_n, stages=stages, warps=warps,
                               error=str(e)[:80]), flush=True)
                    continue
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for _ in range(10):
                        fn()
                g.replay()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                times = []
                for _ in range(5):
                    start.record()
                    g.replay()
                    end.record()
                    torch.cuda.synchronize()
                    times.append(start.elapsed_time(end) / 10)
                ms = sorted(times)[2]
                rows.append(dict(batch=batch, ctx=ctx, kv=name, block_n=block_n, stages=stages, warps=warps,
                                 splits=splits, us=round(ms * 1e3, 2), tb_s=round(nbytes / ms / 1e9, 3)))
                print(rows[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
