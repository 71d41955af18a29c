"""The side stream's L2 prefetch (engine/kernels/l2_prefetch.py, LABKIT_DECODE_L2_SIDE): which weights a layer asks
for, that the programs' ranges cover each buffer exactly as the bulk prefetch requires (the arithmetic in Triton's
interpreter on a CPU), and on CUDA that a fused decode step with it, eager or captured in a graph, gives the very
numbers of one without it."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from engine import fused_decode  # noqa: E402
from engine.context import Context, DecodeMeta, reset_context, set_context  # noqa: E402
from engine.kernels import l2_prefetch  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _layers(n):
    def w(tag):
        return SimpleNamespace(weight=tag)
    return [SimpleNamespace(self_attn=SimpleNamespace(qkv_proj=w(f"qkv{i}"), o_proj=w(f"o{i}")),
                            mlp=SimpleNamespace(gate_up_proj=w(f"gu{i}"), down_proj=w(f"down{i}")))
            for i in range(n)]


@pytest.mark.parametrize("names, want0, want_last", [
    (("gu",), ["gu0"], ["gu2"]),
    (("gu", "qkv"), ["gu0", "qkv1"], ["gu2"]),
    (("o", "gu", "down", "qkv"), ["o0", "gu0", "down0", "qkv1"], ["o2", "gu2", "down2"]),
    (("down", "o"), ["o0", "down0"], ["o2", "down2"]),
    (("qkv",), ["qkv1"], []),
])
def test_a_layer_asks_for_its_later_weights_and_the_next_layers_qkv_in_the_order_they_are_read(names, want0,
                                                                                                want_last):
    layers = _layers(3)
    assert l2_prefetch.side_weights(layers, 0, names) == want0
    assert l2_prefetch.side_weights(layers, 1, names) == [w.replace("0", "1").replace("qkv1", "qkv2") for w in want0]
    assert l2_prefetch.side_weights(layers, 2, names) == want_last


@triton.jit
def _ranges_probe(offs_ptr, size_ptr, nbytes, NT: tl.constexpr):
    part = tl.program_id(0)
    offs, size = l2_prefetch._ranges(nbytes, part, tl.num_programs(0), NT)
    t = tl.arange(0, NT)
    tl.store(offs_ptr + part * NT + t, offs)
    tl.store(size_ptr + part * NT + t, size)


@pytest.mark.parametrize("nbytes, parts, nt", [(16, 1, 4), (4096, 4, 8), (12_582_912, 32, 128), (48, 8, 4),
                                               (1040, 3, 16), (16 * 1001, 7, 32)])
def test_the_programs_ranges_cover_each_byte_once_in_aligned_pieces(nbytes, parts, nt):
    offs = torch.zeros(parts * nt, dtype=torch.int64, device=DEVICE)
    size = torch.zeros(parts * nt, dtype=torch.int32, device=DEVICE)
    _ranges_probe[(parts,)](offs, size, nbytes, NT=nt)
    offs, size = offs.cpu(), size.cpu()
    used = size > 0
    o, s = offs[used].tolist(), size[used].tolist()
    assert all(x % 16 == 0 for x in o) and all(x % 16 == 0 for x in s)
    spans = sorted(zip(o, s))
    at = 0
    for start, n in spans:  # each next range starts where the last ended: no gap, no overlap, nothing past the end
        assert start == at, (start, at)
        at += n
    assert at == nbytes


def test_the_prefetch_takes_one_to_four_contiguous_aligned_tensors():
    w = torch.zeros(8, 8, dtype=torch.bfloat16)
    args = l2_prefetch.prefetch_args([w, w[:2]])
    assert args[1::2] == [128, 32, 0, 0]
    for bad in ([], [w] * 5, [w.t()], [torch.zeros(3, dtype=torch.bfloat16)]):
        with pytest.raises(ValueError, match="l2_prefetch"):
            l2_prefetch.prefetch_args(bad)


def test_off_cuda_or_with_nothing_asked_the_side_stream_does_nothing():
    layers = _layers(2)
    for side in (l2_prefetch.SideStream(torch.device("cpu"), ("gu",)),
                 l2_prefetch.SideStream(torch.device("cuda" if CUDA else "cpu"), ())):
        side.ask(layers, 0)
        side.join()
        assert side.stream is None and not side.forked


def _decode_inputs(model_dir):
    from tests.test_fused_decode import _prefilled

    llm, dec, _ = _prefilled(model_dir, "float32")
    ctx = Context(dec["slots"], DecodeMeta(1, dec["ctx"][:1], dec["tables"][:1], num_splits=2))
    return llm, {k: v[:1] for k, v in dec.items()}, ctx


@pytest.mark.skipif(not CUDA, reason="the bulk prefetch and side streams are CUDA's")
@pytest.mark.parametrize("names, at", [(("gu", "qkv"), "qkv"), (("o", "gu", "down", "qkv"), "qkv"),
                                       (("gu", "down", "qkv"), "attention")])
def test_a_fused_step_asking_the_l2_gives_the_same_numbers_eager_and_in_a_graph(tiny_model, names, at,
                                                                                 monkeypatch):
    monkeypatch.setattr(l2_prefetch, "SIDE_AT", at)
    llm, dec, ctx = _decode_inputs(tiny_model)
    runner = llm.model_runner
    model = runner.model.model
    pool = runner.kv_cache.clone()
    asked = []
    real = l2_prefetch.ask_l2
    monkeypatch.setattr(l2_prefetch, "ask_l2", lambda ts, programs=None: (asked.append(ts), real(ts, programs)))
    with torch.inference_mode():
        set_context(ctx)
        want = fused_decode.forward(model, dec["ids"], dec["pos"]).clone()
        runner.kv_cache.copy_(pool)
        monkeypatch.setattr(l2_prefetch, "SIDE", names)
        got = fused_decode.forward(model, dec["ids"], dec["pos"]).clone()
        assert torch.equal(got, want)
        n = len(model.layers)
        assert [len(ts) for ts in asked] == [len(l2_prefetch.side_weights(model.layers, i, names)) for i in range(n)]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # (a side stream left unjoined fails the capture)
            out = fused_decode.forward(model, dec["ids"], dec["pos"])
        runner.kv_cache.copy_(pool)
        graph.replay()
        torch.cuda.synchronize()
        reset_context()
    assert torch.equal(out, want)
    llm.exit()
