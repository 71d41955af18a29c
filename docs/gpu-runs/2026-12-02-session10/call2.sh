set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
M=/tmp/qwen3-fake
[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null
for p in mixed prefill_first; do
  port=8401
  LABKIT_STEP_LOG=$OUT/steps-$p.jsonl python3 -m labkit serve --model $M --device cuda --port $port --policy $p --log-level warning > $OUT/serve-$p.log 2>&1 &
  spid=$!
  for _ in $(seq 300); do curl -sf localhost:$port/health > /dev/null && break; sleep 1; done
  echo "start $(python3 -c 'import time; print(time.monotonic())')" > $OUT/mark-$p.txt
  timeout 120 python3 -m labkit bench load --arrivals workloads/arrivals/short-and-long.jsonl --url http://127.0.0.1:$port --out /tmp/load-$p.json > $OUT/load-$p.txt 2>&1
  echo "end $(python3 -c 'import time; print(time.monotonic())')" >> $OUT/mark-$p.txt
  kill -TERM $spid; wait $spid
done
cd $OUT && tar czf steps.tgz *.jsonl *.txt *.log && rm -f *.jsonl *.txt *.log
