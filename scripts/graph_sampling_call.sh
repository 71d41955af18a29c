#!/usr/bin/env bash
# Issue 32's device call for the decode graph that runs the LM head and draws its tokens (LABKIT_GRAPH_SAMPLE_BS,
# engine/graph_dispatch.py; off by default until this call), on one H200 with the fake Qwen3-0.6B in bf16:
#   check   scripts/graph_sampling_check.py at batches 1, 3 (a padded bucket) and 16: the same ids with the knob
#           at 0 and 16, and the number of steps the graph drew
#   logits  the graph logits suite with the knob at 16 (logits-check's teacher forcing reads the graph's logits)
#   sweep   scripts/batch1_sweep.sh: base against gs16 at batches 1, 4 and 16, two interleaved rounds
# Back: $OUT/graph-sampling.tgz and $OUT/summary.txt. DEADLINE (default 400 s) bounds the sweep.
# Predictions (session 15, before the run): batch 1 is host-bound (the fused decode leaves the GPU idle 27% of a
# step: ~0.54 ms busy of 0.742), and py-spy puts ~30-40% of a decode step's host samples in the LM head launch,
# the sampler's two kernels and its upload. gs16: batch 1 0.742 -> 0.60-0.66 ms a token; batch 4 0.573 ->
# 0.50-0.55; batch 16 (GPU-bound, 2.9 ms a step) within 2% of base. check: ids agree at 1 and 16 (same shapes as
# the eager LM head); at 3 the graph's LM head multiplies 4 rows, where cuBLAS may pick another kernel: a rare
# near-tie may flip.
set -u
cd "$(dirname "$0")/.."
T0=$SECONDS; DEADLINE=${DEADLINE:-400}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
S=$OUT/summary.txt; M=${FAKE_MODEL:-/tmp/qwen3-fake}; W=/tmp/graph-sampling; mkdir -p $W/logs
pack() { tar czf $OUT/graph-sampling.tgz -C $W --exclude="*.npz" --exclude="*.jsonl" . 2>/dev/null; }
trap pack EXIT
[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null
timeout 150 python3 scripts/graph_sampling_check.py --model $M --device cuda --sizes 1,3,16 --out $W/check.json \
  > $W/logs/check.log 2>&1
echo "rc=$? @$((SECONDS-T0)) check" >> $S; tail -5 $W/logs/check.log >> $S
LABKIT_GRAPH_SAMPLE_BS=16 timeout 120 python3 -m labkit logits-check run --model $M --device cuda --dtype bfloat16 \
  --suite graph --execution graph --out $W/lc-graph-gs16 > $W/logs/lc-graph.log 2>&1
echo "rc=$? @$((SECONDS-T0)) logits graph gs16" >> $S; grep -h "VERDICT\|suite graph" $W/logs/lc-graph.log | head -3 >> $S
left=$((DEADLINE-(SECONDS-T0)))
OUT=$W/sweep VARIANTS="base: gs16:LABKIT_GRAPH_SAMPLE_BS=16" BATCHES="1 4 16" ROUNDS=${ROUNDS:-2} DEADLINE=$left \
  bash scripts/batch1_sweep.sh > $W/logs/sweep.log 2>&1
cat $W/sweep/summary.md >> $S 2>/dev/null
echo "done @$((SECONDS-T0))" >> $S
