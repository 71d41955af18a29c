#!/usr/bin/env bash
# Session 26's first device call (run from the repository root: bash docs/gpu-runs/2026-12-06-session26/call.sh),
# each variant against the default, three rounds interleaved (scripts/batch1_sweep.sh), ~7-8 minutes:
#   ahead  rows taken one at a time get every row's inputs loaded at once, before the loop
#          (LABKIT_DECODE_ROW_INPUTS=ahead), at batches 2 and 4
#   m2     o_proj merges a 2-row step's split attention parts (LABKIT_DECODE_MERGE_ROWS=2: no merge kernel), batch 2
#   both   ahead and m2, batch 2
#   nkf    the attention kernel makes this token's K/V right after q's, before the older keys (LABKIT_DECODE_NEW_KV=first),
#          batch 1
#   mce    o_proj loads the context lengths before its PDL wait (LABKIT_DECODE_MERGE_CTX=early), batch 1
#   b1all  nkf and mce, batch 1; all: ahead, m2, nkf and mce, batch 2
# Before the sweeps: the fused decode's, the knobs' and the sampler's tests on the device (the per-row bit-equality
# tests among them, never yet run there); after them, profiles of batch 1 under b1all and batch 2 under all (kernels
# a token, the layer's timeline) and the graph logits suite under all of them. BUDGET (seconds, default 540).
# DEVICE=cpu FAKE_MODEL=DIR runs the plumbing on the CPU. Back: $OUT/call.tgz and $OUT/summary.txt.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
S=$OUT/summary.txt; W=$(mktemp -d ${WORK:-/tmp}/s26.XXXXXX); mkdir -p $W/logs
M=${FAKE_MODEL:-/tmp/qwen3-fake}; D=${DEVICE:-cuda}; BUDGET=${BUDGET:-540}
pack() {
  (cd $W && find . -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) \
     ! -name '*.trace.json' -size -5M -print0 | tar czf $OUT/call.tgz --null -T -)
}
trap pack EXIT
[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader >> $S 2>&1
git log -1 --format="tree of %H" >> $S 2>/dev/null
AHEAD=LABKIT_DECODE_ROW_INPUTS=ahead; M2=LABKIT_DECODE_MERGE_ROWS=2; NKF=LABKIT_DECODE_NEW_KV=first
MCE=LABKIT_DECODE_MERGE_CTX=early
if [ $D = cuda ]; then
  timeout 180 python3 -m pytest -q -p no:cacheprovider tests/test_fused_decode.py tests/test_decode_knobs.py \
    tests/test_gumbel_sampler.py > $W/logs/tests.log 2>&1
  echo "rc=$? @$SECONDS tests: $(tail -1 $W/logs/tests.log)" >> $S
  grep -E "^(FAILED|ERROR)" $W/logs/tests.log | head -20 >> $S
fi
OUT=$W/sweep1 VARIANTS="base: nkf:$NKF mce:$MCE b1all:$NKF,$MCE" BATCHES=1 ROUNDS=3 DEADLINE=$(( SECONDS + (BUDGET - SECONDS) / 3 )) \
  DEVICE=$D FAKE_MODEL=$M bash scripts/batch1_sweep.sh > $W/logs/sweep1.log 2>&1
echo "rc=$? @$SECONDS sweep batch 1" >> $S; cat $W/sweep1/summary.md >> $S 2>/dev/null
OUT=$W/sweep2 VARIANTS="base: ahead:$AHEAD m2:$M2 all:$AHEAD,$M2,$NKF,$MCE" BATCHES=2 ROUNDS=3 \
  DEADLINE=$(( SECONDS + (BUDGET - SECONDS) / 3 )) DEVICE=$D FAKE_MODEL=$M bash scripts/batch1_sweep.sh \
  > $W/logs/sweep2.log 2>&1
echo "rc=$? @$SECONDS sweep batch 2" >> $S; cat $W/sweep2/summary.md >> $S 2>/dev/null
OUT=$W/sweep4 VARIANTS="base: ahead:$AHEAD" BATCHES=4 ROUNDS=3 DEADLINE=$(( SECONDS + (BUDGET - SECONDS) / 3 )) \
  DEVICE=$D FAKE_MODEL=$M bash scripts/batch1_sweep.sh > $W/logs/sweep4.log 2>&1
echo "rc=$? @$SECONDS sweep batch 4" >> $S; cat $W/sweep4/summary.md >> $S 2>/dev/null
for p in "1 b1all $NKF $MCE" "2 all $AHEAD $M2 $NKF $MCE"; do
  set -- $p; b=$1; name=$2; shift 2
  sed -e "s/^requests: 1$/requests: $b/" -e "s/^  max_num_seqs: 1$/  max_num_seqs: $b/" workloads/bench/batch1.yaml \
    > $W/batch$b.yaml
  env "$@" timeout 100 python3 -m labkit bench --workload $W/batch$b.yaml --model $M --device $D --repeats 3 \
    --profile --profile-steps 64 --out $W/profile-b$b-$name.json > $W/logs/profile-b$b-$name.log 2>&1
  echo "rc=$? @$SECONDS profile batch $b $name: $(grep -m1 -o '[0-9.,]* kernels per token' \
    $W/logs/profile-b$b-$name.log)" >> $S
done
if [ $SECONDS -lt $(( BUDGET - 45 )) ]; then
  env $AHEAD $M2 $NKF $MCE timeout $(( BUDGET - SECONDS )) python3 -m labkit logits-check run --suite graph \
    --attention-backend triton --execution graph --device $D --dtype ${LC_DTYPE:-bfloat16} --model $M \
    --out $W/lc-graph > $W/logs/lc-graph.log 2>&1
  echo "rc=$? @$SECONDS logits-check graph under ahead, m2, nkf, mce: $(grep -m1 -o 'VERDICT: [A-Z]*' \
    $W/logs/lc-graph.log)" >> $S
fi
echo "done @$SECONDS" >> $S
cat $S
