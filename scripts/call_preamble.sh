# Sourced by a device call's script (docs/gpu-runs/*/call.sh) from the repository root: what every call sets up.
#   S        $OUT/summary.txt: one line a step (its exit code, the second it ended, its figures)
#   W        a new working folder under ${WORK:-/tmp} (logs in $W/logs), packed into $OUT/call.tgz at exit (logs,
#            JSON, Markdown and text; no traces, nothing over 5 MB)
#   M, D     the fake Qwen3-0.6B (FAKE_MODEL, made when missing) and the device (DEVICE, default cuda)
#   BUDGET   the call's seconds (default 540), for the steps' deadlines
# The GPU's name, clock and driver go first into the summary.
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
S=$OUT/summary.txt; W=$(mktemp -d ${WORK:-/tmp}/call.XXXXXX); mkdir -p $W/logs
M=${FAKE_MODEL:-/tmp/qwen3-fake}; D=${DEVICE:-cuda}; BUDGET=${BUDGET:-540}
pack() {
  (cd $W && find . -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) \
     ! -name '*.trace.json' -size -5M -print0 | tar czf $OUT/call.tgz --null -T -)
}
trap pack EXIT
[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader >> $S 2>&1
