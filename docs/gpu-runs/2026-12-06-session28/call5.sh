#!/usr/bin/env bash
# Session 28's fifth device call (bash docs/gpu-runs/2026-12-06-session28/call5.sh): attention's tile products as
# FMAs, a query head at a time (LABKIT_DECODE_ATTN_TILE=fma), against the tensor-core tile, ~5 minutes:
#   tests   the FMA tile's tests on the device (the unfused step's numbers; the dot tile's unmerged parts)
#   sweep   batches 1 and 4, three rounds interleaved (scripts/batch1_sweep.sh)
#   probe   scripts/layer_probe.py under fma (attention's phases)
#   lc      the graph logits suite under fma (if the budget allows)
# BUDGET (default 330). DEVICE=cpu FAKE_MODEL=DIR: the plumbing on a CPU.
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-330}
source scripts/call_preamble.sh
FMA=LABKIT_DECODE_ATTN_TILE=fma
if [ $D = cuda ]; then
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_fused_decode.py -k "fma" > $W/logs/tests.log 2>&1
  echo "rc=$? @$SECONDS tests: $(tail -1 $W/logs/tests.log)" >> $S
  grep -E "^(FAILED|ERROR)" $W/logs/tests.log | head -20 >> $S
fi
OUT=$W/sweep VARIANTS="base: fma:$FMA" BATCHES="1 4" ROUNDS=3 \
  DEADLINE=$(( SECONDS + (BUDGET - SECONDS) * 1 / 2 )) DEVICE=$D FAKE_MODEL=$M bash scripts/batch1_sweep.sh \
  > $W/logs/sweep.log 2>&1
echo "rc=$? @$SECONDS sweep" >> $S; cat $W/sweep/summary.md >> $S 2>/dev/null
env $FMA timeout 100 python3 scripts/layer_probe.py --model $M --json $W/probe-fma.json > $W/logs/probe-fma.log 2>&1
echo "rc=$? @$SECONDS layer probe under fma:" >> $S; head -16 $W/logs/probe-fma.log >> $S
if [ $SECONDS -lt $(( BUDGET - 50 )) ]; then
  env $FMA timeout $(( BUDGET - SECONDS )) python3 -m labkit logits-check run --suite graph \
    --attention-backend triton --execution graph --device $D --dtype bfloat16 --model $M \
    --out $W/lc-graph > $W/logs/lc-graph.log 2>&1
  echo "rc=$? @$SECONDS logits-check graph under fma: $(grep -m1 -o 'VERDICT: [A-Z]*' $W/logs/lc-graph.log);\
 $(grep -m1 -o 'worst ratio [0-9.]*x' $W/logs/lc-graph.log)" >> $S
fi
echo "done @$SECONDS" >> $S
