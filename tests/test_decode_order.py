"""paged_decode's order (the rows' programs launched in a given order, longest context first): the same numbers
as the grid's own order, whatever the layout, split count or padding rows. On a CPU the kernel runs in Triton's
interpreter (conftest.py)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine.kernels.decode_attention import longest_first, paged_decode  # noqa: E402
from engine.kv_layout import layer_caches  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_longest_first_is_a_stable_descending_permutation():
    lens = torch.tensor([5, 40, 0, 40, 7], dtype=torch.int32)
    order = longest_first(lens)
    assert order.dtype == torch.int32 and order.tolist() == [1, 3, 4, 0, 2]


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("fp8, v_t", [(False, False), (True, False), (True, True)])
def test_an_ordered_launch_gives_each_row_its_own_output(splits, fp8, v_t):
    heads, kv_heads, head_dim, block_size = 4, 2, 32, 32
    lengths = [3, 70, 0, 33, 96]
    g = torch.Generator().manual_seed(0)
    dtype = torch.float8_e4m3fn if fp8 else torch.float32
    pool = (torch.randn(2, 1, 16, kv_heads, block_size, head_dim, generator=g) * 2).to(dtype).to(DEVICE)
    k, v = layer_caches(pool, 0, v_t)
    tables = torch.arange(15, dtype=torch.int32).view(5, 3).to(DEVICE)
    q = torch.randn(len(lengths), heads, head_dim, generator=g).to(DEVICE)
    ctx = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    kw = dict(block_n=16, k_scale=0.5, v_scale=0.25) if fp8 else dict(block_n=16)
    plain = paged_decode(q, k, v, tables, ctx, 0.2, splits, **kw)
    ordered = paged_decode(q, k, v, tables, ctx, 0.2, splits, order=longest_first(ctx), **kw)
    assert torch.equal(ordered, plain)
    assert plain[1].abs().sum() > 0 and torch.equal(plain[2], torch.zeros_like(plain[2]))
    assert longest_first(ctx).tolist() != list(range(len(lengths)))  # (a kernel mixing rank and row would show)


def test_the_host_order_puts_a_buckets_padding_rows_last_and_refuses_too_few_rows():
    from engine.decode_order import longest_first as host_order

    assert host_order([5, 40, 0, 40, 7], 7).tolist() == [1, 3, 4, 0, 2, 5, 6]
    assert host_order([3]).tolist() == [0]
    with pytest.raises(ValueError, match="rows"):
        host_order([1, 2, 3], 2)


@pytest.mark.parametrize("policy", ["prefill_first", "mixed"])
def test_the_engine_launches_decode_longest_first_when_asked_and_generates_the_same_tokens(tiny_model, policy,
                                                                                        monkeypatch):
    """LABKIT_DECODE_ORDER=longest-first: every decode launch of more than one row gets its rows by descending
    context length (a spy on the kernel's entry); launch order gets none; the tokens are the same."""
    import engine.runner
    from engine import LLM, SamplingParams
    from engine.backends import triton_attn

    seen = []
    real = triton_attn.paged_decode

    def spy(q, k_cache, v_cache, block_tables, context_lens, *args, order=None, **kw):
        seen.append((context_lens.tolist(), None if order is None else order.tolist()))
        return real(q, k_cache, v_cache, block_tables, context_lens, *args, order=order, **kw)

    monkeypatch.setattr(triton_attn, "paged_decode", spy)
    prompts = [[100 + i] * n for i, n in enumerate([3, 41, 9, 26, 17])]
    tokens = {}
    for mode in ("launch", "longest-first"):
        monkeypatch.setattr(engine.runner, "DECODE_ORDER", mode)
        seen.clear()
        llm = LLM(tiny_model, enforce_eager=True, device=DEVICE, attention_backend="triton", kvcache_block_size=16,
                  max_model_len=256, scheduling_policy=policy, dtype="float32")
        out = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), use_tqdm=False)
        llm.exit()
        tokens[mode] = [o["token_ids"] for o in out]
        multi = [(lens, order) for lens, order in seen if len(lens) > 1]
        assert multi, "no decode step of more than one row"
        for lens, order in multi:
            if mode == "launch":
                assert order is None
            else:
                assert sorted(order) == list(range(len(lens)))
                assert [lens[i] for i in order] == sorted(lens, reverse=True)
                assert order != list(range(len(lens))) or lens == sorted(lens, reverse=True)
        if mode == "longest-first":
            assert any(order != list(range(len(lens))) for lens, order in multi)
    assert tokens["longest-first"] == tokens["launch"]
