"""LABKIT_DECODE_ROW_LAYOUT: a one-row GEMV program's weight tile held with its warps on whole rows
(engine/kernels/decode_layer.py: _one_row_tile, row_chunk) against the unfused arithmetic and against the tile as
Triton lays it out ("k"). On a CPU the kernels run in Triton's interpreter (conftest.py): the layout itself is the
GPU compiler's, but the arithmetic here is the kernel's (the chunks, the warps' rows, the input made once a warp,
the norm's statistics, the residual written once)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine import fused_decode  # noqa: E402
from engine.context import Context, DecodeMeta, reset_context, set_context  # noqa: E402
from engine.kernels import decode_layer  # noqa: E402
from engine.kernels.decode_layer import gemv, gemv_meta, row_chunk  # noqa: E402
from engine.layers import fused  # noqa: E402
from tests.test_fused_decode import _close, _prefilled, _rand, check_silu_gemv  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HALF = torch.bfloat16 if DEVICE == "cuda" else torch.float16  # the interpreter has no bfloat16


def _rows_layout(monkeypatch, chunk, block_n=16, warps=4, layout="rows"):
    monkeypatch.setattr(decode_layer, "ROW_LAYOUT", layout)
    monkeypatch.setattr(decode_layer, "ROW_CHUNK", chunk)
    monkeypatch.setattr(decode_layer, "_BLOCK_N", block_n)
    monkeypatch.setattr(decode_layer, "_WARPS_ONE_ROW", warps)


def _meta(M, N, K, split, **kw):
    kw = dict(s_in=0, residual=False, norm=False, silu=False, partials_out=split > 1, dtype=torch.bfloat16,
              use_pdl=False, trigger=0) | kw
    return gemv_meta(M, N, K, split, **kw)[1]


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
# chunk 32: a 256-column range in 8 chunks; block_n 32 at 4 warps: 8 rows a warp; 2 warps: 8 a warp at 16 rows
@pytest.mark.parametrize("chunk, block_n, warps", [(32, 16, 4), (256, 16, 4), (64, 32, 4), (32, 16, 2)])
def test_one_row_with_its_warps_on_rows_is_add_rms_norm_then_matmul(dtype, chunk, block_n, warps, monkeypatch):
    _rows_layout(monkeypatch, chunk, block_n, warps)
    K, N, S = 256, 40, 3  # 40 rows: the last tile's rows past N masked
    assert _meta(1, N, K, 1, s_in=S, residual=True, norm=True)["ROW_CW"] == min(chunk, K)
    parts = _rand(S, 1, K, seed=1)
    residual = _rand(1, K, dtype=dtype, seed=2)
    nw = _rand(K, dtype=dtype, seed=3) + 1
    w = _rand(N, K, scale=K ** -0.5, dtype=dtype, seed=4)
    y, res = gemv(w, partials=parts, residual=residual, norm_weight=nw, eps=1e-6)
    normed, want_res = fused.add_rms_norm(parts.sum(0).to(dtype), residual, nw, 1e-6)
    assert torch.equal(res, want_res)  # the new residual stream: one row, written once, rounded as unfused
    _close(y, normed.float() @ w.float().T, dtype)
    monkeypatch.setattr(decode_layer, "ROW_LAYOUT", "k")
    y_k, _ = gemv(w, partials=parts, residual=residual, norm_weight=nw, eps=1e-6)
    # the same products in another float32 order: a model-dtype rounding apart at most
    _close(y, y_k, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
@pytest.mark.parametrize("chunk", [16, 128])
def test_one_row_silu_epilogue_with_its_warps_on_rows(dtype, chunk, monkeypatch):
    _rows_layout(monkeypatch, chunk)
    assert _meta(1, 48, 128, 1, norm=True, silu=True)["ROW_CW"] == chunk
    check_silu_gemv(dtype, 1, K=128, I=48)


@pytest.mark.parametrize("split", [None, 1, 2, 4])
@pytest.mark.parametrize("chunk, block_n", [(32, 16), (64, 32)])
def test_one_row_split_k_partials_with_its_warps_on_rows(split, chunk, block_n, monkeypatch):
    """Each split's program reads its own K range (pid_k * KS on): a range read from 0, or another's, differs."""
    _rows_layout(monkeypatch, chunk, block_n)
    K, N = 256, 24
    assert _meta(1, N, K, split or 1)["ROW_CW"] == min(chunk, K // (split or 1))
    x = _rand(1, K, seed=8)
    w = _rand(N, K, scale=K ** -0.5, seed=9)
    y = gemv(w, x=x, split=split)
    if split is not None:
        for s in range(split):  # each partial is its own range's product
            cols = slice(s * K // split, (s + 1) * K // split)
            _close(y[s], x[:, cols] @ w[:, cols].T, torch.float32)
        y = y.sum(0)
    _close(y, x @ w.T, torch.float32)


def test_the_rows_layout_takes_only_one_row_ranges_it_can_hold(monkeypatch):
    """Qwen3-0.6B's GEMVs at one row (hidden 1024, q 2048, intermediate 3072; o_proj 4 splits, down 3)."""
    _rows_layout(monkeypatch, 256)
    assert _meta(1, 4096, 1024, 1, s_in=3, residual=True, norm=True)["ROW_CW"] == 256   # q/k/v
    assert _meta(1, 3072, 1024, 1, s_in=4, residual=True, norm=True, silu=True)["ROW_CW"] == 256  # gate/up
    assert _meta(1, 1024, 3072, 3)["ROW_CW"] == 256                                     # down: 1024 a split
    assert _meta(1, 1024, 2048, 4)["ROW_CW"] == 256                                     # o_proj, no merge
    assert _meta(1, 1024, 2048, 4, attn=(4, 128, 128))["ROW_CW"] == 0                   # o_proj merging
    assert _meta(2, 4096, 1024, 1, s_in=3, residual=True, norm=True)["ROW_CW"] == 0     # two rows
    assert _meta(1, 1024, 2048, 2, norm=True)["ROW_CW"] == 0      # the norm's row past the range
    assert _meta(1, 40, 192, 1)["ROW_CW"] == 0                    # a masked range (192 in a 256 tile)
    assert _meta(1, 40, 96, 1)["ROW_CW"] == 0
    assert _meta(1, 40, 64, 1)["ROW_CW"] == 64                    # a range shorter than a chunk: one chunk
    assert _meta(1, 1024, 3072, 3)["ROW_G"] == 4                  # the launch's warps
    monkeypatch.setattr(decode_layer, "ROW_LAYOUT", "plain")      # rows only where no norm is made
    assert _meta(1, 4096, 1024, 1, s_in=3, residual=True, norm=True)["ROW_CW"] == 0
    assert _meta(1, 1024, 3072, 3)["ROW_CW"] == 256
    monkeypatch.setattr(decode_layer, "ROW_LAYOUT", "k")
    assert _meta(1, 1024, 3072, 3)["ROW_CW"] == 0
    assert row_chunk(1, 3072, 1024, 1024, False, False) == 0


@pytest.mark.parametrize("dtype, splits", [("float32", 1), ("float16", 3), ("float32", 2)])
@pytest.mark.parametrize("layout, chunk", [("rows", 32), ("rows", 128), ("plain", 64)])
def test_a_fused_one_row_step_with_its_warps_on_rows_matches_the_unfused_step(tiny_model, dtype, splits, layout,
                                                                                chunk, monkeypatch):
    _rows_layout(monkeypatch, chunk, layout=layout)
    held = []
    meta = decode_layer.gemv_meta
    monkeypatch.setattr(decode_layer, "gemv_meta", lambda *a, **k: held.append(meta(*a, **k)[1]["ROW_CW"])
                        or meta(*a, **k))
    llm, dec, pool = _prefilled(tiny_model, dtype)
    runner = llm.model_runner
    model = runner.model.model
    d = {k: v[:1] for k, v in dec.items()}
    with torch.inference_mode():
        set_context(Context(d["slots"], DecodeMeta(1, d["ctx"], d["tables"], d["ctx"].tolist(), num_splits=splits)))
        want = model(d["ids"], d["pos"])
        want_pool = runner.kv_cache.clone()
        runner.kv_cache.copy_(pool)
        got = fused_decode.forward(model, d["ids"], d["pos"])
        reset_context()
    # the tiny model (hidden 128, intermediate 256): q/k/v and gate/up ("rows" only), down, and o_proj where it
    # does not merge attention's parts, all with their warps on rows
    assert sum(c > 0 for c in held) == len(model.layers) * (4 if layout == "rows" else 2) - (
        len(model.layers) if splits > 1 else 0)
    torch_dtype = getattr(torch, dtype)
    _close(got, want, torch_dtype)
    _close(runner.kv_cache.float(), want_pool.float(), torch_dtype)
    llm.exit()
