#!/usr/bin/env bash
# Session 12's device call (one H200, the final engine, ~11 minutes of device time left): session 11's final.sh
# reordered by what had not been measured: the evidence at the final commit (every trace case, bf16 and FP8; every
# logits suite, fp8-kv included), then serving (scripts/gpu_session.sh issue34's sections C and B: every policy at
# rates 16, 32, inf; trace --url), then FP8 serving against offline and batch-1 as time allows. Outputs packed
# into $OUT/final.tgz and $OUT/reports.tgz, a summary in $OUT/summary.txt. Run from the repo root with the server
# wheels in .whl/ (docs/perf.md says how) and `carry: [".whl"]`.
set -u
FINAL=$OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > /dev/null 2>&1 || echo "wheels: install failed" >> $FINAL/summary.txt
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
M=/tmp/qwen3-fake; W=/tmp/f; R=$W/runs; L=$W/logs; mkdir -p $R $L
export RUNS_DIR=$R MODEL_DIR=$M
S=$FINAL/summary.txt
pack() { tar czf $FINAL/final.tgz -C $W --exclude="*.npz" --exclude="*.trace.json*" --exclude="*.jsonl" . 2>/dev/null; }
trap pack EXIT
T0=$SECONDS; DEADLINE=${DEADLINE:-460}
# Every step is cut to what is left before DEADLINE seconds (the session's device time is short), and skipped
# with a line in the summary when under 15 s are left; the archive is packed after each section.
st() { local t=$1 n=$2; shift 2; local s=$SECONDS left=$((DEADLINE-(SECONDS-T0)))
  if [ $left -lt 15 ]; then echo "skipped (deadline) $n" >> $S; return; fi
  [ "$t" -gt "$left" ] && t=$left
  timeout "$t" "$@" > $L/$n.log 2>&1; echo "rc=$? $((SECONDS-s))s @$((SECONDS-T0)) $n" >> $S; }
[ -f $M/config.json ] || st 120 fake python3 -m labkit model fake --preset qwen3-0.6b --out $M
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >> $S 2>&1
LK="python3 -m labkit"; G="--model $M --device cuda"
# 1. correctness, in parallel (its timings are not figures): every case, then the logits suites beside the
# mixed-graph traces and four cases with an FP8 pool (judged strictly: the same states)
for c in $(ls workloads/cases/*.yaml | xargs -n1 basename | sed 's/[.]yaml$//'); do
  st 180 trace-$c $LK trace --case $c $G -q --out $R/trace-$c &
done
wait
LC="$LK logits-check run $G --dtype bfloat16"
st 300 lc-baseline-torch $LC --suite baseline --attention torch --out $R/lc-baseline-torch &
st 300 lc-baseline-triton-eager $LC --suite baseline --attention triton --execution eager --out $R/lc-baseline-triton-eager &
st 300 lc-baseline-triton-graph $LC --suite baseline --attention triton --execution graph --out $R/lc-baseline-triton-graph &
st 300 lc-graph $LC --suite graph --attention triton --execution graph --out $R/lc-graph &
st 300 lc-kv $LC --suite kv --attention triton --execution graph --ref-execution eager --out $R/lc-kv &
st 300 lc-mixed $LC --suite mixed --attention triton --execution graph --out $R/lc-mixed &
st 300 lc-prefix $LC --suite prefix --attention triton --execution graph --out $R/lc-prefix &
st 300 lc-fp8-kv $LC --suite fp8-kv --execution graph &
for c in chunk refs decode-order mixed mixed-preempt; do
  st 240 trace-mixed-graph-$c $LK trace --case $c $G -q --graph --policy mixed --out $R/trace-mixed-graph-$c &
done
for c in chunk preempt prefix-reuse lifecycle; do  # an FP8 pool: the same states, judged strictly
  st 240 trace-fp8-$c $LK trace --case $c $G -q --kv-cache-dtype fp8 --out $R/trace-fp8-$c &
done
wait
pack
# 2. serving: each policy at the default budget on a fresh server at rates 16, 32 and inf, /metrics scraped around
# every load (issue 34's section C: Deliver 7's choice, its prompt-token books; issue 32's mixed ITL bar), then
# trace --url over a rate-16 mixed load (section B); reports.tgz beside final.tgz
left=$((DEADLINE-(SECONDS-T0)))
s0=$SECONDS
OUT=/tmp/i34 PACK_TO=$FINAL FAKE_MODEL=$M ISSUE34_SECTIONS="C B" ISSUE34_POLICIES="mixed prefill_first balanced" \
  ISSUE34_DEADLINE=$((left-90)) timeout $left bash scripts/gpu_session.sh issue34 > $L/issue34.log 2>&1
echo "rc=$? $((SECONDS-s0))s @$((SECONDS-T0)) issue34 C B" >> $S
# 3. issue 32's FP8 serving bar (rate inf against offline), then batch-1, as time allows
st 150 load-fp8-inf $LK bench load --workload nano --rate inf --kv-cache-dtype fp8 $G --out $R/bench-load-nano-fp8-inf.json
st 150 nano-fp8 $LK bench $G --workload nano --kv-cache-dtype fp8 --out $R/bench-nano-kv-fp8.json
st 90 batch1 $LK bench $G --workload batch1 --out $R/bench-batch1.json
echo "done @$((SECONDS-T0))" >> $S
