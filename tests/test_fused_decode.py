"""The fused decode kernels (engine/kernels/decode_layer.py) and the five-kernel layer (engine/fused_decode.py)
against the unfused path they replace: each kernel against engine/layers/fused.py's arithmetic, and a whole
decode step of the tiny model through both paths (its hidden states and the K/V it writes). On a CPU the kernels
run in Triton's interpreter (conftest.py), PDL compiled out."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from engine import LLM, fused_decode  # noqa: E402
from engine.context import Context, DecodeMeta, PrefillMeta, reset_context, set_context  # noqa: E402
from engine.kernels import decode_layer  # noqa: E402
from engine.kernels.decode_layer import gemv, partials_norm, split_for  # noqa: E402
from engine.layers import fused  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HALF = torch.bfloat16 if DEVICE == "cuda" else torch.float16  # the interpreter has no bfloat16


def _rand(*shape, scale=1.0, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


def _close(a, b, dtype):
    tol = 2e-5 if dtype == torch.float32 else 1e-2
    err = (a.double() - b.double()).abs().max().item()
    assert err <= tol * (1 + b.double().abs().max().item()), err


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
# (3: rows one at a time, LABKIT_DECODE_FMA_ROWS; 6: the tile)
@pytest.mark.parametrize("M", [1, 3, 6])
@pytest.mark.parametrize("rows, chunk, k_chunk", [(16, 0, 0), (32, 0, 0), (16, 64, 0), (16, 64, 32), (32, 0, 64)])
def test_gemv_with_partials_residual_and_norm_is_add_rms_norm_then_matmul(dtype, M, rows, chunk, k_chunk,
                                                                          monkeypatch):
    monkeypatch.setattr(decode_layer, "_BLOCK_N", rows)  # 40 rows: the last tile part masked either way
    monkeypatch.setattr(decode_layer, "NORM_CHUNK", chunk)  # 64: the norm's rows in 4 chunks, the last masked
    monkeypatch.setattr(decode_layer, "K_CHUNK", k_chunk)  # K = 192 in a 256 tile: 32 -> 8 chunks, the last 2 masked
    K, N, S = 192, 40, 3
    parts = _rand(S, M, K, seed=1)
    residual = _rand(M, K, dtype=dtype, seed=2)
    nw = _rand(K, dtype=dtype, seed=3) + 1
    w = _rand(N, K, scale=K ** -0.5, dtype=dtype, seed=4)
    y, res = gemv(w, partials=parts, residual=residual, norm_weight=nw, eps=1e-6)
    x = parts.sum(0).to(dtype)  # the unfused split-K reduce: float32 sum, one rounding
    normed, want_res = fused.add_rms_norm(x, residual, nw, 1e-6)
    assert torch.equal(res, want_res)  # the residual stream is the same sum, rounded the same way
    _close(y, normed.float() @ w.float().T, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
@pytest.mark.parametrize("M", [1, 5])
@pytest.mark.parametrize("chunk, k_chunk", [(0, 0), (16, 0), (16, 32)])
def test_gemv_silu_epilogue_is_silu_and_mul_of_gate_up(dtype, M, chunk, k_chunk, monkeypatch):
    monkeypatch.setattr(decode_layer, "NORM_CHUNK", chunk)
    monkeypatch.setattr(decode_layer, "K_CHUNK", k_chunk)  # K = 64: two chunks, gate and up each summed over both
    check_silu_gemv(dtype, M, K=64, I=48)


def check_silu_gemv(dtype, M, K, I):
    """gemv's SiLU epilogue over [gate; up] rows against rms_norm, the product and silu_and_mul unfused."""
    x = _rand(M, K, dtype=dtype, seed=5)
    nw = _rand(K, dtype=dtype, seed=6) + 1
    w = _rand(2 * I, K, scale=K ** -0.5, dtype=dtype, seed=7)
    y = gemv(w, x=x, norm_weight=nw, eps=1e-6, silu=True)
    gate_up = (fused.rms_norm(x, nw, 1e-6).float() @ w.float().T).to(dtype)
    _close(y, fused.silu_and_mul(gate_up), dtype)


@pytest.mark.parametrize("split", [None, 1, 2, 4])
@pytest.mark.parametrize("M", [1, 16])
@pytest.mark.parametrize("rows, k_chunk", [(16, 0), (64, 0), (16, 32)])
def test_gemv_split_k_partials_sum_to_the_product(split, M, rows, k_chunk, monkeypatch):
    monkeypatch.setattr(decode_layer, "_BLOCK_N", rows)  # 64: one program's tile is mostly past N (masked)
    monkeypatch.setattr(decode_layer, "K_CHUNK", k_chunk)  # each split's range (64-256 columns) in 32-column chunks
    K, N = 256, 24
    x = _rand(M, K, seed=8)
    w = _rand(N, K, scale=K ** -0.5, seed=9)
    y = gemv(w, x=x, split=split)
    if split is not None:
        assert y.shape == (split, M, N) and y.dtype == torch.float32
        y = y.sum(0)
    _close(y, x @ w.T, torch.float32)


def _attention_parts(B, H, S, D, ctx, block_n, seed=0):
    """Split parts as the attention kernel leaves them: a split past its row's context holds no keys (max -inf,
    sum 0, acc 0); the others random."""
    g = torch.Generator().manual_seed(seed)
    acc = torch.randn(B, H, S, D, generator=g) * 3
    ml = torch.randn(B, H, S, 2, generator=g) * 4
    ml[..., 1] = ml[..., 1].abs() + 0.25
    for b, n in enumerate(ctx):
        tiles = -(-n // block_n)
        span = -(-tiles // S) * block_n  # keys a split covers
        for s in range(S):
            if not s * span < n:
                acc[b, :, s], ml[b, :, s, 0], ml[b, :, s, 1] = 0.0, float("-inf"), 0.0
    return acc.to(DEVICE), ml.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
@pytest.mark.parametrize("M, S, block_n, ctx", [(1, 5, 16, [40]), (3, 4, 16, [40, 7, 0]), (2, 3, 32, [100, 33]),
                                               (3, 8, 64, [129, 64, 1])])
@pytest.mark.parametrize("merge_ctx", ["late", "early"])  # (2-3 rows: one at a time, LABKIT_DECODE_FMA_ROWS)
def test_gemv_merging_attention_parts_is_the_merge_kernel_then_the_gemv(dtype, M, S, block_n, ctx, merge_ctx,
                                                                       monkeypatch):
    from engine.kernels.decode_attention import _decode_merge_kernel
    monkeypatch.setattr(decode_layer, "MERGE_CTX", merge_ctx)  # (the context lengths before the PDL wait or after)
    H, D = 4, 16
    acc, ml = _attention_parts(M, H, S, D, ctx, block_n)
    lens = torch.tensor(ctx, dtype=torch.int32, device=DEVICE)
    o = torch.empty(M, H, D, dtype=dtype, device=DEVICE)
    _decode_merge_kernel[(M, H)](acc, ml, o, S, o.stride(0), o.stride(1), NUM_HEADS=H, HEAD_DIM=D,
                                 SPLITS_PAD=triton.next_power_of_2(S))
    w = _rand(40, H * D, dtype=dtype, seed=1)
    for split in (1, 2):
        want = gemv(w, x=o.view(M, H * D), split=split)
        got = gemv(w, x=decode_layer.AttnParts(acc, ml, lens, block_n), split=split)
        _close(got, want, torch.float32)  # the same merged inputs (sums of the parts in another order at most)


@pytest.mark.parametrize("ctx", [[32], [32, 16]])
@pytest.mark.parametrize("merge_ctx", ["late", "early"])
def test_gemv_merge_reads_only_the_splits_that_hold_keys(ctx, merge_ctx, monkeypatch):
    monkeypatch.setattr(decode_layer, "MERGE_CTX", merge_ctx)
    # A split past its row's context is never read (its acc and max are poison here): the bounds come from the
    # context length, as the attention kernel draws them (32 and 16: the first dead split starts at the end).
    # One row merges its parts unrolled, a tile of rows in a loop: both.
    M, H, S, D, block_n = len(ctx), 2, 4, 16, 16
    acc, ml = _attention_parts(M, H, S, D, ctx, block_n)
    clean = gemv(_rand(8, H * D, seed=2), x=decode_layer.AttnParts(acc, ml, torch.tensor(ctx, dtype=torch.int32,
                                                                   device=DEVICE), block_n))
    dead = ml[..., 0] == float("-inf")
    assert dead.any() and not dead.all()
    acc[dead], ml[dead] = float("nan"), float("nan")
    poisoned = gemv(_rand(8, H * D, seed=2), x=decode_layer.AttnParts(acc, ml, torch.tensor(
        ctx, dtype=torch.int32, device=DEVICE), block_n))
    assert torch.equal(poisoned, clean)


def test_the_gemv_merges_the_parts_of_few_rows_and_few_splits(monkeypatch):
    monkeypatch.setattr(decode_layer, "MERGE_IN_GEMV", "1")
    monkeypatch.setattr(decode_layer, "FMA_ROWS", 4)
    monkeypatch.setattr(decode_layer, "MERGE_ROWS", 1)
    most = decode_layer.GEMV_MERGE_SPLITS
    assert [decode_layer.merges_in_gemv(1, s) for s in (1, 2, most, most + 1)] == [False, True, True, False]
    assert not decode_layer.merges_in_gemv(2, 2)
    # LABKIT_DECODE_MERGE_ROWS: more rows, each taken one at a time (never past FMA_ROWS: the tile's rows)
    monkeypatch.setattr(decode_layer, "MERGE_ROWS", 2)
    assert [decode_layer.merges_in_gemv(r, 2) for r in (1, 2, 3)] == [True, True, False]
    assert not decode_layer.merges_in_gemv(2, most + 1)
    monkeypatch.setattr(decode_layer, "MERGE_ROWS", 4)
    assert [decode_layer.merges_in_gemv(r, 3) for r in (1, 2, 3, 4, 5)] == [True, True, True, True, False]
    monkeypatch.setattr(decode_layer, "FMA_ROWS", 2)
    assert [decode_layer.merges_in_gemv(r, 3) for r in (1, 2, 3, 4)] == [True, True, False, False]
    monkeypatch.setattr(decode_layer, "FMA_ROWS", 1)
    assert [decode_layer.merges_in_gemv(r, 3) for r in (1, 2)] == [True, False]
    monkeypatch.setattr(decode_layer, "MERGE_IN_GEMV", "0")
    assert not decode_layer.merges_in_gemv(1, 2) and not decode_layer.merges_in_gemv(2, 2)


def test_partials_norm_is_the_final_add_rms_norm():
    parts, residual, w = _rand(4, 2, 96, seed=10), _rand(2, 96, dtype=HALF, seed=11), _rand(96, dtype=HALF, seed=12)
    out = partials_norm(parts, residual, w, 1e-6)
    want, _ = fused.add_rms_norm(parts.sum(0).to(HALF), residual, w, 1e-6)
    _close(out, want, HALF)


def test_split_for_fills_the_gpu_but_keeps_ranges_long():
    assert split_for(1024, 2048, 132, block_n=64) == 8   # 16 tiles of 64 rows need 8 splits for 128 programs
    assert split_for(1024, 2048, 132) == 4   # o_proj: 64 tiles x 4 = 256 programs, K ranges of 512
    assert split_for(1024, 3072, 132) == 3   # down_proj: ranges of 1024 (768 would need masked loads)
    assert split_for(4096, 1024, 132) == 1   # 256 tiles already
    assert split_for(64, 300, 132) == 1      # too short to split
    assert split_for(64, 512, 132) == 2      # as many as there are: 2 x 256


def _prefilled(model_dir, dtype, kv_cache_dtype="auto"):
    """The tiny model with three sequences prefilled into its pool (unfused path); returns the engine, the
    decode step's inputs and the pool as the prefill left it."""
    # custom_kernels off: the model's own forward is the unfused path, on a GPU too.
    llm = LLM(model_dir, device=DEVICE, attention_backend="triton", dtype=dtype, enforce_eager=True,
              kvcache_block_size=16, num_kvcache_blocks=12, max_model_len=256, kv_cache_dtype=kv_cache_dtype,
              custom_kernels=False)
    runner = llm.model_runner
    lens, tables = [20, 33, 7], [[3, 0], [5, 1, 7], [2]]
    width = 3
    t = torch.tensor([r + [-1] * (width - len(r)) for r in tables], dtype=torch.int32, device=DEVICE)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 1000, (sum(lens),), generator=g).to(DEVICE)
    pos = torch.cat([torch.arange(n) for n in lens]).to(DEVICE)
    slots = torch.tensor([tables[i][p // 16] * 16 + p % 16 for i, n in enumerate(lens) for p in range(n)],
                         dtype=torch.int32, device=DEVICE)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    with torch.inference_mode():
        set_context(Context(slots, None, PrefillMeta(cu_t, cu_t, max(lens), max(lens), t, cu, cu)))
        runner.model(ids, pos)
        reset_context()
    dec = dict(ids=torch.randint(100, 1000, (3,), generator=g).to(DEVICE), pos=torch.tensor(lens, device=DEVICE),
               slots=torch.tensor([tables[i][n // 16] * 16 + n % 16 for i, n in enumerate(lens)], dtype=torch.int32,
                                  device=DEVICE),
               ctx=torch.tensor([n + 1 for n in lens], dtype=torch.int32, device=DEVICE), tables=t)
    return llm, dec, runner.kv_cache.clone()


def _launches(monkeypatch, name: str) -> list:
    """The grids of decode_layer's kernel `name` as the fused step launches it, from now on."""
    grids = []
    kernel = getattr(decode_layer, name)

    class Spy:
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]
    monkeypatch.setattr(decode_layer, name, Spy())
    return grids


def _merge_launches(monkeypatch) -> list:
    """The grids of decode_attention's merge kernel as the fused step launches it, from now on."""
    return _launches(monkeypatch, "_decode_merge_kernel")


# (3 rows on the tile, or one at a time, their parts merged by the merge kernel or by o_proj; this token's K/V
# made after the older keys or first, LABKIT_DECODE_NEW_KV, and with it o_proj's context lengths loaded before
# the wait, LABKIT_DECODE_MERGE_CTX)
@pytest.mark.parametrize("rows, fma_rows, merge_rows, new_kv", [
    (1, 4, 1, "first"), (3, 1, 1, "last"), (3, 4, 1, "last"), (3, 4, 4, "first")])
@pytest.mark.parametrize("merge_in_gemv", ["0", "1"])
@pytest.mark.parametrize("dtype, splits, block_n, gemv_rows", [
    ("float32", 1, 128, 16), ("float32", 2, 128, 16), ("float16", 1, 128, 16), ("float16", 3, 128, 16),
    ("float32", 3, 16, 16), ("float16", 2, 16, 16), ("float32", 2, 64, 32), ("float16", 1, 128, 64)])
def test_a_fused_decode_step_matches_the_unfused_step(tiny_model, rows, dtype, splits, block_n, gemv_rows,
                                                      merge_in_gemv, fma_rows, merge_rows, new_kv,
                                                      monkeypatch):
    # block_n 16: the pool's 16-token pages are whole tiles, and a split walks several of them; gemv_rows > 16:
    # the GEMVs' programs own more weight rows (LABKIT_DECODE_GEMV), the last tile part masked; merge_in_gemv:
    # a split context's parts merged by o_proj's GEMV, not the merge kernel (LABKIT_DECODE_MERGE_IN_GEMV)
    monkeypatch.setattr(decode_layer, "FMA_ROWS", fma_rows)
    monkeypatch.setattr(decode_layer, "MERGE_ROWS", merge_rows)
    monkeypatch.setattr(decode_layer, "NEW_KV", new_kv)
    monkeypatch.setattr(decode_layer, "MERGE_CTX", "early" if new_kv == "first" else "late")
    monkeypatch.setattr(decode_layer, "MERGE_IN_GEMV", merge_in_gemv)
    monkeypatch.setattr(decode_layer, "ATTN_BLOCK_N", block_n)
    monkeypatch.setattr(decode_layer, "SPLIT_BLOCK_N", block_n)
    merges = _merge_launches(monkeypatch)
    monkeypatch.setattr(decode_layer, "_BLOCK_N", gemv_rows)
    llm, dec, pool = _prefilled(tiny_model, dtype)
    runner = llm.model_runner
    model = runner.model.model
    d = {k: v[:rows] for k, v in dec.items()}
    with torch.inference_mode():
        set_context(Context(d["slots"], DecodeMeta(rows, d["ctx"], d["tables"], d["ctx"].tolist(),
                                                   num_splits=splits)))
        assert not model._fused_decode  # on a CPU the model itself takes the unfused path
        want = model(d["ids"], d["pos"])
        want_pool = runner.kv_cache.clone()
        runner.kv_cache.copy_(pool)
        assert fused_decode.applies(Context(d["slots"], DecodeMeta(rows, d["ctx"], d["tables"], num_splits=splits)),
                                    rows)
        got = fused_decode.forward(model, d["ids"], d["pos"])
        reset_context()
    # the merge kernel ran for each layer's split attention, unless o_proj's GEMV merged (one row, or up to
    # LABKIT_DECODE_MERGE_ROWS taken one at a time)
    in_gemv = merge_in_gemv == "1" and splits > 1 and (rows == 1 or rows <= min(merge_rows, fma_rows))
    assert len(merges) == (0 if splits == 1 or in_gemv else len(model.layers))
    torch_dtype = getattr(torch, dtype)
    _close(got, want, torch_dtype)
    # The newest token's K/V written where the unfused KV-write puts them, nothing else touched.
    _close(runner.kv_cache.float(), want_pool.float(), torch_dtype)
    changed = (runner.kv_cache != pool).flatten(3).any(-1)  # [2, layers, blocks, kv_heads]
    assert changed.any()
    assert torch.equal(changed, (want_pool != pool).flatten(3).any(-1))
    llm.exit()


@pytest.mark.parametrize("rows, splits", [(3, 1), (1, 3)])
@pytest.mark.parametrize("new_kv", ["last", "first"])
def test_a_fused_decode_step_writes_an_fp8_pool_as_the_kv_write_kernel_does(tiny_model, rows, splits, new_kv,
                                                                             monkeypatch):
    # (1, 3): one row of a split context, its parts merged inside o_proj (the default at one row)
    monkeypatch.setattr(decode_layer, "MERGE_IN_GEMV", "1")
    monkeypatch.setattr(decode_layer, "NEW_KV", new_kv)
    monkeypatch.setattr(decode_layer, "SPLIT_BLOCK_N", 16)
    llm, dec, pool = _prefilled(tiny_model, "float32", "fp8")
    runner = llm.model_runner
    model = runner.model.model
    dec = {k: v[:rows] for k, v in dec.items()}
    for layer in model.layers:  # scales other than 1 (the engine's), so a path that drops one differs
        layer.self_attn.attn.k_scale, layer.self_attn.attn.v_scale = 0.5, 2.0
    with torch.inference_mode():
        set_context(Context(dec["slots"], DecodeMeta(rows, dec["ctx"], dec["tables"], dec["ctx"].tolist(),
                                                     num_splits=splits)))
        want = model(dec["ids"], dec["pos"])
        want_pool = runner.kv_cache.clone()
        runner.kv_cache.copy_(pool)
        got = fused_decode.forward(model, dec["ids"], dec["pos"])
        reset_context()
    assert runner.kv_cache.dtype == torch.float8_e4m3fn
    differ = (runner.kv_cache.view(torch.uint8) != want_pool.view(torch.uint8)).float().mean().item()
    assert differ < 0.02  # the same quantisation; a value on a rounding edge may land one e4m3 step apart
    _close(got, want, torch.float32)
    llm.exit()


def test_fused_decode_applies_only_to_small_decode_graph_steps():
    t = torch.zeros(1, 1, dtype=torch.int32)
    graph = DecodeMeta(1, t[0], t, num_splits=1)
    assert fused_decode.applies(Context(None, graph), 16)
    assert not fused_decode.applies(Context(None, graph), 17)
    assert not fused_decode.applies(Context(None, DecodeMeta(1, t[0], t)), 1)  # an eager decode step
    assert not fused_decode.applies(Context(None, graph, PrefillMeta(t[0], t[0], 1, 1)), 1)  # a mixed step


@pytest.mark.parametrize("M, k_chunk, fma_rows", [(1, 0, 4), (4, 0, 1), (4, 32, 1), (4, 0, 4), (3, 0, 4)])
@pytest.mark.parametrize("K, split", [(256, 4), (96, 2)])
def test_gemv_norm_over_split_k_ranges_normalises_each_range_with_its_own_weights(M, k_chunk, fma_rows, K, split,
                                                                                  monkeypatch):
    """A split program's columns start at pid_k * KS: its norm weights and inputs must be that range's too, and
    nothing past it (96 / 2: ranges of 48 in tiles of 64, whose last chunk reaches into the next range); rows
    taken one at a time take the norm's statistics over whole rows, not their range."""
    monkeypatch.setattr(decode_layer, "K_CHUNK", k_chunk)
    monkeypatch.setattr(decode_layer, "FMA_ROWS", fma_rows)
    N = 24
    x = _rand(M, K, seed=21)
    nw = _rand(K, seed=22) + 1
    w = _rand(N, K, scale=K ** -0.5, seed=23)
    y = gemv(w, x=x, norm_weight=nw, eps=1e-6, split=split).sum(0)
    _close(y, fused.rms_norm(x, nw, 1e-6) @ w.T, torch.float32)


def test_only_o_proj_takes_its_own_pdl_point(tiny_model, monkeypatch):
    """LABKIT_DECODE_O_PROJ_PDL reaches o_proj's launch in every layer and no other GEMV's."""
    llm, dec, _ = _prefilled(tiny_model, "float32")
    model = llm.model_runner.model.model
    seen = []

    def spy(w, **kw):
        seen.append((w.shape, kw.get("pdl", "")))
        return gemv(w, **kw)
    monkeypatch.setattr(fused_decode, "gemv", spy)
    monkeypatch.setattr(fused_decode, "O_PROJ_PDL", "first")
    with torch.inference_mode():
        set_context(Context(dec["slots"], DecodeMeta(3, dec["ctx"], dec["tables"], num_splits=1)))
        fused_decode.forward(model, dec["ids"], dec["pos"])
        reset_context()
    o_proj = tuple(model.layers[0].self_attn.o_proj.weight.shape)
    assert [p for _, p in seen] == ["first" if tuple(s) == o_proj else "" for s, _ in seen]
    assert [p for _, p in seen].count("first") == len(model.layers)
    llm.exit()


def test_every_gemv_names_its_projection(tiny_model, monkeypatch):
    """Each layer's four GEMVs tell gemv which projection they are (LABKIT_DECODE_SMEM_GEMV routes by that name,
    not by the launch's shape: o_proj's input is a plain row whenever the merge kernel runs)."""
    llm, dec, _ = _prefilled(tiny_model, "float32")
    model = llm.model_runner.model.model
    seen = []

    def spy(w, **kw):
        seen.append((w.data_ptr(), kw.get("proj", "")))
        return gemv(w, **kw)
    monkeypatch.setattr(fused_decode, "gemv", spy)
    with torch.inference_mode():
        set_context(Context(dec["slots"], DecodeMeta(3, dec["ctx"], dec["tables"], num_splits=1)))
        fused_decode.forward(model, dec["ids"], dec["pos"])
        reset_context()
    want = [(m.weight.data_ptr(), name) for layer in model.layers
            for m, name in ((layer.self_attn.qkv_proj, "qkv"), (layer.self_attn.o_proj, "o_proj"),
                            (layer.mlp.gate_up_proj, "gate_up"), (layer.mlp.down_proj, "down"))]
    assert seen == want
    llm.exit()


@pytest.mark.parametrize("M, fma_rows", [(2, 2), (3, 4), (5, 8), (16, 16)])
@pytest.mark.parametrize("kind", ["qkv", "qkv_whole", "o_proj", "o_merge", "o_merge_early", "gate_up", "down"])
def test_rows_taken_one_at_a_time_equal_one_row_launches_bit_for_bit(M, fma_rows, kind, monkeypatch):
    """LABKIT_DECODE_FMA_ROWS: up to that many rows go through the one-row arithmetic in one launch, so each row's
    output (and the new residual) is exactly what a one-row launch gives, whatever the batch."""
    monkeypatch.setattr(decode_layer, "FMA_ROWS", fma_rows)
    # (o_merge_early: the context lengths loaded before the PDL wait, LABKIT_DECODE_MERGE_CTX)
    monkeypatch.setattr(decode_layer, "MERGE_CTX", "early" if kind == "o_merge_early" else "late")
    kind = kind.removesuffix("_early")
    # (not powers of two: the masked loads; qkv_whole: one unmasked K range, the norm's rows the input's own)
    K = {"down": 160, "qkv_whole": 128, "o_merge": 4 * 16}.get(kind, 96)
    N = 40
    w = _rand(2 * N if kind == "gate_up" else N, K, scale=K ** -0.5, seed=31)
    nw = _rand(K, seed=32) + 1
    parts = _rand(3, M, K, seed=33)
    res = _rand(M, K, seed=34)
    x = _rand(M, K, seed=35)
    ctx = [40, 7, 33, 16, 1][:M] + [25] * (M - 5)  # (o_merge: 4 heads of 16 in 3 splits of 16-key tiles)
    acc, ml = _attention_parts(M, 4, 3, 16, ctx, 16)
    lens = torch.tensor(ctx, dtype=torch.int32, device=DEVICE)

    def launch(rows):
        if kind in ("qkv", "qkv_whole"):
            return gemv(w, partials=parts[:, rows].contiguous(), residual=res[rows], norm_weight=nw, eps=1e-6)
        if kind == "gate_up":
            return gemv(w, partials=parts[:, rows].contiguous(), residual=res[rows], norm_weight=nw, eps=1e-6,
                        silu=True)
        if kind == "o_merge":
            return gemv(w, x=decode_layer.AttnParts(acc[rows].contiguous(), ml[rows].contiguous(), lens[rows], 16),
                        split=2)
        return gemv(w, x=x[rows], split=2 if kind == "o_proj" else 1)
    got = launch(slice(None))
    for m in range(M):
        one = launch(slice(m, m + 1))
        if kind in ("qkv", "qkv_whole", "gate_up"):
            assert torch.equal(got[0][m], one[0][0]) and torch.equal(got[1][m], one[1][0])
        else:
            assert torch.equal(got[:, m], one[:, 0])
    monkeypatch.setattr(decode_layer, "FMA_ROWS", 1)  # the tile path: the same sums up to float32 order
    tile = launch(slice(None))
    if kind in ("qkv", "qkv_whole", "gate_up"):
        _close(got[0], tile[0], torch.float32)
        assert torch.equal(got[1], tile[1])
    else:
        _close(got, tile, torch.float32)


@pytest.mark.parametrize("rows, splits, merge_ctx", [(2, 1, "late"), (3, 1, "late"), (3, 3, "early"), (2, 2, "late"),
                                                     (3, 2, "early")])
def test_a_fused_step_taking_rows_one_at_a_time_is_each_rows_one_row_step(tiny_model, rows, splits, merge_ctx,
                                                                          monkeypatch):
    """With LABKIT_DECODE_FMA_ROWS covering the batch, a fused decode step's hidden states are, row for row and bit
    for bit, those of one-row steps, and match the unfused step; a split context's parts merged by o_proj at every
    row (LABKIT_DECODE_MERGE_ROWS) as at one."""
    monkeypatch.setattr(decode_layer, "FMA_ROWS", 4)
    monkeypatch.setattr(decode_layer, "MERGE_ROWS", 4)
    monkeypatch.setattr(decode_layer, "MERGE_CTX", merge_ctx)
    monkeypatch.setattr(decode_layer, "MERGE_IN_GEMV", "1")
    monkeypatch.setattr(decode_layer, "SPLIT_BLOCK_N", 16)
    merges = _merge_launches(monkeypatch)
    llm, dec, pool = _prefilled(tiny_model, "float32")
    runner = llm.model_runner
    model = runner.model.model

    def step(sel):
        d = {k: v[sel] for k, v in dec.items()}
        runner.kv_cache.copy_(pool)
        with torch.inference_mode():
            set_context(Context(d["slots"], DecodeMeta(len(d["ids"]), d["ctx"], d["tables"], num_splits=splits)))
            out = fused_decode.forward(model, d["ids"], d["pos"]).clone()
            reset_context()
        return out
    got = step(slice(0, rows))
    for m in range(rows):
        assert torch.equal(got[m], step(slice(m, m + 1))[0])
    assert not merges  # (every split's parts merged by o_proj)
    d = {k: v[:rows] for k, v in dec.items()}
    runner.kv_cache.copy_(pool)
    with torch.inference_mode():
        set_context(Context(d["slots"], DecodeMeta(rows, d["ctx"], d["tables"], d["ctx"].tolist(),
                                                   num_splits=splits)))
        want = model(d["ids"], d["pos"])
        reset_context()
    _close(got, want, torch.float32)
    llm.exit()
