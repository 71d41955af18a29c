"""An FP8 pool with V stored keys-contiguous (LABKIT_FP8_V_TRANSPOSED=1, engine/kv_layout.py): every writer puts a
value where the view says, every reader (decode, the fused decode layer, prefill, the torch reference, read_kv)
gets the numbers the head_dim-contiguous pool gives, and the unmasked tiles past a context's end add nothing, also
when the rows there hold other values. On a CPU the Triton kernels run in Triton's interpreter (conftest.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")

import engine.runner  # noqa: E402
from engine import LLM, SamplingParams  # noqa: E402
from engine.backends import torch_ref  # noqa: E402
from engine.context import Context, DecodeMeta, PrefillMeta, reset_context, set_context  # noqa: E402
from engine.kernels import decode_layer  # noqa: E402
from engine.kernels.decode_attention import paged_decode  # noqa: E402
from engine.kernels.kv_write import store_kvcache  # noqa: E402
from engine.kernels.prefill_attention import varlen_prefill  # noqa: E402
from engine.kv_layout import layer_caches, read_slots, v_transposed  # noqa: E402
from engine.kv_quant import FP8, quantize  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _pools(blocks, heads, block_size, head_dim, seed=0):
    """The same FP8 K/V values in a head_dim-contiguous pool and in a keys-contiguous one: ([2, 1, ...] pool,
    k_cache, v_cache) for each. Every row holds a finite value, the rows no sequence owns included."""
    g = torch.Generator().manual_seed(seed)
    k = quantize(torch.randn(blocks, heads, block_size, head_dim, generator=g) * 3, 1.0)
    v = quantize(torch.randn(blocks, heads, block_size, head_dim, generator=g) * 50, 1.0)  # up to 448: loud
    out = []
    for vt in (False, True):
        pool = torch.zeros(2, 1, blocks, heads, block_size, head_dim, dtype=FP8, device=DEVICE)
        kc, vc = layer_caches(pool, 0, vt)
        kc.copy_(k.to(DEVICE))
        vc.copy_(v.to(DEVICE))
        out.append((pool, kc, vc))
    return out


def test_the_keys_contiguous_view_puts_each_value_at_its_transposed_place():
    pool = torch.zeros(2, 2, 3, 2, 8, 4, dtype=torch.float32)  # K/V, layers, blocks, heads, block_size, head_dim
    k, v = layer_caches(pool, 1, True)
    assert v.shape == k.shape == (3, 2, 8, 4) and v_transposed(v) and not v_transposed(k)
    assert v.stride() == (64, 32, 1, 8)
    v[2, 1, 5] = torch.arange(4.0) + 1
    raw = pool[1, 1].view(3, 2, 4, 8)  # [blocks, heads, head_dim, block_size]: the keys contiguous
    assert raw[2, 1, :, 5].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert raw.count_nonzero() == 4
    rows = read_slots(pool, torch.tensor([2 * 8 + 5]), True)  # slot: block 2, offset 5
    assert rows[1, 1, 0, 1].tolist() == [1.0, 2.0, 3.0, 4.0]
    # (read as head_dim-contiguous, the same bytes are other positions' values)
    assert read_slots(pool, torch.tensor([2 * 8 + 5]), False)[1, 1, 0, 1].tolist() != [1.0, 2.0, 3.0, 4.0]
    _, v_rows = layer_caches(pool, 1, False)
    assert not v_transposed(v_rows) and v_rows.is_contiguous()


@pytest.mark.parametrize("writer", ["triton", "torch"])
def test_kv_write_stores_the_same_values_in_either_layout(writer):
    blocks, heads, bs, dim = 4, 2, 16, 8
    g = torch.Generator().manual_seed(1)
    k = torch.randn(9, heads, dim, generator=g) * 4
    v = torch.randn(9, heads, dim, generator=g) * 4
    slots = torch.tensor([0, 1, 17, 18, 19, 40, 63, -1, 33], dtype=torch.int32)
    store = store_kvcache if writer == "triton" else torch_ref.store_kvcache
    caches = []
    for vt in (False, True):
        pool = torch.zeros(2, 1, blocks, heads, bs, dim, dtype=FP8, device=DEVICE)
        kc, vc = layer_caches(pool, 0, vt)
        store(k.to(DEVICE), v.to(DEVICE), kc, vc, slots.to(DEVICE), 0.5, 2.0)
        caches.append((pool, kc, vc))
    (rows_pool, k0, v0), (t_pool, k1, v1) = caches
    assert torch.equal(k0.view(torch.uint8), k1.view(torch.uint8))
    assert torch.equal(v0.contiguous().view(torch.uint8), v1.contiguous().view(torch.uint8))
    # The bytes themselves: the transposed pool's V is the other pool's V with each block's head transposed.
    raw = t_pool[1, 0].view(torch.uint8).view(blocks, heads, dim, bs)
    assert torch.equal(raw, rows_pool[1, 0].view(torch.uint8).transpose(-1, -2))
    assert v0.view(torch.uint8).count_nonzero() > 0
    want = quantize(v[5], 2.0)  # slot 40: block 2, offset 8
    assert torch.equal(v1[2, :, 8].cpu().view(torch.uint8), want.view(torch.uint8))


def test_a_nan_row_is_stored_as_zero_so_the_pool_holds_no_nan():
    """The unmasked tiles rely on it: a NaN left in a freed block would reach the next owner's output."""
    x = torch.tensor([[[float("nan"), 1.0, float("inf"), -float("inf")]]])
    q = quantize(x, 1.0).float()
    assert q.flatten().tolist() == [0.0, 1.0, 448.0, -448.0]
    pool = torch.zeros(2, 1, 1, 1, 4, 4, dtype=FP8, device=DEVICE)
    kc, vc = layer_caches(pool, 0, True)
    store_kvcache(x.to(DEVICE), x.to(DEVICE), kc, vc, torch.tensor([2], dtype=torch.int32, device=DEVICE))
    assert not pool.float().isnan().any()
    assert vc[0, 0, 2].float().tolist() == [0.0, 1.0, 448.0, -448.0]


def _float_attention(q, keys, values, scale):
    s = torch.einsum("hd,khd->hk", q.double(), keys.double()) * scale
    return torch.einsum("hk,khd->hd", s.softmax(-1), values.double())


@pytest.mark.parametrize("block_size, block_n, splits, fp8_dot", [
    (32, 16, 1, "off"), (32, 16, 3, "off"), (64, 32, 2, "qkpv"), (64, 32, 1, "swap"), (16, 32, 1, "off")])
def test_paged_decode_over_keys_contiguous_v_reads_only_the_context(block_size, block_n, splits, fp8_dot):
    """Page tiles (block_size a multiple of block_n) read whole tiles unmasked: the context ends mid-tile and
    mid-block with loud values after it. 16/32: tiles straddle blocks, the masked path."""
    heads, kv_heads, head_dim = 4, 2, 32
    lengths = [1, 21, 70, 0]
    num_blocks = 10
    (_, kr, vr), (_, kt, vt) = _pools(num_blocks, kv_heads, block_size, head_dim)
    width = -(-max(lengths) // block_size)
    order = [3, 7, 0, 9, 5, 1, 8, 2, 6]
    tables, at = [], 0
    for n in lengths:
        need = -(-n // block_size)
        tables.append(order[at:at + need] + [-1] * (width - need))
        at += need
    tables_t = torch.tensor(tables, dtype=torch.int32, device=DEVICE)
    ctx = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    q = torch.randn(len(lengths), heads, head_dim, generator=torch.Generator().manual_seed(2))
    scale = head_dim ** -0.5
    kw = dict(block_n=block_n, k_scale=0.5, v_scale=0.25, fp8_dot=fp8_dot)
    rows = paged_decode(q.to(DEVICE), kr, vr, tables_t, ctx, scale, splits, **kw).cpu()
    got = paged_decode(q.to(DEVICE), kt, vt, tables_t, ctx, scale, splits, **kw).cpu()
    assert torch.allclose(got, rows, atol=1e-6, rtol=0)
    kf, vf = kr.cpu().float() * 0.5, vr.cpu().float() * 0.25
    tol = 1e-4 if fp8_dot == "off" else 0.15  # qkpv/swap round q (and p) to e4m3
    for b, n in enumerate(lengths):
        if n == 0:
            assert torch.equal(got[b], torch.zeros_like(got[b]))
            continue
        pos = torch.arange(n)
        blocks = torch.tensor(tables[b])[pos // block_size].long()
        keys = kf[blocks, :, pos % block_size].repeat_interleave(heads // kv_heads, dim=1)
        values = vf[blocks, :, pos % block_size].repeat_interleave(heads // kv_heads, dim=1)
        want = _float_attention(q[b], keys, values, scale)
        assert (got[b].double() - want).abs().max().item() < tol * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("block_size, block_n", [(32, 16), (16, 32)])
def test_varlen_prefill_over_keys_contiguous_v_matches_the_other_layout(block_size, block_n):
    heads, kv_heads, head_dim = 4, 2, 16
    shapes = [(0, 21), (40, 9)]  # (cached, new)
    (_, kr, vr), (_, kt, vt) = _pools(8, kv_heads, block_size, head_dim, seed=4)
    per = -(-max(c + n for c, n in shapes) // block_size)
    tables = torch.tensor([[6, 7, 5, 4][:per], [0, 1, 2, 3][:per]], dtype=torch.int32)
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
    slot_t = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
    cu_q_t = torch.tensor(cu_q, dtype=torch.int32, device=DEVICE)
    cu_k_t = torch.tensor(cu_k, dtype=torch.int32, device=DEVICE)
    outs = []
    for kc, vc in ((kr, vr), (kt, vt)):
        store_kvcache(k.to(DEVICE), v.to(DEVICE), kc, vc, slot_t, 0.5, 1.5)
        outs.append(varlen_prefill(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), kc, vc, tables.to(DEVICE), cu_q_t,
                                   cu_k_t, 21, 0.25, block_m=16, block_n=block_n, k_scale=0.5, v_scale=1.5).cpu())
    assert torch.allclose(outs[1], outs[0], atol=1e-6, rtol=0)
    ctx = PrefillMeta(cu_q_t.cpu(), cu_k_t.cpu(), 21, 49, tables, cu_q, cu_k)
    ref = torch_ref.prefill(q, k, v, kt.cpu(), vt.cpu(), ctx, 0.25, k_scale=0.5, v_scale=1.5)
    assert torch.allclose(outs[1], ref, atol=1e-4, rtol=0)


def _engine(model, v_t, monkeypatch, **kw):
    monkeypatch.setattr(engine.runner, "FP8_V_TRANSPOSED", v_t)
    args = dict(enforce_eager=True, device=DEVICE, max_model_len=512, max_num_batched_tokens=512,
                kvcache_block_size=16, dtype="float32", kv_cache_dtype="fp8")
    args.update(kw)
    return LLM(model, **args)


@pytest.mark.parametrize("block_n", [16, 128])
def test_a_fused_decode_step_over_keys_contiguous_v_gives_the_other_layouts_numbers(tiny_model, block_n,
                                                                                   monkeypatch):
    """The fused decode layer reads the older rows through the view (16: whole pages, unmasked) and writes the
    newest token's V keys-contiguous; the rows no sequence owns hold loud values."""
    from engine import fused_decode

    monkeypatch.setattr(decode_layer, "ATTN_BLOCK_N", block_n)
    lens, tables = [20, 33, 7], [[3, 0], [5, 1, 7], [2]]
    t = torch.tensor([r + [-1] * (3 - len(r)) for r in tables], dtype=torch.int32, device=DEVICE)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 1000, (sum(lens),), generator=g).to(DEVICE)
    new_ids = torch.randint(100, 1000, (3,), generator=g).to(DEVICE)
    pos = torch.cat([torch.arange(n) for n in lens]).to(DEVICE)
    slots = torch.tensor([tables[i][p // 16] * 16 + p % 16 for i, n in enumerate(lens) for p in range(n)],
                         dtype=torch.int32, device=DEVICE)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    new_slots = torch.tensor([tables[i][n // 16] * 16 + n % 16 for i, n in enumerate(lens)], dtype=torch.int32,
                             device=DEVICE)
    ctx = torch.tensor([n + 1 for n in lens], dtype=torch.int32, device=DEVICE)
    results = []
    for v_t in (False, True):
        llm = _engine(tiny_model, v_t, monkeypatch, num_kvcache_blocks=12, max_model_len=256, custom_kernels=False)
        runner = llm.model_runner
        assert runner.v_transposed == v_t
        loud = quantize(torch.randn(runner.kv_cache.shape, generator=torch.Generator().manual_seed(5)) * 100, 1.0)
        runner.kv_cache.copy_(loud.to(DEVICE))  # the same bytes: other values in either layout's unowned rows
        model = runner.model.model
        with torch.inference_mode():
            set_context(Context(slots, None, PrefillMeta(cu_t, cu_t, max(lens), max(lens), t, cu, cu)))
            model(ids, pos)
            set_context(Context(new_slots, DecodeMeta(3, ctx, t, ctx.tolist(), num_splits=2)))
            got = fused_decode.forward(model, new_ids, pos[:0].new_tensor(lens))
            reset_context()
            kv = llm.read_kv([tables[i][p // 16] * 16 + p % 16 for i, n in enumerate(lens) for p in range(n + 1)])
        results.append((got.cpu(), kv.cpu()))
        llm.exit()
    assert torch.allclose(results[1][0], results[0][0], atol=1e-5, rtol=0)
    assert torch.equal(results[1][1], results[0][1])  # every owned row, the decode's newest ones included


@pytest.mark.parametrize("backend, block_size, policy", [
    ("triton", 16, "prefill_first"), ("triton", 256, "prefill_first"), ("torch", 16, "prefill_first"),
    ("triton", 256, "mixed")])
def test_an_engine_over_keys_contiguous_v_generates_the_same_tokens(tiny_model, backend, block_size, policy,
                                                                    monkeypatch):
    """Two waves of requests share the pool (the second reuses blocks the first freed, whose rows it does not
    overwrite), with chunked prefill and prefix-cache hits: the tokens match. 256-token blocks: decode and
    prefill read whole tiles unmasked, past the context's end into the first wave's rows. mixed: prefill chunks
    and decodes in one step."""
    prompts = [[100 + (7 * i + 13 * j) % 900 for i in range(40 + 23 * j)] for j in range(3)]
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    runs = []
    for v_t in (False, True):
        llm = _engine(tiny_model, v_t, monkeypatch, attention_backend=backend, max_num_batched_tokens=64,
                      num_kvcache_blocks=24 if block_size == 16 else 4, kvcache_block_size=block_size,
                      scheduling_policy=policy)
        first = [o["token_ids"] for o in llm.generate(prompts, sp, use_tqdm=False)]
        second = [o["token_ids"] for o in llm.generate([p[:30] + [7, 8, 9] for p in prompts], sp, use_tqdm=False)]
        runs.append((first, second))
        llm.exit()
    assert runs[0] == runs[1]


@pytest.mark.parametrize("knob", [None, "1", "0"], ids=["default", "on", "off"])
def test_the_knob_switches_the_layout_and_is_recorded(tiny_model, tmp_path, knob):
    """LABKIT_FP8_V_TRANSPOSED is read at import: a process started without it or with 1 has a keys-contiguous V
    (an FP8 pool only), one started with 0 the head_dim-contiguous V of before session 19; and the knob is
    recorded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABKIT_")}
    if knob is not None:
        env["LABKIT_FP8_V_TRANSPOSED"] = knob
    code = ("import sys; from engine import LLM\n"
            "for kv in ('fp8', 'auto'):\n"
            "    llm = LLM(sys.argv[1], device='cpu', enforce_eager=True, kv_cache_dtype=kv, num_kvcache_blocks=4,\n"
            "              max_model_len=128, kvcache_block_size=16, dtype='float32')\n"
            "    a = llm.model_runner.attn_layers[0]\n"
            "    print(kv, llm.model_runner.v_transposed, a.v_cache.stride()[-2:])\n"
            "    llm.exit()\n")
    res = subprocess.run([sys.executable, "-c", code, tiny_model], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    if knob == "0":
        assert "fp8 False (" in res.stdout and "fp8 False (1, 16)" not in res.stdout
    else:
        assert "fp8 True (1, 16)" in res.stdout
    assert "auto False (" in res.stdout and "auto False (1, 16)" not in res.stdout
    from labkit.output import engine_knobs

    os.environ["LABKIT_FP8_V_TRANSPOSED"] = "1"
    try:
        assert engine_knobs().get("LABKIT_FP8_V_TRANSPOSED") == "1"
    finally:
        del os.environ["LABKIT_FP8_V_TRANSPOSED"]


def test_a_trace_case_over_keys_contiguous_v_keeps_its_states(tiny_model, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABKIT_FP8")}
    env["LABKIT_FP8_V_TRANSPOSED"] = "1"
    res = subprocess.run([sys.executable, "-m", "labkit", "trace", "--case", "preempt", "--model", tiny_model,
                          "--device", "cpu", "--kv-cache-dtype", "fp8", "-q", "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASS" in res.stdout and "CHANGED" not in res.stdout


def test_two_ranks_over_keys_contiguous_v_generate_one_ranks_tokens(tiny_model, monkeypatch):
    """Tensor parallel (gloo), started with the knob set (rank 0's pool keys-contiguous; the workers inherit the
    environment): the tokens are one rank's with the head_dim-contiguous pool."""
    import json

    prompts = [list(range(100, 400)), list(range(200, 296)) + [7, 8, 9], [42, 43, 44]]
    args = dict(device="cpu", enforce_eager=True, max_model_len=512, max_num_batched_tokens=256, max_num_seqs=8,
                kvcache_block_size=16, num_kvcache_blocks=64, kv_cache_dtype="fp8")
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    monkeypatch.setattr(engine.runner, "FP8_V_TRANSPOSED", False)
    llm = LLM(tiny_model, **args)
    want = [o["token_ids"] for o in llm.generate(prompts, sp, use_tqdm=False)]
    llm.exit()
    code = ("import json, sys; from engine import LLM, SamplingParams\n"
            "args, prompts = json.loads(sys.argv[2]), json.loads(sys.argv[3])\n"
            "llm = LLM(sys.argv[1], tensor_parallel_size=2, **args)\n"
            "assert llm.model_runner.v_transposed\n"
            "sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)\n"
            "print(json.dumps([o['token_ids'] for o in llm.generate(prompts, sp, use_tqdm=False)]))\n"
            "llm.exit()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABKIT_")}
    env["LABKIT_FP8_V_TRANSPOSED"] = "1"
    res = subprocess.run([sys.executable, "-c", code, tiny_model, json.dumps(args), json.dumps(prompts)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == want
