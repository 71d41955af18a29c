#!/usr/bin/env bash
# Session 13, device call 1 (one H200, tree b4868ca): issue 33's before/after timing (batch-1 3 rounds, nano 2
# rounds, main before issue 33 (.before/, `git archive 20675d7`, carried) against this tree, interleaved), then
# issue 34's sections A (the streams' cost at rate inf, 3 rounds) and B (trace --url over a rate-16 mixed load).
# Everything packed into $OUT/call1.tgz; $OUT/summary.txt has each part's exit code and seconds.
# Run from the repo root with `carry: [".whl", ".before"]`.
set -u
FINAL=$OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > /dev/null 2>&1 || echo "wheels: install failed" >> $FINAL/summary.txt
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
W=/tmp/c1; mkdir -p $W
S=$FINAL/summary.txt
pack() { tar czf $FINAL/call1.tgz -C $W --exclude="*.jsonl" --exclude="*.npz" --exclude="*.perfetto.json*" . 2>/dev/null; }
trap pack EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >> $S 2>&1
python3 -m labkit model fake --preset qwen3-0.6b --out /tmp/qwen3-fake > /dev/null 2>&1
s=$SECONDS; OUT=$W/i33 bash scripts/issue33_call.sh timing; echo "rc=$? $((SECONDS-s))s issue33 timing" >> $S
cat $W/i33/summary.txt >> $S 2>/dev/null
pack
s=$SECONDS
OUT=$W/i34 PACK_TO=$W FAKE_MODEL=/tmp/qwen3-fake ISSUE34_SECTIONS="A B" ISSUE34_DEADLINE=$((500-SECONDS)) \
  timeout $((560-SECONDS)) bash scripts/gpu_session.sh issue34 > $W/issue34.log 2>&1
echo "rc=$? $((SECONDS-s))s issue34 A B" >> $S
tar xzf $W/reports.tgz -C $W/i34 logs/issue34-summary.md logs/startup.txt 2>/dev/null
cat $W/i34/logs/issue34-summary.md >> $S 2>/dev/null
echo "done @$SECONDS" >> $S
