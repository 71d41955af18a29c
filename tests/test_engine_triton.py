"""The whole engine on the triton backend (Triton's interpreter on CPU, the real kernels on a GPU)
against the torch reference backend and Transformers."""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

from engine import LLM, SamplingParams  # noqa: E402

from .test_engine_numbers import _check, _prompt, _teacher_forced  # noqa: E402


def _llm(model, backend, **kw):
    args = dict(enforce_eager=True, max_model_len=1024, kvcache_block_size=16, num_kvcache_blocks=96,
                max_num_batched_tokens=128, attention_backend=backend)
    args.update(kw)
    return LLM(model, **args)


def _llm_choosing(monkeypatch, model, backend, choice: dict, **kw):
    """An engine whose kernel choice is forced (the runner makes these CUDA-only choices itself)."""
    import dataclasses

    import engine.runner

    choose = engine.runner.choose_kernels
    monkeypatch.setattr(engine.runner, "choose_kernels", lambda *a: dataclasses.replace(choose(*a), **choice))
    try:
        return _llm(model, backend, **kw)
    finally:
        monkeypatch.setattr(engine.runner, "choose_kernels", choose)


def test_triton_greedy_equals_torch_backend(tiny_model):
    prompts = [_prompt(n, 70 + n) for n in (4, 29, 150)]
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    outs = {b: [o["token_ids"] for o in _llm(tiny_model, b).generate(prompts, sp, use_tqdm=False)]
            for b in ("torch", "triton")}
    assert outs["triton"] == outs["torch"]


def test_triton_logits_match_transformers_with_chunks_and_prefix_hits(tiny_model, hf_logits):
    llm = _llm(tiny_model, "triton")
    a = _prompt(300, 90)
    rows = _teacher_forced(llm, [a, a[:256] + _prompt(20, 91)], max_tokens=3, submit_after_finish=True)
    _check(rows, hf_logits, 6)


def test_triton_sampler_in_the_engine(tiny_model, monkeypatch):
    prompts = [_prompt(12, 5), _prompt(7, 6)]
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    hot = SamplingParams(temperature=0.8, max_tokens=6, ignore_eos=True)
    base = [o["token_ids"] for o in _llm(tiny_model, "torch").generate(prompts, greedy, use_tqdm=False)]

    def gumbel(**kw):
        return _llm_choosing(monkeypatch, tiny_model, "torch", {"gumbel_sampler": True}, **kw)

    from engine.kernels import gumbel_sampler

    calls = []
    real = gumbel_sampler.gumbel_argmax
    monkeypatch.setattr(gumbel_sampler, "gumbel_argmax", lambda *a: calls.append(1) or real(*a))
    assert [o["token_ids"] for o in gumbel().generate(prompts, greedy, use_tqdm=False)] == base
    assert calls  # the steps did go through the Triton sampler
    a = [o["token_ids"] for o in gumbel(seed=4).generate(prompts, hot, use_tqdm=False)]
    b = [o["token_ids"] for o in gumbel(seed=4).generate(prompts, hot, use_tqdm=False)]
    assert a == b and all(len(x) == 6 for x in a)


def test_custom_kernels_in_the_model_match_transformers(tiny_model, hf_logits, monkeypatch):
    """The GEMV and the fused elementwise kernels (q/k norm + RoPE, the norms, SiLU*up) wired into the real
    model. The runner enables them only on CUDA, and the GEMV only while a CUDA graph is captured, so both
    switches are forced here."""
    import torch

    from engine.kernels import small_gemm

    llm = _llm_choosing(monkeypatch, tiny_model, "triton", {"custom_kernels": True, "fused_elementwise": True},
                        max_num_batched_tokens=16)
    calls = []
    real = small_gemm.small_matmul
    monkeypatch.setattr(small_gemm, "small_matmul", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    layer = llm.model_runner.model.model.layers[0]
    assert layer.self_attn._qk_kernel and layer.mlp.down_proj._small_gemm
    a = _prompt(40, 92)
    rows = _teacher_forced(llm, [a, _prompt(9, 93)], max_tokens=3)
    assert calls  # decode steps (2 rows) and the 9-token prefill went through the GEMV
    _check(rows, hf_logits, 6)


def test_triton_prefill_is_paged_but_the_event_keeps_nanos_block_tables(tiny_model):
    """The triton backend reads every prefill key through the pool, so the runner hands it block tables in a
    prefill without a cached prefix; the gpu_inputs event still records null there, as nano-vLLM has none."""
    from engine.trace import ListTracer

    tracer = ListTracer()
    llm = _llm(tiny_model, "triton", tracer=tracer)
    llm.add_request(_prompt(20, 5), SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    result = llm.step()
    assert result.phase == "prefill" and [len(row) for row in result.inputs.block_tables] == [2]
    event = [e for e in tracer.events if e["event"] == "gpu_inputs"][-1]
    assert event["step"] == 1 and event["block_tables"] is None
    llm.exit()
