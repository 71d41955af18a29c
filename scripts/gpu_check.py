"""One device call: correctness of the GPU path, then the headline timings. Writes a JSON log.

    python3 scripts/gpu_check.py --out $OUT/gpu_check.json [--skip-bench]

Correctness: triton kernels vs the torch backend; engine (triton, eager and graph) teacher-forced logits
vs Transformers on fake Qwen3-0.6B in bf16; greedy tokens eager vs graph. Timing (tracing off): the nano
workload with graphs, batch-1 decode latency with graphs and eagerly."""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import LLM, SamplingParams  # noqa: E402

LOG: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "results": {}}


def note(key, value):
    LOG["results"][key] = value
    print(f"[{time.strftime('%H:%M:%S')}] {key}: {json.dumps(value)[:600]}", flush=True)


def teacher_forced_rows(llm, prompts, max_tokens, seed=0):
    rng = random.Random(seed)
    rows = []

    def choose(seqs, logits):
        out = []
        for s, row in zip(seqs, logits):
            if s.num_cached_tokens + s.num_scheduled_tokens == s.num_tokens:
                rows.append((list(s.token_ids), row.float().cpu()))
            out.append(rng.randrange(100, 10000))
        return out

    for p in prompts:
        llm.add_request(p, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    while not llm.is_finished():
        llm.step(choose)
    return rows


def nano_workload(n=256):
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(n)]
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=random.randint(100, 1024)) for _ in range(n)]
    return prompts, params


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="/tmp/qwen3-fake")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--skip-correct", action="store_true")
    args = ap.parse_args()
    dev = torch.cuda.get_device_name(0)
    note("device", {"name": dev, "torch": torch.__version__, "cuda": torch.version.cuda})
    if not os.path.exists(os.path.join(args.model, "config.json")):
        from labkit.fake_model import make_fake_model
        t = time.time()
        make_fake_model("qwen3-0.6b", args.model, seed=0)
        note("make_model_s", time.time() - t)
    try:
        if not args.skip_correct:
            correctness(args)
        if not args.skip_bench:
            bench(args)
    finally:
        LOG["ended"] = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(args.out, "w") as f:
            json.dump(LOG, f, indent=1)


def correctness(args):
    from transformers import Qwen3ForCausalLM

    rng = random.Random(1)
    prompts = [[rng.randrange(100, 10000) for _ in range(n)] for n in (3, 37, 300, 700)]
    common = dict(max_model_len=2048, max_num_batched_tokens=512, kvcache_block_size=256, num_kvcache_blocks=64)
    rows = {}
    for name, kw in {"torch_eager": dict(attention_backend="torch", enforce_eager=True),
                     "triton_eager": dict(attention_backend="triton", enforce_eager=True),
                     "triton_graph": dict(attention_backend="triton", enforce_eager=False, max_num_seqs=20),
                     "triton_graph_no_custom": dict(attention_backend="triton", enforce_eager=False, max_num_seqs=20,
                                                    custom_kernels=False)}.items():
        t = time.time()
        llm = LLM(args.model, **common, **kw)
        rows[name] = teacher_forced_rows(llm, prompts, 4)
        note(f"collect_{name}", {"rows": len(rows[name]), "s": round(time.time() - t, 2),
                                 "execution": llm.model_runner.execution,
                                 "capture_s": llm.model_runner.graph_capture_seconds})
        llm.exit()
        del llm
        torch.cuda.empty_cache()
    hf = Qwen3ForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, attn_implementation="eager").cuda().eval()
    ref = []
    with torch.no_grad():
        for toks, _ in rows["torch_eager"]:
            ref.append(hf(torch.tensor([toks], device="cuda"), use_cache=False).logits[0, -1].float().cpu())
    for name, rr in rows.items():
        worst_abs, worst_rel, top1 = 0.0, 0.0, 0
        for (toks, row), (toks2, _), r in zip(rr, rows["torch_eager"], ref):
            assert toks == toks2
            d = (row - r)
            worst_abs = max(worst_abs, d.abs().max().item())
            worst_rel = max(worst_rel, (d.norm() / r.norm()).item())
            top1 += int(row.argmax() == r.argmax())
        note(f"vs_hf_{name}", {"max_abs": worst_abs, "rel_l2": worst_rel, "top1_agree": f"{top1}/{len(rr)}",
                               "pass_bf16": worst_abs < 0.5 and worst_rel < 0.02})
    del hf
    torch.cuda.empty_cache()
    # Greedy tokens: graph vs eager, 17 requests with max_num_seqs 20 (no bucket covers 17: eager fallback).
    ps = [[rng.randrange(100, 10000) for _ in range(rng.randint(5, 300))] for _ in range(17)]
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    out = {}
    for eager in (True, False):
        llm = LLM(args.model, max_model_len=1024, max_num_seqs=20, enforce_eager=eager, attention_backend="triton",
                  gpu_memory_utilization=0.5)
        out[eager] = [o["token_ids"] for o in llm.generate(ps, sp, use_tqdm=False)]
        llm.exit()
        del llm
        torch.cuda.empty_cache()
    same = sum(a == b for a, b in zip(out[True], out[False]))
    note("greedy_graph_vs_eager_17req", {"identical_sequences": f"{same}/17"})


def kernel_bench():
    """Decode attention alone: bandwidth of K+V bytes read, against the ~4.2 TB/s copy ceiling."""
    from engine.kernels.decode_attention import num_splits_for, paged_decode
    res = {}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for batch, ctx in ((256, 800), (256, 2048), (32, 4096), (8, 16384), (1, 1024)):
        bs = 256
        nblk = batch * (-(-ctx // bs))
        kc = torch.randn(nblk, 8, bs, 128, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        tables = torch.randperm(nblk, device="cuda", dtype=torch.int32).view(batch, -1)
        lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        q = torch.randn(batch, 16, 128, device="cuda", dtype=torch.bfloat16)
        splits = num_splits_for(batch, 8, ctx, sms)
        for _ in range(3):
            paged_decode(q, kc, vc, tables, lens, 0.088, splits)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(20):
            start.record()
            paged_decode(q, kc, vc, tables, lens, 0.088, splits)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        ms = sorted(times)[len(times) // 2]
        res[f"{batch}x{ctx}"] = {"ms": round(ms, 4), "TB_s": round(2 * batch * ctx * 8 * 128 * 2 / ms / 1e9, 2),
                                 "splits": splits}
        del kc, vc
    torch.cuda.empty_cache()
    note("decode_kernel", res)


def kernel_sweep():
    """Decode-attention tuning knobs on the two shapes that matter (nano-like and long context)."""
    from engine.kernels.decode_attention import num_splits_for, paged_decode
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {}
    for batch, ctx in ((256, 800), (32, 4096)):
        nblk = batch * (-(-ctx // 256))
        kc = torch.randn(nblk, 8, 256, 128, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        tables = torch.randperm(nblk, device="cuda", dtype=torch.int32).view(batch, -1)
        lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        q = torch.randn(batch, 16, 128, device="cuda", dtype=torch.bfloat16)
        splits = num_splits_for(batch, 8, ctx, sms)
        ref = paged_decode(q, kc, vc, tables, lens, 0.088, splits)
        for block_n in (32, 64, 128):
            for page_tiles in (False, True):
                for warps in (4, 8):
                    for stages in (2, 3):
                        kw = dict(block_n=block_n, page_tiles=page_tiles, num_warps=warps, num_stages=stages)
                        try:
                            out = paged_decode(q, kc, vc, tables, lens, 0.088, splits, **kw)
                            err = (out.float() - ref.float()).abs().max().item()
                            torch.cuda.synchronize()
                            times = []
                            for _ in range(15):
                                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                                a.record()
                                paged_decode(q, kc, vc, tables, lens, 0.088, splits, **kw)
                                b.record()
                                b.synchronize()
                                times.append(a.elapsed_time(b))
                            ms = sorted(times)[7]
                            res[f"{batch}x{ctx} n{block_n} pt{int(page_tiles)} w{warps} s{stages}"] = {
                                "ms": round(ms, 4), "TB_s": round(2 * batch * ctx * 2048 * 2 / ms / 1e9, 2),
                                "max_err": err}
                        except Exception as e:  # a configuration that does not compile is a result too
                            res[f"{batch}x{ctx} n{block_n} pt{int(page_tiles)} w{warps} s{stages}"] = {"error": str(e)[:120]}
        del kc, vc
    torch.cuda.empty_cache()
    best = sorted((v["ms"], k) for k, v in res.items() if "ms" in v)
    note("decode_kernel_sweep", res)
    note("decode_kernel_sweep_best", best[:6])


def prefill_throughput(args):
    """Prefill alone: full 16,384-token batches of 1,024-token prompts, one output token each."""
    llm = LLM(args.model, max_model_len=4096, attention_backend="triton")
    prompts = [[(7 * i + j) % 10000 for j in range(1024)] for i in range(64)]
    sp = SamplingParams(temperature=0.6, max_tokens=1, ignore_eos=True)
    llm.generate(prompts[:16], sp, use_tqdm=False)
    torch.cuda.synchronize()
    t = time.time()
    llm.generate([[p[0] + 1] + p[1:] for p in prompts], sp, use_tqdm=False)  # no prefix-cache hits
    torch.cuda.synchronize()
    dt = time.time() - t
    # ~2 x 0.6 GFLOP per token for the GEMMs, plus attention (~2 x 28 x 2 x 1024 x 512 x 2048 per 1k prompt).
    note("prefill_tok_s", {"tokens": 64 * 1024, "s": round(dt, 3), "tok_s": round(64 * 1024 / dt)})
    llm.exit()


def _timed_nano(llm, prompts, params, out_tokens, repeats=2):
    """Warm up, then `repeats` timed nano runs: (wall seconds, output tok/s) lists."""
    llm.generate([[1, 2, 3]] * 4, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    runs = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.time()
        llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
        runs.append(time.time() - t)
    return [round(r, 3) for r in runs], [round(out_tokens / r) for r in runs]


def sampler_ratio(args, prompts, params, out_tokens):
    """The nano workload with the torch sampler and with the one-pass Triton sampler, same process."""
    for sampler in ("torch", "triton"):
        llm = LLM(args.model, max_model_len=4096, attention_backend="triton", sampler=sampler)
        wall, tok_s = _timed_nano(llm, prompts, params, out_tokens)
        note(f"nano_sampler_{sampler}", {"wall_s": wall, "output_tok_s": tok_s})
        llm.exit()
        del llm
        torch.cuda.empty_cache()


def profile_steps(llm, prompts, params):
    """Where a step's time goes (host clocks, with a device sync after the forward pass)."""
    import collections
    acc = collections.defaultdict(float)
    sched, runner = llm.scheduler, llm.model_runner

    def wrap(obj, name, sync=False):
        fn = getattr(obj, name)

        def timed(*a, **k):
            t = time.perf_counter()
            r = fn(*a, **k)
            if sync:
                torch.cuda.synchronize()
            acc[name] += time.perf_counter() - t
            return r
        setattr(obj, name, timed)
        return fn

    originals = [(sched, "schedule", wrap(sched, "schedule")), (runner, "prepare", wrap(runner, "prepare")),
                 (runner, "forward_logits", wrap(runner, "forward_logits", True)),
                 (runner, "sample", wrap(runner, "sample")), (sched, "postprocess", wrap(sched, "postprocess"))]
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    total = time.perf_counter() - t
    for obj, name, fn in originals:
        setattr(obj, name, fn)
    note("step_profile_s", {"total": round(total, 3), **{k: round(v, 3) for k, v in acc.items()},
                            "steps": llm.step_count})


def profile_bs1(llm):
    """Batch-1 decode under torch.profiler: GPU kernel time per step against wall time per step, the top
    kernels, and host-side time per engine stage (so the gap between the two is attributed)."""
    import collections
    from torch.profiler import ProfilerActivity, profile

    one = [[5] * 128]
    sp = SamplingParams(temperature=0.6, max_tokens=65, ignore_eos=True)
    llm.generate(one, sp, use_tqdm=False)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        llm.generate(one, sp, use_tqdm=False)
        torch.cuda.synchronize()
    out = os.environ.get("OUT")
    if out:
        prof.export_chrome_trace(os.path.join(out, "bs1_profile.json"))
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total_us = sum(e.self_device_time_total for e in kernels)
    top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:25]
    note("bs1_profile_kernels", {"gpu_us_per_step": round(total_us / 65, 1),
                                 "kernel_launches_per_step": round(sum(e.count for e in kernels) / 65, 1),
                                 "top": [(e.key[:70], e.count, round(e.self_device_time_total / 65, 1)) for e in top]})
    host_ops = sorted((e for e in prof.key_averages() if e.device_type.name == "CPU"),
                      key=lambda e: -e.self_cpu_time_total)[:25]
    note("bs1_profile_host", [(e.key[:60], e.count, round(e.self_cpu_time_total / 65, 1)) for e in host_ops])
    # Host stages with a sync after each, so each stage's number includes the device work it waits for.
    acc = collections.defaultdict(float)
    sched, runner = llm.scheduler, llm.model_runner
    originals = []
    for obj, name in ((sched, "schedule"), (runner, "prepare"), (runner, "forward_logits"), (runner, "sample"),
                      (sched, "postprocess")):
        fn = getattr(obj, name)
        originals.append((obj, name, fn))

        def timed(*a, _fn=fn, _name=name, **k):
            t = time.perf_counter()
            r = _fn(*a, **k)
            torch.cuda.synchronize()
            acc[_name] += time.perf_counter() - t
            return r
        setattr(obj, name, timed)
    sp = SamplingParams(temperature=0.6, max_tokens=257, ignore_eos=True)
    t = time.perf_counter()
    llm.generate(one, sp, use_tqdm=False)
    total = time.perf_counter() - t
    for obj, name, fn in originals:
        setattr(obj, name, fn)
    note("bs1_stage_us_per_step", {"total": round(total * 1e6 / 257, 1),
                                   **{k: round(v * 1e6 / 257, 1) for k, v in acc.items()}})


def _cuda_ms(fn, reps=50):
    from engine.kernels.timing import events_ms

    return events_ms(fn, reps)


def _graph_us(fn, reps=20):
    """Per-call device time of `fn` replayed from a CUDA graph of `reps` calls (no launch overhead)."""
    from engine.kernels.timing import graph_ms

    return graph_ms(fn, calls=reps, replays=7) * 1000


def gemv_graph_sweep():
    """Decode-sized GEMMs timed inside CUDA graphs (as the engine runs them): cuBLAS, our default config, and
    a sweep of the knobs."""
    import torch.nn.functional as F

    from engine.kernels.small_gemm import small_gemm_config, small_matmul
    g = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res, best = {}, {}
    for name, (n, k) in {"qkv": (4096, 1024), "o_proj": (1024, 2048), "gate_up": (6144, 1024),
                         "down": (1024, 3072)}.items():
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        for m in (1, 8):
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            row = {"cublas": round(_graph_us(lambda: F.linear(x, w)), 2),
                   "default": round(_graph_us(lambda: small_matmul(x, w)), 2),
                   "default_cfg": small_gemm_config(m, n, k, sms)}
            for bn in (16, 32, 64):
                for bk in (128, 256):
                    for sk in (1, 2, 4, 8):
                        kw = dict(block_n=bn, block_k=bk, split_k=sk, num_stages=4)
                        try:
                            row[f"n{bn} k{bk} s{sk}"] = round(_graph_us(lambda: small_matmul(x, w, **kw)), 2)
                        except Exception as e:  # noqa: BLE001 - a config that fails is a result
                            row[f"n{bn} k{bk} s{sk}"] = str(e)[:50]
            timed = [(v, c) for c, v in row.items() if c.startswith("n") and isinstance(v, float)]
            best[f"{name} m{m}"] = {"cublas": row["cublas"], "default": row["default"], "best": min(timed),
                                    "weight_GB_s_best": round(n * k * 2 / min(timed)[0] / 1e3)}
            res[f"{name} m{m}"] = row
    note("gemv_graph_best", best)
    LOG["results"]["gemv_graph_sweep"] = res


def qk_check():
    """The fused q/k norm + RoPE kernel against eager torch (the reference it must equal) in bf16."""
    from engine.kernels.qk_norm_rope import qk_norm_rope
    from engine.layers import fused
    from engine.layers.rope import RotaryEmbedding
    g = torch.Generator(device="cuda").manual_seed(0)
    rope = RotaryEmbedding(128, 40960, 1e6).cuda()
    res = {}
    for t in (1, 256, 4096):
        qkv = torch.randn(t, 4096, device="cuda", generator=g).to(torch.bfloat16)
        pos = torch.randint(0, 4000, (t,), device="cuda", generator=g)
        qw = (1 + 0.1 * torch.randn(128, device="cuda", generator=g)).to(torch.bfloat16)
        kw = (1 + 0.1 * torch.randn(128, device="cuda", generator=g)).to(torch.bfloat16)
        q, k, _ = qkv.split([2048, 1024, 1024], dim=-1)
        q0, k0 = fused.qk_norm_rope(q.view(-1, 16, 128), k.view(-1, 8, 128), qw, kw, 1e-6, rope.cos_sin_cache[pos])
        q2, k2 = qk_norm_rope(qkv, pos, rope.cos_sin_cache, qw, kw, 1e-6, 16, 8, 128)
        res[f"T{t}"] = {"max_abs": max((q2.float() - q0.float()).abs().max().item(),
                                       (k2.float() - k0.float()).abs().max().item()),
                        "equal_frac": round(((q2 == q0).float().mean().item() + (k2 == k0).float().mean().item()) / 2, 6),
                        "graph_us": round(_graph_us(lambda: qk_norm_rope(qkv, pos, rope.cos_sin_cache, qw, kw, 1e-6,
                                                                         16, 8, 128)), 2)}
    note("qk_norm_rope_check", res)


def custom_kernel_bench():
    """Our decode-sized GEMM and fused q/k norm + RoPE kernels against what they replace, with errors."""
    import torch.nn.functional as F

    from engine.kernels.qk_norm_rope import qk_norm_rope
    from engine.kernels.small_gemm import small_matmul
    from engine.layers import fused
    from engine.layers.rope import RotaryEmbedding
    res = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, (n, k) in {"qkv": (4096, 1024), "o_proj": (1024, 2048), "gate_up": (6144, 1024),
                         "down": (1024, 3072), "lm_head": (151936, 1024)}.items():
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        for m in (1, 2, 4, 8, 16):
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = F.linear(x, w)
            out = small_matmul(x, w)
            err = (out.float() - ref.float()).abs().max().item()
            t_ref = _cuda_ms(lambda: F.linear(x, w))
            t_our = _cuda_ms(lambda: small_matmul(x, w))
            res[f"{name} m{m}"] = {"cublas_us": round(t_ref * 1000, 1), "triton_us": round(t_our * 1000, 1),
                                   "triton_TB_s": round(n * k * 2 / t_our / 1e9, 2), "max_err": err,
                                   "ref_max": ref.abs().max().item()}
    note("small_gemm_vs_cublas", res)
    sweep = {}
    for name, (n, k) in {"qkv": (4096, 1024), "o_proj": (1024, 2048), "gate_up": (6144, 1024),
                         "down": (1024, 3072)}.items():
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        for m in (1, 16):
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            for bn in (16, 32):
                for bk in (128, 256):
                    for sk in (1, 2, 4, 8):
                        for st in (3, 4):
                            kw = dict(block_n=bn, block_k=bk, split_k=sk, num_stages=st)
                            try:
                                sweep[f"{name} m{m} n{bn} k{bk} s{sk} st{st}"] = round(
                                    _cuda_ms(lambda: small_matmul(x, w, **kw), reps=15) * 1000, 1)
                            except Exception as e:  # noqa: BLE001 - a config that fails to compile is a result
                                sweep[f"{name} m{m} n{bn} k{bk} s{sk} st{st}"] = str(e)[:60]
    best = {}
    for key, us in sweep.items():
        shape = " ".join(key.split()[:2])
        if isinstance(us, float) and (shape not in best or us < best[shape][1]):
            best[shape] = (key, us)
    note("small_gemm_sweep_best", best)
    LOG["results"]["small_gemm_sweep"] = sweep
    rope = RotaryEmbedding(128, 40960, 1e6).cuda()
    compiled = torch.compile(fused.qk_norm_rope, dynamic=True)
    res = {}
    for t in (1, 16, 256, 4096):
        qkv = torch.randn(t, 4096, device="cuda", generator=g).to(torch.bfloat16)
        pos = torch.randint(0, 4000, (t,), device="cuda", generator=g)
        qw = (1 + 0.1 * torch.randn(128, device="cuda", generator=g)).to(torch.bfloat16)
        kw = (1 + 0.1 * torch.randn(128, device="cuda", generator=g)).to(torch.bfloat16)

        def ref():
            q, k, _ = qkv.split([2048, 1024, 1024], dim=-1)
            return compiled(q.view(-1, 16, 128), k.view(-1, 8, 128), qw, kw, 1e-6, rope.cos_sin_cache[pos])

        def eager():
            q, k, _ = qkv.split([2048, 1024, 1024], dim=-1)
            return fused.qk_norm_rope(q.view(-1, 16, 128), k.view(-1, 8, 128), qw, kw, 1e-6, rope.cos_sin_cache[pos])

        ours = lambda: qk_norm_rope(qkv, pos, rope.cos_sin_cache, qw, kw, 1e-6, 16, 8, 128)  # noqa: E731
        (q0, k0), (q1, k1), (q2, k2) = eager(), ref(), ours()
        res[f"T{t}"] = {"compiled_us": round(_cuda_ms(ref) * 1000, 1), "triton_us": round(_cuda_ms(ours) * 1000, 1),
                        "triton_vs_eager_max_abs": max((q2.float() - q0.float()).abs().max().item(),
                                                       (k2.float() - k0.float()).abs().max().item()),
                        "triton_vs_eager_equal_frac": round(((q2 == q0).float().mean().item()
                                                             + (k2 == k0).float().mean().item()) / 2, 5),
                        "compiled_vs_eager_equal_frac": round(((q1 == q0).float().mean().item()
                                                               + (k1 == k0).float().mean().item()) / 2, 5)}
    note("qk_norm_rope_vs_compiled", res)


def _bs1(llm, temperature):
    one = [[5] * 128]
    llm.generate(one, SamplingParams(temperature=temperature, max_tokens=16, ignore_eos=True), use_tqdm=False)
    times = {}
    for n in (1, 257):
        torch.cuda.synchronize()
        t = time.time()
        llm.generate(one, SamplingParams(temperature=temperature, max_tokens=n, ignore_eos=True), use_tqdm=False)
        torch.cuda.synchronize()
        times[n] = time.time() - t
    return round((times[257] - times[1]) * 1000 / 256, 3)


def engine_variants(args, prompts, params, out_tokens):
    """Before/after in one process: our custom kernels on and off (same staging, same sampler)."""
    for custom in (False, True):
        t = time.time()
        llm = LLM(args.model, max_model_len=4096, custom_kernels=custom)
        init = time.time() - t
        wall, tok_s = _timed_nano(llm, prompts, params, out_tokens)
        note(f"variant_custom_kernels_{custom}", {
            "init_s": round(init, 2), "capture_s": round(llm.model_runner.graph_capture_seconds or 0, 2),
            "nano_wall_s": wall, "nano_tok_s": tok_s,
            "bs1_greedy_ms": _bs1(llm, 0.0), "bs1_t06_ms": _bs1(llm, 0.6)})
        if custom and os.environ.get("GPU_CHECK_PROFILE_BS1"):
            profile_bs1(llm)
        llm.exit()
        del llm
        torch.cuda.empty_cache()


def bench(args):
    if os.environ.get("GPU_CHECK_SWEEP"):
        qk_check()
        gemv_graph_sweep()
        return
    if os.environ.get("GPU_CHECK_CUSTOM"):
        prompts, params = nano_workload()
        engine_variants(args, prompts, params, sum(p.max_tokens for p in params))
        return
    kernel_bench()
    prompts, params = nano_workload()
    if os.environ.get("GPU_CHECK_VARIANTS"):
        kernel_sweep()
        prefill_throughput(args)
        sampler_ratio(args, prompts, params, sum(p.max_tokens for p in params))
    out_tokens = sum(p.max_tokens for p in params)
    note("nano_workload", {"prompt_tokens": sum(map(len, prompts)), "output_tokens": out_tokens})
    for eager in (False,):
        t = time.time()
        llm = LLM(args.model, max_model_len=4096, enforce_eager=eager, attention_backend="triton")
        init = time.time() - t
        llm.generate([[1, 2, 3]] * 4, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)  # warm-up
        torch.cuda.synchronize()
        runs = []
        for _ in range(2):
            t = time.time()
            llm.generate(prompts, params, use_tqdm=False)
            torch.cuda.synchronize()
            runs.append(time.time() - t)
        note(f"nano_{'eager' if eager else 'graph'}", {
            "init_s": round(init, 2), "capture_s": llm.model_runner.graph_capture_seconds,
            "kv_blocks": llm.config.num_kvcache_blocks, "wall_s": [round(r, 3) for r in runs],
            "output_tok_s": [round(out_tokens / r) for r in runs],
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)})
        # Batch-1 decode latency on the same engine: warm up at batch 1, then the difference between a
        # 257-token and a 1-token generation isolates 256 decode steps.
        one = [[5] * 128]
        llm.generate(one, SamplingParams(temperature=0.6, max_tokens=16, ignore_eos=True), use_tqdm=False)
        times = {}
        for n in (1, 257):
            torch.cuda.synchronize()
            t = time.time()
            llm.generate(one, SamplingParams(temperature=0.6, max_tokens=n, ignore_eos=True), use_tqdm=False)
            torch.cuda.synchronize()
            times[n] = time.time() - t
        note("bs1_graph_ms_per_token", round((times[257] - times[1]) * 1000 / 256, 3))
        for n in (1, 257):
            torch.cuda.synchronize()
            t = time.time()
            llm.generate(one, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
            torch.cuda.synchronize()
            times[n] = time.time() - t
        note("bs1_graph_greedy_ms_per_token", round((times[257] - times[1]) * 1000 / 256, 3))
        if os.environ.get("GPU_CHECK_PROFILE"):
            profile_steps(llm, prompts, params)
        if os.environ.get("GPU_CHECK_PROFILE_BS1"):
            profile_bs1(llm)
        llm.exit()
        del llm
        torch.cuda.empty_cache()
    if not os.environ.get("GPU_CHECK_EAGER_BS1"):
        return
    llm = LLM(args.model, max_model_len=4096, enforce_eager=True, attention_backend="triton")
    llm.generate([[5] * 128], SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    t = time.time()
    llm.generate([[5] * 128], SamplingParams(temperature=0.6, max_tokens=257, ignore_eos=True), use_tqdm=False)
    torch.cuda.synchronize()
    note("bs1_eager_ms_per_token", round((time.time() - t) * 1000 / 257, 3))


if __name__ == "__main__":
    main()
