#!/usr/bin/env bash
# Session 13, device call 2 (one H200): issue 35's lab plan, as a person runs it (scripts/run_lab_plan.py: every
# lab one GPU runs, each with its own command, into one runs folder, then `labkit report` over it), bench-hf left
# out (Transformers' nano: minutes of its own). The plan takes longer than one device command may (10 minutes), so
# it runs as one detached process (setsid) that call 3, made at once on the same machine, waits for and packs;
# this call packs what is done by its end. Ten untimed labs at a time, then the timed ones alone.
# Back: $OUT/labs1.tgz (runs without logits arrays and profiler traces, logs, report), $OUT/summary.txt.
# Run from the repo root with `carry: [".whl"]`.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > /dev/null 2>&1 || echo "wheels: install failed" >> $OUT/summary.txt
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MODEL_DIR=/tmp/qwen3-fake
W=/tmp/labs; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >> $OUT/summary.txt 2>&1
python3 -m labkit model fake --preset qwen3-0.6b --out $MODEL_DIR > /dev/null 2>&1
echo $SECONDS > $W/started
setsid bash -c "python3 scripts/run_lab_plan.py --runs $W/runs --report $W/report --logs $W/logs --gpus 1 \
  --jobs 10 --skip bench-hf > $W/run_lab_plan.txt 2>&1; echo rc=\$? > $W/DONE" < /dev/null > /dev/null 2>&1 &
while [ ! -f $W/DONE ] && [ $SECONDS -lt 560 ]; do sleep 5; done
echo "lab plan at ${SECONDS}s: $(cat $W/DONE 2>/dev/null || echo 'still running')" >> $OUT/summary.txt
tar czf $OUT/labs1.tgz -C $W --exclude="*.npz" --exclude="*.trace.json*" --exclude="*.perfetto.json*" \
  run_lab_plan.txt runs logs report 2>/dev/null
cat $W/run_lab_plan.txt >> $OUT/summary.txt
