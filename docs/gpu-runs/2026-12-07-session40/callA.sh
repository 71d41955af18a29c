#!/usr/bin/env bash
# Session 40's first call (~5-6 min, the serving wheels carried in .whl), at session 39's final engine (one-row
# graphs that draw, LABKIT_GRAPH_SAMPLE_BS=1 by default): final_evidence_call.sh's batch (batch 1, its profile,
# batches 4 and 16), nano (bf16 and FP8 KV, median of 3), hf (Transformers' batch 1, static cache, compiled) and
# serve (FP8 at rate inf, cold and warm; mixed at rates 16 and 32), the serving runs not yet made under the
# drawing graph.
set -u
cd "$(dirname "$0")/../../.."
pip install -q --no-deps --no-index --target /tmp/site .whl/*.whl > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader >> $OUT/summary.txt 2>&1
SECTIONS="${SECTIONS:-batch nano hf serve}" HF_TIMEOUT=${HF_TIMEOUT:-100} bash scripts/final_evidence_call.sh
