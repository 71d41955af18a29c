#!/usr/bin/env bash
# Session 30's third device call (bash docs/gpu-runs/2026-12-06-session30/call3.sh): q/k/v's one-row GEMV alone at
# 8 warps (LABKIT_DECODE_QKV_WARPS=8: 64 registers a thread, four programs an SM) against the engine as it is; call
# 2 saw attention run one program an SM and end 2.6 us sooner when q/k/v's programs packed onto fewer SMs. ~5 min:
#   sweep   batches 1 and 4, three rounds interleaved
#   probe   scripts/layer_probe.py under qkv8 (each kernel's phases and SMs)
#   lc      the graph logits suite under qkv8 (if the budget allows)
# BUDGET (default 420). DEVICE=cpu FAKE_MODEL=DIR: the plumbing on a CPU.
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-420}
source scripts/call_preamble.sh
Q8=LABKIT_DECODE_QKV_WARPS=8
sweep sweep "base: qkv8:$Q8" "${BATCHES:-1 4}" 3 2/3
env $Q8 timeout 80 python3 scripts/layer_probe.py --model $M --json $W/probe-qkv8.json > $W/logs/probe-qkv8.log 2>&1
echo "rc=$? @$SECONDS layer probe (qkv8):" >> $S; head -16 $W/logs/probe-qkv8.log >> $S
graph_logits $Q8 qkv8
echo "done @$SECONDS" >> $S
