#!/usr/bin/env bash
# Session 28's third device call (bash docs/gpu-runs/2026-12-06-session28/call3.sh): where a batch-1 layer's time
# goes inside its kernels, from the in-kernel probe (LABKIT_DECODE_PROBE=1, engine/kernels/probe.py), ~3 minutes:
#   tests   the probe's and the fused decode's tests on the device (a probed step's numbers are the unprobed
#           step's; no program passes its PDL wait before the previous kernel's last program ended)
#   batch1  `bench --workload batch1` with the probe off (the engine unchanged: 0.713-0.716 ms on an H100)
#   probe   scripts/layer_probe.py: each kernel's programs' start, weights, wait, input, sums and end after the
#           previous kernel's end, for layer 14 and as medians over the middle layers
# BUDGET (default 300). DEVICE=cpu FAKE_MODEL=DIR: the plumbing on a CPU (the probe itself needs CUDA).
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-300}
source scripts/call_preamble.sh
if [ $D = cuda ]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_probe.py tests/test_fused_decode.py \
    > $W/logs/tests.log 2>&1
  echo "rc=$? @$SECONDS tests: $(tail -1 $W/logs/tests.log)" >> $S
  grep -E "^(FAILED|ERROR)" $W/logs/tests.log | head -20 >> $S
fi
timeout 120 python3 -m labkit bench --workload batch1 --model $M --device $D --out $W/batch1.json \
  > $W/logs/batch1.log 2>&1
echo "rc=$? @$SECONDS batch1: $(python3 -c "import json,sys;print(round(json.load(open(sys.argv[1]))['median']\
['decode_ms_per_token'], 4))" $W/batch1.json 2>/dev/null) ms a token" >> $S
timeout 150 python3 scripts/layer_probe.py --model $M --json $W/probe.json > $W/logs/probe.log 2>&1
echo "rc=$? @$SECONDS layer probe:" >> $S; cat $W/logs/probe.log >> $S
timeout 120 python3 scripts/layer_probe.py --model $M --prompt-len 1024 --json $W/probe-1k.json \
  > $W/logs/probe-1k.log 2>&1
echo "rc=$? @$SECONDS layer probe, a 1,024-token prompt:" >> $S; head -12 $W/logs/probe-1k.log >> $S
echo "done @$SECONDS" >> $S
