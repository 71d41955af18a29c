#!/usr/bin/env bash
# Session 13, device call 3 (one H200, the machine of call 2, made at once after it): the lab plan's end (call 2's
# detached run_lab_plan.py: waited for, then packed with its report), then issue 32's batch-1 attention measured
# against its parents:
#   base      the engine as it is: contexts <= 512 in the one-split graph (one program per KV head walks the
#             whole context), longer ones split, the merge kernel launched plainly
#   split     LABKIT_DECODE_SHORT_CONTEXT=0: the split graph always (32 splits at max_model_len 4096, 128-key tiles)
#   split_pdl the same with the merge kernel in the PDL chain (LABKIT_DECODE_MERGE_PDL=1)
#   split64 / split32: split_pdl with 64- or 32-key tiles (LABKIT_DECODE_BLOCK_N): more programs share a context
# Prediction (written before the run): split_pdl 0.78-0.81 ms a token (base 0.84), split32 0.74-0.78; split
# without PDL no better than base (session 5: split 4.1 + merge 2.7 us a layer against 5.6 for one split).
# Correctness first: the baseline logits suite under graphs with split32's and split64's kernels (merge PDL on).
# Then the FP8 decode kernel's knob sweep at batch 256 (kernel_bench.py --kv-cache-dtype fp8) as time allows.
# Back: $OUT/labs.tgz (the whole lab plan and its report), $OUT/call3.tgz, $OUT/summary.txt.
set -u
T0=$SECONDS; DEADLINE=${DEADLINE:-560}
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
S=$OUT/summary.txt
LW=/tmp/labs
if [ -f $LW/started ]; then
  while [ ! -f $LW/DONE ] && [ $SECONDS -lt 300 ]; do sleep 5; done
  echo "lab plan at call 3's ${SECONDS}s: $(cat $LW/DONE 2>/dev/null || echo 'still running: packed as it is')" >> $S
  # (call 2's archive with the event logs was 38 MB, over what a call returns: without them, in 15 MB parts)
  tar czf $LW/labs.tgz -C $LW --exclude="*.npz" --exclude="*.trace.json*" --exclude="*.perfetto.json*" \
    --exclude="*.jsonl" --exclude="*.jsonl.gz" run_lab_plan.txt runs logs report 2>/dev/null
  split -b 15M -d $LW/labs.tgz $OUT/labs.tgz.part
  tail -8 $LW/run_lab_plan.txt >> $S
  [ -f $LW/DONE ] || { echo "the lab plan is still running: no timing beside it" >> $S; exit 0; }
else
  echo "no lab plan on this machine (a fresh one: call 2's machine went back)" >> $S
fi
M=/tmp/qwen3-fake; W=/tmp/c3; R=$W/runs; L=$W/logs; mkdir -p $R $L
pack() { tar czf $OUT/call3.tgz -C $W --exclude="*.npz" --exclude="*.trace.json*" --exclude="*.jsonl" . 2>/dev/null; }
trap pack EXIT
st() { local t=$1 n=$2; shift 2; local s=$SECONDS left=$((DEADLINE-(SECONDS-T0)))
  if [ $left -lt 15 ]; then echo "skipped (deadline) $n" >> $S; return; fi
  [ "$t" -gt "$left" ] && t=$left
  timeout "$t" "$@" > $L/$n.log 2>&1; echo "rc=$? $((SECONDS-s))s @$((SECONDS-T0)) $n" >> $S; }
[ -f $M/config.json ] || st 120 fake python3 -m labkit model fake --preset qwen3-0.6b --out $M
LK="python3 -m labkit"; G="--model $M --device cuda"
LC="$LK logits-check run $G --dtype bfloat16 --suite baseline --attention triton --execution graph"
LABKIT_DECODE_SHORT_CONTEXT=0 LABKIT_DECODE_MERGE_PDL=1 LABKIT_DECODE_BLOCK_N=32 st 200 lc-split32 $LC --out $R/lc-split32 &
LABKIT_DECODE_SHORT_CONTEXT=0 LABKIT_DECODE_MERGE_PDL=1 LABKIT_DECODE_BLOCK_N=64 st 200 lc-split64 $LC --out $R/lc-split64 &
wait
grep -h "^# \|verdict" $R/lc-split*/*.md 2>/dev/null | head -4 >> $S
pack
b1() { local v=$1 r=$2; shift 2
  env "$@" timeout 100 $LK bench $G --workload batch1 --out $R/b1-$v-r$r.json > $L/b1-$v-r$r.log 2>&1
  echo "rc=$? b1 $v r$r $(python3 -c "import json;print(json.load(open('$R/b1-$v-r$r.json'))['median']['decode_ms_per_token'])" 2>/dev/null)" >> $S; }
order="base split split_pdl split64 split32"
for r in 1 2 3; do
  [ $((DEADLINE-(SECONDS-T0))) -lt 80 ] && { echo "skipped (deadline) b1 round $r" >> $S; break; }
  for v in $order; do
    case $v in
      base) b1 base $r ;;
      split) b1 split $r LABKIT_DECODE_SHORT_CONTEXT=0 LABKIT_DECODE_MERGE_PDL=0 ;;
      split_pdl) b1 split_pdl $r LABKIT_DECODE_SHORT_CONTEXT=0 LABKIT_DECODE_MERGE_PDL=1 ;;
      split64) b1 split64 $r LABKIT_DECODE_SHORT_CONTEXT=0 LABKIT_DECODE_MERGE_PDL=1 LABKIT_DECODE_BLOCK_N=64 ;;
      split32) b1 split32 $r LABKIT_DECODE_SHORT_CONTEXT=0 LABKIT_DECODE_MERGE_PDL=1 LABKIT_DECODE_BLOCK_N=32 ;;
    esac
  done
  order=$(echo $order | tr ' ' '\n' | tac | tr '\n' ' ')
  pack
done
st 120 kb-fp8 python3 scripts/kernel_bench.py --skip-prefill --kv-cache-dtype fp8 --out $R/kernel-bench-fp8.json
grep -i "recommend" $R/kernel-bench-fp8.md >> $S 2>/dev/null
echo "done @$((SECONDS-T0))" >> $S
