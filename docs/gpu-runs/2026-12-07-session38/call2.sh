#!/usr/bin/env bash
# Session 38's second call (~2.5 min): the new default (qkv,gate_up,down in shared memory) against the old (down
# alone), three rounds interleaved; then final_evidence_call.sh's batch section at the new default (batch 1, its
# profile: kernels a token; batches 4 and 16); then the fp8-kv logits suite (graph) if the budget allows.
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-200}
source scripts/call_preamble.sh
sweep confirm "base: down:LABKIT_DECODE_SMEM_GEMV=down" "1" 3 1/3
mkdir -p $W/final; OUT=$W/final SECTIONS=batch bash scripts/final_evidence_call.sh; cat $W/final/summary.txt >> $S
[ $SECONDS -lt $(( BUDGET - 70 )) ] && { timeout $(( BUDGET - SECONDS )) python3 -m labkit logits-check run \
  --suite fp8-kv --attention-backend triton --execution graph --device $D --dtype bfloat16 --model $M \
  --out $W/lc-fp8-kv > $W/logs/lc-fp8-kv.log 2>&1
  echo "rc=$? @$SECONDS logits-check fp8-kv: $(grep -m1 -o 'VERDICT: [A-Z]*' $W/logs/lc-fp8-kv.log);\
 $(grep -m1 -o 'worst ratio [0-9.]*x' $W/logs/lc-fp8-kv.log)" >> $S; }
echo "done @$SECONDS" >> $S
