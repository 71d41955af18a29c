#!/usr/bin/env bash
# Session 29's second device call (bash docs/gpu-runs/2026-12-06-session29/call2.sh): whether `plain` (down's tile
# with its warps on rows, LABKIT_DECODE_ROW_LAYOUT=plain) is a win at batch 1: call 1 gave 0.9973x in three rounds,
# inside the rounds' spread. Five rounds interleaved at batch 1, and the layer probe under plain. ~3 minutes.
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-240}
source scripts/call_preamble.sh
PLAIN=LABKIT_DECODE_ROW_LAYOUT=plain
sweep sweep "base: plain:$PLAIN" 1 5 3/4
env $PLAIN timeout 80 python3 scripts/layer_probe.py --model $M --json $W/probe-plain.json > $W/logs/probe-plain.log 2>&1
echo "rc=$? @$SECONDS layer probe (plain):" >> $S; head -16 $W/logs/probe-plain.log >> $S
echo "done @$SECONDS" >> $S
