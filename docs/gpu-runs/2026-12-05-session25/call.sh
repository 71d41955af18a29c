#!/usr/bin/env bash
# Session 25's device call (run from the repository root: bash docs/gpu-runs/2026-12-05-session25/call.sh), each
# variant against the default, three rounds interleaved (scripts/batch1_sweep.sh), ~9 minutes:
#   gu8   gate/up's one-row GEMV at 8 warps (108 registers against 255: one program fits beside two of o_proj's)
#   opf   gate/up launched under attention (o_proj's PDL point at its start)
#   pfo   the attention kernel asks the L2 for its layer's o_proj and gate/up weights (LABKIT_DECODE_L2_PREFETCH)
#   pfd   ... and down's
#   fma4  2-4 rows one at a time through the one-row arithmetic (LABKIT_DECODE_FMA_ROWS=4), at batches 2 and 4
# Before the sweeps: the fused decode's and the knobs' tests on the device, and one profiled batch-1 run under pfd
# (kernels a token, the layer's timeline); after them, if time is left, the graph logits suite under gu8, pfd and
# fma4 together. BUDGET (seconds, default 560). DEVICE=cpu FAKE_MODEL=DIR runs the plumbing on the CPU.
# Back: $OUT/call.tgz and $OUT/summary.txt.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
S=$OUT/summary.txt; W=$(mktemp -d ${WORK:-/tmp}/s25.XXXXXX); mkdir -p $W/logs
M=${FAKE_MODEL:-/tmp/qwen3-fake}; D=${DEVICE:-cuda}; BUDGET=${BUDGET:-560}
pack() {
  (cd $W && find . -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) \
     ! -name '*.trace.json' -size -5M -print0 | tar czf $OUT/call.tgz --null -T -)
}
trap pack EXIT
[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader >> $S 2>&1
git log -1 --format="tree of %H" >> $S 2>/dev/null
GU8=LABKIT_DECODE_GATE_UP_WARPS=8; OPF=LABKIT_DECODE_O_PROJ_PDL=first; PF=LABKIT_DECODE_L2_PREFETCH
FMA4=LABKIT_DECODE_FMA_ROWS=4
if [ $D = cuda ]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_fused_decode.py tests/test_decode_knobs.py \
    > $W/logs/tests.log 2>&1
  echo "rc=$? @$SECONDS tests: $(tail -1 $W/logs/tests.log)" >> $S
fi
env $PF=o+gu+down timeout 150 python3 -m labkit bench --workload workloads/bench/batch1.yaml --model $M --device $D \
  --repeats 3 --profile --profile-steps 64 --out $W/profile-pfd.json > $W/logs/profile-pfd.log 2>&1
echo "rc=$? @$SECONDS profile pfd: $(grep -m1 -o '[0-9.,]* kernels per token' $W/logs/profile-pfd.log)" >> $S
OUT=$W/sweep1 VARIANTS="base: gu8:$GU8 pfo:$PF=o+gu pfd:$PF=o+gu+down opf:$OPF" BATCHES=1 ROUNDS=3 \
  DEADLINE=$(( BUDGET / 2 )) DEVICE=$D FAKE_MODEL=$M bash scripts/batch1_sweep.sh > $W/logs/sweep1.log 2>&1
echo "rc=$? @$SECONDS sweep 1" >> $S; cat $W/sweep1/summary.md >> $S 2>/dev/null
OUT=$W/sweep2 VARIANTS="base: fma4:$FMA4 pfd:$PF=o+gu+down" BATCHES="2 4" ROUNDS=3 \
  DEADLINE=$(( BUDGET - SECONDS - 70 )) DEVICE=$D FAKE_MODEL=$M bash scripts/batch1_sweep.sh > $W/logs/sweep2.log 2>&1
echo "rc=$? @$SECONDS sweep 2" >> $S; cat $W/sweep2/summary.md >> $S 2>/dev/null
if [ $D = cuda ] && [ $SECONDS -lt $(( BUDGET - 60 )) ]; then
  env $GU8 $PF=o+gu+down $FMA4 timeout $(( BUDGET - SECONDS )) python3 -m labkit logits-check run --suite graph \
    --attention-backend triton --execution graph --device $D --dtype bfloat16 --model $M --out $W/lc-graph \
    > $W/logs/lc-graph.log 2>&1
  echo "rc=$? @$SECONDS logits-check graph under gu8, pfd, fma4: $(grep -m1 -o 'VERDICT: [A-Z]*' $W/logs/lc-graph.log)" >> $S
fi
echo "done @$SECONDS" >> $S
cat $S
