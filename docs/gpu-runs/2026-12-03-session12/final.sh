#!/usr/bin/env bash
# Session 12's device call (one H200, the final engine, ~11 minutes of device time left): session 11's final.sh
# reordered by what had not been measured: the evidence (every trace case, bf16 and FP8; every logits suite, fp8-kv
# included), then serving (fp8 at rate inf; mixed at rates 16 and 32; trace --url over a rate-16 load), then
# issue 32's bar again (batch-1, nano bf16 and fp8, the profiled fused/unfused batch-1 runs of the batch1-kernels
# lab). Outputs packed into $OUT/final.tgz, a summary in $OUT/summary.txt. Run from the repo root with the server
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
# 2. serving: fp8 at rate inf (its own server); mixed at the default budget at rates 16 and 32 on a plain server
# (/metrics scraped around each load); trace --url over a rate-16 load on a --live-trace server
st 150 load-fp8-inf $LK bench load --workload nano --rate inf --kv-cache-dtype fp8 $G --out $R/bench-load-nano-fp8-inf.json
serve() { port=$1; shift; url=http://127.0.0.1:$port
  $LK serve $G --port $port --log-level warning --log-stats-interval 0 "$@" > $L/serve-$port.log 2>&1 & spid=$!
  for _ in $(seq 600); do curl -sf $url/health > /dev/null && break; sleep 0.2; done
  echo "server $port up @$((SECONDS-T0))" >> $S
  st 60 warm-$port $LK bench load --workload nano --num-requests 16 --rate inf --seed 9 --url $url --no-warmup --out $L/warm-$port.json; }
serve 8911 --policy mixed
for rs in "16 1" "32 2"; do set -- $rs
  curl -s $url/metrics > $L/metrics-mixed-$1-before.txt
  st 150 load-mixed-$1 $LK bench load --workload nano --rate $1 --seed $2 --url $url --no-warmup --out $R/bench-load-nano-mixed-$1.json
  curl -s $url/metrics > $L/metrics-mixed-$1-after.txt
done
kill -TERM $spid; wait $spid
serve 8912 --policy mixed --live-trace
st 150 load-live $LK bench load --workload nano --num-requests 160 --rate 16 --seed 3 --url $url --no-warmup --out $L/load-live.json &
lp=$!; sleep 4
st 120 trace-url $LK trace --url $url --seconds 5 -q --out $R/trace-live-mixed
wait $lp
kill -TERM $spid; wait $spid
pack
# 3. issue 32's bar, timed one at a time, last (measured in session 11 already; the Transformers reference too) (the profiled runs are the batch1-kernels lab's and time batch-1 too)
B="$LK bench $G"
for i in 1; do st 90 batch1-$i $B --workload batch1 --out $R/bench-batch1-$i.json; done
st 150 nano-bf16 $B --workload nano --repeats 3 --out $R/bench-nano-kv-auto.json
st 150 nano-fp8 $B --workload nano --repeats 3 --kv-cache-dtype fp8 --out $R/bench-nano-kv-fp8.json
st 30 cmp-kv $B compare $R/bench-nano-kv-auto.json $R/bench-nano-kv-fp8.json --variable kv_cache_dtype
st 90 b1-unfused-prof $B --workload batch1 --profile --no-fused-decode --out $R/bench-batch1-unfused.json
st 90 b1-fused-prof $B --workload batch1 --profile --out $R/bench-batch1-fused.json
st 30 cmp-fused $B compare $R/bench-batch1-unfused.json $R/bench-batch1-fused.json --variable fused_decode
echo "done @$((SECONDS-T0))" >> $S
