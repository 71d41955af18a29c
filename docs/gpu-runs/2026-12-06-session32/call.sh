#!/usr/bin/env bash
# Session 32's first device call (bash docs/gpu-runs/2026-12-06-session32/call.sh): batch 1's four GEMVs a layer
# with their weight tiles copied into shared memory before the PDL wait (scripts/smem_chain.py: Gluon, cp.async),
# against the same arithmetic with the tiles in registers; five rounds interleaved; then gemv_bench (the
# engine's own GEMVs chained, and a device copy's rate). On an H200 also batch 1 at the
# default engine (three rounds): the bar's card, unmeasured since session 19. ~2-4 min.
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-300}
source scripts/call_preamble.sh
timeout 200 python3 scripts/smem_chain.py --out $W/smem.json --rounds 5 > $W/logs/smem.log 2>&1
echo "rc=$? @$SECONDS smem_chain:" >> $S; cat $W/smem.md >> $S 2>/dev/null || tail -5 $W/logs/smem.log >> $S
timeout 120 python3 scripts/gemv_bench.py --out $W/gemv.json > $W/logs/gemv.log 2>&1
echo "rc=$? @$SECONDS gemv_bench (the engine's GEMVs chained, a copy's rate):" >> $S; cat $W/gemv.md >> $S 2>/dev/null
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  sweep batch1 "base:" "1" 3 1
fi
echo "done @$SECONDS" >> $S
