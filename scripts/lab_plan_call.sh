#!/usr/bin/env bash
# The whole lab plan on one GPU machine, as a person runs it (scripts/run_lab_plan.py: every lab's own commands
# into one runs folder, then `labkit report`), across two device commands: the plan takes longer than one command
# may run (10 minutes), so it runs as one detached process (setsid) on the machine.
#   bash scripts/lab_plan_call.sh start    install the carried server wheels (.whl/), start the plan detached, wait
#                                          up to START_WAIT seconds (default 540), pack what is done
#   bash scripts/lab_plan_call.sh finish   (the next device command, made at once: the same machine) wait up to
#                                          FINISH_WAIT seconds (default 300) for the plan and its report, pack
#                                          them without event logs and logits arrays, in 15 MB parts
# LABS_SKIP (default: none), LABS_ONLY and LABS_JOBS (default 10) pass to run_lab_plan.py; LABS_DIR (default
# /tmp/labs) is where the plan runs. $OUT gets labs.tgz.partNN (cat them
# together) and summary.txt. Session 13 ran it this way (docs/gpu-runs/2026-12-03-session13/call2.sh, call3.sh).
set -u
cd "$(dirname "$0")/.."
W=${LABS_DIR:-/tmp/labs}
S=$OUT/summary.txt
pack() {
  # (not the report's evidence archive: GBs of the logits arrays left out here, and reading it took call 5 of
  # session 14 past its limit)
  tar czf $W/labs.tgz -C $W --exclude="*.npz" --exclude="*.trace.json*" --exclude="*.perfetto.json*" \
    --exclude="*.jsonl" --exclude="*.jsonl.gz" --exclude="evidence.tar.gz" run_lab_plan.txt runs logs report 2>/dev/null
  split -b 15M -d $W/labs.tgz $OUT/labs.tgz.part
}
case ${1:-} in
  start)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl > /dev/null 2>&1 || echo "wheels: install failed (bench load needs them)" >> $S
    export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MODEL_DIR=${MODEL_DIR:-/tmp/qwen3-fake}
    mkdir -p $W
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >> $S 2>&1
    [ -f $MODEL_DIR/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $MODEL_DIR > /dev/null 2>&1
    setsid bash -c "python3 scripts/run_lab_plan.py --runs $W/runs --report $W/report --logs $W/logs --gpus 1 \
      --jobs ${LABS_JOBS:-10} ${LABS_SKIP:+--skip $LABS_SKIP} ${LABS_ONLY:+--only $LABS_ONLY} > $W/run_lab_plan.txt 2>&1; echo rc=\$? > $W/DONE" \
      < /dev/null > /dev/null 2>&1 &
    while [ ! -f $W/DONE ] && [ $SECONDS -lt ${START_WAIT:-540} ]; do sleep 5; done ;;
  finish)
    [ -f $W/run_lab_plan.txt ] || { echo "no lab plan on this machine (a fresh one: the start's machine went back)" >> $S; exit 2; }
    while [ ! -f $W/DONE ] && [ $SECONDS -lt ${FINISH_WAIT:-300} ]; do sleep 5; done ;;
  *) echo "usage: bash scripts/lab_plan_call.sh start|finish" >&2; exit 2 ;;
esac
echo "lab plan after ${SECONDS}s of this command: $(cat $W/DONE 2>/dev/null || echo 'still running')" >> $S
cat $W/run_lab_plan.txt >> $S 2>/dev/null
[ "$1" = finish ] || [ -f $W/DONE ] && pack
exit 0
