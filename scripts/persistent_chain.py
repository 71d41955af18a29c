"""Batch 1's four GEMVs a layer in one persistent kernel, against the same arithmetic as one kernel a GEMV chained
with PDL: does a program that asks for its next weights before it waits on the grid take the boundaries out?

    PYTHONPATH=. python3 scripts/persistent_chain.py --out $OUT/chain.json     # device, ~1 minute
    python scripts/persistent_chain.py --dry-run --out /tmp/chain.json          # CPU: Triton's interpreter

Why (docs/perf.md, sessions 26-29): a batch-1 layer takes ~26 us on an H100, its weights ~10 us at a copy's rate.
Each GEMV kernel loads its weight tile before its PDL wait, but q/k/v's and gate/up's programs can only start as
the previous kernel's programs leave (registers), so their weight streams start at the boundary; o_proj and down
load under their predecessor and still end ~3 us after it. A megakernel's program stays resident for the whole
step: after a phase it asks for the next phase's weights and only then waits for every program to have finished
the phase (a counter in global memory), so no weight stream waits for a boundary. Whether that pays here, at
Qwen3-0.6B's shapes, is what this measures before the engine is rebuilt around it.

The chain, per layer (Qwen3-0.6B shapes, bf16 weights, 28 layers of distinct weights: 880 MB, past the L2):
    qkv   x = RMSNorm(h) * ln1 (rounded to bf16); qkv = Wqkv x                 [4096 x 1024]
    o     h' = h + Wo q, q the first 2048 of qkv (attention's stand-in)         [1024 x 2048]
    gu    x = RMSNorm(h') * ln2; act = SiLU(Wg x) * (Wu x) (rounded)            [2 x 3072 x 1024]
    down  h = h' + Wd act                                                       [1024 x 3072]
Every phase is split over P programs (P = 128 here: each phase's rows divide evenly), each program a fixed block
of rows over the whole K (no split-K partials). Variants, each one CUDA graph of the 28 layers:
    sep        one launch a phase (112), PDL as the engine uses it: weights loaded, gdc_wait, successor let go
    sep_nopdl  the same launches without PDL
    persist    one launch: P programs, one an SM, a grid barrier (arrive: a release add; wait: acquire polls)
               between phases. ahead (bits, one a phase: 1 next layer's q/k/v, 2 o, 4 gate/up, 8 down): a set
               bit asks for that phase's tile one phase early, before the previous phase's wait (two tiles live);
               a clear one right after the previous phase's arrive. Compiled for sm_90 (Triton 3.6, 8 warps):
               248-255 registers, no spills.
    nosync     persist's programs never waiting (timing only: what the barriers cost; the numbers race)
    probe_*    persist with the global timer stamped at each phase's pass and arrive, summarised per phase
The check: layer by layer the same roundings in float32 torch (relative L2 of the final hidden state within 2e-2
in bf16, 1e-4 in float32), a persistent run's count of arrivals, and whether its output is bit-equal to that of sep
at its warps (the same arithmetic in each program; reported, not required). A persistent program that polls ~2^20
times without its count sets a flag and goes on: a wrong result, never a hung GPU. Exit 0: every check passed; 1:
a check failed; 2: could not run. --dry-run: tiny float32 shapes; sep, and persist as one program (the interpreter
runs programs one after another: with one, its barrier opens on its own arrival). Measured on an H100 in session
30 (docs/perf.md): persist 1.065x sep, refuted.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if "--dry-run" in sys.argv:  # before triton is imported: the interpreter is chosen once, at import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# ~a second of polls on a GPU: a barrier that never opens is a flag, not a hang (the interpreter polls slowly)
MAX_POLLS = tl.constexpr(1 << 10 if os.environ.get("TRITON_INTERPRET") == "1" else 1 << 20)


def geometry(dry: bool) -> dict:
    if dry:
        return {"hidden": 64, "q": 64, "qkv": 128, "inter": 96, "layers": 2, "programs": 4}
    return {"hidden": 1024, "q": 2048, "qkv": 4096, "inter": 3072, "layers": 28, "programs": 128}


def rows_a_program(geo: dict) -> dict:
    """Each phase's rows a program (gate/up's in two power-of-two parts: 24 = 16 + 8); every phase must divide."""
    p = geo["programs"]
    for n in (geo["hidden"], geo["qkv"], geo["inter"]):
        if n % p:
            raise ValueError(f"{n} rows do not divide over {p} programs")
    gu = geo["inter"] // p
    a = 1 << (gu.bit_length() - 1)
    b = gu - a
    if b & (b - 1):
        raise ValueError(f"gate/up's {gu} rows a program are not two powers of two")
    ka = 1 << (geo["inter"].bit_length() - 1)
    if (geo["inter"] - ka) & (geo["inter"] - ka - 1):
        raise ValueError(f"down's K {geo['inter']} is not two powers of two")
    return {"qkv": geo["qkv"] // p, "o": geo["hidden"] // p, "gu_a": a, "gu_b": b, "down": geo["hidden"] // p,
            "down_k_a": ka}


@triton.jit
def _rows_load(ptrs, R: tl.constexpr, live):
    """A [R, K] tile of weights; `live` None, or a scalar that masks the whole load (the layer after the last)."""
    if live is None:
        w = tl.load(ptrs)
    else:  # (a row-wise mask broadcast: the interpreter takes no scalar mask)
        keep = tl.arange(0, R) < R * live.to(tl.int32)
        w = tl.load(ptrs, mask=tl.broadcast_to(keep[:, None], ptrs.shape), other=0.0)
    return w


@triton.jit
def _tile(w_ptr, row0, R: tl.constexpr, K: tl.constexpr, live):
    """A program's [R, K] block of weight rows."""
    # the program's rows as a scalar base: the tile's offsets then depend on the thread alone, which the loads take
    # as immediates (a tensor of addresses hoisted out of the persistent loop, one a tile, spilled)
    return _rows_load((w_ptr + row0 * K) + (tl.arange(0, R)[:, None] * K + tl.arange(0, K)[None, :]), R, live)


@triton.jit
def _act(ptr, K: tl.constexpr):
    """An activation written by other programs this step: from the L2 (.cg), never a stale L1 line."""
    return tl.load(ptr + tl.arange(0, K), cache_modifier=".cg").to(tl.float32)


@triton.jit
def _normed(h_ptr, ln_ptr, eps, H: tl.constexpr, DT: tl.constexpr):
    h = _act(h_ptr, H)
    inv = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / H + eps)
    return (h * inv * tl.load(ln_ptr + tl.arange(0, H)).to(tl.float32)).to(DT).to(tl.float32)


@triton.jit
def _dot_rows(w, x):
    return tl.sum(w.to(tl.float32) * x[None, :], axis=1)


@triton.jit
def _qkv(w, h_ptr, ln_ptr, out_ptr, row0, eps, R: tl.constexpr, H: tl.constexpr, DT: tl.constexpr):
    x = _normed(h_ptr, ln_ptr, eps, H, DT)
    tl.store(out_ptr + row0 + tl.arange(0, R), _dot_rows(w, x).to(DT))


@triton.jit
def _o(w, qkv_ptr, h_ptr, out_ptr, row0, R: tl.constexpr, Q: tl.constexpr):
    rows = row0 + tl.arange(0, R)
    y = _dot_rows(w, _act(qkv_ptr, Q))
    tl.store(out_ptr + rows, tl.load(h_ptr + rows, cache_modifier=".cg") + y)


@triton.jit
def _gu_part(wg, wu, x, act_ptr, row0, R: tl.constexpr, DT: tl.constexpr):
    g = _dot_rows(wg, x)
    u = _dot_rows(wu, x)
    silu = (g / (1.0 + tl.exp(-g))).to(DT).to(tl.float32)
    tl.store(act_ptr + row0 + tl.arange(0, R), (silu * u).to(DT))


@triton.jit
def _down_tile(wd_ptr, row0, R: tl.constexpr, I: tl.constexpr, K0: tl.constexpr, KW: tl.constexpr, live):
    """Columns [K0, K0 + KW) of a program's down rows: down's K (3072) in two power-of-two parts."""
    return _rows_load((wd_ptr + row0 * I + K0) + (tl.arange(0, R)[:, None] * I + tl.arange(0, KW)[None, :]), R, live)


@triton.jit
def _down(wa, wb, act_ptr, h_ptr, out_ptr, row0, R: tl.constexpr, IA: tl.constexpr, IB: tl.constexpr):
    rows = row0 + tl.arange(0, R)
    y = _dot_rows(wa, _act(act_ptr, IA)) + _dot_rows(wb, _act(act_ptr + IA, IB))
    tl.store(out_ptr + rows, tl.load(h_ptr + rows, cache_modifier=".cg") + y)


@triton.jit
def _stamp(probe_ptr, idx, PROBE: tl.constexpr):
    """The global timer (ns) into probe_ptr[idx] (PROBE 1, GPU only): a phase's wait passed, or its arrive sent."""
    if PROBE:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,f", [0.0], dtype=tl.int64, is_pure=False,
                                      pack=1)
        tl.store(probe_ptr + idx, t)


@triton.jit
def _arrive(cnt_ptr):
    tl.debug_barrier()  # every thread's stores issued before the count says so
    tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait(cnt_ptr, flag_ptr, target, SYNC: tl.constexpr):
    if SYNC:  # (SYNC 0, timing only: the phases' streams and sums without the barrier; the numbers race)
        # once any program has timed out, nobody polls again (the run ends wrong and flagged, in seconds)
        polls = tl.load(flag_ptr, volatile=True) * MAX_POLLS
        seen = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
        while (seen < target) & (polls < MAX_POLLS):
            seen = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
            polls += 1
        if seen < target:
            tl.store(flag_ptr, 1)
        tl.debug_barrier()


@triton.jit
def _layer_tiles_gu(wg_ptr, wu_ptr, layer, pid, live, RA: tl.constexpr, RB: tl.constexpr, H: tl.constexpr,
                    I: tl.constexpr):
    base = layer * I * H
    row0 = pid * (RA + RB)
    ga = _tile(wg_ptr + base, row0, RA, H, live)
    ua = _tile(wu_ptr + base, row0, RA, H, live)
    if RB > 0:
        gb = _tile(wg_ptr + base, row0 + RA, RB, H, live)
        ub = _tile(wu_ptr + base, row0 + RA, RB, H, live)
    else:
        gb = ga
        ub = ua
    return ga, ua, gb, ub


@triton.jit
def _gu(ga, ua, gb, ub, h_ptr, ln_ptr, act_ptr, pid, eps, RA: tl.constexpr, RB: tl.constexpr, H: tl.constexpr,
        DT: tl.constexpr):
    x = _normed(h_ptr, ln_ptr, eps, H, DT)
    row0 = pid * (RA + RB)
    _gu_part(ga, ua, x, act_ptr, row0, RA, DT)
    if RB > 0:
        _gu_part(gb, ub, x, act_ptr, row0 + RA, RB, DT)


@triton.jit
def _chain_kernel(h_ptr, mid_ptr, qkv_ptr, act_ptr, wqkv_ptr, wo_ptr, wg_ptr, wu_ptr, wd_ptr, ln1_ptr, ln2_ptr,
                  cnt_ptr, flag_ptr, eps, layer, n_layers,
                  H: tl.constexpr, Q: tl.constexpr, QKV: tl.constexpr, I: tl.constexpr,
                  R_QKV: tl.constexpr, R_O: tl.constexpr, R_GA: tl.constexpr, R_GB: tl.constexpr,
                  R_D: tl.constexpr, IA: tl.constexpr, PHASE: tl.constexpr, AHEAD: tl.constexpr, USE_PDL: tl.constexpr,
                  SYNC: tl.constexpr = 1, probe_ptr=None, PROBE: tl.constexpr = 0):
    """PHASE 0-3: one phase of `layer` (qkv, o, gu, down), loads before the PDL wait. PHASE 4: every phase of
    every layer in one launch, the programs meeting at a grid barrier after each phase."""
    pid = tl.program_id(0)
    DT: tl.constexpr = wqkv_ptr.dtype.element_ty
    live = None
    if PHASE == 0:
        w = _tile(wqkv_ptr + layer * QKV * H, pid * R_QKV, R_QKV, H, live)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        _qkv(w, h_ptr, ln1_ptr + layer * H, qkv_ptr, pid * R_QKV, eps, R_QKV, H, DT)
    elif PHASE == 1:
        w = _tile(wo_ptr + layer * H * Q, pid * R_O, R_O, Q, live)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        _o(w, qkv_ptr, h_ptr, mid_ptr, pid * R_O, R_O, Q)
    elif PHASE == 2:
        ga, ua, gb, ub = _layer_tiles_gu(wg_ptr, wu_ptr, layer, pid, live, R_GA, R_GB, H, I)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        _gu(ga, ua, gb, ub, mid_ptr, ln2_ptr + layer * H, act_ptr, pid, eps, R_GA, R_GB, H, DT)
    elif PHASE == 3:
        wa = _down_tile(wd_ptr + layer * H * I, pid * R_D, R_D, I, 0, IA, live)
        wb = _down_tile(wd_ptr + layer * H * I, pid * R_D, R_D, I, IA, I - IA, live)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        _down(wa, wb, act_ptr, mid_ptr, h_ptr, pid * R_D, R_D, IA, I - IA)
    else:
        P = tl.num_programs(0)
        w1 = _tile(wqkv_ptr, pid * R_QKV, R_QKV, H, live)
        for lay in range(n_layers):
            # AHEAD's bit f: phase f's tile is asked for one phase early (before the previous phase's wait, two
            # tiles live), else right after the previous phase's arrive (before its own wait)
            step = 4 * lay * P
            if AHEAD & 2:
                w2 = _tile(wo_ptr + lay * H * Q, pid * R_O, R_O, Q, live)
            if lay > 0:
                _wait(cnt_ptr, flag_ptr, step, SYNC)
            slot = (pid * n_layers + lay) * 8  # (the probe: 4 phases x wait passed, arrive sent)
            _stamp(probe_ptr, slot, PROBE)
            _qkv(w1, h_ptr, ln1_ptr + lay * H, qkv_ptr, pid * R_QKV, eps, R_QKV, H, DT)
            _arrive(cnt_ptr)
            _stamp(probe_ptr, slot + 1, PROBE)
            if not AHEAD & 2:
                w2 = _tile(wo_ptr + lay * H * Q, pid * R_O, R_O, Q, live)
            if AHEAD & 4:
                ga, ua, gb, ub = _layer_tiles_gu(wg_ptr, wu_ptr, lay, pid, live, R_GA, R_GB, H, I)
            _wait(cnt_ptr, flag_ptr, step + P, SYNC)
            _stamp(probe_ptr, slot + 2, PROBE)
            _o(w2, qkv_ptr, h_ptr, mid_ptr, pid * R_O, R_O, Q)
            _arrive(cnt_ptr)
            _stamp(probe_ptr, slot + 3, PROBE)
            if not AHEAD & 4:
                ga, ua, gb, ub = _layer_tiles_gu(wg_ptr, wu_ptr, lay, pid, live, R_GA, R_GB, H, I)
            if AHEAD & 8:
                wa = _down_tile(wd_ptr + lay * H * I, pid * R_D, R_D, I, 0, IA, live)
                wb = _down_tile(wd_ptr + lay * H * I, pid * R_D, R_D, I, IA, I - IA, live)
            _wait(cnt_ptr, flag_ptr, step + 2 * P, SYNC)
            _stamp(probe_ptr, slot + 4, PROBE)
            _gu(ga, ua, gb, ub, mid_ptr, ln2_ptr + lay * H, act_ptr, pid, eps, R_GA, R_GB, H, DT)
            _arrive(cnt_ptr)
            _stamp(probe_ptr, slot + 5, PROBE)
            nxt = lay + 1 < n_layers
            if not AHEAD & 8:
                wa = _down_tile(wd_ptr + lay * H * I, pid * R_D, R_D, I, 0, IA, live)
                wb = _down_tile(wd_ptr + lay * H * I, pid * R_D, R_D, I, IA, I - IA, live)
            if AHEAD & 1:
                w1 = _tile(wqkv_ptr + (lay + 1) * QKV * H, pid * R_QKV, R_QKV, H, nxt)
            _wait(cnt_ptr, flag_ptr, step + 3 * P, SYNC)
            _stamp(probe_ptr, slot + 6, PROBE)
            _down(wa, wb, act_ptr, mid_ptr, h_ptr, pid * R_D, R_D, IA, I - IA)
            _arrive(cnt_ptr)
            _stamp(probe_ptr, slot + 7, PROBE)
            if not AHEAD & 1:
                w1 = _tile(wqkv_ptr + (lay + 1) * QKV * H, pid * R_QKV, R_QKV, H, nxt)


def make_data(torch, geo: dict, dtype, device: str) -> dict:
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)

    h, q, qkv, inter, n = geo["hidden"], geo["q"], geo["qkv"], geo["inter"], geo["layers"]
    return {"wqkv": rnd(n, qkv, h, scale=h ** -0.5), "wo": rnd(n, h, q, scale=q ** -0.5),
            "wg": rnd(n, inter, h, scale=h ** -0.5), "wu": rnd(n, inter, h, scale=h ** -0.5),
            "wd": rnd(n, h, inter, scale=inter ** -0.5),
            "ln1": 1 + 0.1 * rnd(n, h), "ln2": 1 + 0.1 * rnd(n, h),
            "h0": torch.randn(h, generator=g).to(device)}


def reference(torch, geo: dict, data: dict):
    """The chain in float32 with the kernels' rounding points (x, qkv, SiLU and act to the weights' dtype)."""
    dt, eps = data["wqkv"].dtype, 1e-6
    f = lambda t: t.float().cpu()  # noqa: E731
    rnd = lambda t: t.to(dt).float()  # noqa: E731
    h = f(data["h0"])
    for lay in range(geo["layers"]):
        x = rnd(h * torch.rsqrt((h * h).mean() + eps) * f(data["ln1"][lay]))
        qkv = rnd(f(data["wqkv"][lay]) @ x)
        mid = h + f(data["wo"][lay]) @ qkv[:geo["q"]]
        x = rnd(mid * torch.rsqrt((mid * mid).mean() + eps) * f(data["ln2"][lay]))
        g, u = f(data["wg"][lay]) @ x, f(data["wu"][lay]) @ x
        act = rnd(rnd(torch.nn.functional.silu(g)) * u)
        h = mid + f(data["wd"][lay]) @ act
    return h


class Chain:
    """Buffers and launches of one variant: `run()` computes the whole chain from h0 into `h`."""

    def __init__(self, torch, geo: dict, data: dict, device: str, mode: str, ahead: int = 0, warps: int = 8,
                 programs: int | None = None, sync: int = 1, probe: bool = False):
        geo = {**geo, "programs": programs or geo["programs"]}
        self.torch, self.geo, self.data, self.mode, self.ahead, self.warps = torch, geo, data, mode, ahead, warps
        self.rows = rows_a_program(geo)
        self.sync = sync
        dt = data["wqkv"].dtype
        self.h = torch.empty(geo["hidden"], dtype=torch.float32, device=device)
        self.mid = torch.empty_like(self.h)
        self.qkv = torch.empty(geo["qkv"], dtype=dt, device=device)
        self.act = torch.empty(geo["inter"], dtype=dt, device=device)
        self.cnt = torch.zeros(1, dtype=torch.int32, device=device)
        self.flag = torch.zeros(1, dtype=torch.int32, device=device)
        self.pdl = device == "cuda" and mode == "sep"
        # the probe: each program's 8 timer stamps a layer (a phase's wait passed, its arrive sent)
        self.probe = (torch.zeros(geo["programs"] * geo["layers"] * 8, dtype=torch.int64, device=device)
                      if probe else None)

    def _launch(self, phase: int, layer: int) -> None:
        d, g, r = self.data, self.geo, self.rows
        kw = {"launch_pdl": True} if self.pdl else {}
        _chain_kernel[(g["programs"],)](
            self.h, self.mid, self.qkv, self.act, d["wqkv"], d["wo"], d["wg"], d["wu"], d["wd"], d["ln1"], d["ln2"],
            self.cnt, self.flag, 1e-6, layer, g["layers"],
            H=g["hidden"], Q=g["q"], QKV=g["qkv"], I=g["inter"], R_QKV=r["qkv"], R_O=r["o"], R_GA=r["gu_a"],
            R_GB=r["gu_b"], R_D=r["down"], IA=r["down_k_a"], PHASE=phase, AHEAD=self.ahead, USE_PDL=self.pdl,
            SYNC=self.sync, probe_ptr=self.probe if self.probe is not None else self.cnt,
            PROBE=int(self.probe is not None),
            num_warps=self.warps, **kw)

    def run(self) -> None:
        self.h.copy_(self.data["h0"])
        if self.mode == "persist":
            self.cnt.zero_()
            self._launch(4, 0)
            return
        for layer in range(self.geo["layers"]):
            for phase in range(4):
                self._launch(phase, layer)


def probe_summary(stamps: list[int], programs: int, layers: int) -> dict:
    """Medians over the middle layers (the first two and last two left out), per phase, in us: `work` a program's
    own time from its wait passed to its arrive sent (median over programs, and the slowest), `opened` from the
    phase's last arrive to the next phase's median and last pass (the barrier as the programs saw it), and `span`
    from the previous phase's last arrive to this one's (the layer's timeline)."""
    import statistics

    def at(p, lay, k):
        return stamps[(p * layers + lay) * 8 + k]

    mids = range(2, layers - 2) if layers > 5 else range(layers)
    out = {}
    for f, name in enumerate(("qkv", "o", "gu", "down")):
        work, slowest, opened_med, opened_last, span = [], [], [], [], []
        for lay in mids:
            own = [(at(p, lay, 2 * f + 1) - at(p, lay, 2 * f)) / 1e3 for p in range(programs)]
            work.append(statistics.median(own))
            slowest.append(max(own))
            last_arrive = max(at(p, lay, 2 * f + 1) for p in range(programs))
            nl, nf = (lay, f + 1) if f < 3 else (lay + 1, 0)
            if nl < layers:
                passes = sorted(at(p, nl, 2 * nf) for p in range(programs))
                opened_med.append((passes[len(passes) // 2] - last_arrive) / 1e3)
                opened_last.append((passes[-1] - last_arrive) / 1e3)
            pl, pf = (lay, f - 1) if f > 0 else (lay - 1, 3)
            if pl >= 0:
                span.append((last_arrive - max(at(p, pl, 2 * pf + 1) for p in range(programs))) / 1e3)
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        out[name] = {"work": med(work), "work_slowest": med(slowest), "opened_median": med(opened_med),
                     "opened_last": med(opened_last), "span": med(span)}
    return out


def rel_err(torch, a, b) -> float:
    a, b = a.float().cpu(), b.float().cpu()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def variants(cuda: bool) -> list[dict]:
    """sep first (the others are compared with it). On the CPU the persistent kernel runs as one program (the
    interpreter runs programs one after another: with one, its barrier opens on its own arrival), which checks
    its phases' order and arithmetic, not the barrier."""
    sep = [{"name": "sep", "mode": "sep", "ahead": 0, "warps": 4}]
    if not cuda:
        return sep + [{"name": "persist_a7_p1", "mode": "persist", "ahead": 7, "warps": 4, "programs": 1}]
    return sep + [{"name": "sep_w8", "mode": "sep", "ahead": 0, "warps": 8},
                  {"name": "sep_nopdl", "mode": "sep_nopdl", "ahead": 0, "warps": 4}] + [
        {"name": f"persist_a{a}_w8", "mode": "persist", "ahead": a, "warps": 8} for a in (0, 4, 7, 15)] + [
        # timing only: the same programs never waiting (what the barrier costs; its numbers race, unchecked)
        {"name": "nosync_a0_w8", "mode": "persist", "ahead": 0, "warps": 8, "sync": 0}] + [
        # the probe's stamps (a phase's wait passed, its arrive sent): where a persistent layer's time goes
        {"name": f"probe_a{a}_w8", "mode": "persist", "ahead": a, "warps": 8, "probe": True} for a in (0, 7)]


def measure(torch, device: str, dry: bool, rounds: int) -> dict:
    from engine.device import num_sms

    geo = geometry(dry)
    cuda = device == "cuda"
    sms = num_sms(torch.device(device), geo["programs"])
    if geo["programs"] > sms:
        raise RuntimeError(f"{geo['programs']} persistent programs need as many SMs; this device has {sms}")
    dtype = torch.float32 if dry else torch.bfloat16
    tol = 1e-4 if dry else 2e-2
    data = make_data(torch, geo, dtype, device)
    ref = reference(torch, geo, data)
    wbytes = sum(data[k].numel() * data[k].element_size() for k in ("wqkv", "wo", "wg", "wu", "wd"))
    out = {"device": torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)", "sms": sms,
           "geometry": geo, "rows": rows_a_program(geo), "weight_MB_a_layer": wbytes / geo["layers"] / 1e6,
           "variants": []}
    chains, sep_h = {}, {}  # sep's output by warps: a persistent variant matches the sep of its warps bit for bit
    for v in variants(cuda):
        row = dict(v)
        try:
            c = Chain(torch, geo, data, device, v["mode"], v["ahead"], v["warps"], v.get("programs"),
                      v.get("sync", 1), v.get("probe", False))
            c.run()
            if cuda:
                torch.cuda.synchronize()
            row["rel_err"] = rel_err(torch, c.h, ref)
            row["flag"] = int(c.flag.item())
            row["ok"] = row["rel_err"] < tol and row["flag"] == 0
            if not v.get("sync", 1):
                row["ok"] = True  # (timing only)
            if v["mode"] == "persist" and v.get("sync", 1):
                row["count"] = int(c.cnt.item())
                row["count_ok"] = row["count"] == 4 * geo["layers"] * c.geo["programs"]
                ref_h = sep_h.get(v["warps"])
                row["bit_equal_sep"] = bool(torch.equal(c.h, ref_h)) if ref_h is not None else None
                row["ok"] = row["ok"] and row["count_ok"]
            elif v["mode"] == "sep":
                sep_h[v["warps"]] = c.h.clone()
            chains[v["name"]] = c
        except Exception as e:  # noqa: BLE001 - a variant that does not compile is a result
            row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:200]}")
        out["variants"].append(row)
    # timing: the variants interleaved, `rounds` rounds, each one CUDA graph of the whole chain
    for _ in range(rounds if cuda else 1):
        for row in out["variants"]:
            c = chains.get(row["name"])
            if c is None:
                continue
            ms = time_ms(torch, cuda, c.run)
            row.setdefault("us_a_layer", []).append(ms * 1e3 / geo["layers"])
    for row in out["variants"]:  # (the probe's stamps as the last timed replay left them)
        c = chains.get(row["name"])
        if c is not None and c.probe is not None:
            row["probe"] = probe_summary(c.probe.tolist(), c.geo["programs"], geo["layers"])
    for row in out["variants"]:
        if row.get("us_a_layer"):
            med = sorted(row["us_a_layer"])[len(row["us_a_layer"]) // 2]
            row["median_us_a_layer"] = med
            row["TBps"] = wbytes / geo["layers"] / (med * 1e-6) / 1e12
    base = next((r.get("median_us_a_layer") for r in out["variants"] if r["name"] == "sep"), None)
    for row in out["variants"]:
        if base and row.get("median_us_a_layer"):
            row["ratio_to_sep"] = row["median_us_a_layer"] / base
    out["ok"] = all(r["ok"] for r in out["variants"])
    return out


def time_ms(torch, cuda: bool, fn) -> float:
    if cuda:
        from engine.kernels.timing import graph_ms

        return graph_ms(fn, calls=1, replays=7)
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def markdown(log: dict) -> str:
    g = log["geometry"]
    lines = [f"# four GEMVs a layer: one kernel a phase against one persistent kernel ({log['device']}), "
             f"commit {log.get('commit')}", "",
             f"{g['layers']} layers, {log['weight_MB_a_layer']:.1f} MB of weights a layer, {g['programs']} programs "
             f"({log['sms']} SMs); rows a program {log['rows']}.", "",
             "| variant | warps | ahead | us a layer (rounds) | median | TB/s | / sep | rel err | ok |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in log["variants"]:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['warps']} | {r['ahead']} | | | | | {r['error'][:60]} | no |")
            continue
        us = ", ".join(f"{x:.2f}" for x in r.get("us_a_layer", []))
        extra = "" if r["mode"] != "persist" else f" (bit-equal sep: {r.get('bit_equal_sep')})"
        lines.append(f"| {r['name']} | {r['warps']} | {r['ahead']} | {us} | {r.get('median_us_a_layer', 0):.2f} | "
                     f"{r.get('TBps', 0):.2f} | {r.get('ratio_to_sep', 0):.3f} | {r['rel_err']:.1e}{extra} | "
                     f"{'yes' if r['ok'] else 'NO'} |")
    for r in log["variants"]:
        if r.get("probe"):
            lines += ["", f"{r['name']}, us (medians over the middle layers): a program's work from its wait to its "
                      "arrive (median, slowest); the barrier from the phase's last arrive to the next phase's median "
                      "and last pass; the phase's span from the previous phase's last arrive to its own.", "",
                      "| phase | work | slowest | opened (median) | opened (last) | span |",
                      "| --- | --- | --- | --- | --- | --- |"]
            fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
            for name, ph in r["probe"].items():
                lines.append(f"| {name} | {fmt(ph['work'])} | {fmt(ph['work_slowest'])} | "
                             f"{fmt(ph['opened_median'])} | {fmt(ph['opened_last'])} | {fmt(ph['span'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="result JSON (a Markdown table is written beside it)")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds, the variants interleaved (default 3)")
    ap.add_argument("--dry-run", action="store_true", help="tiny float32 shapes on the CPU (Triton's interpreter)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        print("persistent_chain: --rounds must be at least 1", file=sys.stderr)
        return 2
    from engine.kernels.interpreter import script_device

    device = script_device(args.dry_run)
    if device is None:
        print("persistent_chain: no CUDA device (use --dry-run to exercise the script on the CPU)", file=sys.stderr)
        return 2
    import torch

    from labkit.output import write_result

    log = measure(torch, device, args.dry_run, args.rounds)
    write_result(Path(args.out), log, markdown(log))
    return 0 if log["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
