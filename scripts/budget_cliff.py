"""Issue 32's budget cliff: `serve --policy mixed --budget 8192` at rate inf gave 20.6k tok/s and TTFT p99 1.7 s
against 24.7k / 0.71 s at 2,048 and 25.0k / 0.48 s at 16,384. Which steps leave their graphs, or what else?

The nano workload all at once (rate inf, as a server sees it) through the engine's step loop under mixed, for
each budget: per step its phase, execution (graph or eager), rows, prefill tokens, the graph bucket it was
padded to and its wall time (the loop's: with async scheduling a step's time is the gap to the next return).
Prints a table a budget; writes every step to --out.

    python3 scripts/budget_cliff.py --model DIR [--budgets 2048,8192,16384] [--out FILE.json]"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict

from engine import LLM, SamplingParams
from labkit.bench.workloads import draw, fold_to_vocab, load_workload


def run(model: str, budget: int, extra: dict) -> dict:
    w = load_workload("nano")
    d = draw(w)
    llm = LLM(model, scheduling_policy="mixed", max_num_batched_tokens=budget, max_model_len=4096, **extra)
    t0 = time.perf_counter()
    prompts, _ = fold_to_vocab(d.prompts, llm.config.hf_config.vocab_size)
    for p, n in zip(prompts, d.max_tokens):
        llm.add_request(p, SamplingParams(temperature=0.6, max_tokens=n, ignore_eos=True))
    steps, first = [], {}
    last = time.perf_counter()
    while not llm.is_finished():
        r = llm.step()
        now = time.perf_counter()
        inp = r.inputs
        nd = inp.num_decodes
        prefill_tokens = len(inp.input_ids) - nd
        steps.append(dict(step=r.step, phase=r.phase, execution=inp.execution, decode_rows=nd,
                          prefill_rows=len(r.seq_ids) - nd, prefill_tokens=prefill_tokens,
                          graph=[inp.graph_batch, inp.graph_prefill], s=now - last))
        for rid, tok in zip(r.request_ids, r.token_ids):
            if tok is not None and rid not in first:
                first[rid] = now - t0
        last = now
    wall = time.perf_counter() - t0
    llm.exit()
    ttft = sorted(first.values())
    by = defaultdict(lambda: [0, 0.0, 0])
    for s in steps:
        key = (s["phase"], s["execution"], "rows>16" if s["prefill_rows"] > 16 else "")
        by[key][0] += 1
        by[key][1] += s["s"]
        if s["graph"][1]:
            by[key][2] += s["graph"][1] - s["prefill_tokens"]
    return dict(budget=budget, wall_s=wall, out_tok_s=d.output_tokens / wall,
                ttft_p50=ttft[len(ttft) // 2], ttft_p99=ttft[int(len(ttft) * 0.99)],
                groups=[dict(phase=k[0], execution=k[1], note=k[2], steps=v[0], seconds=round(v[1], 3),
                             padded_prefill_tokens=v[2]) for k, v in sorted(by.items())],
                buckets=Counter(str(s["graph"]) for s in steps).most_common(12), steps=steps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--budgets", default="2048,8192,16384")
    ap.add_argument("--out")
    args = ap.parse_args()
    results = []
    for b in [int(x) for x in args.budgets.split(",")]:
        r = run(args.model, b, {})
        results.append(r)
        print(f"budget {b}: {r['out_tok_s']:.0f} tok/s, wall {r['wall_s']:.2f} s, TTFT p50 {r['ttft_p50']:.3f} s "
              f"p99 {r['ttft_p99']:.3f} s", flush=True)
        for g in r["groups"]:
            print(f"  {g['phase']:8} {g['execution']:5} {g['note']:8} steps {g['steps']:5} {g['seconds']:7.3f} s "
                  f"padded prefill tokens {g['padded_prefill_tokens']}", flush=True)
        print("  most used graphs (decode rows, prefill tokens):", r["buckets"], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
