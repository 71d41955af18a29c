#!/usr/bin/env bash
# Session 26's first device call (run from the repository root: bash docs/gpu-runs/2026-12-06-session26/call.sh),
# each variant against the default, three rounds interleaved (scripts/batch1_sweep.sh), ~7-8 minutes:
#   ahead  rows taken one at a time get every row's inputs loaded at once, before the loop
#          (LABKIT_DECODE_ROW_INPUTS=ahead), at batches 2 and 4
#   m2     o_proj merges a 2-row step's split attention parts (LABKIT_DECODE_MERGE_ROWS=2: no merge kernel), batch 2
#   both   ahead and m2, batch 2
# Before the sweeps: the fused decode's, the knobs' and the sampler's tests on the device (the per-row bit-equality
# tests among them, never yet run there). BUDGET (seconds, default 540). DEVICE=cpu FAKE_MODEL=DIR runs the
# plumbing on the CPU. Back: $OUT/call.tgz and $OUT/summary.txt.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
S=$OUT/summary.txt; W=$(mktemp -d ${WORK:-/tmp}/s26.XXXXXX); mkdir -p $W/logs
M=${FAKE_MODEL:-/tmp/qwen3-fake}; D=${DEVICE:-cuda}; BUDGET=${BUDGET:-540}
pack() {
  (cd $W && find . -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) \
     ! -name '*.trace.json' -size -5M -print0 | tar czf $OUT/call.tgz --null -T -)
}
trap pack EXIT
[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader >> $S 2>&1
git log -1 --format="tree of %H" >> $S 2>/dev/null
AHEAD=LABKIT_DECODE_ROW_INPUTS=ahead; M2=LABKIT_DECODE_MERGE_ROWS=2
if [ $D = cuda ]; then
  timeout 180 python3 -m pytest -q -p no:cacheprovider tests/test_fused_decode.py tests/test_decode_knobs.py \
    tests/test_gumbel_sampler.py > $W/logs/tests.log 2>&1
  echo "rc=$? @$SECONDS tests: $(tail -1 $W/logs/tests.log)" >> $S
  grep -E "^(FAILED|ERROR)" $W/logs/tests.log | head -20 >> $S
fi
OUT=$W/sweep2 VARIANTS="base: ahead:$AHEAD m2:$M2 both:$AHEAD,$M2" BATCHES=2 ROUNDS=3 \
  DEADLINE=$(( SECONDS + (BUDGET - SECONDS) * 3 / 5 )) DEVICE=$D FAKE_MODEL=$M bash scripts/batch1_sweep.sh \
  > $W/logs/sweep2.log 2>&1
echo "rc=$? @$SECONDS sweep batch 2" >> $S; cat $W/sweep2/summary.md >> $S 2>/dev/null
OUT=$W/sweep4 VARIANTS="base: ahead:$AHEAD" BATCHES=4 ROUNDS=3 \
  DEADLINE=$(( BUDGET - SECONDS - 10 )) DEVICE=$D FAKE_MODEL=$M bash scripts/batch1_sweep.sh > $W/logs/sweep4.log 2>&1
echo "rc=$? @$SECONDS sweep batch 4" >> $S; cat $W/sweep4/summary.md >> $S 2>/dev/null
echo "done @$SECONDS" >> $S
cat $S
