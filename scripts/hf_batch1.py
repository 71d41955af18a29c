"""The Transformers batch-1 reference for issue 32's bar: decode ms a token of `generate` on the same weights,
with its static cache and the forward pass compiled (generate's own torch.compile on CUDA, reduce-overhead: CUDA
graphs), as a user of Transformers would make it fast. Same shape as `labkit bench --workload batch1`: 128
prompt tokens, 256 decode steps; decode ms a token = (time of 257 new tokens - time of 1) / 256, median of --repeats.

    python3 scripts/hf_batch1.py --model DIR [--device cuda] [--no-compile] [--repeats 5] [--out FILE.json]"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=257)
    ap.add_argument("--out")
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device).eval()
    model.generation_config.cache_implementation = "static"
    # generate compiles its decoding forward itself when the cache is static, on CUDA (Transformers' auto-compile:
    # reduce-overhead, CUDA graphs, with the step markers a hand-wrapped torch.compile lacks: session 16's call
    # that wrapped model.forward failed on "accessing tensor output of CUDAGraphs that has been overwritten").
    model.generation_config.disable_compile = args.no_compile
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, min(10000, model.config.vocab_size), (1, 128), generator=g).to(args.device)

    def run(n: int) -> float:
        if args.device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 attention_mask=torch.ones_like(ids))
        if args.device == "cuda":
            torch.cuda.synchronize()
        assert out.shape[1] == ids.shape[1] + n
        return time.perf_counter() - t

    t0 = time.perf_counter()
    for _ in range(2):  # compiles and captures
        run(args.new_tokens)
        run(1)
    warm = time.perf_counter() - t0
    per_token = []
    for _ in range(args.repeats):
        full, one = run(args.new_tokens), run(1)
        per_token.append((full - one) / (args.new_tokens - 1) * 1e3)
    result = {"decode_ms_per_token": statistics.median(per_token), "repeats": per_token, "warmup_s": warm,
              "compiled": not args.no_compile and args.device == "cuda", "cache": "static", "dtype": str(dtype),
              "device": args.device,
              "transformers": __import__("transformers").__version__, "torch": torch.__version__}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
