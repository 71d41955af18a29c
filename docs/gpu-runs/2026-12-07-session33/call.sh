#!/usr/bin/env bash
# Session 33's device call (bash docs/gpu-runs/2026-12-07-session33/call.sh): weight tiles in shared memory in the
# engine (LABKIT_DECODE_SMEM_GEMV=1: engine/kernels/smem_gemv.py at one row) first, as the bar measures it: batch 1
# base against smem interleaved (3 rounds) and the graph logits suite under smem; then the four GEMVs alone
# (scripts/smem_chain.py, session 32's prepared experiment); then gemv_bench's streams and layer chain under each
# kernel (checked against its float32 reference). ~5-8 min; a step that would pass BUDGET is cut short. With little
# device time left (session 34), BUDGET=300 SHARE=3/4 still gives the batch-1 sweep its three rounds.
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-540}
source scripts/call_preamble.sh
sweep batch1 "base: smem:LABKIT_DECODE_SMEM_GEMV=1" "1" 3 ${SHARE:-1/2}
graph_logits LABKIT_DECODE_SMEM_GEMV=1 smem
left() { echo $(( BUDGET - SECONDS > 10 ? BUDGET - SECONDS : 10 )); }
timeout $(( $(left) < 150 ? $(left) : 150 )) python3 scripts/smem_chain.py --out $W/smem.json --rounds 5 \
  > $W/logs/smem.log 2>&1
echo "rc=$? @$SECONDS smem_chain:" >> $S; cat $W/smem.md >> $S 2>/dev/null || tail -5 $W/logs/smem.log >> $S
for k in 1 0; do
  LABKIT_DECODE_SMEM_GEMV=$k timeout $(( $(left) < 100 ? $(left) : 100 )) python3 scripts/gemv_bench.py \
    --out $W/gemv$k.json > $W/logs/gemv$k.log 2>&1
  echo "rc=$? @$SECONDS gemv_bench, LABKIT_DECODE_SMEM_GEMV=$k:" >> $S
  cat $W/gemv$k.md >> $S 2>/dev/null || tail -5 $W/logs/gemv$k.log >> $S
done
echo "done @$SECONDS" >> $S
