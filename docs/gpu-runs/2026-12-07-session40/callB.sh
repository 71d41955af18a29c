#!/usr/bin/env bash
# Session 40's second call (~5 min): gate/up's weight stream started under attention again, now that gate/up's
# programs copy their tile into shared memory (session 38) instead of holding it in 255 registers. What blocks
# it at the default is o_proj's Triton programs: 256 of them at 255 registers fill every SM's register file, so
# gate/up's programs start only as o_proj's leave (call D's profile: gate/up starts 0.01 us after o_proj ends).
# One untimed warm-up run a variant (call C's first rounds of a variant were ~1.0 ms against ~0.68), then four
# rounds interleaved at batch 1:
#   base   the default
#   o1     o_proj in shared memory too (LABKIT_DECODE_SMEM_GEMV=1; session 38: 1.001x)
#   o1f    and o_proj letting gate/up launch at its start (LABKIT_DECODE_O_PROJ_PDL=first)
#   opf    o_proj (Triton, registers) letting gate/up launch at its start: the control
#   a1f    every GEMV in shared memory and every kernel letting its successor launch at its start
# The graph logits suite then runs under the fastest variant if it is not base.
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-330}
source scripts/call_preamble.sh
V="base: o1:LABKIT_DECODE_SMEM_GEMV=1 o1f:LABKIT_DECODE_SMEM_GEMV=1,LABKIT_DECODE_O_PROJ_PDL=first"
V="$V opf:LABKIT_DECODE_O_PROJ_PDL=first a1f:LABKIT_DECODE_SMEM_GEMV=1,LABKIT_DECODE_PDL=first"
for v in $V; do
  knobs=${v#*:}
  env ${knobs//,LABKIT/ LABKIT} timeout 100 python3 -m labkit bench --workload batch1 --model $M --device $D \
    --out $W/warmup-${v%%:*}.json > $W/logs/warmup-${v%%:*}.log 2>&1
  echo "rc=$? @$SECONDS warm-up ${v%%:*} (untimed): $(python3 -c "import json,sys;print(round(json.load(open(sys.argv[1]))['median']['decode_ms_per_token'],4))" $W/warmup-${v%%:*}.json 2>/dev/null)" >> $S
done
sweep batch1 "$V" "1" ${ROUNDS:-4} 4/5
logits_under_fastest "$V"
echo "done @$SECONDS" >> $S
