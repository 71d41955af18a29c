"""The run_start event a traced engine writes first, and what exit() leaves: what the trace and its reports
say the run was, checked against the model's config.json and the engine's real step loop, computed here."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.trace import ListTracer


def _run_start(tiny_model, shapes: bool, **kwargs) -> dict:
    tracer = ListTracer()
    tracer.shapes = shapes
    llm = LLM(tiny_model, device="cpu", enforce_eager=True, max_model_len=128, num_kvcache_blocks=8,
              kvcache_block_size=16, tracer=tracer, **kwargs)
    try:
        llm.generate([[100, 101, 102]], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    finally:
        llm.exit()
    starts = [e for e in tracer.events if e["event"] == "run_start"]
    assert len(starts) == 1
    return starts[0]


@pytest.mark.parametrize("kv_cache_dtype, itemsize", [("auto", 4), ("fp8", 1)])
def test_kv_bytes_per_token_is_k_and_v_of_every_layer_for_one_token(tiny_model, kv_cache_dtype, itemsize):
    cfg = json.loads((Path(tiny_model) / "config.json").read_text())
    ev = _run_start(tiny_model, False, kv_cache_dtype=kv_cache_dtype)
    want = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * itemsize
    assert ev["kv_bytes_per_token"] == want and ev["block_size"] == 16 and ev["num_kvcache_blocks"] == 8


def test_async_scheduling_is_what_the_step_loop_does_not_what_was_asked(tiny_model):
    """Asked for (the default), it runs; with model_shape hooks (which fire inside the step) it cannot, and
    run_start says so."""
    assert _run_start(tiny_model, False)["async_scheduling"] is True
    ev = _run_start(tiny_model, True)
    assert ev["config"]["async_scheduling"] is True and ev["async_scheduling"] is False


def test_exit_commits_the_step_planned_ahead_so_no_placeholder_is_left(tiny_model, monkeypatch):
    """With async scheduling a graph-replay step is launched during the step before; exit() lets it finish and
    commits it: the run_end event counts it, and the sequence holds its real token, not a placeholder (-1)."""
    from tests.conftest import replay_graphs

    replay_graphs(monkeypatch, "every")
    tracer = ListTracer()
    llm = LLM(tiny_model, device="cpu", async_scheduling=True, max_model_len=128, num_kvcache_blocks=8,
              kvcache_block_size=16, tracer=tracer)
    seq_id = llm.add_request([100, 101, 102], SamplingParams(max_tokens=8, ignore_eos=True))
    llm.step()
    llm.step()
    assert not llm.is_finished()
    llm.exit()
    tokens = llm.get_sequence(seq_id).completion_token_ids
    end = [e for e in tracer.events if e["event"] == "run_end"]
    assert -1 not in tokens and len(tokens) == llm.step_count == 3 and end[0]["steps"] == 3, (tokens, end)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_run_that_never_steps_ends_with_no_steps(tiny_model, async_scheduling):
    tracer = ListTracer()
    llm = LLM(tiny_model, device="cpu", async_scheduling=async_scheduling, max_model_len=128, num_kvcache_blocks=8,
              kvcache_block_size=16, tracer=tracer)
    assert llm.step_count == 0
    llm.exit()
    end = [e for e in tracer.events if e["event"] == "run_end"]
    assert len(end) == 1 and end[0]["steps"] == 0 and llm.step_count == 0, end


def test_an_engine_failing_its_first_step_is_logged_at_step_1(tiny_model, tmp_path, monkeypatch):
    from engine.runner import ModelRunner
    from labkit.trace.cases import load_case
    from labkit.trace.run import run_case

    def fails(*args, **kwargs):
        raise RuntimeError("planted: the first step's forward")

    monkeypatch.setattr(ModelRunner, "execute", fails)
    events = run_case(load_case("chunk"), Path(tiny_model), tmp_path / "events.jsonl", device="cpu").events
    errors = [e for e in events if e["event"] == "engine_error"]
    assert len(errors) == 1 and errors[0]["step"] == 1 and "planted" in errors[0]["message"], errors
