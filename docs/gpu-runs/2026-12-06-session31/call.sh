#!/usr/bin/env bash
# Session 31's first device call (bash docs/gpu-runs/2026-12-06-session31/call.sh): decode attention's programs
# reserving 120 KiB of shared memory each (LABKIT_DECODE_ATTN_SMEM=120), so that an SM takes one of them, not two,
# with q/k/v's programs as they are; the same with the short contexts in 8 splits of 64 keys; attention at 8 warps
# (LABKIT_DECODE_ATTN_WARPS=8). ~5 min:
#   sweep   batches 1 and 4, three rounds interleaved: base, s120, s120x8, a8
#   probe   scripts/layer_probe.py under s120 (attention's SMs: 32 expected, against base's 16-19)
#   lc      the graph logits suite under s120 (if the budget allows)
# BUDGET (default 420). DEVICE=cpu FAKE_MODEL=DIR: the plumbing on a CPU.
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-420}
source scripts/call_preamble.sh
S120=LABKIT_DECODE_ATTN_SMEM=120
X8=$S120,LABKIT_DECODE_SHORT_SPLITS=8,LABKIT_DECODE_SPLIT_BLOCK_N=64
sweep sweep "base: s120:$S120 s120x8:$X8 a8:LABKIT_DECODE_ATTN_WARPS=8" "${BATCHES:-1 4}" 3 2/3
env $S120 timeout 80 python3 scripts/layer_probe.py --model $M --json $W/probe-s120.json > $W/logs/probe-s120.log 2>&1
echo "rc=$? @$SECONDS layer probe (s120):" >> $S; head -16 $W/logs/probe-s120.log >> $S
graph_logits $S120 s120
echo "done @$SECONDS" >> $S
