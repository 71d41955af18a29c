"""Every Triton kernel a step launches, compiled for the H200 (sm_90) here, without a GPU.

    python scripts/sm90_compile.py [--json] [--triton DIR]
    (DIR: another Triton to compile with, from `pip install --target DIR triton==3.6.0`: the H200's)

The CPU tests run the kernels in Triton's interpreter, which never compiles them: a kernel the device's Triton
cannot compile passes every CPU test and fails on the device. Session 16 lost a device call that way (a helper's
default string argument: Triton 3.9 here compiles it, the H200's 3.6 does not). This script runs, on the CPU
(interpreted), a fused decode layer's kernels (one row and two, one split and three, a bf16 and an FP8 pool),
prefills and decodes through the Triton attention backend (bf16 and FP8 pools, a prefix hit), and calls the
elementwise kernels, q/k norm + RoPE, the small GEMM and the Gumbel sampler; it records every kernel launch and
compiles each for sm_90 with the launch's constexprs, PDL on as on the device and the model dtype bfloat16. Run
it with the device's Triton (--triton) before a device call; the launches are recorded with the Triton installed
here either way (3.6's interpreter cannot run them).

--json gives each launch's PTX fingerprint ("ptx": a hash of the PTX without its source locations), so a
refactor's compiled kernels can be compared with the commit's before it: the same fingerprints, the same code.

Exit 0 when every launch compiles, 1 when one does not (named, with Triton's error), 2 when the step could not
be recorded or Triton cannot compile for sm_90 here.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASES = [(1, "auto"), (3, "auto"), (3, "fp8"), (3, "fp8-vt")]  # (splits, KV cache dtype; -vt: V keys-contiguous)
TYPES = {"float16": "bf16", "bfloat16": "bf16", "float32": "fp32", "float8_e4m3fn": "fp8e4nv", "int32": "i32",
         "int64": "i64", "uint8": "u8"}  # (the interpreter's float16 stands for the device's bfloat16)
OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion", "launch_pdl")


def _record() -> list[dict]:
    """The launches of fused decode steps, interpreted here (TRITON_INTERPRET=1 in this process)."""
    sys.path.insert(0, str(REPO))
    import inspect

    import torch
    import triton.language as tl

    from engine import LLM, SamplingParams
    from engine.kernels import (
        decode_attention,
        decode_layer,
        dot_precision,
        elementwise,
        gumbel_sampler,
        kv_write,
        prefill_attention,
        qk_norm_rope,
        small_gemm,
    )
    from labkit.fake_model import make_fake_model

    launches: dict[str, dict] = {}

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel
            self.fn = kernel.fn

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                params = inspect.signature(self.fn).parameters
                sig, consts = {}, {}
                bound = dict(zip(params, args)) | {k: v for k, v in kwargs.items() if k not in OPTIONS}
                for name, p in params.items():
                    value = bound.get(name, p.default)
                    if p.annotation in (tl.constexpr, "tl.constexpr"):
                        consts[name] = value
                    elif isinstance(value, torch.Tensor):
                        sig[name] = "*" + TYPES[str(value.dtype).removeprefix("torch.")]
                    elif (value == 1 and not isinstance(value, (bool, float))
                          and name not in (self.kernel.kwargs.get("do_not_specialize") or ())):
                        consts[name] = 1  # a launch specialises an int equal to 1 (a keys-contiguous V's row stride)
                    else:
                        sig[name] = "fp32" if isinstance(value, float) else "i32"
                if "USE_PDL" in consts:  # as on the device
                    consts["USE_PDL"] = decode_layer.PDL_MODE != "off"
                if "TRIGGER" in consts:
                    consts["TRIGGER"] = decode_layer.PDL_TRIGGER.get(decode_layer.PDL_MODE, 0)
                if "EARLY" in consts:  # (decode_attention's merge kernel)
                    consts["EARLY"] = decode_layer.PDL_MODE in ("early", "first")
                if "ON_GPU" in consts:
                    consts["ON_GPU"] = True
                if "DOT_PRECISION" in consts:
                    consts["DOT_PRECISION"] = dot_precision(torch.bfloat16)
                options = {k: kwargs[k] for k in OPTIONS[:3] if k in kwargs}
                key = f"{self.fn.__name__} {sorted(consts.items())}"
                launches.setdefault(key, {"kernel": self.fn.__name__, "module": self.fn.__module__, "sig": sig,
                                          "constexprs": consts, "options": options})
                if consts.get("PROBE") == 0:  # the in-kernel probe is CUDA's alone (LABKIT_DECODE_PROBE): compile it
                    on = consts | {"PROBE": 1}
                    launches.setdefault(f"{self.fn.__name__} {sorted(on.items())}", {
                        "kernel": self.fn.__name__, "module": self.fn.__module__, "sig": sig | {"probe_ptr": "*i64"},
                        "constexprs": on, "options": options})
                return self.kernel[grid](*args, **kwargs)
            return launch

    for mod in (decode_layer, decode_attention, elementwise, gumbel_sampler, kv_write, prefill_attention,
                qk_norm_rope, small_gemm):
        for name, obj in list(vars(mod).items()):
            if hasattr(obj, "fn") and name.endswith("_kernel"):  # (launched kernels; helpers are called inside them)
                setattr(mod, name, Recorder(obj))
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g).half()

    # A fused decode layer's launches (engine/fused_decode.py's order) on a small geometry: hidden 64, 4 query
    # and 2 KV heads of 16, intermediate 128, 16-token blocks; at one row and at a tile of two.
    hidden, heads, kv_heads, head_dim, inter = 64, 4, 2, 16, 128
    # (two rows: one at a time, LABKIT_DECODE_FMA_ROWS's default, and on the tensor-core tile, as 5-16 rows go)
    fma_default = decode_layer.FMA_ROWS
    for splits, kv, fma_rows in [(s, k, f) for s, k in CASES for f in (fma_default, 1)]:
        decode_layer.FMA_ROWS = fma_rows
        for rows in (1, 2) if fma_rows > 1 else (2,):
            pool = torch.zeros(8, kv_heads, 16, head_dim).to(torch.float8_e4m3fn if kv != "auto" else torch.float16)
            v_pool = pool.clone()
            if kv == "fp8-vt":  # V keys-contiguous (engine/kv_layout.py), its 16-token pages whole tiles (unmasked)
                v_pool = v_pool.view(8, kv_heads, head_dim, 16).transpose(-1, -2)
            ctx = torch.tensor([40, 7][:rows], dtype=torch.int32)
            tables = torch.tensor([[0, 1, 2], [3, -1, -1]][:rows], dtype=torch.int32)
            down_parts = torch.randn(3, rows, hidden, generator=g)
            qkv, residual = decode_layer.gemv(rand((heads + 2 * kv_heads) * head_dim, hidden), partials=down_parts,
                                              residual=rand(rows, hidden), norm_weight=rand(hidden))
            decode_layer.gemv(rand(8, hidden), x=rand(rows, hidden), norm_weight=rand(hidden))  # the first layer
            o = decode_layer.qkv_attention(qkv, ctx.long() - 1, torch.randn(64, head_dim), rand(head_dim),
                                           rand(head_dim), 1e-6, ctx - 1, pool, v_pool, tables, ctx, 0.25,
                                           splits, heads, kv_heads, block_n=16 if kv == "fp8-vt" else None)
            o_parts = decode_layer.gemv(rand(hidden, heads * head_dim), x=o, split=2)
            if splits > 1:  # the parts merged by o_proj's GEMV instead (LABKIT_DECODE_MERGE_IN_GEMV=1)
                parts = decode_layer.qkv_attention(qkv, ctx.long() - 1, torch.randn(64, head_dim), rand(head_dim),
                                                   rand(head_dim), 1e-6, ctx - 1, pool, v_pool, tables, ctx, 0.25,
                                                   splits, heads, kv_heads, block_n=16 if kv == "fp8-vt" else None,
                                                   merge=False)
                decode_layer.gemv(rand(hidden, heads * head_dim), x=parts, split=2)
            h, residual = decode_layer.gemv(rand(2 * inter, hidden), partials=o_parts, residual=residual,
                                            norm_weight=rand(hidden), silu=True)
            parts = decode_layer.gemv(rand(hidden, inter), x=h, split=2)
            decode_layer.partials_norm(parts, residual, rand(hidden), 1e-6)
    decode_layer.FMA_ROWS = fma_default
    # One row's GEMVs with their warps on rows (LABKIT_DECODE_ROW_LAYOUT=rows), in 32-column chunks: q/k/v's norm
    # over down's partials, gate/up's SiLU, a split down.
    layout_default, chunk_default = decode_layer.ROW_LAYOUT, decode_layer.ROW_CHUNK
    decode_layer.ROW_LAYOUT, decode_layer.ROW_CHUNK = "rows", 32
    decode_layer.gemv(rand((heads + 2 * kv_heads) * head_dim, hidden), partials=torch.randn(3, 1, hidden),
                      residual=rand(1, hidden), norm_weight=rand(hidden))
    decode_layer.gemv(rand(2 * inter, hidden), partials=torch.randn(2, 1, hidden), residual=rand(1, hidden),
                      norm_weight=rand(hidden), silu=True)
    decode_layer.gemv(rand(hidden, inter), x=rand(1, inter), split=2)
    decode_layer.ROW_LAYOUT, decode_layer.ROW_CHUNK = layout_default, chunk_default
    with tempfile.TemporaryDirectory() as tmp:
        make_fake_model("tiny", Path(tmp) / "tiny", seed=0)
        import engine.runner

        # The attention backend's prefill, decode and KV write; a prefix hit. fp8-vt: V keys-contiguous in
        # 128-token blocks, so prefill's and decode's tiles are whole pages (read unmasked).
        for kv in ("auto", "fp8", "fp8-vt"):
            engine.runner.FP8_V_TRANSPOSED = kv == "fp8-vt"
            llm = LLM(str(Path(tmp) / "tiny"), device="cpu", attention_backend="triton", dtype="float16",
                      enforce_eager=True, kvcache_block_size=128 if kv == "fp8-vt" else 16,
                      num_kvcache_blocks=8, max_model_len=128, kv_cache_dtype=kv.removesuffix("-vt"))
            prompt = list(range(100, 140))
            llm.generate([prompt, prompt[:32] + [7, 8, 9]], SamplingParams(max_tokens=3, ignore_eos=True),
                         use_tqdm=False)
            llm.exit()
    engine.runner.FP8_V_TRANSPOSED = False
    vt = {ln["kernel"] for ln in launches.values() if ln["constexprs"].get("V_T")}
    assert {"_decode_split_kernel", "_prefill_kernel", "_store_kv_kernel", "_qkv_attention_kernel"} <= vt, vt
    x, w = rand(3, 64), rand(64)
    elementwise.rms_norm(x, w, 1e-6)
    elementwise.add_rms_norm(x, x.clone(), w, 1e-6)
    elementwise.silu_and_mul(torch.randn(3, 128, generator=g).half())
    qk_norm_rope.qk_norm_rope(torch.randn(3, 4 * 16, generator=g).half(), torch.arange(3), torch.randn(8, 16),
                              torch.ones(16).half(), torch.ones(16).half(), 1e-6, 2, 1, 16)
    small_gemm.small_matmul(x, torch.randn(32, 64, generator=g).half())
    gumbel_sampler.gumbel_argmax(torch.randn(2, 3000, generator=g).half(), torch.tensor([0.0, 0.8]),
                                 torch.tensor([1, 2]))
    return list(launches.values())


def ptx_fingerprint(ptx: str) -> str:
    """A hash of PTX without its source locations (.loc, .file, the debug sections and the $L__tmp labels that
    mark inlined scopes for them: they move with any edit of the file, or a helper's call) or comments: equal for
    equal code."""
    keep = []
    for line in ptx.splitlines():
        t = line.strip()
        if t.startswith((".loc", ".file", "//")) or re.fullmatch(r"\$L__tmp\d+:", t):
            continue
        if t.startswith(".section") and "debug" in t:
            break  # (the debug sections run to the end)
        keep.append(t)
    return hashlib.sha256("\n".join(keep).encode()).hexdigest()[:16]


def _compile_here(launches: list[dict]) -> list[dict]:
    """Each launch compiled for sm_90 in this process (no interpreter): {"kernel", "ok", "error"}, then
    {"triton": its version}."""
    sys.path.insert(0, str(REPO))
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    out = []
    for ln in launches:
        fn = getattr(importlib.import_module(ln["module"]), ln["kernel"])
        sig = {**ln["sig"], **{k: "constexpr" for k in ln["constexprs"]}}
        sig = {name: sig[name] for name in fn.arg_names}
        aligned = [i for i, name in enumerate(fn.arg_names) if sig[name].startswith("*")]
        attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
        try:
            k = triton.compile(ASTSource(fn, sig, constexprs=ln["constexprs"], attrs=attrs),
                               target=GPUTarget("cuda", 90, 32), options=ln["options"])
            out.append({"kernel": ln["kernel"], "constexprs": ln["constexprs"], "ok": True, "error": "",
                        "ptx": ptx_fingerprint(k.asm["ptx"])})
        except Exception as exc:  # noqa: BLE001 - Triton's compile errors are of many kinds; each is reported
            # (a CompilationError's last line may be the caret under the source: its cause says why)
            lines = [ln_ for ln_ in str(exc).strip().splitlines() if ln_.strip() not in ("", "^")]
            why = f"; cause: {type(exc.__cause__).__name__}: {exc.__cause__}" if exc.__cause__ else ""
            out.append({"kernel": ln["kernel"], "constexprs": ln["constexprs"], "ok": False,
                        "error": f"{type(exc).__name__}: {' / '.join(lines[-2:])}{why}"})
    return out + [{"triton": triton.__version__}]


def _run(mode: str, payload: str, interpret: bool, triton_dir: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    if triton_dir:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [triton_dir, env.get("PYTHONPATH")]))
    res = subprocess.run([sys.executable, str(Path(__file__).resolve()), mode, payload], env=env,
                         capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        raise RuntimeError(res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}")
    return res.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--triton", help="a folder holding another Triton to compile with")
    ap.add_argument("--record", action="store_true", help=argparse.SUPPRESS)   # (the recording process)
    ap.add_argument("--compile", help=argparse.SUPPRESS)                       # (the compiling process)
    args, _ = ap.parse_known_args(argv)
    if args.record:
        print(json.dumps(_record()))
        return 0
    if args.compile:
        print(json.dumps(_compile_here(json.loads(Path(args.compile).read_text()))))
        return 0
    try:
        launches = json.loads(_run("--record", "", interpret=True))
    except Exception as exc:  # noqa: BLE001 - the recording step failed: say how
        print(f"sm90_compile: recording the fused decode step failed: {exc}", file=sys.stderr)
        return 2
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(launches, f)
    try:
        results = json.loads(_run("--compile", f.name, interpret=False, triton_dir=args.triton))
    except Exception as exc:  # noqa: BLE001 - no sm_90 backend here
        print(f"sm90_compile: cannot compile for sm_90 here: {exc}", file=sys.stderr)
        return 2
    finally:
        os.unlink(f.name)
    version = results.pop()["triton"]
    bad = [r for r in results if not r["ok"]]
    if args.json:
        print(json.dumps({"triton": version, "launches": results, "ok": not bad}, indent=1))
    else:
        print(f"Triton {version}, sm_90: {len(results) - len(bad)} of {len(results)} launches compile")
        for r in results:
            print(f"  {r['kernel']:<28} {'ok' if r['ok'] else 'FAILS: ' + r['error'][:600]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
