"""Time the elementwise kernels inside a CUDA graph, as a decode step runs them: per "layer", add_rms_norm,
silu_and_mul and rms_norm on Qwen3-0.6B's sizes, 28 layers per graph. Our Triton kernels at several warp
counts (and silu blocks) against torch.compile's fusion of engine/layers/fused.py (what the engine used before
session 8). Prints one row per (variant, rows): microseconds per layer and the largest difference from the
plain torch functions.

Its weights sit in L2 for every layer (one small weight, reused), which a real step never gives them: there a
norm's weight comes from memory, and a load after the reduction costs a trip more. This bench ranked our kernels
ahead of inductor's while the model ran 17-20 us a step slower with them (docs/perf.md, session 9). Decide with
`bench --workload batch1` from both trees in one call (`gpu_session.sh trees`), not with this.

    python scripts/elementwise_bench.py [--rows 1 64 256] [--hidden 1024] [--intermediate 3072]
"""
from __future__ import annotations

import argparse
import json

import torch

from engine.kernels import elementwise
from engine.layers import fused


def _variants(inductor: bool):
    out = {}
    for w in (1, 2, 4, 8):
        for sb in (1024, 4096):
            out[f"triton norm w{w} silu w{min(w * (sb // 1024), 8)}/b{sb}"] = (
                lambda x, r, wt, e, w=w: elementwise.add_rms_norm(x, r, wt, e, num_warps=w),
                lambda g, w=w, sb=sb: elementwise.silu_and_mul(g, num_warps=min(w * (sb // 1024), 8), block=sb),
                lambda x, wt, e, w=w: elementwise.rms_norm(x, wt, e, num_warps=w))
    out["triton default"] = (elementwise.add_rms_norm, elementwise.silu_and_mul, elementwise.rms_norm)
    if inductor:
        import torch._inductor.config as inductor_config

        inductor_config.emulate_precision_casts = True
        out["inductor (torch.compile)"] = tuple(torch.compile(f, dynamic=True) for f in
                                                (fused.add_rms_norm, fused.silu_and_mul, fused.rms_norm))
    return out


def _time(fns, rows, hidden, inter, layers=28, reps=200):
    add_norm, silu, norm = fns
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, hidden, device="cuda", generator=g).bfloat16()
    res = torch.randn(rows, hidden, device="cuda", generator=g).bfloat16()
    gate = torch.randn(rows, 2 * inter, device="cuda", generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(hidden, device="cuda", generator=g)).bfloat16()

    def body():
        h, r = x, res
        for _ in range(layers):
            h, r = add_norm(h, r, w, 1e-6)
            silu(gate)
            h = norm(h, w, 1e-6)
        return h

    ref = body()  # (compiles)
    plain = (fused.add_rms_norm, fused.silu_and_mul, fused.rms_norm)
    h1, _ = add_norm(x, res, w, 1e-6)
    h0, _ = plain[0](x, res, w, 1e-6)
    diff = max((h1.float() - h0.float()).abs().max().item(),
               (silu(gate).float() - plain[1](gate).float()).abs().max().item())
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            body()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    for _ in range(20):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    del ref
    return start.elapsed_time(end) * 1000 / reps / layers, diff


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 64, 256])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=3072)
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    results = []
    for name, fns in _variants(not args.no_inductor).items():
        for rows in args.rows:
            us, diff = _time(fns, rows, args.hidden, args.intermediate)
            results.append({"variant": name, "rows": rows, "us_per_layer": us, "max_diff_vs_torch": diff})
            print(f"{name:36s} rows {rows:4d}  {us:7.2f} us/layer  max diff {diff:.3g}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
