#!/usr/bin/env bash
# Issue 32's device call for LABKIT_DECODE_K_CHUNK (engine/kernels/decode_layer.py: a tile of 2-16 rows reads its
# weights and inputs K_CHUNK columns at a time after the PDL wait; off by default until this call), on one H200
# with the fake Qwen3-0.6B in bf16, in ~2 minutes (the session's last device time):
#   tests   tests/test_fused_decode.py's GEMV tests on the device (bf16, the K_CHUNK cases among them)
#   sweep   scripts/batch1_sweep.sh: base, kc64 and kc128 at batches 4 and 16, one round
# Back: $OUT/k-chunk.tgz and $OUT/summary.txt.
# Predictions (session 15, before the run): compiled for sm_90 here (local Triton 3.9), the 16-row q/k/v and
# gate/up GEMVs spill (538 and 6,070 spill loads with the norm in 128-column chunks) and spill nothing at K_CHUNK
# 64-256. Batch 16 2.86 ms a step (0.1785 a token) -> 1.2-1.8 ms; batch 4 2.29 -> 1.0-1.6; kc64 and kc128 within
# 5% of each other.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
S=$OUT/summary.txt; W=/tmp/k-chunk; mkdir -p $W/logs
pack() { tar czf $OUT/k-chunk.tgz -C $W . 2>/dev/null; }
trap pack EXIT
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_fused_decode.py -k gemv > $W/logs/tests.log 2>&1
echo "rc=$? @$SECONDS tests" >> $S; tail -2 $W/logs/tests.log >> $S
OUT=$W/sweep VARIANTS="base: kc64:LABKIT_DECODE_K_CHUNK=64 kc128:LABKIT_DECODE_K_CHUNK=128" BATCHES="4 16" ROUNDS=1 \
  bash scripts/batch1_sweep.sh > $W/logs/sweep.log 2>&1
cat $W/sweep/summary.md >> $S 2>/dev/null
echo "done @$SECONDS" >> $S
