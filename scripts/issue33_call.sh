#!/usr/bin/env bash
# Issue 33's device check (one H200): the refactor (policies as classes, the step loop chosen at start-up, the plan as
# a value with the scheduler's snapshot, graph dispatch in its own module, flags named as Config fields) must change
# no state and cost no time.
#   bash scripts/issue33_call.sh evidence   every trace case and the logits suites on the GPU (gpu_session.sh evidence:
#                                           decode and mixed graphs, async scheduling on), ~2-3 minutes
#   bash scripts/issue33_call.sh timing     batch-1 (3 rounds) and offline nano (2 rounds), the tree before (.before/, a
#                                           `git archive` of main before issue 33 was merged, carried) and this one,
#                                           interleaved (gpu_session.sh trees: the order reversed every other round)
# Logs and JSON under $OUT; $OUT/summary.txt has each run's exit code and the medians to compare.
set -u
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${OUT:-runs/issue33}")  # absolute: the trees run from their own folders
mkdir -p "$OUT"
mode=${1:-evidence}
if [ "$mode" = evidence ]; then
  OUT=$OUT/evidence bash scripts/gpu_session.sh evidence > "$OUT/evidence.txt" 2>&1
  grep -c "^rc=0" "$OUT/evidence.txt" | sed 's/^/runs with rc=0: /' > "$OUT/summary.txt"
  grep -v "^rc=0" "$OUT/evidence.txt" >> "$OUT/summary.txt"
fi
if [ "$mode" = timing ]; then
  [ -d .before ] || { echo "issue33_call: carry .before/ (git archive of main before issue 33)" > "$OUT/summary.txt"; exit 2; }
  TREES=".before $PWD" ROUNDS=3 TREE_BENCH=batch1 OUT=$OUT/batch1 bash scripts/gpu_session.sh trees > "$OUT/batch1.txt" 2>&1
  TREES=".before $PWD" ROUNDS=2 TREE_BENCH=nano OUT=$OUT/nano bash scripts/gpu_session.sh trees > "$OUT/nano.txt" 2>&1
  # gpu_session.sh deletes the logs it made once they are packed: the medians are read from its archives.
  python3 - "$OUT" > "$OUT/summary.txt" 2>&1 <<'PY'
import json, os, sys, tarfile
out = sys.argv[1]
for bench, key in (("batch1", "decode_ms_per_token"), ("nano", "output_throughput")):
    try:
        tar = tarfile.open(os.path.join(out, bench, "reports.tgz"))
    except (OSError, tarfile.TarError) as e:
        print(bench, "no archive:", e)
        continue
    names = sorted(n for n in tar.getnames() if os.path.basename(n).startswith("tree-") and n.endswith(".json"))
    if not names:
        print(bench, "no tree-*.json in its archive")
    for n in names:
        try:
            med = json.load(tar.extractfile(n))["median"]
        except Exception as e:  # noqa: BLE001 - a missing run is reported, not fatal
            print(bench, os.path.basename(n), "unreadable:", e)
            continue
        print(bench, os.path.basename(n), key, med.get(key))
PY
fi
