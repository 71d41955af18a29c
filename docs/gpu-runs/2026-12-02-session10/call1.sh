set -u
FINAL=$OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
git_head=$(cat labkit/COMMIT 2>/dev/null); echo "tree $(git rev-parse HEAD 2>/dev/null) $git_head" > $FINAL/summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv >> $FINAL/summary.txt
mkdir -p /tmp/e
t0=$(date +%s)
OUT=/tmp/e bash scripts/gpu_session.sh evidence > $FINAL/evidence.txt 2>&1
echo "evidence wall $(( $(date +%s) - t0 )) s" >> $FINAL/summary.txt
cp /tmp/e/reports.tgz $FINAL/evidence-reports.tgz
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MODEL_DIR=/tmp/qwen3-fake
M=/tmp/qwen3-fake; P=/tmp/p; mkdir -p $P
for i in 1 2 3; do timeout 90 python3 -m labkit bench --workload batch1 --model $M --device cuda --out $P/batch1-$i.json > $P/batch1-$i.log 2>&1; echo "batch1 $i rc=$?" >> $FINAL/summary.txt; done
timeout 200 python3 -m labkit bench --workload nano --model $M --device cuda --graph --repeats 3 --out $P/nano.json > $P/nano.log 2>&1; echo "nano rc=$?" >> $FINAL/summary.txt
t0=$(date +%s)
for p in prefill_first balanced mixed; do for r in 1 2; do
  timeout 120 python3 -m labkit bench load --arrivals workloads/arrivals/short-and-long.jsonl --policy $p --out runs/arrivals-$p-$r.json > $P/arrivals-$p-$r.log 2>&1
  echo "arrivals $p $r rc=$? $(( $(date +%s) - t0 )) s" >> $FINAL/summary.txt
done; done
COLUMNS=80 timeout 120 python3 -m labkit report > $P/report.log 2>&1; echo "report rc=$?" >> $FINAL/summary.txt
cp -r runs/arrivals-*.json runs/report $P/ 2>/dev/null
tar czf $FINAL/perf-lab.tgz -C /tmp p
echo done >> $FINAL/summary.txt
