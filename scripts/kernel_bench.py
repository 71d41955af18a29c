"""Attention kernels alone, on one GPU: checks, bandwidth, a knob sweep for decode, prefill against SDPA.

    PYTHONPATH=. python3 scripts/kernel_bench.py --out $OUT/kernel_bench.json     # device, ~1-2 minutes
    python scripts/kernel_bench.py --dry-run --out /tmp/kernel_bench.json         # CPU: Triton's interpreter

Decode (engine/kernels/decode_attention.py), Qwen3-0.6B geometry (16 q heads, 8 KV heads, head_dim 128, bf16,
block 256, one layer's pool, blocks placed at random in it), at 256 x 800, 256 x 2048 and "256 nano-mix" (the
contexts of a full nano decode batch: prompt plus part of the output, mean 809, max 1,835):
  (a) every launch against the torch reference backend, max abs error (the default's decides the exit code);
  (b) a sweep of launch knobs, each timed as 20 calls in one CUDA graph (as the engine runs it); effective TB/s =
      K+V bytes of the contexts / time. The default launches the rows in the engine's order (LABKIT_DECODE_ORDER,
      engine/decode_order.py: longest-first unless set); order=launch / order=longest-first name one (unequal
      contexts only differ). Ceilings on the same bytes: a device copy (bytes read +
      written / time, PERF-NOTES' definition) and a read-only reduction. The same kernel on the old token-major
      pool is the "before"; the default is timed first and last, so the spread between the two is the noise;
  (c) prefill (engine/kernels/prefill_attention.py, reading keys through the pool as the engine does) on the nano
      workload's prefill batches (its 256 prompts, grouped as the scheduler does under a 16,384-token budget),
      against torch's SDPA (cuDNN and flash backends, right-padded dense batches, exact for the valid rows) and
      torch's varlen flash attention when this torch has it: max abs error against each, time, useful TFLOP/s;
  (d) one JSON at --out and the same tables as Markdown beside it (.md), printed last.
Exit 0: every check within tolerance; 1: a check failed; 2: could not run.

--kv-cache-dtype fp8 times decode over an FP8 pool (e4m3 K/V at scale 1.0, as the engine stores them; the
reference reads the same e4m3 values), with wider tiles in the sweep (an e4m3 tile is half a bf16 tile's bytes)
and V keys-contiguous (LABKIT_FP8_V_TRANSPOSED's layout); prefill is left out there. --fp8-layouts times only
that layout, at the default launch and around it, between the default's two timings.

--dry-run runs the same code at tiny shapes in float32 on the CPU (Triton's interpreter): timings there mean
nothing; it exists so the script itself is tested without a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DECODE_TOL = 2e-2      # bf16 output of an average over hundreds of keys: rounding is ~1e-3
PREFILL_TOL = 3e-2
FP8_DOT_TOL = 1e-1     # q (and p) rounded to e4m3 as well: against the reference's float16 dot products
BLOCK_SIZE_GPU = 256
GRAPH_CALLS = 20       # calls captured in one graph; a replay's time / GRAPH_CALLS is one call
REPLAYS = 9


def geometry(dry: bool) -> dict:
    if dry:
        return {"heads": 4, "kv_heads": 2, "head_dim": 32, "block_size": 64,
                "shapes": {"2x40": [40] * 2, "2x100": [100] * 2, "3 mixed": [5, 70, 33]},
                "prefill_prompts": [23, 9, 17], "prefill_budget": 40}
    return {"heads": 16, "kv_heads": 8, "head_dim": 128, "block_size": BLOCK_SIZE_GPU,
            "shapes": {"256x800": [800] * 256, "256x2048": [2048] * 256, "256 nano-mix": nano_decode_lengths()},
            "prefill_prompts": None, "prefill_budget": 16384}


def nano_decode_lengths() -> list[int]:
    """256 contexts as a full nano decode batch has them: each prompt plus part of its output (mean 809)."""
    import random

    from labkit.bench.workloads import draw, load_workload

    d = draw(load_workload("nano"))
    rng = random.Random(14)
    return [len(p) + rng.randint(1, m) for p, m in zip(d.prompts, d.max_tokens)]


VT = "v-keys-contiguous"  # the layout LABKIT_FP8_V_TRANSPOSED=1 gives an FP8 pool's V (engine/kv_layout.py)


def decode_configs(dry: bool, sweep: bool = True, fp8: bool = False, fp8_dot: bool = False,
                   fp8_layouts: bool = False, only: list[dict] | None = None) -> list[dict]:
    """The default first; then the sweep. Each config: knobs for paged_decode plus splits / layout. fp8_dot: only
    the FP8 tensor-core variants (fp8_dot swap and kq at a few launch shapes, qk, qkpv), between the default's
    two timings. fp8_layouts: only V keys-contiguous, at the default launch and around it."""
    default = {"name": "default"}
    if not sweep:
        return [default]
    if only is not None:
        return [default, *only, {"name": "default (again)"}]
    if fp8_layouts:
        # (compiled for sm_90, session 18: 112 registers a thread, 4 programs an SM, against the default's 200
        # and 2; scripts/kernel_sass.py)
        around = [{}, {"order": "launch"}, {"num_stages": 3}, {"num_warps": 8}, {"block_n": 64},
                  {"splits": 2}, {"fp8_dot": "qkpv"}, {"fp8_dot": "swap"}]
        if dry:  # (32-row tiles: whole pages of the dry run's 64-token blocks, read unmasked; {}: masked)
            around = [{"block_n": 32}, {"block_n": 32, "order": "launch"}, {"fp8_dot": "qkpv", "block_n": 32},
                      {}]
        return [default, *[{"layout": VT, **a} for a in around], {"name": "default (again)"}]
    if fp8_dot:
        # (session 14 measured qk and qkpv at these shapes: neither beat the default; kq and swap take the MMAs
        # with the keys, then also the head dimension, as rows: 126 and 100 loop instructions a KB against the
        # default's 130, scripts/kernel_sass.py)
        shapes = [{"block_n": 32}] if dry else [{}, {"num_warps": 8}, {"block_n": 256, "num_warps": 8}]
        dots = [{"fp8_dot": d, **sh} for d in ("swap", "kq") for sh in shapes]
        return [default, *dots, {"fp8_dot": "qk"}, {"fp8_dot": "qkpv"}, {"name": "default (again)"}]
    if dry:
        return [default, {"block_n": 32, "splits": 2}, {"tma": True, "block_n": 32}, {"layout": "token-major"},
                {"order": "launch"}, {"name": "default (again)"}]
    # 128-row tiles at 4 stages want 256 KiB of shared memory (Hopper has 227): left out. An e4m3 tile is half
    # the bytes, so FP8 goes to 256-row tiles (the pool's whole block) and deeper pipelines.
    from engine.kernels.decode_attention import DEFAULTS, FP8_KNOBS

    base = FP8_KNOBS if fp8 else DEFAULTS
    limit, sizes = (768, (64, 128, 256)) if fp8 else (384, (32, 64, 128))
    grid = [{"block_n": n, "num_warps": w, "num_stages": s}
            for n in sizes for w in (4, 8) for s in (2, 3, 4) if n * s <= limit]
    grid = [g for g in grid if any(base.get(k) != v for k, v in g.items())]  # the default is timed anyway
    tma = [{"tma": True, "block_n": n, "num_stages": s} for n, s in ((64, 3), (64, 4), (128, 2))]
    return [default, *grid, *tma, {"splits": 2}, {"splits": 3}, {"page_tiles": False},
            {"layout": "token-major"}, {"order": "launch"}, {"order": "launch", "splits": 2},
            *([{"layout": VT}, {"layout": VT, "order": "launch"}] if fp8 else []), {"name": "default (again)"}]


def config_name(cfg: dict) -> str:
    if "name" in cfg:
        return cfg["name"]
    return " ".join(f"{k}={v}" for k, v in cfg.items())


# ------------------------------------------------------------------------------------------------------
# timing


class Timer:
    """Per-call device time (engine/kernels/timing.py). GPU: `graph` replays GRAPH_CALLS calls captured in one
    CUDA graph (median of REPLAYS replays), `eager` times plain calls. CPU (dry run): one call on the host clock,
    meaningless, but the same path runs."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def graph(self, fn) -> float:
        if not self.cuda:
            return self._host(fn)
        from engine.kernels.timing import graph_ms

        return graph_ms(fn, GRAPH_CALLS, REPLAYS)

    def eager(self, fn) -> float:
        if not self.cuda:
            return self._host(fn)
        from engine.kernels.timing import events_ms

        return events_ms(fn, reps=7, warmup=1)

    @staticmethod
    def _host(fn) -> float:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3


# ------------------------------------------------------------------------------------------------------
# decode


def decode_inputs(torch, geo: dict, lengths: list[int], dtype, device, seed: int = 0, fp8: bool = False):
    """One layer's pool holding len(lengths) sequences, their blocks at random places, and one query each (an
    e4m3 pool with fp8: the values quantised at scale 1.0, as the KV-write kernel stores them)."""
    from engine.context import DecodeMeta

    bs, kvh, hd = geo["block_size"], geo["kv_heads"], geo["head_dim"]
    per_seq = [-(-n // bs) for n in lengths]
    nblk, width = sum(per_seq), max(per_seq)
    gen = torch.Generator(device=device).manual_seed(seed)
    k = torch.randn(nblk, kvh, bs, hd, generator=gen, device=device).to(dtype)
    v = torch.randn(nblk, kvh, bs, hd, generator=gen, device=device).to(dtype)
    if fp8:
        from engine.kv_quant import quantize

        k, v = quantize(k, 1.0), quantize(v, 1.0)
    q = torch.randn(len(lengths), geo["heads"], hd, generator=gen, device=device).to(dtype)
    perm = torch.randperm(nblk, generator=gen, device=device).to(torch.int32).tolist()
    rows, at = [], 0
    for m in per_seq:
        rows.append(perm[at:at + m] + [-1] * (width - m))
        at += m
    tables = torch.tensor(rows, dtype=torch.int32, device=device)
    lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    context = DecodeMeta(len(lengths), lens, tables, list(lengths))
    return {"q": q, "k": k, "v": v, "tables": tables, "lens": lens, "ctx": context,
            "kv_bytes": 2 * sum(lengths) * kvh * hd * k.element_size()}


def run_decode(torch, cfg: dict, inp: dict, splits: int, scale: float, old_layout: dict):
    """A closure running one decode call with cfg's knobs."""
    from engine.kernels.decode_attention import paged_decode

    knobs = {k: v for k, v in cfg.items()
             if k in ("block_n", "num_warps", "num_stages", "page_tiles", "tma", "fp8_dot")}
    n_splits = cfg.get("splits", splits)
    if cfg.get("layout") == VT:
        if "v_t" not in old_layout:  # the same values, each block's head stored [head_dim, block_size]
            old_layout["v_t"] = inp["v"].transpose(-1, -2).contiguous().transpose(-1, -2)
        k, v = inp["k"], old_layout["v_t"]
    elif cfg.get("layout") == "token-major":
        if "k" not in old_layout:  # the same values, stored [blocks, block_size, kv_heads, head_dim]
            from engine.kv_layout import token_major

            old_layout["k"] = token_major(token_major(inp["k"]).contiguous())
            old_layout["v"] = token_major(token_major(inp["v"]).contiguous())
        k, v = old_layout["k"], old_layout["v"]
    else:
        k, v = inp["k"], inp["v"]
    out = torch.empty_like(inp["q"])
    from engine.decode_order import DECODE_ORDER

    if cfg.get("order", DECODE_ORDER) == "longest-first":  # (the engine's order unless the config names one)
        from engine.kernels.decode_attention import longest_first

        knobs["order"] = longest_first(inp["lens"])

    def call():
        return paged_decode(inp["q"], k, v, inp["tables"], inp["lens"], scale, n_splits, out=out, **knobs)

    return call, n_splits


def ceilings(torch, timer: Timer, nbytes: int, dtype, device) -> dict:
    """A copy of the same bytes (read + written / time, PERF-NOTES' copy bandwidth) and a read-only sum."""
    n = nbytes // torch.tensor([], dtype=dtype).element_size()
    src = torch.randn(n, device=device).to(dtype)
    dst = torch.empty_like(src)
    sink = torch.empty((), dtype=torch.float32, device=device)
    copy_ms = timer.graph(lambda: dst.copy_(src))
    read_ms = timer.graph(lambda: torch.sum(src, dim=0, dtype=torch.float32, out=sink))
    src = dst = None  # (free the buffers; the closures above hold them through these names)
    return {"copy_ms": copy_ms, "copy_TBps": 2 * nbytes / copy_ms / 1e9,
            "read_ms": read_ms, "read_TBps": nbytes / read_ms / 1e9}


def bench_decode(torch, timer: Timer, geo: dict, dtype, device, sms: int, dry: bool, sweep: bool,
                 fp8: bool = False, fp8_dot: bool = False, fp8_layouts: bool = False,
                 only: list[dict] | None = None) -> dict:
    from engine.backends import torch_ref
    from engine.decode_order import DECODE_ORDER
    from engine.kernels.decode_attention import DEFAULTS, num_splits_for

    scale = geo["head_dim"] ** -0.5
    out = {"defaults": dict(DEFAULTS), "order": DECODE_ORDER, "kv_cache_dtype": "fp8" if fp8 else "auto", "shapes": {}}
    for key, lengths in geo["shapes"].items():
        inp = decode_inputs(torch, geo, lengths, dtype, device, fp8=fp8)
        ref = torch_ref.decode(inp["q"], inp["k"], inp["v"], inp["ctx"], scale).float()
        splits = num_splits_for(len(lengths), geo["kv_heads"], max(lengths), sms)
        shape = {"batch": len(lengths), "mean_context": sum(lengths) / len(lengths), "max_context": max(lengths),
                 "kv_bytes": inp["kv_bytes"], "heuristic_splits": splits,
                 "ceilings": ceilings(torch, timer, inp["kv_bytes"], dtype, device), "configs": []}
        old_layout: dict = {}
        for cfg in decode_configs(dry, sweep, fp8, fp8_dot, fp8_layouts, only):
            row = {"config": config_name(cfg)}
            try:
                call, row["splits"] = run_decode(torch, cfg, inp, splits, scale, old_layout)
                row["max_abs_err"] = (call().float() - ref).abs().max().item()
                row["ms"] = timer.graph(call)
                row["TBps"] = inp["kv_bytes"] / row["ms"] / 1e9
                row["of_copy"] = row["TBps"] / shape["ceilings"]["copy_TBps"]
                row["ok"] = bool(row["max_abs_err"] <= (FP8_DOT_TOL if "fp8_dot" in cfg else DECODE_TOL))
            except Exception as exc:  # a configuration that does not compile (shared memory) is a result too
                row["error"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            shape["configs"].append(row)
            _progress(f"decode {key} {row['config']}: " + (f"{row['TBps']:.2f} TB/s, err {row['max_abs_err']:.2e}"
                                                          if "TBps" in row else row["error"]))
        if len(set(lengths)) == 1 and not fp8:  # dense SDPA needs equal lengths (and takes no e4m3)
            shape["sdpa_contiguous"] = sdpa_decode(torch, timer, inp, scale, ref, dry)
        out["shapes"][key] = shape
        del inp, ref, old_layout
        if device == "cuda":
            torch.cuda.empty_cache()
    out["recommendation"] = recommend(out)
    return out


def sdpa_decode(torch, timer: Timer, inp: dict, scale: float, ref, dry: bool) -> dict:
    """torch's SDPA (cuDNN, flash) on a contiguous, unpaged copy of the same K/V: what a library reaches on
    these bytes (PERF-NOTES measured cuDNN at 3.59 / 4.23 TB/s on these shapes)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from engine.kv_layout import token_major

    ctx = inp["ctx"].context_lens_host[0]
    tables = inp["tables"].long()

    def dense(cache):  # [batch, kv_heads, ctx, head_dim]
        rows = token_major(cache)[tables].flatten(1, 2)[:, :ctx]  # [batch, ctx, kv_heads, head_dim]
        return rows.transpose(1, 2).contiguous()

    k, v = dense(inp["k"]), dense(inp["v"])
    q = inp["q"].unsqueeze(2)  # [batch, heads, 1, head_dim]
    res = {}
    for backend in ((SDPBackend.MATH,) if dry else (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION)):
        def call(backend=backend):
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
        try:
            err = (call().squeeze(2).float() - ref).abs().max().item()
            try:
                ms, how = timer.graph(call), "graph"
            except RuntimeError:  # a backend that cannot be captured: eager, launch included
                ms, how = timer.eager(call), "eager"
            res[backend.name.lower()] = {"ms": ms, "TBps": inp["kv_bytes"] / ms / 1e9, "max_abs_err": err,
                                         "timed": how}
        except Exception as exc:  # not every backend takes GQA or these shapes
            res[backend.name.lower()] = {"error": " ".join(f"{type(exc).__name__}: {exc}".split())[:200]}
    k = v = None  # (free them; the closures above hold them through these names)
    return res


def recommend(res: dict) -> dict:
    """The config with the best mean TB/s over the shapes among those within tolerance everywhere. It should
    replace the defaults only if it beats them by more than the default's own spread (timed first and last)."""
    shapes = list(res["shapes"].values())
    names = [r["config"] for r in shapes[0]["configs"]]
    table = {}
    for name in names:
        rows = [next(r for r in s["configs"] if r["config"] == name) for s in shapes]
        if all(r.get("ok") for r in rows) and not name.startswith("layout="):
            table[name] = statistics.mean(r["TBps"] for r in rows)
    if not table:
        return {"verdict": "no config passed its check"}
    best = max(table, key=table.get)
    base = [table[n] for n in ("default", "default (again)") if n in table]
    spread = max(base) - min(base) if base else 0.0
    gain = table[best] - max(base) if base else 0.0
    change = best not in ("default", "default (again)") and gain > spread
    return {"best": best, "best_mean_TBps": table[best], "default_mean_TBps": max(base) if base else None,
            "default_spread_TBps": spread, "change_defaults": change,
            "verdict": (f"set DEFAULTS (or the split heuristic) to {best}: +{gain:.2f} TB/s, above the "
                        f"default's spread {spread:.2f}") if change else
                       f"keep the defaults (best {best} is within {spread:.2f} TB/s of them)"}


# ------------------------------------------------------------------------------------------------------
# prefill


def nano_prefill_batches(geo: dict) -> list[list[int]]:
    """The nano workload's prompt lengths, grouped as the scheduler groups whole prompts under the budget."""
    lengths = geo["prefill_prompts"]
    if lengths is None:
        from labkit.bench.workloads import draw, load_workload

        lengths = [len(p) for p in draw(load_workload("nano")).prompts]
    batches, cur = [], []
    for n in lengths:
        if cur and sum(cur) + n > geo["prefill_budget"]:
            batches.append(cur)
            cur = []
        cur.append(n)
    return batches + [cur]


def prefill_inputs(torch, geo: dict, lengths: list[int], dtype, device, seed: int):
    """One prefill batch written into a pool through its block tables, as the engine's step does."""
    from engine.kernels.kv_write import store_kvcache

    bs, h, kvh, hd = geo["block_size"], geo["heads"], geo["kv_heads"], geo["head_dim"]
    gen = torch.Generator(device=device).manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(total, h, hd, generator=gen, device=device).to(dtype)
    k = torch.randn(total, kvh, hd, generator=gen, device=device).to(dtype)
    v = torch.randn(total, kvh, hd, generator=gen, device=device).to(dtype)
    per_seq = [-(-n // bs) for n in lengths]
    nblk = sum(per_seq)
    k_cache = torch.empty(nblk, kvh, bs, hd, dtype=dtype, device=device)
    v_cache = torch.empty_like(k_cache)
    perm = torch.randperm(nblk, generator=gen, device=device).to(torch.int32)
    width = max(per_seq)
    tables = torch.full((len(lengths), width), -1, dtype=torch.int32, device=device)
    slots, at = [], 0
    for i, (n, m) in enumerate(zip(lengths, per_seq)):
        tables[i, :m] = perm[at:at + m]
        at += m
        pos = torch.arange(n, device=device)
        slots.append(tables[i, pos // bs].long() * bs + pos % bs)
    store_kvcache(k, v, k_cache, v_cache, torch.cat(slots).to(torch.int32))
    cu = torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)
    return {"q": q, "k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "tables": tables, "cu": cu,
            "lengths": lengths}


def _dense(torch, x, lengths, group: int):
    """[tokens, heads, d] -> right-padded [seqs, heads * group, max_len, d] (heads repeated for GQA)."""
    rows = torch.nn.utils.rnn.pad_sequence(list(torch.split(x, lengths)), batch_first=True)
    if group > 1:
        rows = rows.repeat_interleave(group, dim=2)
    return rows.transpose(1, 2).contiguous()


def _undense(torch, out, lengths):
    return torch.cat([out[i, :, :n].transpose(0, 1) for i, n in enumerate(lengths)])


def _varlen_attn(torch):
    """torch's varlen flash attention, if this torch has it: (function(q, k, v, cu, max_len, scale), whether k and
    v must have as many heads as q)."""
    import inspect

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, False
    params = inspect.signature(varlen_attn).parameters
    causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    gqa = {"enable_gqa": True} if "enable_gqa" in params else {}

    def call(q, k, v, cu, max_len, scale):
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale, **causal, **gqa)
    return call, not gqa


def bench_prefill(torch, timer: Timer, geo: dict, dtype, device, dry: bool) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from engine.backends import torch_ref
    from engine.context import PrefillMeta
    from engine.kernels.prefill_attention import varlen_prefill

    scale = geo["head_dim"] ** -0.5
    group = geo["heads"] // geo["kv_heads"]
    batches = nano_prefill_batches(geo)
    inputs = [prefill_inputs(torch, geo, lengths, dtype, device, seed=i) for i, lengths in enumerate(batches)]
    flops = sum(4 * geo["heads"] * geo["head_dim"] * n * (n + 1) / 2 for b in batches for n in b)
    res = {"batches": len(batches), "prompts": sum(len(b) for b in batches), "tokens": sum(map(sum, batches)),
           "useful_flop": flops, "methods": {}}

    # Each method: batch index -> output rows [tokens, heads, head_dim] for that batch.
    def ours(i):
        inp = inputs[i]
        return varlen_prefill(inp["q"], inp["k"], inp["v"], inp["k_cache"], inp["v_cache"], inp["tables"],
                              inp["cu"], inp["cu"], max(inp["lengths"]), scale)

    methods = {"triton (ours, paged)": (ours, None)}
    dense = [(_dense(torch, i["q"], i["lengths"], 1), _dense(torch, i["k"], i["lengths"], group),
              _dense(torch, i["v"], i["lengths"], group)) for i in inputs]
    for backend in ((SDPBackend.MATH,) if dry else (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION)):
        def sdpa(i, backend=backend):
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(*dense[i], is_causal=True, scale=scale)
        methods[f"sdpa {backend.name.lower()} (padded)"] = (sdpa, lambda i, out: _undense(torch, out,
                                                                                         inputs[i]["lengths"]))
    varlen, expand = (None, False) if dry else _varlen_attn(torch)
    if varlen is not None:
        reps = group if expand else 1
        kv = [(i["k"].repeat_interleave(reps, 1), i["v"].repeat_interleave(reps, 1)) for i in inputs]

        def var(i):
            return varlen(inputs[i]["q"], *kv[i], inputs[i]["cu"], max(inputs[i]["lengths"]), scale)
        methods["torch varlen_attn (flash)"] = (var, None)

    ours_out = [ours(i) for i in range(len(inputs))]
    for name, (call, unpack) in methods.items():
        row = {}
        try:
            if call is not ours:
                outs = [call(i) if unpack is None else unpack(i, call(i)) for i in range(len(inputs))]
                row["max_abs_err_vs_ours"] = max((o.float() - r.float()).abs().max().item()
                                                 for o, r in zip(outs, ours_out))
                row["ok"] = bool(row["max_abs_err_vs_ours"] <= PREFILL_TOL)
                del outs
            row["ms"] = timer.eager(lambda call=call: [call(i) for i in range(len(inputs))])
            row["TFLOPs"] = flops / row["ms"] / 1e9
        except Exception as exc:  # a backend this torch or GPU lacks is a result too
            row["error"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        res["methods"][name] = row
        _progress(f"prefill {name}: " + (f"{row['ms']:.3f} ms" if "ms" in row else row["error"]))

    # The check that decides the exit code: ours against the torch reference backend on the first batch.
    inp = inputs[0]
    cu_host = inp["cu"].tolist()
    ctx = PrefillMeta(inp["cu"], inp["cu"], max(inp["lengths"]), max(inp["lengths"]), inp["tables"], cu_host, cu_host)
    ref = torch_ref.prefill(inp["q"], inp["k"], inp["v"], inp["k_cache"], inp["v_cache"], ctx, scale)
    res["max_abs_err_vs_torch_ref_first_batch"] = (ours_out[0].float() - ref.float()).abs().max().item()
    res["ok"] = bool(res["max_abs_err_vs_torch_ref_first_batch"] <= PREFILL_TOL)
    return res


# ------------------------------------------------------------------------------------------------------
# report


def markdown(log: dict) -> str:
    lines = [f"# kernel_bench ({log['device']}, commit {log.get('commit') or 'unknown'})", ""]
    if log.get("dry_run"):
        lines += ["DRY RUN on the CPU (Triton interpreter, float32, tiny shapes): the timings mean nothing.", ""]
    dec = log.get("decode")
    if dec:
        lines += [f"Decode defaults: {dec['defaults']}; TB/s = K+V bytes / time per call "
                  f"({GRAPH_CALLS} calls in one CUDA graph, median of {REPLAYS} replays)", ""]
        for key, s in dec["shapes"].items():
            c = s["ceilings"]
            sdpa_txt = "; ".join(f"{name} {r['TBps']:.2f} TB/s" if "TBps" in r else f"{name} {r['error'][:60]}"
                                 for name, r in s.get("sdpa_contiguous", {}).items()) or "not run (unequal lengths)"
            lines += [f"## decode {key} ({s['kv_bytes'] / 1e6:.0f} MB of K/V, mean context {s['mean_context']:.0f}, "
                      f"heuristic splits {s['heuristic_splits']})", "",
                      f"ceilings: copy {c['copy_TBps']:.2f} TB/s (read+write), read-only sum {c['read_TBps']:.2f} "
                      f"TB/s; SDPA on contiguous K/V: {sdpa_txt}", "",
                      "| config | splits | ms | TB/s | of copy | max abs err |",
                      "| --- | --- | --- | --- | --- | --- |"]
            for r in s["configs"]:
                if "error" in r:
                    lines.append(f"| {r['config']} | | | | | {r['error'][:80]} |")
                else:
                    flag = "" if r["ok"] else " FAIL"
                    lines.append(f"| {r['config']} | {r['splits']} | {r['ms']:.4f} | {r['TBps']:.2f} | "
                                 f"{r['of_copy']:.0%} | {r['max_abs_err']:.2e}{flag} |")
            lines.append("")
        lines += [f"Recommendation: {dec['recommendation']['verdict']}", ""]
    pre = log.get("prefill")
    if pre:
        lines += [f"## prefill: nano's {pre['prompts']} prompts in {pre['batches']} batches, {pre['tokens']} tokens, "
                  f"{pre['useful_flop'] / 1e12:.3f} TFLOP of causal attention", "",
                  f"ours vs the torch reference backend (first batch): max abs err "
                  f"{pre['max_abs_err_vs_torch_ref_first_batch']:.2e}", "",
                  "| method | ms (all batches) | useful TFLOP/s | max abs err vs ours |", "| --- | --- | --- | --- |"]
        for name, r in pre["methods"].items():
            if "error" in r and "ms" not in r:
                lines.append(f"| {name} | | | {r['error'][:80]} |")
                continue
            err = r.get("max_abs_err_vs_ours")
            err_txt = "" if err is None else f"{err:.2e}" + ("" if r.get("ok") else " FAIL")
            lines.append(f"| {name} | {r['ms']:.3f} | {r['TFLOPs']:.1f} | {err_txt} |")
        lines.append("")
    lines.append(f"Checks: {'PASS' if log['passed'] else 'FAIL'}")
    return "\n".join(lines) + "\n"


def _progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON path; the Markdown table goes beside it (.md)")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU in Triton's interpreter")
    ap.add_argument("--skip-prefill", action="store_true")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--no-sweep", action="store_true", help="decode: the default launch only")
    ap.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto",
                    help="fp8: decode over an e4m3 pool (prefill left out)")
    ap.add_argument("--fp8-dot", action="store_true",
                    help="with --kv-cache-dtype fp8: sweep only the FP8 tensor-core variants "
                         "(fp8_dot swap, kq, qk, qkpv)")
    ap.add_argument("--fp8-layouts", action="store_true",
                    help="with --kv-cache-dtype fp8: only V keys-contiguous (LABKIT_FP8_V_TRANSPOSED's layout) "
                         "against the default")
    ap.add_argument("--configs", help='decode: only these configurations (a JSON list of objects, e.g. '
                    '\'[{"order": "launch"}]\'; keys: block_n, num_warps, num_stages, page_tiles, tma, '
                    'fp8_dot, splits, layout, order), between the default\'s two timings')
    args = ap.parse_args(argv)
    only = None
    if args.configs is not None:
        keys = {"block_n", "num_warps", "num_stages", "page_tiles", "tma", "fp8_dot", "splits", "layout", "order"}
        try:
            only = json.loads(args.configs)
            if not (isinstance(only, list) and all(isinstance(c, dict) and set(c) <= keys for c in only)):
                raise ValueError(f"a list of objects with keys among {', '.join(sorted(keys))}")
            bad = [c["order"] for c in only if "order" in c and c["order"] not in ("launch", "longest-first")]
            if bad:
                raise ValueError(f"order is launch or longest-first, got {bad[0]!r}")
        except ValueError as exc:
            ap.error(f"--configs: {exc}")
        if args.fp8_dot or args.fp8_layouts:
            ap.error("--configs replaces --fp8-dot and --fp8-layouts")
    if (args.fp8_dot or args.fp8_layouts) and args.kv_cache_dtype != "fp8":
        ap.error("--fp8-dot and --fp8-layouts need --kv-cache-dtype fp8")
    if args.fp8_dot and args.fp8_layouts:
        ap.error("--fp8-dot and --fp8-layouts are two sweeps: one a run")
    out = Path(args.out)
    if args.dry_run:  # before `engine` is imported: importing it imports triton, which reads this once
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from engine.kernels.interpreter import script_device

    device = script_device(args.dry_run)
    if device is None:
        print("kernel_bench: no CUDA device (use --dry-run to exercise the script on the CPU)", file=sys.stderr)
        return 2
    cuda = device == "cuda"
    import torch
    import triton

    from engine.device import num_sms
    from labkit.output import git_head

    dtype = torch.bfloat16 if cuda else torch.float32
    geo = geometry(args.dry_run)
    timer = Timer(cuda)
    log = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": git_head(), "dry_run": args.dry_run,
           "device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
           "triton": triton.__version__, "dtype": str(dtype).replace("torch.", ""),
           "geometry": {k: v for k, v in geo.items() if k != "prefill_prompts"}}
    sms = num_sms(torch.device(device), 132)
    log["sms"] = sms
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if not args.skip_decode:
            log["decode"] = bench_decode(torch, timer, geo, dtype, device, sms, args.dry_run, not args.no_sweep,
                                         fp8=args.kv_cache_dtype == "fp8", fp8_dot=args.fp8_dot,
                                         fp8_layouts=args.fp8_layouts, only=only)
        if not args.skip_prefill and args.kv_cache_dtype == "auto":
            log["prefill"] = bench_prefill(torch, timer, geo, dtype, device, args.dry_run)
    except Exception as exc:  # what ran so far still goes to --out, with the traceback
        import traceback

        log["error"] = traceback.format_exc()
        try:
            out.write_text(json.dumps(log, indent=1, default=str))
        except OSError:
            pass
        print(f"kernel_bench: could not run: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
              file=sys.stderr)
        return 2
    checks = []
    for s in log.get("decode", {}).get("shapes", {}).values():
        checks.append(s["configs"][0].get("ok", False))  # the default launch: what the engine runs
    if "prefill" in log:
        checks.append(log["prefill"]["ok"])
    log["passed"] = all(checks)
    log["ended"] = time.strftime("%Y-%m-%d %H:%M:%S")
    text = markdown(log)
    out.write_text(json.dumps(log, indent=1, default=str))
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0 if log["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
