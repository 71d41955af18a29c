"""Run a case through the real engine with a JSONL tracer attached, honouring `after` dependencies."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from labkit.errors import LabkitError
from labkit.trace.cases import Case, build_prompt_ids


@dataclass
class TraceRun:
    events: list[dict]
    log_path: Path
    wall_s: float
    device: str
    num_kvcache_blocks: int
    engine_kwargs: dict


def engine_kwargs(case: Case, overrides: dict, device: str) -> dict:
    kwargs = {"enforce_eager": True}
    kwargs.update(case.engine)
    kwargs.update({k: v for k, v in overrides.items() if v is not None})
    kwargs.setdefault("device", device)
    if device != "auto":
        kwargs["device"] = device
    return kwargs


def run_case(case: Case, model_dir: Path, log_path: Path, *, overrides: dict | None = None, device: str = "auto",
             shapes: bool = False, run_id: str | None = None, tensor_parallel_size: int | None = None) -> TraceRun:
    from engine import LLM, SamplingParams
    from engine.trace import JsonlTracer

    overrides = dict(overrides or {})
    if tensor_parallel_size is not None:
        overrides["tensor_parallel_size"] = tensor_parallel_size
    kwargs = engine_kwargs(case, overrides, device)
    tracer = JsonlTracer(log_path, run=run_id, keep=True)
    tracer.shapes = shapes
    t0 = time.perf_counter()
    try:
        llm = LLM(str(model_dir), tracer=tracer, **kwargs)
    except Exception:
        tracer.close()
        raise
    try:
        vocab = llm.config.hf_config.vocab_size
        prompts = build_prompt_ids(case, vocab, tokenize=llm.tokenizer.encode)
        params = {r.id: SamplingParams(**r.sampling_kwargs()) for r in case.requests}
        seq_of: dict[str, int] = {}
        pending = list(case.requests)

        def submit_ready():
            for r in list(pending):
                if r.after is None or (r.after in seq_of and llm.get_sequence(seq_of[r.after]).is_finished):
                    seq_of[r.id] = llm.add_request(prompts[r.id], params[r.id], request_id=r.id)
                    pending.remove(r)

        submit_ready()
        max_steps = 100_000
        while not llm.is_finished() or pending:
            if llm.is_finished():
                raise LabkitError(f"case {case.name}: requests {[r.id for r in pending]} wait on requests that never finish")
            llm.step()
            submit_ready()
            if llm.step_count > max_steps:
                raise LabkitError(f"case {case.name}: still running after {max_steps} steps")
    finally:
        llm.exit()
    return TraceRun(tracer.events, Path(log_path), time.perf_counter() - t0, str(llm.device),
                    llm.config.num_kvcache_blocks, kwargs)
