#!/usr/bin/env bash
# Session 24, issue 32's batch 1: a split context's attention parts merged inside o_proj's GEMV
# (LABKIT_DECODE_MERGE_IN_GEMV=1: no merge kernel between attention and o_proj, so o_proj's weights stream in while
# attention runs) with a short-context graph of more splits (LABKIT_DECODE_SHORT_SPLITS), against the engine as it
# is and against the same split with the merge kernel in the PDL chain, in one device call (~9 minutes):
#   1. the fused decode's and the knobs' tests on the device (both merges against the unfused step)
#   2. one `bench --workload batch1 --profile` under the merge kernel and under the GEMV's merge: the profile's
#      kernel table says whether a merge kernel ran (the knobs took) and the kernels a token
#   3. scripts/batch1_sweep.sh over VARIANTS at batches 1, 4 and 16, three rounds, interleaved
#   4. (if time is left) the graph logits suite under the GEMV's merge
# VARIANTS, PROFILES ("name:KNOB=V,KNOB=V ..."), LC_KNOBS (the logits suite's), BATCHES, ROUNDS, BUDGET (seconds
# the call may take) override the defaults (call 1's). DEVICE=cpu FAKE_MODEL=DIR runs the plumbing on the CPU.
# Back: $OUT/call.tgz and $OUT/summary.txt.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
S=$OUT/summary.txt; W=$(mktemp -d ${WORK:-/tmp}/merge-in-gemv.XXXXXX); mkdir -p $W/logs
M=${FAKE_MODEL:-/tmp/qwen3-fake}; D=${DEVICE:-cuda}
pack() {
  (cd $W && find . -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) \
     ! -name '*.trace.json' -size -5M -print0 | tar czf $OUT/call.tgz --null -T -)
}
trap pack EXIT
[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader >> $S 2>&1
git log -1 --format="tree of %H" >> $S 2>/dev/null
S8K="LABKIT_DECODE_SHORT_SPLITS=8,LABKIT_DECODE_BLOCK_N=64,LABKIT_DECODE_MERGE_PDL=1"
S8M="LABKIT_DECODE_SHORT_SPLITS=8,LABKIT_DECODE_BLOCK_N=64,LABKIT_DECODE_MERGE_IN_GEMV=1"
VARIANTS=${VARIANTS:-"base: s8k:$S8K s8m:$S8M \
s16m:LABKIT_DECODE_SHORT_SPLITS=16,LABKIT_DECODE_BLOCK_N=32,LABKIT_DECODE_MERGE_IN_GEMV=1 \
s4m:LABKIT_DECODE_SHORT_SPLITS=4,LABKIT_DECODE_BLOCK_N=64,LABKIT_DECODE_MERGE_IN_GEMV=1"}

if [ $D = cuda ]; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_fused_decode.py tests/test_decode_knobs.py \
    > $W/logs/tests.log 2>&1
  echo "rc=$? @$SECONDS tests: $(tail -1 $W/logs/tests.log)" >> $S
fi
for v in ${PROFILES:-s8k:$S8K s8m:$S8M}; do
  name=${v%%:*}; knobs=${v#*:}
  env ${knobs//,LABKIT/ LABKIT} timeout 150 python3 -m labkit bench --workload workloads/bench/batch1.yaml --model $M \
    --device $D --repeats 3 --profile --profile-steps 64 --out $W/profile-$name.json > $W/logs/profile-$name.log 2>&1
  echo "rc=$? @$SECONDS profile $name: $(grep -m1 -o '[0-9.,]* kernels per token' $W/logs/profile-$name.log)," \
    "merge kernel launches: $(cat $W/*$name*.profile.md 2>/dev/null | grep -c '^| `_decode_merge_kernel`')" >> $S
done
OUT=$W/sweep VARIANTS="$VARIANTS" BATCHES=${BATCHES:-"1 4 16"} ROUNDS=${ROUNDS:-3} \
  DEADLINE=$(( ${BUDGET:-540} - SECONDS - 60 )) DEVICE=$D FAKE_MODEL=$M bash scripts/batch1_sweep.sh > $W/logs/sweep.log 2>&1
echo "rc=$? @$SECONDS sweep" >> $S; cat $W/sweep/summary.md >> $S 2>/dev/null
if [ $D = cuda ] && [ $SECONDS -lt $(( ${BUDGET:-540} - 70 )) ]; then
  LC=${LC_KNOBS:-$S8M}
  env ${LC//,LABKIT/ LABKIT} timeout $(( ${BUDGET:-540} - SECONDS )) python3 -m labkit logits-check run --suite graph \
    --attention-backend triton --execution graph --device $D --dtype bfloat16 --model $M --out $W/lc-graph-s8m \
    > $W/logs/lc-graph-s8m.log 2>&1
  echo "rc=$? @$SECONDS logits-check graph under $LC: $(grep -m1 -o 'VERDICT: [A-Z]*' $W/logs/lc-graph-s8m.log)" >> $S
fi
echo "done @$SECONDS" >> $S
