"""model_shape events (a tracer that asks for shapes): each module's output shape for one decoder layer and the
model's ends, computed here from config.json and the step's token count. The embedding and the LM head belong to
no layer (layer null); the hooked decoder layer's modules carry its index."""
from __future__ import annotations

import json
from pathlib import Path

from engine import LLM, SamplingParams
from engine.trace import ListTracer


def test_one_prefill_steps_shapes_follow_the_config(tiny_model):
    cfg = json.loads((Path(tiny_model) / "config.json").read_text())
    h, d, inter, vocab = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"], cfg["vocab_size"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    tracer = ListTracer()
    tracer.shapes = True
    llm = LLM(tiny_model, device="cpu", enforce_eager=True, max_model_len=128, num_kvcache_blocks=8,
              kvcache_block_size=16, tracer=tracer)
    try:
        llm.generate([[100 + i for i in range(7)], [200, 201, 202]], SamplingParams(max_tokens=1, ignore_eos=True),
                     use_tqdm=False)
    finally:
        llm.exit()
    first = {}
    for e in tracer.events:
        if e["event"] == "model_shape":
            first.setdefault(e["module"], e)
    t, n = 10, 2  # the prefill step: 7 + 3 tokens, two rows sampling
    want = {"embed_tokens": ([t, h], None), "qkv_proj": ([t, (nq + 2 * nkv) * d], 0), "q": ([t, nq, d], 0),
            "k": ([t, nkv, d], 0), "v": ([t, nkv, d], 0), "attn_out": ([t, nq, d], 0), "o_proj": ([t, h], 0),
            "gate_up_proj": ([t, 2 * inter], 0), "down_proj": ([t, h], 0), "logits": ([n, vocab], None),
            "logits_shard": ([n, vocab], None)}
    assert {m: (e["shape"], e["layer"]) for m, e in first.items()} == want
    assert all(e["tp_rank"] == 0 and e["tp_size"] == 1 for e in first.values())
