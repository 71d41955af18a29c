"""Tracing off costs nothing: with no tracer the step loop never builds an event, copies a tensor to the
host for one, or touches the tracer helpers (the only hooks are `if tracer is not None` tests)."""
from __future__ import annotations

from engine import LLM, SamplingParams
from engine.llm import LLMEngine
from engine.step_events import StepEvents


def test_no_tracer_means_no_event_work(tiny_model, monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("tracing work done with tracing off")

    for name in ("scheduling", "launched", "committed", "emit_now", "aborted"):
        monkeypatch.setattr(StepEvents, name, boom)
    monkeypatch.setattr(LLMEngine, "_run_start_fields", boom)
    import engine.model_shapes

    monkeypatch.setattr(engine.model_shapes, "register_shape_hooks", boom)
    llm = LLM(tiny_model, enforce_eager=True, max_model_len=256, kvcache_block_size=16, num_kvcache_blocks=16,
              max_num_batched_tokens=32)
    outs = llm.generate([[100] * 40, [200] * 7], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
                        use_tqdm=False)
    assert [len(o["token_ids"]) for o in outs] == [5, 5]
    llm.exit()


def test_tracing_does_not_change_tokens(tiny_model):
    from engine.trace import ListTracer

    prompts = [[100 + i for i in range(30)], [300 + i for i in range(9)]]
    sp = SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True)
    plain = LLM(tiny_model, enforce_eager=True, max_model_len=256, num_kvcache_blocks=8, seed=5)
    traced = LLM(tiny_model, enforce_eager=True, max_model_len=256, num_kvcache_blocks=8, seed=5, tracer=ListTracer())
    assert ([o["token_ids"] for o in plain.generate(prompts, sp, use_tqdm=False)] ==
            [o["token_ids"] for o in traced.generate(prompts, sp, use_tqdm=False)])
    assert traced.tracer.events
