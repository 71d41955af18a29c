#!/usr/bin/env bash
# Small-batch decode variants against the engine as it is, in one device call (issue 32: "each fusion measured
# alone ... against its parent, interleaved, at least 3 rounds"). Each variant is a set of environment knobs
# (engine/kernels/decode_layer.py, engine/graph_dispatch.py); each run is `labkit bench --workload batch1` with
# the workload's requests and max_num_seqs set to the batch size (decode ms a token = step time / rows).
#   VARIANTS="name:K=V,K=V ..."  (default below: base first, then the open candidates)
#   WORKLOAD=workloads/bench/batch1.yaml (its requests and max_num_seqs set to each batch)
#   BATCHES="1 4 16"  ROUNDS=3  DEADLINE=480 (seconds from the start; a round that would end after it is skipped)
#   DEVICE=cuda (cpu: the script itself, on a tiny model); RUN_TIMEOUT=120 seconds a bench run
#   OUT=folder (default runs/batch1-sweep): runs/*.json, logs/*.log, summary.md (medians and ratios to base)
# Each round runs every (batch, variant) once; the order is reversed every other round.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-runs/batch1-sweep}; mkdir -p $OUT/runs $OUT/logs
M=${FAKE_MODEL:-/tmp/qwen3-fake}
[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null
# (default: session 15's open candidates: the norm's statistics over whole rows (0, the default before session 15)
# and in 64-column chunks, against the 128 now taken, at batches 2-16; split64, which won at batches 1 and 4 and
# lost at 16 in session 15)
VARIANTS=${VARIANTS:-"base: normchunk0:LABKIT_DECODE_NORM_CHUNK=0 normchunk64:LABKIT_DECODE_NORM_CHUNK=64 split64:LABKIT_DECODE_SHORT_CONTEXT=0,LABKIT_DECODE_MERGE_PDL=1,LABKIT_DECODE_BLOCK_N=64"}
BATCHES=${BATCHES:-"1 4 16"}; ROUNDS=${ROUNDS:-3}; DEADLINE=${DEADLINE:-480}
for b in $BATCHES; do
  sed -e "s/^requests: 1$/requests: $b/" -e "s/^  max_num_seqs: 1$/  max_num_seqs: $b/" \
    ${WORKLOAD:-workloads/bench/batch1.yaml} > $OUT/batch$b.yaml
done
runs=$(( $(echo $BATCHES | wc -w) * $(echo $VARIANTS | wc -w) ))
order=""; for b in $BATCHES; do for v in $VARIANTS; do order="$order $b/$v"; done; done
for r in $(seq $ROUNDS); do
  [ $r -gt 1 ] && [ $((SECONDS + SECONDS / (r - 1))) -gt $DEADLINE ] && { echo "round $r skipped (deadline)"; break; }
  for item in $order; do
    b=${item%%/*}; v=${item#*/}; name=${v%%:*}; knobs=${v#*:}
    env ${knobs//,LABKIT/ LABKIT} timeout ${RUN_TIMEOUT:-120} python3 -m labkit bench --workload $OUT/batch$b.yaml --model $M \
      --device ${DEVICE:-cuda} --out $OUT/runs/b$b-$name-r$r.json > $OUT/logs/b$b-$name-r$r.log 2>&1
    echo "rc=$? round $r batch $b $name"
  done
  order=$(echo $order | tr ' ' '\n' | tac | tr '\n' ' ')
done
python3 - "$OUT" "$BATCHES" "$VARIANTS" > $OUT/summary.md <<'PY'
import glob, json, os, statistics, sys
out, batches, variants = sys.argv[1], sys.argv[2].split(), [v.split(":", 1)[0] for v in sys.argv[3].split()]
print("| batch | variant | ms a token, each round | median | / base |\n| --- | --- | --- | --- | --- |")
for b in batches:
    base = None
    for name in variants:
        vals = []
        for f in sorted(glob.glob(os.path.join(out, "runs", f"b{b}-{name}-r*.json"))):
            try:
                vals.append(json.load(open(f))["median"]["decode_ms_per_token"])
            except Exception:  # noqa: BLE001 - a failed run shows as missing
                pass
        med = statistics.median(vals) if vals else None
        base = med if name == variants[0] else base
        ratio = f"{med / base:.4f}" if med and base else ""
        print(f"| {b} | {name} | {', '.join(f'{v:.4f}' for v in vals) or 'missing'} | "
              f"{'' if med is None else f'{med:.4f}'} | {ratio} |")
PY
cat $OUT/summary.md
