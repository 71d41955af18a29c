#!/usr/bin/env bash
# Issue 32's next device call (one H200, fake Qwen3-0.6B bf16), after the lab plan (scripts/lab_plan_call.sh):
#   fp8    the FP8 decode kernel's tensor-core variants timed (kernel_bench.py --kv-cache-dtype fp8 --fp8-dot:
#          swap and kq at three launch shapes (256-key tiles among them), qk, qkpv, the default first and last), nano --kv-cache-dtype fp8
#          --repeats 3 under LABKIT_FP8_DOT=off and swap, two runs a side in the order off swap swap off, and the
#          fp8-kv logits suite (eager: the bulk decode kernel) under swap
#   host   where batch-1's host time goes: py-spy (carried wheel) over `bench --workload batch1`, collapsed stacks
#   sweep  scripts/batch1_sweep.sh's default variants against base at batches 1, 4 and 16, three interleaved
#          rounds (when session 15 ran this call: split64, the norm's statistics in 128-column chunks, and the
#          engine before the 4-warp GEMV; docs/gpu-runs/2026-12-04-session15/)
# SECTIONS (default "fp8 host sweep"), DEADLINE (default 570 s). Back: $OUT/issue32-sweeps.tgz and $OUT/summary.txt.
# Predictions (session 14, written before any run; results: docs/perf.md, session 15; scripts/kernel_sass.py's
# counts: swap 100 warp-instructions a KB of K/V against the default's 130): swap 2.9-3.3 TB/s where the default reads 2.5-3.0; nano FP8 30.5-32k
# against ~28.9k; fp8-kv PASS near 3.25x (swap's products are qk's). split64: batch 1 -1.5%, batch 4 and 16
# within +-2% of base. normchunk128: batch 1 unchanged (it applies to 2-16 rows), batch 16 -20-50% (3.4 ms a
# step, where ~1 would do; its spill loads drop 1,232 -> 174 in gate/up and 188 -> 62 in q/k/v compiled here).
# gemv8warps: batch 1 +10-13% (0.84 against 0.74).
set -u
cd "$(dirname "$0")/.."
T0=$SECONDS; DEADLINE=${DEADLINE:-570}; SECTIONS=${SECTIONS:-"fp8 host sweep"}
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
S=$OUT/summary.txt; M=${FAKE_MODEL:-/tmp/qwen3-fake}; W=/tmp/issue32; R=$W/runs; L=$W/logs; mkdir -p $R $L
pack() { tar czf $OUT/issue32-sweeps.tgz -C $W --exclude="*.npz" --exclude="*.trace.json*" --exclude="*.jsonl" . 2>/dev/null; }
trap pack EXIT
st() { local t=$1 n=$2; shift 2; local s=$SECONDS left=$((DEADLINE-(SECONDS-T0)))
  if [ $left -lt 15 ]; then echo "skipped (deadline) $n" >> $S; return; fi
  [ "$t" -gt "$left" ] && t=$left
  timeout "$t" "$@" > $L/$n.log 2>&1; echo "rc=$? $((SECONDS-s))s @$((SECONDS-T0)) $n" >> $S; }
tps() { python3 -c "import json;print(round(json.load(open('$1'))['median']['output_throughput']))" 2>/dev/null; }
[ -f $M/config.json ] || st 120 fake python3 -m labkit model fake --preset qwen3-0.6b --out $M
LK="python3 -m labkit"; G="--model $M --device ${DEVICE:-cuda}"
for section in $SECTIONS; do
  case $section in
    fp8)
      st 150 kb-fp8-dot python3 scripts/kernel_bench.py --skip-prefill --kv-cache-dtype fp8 --fp8-dot \
        --out $R/kernel-bench-fp8-dot.json
      grep -i "recommend" $R/kernel-bench-fp8-dot.md >> $S 2>/dev/null
      for r in 1 2; do for d in $([ $r = 1 ] && echo "off swap" || echo "swap off"); do
        LABKIT_FP8_DOT=$d st 100 nano-fp8-$d-r$r $LK bench $G --workload nano --kv-cache-dtype fp8 --repeats 3 \
          --out $R/nano-fp8-$d-r$r.json
        echo "nano fp8 $d r$r: $(tps $R/nano-fp8-$d-r$r.json)" >> $S
      done; done
      LABKIT_FP8_DOT=swap st 200 lc-fp8-swap $LK logits-check run $G --dtype bfloat16 --suite fp8-kv --out $R/lc-fp8-swap
      grep -h -i "VERDICT\|FP8 KV puts" $L/lc-fp8-swap.log 2>/dev/null | head -3 >> $S
      pack ;;
    host)
      if command -v py-spy > /dev/null || [ -x /tmp/site/bin/py-spy ]; then
        PS=$(command -v py-spy || echo /tmp/site/bin/py-spy)
        st 120 host-pyspy $PS record -r 500 --format raw -o $R/batch1-host.txt -- \
          python3 -m labkit bench $G --workload batch1 --out $R/batch1-pyspy.json
      else
        echo "host: no py-spy (carry .whl)" >> $S
      fi
      pack ;;
    sweep)
      left=$((DEADLINE-(SECONDS-T0)-10))
      [ $left -gt 60 ] && OUT=$W/sweep BATCHES="1 4 16" ROUNDS=3 DEADLINE=$left bash scripts/batch1_sweep.sh \
        > $L/sweep.log 2>&1
      cat $W/sweep/summary.md >> $S 2>/dev/null ;;
    *) echo "issue32_sweeps.sh: unknown section $section" >> $S ;;
  esac
done
echo "done @$((SECONDS-T0))" >> $S
