"""Whether the fused decode GEMV spills registers, compiled for the H200 (sm_90) here, without a GPU.

    python scripts/gemv_spills.py [--rows "1 16"] [--config config.json] [--max-spills 0] [--json]

Each of a decoder layer's four GEMVs (engine/kernels/decode_layer.py: q/k/v with the partials summed in, the
residual and the norm; o_proj split over K; gate/up with SiLU*up; down_proj split over K) is compiled as the
engine launches it (`gemv_meta`, so the LABKIT_DECODE_* knobs in the environment apply) for Qwen3-0.6B's
geometry or a config.json's, and its cubin's local-memory loads and stores counted (LDL/STL: spills). A tile
that spills runs many times slower on the device: session 15's K_CHUNK change left the 16-row q/k/v and gate/up
tiles spilling (538 and 6,070 loads) and batch 4 decoded 14x slower on the H200. Counts come from the local
Triton, which may differ from the device's; a tile that spills here is worth a device run before it lands.

The attention launch between q/k/v and o_proj is compiled too (its registers and shared memory decide where its
programs go while q/k/v's run: docs/perf.md, session 31).

The table also gives each launch's registers a thread, the programs an SM those and its shared memory allow
(scripts/kernel_sass.py's count) and the programs it launches: with 132 SMs, a launch of fewer programs than
132 x that leaves SMs without a second program to overlap the next kernel's first loads under PDL.

Exit 0 when no GEMV (attention is not judged) has more spill loads than --max-spills, 1 when one has (named), 2
when Triton cannot compile for sm_90 here.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QWEN3_06B = {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
             "intermediate_size": 3072}
NUM_SMS = 132  # the H200's, which split_for cuts K for


def layer_gemvs(cfg: dict, rows: int) -> list[dict]:
    """The four launches of a middle layer (its inputs are the previous layer's partials) at `rows` rows, and
    o_proj merging attention's split parts as it reads them."""
    sys.path.insert(0, str(REPO))
    from engine.kernels.decode_layer import GEMV_MERGE_SPLITS, split_for

    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    head_dim = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    o_split, down_split = split_for(h, q, NUM_SMS), split_for(h, inter, NUM_SMS)
    base = dict(M=rows, residual=False, norm=False, silu=False, partials_out=False, s_in=0, split=1)
    return [
        {**base, "name": "q/k/v", "N": q + 2 * kv, "K": h, "s_in": down_split, "residual": True, "norm": True},
        {**base, "name": "o_proj", "N": h, "K": q, "split": o_split, "partials_out": True},
        {**base, "name": "gate/up", "N": inter, "K": h, "s_in": o_split, "residual": True, "norm": True,
         "silu": True},
        {**base, "name": "down_proj", "N": h, "K": inter, "split": down_split, "partials_out": True},
        # o_proj merging the most attention splits it merges (64-key tiles) as it reads them
        # (LABKIT_DECODE_MERGE_IN_GEMV=1)
        {**base, "name": "o+merge", "N": h, "K": q, "split": o_split, "partials_out": True,
         "attn": [GEMV_MERGE_SPLITS, head_dim, 64]},
    ]


def attention_launch(cfg: dict, rows: int) -> dict:
    """The fused decode attention at `rows` rows as its short-context graph launches it (graph_dispatch's
    splits, a bf16 pool of 256-token blocks), for its registers and shared memory: they decide where its
    programs go beside q/k/v's (docs/perf.md, session 31)."""
    sys.path.insert(0, str(REPO))
    from engine.graph_dispatch import short_splits

    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return {"name": "attention", "M": rows, "heads": cfg["num_attention_heads"], "kv_heads": cfg["num_key_value_heads"],
            "head_dim": head_dim, "split": short_splits(rows), "block_size": 256}


def _attention_compiled(g: dict):
    """The attention launch's kernel, grid and arguments as qkv_attention makes them (recorded on CPU tensors),
    compiled for sm_90 as the device's JIT would specialise them: pointers and 16-divisible integers aligned, an
    integer 1 a constant. (Compiled without those alignments, the kernel loads its K/V tile element by element and
    spills: 32 registers and 12 KB of local memory a thread, nothing like the launch's.)"""
    import inspect

    import torch
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from engine.kernels import decode_layer as dl

    rec = {}

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                rec.update(grid=grid, args=args, kwargs=kwargs)
                raise StopIteration
            return launch

    real = dl._qkv_attention_kernel
    dl._qkv_attention_kernel = Recorder()
    try:
        M, H, KV, D, B = g["M"], g["heads"], g["kv_heads"], g["head_dim"], g["block_size"]
        i32 = dict(dtype=torch.int32)
        pool = torch.zeros(2, KV, B, D, dtype=torch.bfloat16)
        dl.qkv_attention(torch.zeros(M, (H + 2 * KV) * D, dtype=torch.bfloat16), torch.zeros(M, dtype=torch.int64),
                         torch.zeros(64, D), torch.ones(D, dtype=torch.bfloat16), torch.ones(D, dtype=torch.bfloat16),
                         1e-6, torch.zeros(M, dtype=torch.int64), pool, pool, torch.zeros(M, 2, **i32),
                         torch.ones(M, **i32), D ** -0.5, g["split"], H, KV)
    except StopIteration:
        pass
    finally:
        dl._qkv_attention_kernel = real
    options = {k: rec["kwargs"].pop(k) for k in ("num_warps", "num_stages", "enable_fp_fusion")}
    rec["kwargs"].pop("launch_pdl", None)
    params = inspect.signature(real.fn).parameters
    bound = dict(zip(params, rec["args"])) | rec["kwargs"]
    unspecialised = {x if isinstance(x, str) else list(params)[x] for x in real.do_not_specialize or ()}
    sig, consts, aligned = {}, {}, []
    for i, (name, p) in enumerate(params.items()):
        value = bound[name]
        if p.annotation in (tl.constexpr, "tl.constexpr"):
            consts[name], sig[name] = value, "constexpr"
        elif isinstance(value, torch.Tensor):
            sig[name] = "*" + {torch.bfloat16: "bf16", torch.float32: "fp32", torch.int32: "i32",
                               torch.int64: "i64"}[value.dtype]
            aligned.append(i)
        elif isinstance(value, float):
            sig[name] = "fp32"
        elif value == 1 and name not in unspecialised:
            consts[name], sig[name] = 1, "constexpr"
        else:
            sig[name] = "i32"
            if value % 16 == 0 and name not in unspecialised:
                aligned.append(i)
    consts["USE_PDL"] = dl.PDL_MODE != "off"  # (as on the device)
    consts["TRIGGER"] = dl.PDL_TRIGGER.get(dl.PDL_MODE, 0)
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    compiled = triton.compile(ASTSource(real, sig, constexprs=consts, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options=options)
    grid = rec["grid"]
    return compiled, options["num_warps"], grid[0] * grid[1] * grid[2]


def _gemv_compiled(g: dict):
    """One GEMV launch compiled for sm_90 as the engine launches it: (compiled kernel, warps, programs)."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from engine.kernels import decode_layer as dl

    _, meta = dl.gemv_meta(g["M"], g["N"], g["K"], g["split"], s_in=g["s_in"], residual=g["residual"],
                           norm=g["norm"], silu=g["silu"], partials_out=g["partials_out"], dtype=torch.bfloat16,
                           use_pdl=dl.PDL_MODE != "off", trigger=dl.PDL_TRIGGER.get(dl.PDL_MODE, 0),
                           attn=tuple(g.get("attn", (0, 0, 0))))
    options = {"num_warps": meta.pop("num_warps"), "num_stages": 2, "enable_fp_fusion": meta.pop("enable_fp_fusion")}
    sig = {"w_ptr": "*bf16", "x_ptr": "*bf16", "part_ptr": "*fp32", "res_ptr": "*bf16", "res_out_ptr": "*bf16",
           "nw_ptr": "*bf16", "y_ptr": "*fp32" if g["partials_out"] else "*bf16", "ml_ptr": "*fp32",
           "ctx_ptr": "*i32", "probe_ptr": "*i64", **{k: "i32" for k in (
               "M", "N", "K", "KS", "stride_wn", "stride_xm", "up_rows")}, "eps": "fp32"}
    meta["PROBE"] = 0  # (the in-kernel probe off, as the engine launches)
    sig.update({k: "constexpr" for k in meta})
    names = list(sig)
    # A launch specialises what is 16-divisible: torch's pointers, and these shapes' sizes and strides (M, the
    # batch, is not).
    aligned = ["w_ptr", "x_ptr", "part_ptr", "res_ptr", "res_out_ptr", "nw_ptr", "y_ptr", "ml_ptr", "ctx_ptr", "N",
               "K", "KS", "stride_wn", "stride_xm", "up_rows"]
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    compiled = triton.compile(ASTSource(dl._gemv_kernel, sig, constexprs=meta, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options=options)
    grid, _ = dl.gemv_meta(g["M"], g["N"], g["K"], g["split"], s_in=g["s_in"], residual=g["residual"],
                           norm=g["norm"], silu=g["silu"], partials_out=g["partials_out"], dtype=torch.bfloat16,
                           use_pdl=False, trigger=0)
    return compiled, options["num_warps"], grid[0] * grid[1]


def _sass_here(g: dict) -> str:
    """cuobjdump -sass of one launch's sm_90 cubin, compiled in this process."""
    sys.path.insert(0, str(REPO))

    compiled, warps, programs = (_attention_compiled if g["name"] == "attention" else _gemv_compiled)(g)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kernel_sass import cubin_sass

    regs, sass = cubin_sass(compiled)
    return f"// registers {regs} shared {compiled.metadata.shared} warps {warps} programs {programs}\n{sass}"


def sass_of(g: dict, env_changes: dict | None = None) -> str:
    """The launch's SASS (after a "// registers ..." line), compiled in a process of its own: with
    TRITON_INTERPRET set (the CPU tests set it) the engine's kernels are interpreted functions Triton cannot
    compile. env_changes: variables for that process (the LABKIT_DECODE_* knobs are read at import)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_changes or {})
    res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--sass-of", json.dumps(g)], env=env,
                         capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}")
    return res.stdout


def spills(g: dict) -> dict:
    """{"loads", "stores"} of local memory in the launch's SASS, its registers, programs an SM and programs."""
    sass = sass_of(g)
    usage = re.search(r"// registers (\d+) shared (\d+) warps (\d+) programs (\d+)", sass)
    regs, shared, warps, programs = (int(x) for x in usage.groups())
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kernel_sass import programs_per_sm

    return {"loads": len(re.findall(r"\bLDL\b", sass)), "stores": len(re.findall(r"\bSTL\b", sass)),
            "registers": regs, "per_sm": programs_per_sm(regs, shared, warps), "programs": programs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1 16", help="batch sizes (1-16), space-separated")
    ap.add_argument("--config", help="a Hugging Face config.json (default: Qwen3-0.6B's geometry)")
    ap.add_argument("--max-spills", type=int, default=0, help="spill loads a GEMV may have (default 0)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--sass-of", help=argparse.SUPPRESS)  # (spills' own process)
    args = ap.parse_args(argv)
    if args.sass_of:
        print(_sass_here(json.loads(args.sass_of)), end="")
        return 0
    try:
        rows = [int(r) for r in args.rows.split()]
        if not rows or any(not 1 <= r <= 16 for r in rows):
            raise ValueError
    except ValueError:
        print(f"gemv_spills: --rows takes batch sizes 1-16, got {args.rows!r}", file=sys.stderr)
        return 2
    try:
        cfg = json.loads(Path(args.config).read_text()) if args.config else QWEN3_06B
        launches = [g for r in rows for g in [*layer_gemvs(cfg, r), attention_launch(cfg, r)]]
    except (OSError, ValueError, KeyError) as exc:
        print(f"gemv_spills: --config {args.config}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    results = []
    for g in launches:
        try:
            results.append({"gemv": g["name"], "rows": g["M"], "split": g["split"], **spills(g)})
        except Exception as exc:  # noqa: BLE001 - no sm_90 backend here, or the launch does not compile
            print(f"gemv_spills: {g['name']} at {g['M']} rows: {type(exc).__name__}: {str(exc)[:300]}",
                  file=sys.stderr)
            return 2
    # (attention is reported, not judged: at 255 registers a thread a Triton may spill a few values, 4 loads with
    # 3.9 against none with the device's 3.6; a misaligned compile spills thousands)
    bad = [r for r in results if r["loads"] > args.max_spills and r["gemv"] != "attention"]
    if args.json:
        print(json.dumps({"max_spills": args.max_spills, "gemvs": results, "ok": not bad}, indent=1))
    else:
        print(f"{'gemv':<10} {'rows':>4} {'split':>5} {'spill loads':>11} {'spill stores':>12} {'registers':>9} "
              f"{'an SM':>5} {'programs':>8}")
        for r in results:
            print(f"{r['gemv']:<10} {r['rows']:>4} {r['split']:>5} {r['loads']:>11,} {r['stores']:>12,} "
                  f"{r['registers']:>9} {r['per_sm']:>5} {r['programs']:>8}")
        print("no GEMV spills more than %d loads" % args.max_spills if not bad else
              "SPILLS: " + ", ".join(f"{r['gemv']} at {r['rows']} rows ({r['loads']:,} loads)" for r in bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
