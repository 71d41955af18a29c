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

# sweep NAME VARIANTS BATCHES ROUNDS SHARE: scripts/batch1_sweep.sh into $W/NAME, its deadline SHARE (a fraction,
# "1/2") of the budget left; its table into the summary.
sweep() {
  OUT=$W/$1 VARIANTS="$2" BATCHES="$3" ROUNDS=$4 DEADLINE=$(( SECONDS + (BUDGET - SECONDS) * $5 )) DEVICE=$D \
    FAKE_MODEL=$M bash scripts/batch1_sweep.sh > $W/logs/$1.log 2>&1
  echo "rc=$? @$SECONDS $1" >> $S; cat $W/$1/summary.md >> $S 2>/dev/null
}
# graph_logits KNOB NAME: the graph logits suite with KNOB (VAR=VALUE) set, if 50 s of the budget are left.
graph_logits() {
  [ $SECONDS -lt $(( BUDGET - 50 )) ] || return 0
  env $1 timeout $(( BUDGET - SECONDS )) python3 -m labkit logits-check run --suite graph \
    --attention-backend triton --execution graph --device $D --dtype bfloat16 --model $M \
    --out $W/lc-graph > $W/logs/lc-graph.log 2>&1
  echo "rc=$? @$SECONDS logits-check graph under $2: $(grep -m1 -o 'VERDICT: [A-Z]*' $W/logs/lc-graph.log);\
 $(grep -m1 -o 'worst ratio [0-9.]*x' $W/logs/lc-graph.log)" >> $S
}
# logits_under_fastest VARIANTS: after `sweep batch1 VARIANTS "1" ...`, the graph logits suite under the variant
# with the lowest median batch-1 ms a token, unless that is base (the first variant).
logits_under_fastest() {
  local best knobs
  best=$(python3 - "$W/batch1/runs" "$1" <<'PY'
import glob, json, statistics, sys
med = {}
for v in sys.argv[2].split():
    name = v.split(":")[0]
    xs = [json.load(open(f))["median"]["decode_ms_per_token"] for f in glob.glob(f"{sys.argv[1]}/b1-{name}-r*.json")]
    if xs:
        med[v] = statistics.median(xs)
print(min(med, key=med.get) if med else "base:")
PY
)
  knobs=${best#*:}; [ "${best%%:*}" != base ] && graph_logits "${knobs//,LABKIT/ LABKIT}" "${best%%:*}"
  return 0
}
