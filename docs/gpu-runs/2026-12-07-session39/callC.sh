#!/usr/bin/env bash
# Session 39's third call (~3.5 min): the batch-1 knobs tuned before session 38's route, measured again at it
# (q/k/v, gate/up and down in shared memory leave attention other SMs and registers than the routes they were
# chosen beside). One untimed warm-up run (call A's first run on a fresh machine was 0.89 ms against 0.68-0.71),
# then four rounds interleaved:
#   base   the default
#   down   LABKIT_DECODE_SMEM_GEMV=down (session 38's parent: call A's three rounds were noise)
#   s8     eight splits of 64-key tiles at short contexts (the default: four of 128)
#   a120   attention's programs one an SM (120 KiB of shared memory each)
#   gs1    the LM head and the draw inside batch 1's graph
# The graph logits suite then runs under the fastest variant if it is not base.
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-300}
source scripts/call_preamble.sh
timeout 100 python3 -m labkit bench --workload batch1 --model $M --device $D --out $W/warmup.json > $W/logs/warmup.log 2>&1
echo "rc=$? @$SECONDS warm-up batch1 (untimed)" >> $S
V="base: down:LABKIT_DECODE_SMEM_GEMV=down s8:LABKIT_DECODE_SHORT_SPLITS=8,LABKIT_DECODE_SPLIT_BLOCK_N=64"
V="$V a120:LABKIT_DECODE_ATTN_SMEM=120 gs1:LABKIT_GRAPH_SAMPLE_BS=1"
sweep batch1 "$V" "1" ${ROUNDS:-4} 4/5
logits_under_fastest "$V"
echo "done @$SECONDS" >> $S
