#!/usr/bin/env bash
# Session 30's second device call (bash docs/gpu-runs/2026-12-06-session30/call2.sh): the engine's one-row GEMVs at
# 8 warps (LABKIT_DECODE_GEMV=16,8,8: 64-108 registers a thread against 55-254 at 4 warps, so the next kernel's
# programs fit beside them under PDL) and gate/up kept at 4 (w8g4), with session 29's `plain` row layout, against
# the engine as it is; ~6 minutes:
#   sweep   batches 1 and 4, three rounds interleaved
#   probe   scripts/layer_probe.py at base and under w8 (each kernel's phases)
#   lc      the graph logits suite under w8 (if the budget allows)
# BUDGET (default 480). DEVICE=cpu FAKE_MODEL=DIR: the plumbing on a CPU.
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-480}
source scripts/call_preamble.sh
W8=LABKIT_DECODE_GEMV=16,8,8
sweep sweep "base: w8:$W8 w8g4:$W8,LABKIT_DECODE_GATE_UP_WARPS=4 plain:LABKIT_DECODE_ROW_LAYOUT=plain" "1 4" 3 2/3
for v in base w8; do
  env $([ $v = w8 ] && echo $W8) timeout 80 python3 scripts/layer_probe.py --model $M --json $W/probe-$v.json \
    > $W/logs/probe-$v.log 2>&1
  echo "rc=$? @$SECONDS layer probe ($v):" >> $S; head -16 $W/logs/probe-$v.log >> $S
done
graph_logits $W8 w8
echo "done @$SECONDS" >> $S
