#!/usr/bin/env bash
# Session 28's first device call (run from the repository root: bash docs/gpu-runs/2026-12-06-session28/call.sh):
# the layer's later weights asked of the L2 by a kernel on a side stream of the decode graph, forked after each
# layer's q/k/v projection (LABKIT_DECODE_L2_SIDE, engine/kernels/l2_prefetch.py), against the engine as it is,
# three rounds interleaved (scripts/batch1_sweep.sh), ~8-9 minutes:
#   sgu    gate/up (12.6 MB a layer)
#   sguq   gate/up, then the next layer's q/k/v (20.6 MB)
#   sall   o_proj, gate/up, down, the next q/k/v (31.5 MB)
#   sguq64 sguq from 64 programs (32 by default)
# Before the sweeps: the prefetch's and the fused decode's tests on the device (the same numbers eager and in a
# graph); after them, a profile of batch 1 under sguq (kernels a token, the layer's timeline) and the graph logits
# suite under it. BUDGET (seconds, default 540). DEVICE=cpu FAKE_MODEL=DIR runs the plumbing on the CPU.
# Back: $OUT/call.tgz and $OUT/summary.txt.
set -u
cd "$(dirname "$0")/../../.."
source scripts/call_preamble.sh
GUQ=LABKIT_DECODE_L2_SIDE=gu+qkv
if [ $D = cuda ]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_l2_prefetch.py tests/test_fused_decode.py \
    > $W/logs/tests.log 2>&1
  echo "rc=$? @$SECONDS tests: $(tail -1 $W/logs/tests.log)" >> $S
  grep -E "^(FAILED|ERROR)" $W/logs/tests.log | head -20 >> $S
fi
OUT=$W/sweep1 VARIANTS="base: sgu:LABKIT_DECODE_L2_SIDE=gu sguq:$GUQ sall:LABKIT_DECODE_L2_SIDE=o+gu+down+qkv \
sguq64:$GUQ,LABKIT_DECODE_L2_SIDE_PROGRAMS=64" BATCHES=1 ROUNDS=3 \
  DEADLINE=$(( SECONDS + (BUDGET - SECONDS) * 9 / 20 )) DEVICE=$D FAKE_MODEL=$M bash scripts/batch1_sweep.sh \
  > $W/logs/sweep1.log 2>&1
echo "rc=$? @$SECONDS sweep batch 1" >> $S; cat $W/sweep1/summary.md >> $S 2>/dev/null
OUT=$W/sweep4 VARIANTS="base: sguq:$GUQ sall:LABKIT_DECODE_L2_SIDE=o+gu+down+qkv" BATCHES=4 ROUNDS=3 \
  DEADLINE=$(( SECONDS + (BUDGET - SECONDS) * 2 / 5 )) DEVICE=$D FAKE_MODEL=$M bash scripts/batch1_sweep.sh \
  > $W/logs/sweep4.log 2>&1
echo "rc=$? @$SECONDS sweep batch 4" >> $S; cat $W/sweep4/summary.md >> $S 2>/dev/null
env $GUQ timeout 100 python3 -m labkit bench --workload workloads/bench/batch1.yaml --model $M --device $D \
  --repeats 3 --profile --profile-steps 64 --out $W/profile-b1-sguq.json > $W/logs/profile-b1-sguq.log 2>&1
echo "rc=$? @$SECONDS profile batch 1 sguq: $(grep -m1 -o '[0-9.,]* kernels per token' \
  $W/logs/profile-b1-sguq.log); $(grep -m1 -o 'one decoder layer.*' $W/profile-b1-sguq.profile.md 2>/dev/null)" >> $S
if [ $SECONDS -lt $(( BUDGET - 45 )) ]; then
  env $GUQ timeout $(( BUDGET - SECONDS )) python3 -m labkit logits-check run --suite graph \
    --attention-backend triton --execution graph --device $D --dtype ${LC_DTYPE:-bfloat16} --model $M \
    --out $W/lc-graph > $W/logs/lc-graph.log 2>&1
  echo "rc=$? @$SECONDS logits-check graph under sguq: $(grep -m1 -o 'VERDICT: [A-Z]*' $W/logs/lc-graph.log)" >> $S
fi
echo "done @$SECONDS" >> $S
