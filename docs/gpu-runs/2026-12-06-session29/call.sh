#!/usr/bin/env bash
# Session 29's first device call (bash docs/gpu-runs/2026-12-06-session29/call.sh): one row's GEMV tile with its
# warps on whole rows (LABKIT_DECODE_ROW_LAYOUT=rows; plain: only the GEMVs without a norm) against the tile as
# Triton lays it out (k, the default), ~6 minutes:
#   tests   the rows layout's tests and the fused step's on the device (the real compiler's layouts)
#   sweep   batches 1 and 4 (a control: the layout is one row's), three rounds interleaved
#   probe   scripts/layer_probe.py at base and under rows (each kernel's phases)
#   lc      the graph logits suite under rows (if the budget allows)
# BUDGET (default 420). DEVICE=cpu FAKE_MODEL=DIR: the plumbing on a CPU.
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-420}
source scripts/call_preamble.sh
ROWS=LABKIT_DECODE_ROW_LAYOUT=rows; PLAIN=LABKIT_DECODE_ROW_LAYOUT=plain
if [ $D = cuda ]; then
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_row_layout.py tests/test_fused_decode.py \
    -k "row or one_row or matches_the_unfused" > $W/logs/tests.log 2>&1
  echo "rc=$? @$SECONDS tests: $(tail -1 $W/logs/tests.log)" >> $S
  grep -E "^(FAILED|ERROR)" $W/logs/tests.log | head -20 >> $S
fi
OUT=$W/sweep VARIANTS="base: rows:$ROWS plain:$PLAIN" BATCHES="1 4" ROUNDS=3 \
  DEADLINE=$(( SECONDS + (BUDGET - SECONDS) * 1 / 2 )) DEVICE=$D FAKE_MODEL=$M bash scripts/batch1_sweep.sh \
  > $W/logs/sweep.log 2>&1
echo "rc=$? @$SECONDS sweep" >> $S; cat $W/sweep/summary.md >> $S 2>/dev/null
for v in base rows; do
  env $([ $v = rows ] && echo $ROWS) timeout 80 python3 scripts/layer_probe.py --model $M --json $W/probe-$v.json \
    > $W/logs/probe-$v.log 2>&1
  echo "rc=$? @$SECONDS layer probe ($v):" >> $S; head -16 $W/logs/probe-$v.log >> $S
done
if [ $SECONDS -lt $(( BUDGET - 50 )) ]; then
  env $ROWS timeout $(( BUDGET - SECONDS )) python3 -m labkit logits-check run --suite graph \
    --attention-backend triton --execution graph --device $D --dtype bfloat16 --model $M \
    --out $W/lc-graph > $W/logs/lc-graph.log 2>&1
  echo "rc=$? @$SECONDS logits-check graph under rows: $(grep -m1 -o 'VERDICT: [A-Z]*' $W/logs/lc-graph.log);\
 $(grep -m1 -o 'worst ratio [0-9.]*x' $W/logs/lc-graph.log)" >> $S
fi
echo "done @$SECONDS" >> $S
