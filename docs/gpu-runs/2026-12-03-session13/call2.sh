#!/usr/bin/env bash
# Session 13, device call 2 (one H200): issue 35's lab plan, first part: every lab one GPU runs but fp8-kv and
# scheduling-under-arrivals (call 3 runs those into the same runs folder, carried back, then the report over it
# all) and bench-hf (Transformers' nano: minutes of its own). scripts/run_lab_plan.py as a person runs the plan,
# ten untimed labs at a time, then the timed ones alone. Back: $OUT/labs1.tgz (runs without logits arrays and
# profiler traces, logs, report), $OUT/summary.txt. Run from the repo root with `carry: [".whl"]`.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > /dev/null 2>&1 || echo "wheels: install failed" >> $OUT/summary.txt
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MODEL_DIR=/tmp/qwen3-fake
W=/tmp/labs; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >> $OUT/summary.txt 2>&1
python3 -m labkit model fake --preset qwen3-0.6b --out $MODEL_DIR > /dev/null 2>&1
pack() { tar czf $OUT/labs1.tgz -C $W --exclude="*.npz" --exclude="*.trace.json*" --exclude="*.perfetto.json*" \
  runs logs report 2>/dev/null; }
trap pack EXIT
s=$SECONDS
timeout 540 python3 scripts/run_lab_plan.py --runs $W/runs --report $W/report --logs $W/logs --gpus 1 --jobs 10 \
  --skip bench-hf,fp8-kv,scheduling-under-arrivals > $W/run_lab_plan.txt 2>&1
echo "run_lab_plan rc=$? $((SECONDS-s))s" >> $OUT/summary.txt
cp $W/run_lab_plan.txt $W/logs/ 2>/dev/null
cat $W/run_lab_plan.txt >> $OUT/summary.txt
