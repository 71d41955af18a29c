#!/usr/bin/env bash
# Everything the open GPU items need, in one device call (about 9 minutes on one H200):
#   bash scripts/gpu_session.sh [evidence|perf|all]
# evidence: every trace case on fake Qwen3-0.6B, doctor/smoke, logits-check suites (bf16);
# perf: gpu_check with the kernel/sampler variants, labkit bench (nano + fixed, graph/eager, hf baseline).
# Logs and JSON go to $OUT (the device tool's output folder) or ./runs/gpu-session.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-runs/gpu-session}
mkdir -p "$OUT"
export RUNS_DIR=$OUT/runs
M=/tmp/qwen3-fake
what=${1:-all}
step() { local t=$1; shift; echo "== $*"; timeout "$t" "$@" > "$OUT/$(echo "$*" | tr -c 'a-zA-Z0-9' _ | cut -c1-80).log" 2>&1; echo "   rc=$?"; }

[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null

if [ "$what" = evidence ] || [ "$what" = all ]; then
  step 60 python3 -m labkit doctor --device cuda --model $M
  step 60 python3 -m labkit smoke --device cuda
  for c in A B B-seqs1 C chunk D lifecycle prefix preempt refs balanced; do
    step 40 python3 -m labkit trace --case $c --model $M --device cuda -q --out $OUT/runs/trace-$c
  done
  step 40 python3 -m labkit trace --case lifecycle --model $M --device cuda -q --shapes --out $OUT/runs/trace-shapes
  step 90 python3 -m labkit logits-check run --suite baseline --attention torch --device cuda --dtype bfloat16 --model $M --out $OUT/runs/logits-baseline-torch
  step 90 python3 -m labkit logits-check run --suite baseline --attention triton --execution graph --device cuda --dtype bfloat16 --model $M --out $OUT/runs/logits-baseline-triton-graph
  step 150 python3 -m labkit logits-check run --suite graph --attention triton --execution graph --device cuda --dtype bfloat16 --model $M --out $OUT/runs/logits-graph
  step 120 python3 -m labkit logits-check run --suite kv --attention triton --execution graph --device cuda --dtype bfloat16 --model $M --out $OUT/runs/logits-kv
fi
if [ "$what" = perf ] || [ "$what" = all ]; then
  GPU_CHECK_VARIANTS=1 step 300 python3 scripts/gpu_check.py --skip-correct --out $OUT/gpu_check.json
  step 120 python3 -m labkit bench --workload nano --model $M --device cuda --graph --repeats 2 --out $OUT/bench-nano-graph.json
  step 120 python3 -m labkit bench --workload fixed --model $M --device cuda --graph --out $OUT/bench-fixed-graph.json
  step 120 python3 -m labkit bench --workload fixed --model $M --device cuda --eager --out $OUT/bench-fixed-eager.json
  step 30 python3 -m labkit bench compare $OUT/bench-fixed-eager.json $OUT/bench-fixed-graph.json --variable eager --out $OUT/compare-eager.json
  step 300 python3 -m labkit bench --workload nano --backend hf --model $M --device cuda --repeats 1 --out $OUT/bench-nano-hf.json
  step 30 python3 -m labkit bench compare $OUT/bench-nano-hf.json $OUT/bench-nano-graph.json --variable backend --out $OUT/compare-backend.json
fi
echo "done: $OUT"
