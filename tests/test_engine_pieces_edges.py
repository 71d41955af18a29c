"""Blind spots of a mutation screen (session 22) in the engine's small pieces: host-to-device staging, the layers'
arithmetic against Transformers' own modules, sampling-parameter validation and defaults, a sparse config.json,
and the device choices. All on the CPU, no model load, each well under a second."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine import device
from engine.layers import fused
from engine.model_config import QWEN3_DEFAULTS, load_model_config
from engine.sampling_params import SamplingParams
from engine.staging import Staging


# --- staging -------------------------------------------------------------------------------------------------
def test_every_host_buffer_of_the_ring_grows_for_a_larger_step():
    """The host buffers rotate: a larger step arriving after a few small ones lands in a buffer that a small
    step sized, which must grow (a later buffer of the ring, fresh, would hide a buffer that never grows)."""
    staging = Staging(torch.device("cpu"))
    for _ in range(4):  # every buffer of the ring sized by a small step
        assert staging.upload(a=([1, 2, 3], torch.int32))["a"].tolist() == [1, 2, 3]
    for n in (3000, 7000, 20000):  # then larger and larger steps, through each buffer in turn
        big = list(range(n))
        got = staging.upload(ids=(big, torch.int64), tables=([[n, -1]] * 50, torch.int32))
        assert got["ids"].tolist() == big and got["tables"].shape == (50, 2) and got["tables"][-1].tolist() == [n, -1]


def test_fetch_through_the_host_buffers_returns_every_id(monkeypatch):
    """The device path of fetch (a copy into a host buffer, read back as int64), run on the CPU: every sampled
    id of the step comes back, and two fetches outstanding at once keep their own values."""
    staging = Staging(torch.device("cpu"))
    staging._cuda = True  # take the asynchronous path; the CPU buffers are not pinned, so no CUDA event is used
    first = staging.fetch(torch.tensor([3, 1, 2**40, -7]))
    second = staging.fetch(torch.tensor([9, 8, 7, 6, 5, 4, 3, 2, 1]))
    assert first.tolist() == [3, 1, 2**40, -7]
    assert second.tolist() == [9, 8, 7, 6, 5, 4, 3, 2, 1]
    third = staging.fetch(torch.arange(1000, 1700))  # a larger step grows a buffer
    assert third.tolist() == list(range(1000, 1700))


def test_upload_into_copies_the_elements_the_fill_asks_for():
    staging = Staging(torch.device("cpu"))
    dst = torch.full((8,), -1, dtype=torch.int64)

    def fill(host):
        host[:3] = [2**40, 5, 6]
        return 3

    staging.upload_into(dst, fill)
    assert dst.tolist() == [2**40, 5, 6] + [-1] * 5


# --- the layers' arithmetic against Transformers --------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_equals_transformers_including_tiny_and_zero_rows(dtype):
    """fused.rms_norm (the CPU and --eager path) against Transformers' Qwen3RMSNorm: same dtype, same values
    bit for bit, on ordinary rows, a row so small that eps dominates, and a zero row (0, not NaN)."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    g = torch.Generator().manual_seed(0)
    n = 64
    x = torch.randn(4, n, generator=g) * 3
    x[1] *= 1e-4  # mean square 1e-8: eps (1e-6) decides the scale
    x[2] = 0.0
    x = x.to(dtype)
    w = (1 + 0.3 * torch.randn(n, generator=g)).to(dtype)
    ref = Qwen3RMSNorm(n, eps=1e-6).to(dtype)
    ref.weight.data.copy_(w)
    with torch.no_grad():
        expected = ref(x)
    out = fused.rms_norm(x, w, 1e-6)
    assert out.dtype == expected.dtype == dtype
    assert torch.isfinite(out).all() and (out[2] == 0).all()
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_add_rms_norm_keeps_the_residual_in_the_model_dtype_like_transformers(dtype):
    """The decoder layer's residual add then norm, as Transformers does it: residual + hidden in the model dtype,
    then Qwen3RMSNorm."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    g = torch.Generator().manual_seed(1)
    x, res = (torch.randn(3, 96, generator=g) * 4).to(dtype), (torch.randn(3, 96, generator=g) * 4).to(dtype)
    w = (1 + 0.3 * torch.randn(96, generator=g)).to(dtype)
    ref = Qwen3RMSNorm(96, eps=1e-6).to(dtype)
    ref.weight.data.copy_(w)
    out, new_res = fused.add_rms_norm(x, res, w, 1e-6)
    with torch.no_grad():
        assert torch.equal(new_res, res + x)
        assert torch.equal(out, ref(res + x))


# --- sampling parameters ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, name", [
    ({"temperature": True}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"max_tokens": True}, "max_tokens"),
    ({"top_k": True}, "top_k"),
    ({"top_p": True}, "top_p"),
    ({"top_p": float("nan")}, "top_p"),
])
def test_bools_and_non_finite_numbers_are_refused_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}: "):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs", [{"temperature": 0}, {"temperature": 2}, {"top_p": 1}, {"top_k": -1},
                                    {"top_k": 0}, {"top_k": 1}, {"max_tokens": 1}, {"top_p": 1e-9}])
def test_plain_ints_and_the_edges_of_each_range_are_taken(kwargs):
    sp = SamplingParams(**kwargs)
    assert all(getattr(sp, k) == v for k, v in kwargs.items())


def test_the_defaults_sample_with_every_filter_off():
    """What a request that sets nothing gets (LLM.generate without sampling_params): plain sampling at
    temperature 1 (0 would be greedy), top-k and top-p off, 64 tokens, stopping at EOS, the engine's stream."""
    sp = SamplingParams()
    assert (sp.temperature, sp.top_k, sp.top_p, sp.max_tokens, sp.ignore_eos, sp.seed) == \
        (1.0, -1, 1.0, 64, False, None)


# --- config.json -----------------------------------------------------------------------------------------------
def test_a_config_with_only_its_model_type_means_what_transformers_reads(tmp_path):
    """Every field the engine defaults (QWEN3_DEFAULTS) left out at once: each value equals Transformers'
    Qwen3Config default, and fields the file does give are kept as given."""
    from transformers import AutoConfig

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "labkit_note": [1, 2]}))
    ours, hf = load_model_config(tmp_path), AutoConfig.from_pretrained(str(tmp_path))
    for name in QWEN3_DEFAULTS:
        assert getattr(ours, name) == getattr(hf, name), name
    assert ours.labkit_note == [1, 2]


def test_a_config_of_another_model_type_gets_no_qwen3_defaults(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    cfg = load_model_config(Path(tmp_path))
    assert cfg.hidden_size == 64 and not hasattr(cfg, "num_hidden_layers")


# --- device choices --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, dtype", [("float32", torch.float32), ("bfloat16", torch.bfloat16),
                                         ("float16", torch.float16)])
def test_a_named_dtype_is_that_dtype_whatever_the_config_says(name, dtype):
    from types import SimpleNamespace

    assert device.resolve_dtype(name, SimpleNamespace(dtype="float32")) == dtype
    assert device.resolve_dtype("auto", SimpleNamespace(dtype=name)) == dtype
    assert device.resolve_dtype("auto", SimpleNamespace(torch_dtype=name)) == dtype  # older configs' key


def test_auto_dtype_without_a_known_dtype_in_the_config_is_float32():
    from types import SimpleNamespace

    assert device.resolve_dtype("auto", SimpleNamespace()) == torch.float32
    assert device.resolve_dtype("auto", SimpleNamespace(dtype=None, torch_dtype=None)) == torch.float32
    assert device.resolve_dtype("auto", SimpleNamespace(dtype="float8_e4m3fn")) == torch.float32


def test_triton_on_the_cpu_needs_the_interpreter(monkeypatch):
    """The Triton backend runs on the CPU only under Triton's interpreter (as the tests run it); without it the
    choice is refused, naming the setting."""
    cpu = torch.device("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert device.resolve_attention_backend("triton", cpu) == "triton"
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="^attention_backend: 'triton' needs a CUDA device"):
        device.resolve_attention_backend("triton", cpu)
    assert device.resolve_attention_backend("torch", cpu) == "torch"


def test_collectives_are_nccl_on_gpus_and_gloo_on_the_cpu():
    assert device.collective_backend(torch.device("cuda", 0)) == "nccl"
    assert device.collective_backend(torch.device("cpu")) == "gloo"


def test_off_cuda_the_sm_count_is_the_callers():
    assert device.num_sms(torch.device("cpu"), 132) == 132 and device.num_sms(torch.device("cpu"), 7) == 7
