#!/usr/bin/env python
"""Wall time of eager steps (prefill and mixed), the steps CUDA graphs do not cover, with the small fused ops
compiled everywhere (the engine before 2026-12-01's change) or only inside graphs (now).

    python scripts/eager_step_bench.py --model DIR [--out FILE]

For each variant one engine (graphs on, bf16): prefill-only steps of 128, 512, 2048 and 8192 new tokens, and
mixed steps of 64 running decodes plus a 2048-token chunk; each step timed with the device synchronised,
median of the repeats after one untimed round. Needs a CUDA GPU."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _timed_step(llm, torch) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    llm.step()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def measure(model: str, compiled_everywhere: bool, repeats: int) -> dict:
    import torch

    from engine import LLM, SamplingParams
    from engine import kernel_choice

    if compiled_everywhere:  # what elementwise() did before: the compiled function for every call
        from engine.layers import fused
        kernel_choice.KernelChoice.elementwise = lambda self, fn: fused.compiled(fn) if self.compile_fused else fn
    out = {}
    for policy, budget in (("prefill_first", 8192), ("mixed", 2112)):
        llm = LLM(model, device="cuda", dtype="bfloat16", scheduling_policy=policy, max_num_batched_tokens=budget,
                  max_model_len=8192, gpu_memory_utilization=0.35, async_scheduling=False)
        rng = iter(range(10 ** 9))
        one = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0)

        def prompt(n):
            base = next(rng) * 7919
            return [100 + (base + i) % 9000 for i in range(n)]
        if policy == "prefill_first":
            for n in (128, 512, 2048, 8192):
                times = []
                for r in range(repeats + 1):
                    llm.add_request(prompt(n), one)
                    t = _timed_step(llm, torch)
                    while not llm.is_finished():
                        llm.step()
                    if r:
                        times.append(t)
                out[f"prefill {n}"] = statistics.median(times) * 1e3
        else:
            long = SamplingParams(max_tokens=4096, ignore_eos=True, temperature=0)
            ids = [llm.add_request(prompt(100), long) for _ in range(64)]
            while any(llm.get_sequence(i).num_cached_tokens == 0 for i in ids):
                llm.step()
            dec = [_timed_step(llm, torch) for _ in range(repeats + 1)][1:]
            mixed = []
            for r in range(repeats + 1):
                llm.add_request(prompt(2048), one)
                t = _timed_step(llm, torch)
                if r:
                    mixed.append(t)
                llm.step()  # its last token, beside the decodes
            out["decode 64 (graph)"] = statistics.median(dec) * 1e3
            out["mixed 64 + 2048"] = statistics.median(mixed) * 1e3
        llm.exit()
        del llm
        torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variant", choices=["graphs-only", "everywhere"], default=None,
                    help="one variant (each in its own process keeps torch.compile's state apart)")
    ap.add_argument("--out")
    a = ap.parse_args()
    res = {"compiled_ops": a.variant, "ms": measure(a.model, a.variant == "everywhere", a.repeats)}
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
