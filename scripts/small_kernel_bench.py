"""Our small decode-time kernels alone, on one GPU, against what they replace: checks and device times.

    PYTHONPATH=. python3 scripts/small_kernel_bench.py --out $OUT/small_kernels.json [--sweep]   # device, ~1 min
    python scripts/small_kernel_bench.py --dry-run --out /tmp/small_kernels.json   # CPU: Triton's interpreter

What it measures (Qwen3-0.6B shapes, bf16; each call timed as 20 calls in one CUDA graph, as the engine's
decode graphs run them, engine/kernels/timing.py):
  (a) the split-K GEMV (engine/kernels/small_gemm.py) for the decoder's four projections and the LM head at
      M = 1, 8, 16 rows, against cuBLAS (F.linear): time, weight GB/s, and its error against a float64
      product (the check: within one bf16 rounding of the output, as tests/test_small_gemm.py);
      --sweep adds the launch knobs (block_n x block_k x split_k) at M = 1 and 8, best per shape;
  (b) the fused q/k RMSNorm + RoPE kernel (engine/kernels/qk_norm_rope.py) at 1, 16 and 256 tokens against the
      eager torch chain it must equal (fused.qk_norm_rope): fraction of equal outputs (the check: >= 99.9%),
      and both timed.
The engine-level before/after of these kernels is `labkit bench --workload nano|batch1 --no-custom-kernels`
against the default (docs/perf.md); this script is for the kernels themselves.
Exit 0: every check passed; 1: a check failed; 2: could not run. One JSON at --out, a Markdown table beside it.
--dry-run: tiny shapes in float32 on the CPU in Triton's interpreter; its times mean nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

QK_EQUAL_MIN = 0.999   # measured on the H200: 100% at 1 and 256 tokens, 99.9996% at 4,096 (docs/perf.md)
GEMM_ROWS = (1, 8, 16)


def geometry(dry: bool) -> dict:
    if dry:
        return {"gemm": {"o_proj": (64, 128)}, "lm_head": (200, 64), "rows": (1, 3), "heads": (4, 2, 32),
                "tokens": (3,), "sweep": {"block_n": (16,), "block_k": (32, 64), "split_k": (1, 2)}}
    return {"gemm": {"qkv": (4096, 1024), "o_proj": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)},
            "lm_head": (151936, 1024), "rows": GEMM_ROWS, "heads": (16, 8, 128), "tokens": (1, 16, 256),
            "sweep": {"block_n": (16, 32, 64), "block_k": (128, 256), "split_k": (1, 2, 4, 8)}}


def timer(torch, cuda: bool):
    """Per-call milliseconds: graph-replayed on a GPU; one host-timed call on the CPU (meaningless)."""
    if cuda:
        from engine.kernels.timing import graph_ms

        return lambda fn: graph_ms(fn, calls=20, replays=7)

    def host(fn) -> float:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return host


def gemm_ok(torch, out, ref) -> tuple[bool, float]:
    err = (out.double() - ref).abs()
    if out.dtype == torch.float32:
        return bool(err.max().item() <= 1e-5 * (1 + ref.abs().max().item())), err.max().item()
    return bool((err <= 2 ** -8 * ref.abs() + 1e-3).all().item()), err.max().item()


def bench_gemm(torch, timed, geo: dict, dtype, device: str, sweep: bool) -> dict:
    import torch.nn.functional as F

    from engine.device import num_sms
    from engine.kernels.small_gemm import small_gemm_config, small_matmul

    g = torch.Generator().manual_seed(0)
    sms = num_sms(torch.device(device), 132)
    rows = []
    best = {}
    shapes = dict(geo["gemm"], lm_head=geo["lm_head"])
    for name, (n, k) in shapes.items():
        w = (torch.randn(n, k, generator=g) * k ** -0.5).to(dtype).to(device)
        for m in geo["rows"][:1] if name == "lm_head" else geo["rows"]:
            x = torch.randn(m, k, generator=g).to(dtype).to(device)
            ref = x.double() @ w.double().T
            ok, err = gemm_ok(torch, small_matmul(x, w), ref)
            ours, cublas = timed(lambda: small_matmul(x, w)), timed(lambda: F.linear(x, w))
            rows.append({"shape": name, "N": n, "K": k, "M": m, "ok": ok, "max_err": err, "ours_us": ours * 1e3,
                         "cublas_us": cublas * 1e3, "ours_weight_GBps": n * k * w.element_size() / ours / 1e6,
                         "config": small_gemm_config(m, n, k, sms)})
            if sweep and name != "lm_head" and m in geo["rows"][:2]:
                tried = {}
                for bn in geo["sweep"]["block_n"]:
                    for bk in geo["sweep"]["block_k"]:
                        for sk in geo["sweep"]["split_k"]:
                            kw = dict(block_n=bn, block_k=bk, split_k=sk)
                            try:
                                tried[f"n{bn} k{bk} s{sk}"] = timed(lambda: small_matmul(x, w, **kw)) * 1e3
                            except Exception as e:  # noqa: BLE001 - a launch that does not compile is a result
                                tried[f"n{bn} k{bk} s{sk}"] = f"{type(e).__name__}: {str(e)[:80]}"
                timed_ok = {c: us for c, us in tried.items() if isinstance(us, float)}
                if timed_ok:
                    top = min(timed_ok, key=timed_ok.get)
                    best[f"{name} M={m}"] = {"best": top, "best_us": timed_ok[top], "default_us": ours * 1e3,
                                             "cublas_us": cublas * 1e3, "tried": tried}
    return {"rows": rows, "sweep": best or None, "ok": all(r["ok"] for r in rows)}


def bench_qk(torch, timed, geo: dict, dtype, device: str) -> dict:
    from engine.kernels.qk_norm_rope import qk_norm_rope
    from engine.layers import fused
    from engine.layers.rope import RotaryEmbedding

    heads, kv_heads, head_dim = geo["heads"]
    g = torch.Generator().manual_seed(1)
    table = RotaryEmbedding(head_dim, 4096, 1e6).cos_sin_cache.to(device)
    rows = []
    for t in geo["tokens"]:
        qkv = torch.randn(t, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype).to(device)
        pos = torch.randint(0, 4000, (t,), generator=g).to(device)
        qw = (1 + 0.1 * torch.randn(head_dim, generator=g)).to(dtype).to(device)
        kw = (1 + 0.1 * torch.randn(head_dim, generator=g)).to(dtype).to(device)

        def eager():
            q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
            return fused.qk_norm_rope(q.reshape(-1, heads, head_dim), k.reshape(-1, kv_heads, head_dim), qw, kw,
                                      1e-6, table[pos])

        def ours():
            return qk_norm_rope(qkv, pos, table, qw, kw, 1e-6, heads, kv_heads, head_dim)

        (q0, k0), (q1, k1) = eager(), ours()
        equal = ((q1 == q0).sum() + (k1 == k0).sum()).item() / (q0.numel() + k0.numel())
        max_abs = max((q1.float() - q0.float()).abs().max().item(), (k1.float() - k0.float()).abs().max().item())
        ok = equal >= QK_EQUAL_MIN or (dtype == torch.float32 and max_abs <= 1e-5)
        rows.append({"tokens": t, "ok": ok, "equal_frac": equal, "max_abs": max_abs,
                     "ours_us": timed(ours) * 1e3, "eager_chain_us": timed(eager) * 1e3})
    return {"rows": rows, "ok": all(r["ok"] for r in rows)}


def markdown(log: dict) -> str:
    lines = [f"# small kernels: {log['device']} ({log['dtype']}), commit {log['commit']}", "",
             "| GEMM | M | ours us | cuBLAS us | ours/cuBLAS | ours weight GB/s | max err | ok |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in log.get("gemm", {}).get("rows", []):
        lines.append(f"| {r['shape']} {r['N']}x{r['K']} | {r['M']} | {r['ours_us']:.2f} | {r['cublas_us']:.2f} | "
                     f"{r['ours_us'] / r['cublas_us']:.2f} | {r['ours_weight_GBps']:,.0f} | {r['max_err']:.2e} | "
                     f"{'ok' if r['ok'] else 'FAIL'} |")
    sweep = log.get("gemm", {}).get("sweep")
    if sweep:
        lines += ["", "| GEMM sweep | best | best us | default us | cuBLAS us |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {s} | {v['best']} | {v['best_us']:.2f} | {v['default_us']:.2f} | {v['cublas_us']:.2f} |"
                  for s, v in sweep.items()]
    lines += ["", "| q/k norm + RoPE | ours us | eager chain us | equal to eager | max abs | ok |",
              "| --- | --- | --- | --- | --- | --- |"]
    for r in log.get("qk", {}).get("rows", []):
        lines.append(f"| {r['tokens']} tokens | {r['ours_us']:.2f} | {r['eager_chain_us']:.2f} | "
                     f"{100 * r['equal_frac']:.4f}% | {r['max_abs']:.2e} | {'ok' if r['ok'] else 'FAIL'} |")
    lines += ["", f"Checks: {'PASS' if log.get('passed') else 'FAIL'}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON path; the Markdown table goes beside it (.md)")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU in Triton's interpreter")
    ap.add_argument("--sweep", action="store_true", help="GEMM launch knobs at M = 1 and 8, best per shape")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.dry_run:  # before `engine` is imported: importing it imports triton, which reads this once
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from engine.kernels.interpreter import script_device

    device = script_device(args.dry_run)
    if device is None:
        print("small_kernel_bench: no CUDA device (use --dry-run to exercise the script on the CPU)", file=sys.stderr)
        return 2
    cuda = device == "cuda"
    import torch

    from labkit.output import git_head

    dtype = torch.bfloat16 if cuda else torch.float32
    geo = geometry(args.dry_run)
    timed = timer(torch, cuda)
    log = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": git_head(), "dry_run": args.dry_run,
           "device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
           "dtype": str(dtype).replace("torch.", "")}
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        log["gemm"] = bench_gemm(torch, timed, geo, dtype, device, args.sweep)
        log["qk"] = bench_qk(torch, timed, geo, dtype, device)
    except Exception as exc:  # what ran so far still goes to --out
        log["error"] = f"{type(exc).__name__}: {exc}"
        out.write_text(json.dumps(log, indent=1, default=str))
        print(f"small_kernel_bench: could not run: {log['error'][:300]}", file=sys.stderr)
        return 2
    log["passed"] = log["gemm"]["ok"] and log["qk"]["ok"]
    log["ended"] = time.strftime("%Y-%m-%d %H:%M:%S")
    text = markdown(log)
    out.write_text(json.dumps(log, indent=1, default=str))
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0 if log["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
