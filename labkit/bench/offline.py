"""The offline engine bench: load once, warm up, then time `llm.generate` on fresh requests.

What is timed, and what is not:

- init: the `LLM(...)` constructor (the engine's own `llm.init_seconds`; `init_wall_s` is the
  constructor's wall time seen from here). Graph capture is reported apart as `graph_capture_s`
  (`llm.graph_capture_seconds`, part of init: the engine captures while it loads; null when it
  captured none).
- warm-up: `warmup.rounds` calls of `generate` before timing, each on its own random stream.
- each timed repeat: the wall seconds of one `llm.generate(prompts, params, use_tqdm=False)`
  call, bracketed by `torch.cuda.synchronize()` on a GPU. output_throughput = output tokens
  (the lengths of the returned token_ids) / wall; total_token_throughput adds the prompt tokens.
- the median over repeats is the headline; every repeat is kept.
- a workload with `timing: steps` (batch1.yaml) drives the engine through its public step API instead
  (`add_request`, then `step()` until done, each step timed on the host clock; a step ends with the host
  fetching the sampled ids, so its time includes the device work) and also reports decode ms per token:
  the decode steps' seconds over the tokens they produced.
- `--profile` adds one more run after the timed repeats, under torch.profiler (labkit/bench/profile.py);
  its times are not among the repeats.

No tracer is ever passed: tracing is for mechanism evidence, never timing.
"""
from __future__ import annotations

import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from labkit.bench.timing import is_cuda, run_steps, step_stats, timed
from labkit.bench.workloads import Draw, Workload, draw_repeat, draw_warmup, fold_to_vocab
from labkit.engine_args import FIELDS, EngineArgs

# Engine Config fields recorded (and compared) for an engine run: every setting a command or workload may give
# (labkit/engine_args.py), but the device and dtype, which the result records resolved, on their own.
RECORDED_ENGINE_FIELDS = tuple(f for f in FIELDS if f not in ("device", "dtype"))


class Stepper:
    """Progress hooks: `start(label, total)` then `advance()` after each unit of work."""

    def start(self, label: str, total: int) -> None:  # pragma: no cover - trivial
        pass

    def advance(self, n: int = 1) -> None:  # pragma: no cover - trivial
        pass


def reset_peak(device: Any) -> None:
    if is_cuda(device):
        import torch

        torch.cuda.reset_peak_memory_stats(device)


def maxrss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) if sys.platform == "darwin" else int(rss) * 1024  # Linux reports KiB


def peak_now(device: Any) -> dict:
    """Peak memory so far in this process: GPU allocator peak on cuda, max RSS on the CPU."""
    if is_cuda(device):
        import torch

        return {"allocated": int(torch.cuda.max_memory_allocated(device)),
                "reserved": int(torch.cuda.max_memory_reserved(device))}
    return {"allocated": maxrss_bytes(), "reserved": None}


def peak_memory_record(device: Any, overall: dict, timed_peak: dict, tp: int = 1,
                       workers: list[tuple[dict, dict]] | None = None) -> dict:
    """Peak memory per rank. Rank 0 runs in this process; the other ranks (tensor parallel workers) run in
    their own processes and report through the engine (`workers`: (whole run, timed part) per rank, as
    `LLMEngine.peak_memory_per_rank()` gives them); without that report a worker's peak is null."""
    cuda = is_cuda(device)
    source = ("torch.cuda.max_memory_allocated" if cuda
              else "resource.getrusage(RUSAGE_SELF).ru_maxrss (whole process, lifetime)")
    base = str(device) if cuda and ":" in str(device) else ("cuda:0" if cuda else "cpu")
    per_rank = [{
        "rank": 0,
        "device": base,
        "peak_bytes": overall["allocated"],
        "peak_reserved_bytes": overall["reserved"],
        "timed_peak_bytes": timed_peak["allocated"],
    }]
    for r in range(1, max(1, tp)):
        if workers is not None and r - 1 < len(workers):
            before, during = workers[r - 1]
            reserved = [v for v in (before.get("peak_reserved_bytes"), during.get("peak_reserved_bytes"))
                        if v is not None]
            per_rank.append({"rank": r, "device": during.get("device"),
                             "peak_bytes": max(before["peak_bytes"], during["peak_bytes"]),
                             "peak_reserved_bytes": max(reserved) if reserved else None,
                             "timed_peak_bytes": during["peak_bytes"] if cuda else None,
                             "source": during.get("source")})
            continue
        per_rank.append({"rank": r, "device": f"cuda:{r}" if cuda else "cpu", "peak_bytes": None,
                         "peak_reserved_bytes": None, "timed_peak_bytes": None,
                         "note": "worker process: not measurable from rank 0"})
    measured = [p["peak_bytes"] for p in per_rank if p["peak_bytes"] is not None]
    return {"source": source, "per_rank": per_rank, "max_bytes": max(measured) if measured else None,
            "timed_reset": cuda}


def summarize(runs: list[dict]) -> dict:
    """Median over repeats of every per-run rate and of the wall time (and of decode ms per token when the
    runs were timed step by step)."""
    keys = ("output_throughput", "total_token_throughput", "request_throughput", "wall_s")
    out = {k: statistics.median(r[k] for r in runs) for k in keys} | {"repeats": len(runs)}
    per_token = [r.get("decode_ms_per_token") for r in runs]
    if per_token and all(v is not None for v in per_token):
        out["decode_ms_per_token"] = statistics.median(per_token)
    return out


def run_record(index: int, d: Draw, wall_s: float, output_tokens: int, **extra: Any) -> dict:
    wall = max(wall_s, 1e-12)
    return {
        "repeat": index,
        "seed": d.seed,
        "requests": len(d),
        "prompt_tokens": d.prompt_tokens,
        "output_tokens": int(output_tokens),
        "wall_s": wall_s,
        "output_throughput": output_tokens / wall,
        "total_token_throughput": (d.prompt_tokens + output_tokens) / wall,
        "request_throughput": len(d) / wall,
        **extra,
    }


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def engine_kwargs(w: Workload, overrides: EngineArgs, device: str) -> dict:
    """Workload engine settings, overridden by the CLI flags that were given, plus the device
    (and enforce_eager when neither sets it: False on cuda, True on the CPU)."""
    kwargs = overrides.over(w.engine)
    kwargs["device"] = device
    # Unless asked, CUDA graphs on a GPU (the engine's default) and eager on the CPU (no graphs there).
    kwargs.setdefault("enforce_eager", not is_cuda(device))
    return kwargs


def measure_engine(w: Workload, model_dir: str | Path, device: str, overrides: EngineArgs,
                   stepper: Stepper | None = None, profile: Any = None) -> dict:
    """Run the workload through the engine; returns the measurement part of the bench JSON.

    `profile` (a labkit.bench.profile.ProfileRequest) adds a profiled run after the timed repeats."""
    try:
        from engine import LLM, SamplingParams
    except ImportError as exc:  # pragma: no cover - the engine ships with labkit
        from labkit.errors import LabkitError

        raise LabkitError(f"cannot import the engine: {exc}") from exc
    stepper = stepper or Stepper()
    kwargs = engine_kwargs(w, overrides, device)

    stepper.start("init (loading the engine)", 1)
    start = time.perf_counter()
    llm = LLM(str(model_dir), **kwargs)
    init_wall_s = time.perf_counter() - start
    stepper.advance()
    try:
        run_device = str(llm.device)
        vocab = int(llm.config.hf_config.vocab_size)
        folded = False

        def requests(d: Draw) -> tuple[list[list[int]], list[Any]]:
            nonlocal folded
            prompts, was_folded = fold_to_vocab(d.prompts, vocab)
            folded = folded or was_folded
            params = [SamplingParams(temperature=w.temperature, ignore_eos=w.ignore_eos, max_tokens=t)
                      for t in d.max_tokens]
            return prompts, params

        def generate(d: Draw) -> tuple[float, int, dict]:
            prompts, params = requests(d)
            before = dict(llm.async_stats)
            if w.timing == "steps":
                wall, times = timed(lambda: run_steps(llm, prompts, params), run_device)
                out, stats = sum(t.new_tokens for t in times), step_stats(times)
            else:
                wall, outs = timed(lambda: llm.generate(prompts, params, use_tqdm=False), run_device)
                out, stats = sum(len(o["token_ids"]) for o in outs), {}
            # Async scheduling: steps launched while the one before ran, rows wasted on a late EOS.
            stats["async_steps"] = {k: llm.async_stats[k] - before[k] for k in before}
            return wall, out, stats

        warmup_rounds = []
        stepper.start("warm-up", w.warmup.rounds)
        for r in range(w.warmup.rounds):
            d = draw_warmup(w, r)
            wall, out_tokens, _ = generate(d)
            warmup_rounds.append({"round": r, "requests": len(d), "prompt_tokens": d.prompt_tokens,
                                  "output_tokens": out_tokens, "wall_s": wall})
            stepper.advance()
        overall_before = peak_now(run_device)
        # Tensor parallel workers measure themselves and answer over the engine's control channel.
        per_rank = llm.peak_memory_per_rank if int(llm.config.tensor_parallel_size) > 1 else None
        workers_before = per_rank()[1:] if per_rank else None
        reset_peak(run_device)
        if per_rank:
            llm.reset_peak_memory()

        runs = []
        stepper.start("timed repeats", w.repeats)
        for i in range(w.repeats):
            d = draw_repeat(w, i)
            wall, out_tokens, stats = generate(d)
            runs.append(run_record(i, d, wall, out_tokens,
                                   prefix_cache_possible=bool(i > 0 and not w.vary_seed), **stats))
            stepper.advance()
        timed_peak = peak_now(run_device)
        workers = list(zip(workers_before, per_rank()[1:])) if per_rank else None
        overall = {k: (max(v, timed_peak[k]) if v is not None else None) for k, v in overall_before.items()}

        profiled = None
        if profile is not None:
            from labkit.bench.profile import profile_prompts, profile_run

            stepper.start("profiled run", 1)
            prompts, params = requests(draw_repeat(w, 0))
            profiled = profile_run(llm, profile_prompts(prompts, vocab), params, run_device, profile)
            stepper.advance()

        cfg = llm.config
        engine_rec = {f: getattr(cfg, f, None) for f in RECORDED_ENGINE_FIELDS}
        engine_rec["attention_backend"] = llm.attention_backend
        # The pool size actually used is a result (kv_blocks); the config keeps what was asked.
        engine_rec["num_kvcache_blocks"] = kwargs.get("num_kvcache_blocks", -1)
        graph_capture = llm.graph_capture_seconds
        return {
            "dtype": _dtype_name(llm.dtype),
            "run_device": run_device,
            "engine": engine_rec,
            "engine_requested": {k: v for k, v in kwargs.items()},
            "execution": llm.execution,
            "init_s": float(llm.init_seconds),
            "init_wall_s": init_wall_s,
            "graph_capture_s": None if graph_capture is None else float(graph_capture),
            "startup_s": {k: round(float(v), 4) for k, v in llm.startup_seconds.items()},
            "warmup_s": sum(r["wall_s"] for r in warmup_rounds),
            "warmup_rounds": warmup_rounds,
            "runs": runs,
            "median": summarize(runs),
            "kv_blocks": int(cfg.num_kvcache_blocks),
            "peak_memory": peak_memory_record(run_device, overall, timed_peak, int(cfg.tensor_parallel_size),
                                              workers),
            "vocab_size": vocab,
            "prompt_ids_folded": folded,
            "profile": profiled,
        }
    finally:
        llm.exit()
