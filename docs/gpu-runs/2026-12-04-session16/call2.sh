#!/usr/bin/env bash
# A RECORD of session 16's second device call, as it ran from scripts/merge_inline_call.sh at 648c947
# (`bash scripts/merge_inline_call.sh`). LABKIT_DECODE_MERGE_INLINE, which it measured, was removed after it (slower:
# docs/perf.md, session 16, call 2), and this file no longer runs from here.
# Issue 32's second device call of session 16, on one H200 with the fake Qwen3-0.6B in bf16 (~6 minutes;
# DEVICE=cpu FAKE_MODEL=DIR runs it on the CPU, as its test does):
#   tests   the fused decode's tests on the device (GEMVs, the inline merge among several real programs, a whole
#           step against the unfused one) and the Gumbel sampler's
#   sweep   scripts/batch1_sweep.sh at batches 1 and 16 (ROUNDS, default 2; DEADLINE 330 s): base (a short
#           context reads in one program per KV head), inline64 and inline128 (every context split over up to
#           num_splits_for's programs, 64- or 128-key tiles, the parts merged inside the attention kernel by the
#           last program of each KV head: LABKIT_DECODE_MERGE_INLINE=1)
#   long    the same at contexts of 2,048-2,305 tokens (batch1.yaml with 2,048 prompt tokens; BATCHES, ROUNDS 2),
#           where every step already splits and merges: base (the merge launch) against inline (the kernel's own)
#   nano    `bench --workload nano --repeats 3`, bf16 then FP8 KV (the engine's defaults: K in 128-column chunks
#           at 2-16 rows since call 1)
# SECTIONS (default "tests sweep long nano"); WORK: its folder (default: a new one under /tmp). Back: $OUT/call.tgz
# and $OUT/summary.txt.
# Predictions (session 16, before the run): batch 1 0.742 ms a token -> inline64 0.70-0.72 (session 15's split64,
# the same split with a merge launch in the PDL chain, took 0.7304: the launch's boundary is what inline removes),
# inline128 0.71-0.74; batch 16 within 2% of base (0.1574). long: inline 2-5% under base at batch 1 (one kernel
# boundary of ~27 us a layer), within 1% at 16. nano bf16 26.2k -> 26.3-26.8k (its few-row last steps
# no longer spill); FP8 29.2k -> 29.3-29.8k.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
S=$OUT/summary.txt; W=${WORK:-$(mktemp -d /tmp/merge-inline.XXXXXX)}; mkdir -p $W/logs; M=${FAKE_MODEL:-/tmp/qwen3-fake}
pack() { tar czf $OUT/call.tgz -C $W . 2>/dev/null; }
trap pack EXIT
[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null
tps() { python3 -c "import json,sys;print(round(json.load(open(sys.argv[1]))['median']['output_throughput']))" "$1" 2>/dev/null; }
for section in ${SECTIONS:-tests sweep long nano}; do
  case $section in
    tests)
      timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_fused_decode.py tests/test_gumbel_sampler.py \
        > $W/logs/tests.log 2>&1
      echo "rc=$? @$SECONDS tests" >> $S; tail -2 $W/logs/tests.log >> $S ;;
    sweep)
      OUT=$W/sweep BATCHES=${BATCHES:-"1 16"} ROUNDS=${ROUNDS:-2} DEADLINE=${DEADLINE:-330} VARIANTS="base: \
inline64:LABKIT_DECODE_SHORT_CONTEXT=0,LABKIT_DECODE_MERGE_INLINE=1,LABKIT_DECODE_BLOCK_N=64 \
inline128:LABKIT_DECODE_SHORT_CONTEXT=0,LABKIT_DECODE_MERGE_INLINE=1" bash scripts/batch1_sweep.sh > $W/logs/sweep.log 2>&1
      cat $W/sweep/summary.md >> $S 2>/dev/null ;;
    long)
      sed -e "s/^prompt_len: 128$/prompt_len: ${LONG_PROMPT:-2048}/" workloads/bench/batch1.yaml > $W/long.yaml
      OUT=$W/long WORKLOAD=$W/long.yaml BATCHES=${BATCHES:-"1 16"} ROUNDS=${LONG_ROUNDS:-2} DEADLINE=${DEADLINE:-330} \
        VARIANTS="base: inline:LABKIT_DECODE_MERGE_INLINE=1" bash scripts/batch1_sweep.sh > $W/logs/long.log 2>&1
      echo "long contexts:" >> $S; cat $W/long/summary.md >> $S 2>/dev/null ;;
    nano)
      for kv in auto fp8; do
        timeout 200 python3 -m labkit bench --model $M --device ${DEVICE:-cuda} ${NANO_BENCH:---workload nano --repeats 3} \
          --kv-cache-dtype $kv --out $W/nano-$kv.json > $W/logs/nano-$kv.log 2>&1
        echo "rc=$? @$SECONDS nano kv $kv: $(tps $W/nano-$kv.json)" >> $S
      done ;;
    *) echo "merge_inline_call.sh: unknown section $section" >> $S ;;
  esac
done
echo "done @$SECONDS" >> $S
