#!/usr/bin/env bash
# A RECORD of session 17's first device call, as it ran from scripts/issue32_next_call.sh at cffa8b8
# (`DEADLINE=390 bash scripts/issue32_next_call.sh`). Its gemv section measured LABKIT_DECODE_SPLIT=balance and
# LABKIT_DECODE_SILU_ROWS=8, removed after it (slower: docs/perf.md, session 17, call 1); this file no longer runs.
# Issue 32's next device calls (prepared in session 16, not yet run), on one H200 with the fake Qwen3-0.6B in bf16;
# DEVICE=cpu FAKE_MODEL=DIR runs the plumbing on the CPU, as its test does. Run `python scripts/sm90_compile.py
# --triton DIR` (DIR: `pip install --target DIR triton==3.6.0`) here first.
#   sampler  scripts/sampler_bench.py: the Gumbel kernel alone at 1, 16 and 256 rows over chunkings, blocks and
#            warps, each variant checked to draw the default's ids (~1 minute)
#   gemv     scripts/batch1_sweep.sh at batches 1 and 16 (ROUNDS, default 3; DEADLINE 420 s): base, balance
#            (LABKIT_DECODE_SPLIT=balance: down_proj in 6 splits, 384 programs, instead of 3), silu8
#            (LABKIT_DECODE_SILU_ROWS=8: the one-row gate/up GEMV in 384 programs instead of 192) and both
#   nano     `bench --workload nano --repeats 3` with the sampler at 2 (the default) and PER_SM programs an SM
#            (LABKIT_GUMBEL_PER_SM; default 8), in the order 2 X X 2
# SECTIONS (default "sampler gemv": ~7 minutes; "nano" is a call of its own, ~4 minutes); WORK: its folder
# (default: a new one under /tmp). Back: $OUT/call.tgz and $OUT/summary.txt.
# Predictions (session 16, before any run; docs/perf.md, session 16, "PREDICTION"): batch 1 0.744 ms a token ->
# balance 0.72-0.74, silu8 0.70-0.72, both 0.68-0.71 (gate/up's 12 MB and down's 6 MB a layer are spread over
# the SMs at 73%, q/k/v's and o_proj's at 97%); batch 16 within 3% of base for each. The sampler at 256 rows
# ~0.2 ms -> 0.06-0.1 at 8-16 programs an SM; nano +1-2.5% with it.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
S=$OUT/summary.txt; W=${WORK:-$(mktemp -d /tmp/issue32-next.XXXXXX)}; mkdir -p $W/logs
M=${FAKE_MODEL:-/tmp/qwen3-fake}; D=${DEVICE:-cuda}
pack() { tar czf $OUT/call.tgz -C $W . 2>/dev/null; }
trap pack EXIT
[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null
tps() { python3 -c "import json,sys;print(round(json.load(open(sys.argv[1]))['median']['output_throughput']))" "$1" 2>/dev/null; }
for section in ${SECTIONS:-sampler gemv}; do
  case $section in
    sampler)
      timeout 240 python3 scripts/sampler_bench.py ${SAMPLER_ARGS:-} $([ $D = cpu ] && echo --dry-run) \
        --out $W/sampler-bench.json > $W/logs/sampler.log 2>&1
      echo "rc=$? @$SECONDS sampler bench" >> $S; cat $W/logs/sampler.log >> $S ;;
    gemv)
      OUT=$W/sweep BATCHES=${BATCHES:-"1 16"} ROUNDS=${ROUNDS:-3} DEADLINE=${DEADLINE:-420} DEVICE=$D FAKE_MODEL=$M \
        VARIANTS="base: balance:LABKIT_DECODE_SPLIT=balance silu8:LABKIT_DECODE_SILU_ROWS=8 \
both:LABKIT_DECODE_SPLIT=balance,LABKIT_DECODE_SILU_ROWS=8" bash scripts/batch1_sweep.sh > $W/logs/sweep.log 2>&1
      cat $W/sweep/summary.md >> $S 2>/dev/null ;;
    nano)
      x=${PER_SM:-8}
      for r in 1 2; do for p in $([ $r = 1 ] && echo "2 $x" || echo "$x 2"); do
        LABKIT_GUMBEL_PER_SM=$p timeout 200 python3 -m labkit bench --model $M --device $D \
          ${NANO_BENCH:---workload nano --repeats 3} --out $W/nano-sm$p-r$r.json > $W/logs/nano-sm$p-r$r.log 2>&1
        echo "rc=$? @$SECONDS nano, sampler at $p programs an SM, round $r: $(tps $W/nano-sm$p-r$r.json) tok/s" >> $S
      done; done ;;
    *) echo "issue32_next_call.sh: unknown section $section" >> $S ;;
  esac
done
echo "done @$SECONDS" >> $S
