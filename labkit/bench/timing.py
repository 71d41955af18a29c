"""How the benches time the engine: the device drained around a timed call, and the step loop that times each
`llm.step()` through the public API (bench's `timing: steps` workloads and `bench --profile` both drive it).

Its own module so that the offline bench and the profiler each import it, and neither the other.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, ContextManager


def is_cuda(device: Any) -> bool:
    return str(device).startswith("cuda")


def sync(device: Any) -> None:
    if is_cuda(device):
        import torch

        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: Any) -> tuple[float, Any]:
    """Wall seconds of fn(), with the GPU drained before and after."""
    sync(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    return time.perf_counter() - start, result


@dataclass(frozen=True)
class StepTime:
    """One engine step as the step loop saw it (from its StepResult and the host clock)."""
    index: int              # 1-based within the run
    phase: str              # "prefill" | "decode"
    batch_size: int
    computed_tokens: int
    new_tokens: int
    seconds: float


def run_steps(llm: Any, prompts: list[list[int]], params: list[Any],
              around_step: Callable[[int], ContextManager] | None = None,
              after_step: Callable[[int], bool] | None = None) -> list[StepTime]:
    """Add the requests and step the engine until it is done, timing each `llm.step()` (public API only).

    `around_step(i)` is entered around step i (the profiler's named range); `after_step(i)` returning True
    stops early, and the requests still running are aborted. The engine keeps no record of them after."""
    seq_ids = [llm.add_request(p, sp) for p, sp in zip(prompts, params)]
    times: list[StepTime] = []
    try:
        while not llm.is_finished():
            i = len(times) + 1
            with around_step(i) if around_step is not None else contextlib.nullcontext():
                start = time.perf_counter()
                r = llm.step()
                seconds = time.perf_counter() - start
            times.append(StepTime(i, r.phase, r.batch_size, r.num_computed_tokens, r.num_new_tokens, seconds))
            if after_step is not None and after_step(i):
                break
    finally:
        for seq_id in seq_ids:
            llm.abort(seq_id)  # False (a no-op) for the finished ones
            llm.forget(seq_id)
    return times


def step_stats(times: list[StepTime]) -> dict:
    """Per-phase step counts and times of one step-timed run; decode ms per token is the headline."""
    decode = [t for t in times if t.phase == "decode"]
    prefill = [t for t in times if t.phase == "prefill"]
    decode_tokens = sum(t.new_tokens for t in decode)
    decode_s = sum(t.seconds for t in decode)
    return {
        "steps": len(times),
        "prefill_steps": len(prefill),
        "prefill_s": sum(t.seconds for t in prefill),
        "decode_steps": len(decode),
        "decode_tokens": decode_tokens,
        "decode_s": decode_s,
        "decode_ms_per_token": decode_s * 1000 / decode_tokens if decode_tokens else None,
        "decode_ms_per_step_median": statistics.median(t.seconds for t in decode) * 1000 if decode else None,
        "max_decode_batch": max((t.batch_size for t in decode), default=None),
    }
