#!/usr/bin/env python
"""Wall time of the steps a mixed-policy engine runs, with and without CUDA graphs for mixed steps.

    python scripts/mixed_step_bench.py --model DIR --mixed-graphs on|off [--out FILE]

One engine (scheduling_policy mixed, budget 2112, graphs on for decode, bf16): prefill-only steps of 128, 512
and 2048 tokens, decode steps of 64 running sequences, and mixed steps of those 64 decodes plus a 2048-token
prompt; each step timed with the device synchronised, the median of the repeats after one untimed round.
`--mixed-graphs off` skips capturing the mixed graphs (engine/mixed_graphs.py), so mixed steps run eagerly.
Needs a CUDA GPU."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(model: str, mixed_graphs: bool, repeats: int) -> dict:
    import torch

    from engine import LLM, SamplingParams
    from engine.runner import ModelRunner

    if not mixed_graphs:
        ModelRunner.capture_mixed_graphs = lambda self, pool: None
    llm = LLM(model, device="cuda", dtype="bfloat16", scheduling_policy="mixed", max_num_batched_tokens=2112,
              max_model_len=4096, gpu_memory_utilization=0.5, async_scheduling=False)
    counter = iter(range(10 ** 9))

    def prompt(n):
        base = next(counter) * 7919
        return [100 + (base + i) % 9000 for i in range(n)]

    def timed():
        torch.cuda.synchronize()
        t = time.perf_counter()
        r = llm.step()
        torch.cuda.synchronize()
        return time.perf_counter() - t, r

    one = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0)
    out, execution = {}, {}
    for n in (128, 512, 2048):
        times = []
        for _ in range(repeats + 1):
            llm.add_request(prompt(n), one)
            t, res = timed()
            while not llm.is_finished():
                llm.step()
            times.append(t)
        out[f"prefill {n}"], execution[f"prefill {n}"] = statistics.median(times[1:]) * 1e3, res.inputs.execution
    ids = [llm.add_request(prompt(100), SamplingParams(max_tokens=4000, ignore_eos=True, temperature=0))
           for _ in range(64)]
    while any(llm.get_sequence(i).num_cached_tokens == 0 for i in ids):
        llm.step()
    runs = [timed() for _ in range(repeats + 1)][1:]
    out["decode 64"], execution["decode 64"] = statistics.median(t for t, _ in runs) * 1e3, runs[-1][1].inputs.execution
    times = []
    for _ in range(repeats + 1):
        llm.add_request(prompt(2048), one)
        t, res = timed()
        times.append(t)
        assert res.phase == "mixed", res.phase
    out["mixed 64 + 2048"], execution["mixed 64 + 2048"] = statistics.median(times[1:]) * 1e3, res.inputs.execution
    llm.exit()
    return {"ms": out, "execution": execution, "graph_capture_s": llm.graph_capture_seconds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mixed-graphs", choices=["on", "off"], required=True)
    ap.add_argument("--out")
    a = ap.parse_args()
    res = {"mixed_graphs": a.mixed_graphs, **measure(a.model, a.mixed_graphs == "on", a.repeats)}
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
