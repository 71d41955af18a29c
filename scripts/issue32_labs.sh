#!/usr/bin/env bash
# Issue 32's two optimisation labs on one GPU, run as workloads/labs.yaml lists them (plus --model and --device),
# into a runs folder of their own, then `labkit report` over it. Everything is written under $WORK (made here,
# on the device's disk); the small files (JSON, Markdown, the report's md/html/manifest, logs) are copied to
# $OUT/labs. The logits arrays (5 x ~170 MB on Qwen3-0.6B's vocabulary), the profile traces and the evidence
# archive stay in $WORK.
#   bash scripts/issue32_labs.sh            # both labs
#   bash scripts/issue32_labs.sh fp8-kv     # one of them (fp8-kv | batch1-kernels)
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
WORK=$(mktemp -d /tmp/issue32-labs.XXXXXX)
export RUNS_DIR=$WORK/runs
mkdir -p "$RUNS_DIR" "$OUT/labs"
M=/tmp/qwen3-fake
L="python3 -m labkit"
G="--model $M --device cuda"
st() { local t=$1 name=$2; shift 2; local s=$SECONDS; timeout "$t" "$@" > "$WORK/$name.log" 2>&1; echo "rc=$? ${SECONDS}-${s}s $name" | tee -a "$WORK/steps.txt"; }
keep() {  # the small files, beside the logs
  (cd "$WORK" && find . -type f \( -name '*.json' -o -name '*.md' -o -name '*.html' -o -name '*.log' -o -name '*.txt' \) \
     ! -name '*.trace.json' -size -20M -print0 | tar czf "$OUT/labs/labs.tgz" --null -T -)
  cp "$WORK/steps.txt" "$OUT/labs/" 2>/dev/null
}
trap keep EXIT
[ -f $M/config.json ] || st 120 fake $L model fake --preset qwen3-0.6b --out $M
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$WORK/gpu.txt" 2>&1
lab=${1:-all}
if [ "$lab" = all ] || [ "$lab" = fp8-kv ]; then
  st 240 bench-nano-kv-auto $L bench --workload nano --repeats 3 $G --out $RUNS_DIR/bench-nano-kv-auto.json
  st 240 bench-nano-kv-fp8 $L bench --workload nano --repeats 3 --kv-cache-dtype fp8 $G --out $RUNS_DIR/bench-nano-kv-fp8.json
  st 60 compare-kv $L bench compare $RUNS_DIR/bench-nano-kv-auto.json $RUNS_DIR/bench-nano-kv-fp8.json --variable kv_cache_dtype
  st 420 logits-fp8-kv $L logits-check run --suite fp8-kv --execution graph --dtype bfloat16 $G
fi
if [ "$lab" = all ] || [ "$lab" = batch1-kernels ]; then
  st 180 bench-batch1-unfused $L bench --workload batch1 --profile --no-fused-decode $G --out $RUNS_DIR/bench-batch1-unfused.json
  st 180 bench-batch1-fused $L bench --workload batch1 --profile $G --out $RUNS_DIR/bench-batch1-fused.json
  st 60 compare-fused $L bench compare $RUNS_DIR/bench-batch1-unfused.json $RUNS_DIR/bench-batch1-fused.json --variable fused_decode
fi
COLUMNS=100 st 300 report $L report --runs "$RUNS_DIR" --out "$WORK/report"
cat "$WORK/steps.txt"
sed -n '/^## fp8-kv: /,/^Picture/p; /^## batch1-kernels: /,/^Picture/p' "$WORK/report/report.md"
