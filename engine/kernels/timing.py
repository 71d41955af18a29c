"""Device timings for kernel benchmarks (scripts/kernel_bench.py, scripts/gpu_check.py): CUDA events only, the
function run once first so compilation stays out of the figures."""
from __future__ import annotations

import statistics

import torch


def graph_ms(fn, calls: int = 20, replays: int = 7) -> float:
    """Per-call milliseconds of `fn` replayed from one CUDA graph holding `calls` calls (no launch gaps, as the
    engine's decode graphs run it); median over `replays` replays."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = [_timed(graph.replay) / calls for _ in range(replays)]
    del graph
    return statistics.median(times)


def events_ms(fn, reps: int = 50, warmup: int = 3) -> float:
    """Milliseconds of one eager call of `fn` (launch overhead included), median of `reps`."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return statistics.median(_timed(fn) for _ in range(reps))


def _timed(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)
