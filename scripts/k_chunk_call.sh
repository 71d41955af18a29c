#!/usr/bin/env bash
# Issue 32's device call for LABKIT_DECODE_K_CHUNK (engine/kernels/decode_layer.py: a tile of 2-16 rows reads its
# weights and inputs K_CHUNK columns at a time after the PDL wait; off by default until this call), on one H200
# with the fake Qwen3-0.6B in bf16, in ~4 minutes (DEVICE=cpu FAKE_MODEL=DIR runs it on the CPU, as its test does):
#   tests      tests/test_fused_decode.py's GEMV tests and the Gumbel sampler's on the device (bf16, the K_CHUNK
#              cases among them)
#   sweep      scripts/batch1_sweep.sh: base, kc64 and kc128 at batches 4 and 16 (ROUNDS, default 1)
#   lifecycle  `labkit serve lifecycle --device cuda` (the service-lifecycle lab, run on the CPU so far; needs the
#              server wheels: carry .whl, installed here into /tmp/site)
# SECTIONS (default "tests sweep lifecycle"); WORK: where it makes a new folder (default /tmp). Back:
# $OUT/k-chunk.tgz and $OUT/summary.txt.
# Predictions (session 15, before the run): compiled for sm_90 here (local Triton 3.9), the 16-row q/k/v and
# gate/up GEMVs spill (538 and 6,070 spill loads with the norm in 128-column chunks) and spill nothing at K_CHUNK
# 64-256. Session 16 ran it (ROUNDS=3, two rounds fitted) with a sampler section timing LABKIT_GUMBEL_RNG=4 (no
# faster: the knob was removed) and found the 538/6,070 were the K_CHUNK change's own: it had moved a load in the
# K_CHUNK=0 path, which then ran 14x slower (docs/perf.md, session 16; scripts/gemv_spills.py now checks).
# Batch 16 2.86 ms a step (0.1785 a token) -> 1.2-1.8 ms; batch 4 2.29 -> 1.0-1.6; kc64 and kc128 within 5% of
# each other. sampler: the Gumbel kernel takes 0.21 ms of nano's ~5.6 ms step (session 5's profile) where
# its bytes need ~0.02; if Philox bounds it, 4 uniforms a call save ~0.1 ms a step: nano +1.5-2.5%.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
S=$OUT/summary.txt; mkdir -p ${WORK:-/tmp}; W=$(mktemp -d ${WORK:-/tmp}/k-chunk.XXXXXX); mkdir -p $W/logs; M=${FAKE_MODEL:-/tmp/qwen3-fake}
pack() { tar czf $OUT/k-chunk.tgz -C $W . 2>/dev/null; }
trap pack EXIT
[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null
for section in ${SECTIONS:-tests sweep lifecycle}; do
  case $section in
    tests)
      timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_fused_decode.py tests/test_gumbel_sampler.py \
        -k "gemv or gumbel" > $W/logs/tests.log 2>&1
      echo "rc=$? @$SECONDS tests" >> $S; tail -2 $W/logs/tests.log >> $S ;;
    sweep)
      OUT=$W/sweep VARIANTS="base: kc64:LABKIT_DECODE_K_CHUNK=64 kc128:LABKIT_DECODE_K_CHUNK=128" BATCHES="4 16" \
        ROUNDS=${ROUNDS:-1} bash scripts/batch1_sweep.sh > $W/logs/sweep.log 2>&1
      cat $W/sweep/summary.md >> $S 2>/dev/null ;;
    lifecycle)
      python3 -c "import fastapi, uvicorn, zmq" 2> /dev/null || python3 -m pip install -q --no-index --no-deps \
        --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1 || echo "wheels: install failed (carry .whl)" >> $S
      timeout 300 python3 -m labkit serve lifecycle --model $M --device ${DEVICE:-cuda} --out $W/serve-lifecycle.json \
        > $W/logs/lifecycle.log 2>&1
      echo "rc=$? @$SECONDS lifecycle" >> $S; grep -h "scenarios hold" $W/logs/lifecycle.log >> $S
      # a failed scenario's problems, so a summary says why (session 22's CI saw "overload FAIL" and no more)
      python3 -c "import json,sys
for c in json.load(open(sys.argv[1]))['scenarios']:
    for p in c['problems']: print(c['name'] + ': ' + p)" $W/serve-lifecycle.json >> $S 2>/dev/null ;;
    *) echo "k_chunk_call.sh: unknown section $section" >> $S ;;
  esac
done
echo "done @$SECONDS" >> $S
