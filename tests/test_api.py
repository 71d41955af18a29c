"""The Python API: nano-vLLM compatible calls, and a ValueError naming the argument for every bad input."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_model):
    return LLM(tiny_model, enforce_eager=True, max_model_len=256, max_num_seqs=8, max_num_batched_tokens=512,
               kvcache_block_size=16, num_kvcache_blocks=32)


def test_generate_text_and_ids_in_prompt_order(llm):
    outs = llm.generate(["hello there", [100, 200, 300]],
                        SamplingParams(temperature=0.6, max_tokens=2, ignore_eos=True),
                        use_tqdm=False)
    assert len(outs) == 2
    for out in outs:
        assert len(out["token_ids"]) == 2 and isinstance(out["text"], str)
    again = llm.generate([[100, 200, 300]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
                         use_tqdm=False)
    assert len(again[0]["token_ids"]) == 3


def test_step_api(llm):
    seq_id = llm.add_request([101, 102, 103], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    results = []
    while not llm.is_finished():
        results.append(llm.step())
    assert [r.phase for r in results] == ["prefill", "decode", "decode"]
    assert [r.num_computed_tokens for r in results] == [3, 1, 1] and all(r.batch_size == 1 for r in results)
    new = [t for r in results for t in r.token_ids]
    assert all(isinstance(t, int) for t in new) and len(new) == 3
    assert [r.finish_reasons[0] for r in results] == [None, None, "length"]
    assert llm.get_sequence(seq_id).completion_token_ids == new
    assert results[-1].finished[0].seq_id == seq_id and results[-1].num_running == 0


def test_stats_count_waiting_running_and_free_blocks_between_steps(llm):
    before = llm.stats()
    assert before["waiting"] == before["running"] == 0 and before["free_blocks"] == before["num_blocks"] == 32
    ids = [llm.add_request([100 + i] * 20, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
           for i in range(3)]
    assert llm.stats() == {"waiting": 3, "running": 0, "free_blocks": 32, "num_blocks": 32}
    llm.step()  # one prefill of all three (20 tokens each, 2 blocks of 16 each)
    assert llm.stats() == {"waiting": 0, "running": 3, "free_blocks": 32 - 6, "num_blocks": 32}
    while not llm.is_finished():
        llm.step()
    assert llm.stats() == before
    for i in ids:
        llm.forget(i)


def test_a_text_prompt_longer_in_characters_than_max_model_len_is_read_when_its_tokens_fit(llm):
    text = "the cat sat on the mat. " * 20
    assert len(text) > 256 > len(llm.tokenizer.encode(text))  # (max_model_len 256: characters are not tokens)
    out = llm.generate([text], SamplingParams(max_tokens=1, ignore_eos=True), use_tqdm=False)
    assert len(out[0]["token_ids"]) == 1


def test_steps_keep_counting_when_the_sampling_strategy_is_set(llm):
    llm.generate([[100, 101]], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    done = llm.step_count
    assert done >= 2
    llm.sampling = llm.sampling  # (a new step loop: its numbering goes on)
    seq = llm.add_request([102], SamplingParams(max_tokens=1, ignore_eos=True))
    result = llm.step()
    assert result.step == done + 1 and llm.step_count == done + 1
    llm.forget(seq)


def test_per_prompt_sampling_params(llm):
    outs = llm.generate([[100, 101], [102, 103]], [SamplingParams(max_tokens=1, ignore_eos=True),
                                                   SamplingParams(max_tokens=4, ignore_eos=True)], use_tqdm=False)
    assert [len(o["token_ids"]) for o in outs] == [1, 4]


def test_eos_stops_unless_ignored(tiny_model):
    # Force the EOS id to be whatever greedy decoding produces second, then check both behaviours.
    probe = LLM(tiny_model, enforce_eager=True, max_model_len=256, num_kvcache_blocks=8)
    toks = probe.generate([[100, 200, 300]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                          use_tqdm=False)[0]["token_ids"]
    probe.config.eos = probe.scheduler.eos = toks[1]
    stop = probe.generate([[100, 200, 300]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    assert stop["token_ids"] == toks[: toks.index(toks[1]) + 1] and stop["finish_reason"] == "stop"
    keep = probe.generate([[100, 200, 300]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                          use_tqdm=False)[0]
    assert keep["token_ids"] == toks and keep["finish_reason"] == "length"


@pytest.mark.parametrize("prompts, params, name", [
    ([""], None, "prompt"),
    ([[]], None, "prompt"),
    ([[100, 10**7]], None, "prompt"),
    ([[100] * 300], None, "max_model_len"),
    ([[100], [101]], [SamplingParams(), SamplingParams(top_k=10**6)], "top_k"),  # the first fits: not queued either
    ([[100], [101]], [SamplingParams()], "sampling_params"),
    ([], None, "prompts"),
    ([[100]], "fast", "sampling_params"),
])
def test_bad_requests_raise_value_error(llm, prompts, params, name):
    with pytest.raises(ValueError, match=name):
        llm.generate(prompts, params, use_tqdm=False)
    assert llm.is_finished()  # nothing half-queued


def test_request_larger_than_the_pool(tiny_model):
    small = LLM(tiny_model, enforce_eager=True, max_model_len=256, kvcache_block_size=16, num_kvcache_blocks=4)
    with pytest.raises(ValueError, match="KV blocks"):
        small.generate([[100] * 60], SamplingParams(max_tokens=10), use_tqdm=False)
    assert small.generate([[100] * 60], SamplingParams(max_tokens=5), use_tqdm=False)[0]["token_ids"]


@pytest.mark.parametrize("kwargs, name", [
    ({"kvcache_block_size": 0}, "kvcache_block_size"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_num_batched_tokens": -5}, "max_num_batched_tokens"),
    ({"num_kvcache_blocks": 0}, "num_kvcache_blocks"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
    ({"device": "tpu"}, "device"),
    ({"attention_backend": "magic"}, "attention_backend"),
    ({"scheduling_policy": "fifo"}, "scheduling_policy"),
    ({"tensor_parallel_size": 3}, "tensor_parallel_size"),
    ({"not_a_field": 1}, "not_a_field"),
    ({"attention_backend": "flash_attn", "device": "cpu"}, "attention_backend"),
])
def test_bad_engine_arguments_raise_value_error(tiny_model, kwargs, name):
    with pytest.raises(ValueError, match=name):
        LLM(tiny_model, **kwargs)



def test_max_model_len_is_capped_at_the_models_positions(tiny_model):
    """The RoPE table and the model know max_position_embeddings positions (the tiny model's 4,096): a longer
    max_model_len is cut to it, a shorter one kept."""
    from engine.config import Config

    assert Config(tiny_model, max_model_len=1 << 20).max_model_len == 4096
    assert Config(tiny_model, max_model_len=100).max_model_len == 100


@pytest.mark.parametrize("name", ["num_attention_heads", "num_key_value_heads", "vocab_size", "intermediate_size"])
def test_tensor_parallel_needs_each_sharded_dimension_divisible(tiny_model, name):
    """Two ranks split the heads, the KV heads, the vocabulary (embedding and LM head) and the MLP: each must
    divide evenly, or the refusal names it."""
    from types import SimpleNamespace

    from engine.config import Config
    from engine.model_config import load_model_config

    hf = load_model_config(tiny_model)
    assert Config(tiny_model, tensor_parallel_size=2, hf_config=hf).tensor_parallel_size == 2
    odd = SimpleNamespace(**{**vars(hf), name: getattr(hf, name) + 1})
    with pytest.raises(ValueError, match=f"tensor_parallel_size: {name}"):
        Config(tiny_model, tensor_parallel_size=2, hf_config=odd)

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_gpu_is_a_clear_error(tiny_model):
    with pytest.raises(ValueError, match="device"):
        LLM(tiny_model, device="cuda")


def test_missing_model_folder(tmp_path):
    with pytest.raises(ValueError, match="model"):
        LLM(str(tmp_path / "nowhere"))


def test_abort_returns_blocks_and_leaves_others_running(tiny_model):
    llm = LLM(tiny_model, enforce_eager=True, max_model_len=256, kvcache_block_size=4, num_kvcache_blocks=64,
              max_num_batched_tokens=8)
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    keep = llm.add_request([100 + i for i in range(5)], sp)
    running = llm.add_request([200 + i for i in range(6)], sp)
    chunking = llm.add_request([300 + i for i in range(30)], sp)
    for _ in range(3):
        llm.step()
    assert llm.get_sequence(chunking).block_table  # mid-chunk: holds blocks while waiting
    assert llm.abort(running) and llm.abort(chunking)
    assert not llm.abort(running)  # already gone
    with pytest.raises(ValueError, match="seq_id"):
        llm.abort(12345)
    while not llm.is_finished():
        llm.step()
    assert llm.get_sequence(keep).num_completion_tokens == 6
    assert llm.get_sequence(running).finish_reason == "abort"
    assert llm.scheduler.block_manager.num_free_blocks == 64


def test_forget_drops_only_finished_requests(tiny_model):
    llm = LLM(tiny_model, enforce_eager=True, max_model_len=256, num_kvcache_blocks=8)
    sid = llm.add_request([100, 101, 102], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    with pytest.raises(ValueError, match="still running"):
        llm.forget(sid)
    while not llm.is_finished():
        llm.step()
    llm.forget(sid)
    with pytest.raises(KeyError):
        llm.get_sequence(sid)


def test_auto_attention_takes_only_the_measured_paths_with_flash_attn_installed(monkeypatch):
    """`auto` runs what was measured on our GPU (the Triton kernels) and on a CPU (torch), even where flash-attn
    is installed (never run on the device here); flash_attn stays a choice by name."""
    import importlib.util

    from engine import device

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: object() if name == "flash_attn" else real(name, *args))
    assert device.resolve_attention_backend("auto", torch.device("cuda")) == "triton"
    assert device.resolve_attention_backend("auto", torch.device("cpu")) == "torch"
    assert device.resolve_attention_backend("flash_attn", torch.device("cuda")) == "flash_attn"
    # Without triton the torch reference, never flash-attn.
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: object() if name == "flash_attn" else None if name == "triton"
                        else real(name, *args))
    assert device.resolve_attention_backend("auto", torch.device("cuda")) == "torch"
