#!/usr/bin/env bash
# Session 35's prepared call (bash docs/gpu-runs/2026-12-07-session35/next_call.sh; ~3 min on an H100 or H200):
# gemv_bench --prologue under LABKIT_DECODE_SMEM_GEMV=1 and =0 tells apart what made q/k/v and gate/up 1.4x slower
# in shared memory (their prologue: partials summed, residual, RMSNorm; or their tile's stream), then batch 1 at the
# default (down in shared memory) against knob 0, three rounds interleaved (on an H200 the first figure of it).
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-300}
source scripts/call_preamble.sh
left() { echo $(( BUDGET - SECONDS > 10 ? BUDGET - SECONDS : 10 )); }
for k in 1 0; do
  LABKIT_DECODE_SMEM_GEMV=$k timeout $(( $(left) < 100 ? $(left) : 100 )) python3 scripts/gemv_bench.py --prologue \
    --out $W/gemv$k.json > $W/logs/gemv$k.log 2>&1
  echo "rc=$? @$SECONDS gemv_bench --prologue, LABKIT_DECODE_SMEM_GEMV=$k:" >> $S
  cat $W/gemv$k.md >> $S 2>/dev/null || tail -5 $W/logs/gemv$k.log >> $S
done
sweep batch1 "base: off:LABKIT_DECODE_SMEM_GEMV=0" "1" 3 ${SHARE:-3/4}
echo "done @$SECONDS" >> $S
