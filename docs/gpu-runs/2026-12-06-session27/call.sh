#!/usr/bin/env bash
# Session 27's third device call (run from the repository root: bash docs/gpu-runs/2026-12-06-session27/call.sh):
# the MLP in one launch (LABKIT_DECODE_MLP=one: down's programs wait on counts of gate/up's tiles, not on a kernel
# boundary) against the two launches, three rounds interleaved (scripts/batch1_sweep.sh), ~8-9 minutes:
#   one    LABKIT_DECODE_MLP=one, down's programs of 16 rows (bit-equal to the two launches)
#   one32  LABKIT_DECODE_MLP=one LABKIT_DECODE_MLP_DOWN_ROWS=32 (half the down programs)
# Before the sweeps: the one-launch MLP's and the fused decode's tests on the device (the waits against real
# concurrency: the interpreter runs programs one after another); after them, a profile of batch 1 under `one`
# (kernels a token, the layer's timeline) and the graph logits suite under it. BUDGET (seconds, default 540).
# DEVICE=cpu FAKE_MODEL=DIR runs the plumbing on the CPU. Back: $OUT/call.tgz and $OUT/summary.txt.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
S=$OUT/summary.txt; W=$(mktemp -d ${WORK:-/tmp}/s27.XXXXXX); mkdir -p $W/logs
M=${FAKE_MODEL:-/tmp/qwen3-fake}; D=${DEVICE:-cuda}; BUDGET=${BUDGET:-540}
pack() {
  (cd $W && find . -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) \
     ! -name '*.trace.json' -size -5M -print0 | tar czf $OUT/call.tgz --null -T -)
}
trap pack EXIT
[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader >> $S 2>&1
ONE=LABKIT_DECODE_MLP=one; R32=LABKIT_DECODE_MLP_DOWN_ROWS=32
if [ $D = cuda ]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_mlp_launch.py tests/test_fused_decode.py \
    > $W/logs/tests.log 2>&1
  echo "rc=$? @$SECONDS tests: $(tail -1 $W/logs/tests.log)" >> $S
  grep -E "^(FAILED|ERROR)" $W/logs/tests.log | head -20 >> $S
fi
OUT=$W/sweep1 VARIANTS="base: one:$ONE one32:$ONE,$R32" BATCHES=1 ROUNDS=3 \
  DEADLINE=$(( SECONDS + (BUDGET - SECONDS) * 2 / 5 )) DEVICE=$D FAKE_MODEL=$M bash scripts/batch1_sweep.sh \
  > $W/logs/sweep1.log 2>&1
echo "rc=$? @$SECONDS sweep batch 1" >> $S; cat $W/sweep1/summary.md >> $S 2>/dev/null
OUT=$W/sweep24 VARIANTS="base: one:$ONE one32:$ONE,$R32" BATCHES="2 4" ROUNDS=3 \
  DEADLINE=$(( SECONDS + (BUDGET - SECONDS) * 3 / 5 )) DEVICE=$D FAKE_MODEL=$M bash scripts/batch1_sweep.sh \
  > $W/logs/sweep24.log 2>&1
echo "rc=$? @$SECONDS sweep batches 2, 4" >> $S; cat $W/sweep24/summary.md >> $S 2>/dev/null
sed -e "s/^requests: 1$/requests: 1/" workloads/bench/batch1.yaml > $W/batch1.yaml
env $ONE timeout 100 python3 -m labkit bench --workload $W/batch1.yaml --model $M --device $D --repeats 3 \
  --profile --profile-steps 64 --out $W/profile-b1-one.json > $W/logs/profile-b1-one.log 2>&1
echo "rc=$? @$SECONDS profile batch 1 one: $(grep -m1 -o '[0-9.,]* kernels per token' \
  $W/logs/profile-b1-one.log); $(grep -m1 -o 'one decoder layer.*' $W/profile-b1-one.profile.md 2>/dev/null)" >> $S
if [ $SECONDS -lt $(( BUDGET - 45 )) ]; then
  env $ONE timeout $(( BUDGET - SECONDS )) python3 -m labkit logits-check run --suite graph \
    --attention-backend triton --execution graph --device $D --dtype ${LC_DTYPE:-bfloat16} --model $M \
    --out $W/lc-graph > $W/logs/lc-graph.log 2>&1
  echo "rc=$? @$SECONDS logits-check graph under one: $(grep -m1 -o 'VERDICT: [A-Z]*' $W/logs/lc-graph.log)" >> $S
fi
echo "done @$SECONDS" >> $S
