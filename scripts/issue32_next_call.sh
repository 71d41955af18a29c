#!/usr/bin/env bash
# Issue 32's sampler experiments (sessions 16-17) on one H200 with the fake Qwen3-0.6B in bf16; DEVICE=cpu
# FAKE_MODEL=DIR runs the plumbing on the CPU, as its test does. Run `python scripts/sm90_compile.py --triton DIR`
# (DIR: `pip install --target DIR triton==3.6.0`) here first.
#   sampler  scripts/sampler_bench.py: the Gumbel kernel alone at 1, 16 and 256 rows over chunkings, blocks and
#            warps, each variant checked to draw the default's ids (~1 minute)
#   nano     `bench --workload nano --repeats 3` with the sampler at 2 and PER_SM programs an SM
#            (LABKIT_GUMBEL_PER_SM; default 8), in the order 2 X X 2 (~4 minutes)
#   noise    the Gumbel kernel's uniforms from a keyed 32-bit hash and two hardware log2s (LABKIT_GUMBEL_NOISE=hash)
#            against Philox and tl.log: its tests on the device (the draws equal a float64 reference's),
#            sampler_bench.py over both noises, then nano bf16 (3 repeats) with philox at 2 programs an SM and hash
#            at PER_SM (default 8), in the order A B B A (~3 minutes)
#   vt       V keys-contiguous in an FP8 pool (LABKIT_FP8_V_TRANSPOSED=1, session 18): both layouts as this
#            machine's Triton compiles them, the layout's tests on the device, kernel_bench --fp8-layouts (the
#            decode kernel alone, the default layout timed first and last; with the programs of the longest
#            contexts launched first too), the same order over the bf16 pool (~5 minutes)
#   vt-nano  nano FP8 (3 repeats) with the layout off and on in the order 0 1 1 0, then the fp8-kv logits suite
#            (graph) with it on (~5.5 minutes; a call of its own: vt and vt-nano together pass 600 s)
#   order    nano with the decode kernel's rows launched longest first (LABKIT_DECODE_ORDER, session 19): FP8 (3
#            repeats) in the order launch, longest-first, longest-first, launch, then bf16 launch, longest-first
#            (~5 minutes)
#   ncu      Nsight Compute over one nano-mix decode launch: bf16, FP8, FP8 with V keys-contiguous (occupancy,
#            DRAM throughput, warp stalls; ~1 minute; a machine whose ncu cannot read counters says so)
#   gemv     batch 1's weight stream kernel by kernel (scripts/gemv_bench.py, session 20): each fused GEMV alone
#            over the 28 layers' weights, the four chained, rows x warps x PDL around the default, a device copy's
#            bandwidth, the layer's chain under each PDL mode; then `bench --workload batch1` on the same machine
#            for the whole token with the kernels letting their successors launch after their wait (early, the
#            default) and at their start (first, session 21), in the order PDL_MODES (default "early first first
#            early"; ~5 minutes)
# SECTIONS (default "sampler noise"); WORK: where it makes a new folder (default /tmp). Back: $OUT/call.tgz and
# $OUT/summary.txt. Session 17 ran "sampler" plus a GEMV section since removed with its knobs (call 1: the record
# is docs/gpu-runs/2026-12-04-session17/call1.sh), then "noise" (call 2), whose hash noise at 8 programs an SM
# became the default (docs/perf.md, session 17).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
S=$OUT/summary.txt; mkdir -p ${WORK:-/tmp}; W=$(mktemp -d ${WORK:-/tmp}/issue32-next.XXXXXX); mkdir -p $W/logs
M=${FAKE_MODEL:-/tmp/qwen3-fake}; D=${DEVICE:-cuda}
# (logs, JSON and Markdown: a logits suite's arrays put session 19's archive past what a call brings back)
pack() {
  (cd $W && find . -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -5M -print0 \
     | tar czf $OUT/call.tgz --null -T -)
}
trap pack EXIT
[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null
tps() { python3 -c "import json,sys;print(round(json.load(open(sys.argv[1]))['median']['output_throughput']))" "$1" 2>/dev/null; }
for section in ${SECTIONS:-sampler noise}; do
  case $section in
    sampler)
      timeout 240 python3 scripts/sampler_bench.py ${SAMPLER_ARGS:-} $([ $D = cpu ] && echo --dry-run) \
        --out $W/sampler-bench.json > $W/logs/sampler.log 2>&1
      echo "rc=$? @$SECONDS sampler bench" >> $S; cat $W/logs/sampler.log >> $S ;;
    nano)
      x=${PER_SM:-8}
      for r in 1 2; do for p in $([ $r = 1 ] && echo "2 $x" || echo "$x 2"); do
        LABKIT_GUMBEL_PER_SM=$p timeout 200 python3 -m labkit bench --model $M --device $D \
          ${NANO_BENCH:---workload nano --repeats 3} --out $W/nano-sm$p-r$r.json > $W/logs/nano-sm$p-r$r.log 2>&1
        echo "rc=$? @$SECONDS nano, sampler at $p programs an SM, round $r: $(tps $W/nano-sm$p-r$r.json) tok/s" >> $S
      done; done ;;
    noise)
      timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gumbel_sampler.py > $W/logs/gumbel-tests.log 2>&1
      echo "rc=$? @$SECONDS gumbel tests: $(tail -1 $W/logs/gumbel-tests.log)" >> $S
      timeout 240 python3 scripts/sampler_bench.py --noises philox hash ${SAMPLER_ARGS:-} $([ $D = cpu ] && echo --dry-run) \
        --out $W/sampler-noise.json > $W/logs/sampler-noise.log 2>&1
      echo "rc=$? @$SECONDS sampler bench, both noises" >> $S; cat $W/logs/sampler-noise.log >> $S
      x=${PER_SM:-8}
      for v in philox,2 hash,$x hash,$x philox,2; do
        n=${v%,*}; p=${v#*,}; r=$([ -f $W/nano-$n-sm$p-r1.json ] && echo 2 || echo 1)
        LABKIT_GUMBEL_NOISE=$n LABKIT_GUMBEL_PER_SM=$p timeout 200 python3 -m labkit bench --model $M --device $D \
          ${NANO_BENCH:---workload nano --repeats 3} --out $W/nano-$n-sm$p-r$r.json > $W/logs/nano-$n-sm$p-r$r.log 2>&1
        echo "rc=$? @$SECONDS nano, $n noise at $p programs an SM, round $r: $(tps $W/nano-$n-sm$p-r$r.json) tok/s" >> $S
      done ;;
    vt)  # (the kernels; vt-nano: the engine)
      # the device's own Triton: registers a thread and programs an SM of both layouts, as compiled there
      timeout 200 python3 scripts/kernel_sass.py --variants "fp8 fp8:vt=1" > $W/logs/vt-sass.log 2>&1
      echo "rc=$? @$SECONDS kernel_sass (this machine's Triton)" >> $S; cat $W/logs/vt-sass.log >> $S
      timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_fp8_v_transposed.py tests/test_fp8_kv.py \
        > $W/logs/vt-tests.log 2>&1
      echo "rc=$? @$SECONDS V keys-contiguous tests: $(tail -1 $W/logs/vt-tests.log)" >> $S
      timeout 240 python3 scripts/kernel_bench.py --kv-cache-dtype fp8 --fp8-layouts --skip-prefill \
        $([ $D = cpu ] && echo --dry-run) --out $W/kb-fp8-layouts.json > $W/logs/kb-fp8-layouts.log 2>&1
      echo "rc=$? @$SECONDS kernel_bench --fp8-layouts" >> $S; cat $W/kb-fp8-layouts.md >> $S 2>/dev/null
      timeout 200 python3 scripts/kernel_bench.py --skip-prefill $([ $D = cpu ] && echo --dry-run) \
        --configs '[{"order": "launch"}, {"order": "launch", "splits": 2}]' \
        --out $W/kb-bf16-order.json > $W/logs/kb-bf16-order.log 2>&1
      echo "rc=$? @$SECONDS kernel_bench bf16, longest first (the default) against launch order" >> $S; cat $W/kb-bf16-order.md >> $S 2>/dev/null ;;
    vt-nano)
      for v in 0 1 1 0; do
        r=$([ -f $W/nano-fp8-vt$v-r1.json ] && echo 2 || echo 1)
        LABKIT_FP8_V_TRANSPOSED=$v timeout 200 python3 -m labkit bench --model $M --device $D --kv-cache-dtype fp8 \
          ${NANO_BENCH:---workload nano --repeats 3} --out $W/nano-fp8-vt$v-r$r.json > $W/logs/nano-fp8-vt$v-r$r.log 2>&1
        echo "rc=$? @$SECONDS nano FP8, V keys-contiguous $v, round $r: $(tps $W/nano-fp8-vt$v-r$r.json) tok/s" >> $S
      done
      # (the CPU plumbing run interprets every kernel: minutes alone, past 5 on a loaded 2-core machine)
      lc_s=$([ $D = cpu ] && echo 900 || echo 300)
      LABKIT_FP8_V_TRANSPOSED=1 timeout $lc_s python3 -m labkit logits-check run --suite fp8-kv \
        --attention-backend triton $([ $D = cpu ] || echo --execution graph) --device $D \
        --dtype $([ $D = cpu ] && echo float32 || echo bfloat16) --model $M --out $W/lc-fp8-kv-vt \
        > $W/logs/lc-fp8-kv-vt.log 2>&1
      echo "rc=$? @$SECONDS logits-check fp8-kv, V keys-contiguous: $(grep -m1 -o 'VERDICT: [A-Z]*' \
$W/logs/lc-fp8-kv-vt.log); $(grep -m1 -o 'worst ratio [0-9.]*x' $W/logs/lc-fp8-kv-vt.log)" >> $S ;;
    order)
      # the engine's decode launched longest first (LABKIT_DECODE_ORDER, session 19): FP8 in the order L F F L,
      # then bf16 L F (ORDER_BF16_ROUNDS=2: L F F L)
      for kv in fp8 bf16; do
        seq=$([ $kv = fp8 ] || [ ${ORDER_BF16_ROUNDS:-1} = 2 ] && echo "launch longest-first longest-first launch" \
              || echo "launch longest-first")
        for o in $seq; do
          r=$([ -f $W/nano-$kv-$o-r1.json ] && echo 2 || echo 1)
          LABKIT_DECODE_ORDER=$o timeout 200 python3 -m labkit bench --model $M --device $D \
            $([ $kv = fp8 ] && echo --kv-cache-dtype fp8) ${NANO_BENCH:---workload nano --repeats 3} \
            --out $W/nano-$kv-$o-r$r.json > $W/logs/nano-$kv-$o-r$r.log 2>&1
          echo "rc=$? @$SECONDS nano $kv, decode order $o, round $r: $(tps $W/nano-$kv-$o-r$r.json) tok/s" >> $S
        done
      done ;;
    ncu)
      for v in bf16,rows fp8,rows fp8,v-keys-contiguous; do
        p=${v%,*}; l=${v#*,}
        if [ $D = cpu ]; then
          python3 scripts/decode_ncu.py --dry-run --pool $p --layout $l > $W/ncu-$p-$l.txt 2>&1
        else
          timeout 150 ncu --clock-control none -k regex:_decode_split --launch-skip 3 --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
            --section MemoryWorkloadAnalysis python3 scripts/decode_ncu.py --pool $p --layout $l \
            > $W/ncu-$p-$l.txt 2>&1
        fi
        echo "rc=$? @$SECONDS ncu $p $l" >> $S
        grep -E "decode_ncu:|Achieved Occupancy|Theoretical Occupancy|DRAM Throughput|Memory Throughput|Duration|\
Registers Per Thread|Block Limit|Warp Cycles Per Issued|==PROF==|==ERROR==" $W/ncu-$p-$l.txt | head -20 >> $S
      done ;;
    gemv)
      timeout 300 python3 scripts/gemv_bench.py --sweep $([ $D = cpu ] && echo --dry-run) --out $W/gemv.json \
        > $W/logs/gemv.log 2>&1
      echo "rc=$? @$SECONDS gemv_bench" >> $S; cat $W/gemv.md >> $S 2>/dev/null
      r=0
      for mode in ${PDL_MODES:-early first first early}; do
        r=$((r + 1))
        LABKIT_DECODE_PDL=$mode timeout 200 python3 -m labkit bench --model $M --device $D \
          ${BATCH1_BENCH:---workload batch1} --out $W/batch1-$mode-r$r.json > $W/logs/batch1-$mode-r$r.log 2>&1
        echo "rc=$? @$SECONDS batch1, PDL $mode, round $r: $(python3 -c "import json,sys;print(round(json.load(\
open(sys.argv[1]))['median']['decode_ms_per_token'], 4))" $W/batch1-$mode-r$r.json 2>/dev/null) ms a token" >> $S
      done ;;
    *) echo "issue32_next_call.sh: unknown section $section" >> $S ;;
  esac
done
echo "done @$SECONDS" >> $S
