"""engine/kernels/smem_gemv.py (the launches LABKIT_DECODE_SMEM_GEMV names; all but o_proj by default): the one-row
GEMV with its weight tile in shared memory. Triton's interpreter does not run Gluon: its numbers are checked on the
device (scripts/gemv_bench.py under the knob, the graph logits suite) and in tests/gluon_emulator.py; here: the
five launches a Qwen3-0.6B layer makes, compiled for sm_90 as the engine makes them, keep the design (every weight
copied before the PDL wait, in one commit group a chunk after the norm weights' own, each chunk read only once its
group landed, few registers, no spills); the launches each choice routes to it; and what decode_layer.gemv hands
it, run through a torch model of the kernel's arithmetic against the Triton path."""
from __future__ import annotations

import math
import sys

import pytest
import torch

from .helpers import needs_sm90_tools

# (N, K, split, partials in, residual, norm, SiLU, partials out, attention's splits merged): the launches of
# engine/fused_decode.py at one row for Qwen3-0.6B on 132 SMs (the splits as decode_layer.split_for gives them;
# o_proj merges attention's 4 parts at contexts up to 512, the short-context graph's, and reads its output past)
LAUNCHES = {
    "qkv, layer 0": (4096, 1024, 1, 0, False, True, False, False, 0),
    "qkv": (4096, 1024, 1, 3, True, True, False, False, 0),
    "o_proj": (1024, 2048, 4, 0, False, False, False, True, 0),
    "o_proj, merging": (1024, 2048, 4, 0, False, False, False, True, 4),
    "gate_up": (3072, 1024, 1, 4, True, True, True, False, 0),
    "down": (1024, 3072, 3, 0, False, False, False, True, 0),
}
SIG = {"w_ptr": "*bf16", "x_ptr": "*bf16", "part_ptr": "*fp32", "res_ptr": "*bf16", "res_out_ptr": "*bf16",
       "nw_ptr": "*bf16", "y_ptr": "*bf16", "ml_ptr": "*fp32", "ctx_ptr": "*i32", "eps": "fp32"}
HEAD_DIM, KEYS_A_TILE = 128, 128


def test_the_launches_are_the_engines():
    from engine.kernels import decode_layer as dl

    for name, (n, k, split, *_, partials_out, _) in LAUNCHES.items():
        if partials_out:
            assert dl.split_for(n, k, 132) == split, name


_COMPILE = """
import json, sys
sys.path.insert(0, "scripts")
from engine.kernels import smem_gemv as sg
import kernel_sass as ks
sig = json.loads(sys.argv[1])
HEAD_DIM, KEYS_A_TILE = json.loads(sys.argv[3])
out = {}
for name, (n, k, split, s_in, residual, norm, silu, partials_out, attn, trigger) in json.loads(sys.argv[2]).items():
    meta = sg.meta(n, k, 16, k // split, s_in=s_in, residual=residual, norm=norm, silu=silu,
                   partials_out=partials_out, use_pdl=True, trigger=trigger,
                   attn=(attn, HEAD_DIM, KEYS_A_TILE) if attn else (0, 0, 0))
    s = dict(sig, y_ptr="*fp32" if partials_out else "*bf16")
    kernel = ks.gluon_sm90(sg._smem_gemv_kernel, s, meta, tuple(list(s)[:9]), meta["num_warps"])
    out[name] = ks.async_copy_report(kernel, meta["num_warps"])
    sass = ks.cubin_sass(kernel)[1]
    # where the successor is let go (PREEXIT: griddepcontrol.launch_dependents) against the first copy
    out[name]["trigger_before_copies"] = "PREEXIT" in sass.split("LDGSTS")[0]
    out[name]["triggers"] = sass.count("PREEXIT")
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def reports():
    """Each launch compiled for sm_90 (TRIGGER 1, the default; "down, first": TRIGGER 2), in a fresh interpreter:
    Gluon compiles nothing under Triton's interpreter, which the tests run with."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    needs_sm90_tools()
    cases = {name: (*launch, 1) for name, launch in LAUNCHES.items()}
    cases["down, first"] = (*LAUNCHES["down"], 2)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(SIG), json.dumps(cases),
                          json.dumps([HEAD_DIM, KEYS_A_TILE])], env=env,
                         cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(LAUNCHES))
def test_every_weight_is_copied_before_the_wait_and_read_after_its_group_landed(reports, name):
    n, k, split, s_in, residual, norm, silu, partials_out, attn = LAUNCHES[name]
    r = reports[name]
    chunks = k // split // 256
    per_chunk = (2 if silu else 1) * 16 * 256 // (4 * 32 * 8)  # 16-byte copies a thread (4 warps) a chunk
    # the norm weights first, a group of their own (one warp's copies: the others' are the same bytes), then one
    # group a chunk of the tile; all of it asked for before the one PDL wait
    assert r["group_sizes"] == [chunks] * norm + [per_chunk] * chunks, r
    assert r["async_copies"] == r["copies_before_wait"] == sum(r["group_sizes"]), r
    assert r["pdl_waits"] == 1, r
    # chunk c read once at most chunks-1-c groups are still in flight: its own (and the norm's) have landed
    assert r["group_waits"] == list(range(chunks - 1, -1, -1)), r
    # and nothing copied is read before the first wait: with the norm, only what the program itself wrote: the
    # statistics' sum across the warps (one or two reads, as the compiler makes it; Triton 3.9 one, 3.6 two) and
    # the first chunk of the row (256 float32 over 32 lanes, two 16-byte reads); without it the input is read from
    # memory
    assert r["reads_before_first_wait"] <= (4 if norm else 0), r
    tile = (2 if silu else 1) * 16 * (k // split) * 2
    assert tile <= r["shared"] <= tile + 8 * 1024, r  # (the tile, plus the row's input and norm weights)
    assert r["spill_loads"] == 0 and r["registers"] <= 160, r
    # so that a successor's programs fit on an SM beside (the Triton programs: 255 registers, two an SM)
    assert r["per_sm"] >= 3, r


@pytest.mark.parametrize("name", list(LAUNCHES))
def test_the_input_is_loaded_before_the_new_residual_is_stored(reports, name):
    """The row's input (partials, residual, attention's parts) is asked of memory at once: no global load comes
    after the program's first store. Made chunk by chunk with the residual's store between the chunks, each chunk's
    loads waited behind the store: four L2 round trips, ~2 us of q/k/v's 5.7 (docs/perf.md, session 38)."""
    assert reports[name]["loads_after_a_store"] == 0, reports[name]


def test_the_successor_is_let_go_where_the_trigger_says(reports):
    """TRIGGER 1 (the default, LABKIT_DECODE_PDL=early) lets the successor launch after the wait, past every copy;
    2 (first) before the first copy."""
    assert reports["down"]["triggers"] == reports["down, first"]["triggers"] == 1
    assert not reports["down"]["trigger_before_copies"]
    assert reports["down, first"]["trigger_before_copies"]


@pytest.mark.parametrize("M, N, K, ks, elem, kw, want", [
    (1, 4096, 1024, 1024, 2, {}, True),
    (1, 3072, 1024, 1024, 2, {"silu": True}, True),
    (1, 1024, 3072, 1024, 2, {"norm": False}, True),
    (2, 4096, 1024, 1024, 2, {}, False),                      # two rows: the Triton per-row path
    (1, 4096, 1024, 512, 2, {}, False),                       # the norm needs whole rows
    (1, 4096, 2560, 2560, 2, {}, False),                      # ... of a power-of-two count of chunks (10)
    (1, 4096, 2048, 2048, 2, {}, True),                       # (8)
    (1, 4096, 768, 768, 2, {"norm": False}, True),            # (without the norm, any count)
    (1, 1024, 2048, 512, 2, {"norm": False}, True),           # o_proj (with attention's parts or not)
    (1, 4096, 1024, 1024, 2, {"probe": True}, False),
    (1, 4096, 1024, 1024, 4, {}, False),                      # float32 weights: 32 bytes a lane's chunk
    (1, 4096, 1024, 1024, 2, {"dense": False}, False),        # rows not K apart
    (1, 4100, 1024, 1024, 2, {}, False),                      # a tile of rows past the end
    (1, 4096, 1000, 1000, 2, {}, False),                      # a part chunk
    (1, 6144, 4096, 4096, 2, {"silu": True}, False),          # 256 KiB of tile
    (1, 1024, 4096, 4096, 2, {"norm": False}, True),          # 128 KiB
])
def test_it_serves_one_row_launches_it_fits_and_no_other(M, N, K, ks, elem, kw, want):
    from engine.kernels import smem_gemv as sg

    args = {"dense": True, "norm": True, "silu": False, "probe": False, **kw}
    assert sg.serves(M, N, K, ks, 16, elem, **args) is want


def _model(w, *, x=None, partials=None, residual=None, norm_weight=None, silu=False, split=None, eps=1e-6):
    """The launch's arithmetic in torch, from the unfused path's definition (engine/layers: the split partials
    summed in order and rounded, the residual added and rounded, RMSNorm's rounding points, float32 products
    rounded once, SiLU rounded before the product): (y, new residual or None)."""
    from engine.kernels.decode_layer import AttnParts

    dt = w.dtype
    h = x[0].float() if isinstance(x, torch.Tensor) else None
    if isinstance(x, AttnParts):  # each head's live splits (those holding keys) weighed by exp2(max - the max)
        _, heads, splits, d = x.acc.shape
        ctx = int(x.context_lens[0])
        span = math.ceil(math.ceil(ctx / x.block_n) / splits) * x.block_n  # (keys a split covers)
        h = torch.empty(heads * d)
        for hd in range(heads):
            live = [s for s in range(splits) if s * span < ctx]
            m = max(x.ml[0, hd, s, 0].item() for s in live)
            wts = {s: torch.exp2(x.ml[0, hd, s, 0] - m) for s in live}
            num = sum(x.acc[0, hd, s] * wts[s] for s in live)
            den = sum(x.ml[0, hd, s, 1] * wts[s] for s in live)
            h[hd * d:(hd + 1) * d] = (num / den).to(dt).float()
    if partials is not None:  # (in order: a float32 sum's order matters to its last bit)
        h = partials[0, 0].clone()
        for s in range(1, partials.shape[0]):
            h += partials[s, 0]
        h = h.to(dt).float()
    res = None
    if residual is not None:
        h = (h + residual[0].float()).to(dt).float()
        res = h.to(dt)[None]
    if norm_weight is not None:
        rstd = torch.rsqrt((h * h).mean() + eps)
        h = ((h * rstd).to(dt).float() * norm_weight.float()).to(dt).float()
    wf = w.double()
    if silu:
        n = w.shape[0] // 2
        g = (wf[:n] @ h.double()).float().to(dt).float()
        u = (wf[n:] @ h.double()).float().to(dt).float()
        return ((g / (1 + torch.exp(-g))).to(dt).float() * u).to(dt)[None], res
    if split:
        ks = w.shape[1] // split
        return torch.stack([(wf[:, p * ks:(p + 1) * ks] @ h[p * ks:(p + 1) * ks].double()).float()
                            for p in range(split)])[:, None], res
    return (wf @ h.double()).float().to(dt)[None], res


def _inputs(name: str, context: int = 256):
    """A launch's inputs (fewer rows); attention's parts for a context of `context` keys, the parts of splits that
    hold none NaN (never to be read)."""
    from engine.kernels.decode_layer import AttnParts

    n, k, split, s_in, residual, norm, silu, partials_out, attn = LAUNCHES[name]
    n = n // 16   # (the same launch with fewer rows)
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(2 * n if silu else n, k, generator=g) * 0.05).to(torch.bfloat16)
    kw = {}
    if attn:
        heads = k // HEAD_DIM
        acc = torch.randn(1, heads, attn, HEAD_DIM, generator=g)
        ml = torch.stack([torch.randn(1, heads, attn, generator=g) * 3,
                          torch.rand(1, heads, attn, generator=g) * 50 + 1], dim=-1)
        span = math.ceil(math.ceil(context / KEYS_A_TILE) / attn) * KEYS_A_TILE
        dead = torch.arange(attn) * span >= context
        acc[:, :, dead] = float("nan")
        ml[:, :, dead] = float("nan")
        kw["x"] = AttnParts(acc, ml, torch.tensor([context], dtype=torch.int32), KEYS_A_TILE)
    elif s_in:
        kw["partials"] = torch.randn(s_in, 1, k, generator=g)
    else:
        kw["x"] = torch.randn(1, k, generator=g).to(torch.bfloat16)
    if residual:
        kw["residual"] = torch.randn(1, k, generator=g).to(torch.bfloat16)
    if norm:
        kw["norm_weight"] = (1 + 0.5 * torch.randn(k, generator=g)).to(torch.bfloat16)  # (one left out: ~50%)
    if partials_out:
        kw["split"] = split
    return w, dict(kw, silu=silu)


def _emulated(monkeypatch, trigger: int = 1):
    """gemv's Gluon route forced on this CPU, with PDL (its trigger point), the kernel run by the emulator."""
    from engine.kernels import decode_layer as dl, smem_gemv as sg

    from .gluon_emulator import emulate

    em = emulate(sg._smem_gemv_kernel, dependent=("x_ptr", "part_ptr", "res_ptr", "ml_ptr"))
    monkeypatch.setattr(sg, "_smem_gemv_kernel", em)
    monkeypatch.setattr(dl, "SMEM_GEMV", "1")
    monkeypatch.setattr(dl, "_smem_serves", lambda dev, *a, **k: sg.serves(
        *a[:4], 16, 2, dense=True, norm=k["norm"], silu=k["silu"], probe=False))
    monkeypatch.setattr(dl, "_pdl", lambda dev, mode="": (True, trigger, {"launch_pdl": True}))
    return em


def _bf16_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """bf16 values equal but for float32 sums' order: at most 1% of them one rounding apart."""
    diff = (got.float() - want.float()).abs()
    ulp = want.float().abs().clamp_min(1e-30) * 2.0 ** -7
    assert (diff <= ulp).all(), diff.max()
    assert (diff > 0).float().mean() <= 0.01, (diff > 0).float().mean()


@pytest.mark.parametrize("name, context", [(name, 256) for name in LAUNCHES] + [
    # (256 keys: two splits of 128 hold keys, the third starts at the end; 100 and 200: one and two, inside)
    ("o_proj, merging", 100), ("o_proj, merging", 200)])
def test_the_kernel_computes_the_launch_and_waits_before_its_input(monkeypatch, name, context):
    """_smem_gemv_kernel's own source run on this CPU (tests/gluon_emulator.py) through gemv: its outputs against
    the launch's arithmetic in torch (tight) and against the Triton path (interpreted: its bfloat16 rounding is
    its own, so loose); every program passes its PDL wait once, before it reads its input, and lets its successor
    launch after it; no chunk read before its copy group landed (the emulator raises)."""
    from engine.kernels import decode_layer as dl

    w, kw = _inputs(name, context)
    triton_path = dl.gemv(w, **kw)
    em = _emulated(monkeypatch)
    got = dl.gemv(w, **kw)
    want, res = _model(w, **kw)
    if res is not None:
        got, new_res = got
        triton_path = triton_path[0]
        assert torch.equal(new_res, res)  # (the residual stream, written once: exact)
    assert got.shape == want.shape and got.dtype == want.dtype
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        _bf16_close(got, want)
    rel = ((got.float() - triton_path.float()).norm() / triton_path.float().norm()).item()
    rounded = got.dtype != torch.float32 or LAUNCHES[name][-1]  # (a bfloat16 rounding on the way: the merge's)
    assert rel < (5e-2 if rounded else 1e-5), rel
    assert em.programs and all(p.events == ["wait", "trigger"] for p in em.programs)


@pytest.mark.parametrize("silu", [False, True], ids=["qkv", "gate_up"])
@pytest.mark.parametrize("norm", [False, True], ids=["x", "xn"])
def test_gemv_bench_prologue_launches_compute_their_arithmetic(monkeypatch, silu, norm):
    """scripts/gemv_bench.py --prologue's launches (one bf16 row in, with or without RMSNorm: not the engine's, so
    not in LAUNCHES) through the Gluon route as the device takes them under LABKIT_DECODE_SMEM_GEMV=1."""
    from engine.kernels import decode_layer as dl

    g = torch.Generator().manual_seed(11)
    n, k = 64, 1024
    w = (torch.randn(2 * n if silu else n, k, generator=g) * 0.05).to(torch.bfloat16)
    kw = {"x": torch.randn(1, k, generator=g).to(torch.bfloat16), "silu": silu}
    if norm:
        kw["norm_weight"] = (1 + 0.5 * torch.randn(k, generator=g)).to(torch.bfloat16)
    em = _emulated(monkeypatch)
    got = dl.gemv(w, **kw)
    want, _ = _model(w, **kw)
    _bf16_close(got, want)
    assert em.programs and all(p.events == ["wait", "trigger"] for p in em.programs)


def test_the_first_trigger_lets_the_successor_go_before_the_copies(monkeypatch):
    from engine.kernels import decode_layer as dl

    w, kw = _inputs("down")
    em = _emulated(monkeypatch, trigger=2)
    dl.gemv(w, **kw)
    assert all(p.events == ["trigger", "wait"] for p in em.programs)


# Qwen3-0.6B's one-row launches by projection (LAUNCHES' entries as fused_decode makes them at batch 1).
PROJECTION_LAUNCHES = {"qkv": "qkv", "o_proj": "o_proj, merging", "gate_up": "gate_up", "down": "down"}


@pytest.mark.parametrize("knob, served", [("0", set()), ("1", set(PROJECTION_LAUNCHES)),
                                          ("split", {"o_proj", "down"}), ("o_proj", {"o_proj"}), ("down", {"down"}),
                                          ("qkv,gate_up,down", {"qkv", "gate_up", "down"}), ("gate_up", {"gate_up"}),
                                          ("down,gate_up,o_proj,qkv", set(PROJECTION_LAUNCHES))])
def test_the_knob_routes_its_launches(monkeypatch, knob, served):
    from engine.kernels import decode_layer as dl

    monkeypatch.setattr(dl, "SMEM_GEMV", knob)
    got = set()
    for proj, name in PROJECTION_LAUNCHES.items():
        N, K, split, _, _, norm, silu, *_ = LAUNCHES[name]
        w = torch.empty(2 * N if silu else N, K, dtype=torch.bfloat16)

        def serves(dev, M, proj=proj):
            return dl._smem_serves(torch.device(dev), M, N, K, K // split, w, norm=norm, silu=silu, one_dtype=True,
                                   proj=proj)
        assert not serves("cpu", 1) and not serves("cuda", 2) and not serves("cuda", 1, proj="")
        if serves("cuda", 1):
            got.add(proj)
    assert got == served


def test_a_triton_without_gluon_leaves_every_launch_to_triton(monkeypatch):
    """The default routes down to Gluon on CUDA; where the installed Triton has no Gluon, down stays on the Triton
    program instead of failing the step."""
    import engine.kernels
    from engine.kernels import decode_layer as dl

    # (None in sys.modules: importing the module raises ImportError, as smem_gemv's Gluon import would)
    monkeypatch.delattr(engine.kernels, "smem_gemv", raising=False)
    monkeypatch.setitem(sys.modules, "engine.kernels.smem_gemv", None)
    monkeypatch.setattr(dl, "SMEM_GEMV", "down")
    N, K, split, _, _, norm, silu, *_ = LAUNCHES["down"]
    assert not dl._smem_serves(torch.device("cuda"), 1, N, K, K // split, torch.empty(N, K, dtype=torch.bfloat16),
                               norm=norm, silu=silu, one_dtype=True, proj="down")


def test_the_knob_defaults_to_every_projection_but_o_proj_the_measured_win():
    import os

    from engine.kernels import decode_layer as dl

    if "LABKIT_DECODE_SMEM_GEMV" in os.environ:
        pytest.skip("the knob is set in this environment")
    # (0.965x batch 1 against down alone on an H100, three rounds; docs/perf.md session 38)
    assert set(dl.smem_route(dl.SMEM_GEMV)) == {"qkv", "gate_up", "down"}


@pytest.mark.parametrize("bad", ["2", "qkv,qkv", "qkv,mlp", "qkv,", ""])
def test_a_bad_knob_is_refused_by_name(bad):
    import subprocess
    import sys

    env = dict(__import__("os").environ, LABKIT_DECODE_SMEM_GEMV=bad)
    r = subprocess.run([sys.executable, "-c", "import engine.kernels.decode_layer"], env=env, capture_output=True,
                       text=True)
    assert r.returncode != 0, bad
    assert ("LABKIT_DECODE_SMEM_GEMV: one of 0, 1, split, o_proj, down, or projections joined by commas, each once "
            f"(qkv,o_proj,gate_up,down), got {bad!r}") in r.stderr
