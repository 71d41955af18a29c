#!/usr/bin/env bash
# Session 14, device call 1 (one H200, fake Qwen3-0.6B bf16): issue 32's FP8 decode on FP8 tensor cores, then the
# batch-1 candidates of session 13, each against the engine as it is.
#   1. kernel_bench.py --kv-cache-dtype fp8 --fp8-dot: the decode kernel over an e4m3 pool at batch 256 with
#      fp8_dot off (the default: every e4m3 value converted to float16), qk (q quantised to e4m3 a head, q.K^T on
#      FP8 tensor cores) and qkpv (p in e4m3 too), at four launch shapes each; the default timed first and last.
#   2. nano with --kv-cache-dtype fp8, median of 3, under LABKIT_FP8_DOT=off, qk, qkpv.
#   3. logits-check fp8-kv (eager: the bulk decode kernel) under qk and qkpv, side by side: does the anchored gate
#      still pass with q (and p) rounded to e4m3?
#   4. batch-1: base, split64 (session 13's -1.6%), GEMV programs of 16 rows x 4 warps and 32 rows x 8 warps;
#      3 interleaved rounds as time allows (scripts/batch1_sweep.sh).
# Predictions (before the run): the float16 conversions bound the FP8 kernel (2.5-3.0 TB/s of e4m3 bytes against
# bf16's 4.1-4.4), so qk 3.2-3.6 TB/s and qkpv 3.6-4.0; nano fp8 29k -> 31-33k (qkpv); fp8-kv logits PASS with
# qk, REVIEW-or-PASS with qkpv (the worst ratio grows ~1.2-1.4x). Batch-1: split64 0.83 (-1.5%), GEMV shapes
# within +-2% of base.
# Back: $OUT/call1.tgz (runs, logs, summaries), $OUT/summary.txt.
set -u
T0=$SECONDS; DEADLINE=${DEADLINE:-575}
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
S=$OUT/summary.txt
M=/tmp/qwen3-fake; W=/tmp/s14c1; R=$W/runs; L=$W/logs; mkdir -p $R $L
pack() { tar czf $OUT/call1.tgz -C $W --exclude="*.npz" --exclude="*.trace.json*" --exclude="*.jsonl" . 2>/dev/null; }
trap pack EXIT
st() { local t=$1 n=$2; shift 2; local s=$SECONDS left=$((DEADLINE-(SECONDS-T0)))
  if [ $left -lt 15 ]; then echo "skipped (deadline) $n" >> $S; return; fi
  [ "$t" -gt "$left" ] && t=$left
  timeout "$t" "$@" > $L/$n.log 2>&1; echo "rc=$? $((SECONDS-s))s @$((SECONDS-T0)) $n" >> $S; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S 2>&1
[ -f $M/config.json ] || st 120 fake python3 -m labkit model fake --preset qwen3-0.6b --out $M
LK="python3 -m labkit"; G="--model $M --device cuda"
st 160 kb-fp8-dot python3 scripts/kernel_bench.py --skip-prefill --kv-cache-dtype fp8 --fp8-dot --out $R/kernel-bench-fp8-dot.json
grep -i "recommend" $R/kernel-bench-fp8-dot.md >> $S 2>/dev/null
pack
for d in off qk qkpv; do
  LABKIT_FP8_DOT=$d st 100 nano-fp8-$d $LK bench $G --workload nano --kv-cache-dtype fp8 --repeats 3 --out $R/nano-fp8-$d.json
  echo "nano fp8 $d: $(python3 -c "import json;print(json.load(open('$R/nano-fp8-$d.json'))['median']['output_throughput'])" 2>/dev/null)" >> $S
done
pack
LC="$LK logits-check run $G --dtype bfloat16 --suite fp8-kv"
LABKIT_FP8_DOT=qk st 240 lc-fp8-qk $LC --out $R/lc-fp8-qk &
LABKIT_FP8_DOT=qkpv st 240 lc-fp8-qkpv $LC --out $R/lc-fp8-qkpv &
wait
for d in qk qkpv; do echo "lc $d: $(grep -h -i "verdict\|FP8 KV puts\|cost" $L/lc-fp8-$d.log 2>/dev/null | head -4 | tr "\n" " ")" >> $S; done
pack
left=$((DEADLINE-(SECONDS-T0)-10))
[ $left -gt 60 ] && OUT=$W/b1sweep BATCHES=1 ROUNDS=3 DEADLINE=$left \
  VARIANTS="base: split64:LABKIT_DECODE_SHORT_CONTEXT=0,LABKIT_DECODE_MERGE_PDL=1,LABKIT_DECODE_BLOCK_N=64 gemv16x4:LABKIT_DECODE_GEMV=16,4 gemv32x8:LABKIT_DECODE_GEMV=32,8" \
  bash scripts/batch1_sweep.sh > $L/b1sweep.log 2>&1
cat $W/b1sweep/summary.md >> $S 2>/dev/null
echo "done @$((SECONDS-T0))" >> $S
