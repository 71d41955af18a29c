#!/usr/bin/env bash
# Issue 32's device call for LABKIT_DECODE_K_CHUNK (engine/kernels/decode_layer.py: a tile of 2-16 rows reads its
# weights and inputs K_CHUNK columns at a time after the PDL wait; off by default until this call), on one H200
# with the fake Qwen3-0.6B in bf16, in ~4 minutes (DEVICE=cpu FAKE_MODEL=DIR runs it on the CPU, as its test does):
#   tests      tests/test_fused_decode.py's GEMV tests and the Gumbel sampler's on the device (bf16, the K_CHUNK
#              and LABKIT_GUMBEL_RNG=4 cases among them)
#   sweep      scripts/batch1_sweep.sh: base, kc64 and kc128 at batches 4 and 16 (ROUNDS, default 1)
#   sampler    nano (`bench --workload nano --repeats 3`; SAMPLER_BENCH replaces those options) with the Gumbel
#              kernel's Philox at 1 and 4 uniforms a call (LABKIT_GUMBEL_RNG), two runs a side in the order 1 4 4 1
#   lifecycle  `labkit serve lifecycle --device cuda` (the service-lifecycle lab, run on the CPU so far; needs the
#              server wheels: carry .whl, installed here into /tmp/site)
# SECTIONS (default "tests sweep sampler lifecycle"); WORK: its folder (default: a new one under /tmp). Back:
# $OUT/k-chunk.tgz and $OUT/summary.txt.
# Predictions (session 15, before the run): compiled for sm_90 here (local Triton 3.9), the 16-row q/k/v and
# gate/up GEMVs spill (538 and 6,070 spill loads with the norm in 128-column chunks) and spill nothing at K_CHUNK
# 64-256. Batch 16 2.86 ms a step (0.1785 a token) -> 1.2-1.8 ms; batch 4 2.29 -> 1.0-1.6; kc64 and kc128 within
# 5% of each other. sampler: the Gumbel kernel takes 0.21 ms of nano's ~5.6 ms step (session 5's profile) where
# its bytes need ~0.02; if Philox bounds it, 4 uniforms a call save ~0.1 ms a step: nano +1.5-2.5%.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
S=$OUT/summary.txt; W=${WORK:-$(mktemp -d /tmp/k-chunk.XXXXXX)}; mkdir -p $W/logs; M=${FAKE_MODEL:-/tmp/qwen3-fake}
pack() { tar czf $OUT/k-chunk.tgz -C $W . 2>/dev/null; }
trap pack EXIT
[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null
for section in ${SECTIONS:-tests sweep sampler lifecycle}; do
  case $section in
    tests)
      timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_fused_decode.py tests/test_gumbel_sampler.py \
        -k "gemv or gumbel or four_uniforms" > $W/logs/tests.log 2>&1
      echo "rc=$? @$SECONDS tests" >> $S; tail -2 $W/logs/tests.log >> $S ;;
    sweep)
      OUT=$W/sweep VARIANTS="base: kc64:LABKIT_DECODE_K_CHUNK=64 kc128:LABKIT_DECODE_K_CHUNK=128" BATCHES="4 16" \
        ROUNDS=${ROUNDS:-1} bash scripts/batch1_sweep.sh > $W/logs/sweep.log 2>&1
      cat $W/sweep/summary.md >> $S 2>/dev/null ;;
    sampler)
      for r in 1 2; do for g in $([ $r = 1 ] && echo "1 4" || echo "4 1"); do
        LABKIT_GUMBEL_RNG=$g timeout 150 python3 -m labkit bench --model $M --device ${DEVICE:-cuda} \
          ${SAMPLER_BENCH:---workload nano --repeats 3} --out $W/nano-rng$g-r$r.json > $W/logs/nano-rng$g-r$r.log 2>&1
        rc=$?; tps=$(python3 -c "import json,sys;print(round(json.load(open(sys.argv[1]))['median'][sys.argv[2]]))" \
          $W/nano-rng$g-r$r.json output_throughput 2>/dev/null)
        echo "rc=$rc @$SECONDS nano rng$g r$r: $tps" >> $S
      done; done ;;
    lifecycle)
      python3 -c "import fastapi, uvicorn, zmq" 2> /dev/null || python3 -m pip install -q --no-index --no-deps \
        --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1 || echo "wheels: install failed (carry .whl)" >> $S
      timeout 300 python3 -m labkit serve lifecycle --model $M --device ${DEVICE:-cuda} --out $W/serve-lifecycle.json \
        > $W/logs/lifecycle.log 2>&1
      echo "rc=$? @$SECONDS lifecycle" >> $S; grep -h "scenarios hold" $W/logs/lifecycle.log >> $S ;;
    *) echo "k_chunk_call.sh: unknown section $section" >> $S ;;
  esac
done
echo "done @$SECONDS" >> $S
