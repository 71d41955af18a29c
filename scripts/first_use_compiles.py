"""What a workload compiles on first use, after the engine's start-up and the bench's warm-up.

A bench's repeat 0 and a fresh server's first requests run slower than later ones. This script finds out
which kernels are built during them: it points Triton's and Inductor's caches at empty folders, builds the
engine and runs the workload's warm-up (as `labkit bench` does), then runs repeat 0 and repeat 1, listing
the kernels each one added to the caches and the graphs TorchDynamo compiled.

    PYTHONPATH=. python3 scripts/first_use_compiles.py --workload nano --device cuda --out runs/first-use.json

Writes JSON and a .md table beside it. On a CPU it runs too (eager; Inductor compiles nothing there).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def _cache_entries(root: str) -> dict[str, str]:
    """{relative path: kernel name} of the compiled artefacts under a cache folder."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith((".json", ".py", ".so", ".cubin")) and not f.startswith("__grp__"):
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                out[rel] = f.rsplit(".", 1)[0]
    return out


def _added(before: dict, after: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for rel, name in after.items():
        if rel not in before:
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="nano")
    ap.add_argument("--model", default="/tmp/qwen3-fake")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="runs/first-use-compiles.json")
    args = ap.parse_args(argv)

    triton_dir, inductor_dir = tempfile.mkdtemp(prefix="triton-"), tempfile.mkdtemp(prefix="inductor-")
    os.environ["TRITON_CACHE_DIR"] = triton_dir
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_dir

    from labkit.bench.offline import engine_kwargs
    from labkit.bench.workloads import draw_repeat, draw_warmup, fold_to_vocab, load_workload
    from labkit.engine_args import EngineArgs

    w = load_workload(args.workload)
    import torch

    from engine import LLM, SamplingParams

    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover
        counters = None

    def snapshot():
        graphs = dict(counters["stats"]) if counters is not None else {}
        return {"triton": _cache_entries(triton_dir), "inductor": _cache_entries(inductor_dir), "dynamo": graphs}

    def run(llm, d):
        prompts, _ = fold_to_vocab(d.prompts, int(llm.config.hf_config.vocab_size))
        params = [SamplingParams(temperature=w.temperature, ignore_eos=w.ignore_eos, max_tokens=t)
                  for t in d.max_tokens]
        if llm.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        if llm.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    phases = []
    t0 = time.perf_counter()
    llm = LLM(args.model, **engine_kwargs(w, EngineArgs(), args.device))
    marks = [("start-up", time.perf_counter() - t0, snapshot())]
    for r in range(w.warmup.rounds):
        marks.append((f"warm-up {r}", run(llm, draw_warmup(w, r)), snapshot()))
    for i in range(2):
        marks.append((f"repeat {i}", run(llm, draw_repeat(w, i)), snapshot()))
    llm.exit()

    previous = {"triton": {}, "inductor": {}, "dynamo": {}}
    for name, seconds, snap in marks:
        dynamo = {k: v - previous["dynamo"].get(k, 0) for k, v in snap["dynamo"].items()
                  if v != previous["dynamo"].get(k, 0)}
        phases.append({"phase": name, "seconds": round(seconds, 3),
                       "triton_kernels_added": _added(previous["triton"], snap["triton"]),
                       "inductor_files_added": _added(previous["inductor"], snap["inductor"]),
                       "dynamo_counters_added": dynamo})
        previous = snap
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"workload": w.name, "device": args.device, "phases": phases}, indent=2))
    lines = [f"# First-use compiles: {w.name} on {args.device}", "",
             "| phase | seconds | Triton cache files added | Inductor cache files added | Dynamo counters |",
             "| --- | --- | --- | --- | --- |"]
    for p in phases:
        tri = ", ".join(f"{k} x{v}" for k, v in list(p["triton_kernels_added"].items())[:12]) or "-"
        ind = sum(p["inductor_files_added"].values())
        dyn = ", ".join(f"{k} +{v}" for k, v in p["dynamo_counters_added"].items()) or "-"
        lines.append(f"| {p['phase']} | {p['seconds']} | {tri} | {ind} | {dyn} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
