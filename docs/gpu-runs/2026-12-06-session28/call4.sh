#!/usr/bin/env bash
# Session 28's fourth device call (bash docs/gpu-runs/2026-12-06-session28/call4.sh; AB_OLD=folder holding
# engine/ and labkit/ as they were at 5700908, before the probe): call 3 measured batch 1 at 0.8432 ms a token with
# the probe off, against 0.713-0.716 on earlier H100s. Is that the machine or the probe's unused argument?
#   ab      `bench --workload batch1`, the engine before the probe and after it, three rounds interleaved
#   probe   scripts/layer_probe.py with attention's phases apart (this token's K/V, its tile's V, the tiles)
# BUDGET (default 300). DEVICE=cpu FAKE_MODEL=DIR: the plumbing on a CPU (the probe itself needs CUDA).
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-300}
source scripts/call_preamble.sh
if [ $D = cuda ]; then
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_probe.py > $W/logs/tests.log 2>&1
  echo "rc=$? @$SECONDS tests: $(tail -1 $W/logs/tests.log)" >> $S
  grep -E "^(FAILED|ERROR)" $W/logs/tests.log | head -20 >> $S
fi
ms() { python3 -c "import json,sys;print(round(json.load(open(sys.argv[1]))['median']['decode_ms_per_token'], 4))" \
  "$1" 2>/dev/null; }
for r in 1 2 3; do
  for side in old new; do
    [ $side = old ] && P=$PWD/${AB_OLD:-ab_old} || P=$PWD
    # (run from that folder: python -m puts the working directory first on the path)
    (cd $P && PYTHONPATH=$P timeout 120 python3 -m labkit bench --workload batch1 --model $M --device $D \
      --out $W/b1-$side-r$r.json > $W/logs/b1-$side-r$r.log 2>&1)
    echo "rc=$? @$SECONDS batch1 $side round $r: $(ms $W/b1-$side-r$r.json) ms a token" >> $S
    [ $r = 1 ] && (cd $P && PYTHONPATH=$P python3 -c "import engine.kernels.decode_layer as d;\
print('  engine', d.__file__, 'probe' if 'probe_ptr' in open(d.__file__).read() else 'no probe')") >> $S
  done
done
timeout 150 python3 scripts/layer_probe.py --model $M --json $W/probe.json > $W/logs/probe.log 2>&1
echo "rc=$? @$SECONDS layer probe:" >> $S; cat $W/logs/probe.log >> $S
echo "done @$SECONDS" >> $S
