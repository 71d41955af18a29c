"""The engine's numbers against Transformers on the same fake weights, in float32.

Teacher forcing: every step feeds a fixed pseudo-random token instead of the sampled one, and each
accepted step's last-position logits row is compared with Transformers recomputing the whole prefix.
"""
from __future__ import annotations

import random

import pytest
import torch

from engine import LLM, SamplingParams
from engine.sampler import TeacherForcing
from engine.trace import ListTracer

TOL = 1e-4


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 2000) for _ in range(n)]


def _teacher_forced(llm, prompts, max_tokens, submit_after_finish=False):
    """Run prompts with forced tokens; return [(token_ids_so_far, logits_row)] for accepted steps."""
    rng = random.Random(1234)
    rows = []
    tokens: dict[int, list[int]] = {}  # seq id -> its prompt and the tokens forced so far

    def choose(plan, logits):
        out = []
        for j, i in enumerate(plan.sample_rows):
            seq = tokens[plan.seq_ids[i]]
            assert len(seq) == plan.num_tokens[i]
            rows.append((list(seq), logits[j].detach().float().cpu()))
            out.append(rng.randrange(100, 2000))
            seq.append(out[-1])
        return out

    llm.sampling = TeacherForcing(choose)
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    if submit_after_finish:
        for p in prompts:
            tokens[llm.add_request(p, sp)] = list(p)
            while not llm.is_finished():
                llm.step()
    else:
        for p in prompts:
            tokens[llm.add_request(p, sp)] = list(p)
        while not llm.is_finished():
            llm.step()
    return rows


def _check(rows, hf_logits, expected_rows):
    assert len(rows) == expected_rows
    for tokens, row in rows:
        ref = hf_logits(tokens)
        diff = (ref - row).abs().max().item()
        assert diff < TOL, f"logits differ by {diff:.2e} after {len(tokens)} tokens"


def test_full_prefill_and_decode(tiny_model, hf_logits):
    llm = LLM(tiny_model, enforce_eager=True, max_model_len=1024, num_kvcache_blocks=16)
    rows = _teacher_forced(llm, [_prompt(300, 1)], max_tokens=3)
    _check(rows, hf_logits, 3)


def test_chunked_prefill(tiny_model, hf_logits):
    # 700 tokens under a 256-token budget: two discarded chunk candidates, then the real prefill row.
    tracer = ListTracer()
    llm = LLM(tiny_model, enforce_eager=True, max_model_len=1024, max_num_batched_tokens=256,
              num_kvcache_blocks=16, tracer=tracer)
    rows = _teacher_forced(llm, [_prompt(700, 2), _prompt(32, 3)], max_tokens=3)
    _check(rows, hf_logits, 6)
    chunks = [e for e in tracer.events if e["event"] == "scheduled" and e["phase"] == "prefill"]
    assert [s["num_scheduled_tokens"] for s in chunks[0]["seqs"]] == [256]
    assert [s["num_scheduled_tokens"] for s in chunks[2]["seqs"]] == [188, 32]


def test_decode_across_block_boundary(tiny_model, hf_logits):
    # Block size 8: a 14-token prompt decodes through positions 14..21, taking blocks 2 and 3 on the way.
    llm = LLM(tiny_model, enforce_eager=True, max_model_len=256, kvcache_block_size=8, num_kvcache_blocks=16)
    rows = _teacher_forced(llm, [_prompt(14, 4)], max_tokens=9)
    _check(rows, hf_logits, 9)


def test_prefix_cache_hit(tiny_model, hf_logits):
    tracer = ListTracer()
    llm = LLM(tiny_model, enforce_eager=True, max_model_len=1024, max_num_batched_tokens=1024,
              num_kvcache_blocks=16, tracer=tracer)
    a = _prompt(620, 5)
    b = a[:512] + _prompt(108, 6)
    rows = _teacher_forced(llm, [a, b], max_tokens=2, submit_after_finish=True)
    _check(rows, hf_logits, 4)
    prefills = [e for e in tracer.events if e["event"] == "scheduled" and e["phase"] == "prefill"]
    second = prefills[1]["seqs"][0]
    assert (second["num_cached_tokens"], second["num_scheduled_tokens"]) == (512, 108)


def test_uneven_batch(tiny_model, hf_logits):
    llm = LLM(tiny_model, enforce_eager=True, max_model_len=512, kvcache_block_size=16, num_kvcache_blocks=64,
              max_num_batched_tokens=300)
    prompts = [_prompt(n, 10 + n) for n in (3, 50, 200, 17, 90)]
    rows = _teacher_forced(llm, prompts, max_tokens=4)
    _check(rows, hf_logits, 20)


def _hf_greedy(hf_model, prompt, n):
    out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                            pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def greedy_case(tiny_model, hf_model):
    prompts = [_prompt(n, 40 + n) for n in (5, 37, 130)]
    expected = [_hf_greedy(hf_model, p, 24) for p in prompts]
    return prompts, expected


def test_greedy_generation_equals_transformers(tiny_model, greedy_case):
    prompts, expected = greedy_case
    llm = LLM(tiny_model, enforce_eager=True, max_model_len=512, kvcache_block_size=16, num_kvcache_blocks=64)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    assert [o["token_ids"] for o in outs] == expected
    # The fake weights make continuations depend on the context, so this comparison has teeth.
    assert len({tuple(e) for e in expected}) == len(expected)
    assert all(len(set(e)) > 3 for e in expected)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_greedy_generation_under_the_mixed_policy_equals_transformers(tiny_model, greedy_case, async_scheduling):
    """Budget 48: the 130-id prompt is chunked beside the others' decodes, so most steps are mixed (decode rows
    through the decode kernel, prefill rows through the varlen one, in one forward pass)."""
    from engine.trace import ListTracer

    prompts, expected = greedy_case
    tracer = ListTracer()
    llm = LLM(tiny_model, enforce_eager=True, max_model_len=512, kvcache_block_size=16, num_kvcache_blocks=64,
              scheduling_policy="mixed", max_num_batched_tokens=48, async_scheduling=async_scheduling,
              tracer=tracer)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    assert [o["token_ids"] for o in outs] == expected
    phases = [e["phase"] for e in tracer.events if e["event"] == "scheduled"]
    assert phases.count("mixed") >= 2 and phases[0] == "prefill"


def test_a_request_seed_gives_the_same_tokens_whatever_runs_beside_it(tiny_model):
    """SamplingParams.seed: the request's own random stream, as vLLM's per-request seed. Alone, or in a batch
    with other requests (other rows, other steps), it samples the same tokens; another seed samples others."""
    sp = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=1234)
    prompt = _prompt(20, 9)
    llm = LLM(tiny_model, enforce_eager=True, max_model_len=256, num_kvcache_blocks=16, seed=1)
    alone = llm.generate([prompt], sp, use_tqdm=False)[0]["token_ids"]
    crowd = llm.generate([_prompt(7, 1), prompt, _prompt(50, 2)], [SamplingParams(temperature=1.0, max_tokens=5),
                         sp, SamplingParams(temperature=0.7, max_tokens=20)], use_tqdm=False)[1]["token_ids"]
    other = llm.generate([prompt], SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=99),
                         use_tqdm=False)[0]["token_ids"]
    llm.exit()
    again = LLM(tiny_model, enforce_eager=True, max_model_len=256, num_kvcache_blocks=16, seed=5).generate(
        [prompt], sp, use_tqdm=False)[0]["token_ids"]  # another engine seed: the request's seed decides
    assert alone == crowd == again
    assert other != alone


@pytest.mark.parametrize("breakage", ["no_causal_mask", "decode_sees_last_key_only"])
def test_broken_attention_changes_greedy_tokens(tiny_model, greedy_case, monkeypatch, breakage):
    from engine.backends import torch_ref

    if breakage == "no_causal_mask":
        def attend(q, k, v, scale):
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            p = (torch.einsum("qhd,khd->hqk", q, k) * scale).softmax(-1)
            return torch.einsum("hqk,khd->qhd", p, v)
        monkeypatch.setattr(torch_ref, "_attend", attend)
    else:
        real_decode = torch_ref.decode

        def decode(q, k_cache, v_cache, ctx, scale):
            ctx.block_tables = ctx.block_tables.clone()
            ctx.context_lens = torch.ones_like(ctx.context_lens)  # forget all but position 0
            return real_decode(q, k_cache, v_cache, ctx, scale)
        monkeypatch.setattr(torch_ref, "decode", decode)
    prompts, expected = greedy_case
    llm = LLM(tiny_model, enforce_eager=True, max_model_len=512, kvcache_block_size=16, num_kvcache_blocks=64)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    assert [o["token_ids"] for o in outs] != expected


def test_sampling_is_reproducible_and_respects_top_k(tiny_model):
    prompts = [_prompt(20, 7), _prompt(9, 8)]
    sp = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, top_k=3)
    runs = []
    for _ in range(2):
        llm = LLM(tiny_model, enforce_eager=True, max_model_len=256, num_kvcache_blocks=8, seed=3)
        runs.append([o["token_ids"] for o in llm.generate(prompts, sp, use_tqdm=False)])
    assert runs[0] == runs[1]
    greedy = LLM(tiny_model, enforce_eager=True, max_model_len=256, num_kvcache_blocks=8).generate(
        prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    assert runs[0] != [o["token_ids"] for o in greedy]
