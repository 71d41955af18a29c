"""The Triton RMSNorm (with and without the residual add) and SiLU*up kernels against engine/layers/fused.py,
rounding points included. On CPU they run in Triton's interpreter, where half precision is float16."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from engine.kernels import elementwise  # noqa: E402
from engine.layers import fused  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HALF = torch.bfloat16 if DEVICE == "cuda" else torch.float16
EPS = 1e-6


def _randn(*shape, dtype, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


def _within_an_ulp(out, ref):
    """Equal but for the norm's float32 sum order: at most 1 ulp of each row's largest value, and almost every
    element exactly equal."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    diff = (out.float() - ref.float()).abs()
    scale = ref.float().abs().amax(dim=-1, keepdim=True)
    info = torch.finfo(out.dtype)
    ulp = info.eps * torch.exp2(torch.floor(torch.log2(scale.clamp_min(info.tiny))))
    if dtype_is_float32 := out.dtype == torch.float32:
        ulp = 2 * ulp  # nothing rounds the norm's last float32 bit away: most elements differ by an ulp or two
    assert (diff <= ulp).all(), f"more than {2 if dtype_is_float32 else 1} ulp off: max {diff.max().item()}"
    if not dtype_is_float32:
        assert (diff == 0).float().mean().item() >= 0.98, (diff == 0).float().mean().item()


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
@pytest.mark.parametrize("rows, n", [(1, 64), (5, 96), (3, 1024)])
def test_rms_norm_matches_fused(dtype, rows, n):
    x = _randn(rows, n, dtype=dtype, seed=n)
    w = (1 + 0.3 * _randn(n, dtype=torch.float32, seed=1, scale=1.0)).to(dtype)
    _within_an_ulp(elementwise.rms_norm(x, w, EPS), fused.rms_norm(x, w, EPS))


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
@pytest.mark.parametrize("rows, n", [(1, 64), (5, 96), (3, 1024)])
def test_add_rms_norm_matches_fused_and_returns_the_rounded_sum(dtype, rows, n):
    # x a column slice of a wider buffer (a strided row), as a layer's output view can be.
    wide = _randn(rows, n + 32, dtype=dtype, seed=n)
    x = wide[:, 16:16 + n]
    res = _randn(rows, n, dtype=dtype, seed=n + 1)
    w = (1 + 0.3 * _randn(n, dtype=torch.float32, seed=2, scale=1.0)).to(dtype)
    out, new_res = elementwise.add_rms_norm(x, res, w, EPS)
    ref_out, ref_res = fused.add_rms_norm(x, res, w, EPS)
    assert torch.equal(new_res, ref_res)  # the residual stream: one rounding of an exact float32 sum
    _within_an_ulp(out, ref_out)
    assert torch.equal(x, wide[:, 16:16 + n]) and not torch.equal(out, x)  # inputs untouched


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
@pytest.mark.parametrize("rows, n", [(1, 32), (4, 1500), (2, 3072)])
def test_silu_and_mul_matches_fused(dtype, rows, n):
    x = _randn(rows, 2 * n, dtype=dtype, seed=n)
    out, ref = elementwise.silu_and_mul(x), fused.silu_and_mul(x)
    assert out.shape == (rows, n) and out.dtype == dtype
    diff = (out.float() - ref.float()).abs()
    # exp is the device's, not torch's: before the rounding to the model dtype the two can differ in the last
    # float32 bits, so a rare element rounds the other way (one ulp of itself).
    tol = 1e-6 if dtype == torch.float32 else torch.finfo(dtype).eps
    assert (diff <= tol * ref.float().abs().clamp_min(1e-3)).all(), diff.max().item()
    if dtype != torch.float32:
        assert (diff == 0).float().mean().item() >= 0.98


def test_the_kernels_see_what_they_are_given():
    """Edits that must change the output: the residual, the weight, eps, the gate/up halves swapped."""
    x = _randn(4, 64, dtype=torch.float32, seed=3)
    res = _randn(4, 64, dtype=torch.float32, seed=4)
    w = 1 + 0.3 * _randn(64, dtype=torch.float32, seed=5, scale=1.0)
    base, _ = elementwise.add_rms_norm(x, res, w, EPS)
    assert not torch.allclose(base, elementwise.rms_norm(x, w, EPS))
    assert not torch.allclose(base, elementwise.add_rms_norm(x, res, w * 2, EPS)[0])
    small = x * 1e-4
    assert not torch.allclose(elementwise.rms_norm(small, w, EPS), elementwise.rms_norm(small, w, 1.0))
    g = _randn(3, 128, dtype=torch.float32, seed=6)
    swapped = torch.cat([g[:, 64:], g[:, :64]], dim=1)
    assert not torch.allclose(elementwise.silu_and_mul(g), elementwise.silu_and_mul(swapped))


def test_no_rows_is_no_launch():
    x = torch.empty(0, 64, device=DEVICE)
    w = torch.ones(64, device=DEVICE)
    assert elementwise.rms_norm(x, w, EPS).shape == (0, 64)
    assert elementwise.silu_and_mul(torch.empty(0, 128, device=DEVICE)).shape == (0, 64)


@pytest.mark.skipif(DEVICE == "cuda", reason="CPU tensors through the interpreter; on a GPU the logits suites "
                                            "check the wired kernels against Transformers")
def test_the_engine_with_the_fused_kernels_gives_the_plain_engines_tokens(tiny_model, monkeypatch):
    """The kernels wired into the model (the norms, SiLU*up, q/k norm + RoPE from the qkv rows), as on a GPU
    without --enforce-eager: greedy tokens equal the plain torch engine's, and the logits agree to float32 rounding."""
    import dataclasses

    from engine import LLM, SamplingParams, runner as runner_module

    prompts = [[5, 9, 300, 17, 2, 44, 1000], [7] * 13, list(range(40, 61))]
    sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    outs = {}
    choose = runner_module.choose_kernels
    for fused_on in (False, True):
        monkeypatch.setattr(runner_module, "choose_kernels", lambda config, device: dataclasses.replace(
            choose(config, device), fused_elementwise=fused_on))
        llm = LLM(tiny_model, device="cpu", kvcache_block_size=4)
        layer = llm.model_runner.model.model.layers[0]
        assert layer.self_attn._qk_kernel is fused_on
        assert (layer.mlp.act_fn._fn is elementwise.silu_and_mul) is fused_on
        outs[fused_on] = [o["token_ids"] for o in llm.generate(prompts, sp, use_tqdm=False)]
        llm.exit()
    assert outs[True] == outs[False]
