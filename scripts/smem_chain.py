"""Batch 1's four GEMVs a layer with their weight tiles copied into shared memory (Gluon, cp.async) before the
PDL wait, against the same arithmetic with the tiles held in registers (persistent_chain's `sep`): do programs
that hold few registers while they wait let the next kernel's programs load beside them?

    PYTHONPATH=. python3 scripts/smem_chain.py --out $OUT/smem.json        # device, ~1 minute
    python scripts/smem_chain.py --compile-only [--json]                    # here: sm_90 cubins, no GPU

Why (docs/perf.md, sessions 28-31): each one-row GEMV of the engine holds its whole weight tile in registers
(255 a thread for gate/up: two programs fill an SM's register file), so the next kernel's programs cannot start
on an SM before the previous kernel's leave, and q/k/v's and gate/up's weight streams start at the boundary.
persistent_chain.py measured the megakernel's answer in plain Triton (the tile in registers, a grid barrier a
phase) and lost (1.065x). The megakernels that win hold the next weights in shared memory, which Triton's `tl`
does not express; Gluon (Triton 3.6's triton.experimental.gluon) does: each program here issues its tile as
16-byte cp.async copies into shared memory (LDGSTS: no register holds a weight while it is in flight), commits
one group a 256-column chunk, passes its PDL wait, makes its input and sums chunk by chunk as the groups land.
Compiled for sm_90 with Triton 3.6: 44-127 registers and 32-64 KiB of shared memory a program, so a successor's
programs fit on an SM beside them.

The chain is persistent_chain's (Qwen3-0.6B shapes, bf16, 28 layers of distinct weights, its float32 reference
with the kernels' rounding points). Grids as the engine's: q/k/v 256 programs of 16 rows, o 128 of 8, gate/up 192
of 16 (+16 up), down 128 of 8 (persistent_chain's sep: 128 programs every phase). Variants, each one CUDA graph
of the 28 layers:
    sep          persistent_chain's kernel a phase, the tile in registers, PDL (the baseline), 4 warps
    smem         the tile in shared memory; a program lets its successor launch after its own wait
    smem_first   the same, its successor let go before its wait (the chain may run ahead while shared memory lasts)
    smem_nopdl   the same kernels without PDL (what PDL is worth here)
    smem_fine    smem with twice the programs, half the rows each (an SM's share of a phase evener)
    smem_w8      smem at 8 warps
    smem_probe   smem with each program's timer stamped at its start, past its wait, with its last chunk landed and
                 at its end: a table a phase of when those come after the previous launch's last program ended
The check: each variant's final hidden state against the float32 reference (relative L2 within 2e-2). Exit 0:
every check passed; 1: a check failed; 2: could not run (no GPU, or Gluon missing).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp  # noqa: E402

# (the copy under its name in this Triton, and PDL's two instructions: the engine's Gluon GEMV's)
from engine.kernels.smem_gemv import _copy, _gdc_launch_dependents, _gdc_wait  # noqa: E402

CHUNK = 256  # columns a chunk: one commit group, one wait
KB = gl.constexpr(CHUNK)
MAX_PROGRAMS = gl.constexpr(1024)  # a launch's region of the probe buffer
PHASES = ("qkv", "o", "gu", "down")
# the engine's decode grids: (rows, K, programs) a phase
SHAPES = {"qkv": (4096, 1024, 256), "o": (1024, 2048, 128), "gu": (3072, 1024, 192), "down": (1024, 3072, 128)}
# the Gluon variants: (PDL mode, programs a phase times the engine's grid, warps)
SMEM_VARIANTS = {"smem": (1, 1, 4), "smem_first": (2, 1, 4), "smem_nopdl": (0, 1, 4), "smem_fine": (1, 2, 4),
                 "smem_w8": (1, 1, 8)}


@gluon.jit
def _stamp(probe_ptr, idx, PROBE: gl.constexpr):
    """The global timer (ns) into probe_ptr[idx] when PROBE is 1."""
    if PROBE:
        t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
        gl.store(probe_ptr + idx, t)


@gluon.jit
def _smem_gemv(w_ptr, u_ptr, in_ptr, ln_ptr, res_ptr, out_ptr, eps, layer, probe_ptr, slot,
               N: gl.constexpr, K: gl.constexpr, R: gl.constexpr, KC: gl.constexpr, PHASE: gl.constexpr,
               PDL: gl.constexpr, PROBE: gl.constexpr, num_warps: gl.constexpr):
    """One phase of `layer` for a program's R rows of an [N, K] weight (u_ptr: gate/up's second weight).
    PHASE 0 qkv: out = W RMSNorm(in) (bf16); 1 o and 3 down: out = res + W in (fp32); 2 gate/up: out =
    SiLU(W x) * (U x), x = RMSNorm(in) (bf16). PDL 1: wait, then let the successor launch; 2: the other way
    round; 0: neither (launched without PDL). PROBE 1: the program's timer stamps at its start, past its wait,
    with its last chunk landed and at its end, into probe_ptr[((slot * MAX_PROGRAMS) + program) * 4 + k]."""
    BL: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])  # 16 bytes a thread a row
    SH: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])  # a warp reads 512 contiguous bytes: no conflicts
    DT: gl.constexpr = w_ptr.dtype.element_ty
    row0 = gl.program_id(0) * R
    at = (slot * MAX_PROGRAMS + gl.program_id(0)) * 4
    _stamp(probe_ptr, at, PROBE)
    rows = gl.arange(0, R, layout=gl.SliceLayout(1, BL))
    cols = gl.arange(0, KB, layout=gl.SliceLayout(0, BL))
    offs = rows[:, None] * K + cols[None, :]
    wbase = w_ptr + (layer * N + row0) * K
    wbuf = gl.allocate_shared_memory(DT, [KC, R, KB], SH)
    if PHASE == 2:
        ubase = u_ptr + (layer * N + row0) * K
        ubuf = gl.allocate_shared_memory(DT, [KC, R, KB], SH)
    for c in gl.static_range(KC):  # every weight in flight before the wait
        _copy(wbuf.index(c), wbase + c * KB + offs, cache_modifier=".cg")
        if PHASE == 2:
            _copy(ubuf.index(c), ubase + c * KB + offs, cache_modifier=".cg")
        cp.commit_group()
    if PDL == 1:
        _gdc_wait()
        _gdc_launch_dependents()
    elif PDL == 2:
        _gdc_launch_dependents()
        _gdc_wait()
    _stamp(probe_ptr, at + 1, PROBE)
    if PHASE == 0 or PHASE == 2:
        V: gl.constexpr = gl.BlockedLayout([4], [32], [num_warps], [0])
        h = gl.load(in_ptr + gl.arange(0, K, layout=V), cache_modifier=".cg")
        inv = 1.0 / gl.sqrt(gl.sum(h * h, axis=0) / K + eps)
    acc = gl.zeros([R, KB], gl.float32, BL)
    acc_u = gl.zeros([R, KB], gl.float32, BL)
    for c in gl.static_range(KC):
        x = gl.load(in_ptr + c * KB + cols, cache_modifier=".cg").to(gl.float32)
        if PHASE == 0 or PHASE == 2:
            x = (x * inv * gl.load(ln_ptr + layer * K + c * KB + cols).to(gl.float32)).to(DT).to(gl.float32)
        cp.wait_group(KC - 1 - c)  # (groups land in order: chunk c's is the oldest still counted)
        if c == KC - 1:
            _stamp(probe_ptr, at + 2, PROBE)
        acc += wbuf.index(c).load(BL).to(gl.float32) * x[None, :]
        if PHASE == 2:
            acc_u += ubuf.index(c).load(BL).to(gl.float32) * x[None, :]
    y = gl.sum(acc, axis=1)
    out_rows = row0 + rows
    if PHASE == 0:
        gl.store(out_ptr + out_rows, y.to(DT))
    elif PHASE == 2:
        silu = (y / (1.0 + gl.exp(-y))).to(DT).to(gl.float32)
        gl.store(out_ptr + out_rows, (silu * gl.sum(acc_u, axis=1)).to(DT))
    else:
        gl.store(out_ptr + out_rows, gl.load(res_ptr + out_rows, cache_modifier=".cg") + y)
    _stamp(probe_ptr, at + 3, PROBE)


def launch_args(phase: str, scale: int = 1) -> dict:
    """The constexprs and grid of a phase's launch (scale: programs a phase times the engine's, rows a program
    divided by it)."""
    n, k, programs = SHAPES[phase]
    programs *= scale
    if n % programs or k % CHUNK:
        raise ValueError(f"{phase}: {n} rows over {programs} programs, K {k} in chunks of {CHUNK}")
    return {"N": n, "K": k, "R": n // programs, "KC": k // CHUNK, "PHASE": PHASES.index(phase), "programs": programs}


class SmemChain:
    """persistent_chain.Chain's buffers, run by the Gluon kernels: `run()` computes the chain from h0 into `h`."""

    def __init__(self, torch, geo: dict, data: dict, device: str, pdl: int, scale: int = 1, warps: int = 4,
                 probe: bool = False):
        self.geo, self.data, self.pdl, self.warps = geo, data, pdl, warps
        # the probe: 4 stamps a program a launch, a region of MAX_PROGRAMS programs a launch
        self.probe = (torch.zeros(geo["layers"] * len(PHASES) * MAX_PROGRAMS.value * 4, dtype=torch.int64,
                                  device=device) if probe else None)
        dt = data["wqkv"].dtype
        self.h = torch.empty(geo["hidden"], dtype=torch.float32, device=device)
        self.mid = torch.empty_like(self.h)
        self.qkv = torch.empty(geo["qkv"], dtype=dt, device=device)
        self.act = torch.empty(geo["inter"], dtype=dt, device=device)
        self.meta = {p: launch_args(p, scale) for p in PHASES}

    def _launch(self, phase: str, layer: int) -> None:
        d = self.data
        w, u, src, ln, res, out = {
            "qkv": (d["wqkv"], d["wqkv"], self.h, d["ln1"], self.h, self.qkv),
            "o": (d["wo"], d["wo"], self.qkv, d["ln1"], self.h, self.mid),
            "gu": (d["wg"], d["wu"], self.mid, d["ln2"], self.h, self.act),
            "down": (d["wd"], d["wd"], self.act, d["ln2"], self.mid, self.h)}[phase]
        m = self.meta[phase]
        kw = {"launch_pdl": True} if self.pdl else {}
        probe = self.probe if self.probe is not None else self.h
        _smem_gemv[(m["programs"],)](w, u, src, ln, res, out, 1e-6, layer, probe, layer * len(PHASES) + m["PHASE"],
                                    N=m["N"], K=m["K"], R=m["R"], KC=m["KC"], PHASE=m["PHASE"], PDL=self.pdl,
                                    PROBE=int(self.probe is not None), num_warps=self.warps, **kw)

    def run(self) -> None:
        self.h.copy_(self.data["h0"])
        for layer in range(self.geo["layers"]):
            for phase in PHASES:
                self._launch(phase, layer)


def measure(torch, rounds: int) -> dict:
    import persistent_chain as pc

    geo = pc.geometry(False)
    data = pc.make_data(torch, geo, torch.bfloat16, "cuda")
    ref = pc.reference(torch, geo, data)
    wbytes = sum(data[k].numel() * data[k].element_size() for k in ("wqkv", "wo", "wg", "wu", "wd"))
    out = {"device": torch.cuda.get_device_name(), "geometry": geo, "shapes": SHAPES, "variants": []}
    chains = {}
    rows = [{"name": "sep", "kernel": "triton, tile in registers"}] + [
        {"name": n, "kernel": f"gluon, tile in shared memory, {w} warps, {s}x programs", "pdl": m, "scale": s,
         "warps": w} for n, (m, s, w) in SMEM_VARIANTS.items()] + [
        # the timer stamped at four points of each program (timed too: what the stamps cost)
        {"name": "smem_probe", "kernel": "smem with its probe", "pdl": 1, "scale": 1, "warps": 4, "probe": True}]
    for row in rows:
        try:
            c = (pc.Chain(torch, geo, data, "cuda", "sep", 0, 4) if row["name"] == "sep"
                 else SmemChain(torch, geo, data, "cuda", row["pdl"], row["scale"], row["warps"],
                                row.get("probe", False)))
            c.run()
            torch.cuda.synchronize()
            row["rel_err"] = pc.rel_err(torch, c.h, ref)
            row["ok"] = row["rel_err"] < 2e-2
            chains[row["name"]] = c
        except Exception as e:  # noqa: BLE001 - a variant that does not run is a result
            row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
        out["variants"].append(row)
    for _ in range(rounds):  # interleaved: each variant once a round
        for row in out["variants"]:
            if row["name"] in chains:
                row.setdefault("us_a_layer", []).append(pc.time_ms(torch, True, chains[row["name"]].run) * 1e3
                                                        / geo["layers"])
    for row in out["variants"]:
        if row.get("us_a_layer"):
            row["median_us_a_layer"] = sorted(row["us_a_layer"])[len(row["us_a_layer"]) // 2]
            row["TBps"] = wbytes / geo["layers"] / (row["median_us_a_layer"] * 1e-6) / 1e12
    for row in out["variants"]:  # (the stamps as the last timed replay left them)
        c = chains.get(row["name"])
        if getattr(c, "probe", None) is not None and row["name"] != "sep":
            row["probe"] = probe_summary(c.probe.tolist(), {p: m["programs"] for p, m in c.meta.items()},
                                         geo["layers"])
    base = out["variants"][0].get("median_us_a_layer")
    for row in out["variants"]:
        if base and row.get("median_us_a_layer"):
            row["ratio_to_sep"] = row["median_us_a_layer"] / base
    out["ok"] = all(r["ok"] for r in out["variants"])
    return out


def probe_summary(stamps: list[int], programs: dict, layers: int) -> dict:
    """Per phase, medians over the middle layers (two at each end left out) of when its programs started, passed
    their wait, had their last chunk landed and ended, in us after the previous launch's last program ended:
    (first, last) for the starts, (median, last) for the rest."""
    import statistics

    def at(launch, p, k):
        return stamps[(launch * MAX_PROGRAMS.value + p) * 4 + k]

    mids = range(2, layers - 2) if layers > 5 else range(1, layers)
    out = {}
    for f, name in enumerate(PHASES):
        cols = {"started": [], "started_last": [], "past_wait": [], "past_wait_last": [], "landed": [],
                "landed_last": [], "ended": [], "ended_last": []}
        for lay in mids:
            launch = lay * len(PHASES) + f
            prev = launch - 1
            prev_end = max(at(prev, p, 3) for p in range(programs[PHASES[prev % len(PHASES)]]))
            for k, key in enumerate(("started", "past_wait", "landed", "ended")):
                ts = sorted((at(launch, p, k) - prev_end) / 1e3 for p in range(programs[name]))
                cols[key].append(ts[0] if k == 0 else ts[len(ts) // 2])
                cols[key + "_last"].append(ts[-1])
        out[name] = {k: statistics.median(v) for k, v in cols.items() if v}
    return out


def compiled(phase: str, pdl: int = 1, warps: int = 4, scale: int = 1, probe: int = 0):
    """The phase's kernel compiled for sm_90 by the installed Triton, as the device's JIT specialises the launch
    (pointers 16-byte aligned, `layer` a plain i32)."""
    from kernel_sass import gluon_sm90

    m = launch_args(phase, scale)
    normed = phase in ("qkv", "gu")
    sig = {"w_ptr": "*bf16", "u_ptr": "*bf16", "in_ptr": "*fp32" if normed else "*bf16", "ln_ptr": "*bf16",
           "res_ptr": "*fp32", "out_ptr": "*bf16" if normed else "*fp32", "eps": "fp32", "layer": "i32",
           "probe_ptr": "*i64", "slot": "i32"}
    consts = {"N": m["N"], "K": m["K"], "R": m["R"], "KC": m["KC"], "PHASE": m["PHASE"], "PDL": pdl,
              "PROBE": probe, "num_warps": warps}
    return gluon_sm90(_smem_gemv, sig, consts, ("w_ptr", "u_ptr", "in_ptr", "ln_ptr", "res_ptr", "out_ptr",
                                                "probe_ptr"), warps, fp_fusion=True)


def resources(kernel, warps: int = 4) -> dict:
    from kernel_sass import async_copy_report

    return async_copy_report(kernel, warps)


def compile_report() -> dict:
    return {p: resources(compiled(p)) for p in PHASES}


def markdown(log: dict) -> str:
    lines = [f"# four GEMVs a layer: tiles in registers (sep) against tiles in shared memory ({log['device']}), "
             f"commit {log.get('commit')}", "", "| variant | kernel | us a layer (rounds) | median | TB/s | / sep | "
             "rel err | ok |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in log["variants"]:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['kernel']} | | | | | {r['error'][:80]} | no |")
            continue
        us = ", ".join(f"{x:.2f}" for x in r.get("us_a_layer", []))
        lines.append(f"| {r['name']} | {r['kernel']} | {us} | {r.get('median_us_a_layer', 0):.2f} | "
                     f"{r.get('TBps', 0):.2f} | {r.get('ratio_to_sep', 0):.3f} | {r['rel_err']:.1e} | "
                     f"{'yes' if r['ok'] else 'NO'} |")
    for r in log["variants"]:
        if r.get("probe"):
            lines += ["", f"{r['name']}: us after the previous launch's last program ended (medians over the middle "
                      "layers): started (first / last), past the PDL wait, last chunk landed, ended (median / last)",
                      "", "| phase | started | past wait | landed | ended |", "| --- | --- | --- | --- | --- |"]
            for name, ph in r["probe"].items():
                lines.append(f"| {name} | {ph['started']:.2f} / {ph['started_last']:.2f} | {ph['past_wait']:.2f} / "
                             f"{ph['past_wait_last']:.2f} | {ph['landed']:.2f} / {ph['landed_last']:.2f} | "
                             f"{ph['ended']:.2f} / {ph['ended_last']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="result JSON (a Markdown table is written beside it)")
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds, the variants interleaved (default 5)")
    ap.add_argument("--compile-only", action="store_true",
                    help="compile each phase for sm_90 here and print registers, shared memory and spills")
    ap.add_argument("--json", action="store_true", help="with --compile-only: JSON instead of a table")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        print("smem_chain: --rounds must be at least 1", file=sys.stderr)
        return 2
    if args.compile_only:
        try:
            report = compile_report()
        except Exception as e:  # noqa: BLE001 - a kernel that does not compile is the answer
            print(f"smem_chain: could not compile for sm_90: {type(e).__name__}: {str(e)[-600:]}", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(report, indent=1))
        else:
            print(f"{'phase':6} {'registers':>9} {'shared':>7} {'an SM':>5} {'spills':>6} {'copies':>6} {'waits':>5}")
            for p, r in report.items():
                print(f"{p:6} {r['registers']:9d} {r['shared']:7d} {r['per_sm']:5d} {r['spill_loads']:6d} "
                      f"{r['async_copies']:6d} {r['pdl_waits']:5d}")
        return 0 if all(r["spill_loads"] == 0 for r in report.values()) else 1
    if not args.out:
        print("smem_chain: --out is required unless --compile-only", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("smem_chain: no CUDA device (use --compile-only here)", file=sys.stderr)
        return 2
    from labkit.output import write_result

    log = measure(torch, args.rounds)
    write_result(Path(args.out), log, markdown(log))
    return 0 if log["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
