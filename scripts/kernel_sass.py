"""What the decode attention kernel's loop costs in instructions, compiled for the H200 (sm_90) here, without a GPU.

    python scripts/kernel_sass.py [--out FILE.md] [--variants "fp8 fp8:fp8_dot=kq ..."] [--triton DIR]

Each variant is compiled ahead of time by Triton for sm_90 (the arguments specialised as a launch on the device
specialises them: aligned pointers and strides, so the K/V loads are software-pipelined into shared memory as
they are there), its cubin disassembled with the cuobjdump Triton ships, and the main loop (the longest backward
branch) counted: instructions a warp issues for one tile of keys, the warp-instructions a kilobyte of K/V costs
(x warps / the tile's K+V bytes), and the opcodes that dominate. A kernel that moves its bytes near the memory's
rate spends few instructions a byte; session 14 found the e4m3 kernel spending ~3x bf16's (docs/perf.md), its
V tile read from shared memory a byte at a time (LDS, IMAD, F2FP) because an 8-bit operand cannot be transposed
by ldmatrix. The counts come from the local Triton, or with --triton DIR from another (`pip install --target
DIR triton==3.6.0`, the H200's: the two compile differently, session 18 found the keys-contiguous V tile loaded
byte by byte by 3.6 alone until the kernel stated its alignment): a guide for what to measure, never a
measurement.

Variant: "bf16" or "fp8", then ":key=value" pairs among block_n, warps, stages, fp8_dot (engine/kernels/
decode_attention.py's names), vt (1: V stored keys-contiguous, LABKIT_FP8_V_TRANSPOSED's layout, read in
unmasked page tiles) and order (1: programs launched in a given order of the rows). The table also gives the
registers a thread (cuobjdump -res-usage) and the programs an SM that registers and shared memory allow: a kernel
that keeps few tiles in flight an SM cannot hide DRAM's latency.
Exit 0 with the table; 2 when Triton cannot compile for sm_90 here.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VARIANTS = "bf16 fp8 fp8:vt=1 fp8:fp8_dot=qk fp8:fp8_dot=kq fp8:fp8_dot=qkpv fp8:vt=1,fp8_dot=qkpv"
HEAD_DIM, GROUP, BLOCK_SIZE = 128, 2, 256   # Qwen3-0.6B's geometry, the engine's block


def parse_variant(text: str) -> dict:
    kind, _, rest = text.partition(":")
    if kind not in ("bf16", "fp8"):
        raise ValueError(f"variant {text!r}: starts with bf16 or fp8")
    v = {"fp8": kind == "fp8", "block_n": 128, "warps": 4, "stages": 2, "fp8_dot": "off", "vt": 0, "order": 0,
         "name": text}
    for pair in filter(None, rest.split(",")):
        key, _, value = pair.partition("=")
        if key not in ("block_n", "warps", "stages", "fp8_dot", "vt", "order"):
            raise ValueError(f"variant {text!r}: unknown key {key!r}")
        v[key] = value if key == "fp8_dot" else int(value)
    return v


def compile_sass(v: dict, triton_dir: str | None = None) -> str:
    """The variant's SASS, from a process of its own: with TRITON_INTERPRET set (the CPU tests set it) the
    engine's kernels are imported as interpreted functions, which Triton cannot compile. triton_dir: another
    Triton to compile with (first on the path)."""
    env = {k: val for k, val in os.environ.items() if k != "TRITON_INTERPRET"}
    if triton_dir:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [triton_dir, env.get("PYTHONPATH")]))
    res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--sass-of", v["name"]], env=env,
                         capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}")
    return res.stdout


def _sass_here(v: dict) -> str:
    """cuobjdump -sass of the variant's sm_90 cubin, compiled in this process."""
    sys.path.insert(0, str(REPO))
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from engine.kernels.decode_attention import FP8_DOTS, _decode_split_kernel

    kv = "fp8e4nv" if v["fp8"] else "bf16"
    sig = {"q_ptr": "*bf16", "k_cache_ptr": f"*{kv}", "v_cache_ptr": f"*{kv}", "k_desc": f"*{kv}",
           "v_desc": f"*{kv}", "block_tables_ptr": "*i32", "context_lens_ptr": "*i32", "order_ptr": "*i32",
           "out_ptr": "*bf16",
           "acc_ptr": "*fp32", "ml_ptr": "*fp32", **{k: "i32" for k in (
               "num_splits", "stride_qb", "stride_qh", "stride_ob", "stride_oh", "stride_bt", "stride_block",
               "stride_head", "stride_row", "stride_v_row", "stride_v_d")}, "scale_log2": "fp32", "v_scale": "fp32"}
    # A launch specialises an int argument equal to 1 to the constant: V's head-dimension stride, or with vt its
    # row stride.
    one = "stride_v_row" if v["vt"] else "stride_v_d"
    sig[one] = "constexpr"
    consts = {one: 1, "FP8": v["fp8"], "V_T": bool(v["vt"]), "GROUP": GROUP, "GROUP_PAD": 16, "HEAD_DIM": HEAD_DIM,
              "BLOCK_SIZE": BLOCK_SIZE,
              "BLOCK_N": v["block_n"], "PAGE_TILES": True, "TMA": False, "PARTIALS": False,
              "DOT_PRECISION": "tf32", "FP8_DOT": FP8_DOTS.index(v["fp8_dot"]), "ORDERED": bool(v["order"])}
    sig.update({k: "constexpr" for k in consts})
    names = list(sig)
    # A launch specialises what is 16-divisible (pointers from torch, strides of these shapes); the kernel keeps
    # block_tables/context_lens (unaligned) and num_splits/stride_bt (do_not_specialize) general.
    aligned = ["q_ptr", "k_cache_ptr", "v_cache_ptr", "k_desc", "v_desc", "out_ptr", "acc_ptr", "ml_ptr",
               "stride_qb", "stride_qh", "stride_ob", "stride_oh", "stride_block", "stride_head", "stride_row",
               "stride_v_d" if v["vt"] else "stride_v_row"]
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = ASTSource(_decode_split_kernel, sig, constexprs=consts, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": v["warps"], "num_stages": v["stages"]})
    regs, sass = cubin_sass(compiled)
    return f"// registers {regs} shared {compiled.metadata.shared}\n{sass}"


def cubin_sass(compiled) -> tuple[int, str]:
    """A compiled kernel's registers a thread and SASS, from its cubin through the cuobjdump Triton ships."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([str(tool), "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([str(tool), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"REG:(\d+)", usage).group(1)), sass


def gluon_sm90(fn, sig: dict, consts: dict, aligned: tuple[str, ...], warps: int, fp_fusion: bool = False):
    """A Gluon kernel compiled for sm_90 by the installed Triton as the device's JIT specialises a launch: sig
    (argument: type, in order), consts (constexpr: value, after them), the pointers in `aligned` 16-byte aligned,
    PDL on, floating-point fusion as the launch asks (Triton's default: on)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    names = list(sig) + list(consts)
    full = dict(sig, **{k: "constexpr" for k in consts})
    src = GluonASTSource(fn, full, constexprs={(names.index(k),): v for k, v in consts.items()},
                         attrs={(names.index(a),): [["tt.divisibility", 16]] for a in aligned})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "launch_pdl": True, "enable_fp_fusion": fp_fusion})


def async_copy_report(kernel, warps: int) -> dict:
    """Registers a thread, shared memory a program, programs an SM, spill loads, and the cp.async copies in a
    compiled kernel's SASS: how many, how many before the PDL wait (ACQBULK), how many each commit group holds,
    and the copy groups a thread lets stay in flight at each of its waits, in program order (a chunk is read only
    once its own group has landed when these count down to 0)."""
    regs, sass = cubin_sass(kernel)
    return {"registers": regs, "shared": kernel.metadata.shared,
            "per_sm": programs_per_sm(regs, kernel.metadata.shared, warps),
            "spill_loads": len(re.findall(r"\bLDL\b", sass)), "async_copies": len(re.findall(r"\bLDGSTS\b", sass)),
            "pdl_waits": len(re.findall(r"\bACQBULK\b", sass)),
            "group_waits": [int(n, 16) for n in re.findall(r"\bDEPBAR\.LE SB0, (0x[0-9a-f]+)", sass)],
            "copies_before_wait": len(re.findall(r"\bLDGSTS\b", sass.split("ACQBULK")[0])),
            # shared-memory reads before the first group wait (nothing copied may be read there)
            # (not counting `@!PT LDS RZ, [RZ]`: never executed, the compiler's padding)
            "reads_before_first_wait": len(re.findall(r"(?<!@!PT )\bLDS\b", sass.split("DEPBAR.LE")[0])),
            # global loads issued after the program's first global store: a store the compiler cannot tell from
            # the loads' memory (the new residual stream) keeps every later load behind it, a round trip each
            "loads_after_a_store": len(re.findall(r"\bLDG\b", sass.split("STG", 1)[1])) if "STG" in sass else 0,
            # the copies each commit group (LDGDEPBAR) closes, in program order
            "group_sizes": [len(re.findall(r"\bLDGSTS\b", part)) for part in sass.split("LDGDEPBAR")[:-1]]}


def main_loop(sass: str) -> list[str]:
    """The instructions of the longest loop (a branch back to an earlier address), predicates stripped."""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4})\*/\s+([^;]*);", sass)]
    loops = []
    for addr, text in ins:
        target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            loops.append((int(target.group(1), 16), addr))
    if not loops:
        return []
    lo, hi = max(loops, key=lambda span: span[1] - span[0])
    return [re.sub(r"^@!?U?P\w+\s+", "", t) for a, t in ins if lo <= a <= hi]


def programs_per_sm(registers: int, shared: int, warps: int) -> int:
    """How many programs an H100/H200 SM holds at once: 64K registers (a thread's count rounded up to 8), 228 KiB
    of shared memory (1 KiB of it reserved a program), 64 warps."""
    by_regs = 65536 // (-(-registers // 8) * 8 * 32 * warps)
    by_shared = 233472 // (shared + 1024)
    return min(by_regs, by_shared, 64 // warps, 32)


def row(v: dict, loop: list[str], sass: str = "") -> dict:
    ops = collections.Counter(t.split()[0].split(".")[0] for t in loop)
    tile_kb = 2 * v["block_n"] * HEAD_DIM * (1 if v["fp8"] else 2) / 1024
    usage = re.search(r"// registers (\d+) shared (\d+)", sass)
    regs, shared = (int(usage.group(1)), int(usage.group(2))) if usage else (0, 0)
    return {"variant": v["name"], "loop": len(loop), "per_kb": len(loop) * v["warps"] / tile_kb,
            "registers": regs, "shared": shared,
            "per_sm": programs_per_sm(regs, shared, v["warps"]) if usage else 0,
            "top": ", ".join(f"{k} {n}" for k, n in ops.most_common(6))}


def markdown(rows: list[dict]) -> str:
    out = ["| variant | loop instructions a warp | warp-instructions a KB of K/V | registers | shared KiB | "
           "programs an SM | most frequent |", "| --- | --- | --- | --- | --- | --- | --- |"]
    out += [f"| {r['variant']} | {r['loop']} | {r['per_kb']:.0f} | {r['registers']} | {r['shared'] / 1024:.0f} | "
            f"{r['per_sm']} | {r['top']} |" for r in rows]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--out", help="write the Markdown table here too")
    ap.add_argument("--triton", help="a folder holding another Triton to compile with (pip install --target DIR "
                                     "triton==3.6.0: the H200's)")
    ap.add_argument("--sass-of", help=argparse.SUPPRESS)  # (compile_sass's own process)
    args = ap.parse_args(argv)
    if args.sass_of:
        print(_sass_here(parse_variant(args.sass_of)), end="")
        return 0
    try:
        variants = [parse_variant(t) for t in args.variants.split()]
    except ValueError as exc:
        print(f"kernel_sass: {exc}", file=sys.stderr)
        return 2
    rows = []
    for v in variants:
        try:
            sass = compile_sass(v, args.triton)
        except Exception as exc:  # noqa: BLE001 - no sm_90 backend here, or the variant does not compile
            print(f"kernel_sass: {v['name']}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
            return 2
        rows.append(row(v, main_loop(sass), sass))
    table = markdown(rows)
    print(table, end="")
    if args.out:
        Path(args.out).write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
