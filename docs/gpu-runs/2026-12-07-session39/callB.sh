#!/usr/bin/env bash
# Session 39's second call (~6 min, the serving wheels carried in .whl): final_evidence_call.sh's nano (bf16 and
# FP8 KV, median of 3), hf (Transformers' batch 1, static cache, compiled: the reference) and serve (FP8 at rate
# inf, cold and warm, against the offline median; mixed at rates 16 and 32: ITL p99 over tpot median).
set -u
cd "$(dirname "$0")/../../.."
pip install -q --no-deps --no-index --target /tmp/site .whl/*.whl > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader >> $OUT/summary.txt 2>&1
SECTIONS="${SECTIONS:-nano hf serve}" HF_TIMEOUT=${HF_TIMEOUT:-100} bash scripts/final_evidence_call.sh
