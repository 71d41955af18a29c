"""The FP8 KV cache (kv_cache_dtype="fp8", engine/kv_quant.py): the KV-write kernel rounds as the hardware and
torch do, the attention kernels read e4m3 values with their scales exactly as a float reference computes it, and
the engine's schedule does not change (only the numbers, and the number of blocks). On a CPU the Triton kernels
run in Triton's interpreter (conftest.py)."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from engine import LLM, SamplingParams  # noqa: E402
from engine.backends import torch_ref  # noqa: E402
from engine.config import Config  # noqa: E402
from engine.context import DecodeMeta, PrefillMeta  # noqa: E402
from engine.kernels.decode_attention import paged_decode  # noqa: E402
from engine.kernels.kv_write import store_kvcache  # noqa: E402
from engine.kernels.prefill_attention import varlen_prefill  # noqa: E402
from engine.kv_quant import FP8, FP8_MAX, quantize  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _e4m3_grid() -> torch.Tensor:
    """Every e4m3 value, the midpoints between neighbours (ties: round to even), values a hair either side of
    each midpoint, values just under each power of two (a round-up there crosses into the next binade) and
    values past the saturation point, both signs."""
    values = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    values = values[torch.isfinite(values)].unique()
    pos = values[values >= 0]
    mids = (pos[1:] + pos[:-1]) / 2
    near = torch.cat([mids * (1 + 2 ** -20), mids * (1 - 2 ** -20)])
    powers = torch.tensor([2.0 ** e for e in range(-9, 9)])
    below = torch.cat([powers * (1 - 2 ** -k) for k in (5, 6, 8, 12)])
    big = torch.tensor([440.0, 447.9, 448.0, 460.0, 463.9, 464.0, 500.0, 1e6])
    grid = torch.cat([pos, mids, near, below, big])
    return torch.cat([grid, -grid])


@pytest.mark.parametrize("scale", [1.0, 0.37, 4.0])
def test_kv_write_quantises_exactly_as_torch_rounds(scale):
    """Bit-equal to engine.kv_quant.quantize (torch's round-to-nearest-even cast after the clamp), over every
    rounding edge: what the GPU's cvt.rn does, and what Triton's interpreter gets wrong if the kernel casts."""
    grid = _e4m3_grid() * scale
    n = -(-grid.numel() // 8) * 8
    x = torch.zeros(n)
    x[:grid.numel()] = grid
    k = x.view(-1, 2, 4).to(DEVICE)  # tokens x 2 heads x head_dim 4
    v = -k
    tokens = k.shape[0]
    k_cache = torch.zeros(tokens, 2, 1, 4, dtype=FP8, device=DEVICE)  # one token a block
    v_cache = torch.zeros_like(k_cache)
    store_kvcache(k, v, k_cache, v_cache, torch.arange(tokens, dtype=torch.int32, device=DEVICE), scale, scale)
    want_k, want_v = quantize(k, scale), quantize(v, scale)
    got_k, got_v = k_cache[:, :, 0], v_cache[:, :, 0]
    assert torch.equal(got_k.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(got_v.view(torch.uint8), want_v.view(torch.uint8))
    assert got_k.float().abs().max().item() <= FP8_MAX  # saturated, never NaN


def test_quantize_saturates_and_rounds_to_even():
    x = torch.tensor([1e6, -1e6, 1.0625, 1.1875, 2 ** -10, 0.49609375])
    q = quantize(x, 1.0).float()
    # 1.0625 lies halfway between 1.0 and 1.125 (even mantissa: 1.0); 1.1875 between 1.125 and 1.25 (1.25);
    # 2^-10 halfway between 0 and the least subnormal 2^-9 (0); 0.49609375 just under 0.5 rounds up to it.
    assert q.tolist() == [448.0, -448.0, 1.0, 1.25, 0.0, 0.5]


def _fp8_pool(num_blocks, block_size, kv_heads, head_dim, k_scale, v_scale, seed=0):
    """An FP8 layer cache and the float values it stands for (e4m3 value x scale)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num_blocks, kv_heads, block_size, head_dim, generator=g) * 3
    v = torch.randn(num_blocks, kv_heads, block_size, head_dim, generator=g)
    kq, vq = quantize(k, k_scale), quantize(v, v_scale)
    return kq.to(DEVICE), vq.to(DEVICE), kq.float() * k_scale, vq.float() * v_scale


def _float_attention(q, keys, values, scale):
    """softmax(q k^T * scale) v for one query row group, in float64: the independent reference."""
    s = torch.einsum("hd,khd->hk", q.double(), keys.double()) * scale
    return torch.einsum("hk,khd->hd", s.softmax(-1), values.double())


@pytest.mark.parametrize("splits", [1, 3])
def test_paged_decode_reads_fp8_as_the_float_values_it_stands_for(splits):
    block_size, heads, kv_heads, head_dim = 16, 4, 2, 32
    k_scale, v_scale = 0.5, 2.0
    lengths = [1, 17, 40]
    num_blocks = 8
    kq, vq, kf, vf = _fp8_pool(num_blocks, block_size, kv_heads, head_dim, k_scale, v_scale)
    tables = torch.tensor([[5, -1, -1], [0, 3, -1], [1, 2, 7]], dtype=torch.int32)
    q = torch.randn(len(lengths), heads, head_dim)
    scale = head_dim ** -0.5
    out = paged_decode(q.to(DEVICE), kq, vq, tables.to(DEVICE), torch.tensor(lengths, dtype=torch.int32, device=DEVICE),
                       scale, splits, block_n=16, k_scale=k_scale, v_scale=v_scale).cpu()
    ctx = DecodeMeta(len(lengths), torch.tensor(lengths, dtype=torch.int32), tables, lengths)
    ref = torch_ref.decode(q, kq.cpu(), vq.cpu(), ctx, scale, k_scale=k_scale, v_scale=v_scale)
    for b, n in enumerate(lengths):
        pos = torch.arange(n)
        blocks = tables[b, pos // block_size].long()
        keys = kf[blocks, :, pos % block_size].repeat_interleave(heads // kv_heads, dim=1)
        values = vf[blocks, :, pos % block_size].repeat_interleave(heads // kv_heads, dim=1)
        want = _float_attention(q[b], keys, values, scale)
        assert (out[b].double() - want).abs().max().item() < 1e-4
        assert (ref[b].double() - want).abs().max().item() < 1e-4


def test_varlen_prefill_reads_fp8_through_the_pool():
    """A chunk after a cached prefix and a fresh prompt, keys and values read from an FP8 pool (this step's rows
    written by the KV-write kernel first): the kernel, the torch reference and a float reference agree."""
    block_size, heads, kv_heads, head_dim = 16, 4, 2, 32
    k_scale, v_scale = 0.25, 1.5
    shapes = [(0, 21), (32, 9)]  # (cached, new)
    num_blocks = 8
    kq, vq, _, _ = _fp8_pool(num_blocks, block_size, kv_heads, head_dim, k_scale, v_scale)
    tables = torch.tensor([[6, 7, -1], [0, 1, 2]], dtype=torch.int32)
    total = sum(n for _, n in shapes)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(total, heads, head_dim, generator=g)
    k = torch.randn(total, kv_heads, head_dim, generator=g) * 3
    v = torch.randn(total, kv_heads, head_dim, generator=g)
    slots, cu_q, cu_k = [], [0], [0]
    for i, (c, n) in enumerate(shapes):
        slots += [int(tables[i, p // block_size]) * block_size + p % block_size for p in range(c, c + n)]
        cu_q.append(cu_q[-1] + n)
        cu_k.append(cu_k[-1] + c + n)
    slot_t = torch.tensor(slots, dtype=torch.int32)
    store_kvcache(k.to(DEVICE), v.to(DEVICE), kq, vq, slot_t.to(DEVICE), k_scale, v_scale)
    cu_q_t, cu_k_t = torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32)
    scale = head_dim ** -0.5
    out = varlen_prefill(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), kq, vq, tables.to(DEVICE), cu_q_t.to(DEVICE),
                         cu_k_t.to(DEVICE), max(n for _, n in shapes), scale, block_m=16, block_n=16,
                         k_scale=k_scale, v_scale=v_scale).cpu()
    ctx = PrefillMeta(cu_q_t, cu_k_t, max(n for _, n in shapes), max(c + n for c, n in shapes), tables, cu_q, cu_k)
    ref = torch_ref.prefill(q, k, v, kq.cpu(), vq.cpu(), ctx, scale, k_scale=k_scale, v_scale=v_scale)
    kf, vf = kq.cpu().float() * k_scale, vq.cpu().float() * v_scale
    for i, (c, n) in enumerate(shapes):
        for j in range(n):  # query j sits at position c + j and sees keys 0 .. c + j
            pos = torch.arange(c + j + 1)
            blocks = tables[i, pos // block_size].long()
            keys = kf[blocks, :, pos % block_size].repeat_interleave(heads // kv_heads, dim=1)
            values = vf[blocks, :, pos % block_size].repeat_interleave(heads // kv_heads, dim=1)
            want = _float_attention(q[cu_q[i] + j], keys, values, scale)
            assert (out[cu_q[i] + j].double() - want).abs().max().item() < 1e-4
            assert (ref[cu_q[i] + j].double() - want).abs().max().item() < 1e-4


def test_reference_prefill_without_tables_sees_the_stored_values():
    """The torch backend's prefill of a fresh prompt reads this step's own k/v (no tables): with an FP8 pool it
    must see them as stored, or a prefix-cache hit (read from the pool) would attend to other numbers."""
    heads, kv_heads, head_dim, n = 2, 1, 16, 7
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, h, head_dim, generator=g) for h in (heads, kv_heads, kv_heads))
    cache = torch.zeros(2, kv_heads, 8, head_dim, dtype=FP8)
    cu = torch.tensor([0, n], dtype=torch.int32)
    fresh = torch_ref.prefill(q, k, v, cache, cache, PrefillMeta(cu, cu, n, n, None, [0, n], [0, n]), 0.3,
                              k_scale=0.5, v_scale=0.5)
    torch_ref.store_kvcache(k, v, kc := cache.clone(), vc := cache.clone(), torch.arange(n, dtype=torch.int32),
                            0.5, 0.5)
    paged = torch_ref.prefill(q, k, v, kc, vc, PrefillMeta(cu, cu, n, n, torch.tensor([[0]]), [0, n], [0, n]), 0.3,
                              k_scale=0.5, v_scale=0.5)
    assert torch.equal(fresh, paged)


def _engine(model, **kw):
    args = dict(enforce_eager=True, device=DEVICE, max_model_len=512, max_num_batched_tokens=512,
                kvcache_block_size=16, dtype="float32")
    args.update(kw)
    return LLM(model, **args)


def test_fp8_pool_holds_twice_the_blocks_and_says_so(tiny_model):
    budget = 1 << 20
    sizes = {}
    for kv in ("auto", "fp8"):
        llm = _engine(tiny_model, kv_cache_dtype=kv, kvcache_memory_bytes=budget)
        sizes[kv] = (llm.config.num_kvcache_blocks, llm.model_runner.kv_cache.dtype,
                     llm._run_start_fields()["kv_bytes_per_token"], llm._run_start_fields()["kv_cache_dtype"])
        llm.exit()
    # float32 tiny model: 4 bytes an element; e4m3: 1. (bf16 -> fp8 is the 2x of a GPU run.)
    assert sizes["fp8"][0] == 4 * sizes["auto"][0]
    assert sizes["fp8"][1] == FP8 and sizes["auto"][1] == torch.float32
    assert sizes["fp8"][2] * 4 == sizes["auto"][2]
    assert sizes["fp8"][3] == "float8_e4m3fn"


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_fp8_outputs_do_not_depend_on_chunking_or_the_prefix_cache(tiny_model, backend):
    """Attention reads every key as stored, so a prompt prefilled whole, in chunks of 48, or after a cached
    prefix gives the same tokens (float32 on CPU: the same values in the same order)."""
    prompt = [100 + (7 * i) % 900 for i in range(100)]
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    runs = []
    for budget in (512, 48):
        llm = _engine(tiny_model, kv_cache_dtype="fp8", attention_backend=backend, max_num_batched_tokens=budget,
                      num_kvcache_blocks=32)
        first = llm.generate([prompt], sp, use_tqdm=False)[0]["token_ids"]
        again = llm.generate([prompt], sp, use_tqdm=False)[0]["token_ids"]  # 96 tokens from the prefix cache
        runs.append((first, again))
        llm.exit()
    assert runs[0][0] == runs[0][1] == runs[1][0] == runs[1][1]


def test_fp8_pool_holds_each_row_quantised(tiny_model):
    """Different K/V bytes: read back from the pool, layer 0's rows (whose inputs attention has not touched yet)
    are the model-dtype pool's rows quantised; later layers' inputs already carry FP8 attention's error."""
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    prompt = list(range(200, 240))
    rows = {}
    for kv in ("auto", "fp8"):
        llm = _engine(tiny_model, kv_cache_dtype=kv, num_kvcache_blocks=16, attention_backend="torch")
        llm.generate([prompt], sp, use_tqdm=False)
        rows[kv] = llm.read_kv(list(range(len(prompt)))).cpu()
        llm.exit()
    first_fp8, first = rows["fp8"][:, 0], rows["auto"][:, 0]
    assert torch.equal(first_fp8, quantize(first, 1.0).float())
    err = ((first_fp8 - first).norm() / first.norm()).item()
    assert 0 < err < 2 ** -4  # e4m3 keeps 3 mantissa bits: a relative error of at most 2^-4 a value


def test_config_refuses_an_unknown_kv_cache_dtype(tiny_model):
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        Config(tiny_model, kv_cache_dtype="fp16")


def test_trace_with_fp8_is_judged_strictly_and_passes(tiny_model, tmp_path):
    """--kv-cache-dtype is state-neutral: a trace case run with it keeps its expected states (PASS, exit 0)."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "labkit", "trace", "--case", "preempt", "--model", tiny_model,
                          "--device", "cpu", "--kv-cache-dtype", "fp8", "-q", "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASS" in res.stdout and "CHANGED" not in res.stdout
