"""Batch 1's weight stream, kernel by kernel: the fused decode GEMVs (engine/kernels/decode_layer.py) alone and
chained, at one row, as the engine launches them in a decode graph.

    PYTHONPATH=. python3 scripts/gemv_bench.py --out $OUT/gemv.json [--sweep]   # device, ~1 minute (+1 with --sweep)
    python scripts/gemv_bench.py --dry-run --out /tmp/gemv.json                 # CPU: Triton's interpreter

Why: a batch-1 token takes 0.742-0.754 ms on the H200 (sessions 15-19), a layer 26.5 us, of which the four GEMVs
~20 us: the weights at ~2.1 of the GPU's ~4.2 TB/s (docs/perf.md, "What limits us now"). Whether the GEMV itself
is slow, or the boundaries between kernels are, decides the next step (wider programs, or a persistent kernel a
layer); this script separates the two in one call.

Qwen3-0.6B shapes in bf16, 28 layers of distinct random weights (840 MB: past the 50 MB L2, as in a decode step,
so no launch reads its weights from L2). Each variant is one CUDA graph (engine/kernels/timing.py, median of 7
replays), its launches made exactly as engine/fused_decode.py makes them (input kind, norm, residual, SiLU*up,
split-K partials) with the engine's PDL:
  stream P    projection P's GEMV over the 28 layers' weights (28 launches back to back): per launch us, and
              its weight bytes / time in TB/s
  layer       the four GEMVs of every layer in order (112 launches): us a layer, beside the sum of the streams'
              (what chaining different kernels costs) and the engine's 26.5 us a layer with attention
  copy        a device copy of 256 MB: the bandwidth a kernel can reach here ((read + written) / time)
--prologue adds q/k/v's and gate/up's streams with their input as one bf16 row: ":x" (no partials, residual or
norm: the weights' stream and the products alone) and ":xn" (that row through RMSNorm): against the engine's
launch (partials summed, residual added, norm), what the prologue costs in each kernel (docs/perf.md, session 35:
both lost 1.4x in shared memory, the two GEMVs without that prologue gained).
--sweep adds, for each stream, rows a program (16, 32, 64) x warps (2, 4, 8) x PDL (early, off) around the
engine's default (16 rows, 4 warps, early), the launch knobs LABKIT_DECODE_GEMV and LABKIT_DECODE_PDL set; and
the layer's chain under each other PDL mode (first, early, late, off: where a kernel lets its successor launch).

The check: every launch of layer 0 in every variant against a float32 torch reference of the same arithmetic
(partials summed, residual added, RMSNorm, the product, SiLU(gate) * up): relative L2 error within 1e-2 in bf16
(a few roundings), 1e-4 in float32 (--dry-run). Exit 0: every check passed; 1: a check failed; 2: could not run.
One JSON at --out and a Markdown table beside it. --dry-run: tiny shapes in float32 on the CPU; its times mean
nothing.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROJECTIONS = ("qkv", "o_proj", "gate_up", "down")
ENGINE_LAYER_US = 26.5          # the engine's layer with attention, batch 1 (docs/perf.md, session 15)
PROLOGUE_STREAMS = ("qkv:x", "qkv:xn", "gate_up:x", "gate_up:xn")  # (--prologue: projection:input)


def base(proj: str) -> str:
    """The projection a stream launches ("qkv:x" -> "qkv")."""
    return proj.split(":")[0]


def geometry(dry: bool) -> dict:
    """hidden, q+kv heads' width, intermediate, layers, sweep values."""
    if dry:
        return {"hidden": 64, "q": 64, "kv": 32, "inter": 128, "layers": 2,
                "sweep": {"rows": (16, 32), "warps": (4,), "pdl": ("early",), "layer_pdl": ("first", "early")}}
    return {"hidden": 1024, "q": 2048, "kv": 1024, "inter": 3072, "layers": 28,
            "sweep": {"rows": (16, 32, 64), "warps": (2, 4, 8), "pdl": ("early", "off"),
                      "layer_pdl": ("first", "early", "late", "off")}}


def shapes(geo: dict) -> dict:
    """Each projection's weight [N', K] as nn.Linear stores it (gate_up: gate rows then up rows)."""
    h, q, kv, inter = geo["hidden"], geo["q"], geo["kv"], geo["inter"]
    return {"qkv": (q + 2 * kv, h), "o_proj": (h, q), "gate_up": (2 * inter, h), "down": (h, inter)}


def make_layers(torch, geo: dict, dtype, device: str) -> dict:
    """Weights of every layer (distinct), the inputs each projection's launch reads, and the norm weights."""
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)

    h, q, inter = geo["hidden"], geo["q"], geo["inter"]
    weights = {p: [rnd(n, k, scale=k ** -0.5) for _ in range(geo["layers"])] for p, (n, k) in shapes(geo).items()}
    return {
        "w": weights,
        "norm": [1 + 0.1 * rnd(h) for _ in range(geo["layers"])],
        # what the launches read: the previous down_proj's and o_proj's partials (float32), the residual, the
        # attention output and SiLU(gate) * up (the model dtype)
        "residual": rnd(1, h),
        "attn": rnd(1, q),
        "act": rnd(1, inter),
        "x": rnd(1, h),  # (--prologue's one-row input)
    }


def split_of(proj: str, geo: dict, sms: int, rows: int) -> int | None:
    """The K splits the engine gives o_proj and down_proj (their partials feed the next kernel); None: whole sums."""
    from engine.kernels.decode_layer import split_for

    n, k = shapes(geo)[base(proj)]
    return split_for(n, k, sms, block_n=rows) if proj in ("o_proj", "down") else None


def launch(torch, proj: str, layer: int, data: dict, ins: dict, split: int | None):
    """One GEMV launch as engine/fused_decode.py makes it for `proj`."""
    from engine.kernels.decode_layer import gemv

    w = data["w"][base(proj)][layer]
    if ":" in proj:
        norm = data["norm"][layer] if proj.endswith(":xn") else None
        return gemv(w, x=data["x"], norm_weight=norm, eps=1e-6, silu=base(proj) == "gate_up", proj=base(proj))
    if proj == "qkv":
        return gemv(w, partials=ins["down_partials"], residual=data["residual"], norm_weight=data["norm"][layer],
                    eps=1e-6, proj=proj)
    if proj == "gate_up":
        return gemv(w, partials=ins["o_partials"], residual=data["residual"], norm_weight=data["norm"][layer],
                    eps=1e-6, silu=True, proj=proj)
    return gemv(w, x=data["attn"] if proj == "o_proj" else data["act"], split=split, proj=proj)


def inputs(torch, geo: dict, sms: int, rows: int, device: str) -> dict:
    """The partials the norm-GEMVs read, shaped as the engine's o_proj / down_proj leave them."""
    g = torch.Generator().manual_seed(1)
    h = geo["hidden"]
    s_down, s_o = split_of("down", geo, sms, rows), split_of("o_proj", geo, sms, rows)
    return {"down_partials": (torch.randn(s_down, 1, h, generator=g) * 0.5).to(device),
            "o_partials": (torch.randn(s_o, 1, h, generator=g) * 0.5).to(device)}


def reference(torch, proj: str, data: dict, ins: dict):
    """Layer 0's output of `proj` in float32: partials summed, + residual, RMSNorm (x the norm weight), x @ W^T;
    gate_up ends in SiLU(gate) * up; o_proj and down give the whole sum (what their partials add up to)."""
    w = data["w"][base(proj)][0].float()
    if base(proj) in ("qkv", "gate_up"):
        if ":" in proj:
            x = data["x"].float()
        else:
            p = ins["down_partials" if proj == "qkv" else "o_partials"].float().sum(0)
            x = p + data["residual"].float()
        if not proj.endswith(":x"):
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * data["norm"][0].float()
        y = x @ w.T
        if base(proj) == "gate_up":
            g, u = y.chunk(2, -1)
            y = torch.nn.functional.silu(g) * u
        return y
    x = data["attn" if proj == "o_proj" else "act"].float()
    return x @ w.T


def check(torch, proj: str, out, data: dict, ins: dict, tol: float) -> tuple[bool, float]:
    y = out[0] if isinstance(out, tuple) else out
    if y.dim() == 3:            # split-K partials: their sum is the product
        y = y.sum(0)
    ref = reference(torch, proj, data, ins)
    err = ((y.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    return err <= tol, err


class Knobs:
    """Sets decode_layer's launch knobs (rows a program, one-row warps, PDL) for a block, then puts them back."""

    def __init__(self, rows: int, warps: int, pdl: str):
        self.want = {"_BLOCK_N": rows, "_WARPS_ONE_ROW": warps, "PDL_MODE": pdl}

    def __enter__(self):
        from engine.kernels import decode_layer as dl

        self.old = {k: getattr(dl, k) for k in self.want}
        for k, v in self.want.items():
            setattr(dl, k, v)

    def __exit__(self, *exc):
        from engine.kernels import decode_layer as dl

        for k, v in self.old.items():
            setattr(dl, k, v)


def weight_bytes(data: dict, projs) -> int:
    return sum(w.numel() * w.element_size() for p in projs for w in data["w"][base(p)])


def run_variant(torch, timed, geo: dict, data: dict, sms: int, device: str, projs: tuple, rows: int, warps: int,
                pdl: str, tol: float) -> dict:
    """Every layer's launches of `projs` (in that order, layer by layer) as one timed graph; layer 0 checked."""
    with Knobs(rows, warps, pdl):
        ins = inputs(torch, geo, sms, rows, device)
        splits = {p: split_of(p, geo, sms, rows) for p in projs}
        results = {p: check(torch, p, launch(torch, p, 0, data, ins, splits[p]), data, ins, tol) for p in projs}

        def step():
            for layer in range(geo["layers"]):
                for p in projs:
                    launch(torch, p, layer, data, ins, splits[p])

        ms = timed(step)
    n = geo["layers"] * len(projs)
    return {"projections": list(projs), "rows": rows, "warps": warps, "pdl": pdl, "splits": splits,
            "launches": n, "us_per_launch": ms * 1e3 / n, "us_per_layer": ms * 1e3 / geo["layers"],
            "TBps": weight_bytes(data, projs) / (ms * 1e-3) / 1e12,
            "ok": all(ok for ok, _ in results.values()),
            "rel_err": {p: err for p, (_, err) in results.items()}}


def copy_TBps(torch, timed, device: str, nbytes: int) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3) / 1e12


def timer(torch, cuda: bool):
    """Milliseconds of one call: graph-replayed on a GPU (the launches captured once); host-timed on the CPU."""
    if cuda:
        from engine.kernels.timing import graph_ms

        return lambda fn: graph_ms(fn, calls=1, replays=7)

    def host(fn) -> float:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return host


def sweep_points(geo: dict, default: tuple) -> list[tuple[int, int, str]]:
    """The sweep's (rows, warps, PDL) points, the default left out (it is timed as the streams)."""
    s = geo["sweep"]
    return [(r, w, p) for r in s["rows"] for w in s["warps"] for p in s["pdl"] if (r, w, p) != default]


def layer_pdl_modes(geo: dict, default_pdl: str) -> list[str]:
    """The PDL modes the layer's chain is also timed under, the default's left out (timed as "layer")."""
    return [p for p in geo["sweep"]["layer_pdl"] if p != default_pdl]


def measure(torch, device: str, dry: bool, sweep: bool, prologue: bool = False) -> dict:
    from engine.device import num_sms
    from engine.kernels import decode_layer as dl

    geo = geometry(dry)
    dtype = torch.float32 if dry else torch.bfloat16
    tol = 1e-4 if dry else 1e-2
    cuda = device == "cuda"
    timed = timer(torch, cuda)
    sms = num_sms(torch.device(device), 132)
    data = make_layers(torch, geo, dtype, device)
    default = (dl._BLOCK_N, dl._WARPS_ONE_ROW, dl.PDL_MODE if cuda else "off")
    out = {"device": torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)", "dtype": str(dtype),
           "layers": geo["layers"], "sms": sms, "default": {"rows": default[0], "warps": default[1],
                                                            "pdl": default[2]},
           "weight_MB": {p: weight_bytes(data, [p]) / geo["layers"] / 1e6 for p in PROJECTIONS},
           "copy_TBps": copy_TBps(torch, timed, device, (256 << 20) if cuda else (1 << 20)),
           "streams": [], "layer": None, "sweep": []}
    for p in PROJECTIONS + (PROLOGUE_STREAMS if prologue else ()):
        out["streams"].append(run_variant(torch, timed, geo, data, sms, device, (p,), *default, tol))
    out["layer"] = run_variant(torch, timed, geo, data, sms, device, PROJECTIONS, *default, tol)
    out["layer"]["sum_of_streams_us"] = sum(s["us_per_launch"] for s in out["streams"][:len(PROJECTIONS)])
    out["layer"]["engine_layer_us"] = ENGINE_LAYER_US
    if sweep:
        for rows, warps, pdl in sweep_points(geo, default):
            for p in PROJECTIONS:
                try:
                    out["sweep"].append(run_variant(torch, timed, geo, data, sms, device, (p,), rows, warps, pdl,
                                                    tol))
                except Exception as e:  # noqa: BLE001 - a launch that does not compile is a result
                    out["sweep"].append({"projections": [p], "rows": rows, "warps": warps, "pdl": pdl, "ok": False,
                                         "error": f"{type(e).__name__}: {str(e)[:120]}"})
        for pdl in layer_pdl_modes(geo, default[2]):
            out["sweep"].append(run_variant(torch, timed, geo, data, sms, device, PROJECTIONS, default[0],
                                            default[1], pdl, tol))
    runs = out["streams"] + [out["layer"]] + out["sweep"]
    out["ok"] = all(r["ok"] for r in runs if "error" not in r)
    return out


def markdown(log: dict) -> str:
    d = log["default"]
    lines = [f"# fused decode GEMVs at one row: {log['device']} ({log['dtype']}), commit {log.get('commit')}", "",
             f"{log['layers']} layers of distinct weights; defaults {d['rows']} rows a program, {d['warps']} warps, "
             f"PDL {d['pdl']}; a device copy reaches {log['copy_TBps']:.2f} TB/s.", "",
             "| launches | rows | warps | PDL | splits | us a launch | TB/s | of copy | rel err | ok |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in log["streams"] + [log["layer"]] + log["sweep"]:
        name = " + ".join(r["projections"])
        if "error" in r:
            lines.append(f"| {name} | {r['rows']} | {r['warps']} | {r['pdl']} | | | | | {r['error']} | no |")
            continue
        splits = ", ".join(f"{p} {s}" for p, s in r["splits"].items() if s) or "-"
        err = max(r["rel_err"].values())
        lines.append(f"| {name} | {r['rows']} | {r['warps']} | {r['pdl']} | {splits} | {r['us_per_launch']:.2f} | "
                     f"{r['TBps']:.2f} | {r['TBps'] / log['copy_TBps']:.0%} | {err:.1e} | "
                     f"{'yes' if r['ok'] else 'NO'} |")
    lay = log["layer"]
    lines += ["", f"A layer's four GEMVs chained: {lay['us_per_layer']:.2f} us against {lay['sum_of_streams_us']:.2f} "
              f"us for the four streams' launches summed, and {lay['engine_layer_us']} us for the engine's layer "
              "with attention."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="result JSON (a Markdown table is written beside it)")
    ap.add_argument("--sweep", action="store_true", help="also rows a program x warps x PDL for each stream")
    ap.add_argument("--prologue", action="store_true",
                    help="also q/k/v and gate/up from one bf16 row, with and without RMSNorm (PROLOGUE_STREAMS)")
    ap.add_argument("--dry-run", action="store_true", help="tiny float32 shapes on the CPU (Triton's interpreter)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.dry_run:  # before `engine` is imported: importing it imports triton, which reads this once
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from engine.kernels.interpreter import script_device

    device = script_device(args.dry_run)
    if device is None:
        print("gemv_bench: no CUDA device (use --dry-run to exercise the script on the CPU)", file=sys.stderr)
        return 2
    import torch

    from labkit.output import write_result

    log = measure(torch, device, args.dry_run, args.sweep, args.prologue)
    write_result(out, log, markdown(log))
    return 0 if log["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
