"""The environment knobs a device sweep sets (docs/perf.md, session 13): each read as documented, a bad value
refused with its variable named, and the defaults the engine was measured with."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


def _import_with(env: dict, code: str) -> subprocess.CompletedProcess:
    """A fresh interpreter (the knobs are read once, at import) with `env` added."""
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_the_defaults_are_the_measured_ones():
    from engine import decode_order, kv_layout
    from engine.graph_dispatch import GRAPH_SAMPLE_BS, SHORT_CONTEXT, SHORT_SPLITS
    from engine.kernels import decode_layer, gumbel_sampler

    if any(k.startswith(("LABKIT_DECODE", "LABKIT_GRAPH", "LABKIT_GUMBEL", "LABKIT_FP8")) for k in os.environ):
        pytest.skip("a knob is set in this environment")
    assert kv_layout.FP8_V_TRANSPOSED is True  # (nano FP8 +22% on the H200: docs/perf.md, session 19)
    assert decode_layer.PDL_MODE == "early"  # (batch 1 0.84 ms against late's 0.95: docs/perf.md, session 11)
    assert decode_order.DECODE_ORDER == "longest-first"  # (nano FP8 +6% on the H200: docs/perf.md, session 19)
    assert (decode_layer._BLOCK_N, decode_layer._WARPS, decode_layer._WARPS_ONE_ROW, decode_layer.ATTN_BLOCK_N,
            decode_layer.MERGE_PDL, decode_layer.NORM_CHUNK, decode_layer.K_CHUNK, SHORT_CONTEXT, SHORT_SPLITS,
            decode_layer.MERGE_IN_GEMV, decode_layer.SPLIT_BLOCK_N, decode_layer.O_PROJ_PDL, GRAPH_SAMPLE_BS,
            gumbel_sampler.PROGRAMS_PER_SM, gumbel_sampler.NOISE, decode_layer.GATE_UP_WARPS,
            decode_layer.FMA_ROWS, decode_layer.MERGE_ROWS, decode_layer.NEW_KV, decode_layer.MERGE_CTX) == (
        16, 8, 4, 128, "1", 128, 128, 512, 4, "1", 128, "", 1, 8, "hash", 0, 4, 2, "first", "early")
    assert decode_layer.ATTN_WARPS == 4
    assert decode_layer.ATTN_SMEM_KIB == 0  # (a device sweep's knob: docs/perf.md, session 31)
    assert decode_layer.ROW_LAYOUT == "k"  # (the rows layout: a device sweep's knob, docs/perf.md, session 29)
    from engine.kernels import probe
    assert probe.ENABLED == "0"  # (the in-kernel probe: a diagnostic, never the engine's timing)


def test_each_knob_is_read_when_set():
    res = _import_with({"LABKIT_DECODE_GEMV": "32,4", "LABKIT_DECODE_BLOCK_N": "64", "LABKIT_DECODE_MERGE_PDL": "0",
                        "LABKIT_DECODE_SHORT_CONTEXT": "0"},
                       "from engine.kernels import decode_layer as d; from engine import graph_dispatch as g; "
                       "print(d._BLOCK_N, d._WARPS, d._WARPS_ONE_ROW, d.ATTN_BLOCK_N, d.MERGE_PDL, g.SHORT_CONTEXT)")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["32", "4", "4", "64", "0", "0"]  # (two values: batch 1 takes the same warps)
    res = _import_with({"LABKIT_DECODE_GEMV": "64,8,2", "LABKIT_DECODE_NORM_CHUNK": "128"},
                       "from engine.kernels import decode_layer as d; "
                       "print(d._BLOCK_N, d._WARPS, d._WARPS_ONE_ROW, d.NORM_CHUNK)")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["64", "8", "2", "128"]
    res = _import_with({"LABKIT_GUMBEL_PER_SM": "2", "LABKIT_GUMBEL_NOISE": "philox"},
                       "from engine.kernels import gumbel_sampler as s; print(s.PROGRAMS_PER_SM, s.NOISE)")
    assert res.returncode == 0 and res.stdout.split() == ["2", "philox"], res.stderr
    res = _import_with({"LABKIT_GRAPH_SAMPLE_BS": "16"},
                       "from engine import graph_dispatch as g; print(g.GRAPH_SAMPLE_BS)")
    assert res.returncode == 0 and res.stdout.split() == ["16"], res.stderr
    res = _import_with({"LABKIT_DECODE_SHORT_SPLITS": "8", "LABKIT_DECODE_MERGE_IN_GEMV": "0",
                        "LABKIT_DECODE_BLOCK_N": "32"},
                       "from engine import graph_dispatch as g; from engine.kernels import decode_layer as d; "
                       "print(g.SHORT_SPLITS, d.MERGE_IN_GEMV, d.SPLIT_BLOCK_N, "
                       "[g.short_splits(b) for b in (1, 2, 4, 8, 16)])")
    assert res.returncode == 0, res.stderr
    # (fewer splits as rows add programs; a split's tile is the one-split tile unless set apart)
    assert res.stdout.strip().split(maxsplit=3) == ["8", "0", "32", "[8, 4, 2, 1, 1]"]
    res = _import_with({"LABKIT_DECODE_O_PROJ_PDL": "first"},
                       "from engine.kernels import decode_layer as d; print(d.O_PROJ_PDL or '-', d.PDL_MODE)")
    assert res.returncode == 0 and res.stdout.split() == ["first", "early"], res.stderr
    res = _import_with({"LABKIT_DECODE_GATE_UP_WARPS": "8"},
                       "from engine.kernels import decode_layer as d; print(d.GATE_UP_WARPS, d._WARPS_ONE_ROW)")
    assert res.returncode == 0 and res.stdout.split() == ["8", "4"], res.stderr
    res = _import_with({"LABKIT_DECODE_QKV_WARPS": "8"},
                       "from engine.kernels import decode_layer as d; print(d.QKV_WARPS, d._WARPS_ONE_ROW)")
    assert res.returncode == 0 and res.stdout.split() == ["8", "4"], res.stderr
    res = _import_with({"LABKIT_DECODE_ATTN_SMEM": "120", "LABKIT_DECODE_ATTN_WARPS": "8"},
                       "from engine.kernels import decode_layer as d; print(d.ATTN_SMEM_KIB, d.ATTN_WARPS)")
    assert res.returncode == 0 and res.stdout.split() == ["120", "8"], res.stderr
    res = _import_with({"LABKIT_DECODE_FMA_ROWS": "4"},
                       "from engine.kernels import decode_layer as d; print(d.FMA_ROWS)")
    assert res.returncode == 0 and res.stdout.split() == ["4"], res.stderr
    res = _import_with({"LABKIT_DECODE_SPLIT_BLOCK_N": "64"},
                       "from engine.kernels import decode_layer as d; print(d.ATTN_BLOCK_N, d.SPLIT_BLOCK_N)")
    assert res.returncode == 0 and res.stdout.split() == ["128", "64"], res.stderr


@pytest.mark.parametrize("mode, trigger", [("first", 2), ("early", 1), ("late", 0), ("off", None)])
def test_each_pdl_mode_launches_with_its_trigger_on_cuda_and_none_elsewhere(monkeypatch, mode, trigger):
    """LABKIT_DECODE_PDL picks where the fused kernels let their successor launch (tests/test_pdl_trigger.py reads
    the compiled code); a launch off CUDA never uses PDL."""
    res = _import_with({"LABKIT_DECODE_PDL": mode}, "from engine.kernels import decode_layer as d; print(d.PDL_MODE)")
    assert res.returncode == 0 and res.stdout.split() == [mode], res.stderr
    from engine.kernels import decode_layer as dl

    monkeypatch.setattr(dl, "PDL_MODE", mode)
    cuda = dl._pdl(torch.device("cuda"))
    assert cuda == ((True, trigger, {"launch_pdl": True}) if trigger is not None else (False, 0, {}))
    assert dl._pdl(torch.device("cpu")) == (False, 0, {})
    # one launch's own point (LABKIT_DECODE_O_PROJ_PDL) where PDL is on; none where it is off
    assert dl._pdl(torch.device("cuda"), "first")[:2] == ((True, 2) if trigger is not None else (False, 0))
    assert dl._pdl(torch.device("cpu"), "first") == (False, 0, {})


INT_KNOBS = ("LABKIT_GUMBEL_PER_SM", "LABKIT_DECODE_BLOCK_N", "LABKIT_DECODE_SPLIT_BLOCK_N", "LABKIT_DECODE_FMA_ROWS",
             "LABKIT_DECODE_MERGE_ROWS", "LABKIT_DECODE_GATE_UP_WARPS", "LABKIT_DECODE_QKV_WARPS",
             "LABKIT_DECODE_ATTN_SMEM", "LABKIT_DECODE_ATTN_WARPS", "LABKIT_DECODE_NORM_CHUNK",
             "LABKIT_DECODE_K_CHUNK", "LABKIT_DECODE_SHORT_CONTEXT", "LABKIT_DECODE_SHORT_SPLITS",
             "LABKIT_GRAPH_SAMPLE_BS")


@pytest.mark.parametrize("var, value", [("LABKIT_DECODE_GEMV", "24,8"), ("LABKIT_DECODE_GEMV", "32"),
                                        ("LABKIT_DECODE_GEMV", "16,8,3"), ("LABKIT_DECODE_GEMV", "16,8,4,4"),
                                        ("LABKIT_DECODE_NORM_CHUNK", "100"),
                                        ("LABKIT_DECODE_BLOCK_N", "48"), ("LABKIT_DECODE_MERGE_PDL", "yes"),
                                        ("LABKIT_DECODE_SHORT_CONTEXT", "-1"), ("LABKIT_GRAPH_SAMPLE_BS", "3"),
                                        ("LABKIT_DECODE_K_CHUNK", "100"),
                                        ("LABKIT_GUMBEL_PER_SM", "3"), ("LABKIT_GUMBEL_NOISE", "xorshift"),
                                        ("LABKIT_FP8_V_TRANSPOSED", "yes"),
                                        ("LABKIT_DECODE_ORDER", "longest"), ("LABKIT_DECODE_PDL", "start"),
                                        ("LABKIT_DECODE_SHORT_SPLITS", "3"), ("LABKIT_DECODE_MERGE_IN_GEMV", "2"),
                                        ("LABKIT_DECODE_SPLIT_BLOCK_N", "48"), ("LABKIT_DECODE_O_PROJ_PDL", "off"),
                                        ("LABKIT_DECODE_GATE_UP_WARPS", "3"), ("LABKIT_DECODE_GATE_UP_WARPS", "32"),
                                        ("LABKIT_DECODE_FMA_ROWS", "3"), ("LABKIT_DECODE_FMA_ROWS", "32"),
                                        ("LABKIT_DECODE_MERGE_ROWS", "3"),
                                        ("LABKIT_DECODE_MERGE_ROWS", "0"), ("LABKIT_DECODE_NEW_KV", "early"),
                                        ("LABKIT_DECODE_MERGE_CTX", "first"), ("LABKIT_DECODE_PROBE", "yes"),
                                        ("LABKIT_DECODE_ROW_LAYOUT", "cols"), ("LABKIT_DECODE_QKV_WARPS", "3"),
                                        ("LABKIT_DECODE_ATTN_SMEM", "201"), ("LABKIT_DECODE_ATTN_SMEM", "-1"),
                                        ("LABKIT_DECODE_ATTN_SMEM", "72k"),
                                        ("LABKIT_DECODE_ATTN_WARPS", "2"), ("LABKIT_DECODE_ATTN_WARPS", "16")] + [
    # a value that is not an integer, for every integer knob
    (var, "4x") for var in INT_KNOBS])
def test_a_bad_knob_is_refused_with_its_name(var, value):
    res = _import_with({var: value}, "import engine.kernels.decode_layer, engine.graph_dispatch, "
                                     "engine.kernels.gumbel_sampler, engine.kv_layout, engine.decode_order, "
                                     "engine.kernels.probe")
    # the error itself names the variable (what the CLI prints), not only the traceback's source line
    assert res.returncode != 0 and var in res.stderr.strip().splitlines()[-1], res.stderr[-600:]


def test_with_short_context_off_no_step_replays_the_one_split_graph(monkeypatch):
    from engine import graph_dispatch

    d = graph_dispatch.GraphDispatch(decode=(1, 2), short=frozenset({1, 2}))
    assert d.one_split(1, [5])
    monkeypatch.setattr(graph_dispatch, "SHORT_CONTEXT", 0)
    assert not d.one_split(1, [1]) and not d.one_split(2, [5, 9])


class _Launched(Exception):
    """Raised by a kernel stand-in in place of launching: the launch's keyword arguments."""


def _launches(monkeypatch, module, kernel: str) -> list[dict]:
    """Stand `module.kernel[grid](...)` in: each launch records its keyword arguments and raises _Launched."""
    seen: list[dict] = []

    def launch(*args, **kwargs):
        seen.append(kwargs)
        raise _Launched

    class Grid:
        def __getitem__(self, grid):
            return launch

    monkeypatch.setattr(module, kernel, Grid())
    return seen


def test_an_fp8_pool_launches_with_the_fp8_knobs_and_a_bf16_pool_with_the_defaults(monkeypatch):
    """paged_decode takes its launch knobs by the pool's dtype (a planted swap would time the wrong kernel)."""
    from engine.kernels import decode_attention as da

    seen = _launches(monkeypatch, da, "_decode_split_kernel")
    monkeypatch.setattr(da, "FP8_KNOBS", {**da.FP8_DEFAULTS, "block_n": 64})
    q = torch.zeros(1, 2, 16)
    tables = torch.zeros(1, 1, dtype=torch.int32)
    lens = torch.ones(1, dtype=torch.int32)
    for dtype in (torch.float32, torch.float8_e4m3fn):
        cache = torch.zeros(1, 1, 128, 16).to(dtype)
        with pytest.raises(_Launched):
            da.paged_decode(q, cache, cache, tables, lens, 1.0, 1)
    assert [k["BLOCK_N"] for k in seen] == [da.DEFAULTS["block_n"], 64]


@pytest.mark.parametrize("rows, warps", [(1, 4), (2, 4), (4, 4), (5, 8), (16, 8)])
def test_a_one_row_gemv_launches_with_the_batch_1_warps(monkeypatch, rows, warps):
    """Four warps at batch 1 and for rows taken one at a time (FMA path, up to FMA_ROWS: 4 by default), eight for a
    tile of rows (session 14: four there spill, 6.8x slower)."""
    from engine.kernels import decode_layer as dl

    seen = _launches(monkeypatch, dl, "_gemv_kernel")
    with pytest.raises(_Launched):
        dl.gemv(torch.zeros(32, 64), x=torch.zeros(rows, 64))
    assert [k["num_warps"] for k in seen] == [warps]


@pytest.mark.parametrize("knob, rows, chunk", [(128, 1, 1024), (128, 2, 128), (128, 16, 128), (0, 16, 1024),
                                              (256, 4, 256)])
def test_the_norm_chunk_applies_to_a_tile_of_rows_only(monkeypatch, knob, rows, chunk):
    """LABKIT_DECODE_NORM_CHUNK is for batches 2-16 (their GEMV tile spills); batch 1 keeps whole rows (a chunk of
    all K columns), and so does every batch at 0."""
    from engine.kernels import decode_layer as dl

    monkeypatch.setattr(dl, "FMA_ROWS", 1)  # (2-16 rows on the tile path)
    seen = _launches(monkeypatch, dl, "_gemv_kernel")
    monkeypatch.setattr(dl, "NORM_CHUNK", knob)
    with pytest.raises(_Launched):
        dl.gemv(torch.zeros(32, 1024), x=torch.zeros(rows, 1024), norm_weight=torch.ones(1024))
    assert [k["NORM_CHUNK"] for k in seen] == [chunk]


@pytest.mark.parametrize("knob, rows, chunk", [(64, 1, 0), (64, 2, 64), (64, 16, 64), (0, 16, 0), (256, 4, 256)])
def test_the_k_chunk_applies_to_a_tile_of_rows_only(monkeypatch, knob, rows, chunk):
    """LABKIT_DECODE_K_CHUNK is for batches 2-16 (their whole K range spills); batch 1 loads its whole range
    before the PDL wait (0)."""
    from engine.kernels import decode_layer as dl

    monkeypatch.setattr(dl, "FMA_ROWS", 1)  # (2-16 rows on the tile path)
    seen = _launches(monkeypatch, dl, "_gemv_kernel")
    monkeypatch.setattr(dl, "K_CHUNK", knob)
    with pytest.raises(_Launched):
        dl.gemv(torch.zeros(32, 1024), x=torch.zeros(rows, 1024), split=4)  # a range of 256 columns
    assert [k["K_CHUNK"] for k in seen] == [chunk]


@pytest.mark.parametrize("splits, block_n", [(1, 128), (2, 32), (8, 32)])
def test_a_split_attention_launches_with_the_split_tile(monkeypatch, splits, block_n):
    """LABKIT_DECODE_SPLIT_BLOCK_N is a split context's key tile; one split keeps LABKIT_DECODE_BLOCK_N's."""
    from engine.kernels import decode_layer as dl

    seen = _launches(monkeypatch, dl, "_qkv_attention_kernel")
    monkeypatch.setattr(dl, "SPLIT_BLOCK_N", 32)
    pool = torch.zeros(2, 1, 128, 16)
    ones = torch.ones(1, dtype=torch.int32)
    with pytest.raises(_Launched):
        dl.qkv_attention(torch.zeros(1, 64), ones, torch.zeros(8, 16), torch.ones(16), torch.ones(16), 1e-6, ones,
                         pool, pool, torch.zeros(1, 1, dtype=torch.int32), ones, 1.0, splits, 2, 1)
    assert [k["BLOCK_N"] for k in seen] == [block_n]


@pytest.mark.parametrize("warps", [4, 8])
def test_attention_warps_reach_the_attention_launch(monkeypatch, warps):
    """LABKIT_DECODE_ATTN_WARPS: the fused decode attention's warps, split context or not."""
    from engine.kernels import decode_layer as dl

    seen = _launches(monkeypatch, dl, "_qkv_attention_kernel")
    monkeypatch.setattr(dl, "ATTN_WARPS", warps)
    pool = torch.zeros(2, 1, 128, 16)
    ones = torch.ones(1, dtype=torch.int32)
    for splits in (1, 4):
        with pytest.raises(_Launched):
            dl.qkv_attention(torch.zeros(1, 64), ones, torch.zeros(8, 16), torch.ones(16), torch.ones(16), 1e-6,
                             ones, pool, pool, torch.zeros(1, 1, dtype=torch.int32), ones, 1.0, splits, 2, 1)
    assert [k["num_warps"] for k in seen] == [warps, warps]


@pytest.mark.parametrize("short, context, bs, long_splits, want", [
    (4, 512, 1, 32, 4), (4, 512, 2, 17, 2), (4, 512, 4, 9, 1), (4, 512, 16, 3, 1), (4, 512, 1, 4, None),
    (4, 512, 1, 5, 4), (1, 512, 16, 1, None), (1, 512, 16, 3, 1), (4, 0, 1, 32, None), (8, 512, 2, 17, 4)])
def test_a_bucket_gets_a_short_context_graph_only_with_fewer_splits_than_its_long_one(monkeypatch, short, context, bs,
                                                                                       long_splits, want):
    """ModelRunner.capture_cudagraph captures a second, short-context graph of short_graph_splits' count: none
    when SHORT_CONTEXT is 0 or the long-context graph has no more splits (it would be the same graph)."""
    from engine import graph_dispatch

    monkeypatch.setattr(graph_dispatch, "SHORT_SPLITS", short)
    monkeypatch.setattr(graph_dispatch, "SHORT_CONTEXT", context)
    assert graph_dispatch.short_graph_splits(bs, long_splits) == want


@pytest.mark.parametrize("gate_up_warps", [0, 2, 16])
def test_gate_up_warps_reach_the_one_row_gate_up_launch_and_no_other(monkeypatch, gate_up_warps):
    """LABKIT_DECODE_GATE_UP_WARPS sets the warps of gate/up's GEMV (SiLU) at one row; every other launch keeps
    LABKIT_DECODE_GEMV's warps (a tile of rows _WARPS, one row _WARPS_ONE_ROW)."""
    from engine.kernels import decode_layer as dl

    monkeypatch.setattr(dl, "FMA_ROWS", 1)  # (2-16 rows on the tile path)
    monkeypatch.setattr(dl, "GATE_UP_WARPS", gate_up_warps)
    monkeypatch.setattr(dl, "_WARPS", 8)
    monkeypatch.setattr(dl, "_WARPS_ONE_ROW", 4)

    def warps(rows, silu):
        return dl.gemv_meta(rows, 3072, 1024, 1, s_in=4, residual=True, norm=True, silu=silu, partials_out=False,
                            dtype=torch.bfloat16, use_pdl=False, trigger=0)[1]["num_warps"]
    assert warps(1, True) == (gate_up_warps or 4)
    assert [warps(1, False), warps(4, True), warps(16, True), warps(2, False)] == [4, 8, 8, 8]


@pytest.mark.parametrize("qkv_warps", [0, 2, 8])
def test_qkv_warps_reach_the_one_row_qkv_launch_and_no_other(monkeypatch, qkv_warps):
    """LABKIT_DECODE_QKV_WARPS sets the warps of q/k/v's GEMV (the norm without SiLU) at one row and on the per-row
    path; gate/up, o_proj, down and a tile of rows keep LABKIT_DECODE_GEMV's (or gate/up's own)."""
    from engine.kernels import decode_layer as dl

    monkeypatch.setattr(dl, "FMA_ROWS", 2)
    monkeypatch.setattr(dl, "QKV_WARPS", qkv_warps)
    monkeypatch.setattr(dl, "GATE_UP_WARPS", 0)
    monkeypatch.setattr(dl, "_WARPS", 8)
    monkeypatch.setattr(dl, "_WARPS_ONE_ROW", 4)

    def warps(rows, norm, silu):
        return dl.gemv_meta(rows, 4096, 1024, 1, s_in=3 if norm else 0, residual=norm, norm=norm, silu=silu,
                            partials_out=not norm, dtype=torch.bfloat16, use_pdl=False, trigger=0)[1]["num_warps"]
    assert warps(1, True, False) == warps(2, True, False) == (qkv_warps or 4)
    assert [warps(1, True, True), warps(1, False, False), warps(4, True, False), warps(16, True, False)] == [4, 4, 8, 8]


class _Compiled:
    """What reserve_shared reads and writes of a compiled Triton kernel: the launcher's (warps, CTAs, shared bytes)."""
    def __init__(self, shared):
        self.packed_metadata = (4, 1, shared)
        self.function = 0


@pytest.mark.parametrize("own, asked, launched", [(72, 120, 120), (72, 72, 72), (72, 64, 72), (60, 61, 61)])
def test_reserve_shared_raises_a_launch_to_what_is_asked_and_never_lowers_it(own, asked, launched):
    """LABKIT_DECODE_ATTN_SMEM's reservation: a later launch asks for max(the kernel's own, asked) bytes of shared
    memory a program, its warps and CTAs as they were; True only when that changed."""
    from engine.kernels.decode_layer import reserve_shared

    own, asked, launched = own * 1024, asked * 1024, launched * 1024  # (KiB above)
    k = _Compiled(own)
    assert reserve_shared(k, asked) is (launched != own)
    assert k.packed_metadata == (4, 1, launched)
    assert reserve_shared(k, asked) is False  # (a second launch finds it done)


@pytest.mark.parametrize("fma_rows", [1, 4])
def test_fma_rows_send_rows_up_to_it_through_the_one_row_arithmetic(monkeypatch, fma_rows):
    """LABKIT_DECODE_FMA_ROWS: 2..FMA_ROWS rows take the per-row path (their weight tile whole before the wait, the
    FMA sums, one-row warps); one row always the one-row path; more rows the tensor-core tile in K chunks."""
    from engine.kernels import decode_layer as dl

    monkeypatch.setattr(dl, "FMA_ROWS", fma_rows)
    monkeypatch.setattr(dl, "_WARPS", 8)
    monkeypatch.setattr(dl, "_WARPS_ONE_ROW", 4)
    monkeypatch.setattr(dl, "K_CHUNK", 128)

    def meta(rows):
        m = dl.gemv_meta(rows, 1024, 1024, 1, s_in=0, residual=False, norm=False, silu=False, partials_out=False,
                         dtype=torch.bfloat16, use_pdl=False, trigger=0)[1]
        return m["PER_ROW"], m["BLOCK_M"], m["K_CHUNK"], m["num_warps"]
    assert meta(1) == (False, 1, 0, 4)
    for rows in (2, 3, 4, 5, 16):
        per_row = rows <= fma_rows
        assert meta(rows) == ((True, 1 << (rows - 1).bit_length(), 0, 4) if per_row else (False, 16, 128, 8))


def test_session_26s_and_29s_knobs_are_read_from_the_environment():
    """LABKIT_DECODE_MERGE_ROWS, _NEW_KV, _MERGE_CTX and _ROW_LAYOUT set to values other than their defaults
    reach the module."""
    res = _import_with({"LABKIT_DECODE_MERGE_ROWS": "4", "LABKIT_DECODE_NEW_KV": "last",
                        "LABKIT_DECODE_MERGE_CTX": "late", "LABKIT_DECODE_ROW_LAYOUT": "plain"},
                       "from engine.kernels import decode_layer as d; "
                       "print(d.MERGE_ROWS, d.NEW_KV, d.MERGE_CTX, d.ROW_LAYOUT)")
    assert res.returncode == 0 and res.stdout.split() == ["4", "last", "late", "plain"], res.stderr


@pytest.mark.parametrize("new_kv", ["last", "first"])
def test_new_kv_reaches_the_attention_kernel(monkeypatch, new_kv):
    """LABKIT_DECODE_NEW_KV: the attention kernel is compiled with this token's K/V made first or last."""
    from engine.kernels import decode_layer as dl

    monkeypatch.setattr(dl, "NEW_KV", new_kv)
    seen = []
    real = dl._qkv_attention_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.append(kw["NEW_FIRST"])
                return real[grid](*args, **kw)
            return launch
    monkeypatch.setattr(dl, "_qkv_attention_kernel", Spy())
    H, KV, D, B = 2, 1, 16, 16
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    qkv = torch.randn(1, (H + 2 * KV) * D, device=dev)
    k_cache, v_cache = torch.zeros(2, KV, B, D, device=dev), torch.zeros(2, KV, B, D, device=dev)
    cos_sin = torch.randn(64, D, device=dev)
    i32 = dict(dtype=torch.int32, device=dev)
    dl.qkv_attention(qkv, torch.tensor([3], device=dev), cos_sin, torch.ones(D, device=dev),
                     torch.ones(D, device=dev), 1e-6, torch.tensor([3], **i32), k_cache, v_cache,
                     torch.tensor([[0]], **i32), torch.tensor([4], **i32), D ** -0.5, 1, H, KV)
    assert seen == [new_kv == "first"]
    assert k_cache[0, 0, 3].abs().sum() > 0  # (this token's K written either way)


@pytest.mark.parametrize("merge_ctx", ["early", "late"])
def test_merge_ctx_reaches_the_gemv(monkeypatch, merge_ctx):
    """LABKIT_DECODE_MERGE_CTX: the GEMV is compiled to load the context lengths before its PDL wait or after."""
    from engine.kernels import decode_layer as dl

    monkeypatch.setattr(dl, "MERGE_CTX", merge_ctx)
    meta = dl.gemv_meta(1, 1024, 2048, 4, s_in=0, residual=False, norm=False, silu=False, partials_out=True,
                        dtype=torch.bfloat16, use_pdl=True, trigger=1, attn=(4, 128, 128))[1]
    assert meta["CTX_EARLY"] is (merge_ctx == "early")
