#!/usr/bin/env bash
# Session 39's first call (~7 min): session 38's new default (q/k/v, gate/up and down in shared memory) against the
# old (down alone), batch 1, three rounds interleaved; then issue 32's evidence at this commit
# (final_evidence_call.sh's tests, evidence with fp8-kv, batch with its profile: kernels a token).
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-560}
source scripts/call_preamble.sh
sweep confirm "base: down:LABKIT_DECODE_SMEM_GEMV=down" "1" 3 1/6
mkdir -p $W/final
OUT=$W/final SECTIONS="${SECTIONS:-tests evidence batch}" EVIDENCE_TIMEOUT=${EVIDENCE_TIMEOUT:-240} \
  bash scripts/final_evidence_call.sh
cat $W/final/summary.txt >> $S; cp $W/final/call.tgz $OUT/final.tgz 2>/dev/null
echo "done @$SECONDS" >> $S
