#!/usr/bin/env bash
# Session 38's call (bash docs/gpu-runs/2026-12-07-session38/call.sh; ~4 min on an H100 or H200): the Gluon GEMV's
# prologue made at once (the row's partials and residual loaded together, before the new residual's store) against
# the chunk-by-chunk one it replaces (session 37: q/k/v 1.53x and gate/up 1.41x Triton's as launched).
#   1. gemv_bench --prologue under LABKIT_DECODE_SMEM_GEMV=1, =0 and =qkv,gate_up,down (numbers checked there)
#   2. batch 1: the default (down) against qkv,gate_up,down, gate_up,down and 1, four rounds interleaved
#   3. the graph logits suite and the fused decode's tests under qkv,gate_up,down
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-400}
source scripts/call_preamble.sh
left() { echo $(( BUDGET - SECONDS > 10 ? BUDGET - SECONDS : 10 )); }
for k in ${GEMV_KNOBS:-1 0 qkv,gate_up,down}; do
  LABKIT_DECODE_SMEM_GEMV=$k timeout $(( $(left) < 100 ? $(left) : 100 )) python3 scripts/gemv_bench.py --prologue \
    --out $W/gemv-$k.json > $W/logs/gemv-$k.log 2>&1
  echo "rc=$? @$SECONDS gemv_bench --prologue, LABKIT_DECODE_SMEM_GEMV=$k:" >> $S
  cat $W/gemv-$k.md >> $S 2>/dev/null || tail -5 $W/logs/gemv-$k.log >> $S
done
sweep batch1 "${VARIANTS:-base: norms:LABKIT_DECODE_SMEM_GEMV=qkv,gate_up,down gu:LABKIT_DECODE_SMEM_GEMV=gate_up,down all:LABKIT_DECODE_SMEM_GEMV=1}" \
  "1" ${ROUNDS:-4} ${SHARE:-2/3}
graph_logits LABKIT_DECODE_SMEM_GEMV=qkv,gate_up,down qkv,gate_up,down
LABKIT_DECODE_SMEM_GEMV=qkv,gate_up,down timeout $(( $(left) < 120 ? $(left) : 120 )) python3 -m pytest -q \
  -p no:cacheprovider tests/test_fused_decode.py > $W/logs/tests.log 2>&1
echo "rc=$? @$SECONDS test_fused_decode under qkv,gate_up,down: $(tail -1 $W/logs/tests.log)" >> $S
echo "done @$SECONDS" >> $S
