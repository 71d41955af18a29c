"""Does a decode graph that draws its own tokens (LABKIT_GRAPH_SAMPLE_BS) pick the tokens the engine picks
without it? One engine process per setting (the knob is read at import), the same prompts and sampling
settings (greedy rows, seeded rows, rows on the engine's seed), batches that fill a graph bucket and one that
pads it; prints each batch's verdict and how many steps the graph drew.

    python scripts/graph_sampling_check.py --model DIR [--device cuda] [--sizes 1,3,16] [--out check.json]

Exit 0 when every batch's ids agree and its graph drew, 1 when ids differ, 3 when a graph drew nothing (on the
CPU no graph is captured: both runs are eager and the verdict is NOT RUN; its use there is to test this script)."""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _params(n: int):
    from engine.sampling_params import SamplingParams

    # Greedy, seeded and engine-seeded rows in turn: each reaches the draw differently.
    return [SamplingParams(temperature=[0.0, 0.8, 1.0][i % 3], seed=i if i % 3 == 1 else None, max_tokens=24,
                           ignore_eos=True) for i in range(n)]


def emit(model: str, device: str, sizes: list[int]) -> dict:
    """This process's ids for every batch size, and how many decode steps the graph drew."""
    from engine.llm import LLMEngine
    from engine.runner import ModelRunner

    drawn = [0]
    execute = ModelRunner.execute

    def counting(self, plan):
        launched = execute(self, plan)
        drawn[0] += self.drawn is not None
        return launched
    ModelRunner.execute = counting
    rng = random.Random(0)
    result = {}
    for n in sizes:
        # max_num_seqs: the smallest bucket holding n, so every decode step replays that bucket's graph.
        bucket = next(b for b in [1, 2, 4, 8, 16, 32] if b >= n)
        llm = LLMEngine(model, device=device, max_num_seqs=bucket, max_model_len=256)
        prompts = [[rng.randrange(100, 2000) for _ in range(rng.randrange(20, 60))] for _ in range(n)]
        drawn[0] = 0
        outs = llm.generate(prompts, _params(n), use_tqdm=False)
        result[str(n)] = {"ids": [o["token_ids"] for o in outs], "drawn_steps": drawn[0],
                          "execution": llm.execution}
        llm.exit()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sizes", default="1,3,16")
    ap.add_argument("--graph-sample-bs", default="16", help="the knob's value for the drawing run")
    ap.add_argument("--out")
    ap.add_argument("--emit", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes: comma-separated integers, got {a.sizes!r}")
    if a.emit:
        print(json.dumps(emit(a.model, a.device, sizes)))
        return 0
    runs = {}
    for knob in ("0", a.graph_sample_bs):
        env = {**os.environ, "LABKIT_GRAPH_SAMPLE_BS": knob, "PYTHONPATH": str(REPO)}
        res = subprocess.run([sys.executable, __file__, "--emit", "--model", a.model, "--device", a.device,
                              "--sizes", a.sizes], capture_output=True, text=True, env=env)
        if res.returncode != 0:
            print(f"the run with LABKIT_GRAPH_SAMPLE_BS={knob} failed:\n{res.stderr[-3000:]}", file=sys.stderr)
            return 2
        runs[knob] = json.loads(res.stdout.strip().splitlines()[-1])
    base, test = runs["0"], runs[a.graph_sample_bs]
    report, ok = {}, True
    for n in sizes:
        b, t = base[str(n)], test[str(n)]
        same = sum(x == y for bi, ti in zip(b["ids"], t["ids"]) for x, y in zip(bi, ti))
        total = sum(len(bi) for bi in b["ids"])
        agree = b["ids"] == t["ids"]
        ok &= agree
        report[n] = {"agree": agree, "tokens_equal": same, "tokens": total, "drawn_steps_off": b["drawn_steps"],
                     "drawn_steps_on": t["drawn_steps"]}
        print(f"batch {n}: {'ids agree' if agree else 'ids DIFFER'} ({same}/{total} tokens equal); "
              f"steps the graph drew: {b['drawn_steps']} off, {t['drawn_steps']} on")
    tested = all(r["drawn_steps_on"] > 0 for r in report.values())
    verdict = "FAIL" if not ok else ("PASS" if tested else "NOT RUN")
    if a.out:
        Path(a.out).write_text(json.dumps({"graph_sample_bs": a.graph_sample_bs, "verdict": verdict,
                                           "batches": report}, indent=1))
    print("VERDICT:", verdict, "" if tested else "(a batch's graph drew no step: no CUDA graphs, nothing compared)")
    return {"PASS": 0, "FAIL": 1}.get(verdict, 3)


if __name__ == "__main__":
    sys.exit(main())
