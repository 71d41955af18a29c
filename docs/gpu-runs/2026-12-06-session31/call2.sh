#!/usr/bin/env bash
# Session 31's second device call (bash docs/gpu-runs/2026-12-06-session31/call2.sh): attention's programs one an SM
# (LABKIT_DECODE_ATTN_SMEM=120) against the engine as it is at every small-batch bucket's size, before it becomes
# the default (call 1 measured batches 1 and 4 only). ~4 min:
#   sweep   batches 1 2 8 16, three rounds interleaved: base, s120
# BUDGET (default 400). DEVICE=cpu FAKE_MODEL=DIR: the plumbing on a CPU.
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-400}
source scripts/call_preamble.sh
sweep sweep "base: s120:LABKIT_DECODE_ATTN_SMEM=120" "${BATCHES:-1 2 8 16}" 3 9/10
echo "done @$SECONDS" >> $S
