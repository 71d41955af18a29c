#!/usr/bin/env bash
# Session 28's second device call (bash docs/gpu-runs/2026-12-06-session28/call2.sh): call 1's side-stream L2
# prefetch lost (1.07-1.10x at batch 1): the profile showed attention 2.9 us longer a layer (the prefetch took the
# DRAM at ~4 TB/s while attention read its KV) and the GEMVs only 0.3-0.6 us shorter each. Here the prefetch is
# slowed (fewer programs) or forked after attention's launch (LABKIT_DECODE_L2_SIDE_AT=attention), three rounds
# interleaved at batch 1, ~5 minutes:
#   sguq     call 1's (gate/up, next q/k/v; 32 programs, forked after q/k/v): the anchor
#   sguq8    the same from 8 programs
#   sguq8a   8 programs, forked after attention
#   sgudq16a gate/up, down, next q/k/v from 16 programs, forked after attention
# Then a profile of batch 1 under sguq8a. BUDGET (default 420). DEVICE=cpu FAKE_MODEL=DIR: the plumbing on a CPU.
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-420}
source scripts/call_preamble.sh
if [ $D = cuda ]; then
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_l2_prefetch.py > $W/logs/tests.log 2>&1
  echo "rc=$? @$SECONDS tests: $(tail -1 $W/logs/tests.log)" >> $S
  grep -E "^(FAILED|ERROR)" $W/logs/tests.log | head -20 >> $S
fi
GUQ=LABKIT_DECODE_L2_SIDE=gu+qkv; P8=LABKIT_DECODE_L2_SIDE_PROGRAMS=8; AT=LABKIT_DECODE_L2_SIDE_AT=attention
OUT=$W/sweep1 VARIANTS="base: sguq:$GUQ sguq8:$GUQ,$P8 sguq8a:$GUQ,$P8,$AT \
sgudq16a:LABKIT_DECODE_L2_SIDE=gu+down+qkv,LABKIT_DECODE_L2_SIDE_PROGRAMS=16,$AT" BATCHES=1 ROUNDS=3 \
  DEADLINE=$(( SECONDS + (BUDGET - SECONDS) * 3 / 4 )) DEVICE=$D FAKE_MODEL=$M bash scripts/batch1_sweep.sh \
  > $W/logs/sweep1.log 2>&1
echo "rc=$? @$SECONDS sweep batch 1" >> $S; cat $W/sweep1/summary.md >> $S 2>/dev/null
env $GUQ $P8 $AT timeout 100 python3 -m labkit bench --workload workloads/bench/batch1.yaml --model $M \
  --device $D --repeats 3 --profile --profile-steps 64 --out $W/profile-b1-sguq8a.json \
  > $W/logs/profile-b1-sguq8a.log 2>&1
echo "rc=$? @$SECONDS profile batch 1 sguq8a: $(grep -m1 -o '[0-9.,]* kernels per token' \
  $W/logs/profile-b1-sguq8a.log); $(grep -m1 -o 'one decoder layer.*' $W/profile-b1-sguq8a.profile.md 2>/dev/null)" >> $S
grep -A10 "^## One decoder layer in time" $W/profile-b1-sguq8a.profile.md >> $S 2>/dev/null
echo "done @$SECONDS" >> $S
