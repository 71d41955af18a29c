#!/usr/bin/env bash
# Session 31's fifth device call (bash docs/gpu-runs/2026-12-06-session31/call5.sh): the layer probe at base, under
# opf (LABKIT_DECODE_O_PROJ_PDL=first: gate/up's programs launched under attention) and under s120opf (with
# attention one an SM), on one machine: where gate/up's early programs sit and what they cost o_proj. ~2 min.
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-200}
source scripts/call_preamble.sh
for v in base: opf:LABKIT_DECODE_O_PROJ_PDL=first s120opf:LABKIT_DECODE_ATTN_SMEM=120,LABKIT_DECODE_O_PROJ_PDL=first; do
  name=${v%%:*}; knobs=${v#*:}
  env ${knobs//,/ } timeout 80 python3 scripts/layer_probe.py --model $M --json $W/probe-$name.json \
    > $W/logs/probe-$name.log 2>&1
  echo "rc=$? @$SECONDS layer probe ($name):" >> $S; head -16 $W/logs/probe-$name.log >> $S
done
echo "done @$SECONDS" >> $S
