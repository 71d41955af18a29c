#!/usr/bin/env bash
# Every GPU check and benchmark, from a clean tree (`git archive HEAD`, see README):
#   bash scripts/gpu_session.sh [labs|evidence|bar|perf|floor|all|tp|kernels|serve|serve-profile|slow-state|plan|bar20|cells|final20|startup|startup+cells|trees|capture-profile|issue34]
# labs:     the lab plan (workloads/labs.yaml) as a person runs it, every lab's own commands into one runs folder
#           ($OUT/runs), then `labkit report` over it (scripts/run_lab_plan.py). On one H200 the whole plan takes
#           longer than one device command may run (session 13: ~7.5 min without bench-hf): scripts/lab_plan_call.sh
#           runs it detached across two commands. LABS_SKIP="a,b" leaves labs out
#           (bench-hf: the Transformers baseline, ~5 minutes alone), LABS_ONLY="a,b" runs only those. Back in
#           $OUT/reports.tgz: the report (report.md, report.html, manifest.json), every result's JSON and Markdown
#           and each command's log.
# Measured on one H200 (docs/perf.md): evidence ~2 minutes, perf ~7 (3.5 of them the Transformers baseline);
# `all` is ~9.5, close to a 10-minute device call: two calls (evidence, perf) are safer.
# evidence: doctor/smoke, every trace case on fake Qwen3-0.6B (block 256), the logits-check suites in bf16
#           (baseline: torch eager, triton eager, triton graph against Transformers; graph suite graph vs
#           eager and triton vs torch; kv suite), run as parallel processes (each uses a small KV pool);
# perf:     labkit bench nano (graph) and fixed (graph, eager, compare), then the custom kernels' before/after
#           (nano and batch1 with --no-custom-kernels, `compare --variable custom_kernels`), profiles of nano
#           and batch1 (`--profile`: table + trace, into reports.tgz), then the Transformers baseline on the
#           nano workload and the engine/baseline ratio, one at a time (each takes the GPU's memory).
#           perf-hf: the baseline alone.
# bar:      issue 14's bar: nano (3 repeats), batch1, kernel_bench's decode TB/s, Transformers and the ratio.
# floor:    issue 14's bar minus perf-hf and kernels: nano (3 repeats) and batch1, async scheduling on and off
#           (and .old/'s engine, if present), profiles of both.
# tp:       issue 15 on a two-GPU kind (nvidia-h200-x2), call 1: shapes --check, the tp logits suite eager and
#           graph, every trace case with --tensor-parallel-size 2 in eager and graph mode, worker failures (scripts/tp_failure_check.py).
# tp-perf:  call 2: offline nano TP=1 vs TP=2 (3 repeats each), and replicas (`bench load --endpoints`) versus
#           one TP=2 server under the nano load at rate inf, 32 and 16.
# kernels:  scripts/kernel_bench.py (decode TB/s at 256x800 / 256x2048 / nano mix, knob sweep, prefill vs SDPA)
#           and the kernel tests on the GPU.
# serve:    issue 11's bar: offline nano (3 repeats), then `bench load --workload nano` at rate inf and at
#           rate 16 (a fresh server each), and rate 16 with --no-async-scheduling (compared). serve-profile: a rate-inf load on a server with py-spy --gil
#           recording it and its engine core; with .old/ (a `git archive` of an earlier commit) the same load
#           on that commit's server.
#           Needs fastapi/uvicorn/pyzmq/py-spy wheels installed on PYTHONPATH first (docs/perf.md says how).
# trees:    a bisect in one call: TREES="dir ..." (each a `git archive` of one commit, carried), TREE_BENCH (default
#           batch1) from each in turn, ROUNDS times, the order reversed every other round (docs/perf.md, session 9).
# capture-profile: py-spy over `bench --workload nano`'s init (raw stacks: where start-up and graph capture go).
# issue34:  issue 34's GPU bar and serve's default policy by measurement, one call (~7.5 minutes on an H200):
#           A. nano at rate inf on a fresh server with --step-stream (+ a ZeroMQ subscriber), --kv-events (+ a
#              subscriber) and a `labkit watch` client attached, against the same server without them, interleaved,
#              3 rounds (workload seed 4-6, one per round); B. `trace --url` over nano at rate 16 under mixed
#              (serve --live-trace); C. each policy at the default budget on a fresh server: rates 16, 32, inf (same
#              prompts for every policy: workload and arrival seed 1, 2, 3), /metrics scraped around every load.
#              scripts/issue34_summary.py writes logs/issue34-summary.md (every check, the rule of Deliver 7).
# Logs and JSON go to $OUT (the device tool's output folder).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-runs/gpu-session}
mkdir -p "$OUT"
# What this call makes is newer than this file: at the end only that is deleted (after it is packed), never a
# result that was in $OUT before (pointed at a folder of results, the script once deleted them all).
started=$(mktemp "$OUT/.gpu-session-start.XXXXXX")
mkdir -p "$OUT/logs"
export RUNS_DIR=$OUT/runs
M=${FAKE_MODEL:-/tmp/qwen3-fake}   # a model folder; made (fake Qwen3-0.6B) when it holds no config.json
what=${1:-all}
log() { echo "$*" | tr -c 'a-zA-Z0-9\n' _ | cut -c1-90; }
# step SECONDS CMD...: run, log to $OUT/logs (the name's hash keeps commands with the same start apart), print the exit code.
step() { local t=$1; shift; local f; f=$OUT/logs/$(log "$*")-$(echo "$*" | md5sum | cut -c1-6).log; timeout "$t" "$@" > "$f" 2>&1; echo "rc=$? $*" | cut -c1-200; }
LC="python3 -m labkit logits-check"
# At most EVIDENCE_JOBS steps at once: session 35's H100 (80 GB) ran out of memory loading the 21st of 21
# concurrent trace processes (2.4-4.2 GB each), which an H200's 141 GB had held.
throttle() { while [ "$(jobs -rp | wc -l)" -ge "${EVIDENCE_JOBS:-12}" ]; do wait -n; done; }
BF="--device cuda --dtype bfloat16 --model $M"

[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null

if [ "$what" = labs ]; then
  # The lab plan into one folder, then the report (~8 minutes on one H200 without bench-hf).
  export MODEL_DIR=$M
  step 590 python3 scripts/run_lab_plan.py --runs $OUT/runs --report $OUT/report --logs $OUT/logs/labs --gpus 1 \
    ${LABS_SKIP:+--skip $LABS_SKIP} ${LABS_ONLY:+--only $LABS_ONLY}
  cp $OUT/logs/*run_lab_plan*.log $OUT/logs/run_lab_plan.txt 2>/dev/null
  tar czf $OUT/reports.tgz -C $OUT --exclude='*.jsonl' --exclude='*.npz' --exclude='*.tsv' --exclude='*.tar.gz' \
    --exclude='*.perfetto.json*' logs runs report 2>/dev/null
fi
if [ "$what" = evidence ] || [ "$what" = all ]; then
  R=$OUT/runs
  mkdir -p $R/lc-graph
  step 120 python3 -m labkit doctor --device cuda --model $M &
  step 120 python3 -m labkit smoke --device cuda &
  for c in $(ls workloads/cases/*.yaml | xargs -n1 basename | sed 's/[.]yaml$//'); do  # every shipped case
    throttle
    step 180 python3 -m labkit trace --case $c --model $M --device cuda -q --out $R/trace-$c &
  done
  throttle
  step 180 python3 -m labkit trace --case lifecycle --model $M --device cuda -q --shapes --out $R/trace-shapes &
  wait
  # Judged by the float32-anchored gate (docs/logits-check.md): each run also collects Transformers in
  # float32 (the truth) and in bf16 (the noise yardstick).
  step 300 $LC run --suite baseline --attention-backend torch $BF --out $R/lc-baseline-torch &
  step 300 $LC run --suite baseline --attention-backend triton --execution eager $BF --out $R/lc-baseline-triton-eager &
  step 300 $LC run --suite baseline --attention-backend triton --execution graph $BF --out $R/lc-baseline-triton-graph &
  step 300 $LC run --suite graph --attention-backend triton --execution graph $BF --out $R/lc-graph &
  step 300 $LC run --suite kv --attention-backend triton --execution graph --ref-execution eager $BF --out $R/lc-kv &
  step 300 $LC run --suite mixed --attention-backend triton --execution graph $BF --out $R/lc-mixed-triton-graph &
  wait
  for c in chunk refs balanced decode-order mixed mixed-preempt; do  # mixed steps through their graphs
    step 240 python3 -m labkit trace --case $c --model $M --device cuda -q --no-enforce-eager --scheduling-policy mixed --out $R/trace-mixed-graph-$c &
  done
  wait
fi
if [ "$what" = perf ] || [ "$what" = all ]; then
  step 150 python3 -m labkit bench --workload nano --model $M --device cuda --no-enforce-eager --repeats 2 --out $OUT/bench-nano-graph.json
  step 90 python3 -m labkit bench --workload fixed --model $M --device cuda --no-enforce-eager --out $OUT/bench-fixed-graph.json
  step 90 python3 -m labkit bench --workload fixed --model $M --device cuda --enforce-eager --out $OUT/bench-fixed-eager.json
  step 30 python3 -m labkit bench compare $OUT/bench-fixed-eager.json $OUT/bench-fixed-graph.json --variable eager --out $OUT/compare-eager.json
  P=$OUT/runs/perf; mkdir -p $P
  step 150 python3 -m labkit bench --workload nano --model $M --device cuda --no-enforce-eager --no-custom-kernels --repeats 2 --out $P/bench-nano-graph-no-custom.json
  step 30 python3 -m labkit bench compare $P/bench-nano-graph-no-custom.json $OUT/bench-nano-graph.json --variable custom_kernels --out $P/compare-nano-custom-kernels.json
  step 90 python3 -m labkit bench --workload batch1 --model $M --device cuda --out $P/bench-batch1.json
  step 90 python3 -m labkit bench --workload batch1 --model $M --device cuda --no-custom-kernels --out $P/bench-batch1-no-custom.json
  step 30 python3 -m labkit bench compare $P/bench-batch1-no-custom.json $P/bench-batch1.json --variable custom_kernels --out $P/compare-batch1-custom-kernels.json
  step 150 python3 -m labkit bench --workload nano --model $M --device cuda --no-enforce-eager --repeats 1 --profile --profile-steps 64 --out $P/profile-nano.json
  step 90 python3 -m labkit bench --workload batch1 --model $M --device cuda --repeats 3 --profile --profile-steps 64 --out $P/profile-batch1.json
fi
if [ "$what" = floor ]; then
  # Issue 14's bar without the Transformers baseline (perf-hf) and the kernels (kernels): nano median of 3 and
  # batch-1 ms per token, each with async scheduling on (the default) and off, compared as ratios; with .old/ (a
  # `git archive` of an earlier commit) batch1 and nano on that commit's engine too; then both profiles (nano's
  # window decode-only at batch 256).
  P=$OUT/runs/perf; mkdir -p $P
  B="python3 -m labkit bench --model $M --device cuda"
  step 200 $B --workload nano --no-enforce-eager --repeats 3 --out $OUT/logs/bench-nano-graph.json
  step 200 $B --workload nano --no-enforce-eager --repeats 3 --no-async-scheduling --out $OUT/logs/bench-nano-graph-sync.json
  step 30 python3 -m labkit bench compare $OUT/logs/bench-nano-graph-sync.json $OUT/logs/bench-nano-graph.json --variable async_scheduling --out $OUT/logs/compare-nano-async.json
  step 90 $B --workload batch1 --out $OUT/logs/bench-batch1.json
  step 90 $B --workload batch1 --no-async-scheduling --out $OUT/logs/bench-batch1-sync.json
  step 30 python3 -m labkit bench compare $OUT/logs/bench-batch1-sync.json $OUT/logs/bench-batch1.json --variable async_scheduling --out $OUT/logs/compare-batch1-async.json
  if [ -d .old ]; then
    (cd .old && export PYTHONPATH=$PWD && step 90 python3 -m labkit bench --model $M --device cuda --workload batch1 --out $OUT/logs/bench-batch1-old.json)
    (cd .old && export PYTHONPATH=$PWD && step 200 python3 -m labkit bench --model $M --device cuda --workload nano --no-enforce-eager --repeats 3 --out $OUT/logs/bench-nano-old.json)
  fi
  step 150 $B --workload nano --no-enforce-eager --repeats 1 --profile --profile-skip 16 --profile-steps 32 --out $P/profile-nano-decode.json
  step 90 $B --workload batch1 --repeats 3 --profile --profile-steps 64 --out $P/profile-batch1.json
fi
if [ "$what" = bar ]; then
  # Issue 14's bar in one call (~6 minutes; run `evidence` after it in the same call for the correctness half):
  # nano median of 3, batch-1 ms per token, decode attention TB/s (kernel_bench), Transformers on nano and the ratio.
  step 200 python3 -m labkit bench --workload nano --model $M --device cuda --no-enforce-eager --repeats 3 --out $OUT/logs/bench-nano-graph.json
  step 90 python3 -m labkit bench --workload batch1 --model $M --device cuda --out $OUT/logs/bench-batch1.json
  step 200 python3 scripts/kernel_bench.py --out $OUT/logs/kernel_bench.json
  step 400 python3 -m labkit bench --workload nano --backend hf --hf-batch 256 --model $M --device cuda --repeats 1 --out $OUT/logs/bench-nano-hf.json
  step 30 python3 -m labkit bench compare $OUT/logs/bench-nano-hf.json $OUT/logs/bench-nano-graph.json --variable backend --allow-single --out $OUT/logs/compare-backend.json
fi
if [ "$what" = perf ] || [ "$what" = all ] || [ "$what" = perf-hf ]; then
  step 400 python3 -m labkit bench --workload nano --backend hf --hf-batch 256 --model $M --device cuda --repeats 1 --out $OUT/bench-nano-hf.json
fi
if [ "$what" = tp ]; then
  # Issue 15's evidence, call 1 of 2 (~6 minutes): shapes, the tp logits suite eager and graph, every trace case
  # with --tensor-parallel-size 2 eager (the cases' own setting) and graph, six at a time, then worker failures on NCCL.
  R=$OUT/runs
  step 300 python3 -m labkit shapes --tensor-parallel-size 2 --check --device cuda --model $M --out $R/shapes-tp2.json &
  step 300 $LC run --suite tp --execution eager $BF --out $R/lc-tp-eager &
  step 300 $LC run --suite tp --execution graph $BF --out $R/lc-tp-graph &
  wait
  n=0
  for mode in eager graph; do
    for c in $(ls workloads/cases/*.yaml | xargs -n1 basename | sed 's/[.]yaml$//'); do  # every shipped case
      flag=""; [ $mode = graph ] && flag="--no-enforce-eager"
      # --tensor-parallel-size 2 must not change a single state: judge strictly (no CHANGED).
      step 240 python3 -m labkit trace --case $c --tensor-parallel-size 2 $flag --no-expect-changes --model $M --device cuda -q --out $R/trace-tp2-$mode-$c &
      n=$((n + 1)); [ $((n % 6)) -eq 0 ] && wait
    done
  done
  wait
  step 300 python3 scripts/tp_failure_check.py --model $M --device cuda --out $R/tp-failures.json
fi
if [ "$what" = tp-perf ]; then
  # Issue 15's measurements, call 2 of 2 (~6 minutes): offline nano TP=1 vs TP=2 (3 repeats each), then the
  # same online load against two replicas (one per GPU, `bench load --endpoints`) and against one TP=2 server,
  # at rate inf, 32 and 16 requests/s. Each load uses its own prompts (workload seed 1, 2, 3) so that no run
  # finds the previous run's prompts in a server's prefix cache.
  for tp in 1 2; do
    step 240 python3 -m labkit bench --workload nano --tensor-parallel-size $tp --model $M --device cuda --no-enforce-eager --repeats 3 --out $OUT/logs/bench-nano-tp$tp.json
  done
  step 30 python3 -m labkit bench compare $OUT/logs/bench-nano-tp1.json $OUT/logs/bench-nano-tp2.json --variable tp --out $OUT/logs/compare-nano-tp.json
  for i in 1 2 3; do sed "s/^seed: 0/seed: $i/" workloads/bench/nano.yaml > /tmp/nano-seed$i.yaml; done
  serve() { python3 -m labkit serve --model $M --device cuda --log-level warning "$@"; }
  healthy() { for _ in $(seq 240); do curl -sf localhost:$1/health > /dev/null && return 0; sleep 1; done; return 1; }
  loads() {  # NAME URL-FLAGS...
    local name=$1; shift; local i=1
    for rate in inf 32 16; do
      step 120 python3 -m labkit bench load --workload /tmp/nano-seed$i.yaml --rate $rate "$@" --out $OUT/logs/load-$name-$rate.json
      i=$((i + 1))
    done
  }
  CUDA_VISIBLE_DEVICES=0 serve --port 8101 > $OUT/logs/serve-replica0.log 2>&1 & r0=$!
  CUDA_VISIBLE_DEVICES=1 serve --port 8102 > $OUT/logs/serve-replica1.log 2>&1 & r1=$!
  healthy 8101 && healthy 8102
  nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv > $OUT/logs/memory-replicas.csv
  curl -s localhost:8101/health > $OUT/logs/health-replica0.json; curl -s localhost:8102/health > $OUT/logs/health-replica1.json
  loads replicas --endpoints http://127.0.0.1:8101,http://127.0.0.1:8102
  if command -v vllm-router > /dev/null; then   # the same replicas behind a real router (issue 34), if it is installed
    vllm-router --host 127.0.0.1 --port 8180 --prometheus-port 29180 --worker-urls http://127.0.0.1:8101 \
      http://127.0.0.1:8102 --policy cache_aware --worker-startup-check-interval 1 > $OUT/logs/router.log 2>&1 & rt=$!
    for _ in $(seq 60); do curl -sf localhost:8180/health > /dev/null && break; sleep 1; done
    loads router --url http://127.0.0.1:8180 --behind http://127.0.0.1:8101,http://127.0.0.1:8102
    kill -TERM $rt; wait $rt
  else
    echo "vllm-router not installed: no load through a router" > $OUT/logs/router.log
  fi
  kill -TERM $r0 $r1; wait $r0 $r1
  serve --port 8103 --tensor-parallel-size 2 > $OUT/logs/serve-tp2.log 2>&1 & t2=$!
  healthy 8103
  nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv > $OUT/logs/memory-tp2.csv
  curl -s localhost:8103/health > $OUT/logs/health-tp2.json
  loads tp2 --url http://127.0.0.1:8103
  kill -TERM $t2; wait $t2
fi
if [ "$what" = kernels ]; then
  step 300 python3 scripts/kernel_bench.py --out $OUT/logs/kernel_bench.json
  step 200 python3 -m pytest -q -p no:xdist -o addopts= tests/test_triton_kernels.py tests/test_small_gemm.py tests/test_qk_norm_rope_kernel.py
fi
LOAD="python3 -m labkit bench load --workload nano --model $M --device cuda --no-enforce-eager"
if [ "$what" = serve ]; then
  step 300 python3 -m labkit bench --workload nano --model $M --device cuda --no-enforce-eager --repeats 3 --out $OUT/bench-nano.json
  step 300 $LOAD --rate inf --out $OUT/load-nano-inf.json
  step 300 $LOAD --rate inf --out $OUT/load-nano-inf-2.json
  step 300 $LOAD --rate 16 --out $OUT/load-nano-r16.json
  # What async scheduling costs or saves under arrivals (each arrival discards one planned decode step).
  step 300 $LOAD --rate 16 --no-async-scheduling --out $OUT/load-nano-r16-sync.json
  step 30 python3 -m labkit bench compare $OUT/load-nano-r16-sync.json $OUT/load-nano-r16.json --variable async_scheduling --out $OUT/compare-r16-async.json
  for f in $OUT/load-*.json $OUT/bench-nano.json; do cp $f $OUT/logs/; done
fi
if [ "$what" = serve-profile ]; then
  # Our own server, py-spy on it and (--subprocesses) its engine core, GIL holders only.
  port=8391
  python3 -m labkit serve --model $M --device cuda --port $port --log-level warning > $OUT/logs/serve-profiled.log 2>&1 &
  spid=$!
  for _ in $(seq 300); do curl -sf localhost:$port/health > /dev/null && break; sleep 1; done
  PATH=$PATH:/tmp/site/bin py-spy record --gil --subprocesses --rate 200 --format raw --pid $spid -o $OUT/logs/pyspy-gil.txt --duration 30 \
    > $OUT/logs/pyspy.log 2>&1 &
  pyspy=$!
  sleep 2
  step 120 python3 -m labkit bench load --workload nano --url http://127.0.0.1:$port --out $OUT/load-nano-inf-profiled.json
  curl -s localhost:$port/health > $OUT/logs/health-after-profile.json
  curl -s localhost:$port/metrics > $OUT/logs/metrics-after-profile.txt
  wait $pyspy
  kill -TERM $spid; wait $spid; echo "serve exit code $?" >> $OUT/logs/serve-profiled.log
  if [ -d .old ]; then
    # The earlier commit's server (run from its own folder: `python -m` puts the cwd first on sys.path),
    # measured by today's client.
    (cd .old && PYTHONPATH=$PWD:/tmp/site exec python3 -m labkit serve --model $M --device cuda \
      --port $((port + 1)) --log-level warning) > $OUT/logs/serve-old.log 2>&1 &
    opid=$!
    for _ in $(seq 300); do curl -sf localhost:$((port + 1))/health > /dev/null && break; sleep 1; done
    step 120 python3 -m labkit bench load --workload nano --url http://127.0.0.1:$((port + 1)) --out $OUT/load-nano-inf-old.json
    kill -INT $opid; wait $opid
  fi
  for f in $OUT/load-*.json $OUT/bench-nano.json; do cp $f $OUT/logs/; done
fi
if [ "$what" = plan ]; then
  # Issue 20, the batch plan on the GPU (~9 minutes): the kernel tests; every trace case as nano (default) and
  # under --scheduling-policy mixed, eager and a few with --no-enforce-eager; the logits suites baseline (triton graph) and mixed
  # (triton eager and graph) under the anchored gate; then the eager-step bench (compiled small ops everywhere
  # against inside graphs only) and offline nano/batch1, with .old/'s engine for before/after if present.
  R=$OUT/runs
  step 240 python3 -m pytest -q -p no:xdist -o addopts= tests/test_triton_kernels.py tests/test_small_gemm.py tests/test_qk_norm_rope_kernel.py &
  for c in $(ls workloads/cases/*.yaml | xargs -n1 basename | sed 's/[.]yaml$//'); do  # every shipped case
    step 240 python3 -m labkit trace --case $c --model $M --device cuda -q --out $R/trace-$c &
    step 240 python3 -m labkit trace --case $c --model $M --device cuda -q --scheduling-policy mixed --out $R/trace-mixed-$c &
  done
  wait
  for c in chunk refs balanced decode-order; do
    step 240 python3 -m labkit trace --case $c --model $M --device cuda -q --no-enforce-eager --scheduling-policy mixed --out $R/trace-mixed-graph-$c &
  done
  step 300 $LC run --suite baseline --attention-backend triton --execution graph $BF --out $R/lc-baseline-triton-graph &
  step 300 $LC run --suite mixed --attention-backend triton --execution eager $BF --out $R/lc-mixed-triton-eager &
  step 300 $LC run --suite mixed --attention-backend triton --execution graph $BF --out $R/lc-mixed-triton-graph &
  step 300 $LC run --suite mixed --attention-backend torch $BF --out $R/lc-mixed-torch &
  wait
  for v in everywhere graphs-only; do
    step 200 python3 scripts/eager_step_bench.py --model $M --variant $v --out $OUT/logs/eager-steps-$v.json
  done
  B="python3 -m labkit bench --model $M --device cuda"
  step 200 $B --workload nano --no-enforce-eager --repeats 2 --out $OUT/logs/bench-nano-graph.json
  step 90 $B --workload batch1 --out $OUT/logs/bench-batch1.json
  step 200 $B --workload nano --no-enforce-eager --repeats 2 --scheduling-policy mixed --out $OUT/logs/bench-nano-graph-mixed.json
  if [ -d .old ]; then
    (cd .old && export PYTHONPATH=$PWD:/tmp/site && step 200 python3 -m labkit bench --model $M --device cuda --workload nano --no-enforce-eager --repeats 2 --out $OUT/logs/bench-nano-old.json)
    step 30 python3 -m labkit bench compare $OUT/logs/bench-nano-old.json $OUT/logs/bench-nano-graph.json --variable code --allow-single --out $OUT/logs/compare-nano-old-new.json
  fi
fi
if [ "$what" = bar20 ]; then
  # Issue 20's bar in one call (~9.5 minutes), most important first; reports.tgz is rewritten after each phase so
  # a call cut short still returns what ran. A: the graph paths' correctness (mixed graphs included); B: mixed
  # steps eager against their graphs (scripts/mixed_step_bench.py); C: serving under arrivals, a fresh server
  # per policy and round, interleaved, each serving rate 16 (workload and arrival seed 1) then rate 32 (seed 2);
  # the last mixed server then serves rate inf (seed 3).
  # Reports only: the event logs, request logs and logits arrays would take the archive past the 16 MiB a file may
  # come back with (session 6 lost its last call's figures that way).
  pack() { tar czf ${PACK_TO:-$OUT}/reports.tgz -C $OUT --exclude='*.jsonl' --exclude='*.npz' --exclude='*.tsv' \
    --exclude='*.perfetto.json*' logs runs 2>/dev/null; }
  R=$OUT/runs; mkdir -p $R
  step 300 $LC run --suite mixed --attention-backend triton --execution graph $BF --out $R/lc-mixed-triton-graph &
  step 300 $LC run --suite baseline --attention-backend triton --execution graph $BF --out $R/lc-baseline-triton-graph &
  for c in chunk refs balanced decode-order; do
    step 240 python3 -m labkit trace --case $c --model $M --device cuda -q --no-enforce-eager --scheduling-policy mixed --out $R/trace-mixed-graph-$c &
  done
  wait; pack
  for g in on off; do
    step 200 python3 scripts/mixed_step_bench.py --model $M --mixed-graphs $g --out $OUT/logs/mixed-steps-$g.json
  done
  pack
  for i in 1 2 3; do sed "s/^seed: 0/seed: $i/" workloads/bench/nano.yaml > /tmp/nano-seed$i.yaml; done
  port=8500
  for round in 1 2; do
    for policy in mixed prefill_first; do
      port=$((port + 1))
      python3 -m labkit serve --model $M --device cuda --port $port --scheduling-policy $policy --log-level warning \
        > $OUT/logs/serve-$policy-r$round.log 2>&1 &
      spid=$!; t0=$(date +%s.%N)
      for _ in $(seq 480); do curl -sf localhost:$port/health > /dev/null && break; sleep 0.5; done
      echo "$policy r$round: /health after $(awk "BEGIN{print $(date +%s.%N) - $t0}") s" >> $OUT/logs/startup.txt
      for rate in 16 32; do
        i=$([ $rate = 16 ] && echo 1 || echo 2)
        step 120 python3 -m labkit bench load --workload /tmp/nano-seed$i.yaml --rate $rate --seed $i \
          --url http://127.0.0.1:$port --out $OUT/logs/load-$policy-r$round-rate$rate.json
        curl -s localhost:$port/health > $OUT/logs/health-$policy-r$round-rate$rate.json
      done
      if [ $round = 2 ] && [ $policy = mixed ]; then
        step 120 python3 -m labkit bench load --workload /tmp/nano-seed3.yaml --rate inf --seed 3 \
          --url http://127.0.0.1:$port --out $OUT/logs/load-mixed-r2-rateinf.json
      fi
      kill -TERM $spid; wait $spid
      pack
    done
  done
fi
if [ "$what" = startup ] || [ "$what" = startup+cells ]; then
  # Issue 21's start-up table: each command's wall seconds, first on this machine's empty compile caches (cold),
  # then again (warm), and the engine's phases (bench's startup_s, serve's /health startup_s). The lines go to
  # logs/startup-table.txt: "<cold|warm> <command> <seconds> rc=<exit>".
  timed() { local tag=$1 name=$2; shift 2; local t0 t1 rc; t0=$(date +%s.%N)
    timeout 300 "$@" > "$OUT/logs/startup-$tag-$name.log" 2>&1; rc=$?; t1=$(date +%s.%N)
    echo "$tag $name $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}") rc=$rc" >> $OUT/logs/startup-table.txt; }
  for tag in cold warm; do
    timed $tag import-torch python3 -c "import torch"
    timed $tag import-engine python3 -X importtime -c "import engine.llm"
    timed $tag doctor python3 -m labkit doctor --device cuda --model $M
    timed $tag smoke python3 -m labkit smoke --device cuda
    timed $tag trace-chunk python3 -m labkit trace --case chunk --model $M --device cuda -q --out $OUT/runs/st-$tag-chunk
    timed $tag trace-chunk-graph python3 -m labkit trace --case chunk --model $M --device cuda -q --no-enforce-eager --out $OUT/runs/st-$tag-chunk-graph
    timed $tag bench-batch1 python3 -m labkit bench --workload batch1 --model $M --device cuda --out $OUT/logs/st-$tag-batch1.json
    port=$([ $tag = cold ] && echo 8801 || echo 8802)
    python3 -m labkit serve --model $M --device cuda --port $port --log-level warning > $OUT/logs/startup-$tag-serve.log 2>&1 &
    spid=$!; t0=$(date +%s.%N)
    for _ in $(seq 600); do curl -sf localhost:$port/health > $OUT/logs/st-$tag-health.json && break; sleep 0.2; done
    echo "$tag serve-health $(awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $t0}") rc=0" >> $OUT/logs/startup-table.txt
    kill -TERM $spid; wait $spid
  done
  tar czf ${PACK_TO:-$OUT}/reports.tgz -C $OUT --exclude='*.jsonl' --exclude='*.npz' --exclude='*.tsv' \
    --exclude='*.perfetto.json*' logs runs 2>/dev/null
  [ "$what" = startup+cells ] && what=cells
fi
if [ "$what" = cells ]; then
  # Issue 20's bar, the cells a bar20 call leaves: CELLS="policy/async/round ..." (async on|off), each a fresh server
  # serving rate 16 (workload and arrival seed 1) then rate 32 (seed 2); a mixed cell of round INF_ROUND also serves
  # rate inf (seed 3); OFFLINE=1 first runs offline nano (graph, 3 repeats) and batch1. Reports only (as bar20).
  pack() { tar czf ${PACK_TO:-$OUT}/reports.tgz -C $OUT --exclude='*.jsonl' --exclude='*.npz' --exclude='*.tsv' \
    --exclude='*.perfetto.json*' logs runs 2>/dev/null; }
  mkdir -p $OUT/runs
  for i in 1 2 3; do sed "s/^seed: 0/seed: $i/" workloads/bench/nano.yaml > /tmp/nano-seed$i.yaml; done
  if [ "${OFFLINE:-0}" = 1 ]; then
    step 200 python3 -m labkit bench --workload nano --model $M --device cuda --no-enforce-eager --repeats 3 --out $OUT/logs/bench-nano-graph.json
    step 90 python3 -m labkit bench --workload batch1 --model $M --device cuda --out $OUT/logs/bench-batch1.json
    pack
  fi
  port=8700
  for cell in ${CELLS:-}; do
    IFS=/ read -r policy async round <<< "$cell"
    name=$policy-$async-r$round; port=$((port + 1))
    flag=$([ $async = off ] && echo --no-async-scheduling || echo --async-scheduling)
    python3 -m labkit serve --model $M --device cuda --port $port --scheduling-policy $policy $flag --log-level warning \
      > $OUT/logs/serve-$name.log 2>&1 &
    spid=$!; t0=$(date +%s.%N)
    for _ in $(seq 480); do curl -sf localhost:$port/health > /dev/null && break; sleep 0.5; done
    echo "$name: /health after $(awk "BEGIN{print $(date +%s.%N) - $t0}") s" >> $OUT/logs/startup.txt
    for rate in 16 32; do
      i=$([ $rate = 16 ] && echo 1 || echo 2)
      step 120 python3 -m labkit bench load --workload /tmp/nano-seed$i.yaml --rate $rate --seed $i \
        --url http://127.0.0.1:$port --out $OUT/logs/load-$name-rate$rate.json
      curl -s localhost:$port/health > $OUT/logs/health-$name-rate$rate.json
    done
    if [ $policy = mixed ] && [ $async = on ] && [ "$round" = "${INF_ROUND:-}" ]; then
      step 120 python3 -m labkit bench load --workload /tmp/nano-seed3.yaml --rate inf --seed 3 \
        --url http://127.0.0.1:$port --out $OUT/logs/load-$name-rateinf.json
    fi
    kill -TERM $spid; wait $spid
    pack
  done
fi
if [ "$what" = final20 ]; then
  # Issue 20's last call of session 6 (~4 minutes, what the device budget left): the graph paths' correctness
  # (decode graphs and mixed graphs) while the first server starts, then one fresh server per policy (mixed,
  # prefill_first), each serving rate 16 (workload and arrival seed 1) then rate 32 (seed 2).
  # Reports only: the event logs, request logs and logits arrays would take the archive past the 16 MiB a file may
  # come back with (session 6 lost its last call's figures that way).
  pack() { tar czf ${PACK_TO:-$OUT}/reports.tgz -C $OUT --exclude='*.jsonl' --exclude='*.npz' --exclude='*.tsv' \
    --exclude='*.perfetto.json*' logs runs 2>/dev/null; }
  R=$OUT/runs; mkdir -p $R
  for i in 1 2; do sed "s/^seed: 0/seed: $i/" workloads/bench/nano.yaml > /tmp/nano-seed$i.yaml; done
  port=8600
  python3 -m labkit serve --model $M --device cuda --port $port --scheduling-policy mixed --log-level warning \
    > $OUT/logs/serve-mixed.log 2>&1 &
  spid=$!
  step 150 $LC run --suite mixed --attention-backend triton --execution graph $BF --out $R/lc-mixed-triton-graph &
  c1=$!
  step 150 $LC run --suite baseline --attention-backend triton --execution graph $BF --out $R/lc-baseline-triton-graph &
  c2=$!
  step 150 python3 -m labkit trace --case refs --model $M --device cuda -q --no-enforce-eager --scheduling-policy mixed --out $R/trace-mixed-graph-refs &
  c3=$!
  wait $c1 $c2 $c3; pack
  for policy in mixed prefill_first; do
    if [ $policy = prefill_first ]; then
      port=$((port + 1))
      python3 -m labkit serve --model $M --device cuda --port $port --log-level warning > $OUT/logs/serve-$policy.log 2>&1 &
      spid=$!
    fi
    for _ in $(seq 150); do curl -sf localhost:$port/health > /dev/null && break; sleep 1; done
    for rate in 16 32; do
      i=$([ $rate = 16 ] && echo 1 || echo 2)
      step 60 python3 -m labkit bench load --workload /tmp/nano-seed$i.yaml --rate $rate --seed $i \
        --url http://127.0.0.1:$port --out $OUT/logs/load-$policy-rate$rate.json
      curl -s localhost:$port/health > $OUT/logs/health-$policy-rate$rate.json
    done
    kill -TERM $spid; wait $spid
    pack
  done
fi
if [ "$what" = trees ]; then
  # A bisect in one call: TREES="dir ..." (each a `git archive` of one commit, carried; named by its commit), a
  # benchmark (TREE_BENCH, default batch1) run from each tree in turn, ROUNDS times (the order reversed every
  # other round, so a drifting machine does not favour one tree). Lines in logs/trees.txt: "<round> <tree> rc=".
  pack() { tar czf ${PACK_TO:-$OUT}/reports.tgz -C $OUT logs 2>/dev/null; }
  order=${TREES:-}
  for r in $(seq ${ROUNDS:-2}); do
    for t in $order; do
      name=$(basename $t)
      (cd $t && PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout 120 python3 -m labkit bench --workload ${TREE_BENCH:-batch1} \
        --model $M --device cuda --out $OUT/logs/tree-$name-r$r.json > $OUT/logs/tree-$name-r$r.log 2>&1)
      echo "$r $name rc=$?" >> $OUT/logs/trees.txt
    done
    order=$(echo $order | tr ' ' '\n' | tac | tr '\n' ' ')
    pack
  done
fi
if [ "$what" = capture-profile ]; then
  # Where nano's start-up goes, stack by stack: py-spy (raw collapsed stacks, 200 Hz, native frames off) over
  # `bench --workload nano --repeats 1`, whose init captures every decode graph.
  PATH=$PATH:/tmp/site/bin timeout 200 py-spy record --rate 200 --format raw -o $OUT/logs/pyspy-nano-init.txt -- \
    python3 -m labkit bench --workload nano --model $M --device cuda --no-enforce-eager --repeats 1 \
    --out $OUT/logs/capture-profile-nano.json > $OUT/logs/capture-profile.log 2>&1
  echo "capture-profile rc=$?"
  tar czf ${PACK_TO:-$OUT}/reports.tgz -C $OUT logs 2>/dev/null
fi
if [ "$what" = slow-state ]; then
  # Issue 20: catch a rate-16 round in the slow state (one round in three fell into it at c9f8878) with a per-step
  # log of the engine core (LABKIT_STEP_LOG) and py-spy on the server and its core, then say where the time went.
  # One server, rounds back to back with their own prompts (workload seed r) and arrivals (--seed r): random
  # prompts of another seed share no full block, so no round hits an earlier round's prefix cache.
  port=8401
  LABKIT_STEP_LOG=$OUT/logs/steps.jsonl python3 -m labkit serve --model $M --device cuda --port $port \
    --log-level warning > $OUT/logs/serve.log 2>&1 &
  spid=$!
  for _ in $(seq 300); do curl -sf localhost:$port/health > /dev/null && break; sleep 1; done
  for r in ${SLOW_ROUNDS:-1 2 3 4}; do
    sed "s/^seed: 0/seed: $r/" workloads/bench/nano.yaml > /tmp/nano-seed$r.yaml
    echo "round $r $(python3 -c 'import time; print(time.monotonic())')" >> $OUT/logs/rounds.txt
    PATH=$PATH:/tmp/site/bin timeout 80 py-spy record --idle --subprocesses --rate 100 --format raw --pid $spid \
      -o $OUT/logs/pyspy-r$r.txt --duration 45 > $OUT/logs/pyspy-r$r.log 2>&1 &
    pyspy=$!
    step 150 python3 -m labkit bench load --workload /tmp/nano-seed$r.yaml --rate 16 --seed $r \
      --url http://127.0.0.1:$port --out $OUT/logs/load-r$r.json
    curl -s localhost:$port/health > $OUT/logs/health-r$r.json
    wait $pyspy
  done
  kill -TERM $spid; wait $spid; echo "serve exit code $?" >> $OUT/logs/serve.log
fi
if [ "$what" = issue34 ]; then
  pack() { python3 scripts/issue34_summary.py $OUT/logs > $OUT/logs/issue34-summary.md 2>&1
    tar czf ${PACK_TO:-$OUT}/reports.tgz -C $OUT --exclude='*.jsonl' --exclude='*.npz' --exclude='*.tsv' \
      --exclude='*.perfetto.json*' logs runs 2>/dev/null; }
  mkdir -p $OUT/runs
  for i in 1 2 3 4 5 6 9; do sed "s/^seed: 0/seed: $i/" workloads/bench/nano.yaml > /tmp/nano-seed$i.yaml; done
  port=8900
  start() {  # NAME FLAGS...: a fresh server on the next port; sets $url, $spid; logs its /health time
    local name=$1; shift; port=$((port + 1)); url=http://127.0.0.1:$port
    python3 -m labkit serve --model $M --device cuda --port $port --log-level warning --log-stats-interval 0 "$@" \
      > $OUT/logs/serve-$name.log 2>&1 &
    spid=$!; local t0; t0=$(date +%s.%N)
    for _ in $(seq 600); do curl -sf $url/health > /dev/null && break; sleep 0.2; done
    echo "$name: /health after $(awk "BEGIN{print $(date +%s.%N) - $t0}") s" >> $OUT/logs/startup.txt
    # warm-up (compile caches, first graph replays) with its own prompts, before anything is counted
    step 60 python3 -m labkit bench load --workload /tmp/nano-seed9.yaml --num-requests 16 --rate inf --seed 9 \
      --url $url --no-warmup --out $OUT/logs/warm-$name.json
  }
  load() {  # NAME SEED RATE: a timed load, /metrics scraped before and after
    curl -s $url/metrics > $OUT/logs/metrics-$1-before.txt
    step 150 python3 -m labkit bench load --workload /tmp/nano-seed$2.yaml --rate $3 --seed $2 --url $url \
      --no-warmup --out $OUT/logs/load-$1.json
    curl -s $url/metrics > $OUT/logs/metrics-$1-after.txt
  }
  stop() { kill -TERM $spid; wait $spid; echo "$1 exit $?" >> $OUT/logs/startup.txt; }
  # ISSUE34_SECTIONS picks the sections and their order (default "A B C"); ISSUE34_DEADLINE (seconds from this
  # script's start) skips what would start after it, with a line in logs/startup.txt.
  due() { [ $SECONDS -lt ${ISSUE34_DEADLINE:-999999} ] || { echo "skipped (deadline): $1" >> $OUT/logs/startup.txt; return 1; }; }
  section_A() {
    # A. the streams' cost at rate inf: with (step stream + its ZeroMQ subscriber, KV events + a subscriber, a watch
    # client) against without, interleaved.
    for round in 1 2 3; do
    due A-r$round || continue
      seed=$((round + 3))
      for cond in plain streams; do
        if [ $cond = streams ]; then
          start streams-r$round --step-stream --step-stream-zmq tcp://127.0.0.1:5560 --kv-events tcp://127.0.0.1:5557
          python3 scripts/zmq_tap.py tcp://127.0.0.1:5560 tcp://127.0.0.1:5557 --seconds 60 \
            --out $OUT/logs/taps-r$round.json > $OUT/logs/taps-r$round.log 2>&1 & tap=$!
          python3 -m labkit watch $url --seconds 60 --json > $OUT/logs/watch-r$round.json 2> $OUT/logs/watch-r$round.log & w=$!
          sleep 1
        else
          start plain-r$round
        fi
        load overhead-$cond-r$round $seed inf
        [ $cond = streams ] && { kill -INT $w $tap; wait $w $tap; curl -s $url/health > $OUT/logs/health-streams-r$round.json; }
        stop $cond-r$round
      done
      pack
    done
  }
  section_B() {
    due B || return 0
    # B. trace --url over nano at rate 16 under mixed, the window in the middle of the load
    start live-mixed --policy mixed --live-trace
    load live-mixed-rate16 1 16 & lp=$!
    sleep 6
    step 200 python3 -m labkit trace --url $url --seconds 8 -q --out $OUT/runs/trace-live-mixed
    wait $lp
    stop live-mixed
    pack
  }
  section_C() {
    # C. serve's policies at the default budget, a fresh server each, the same prompts (seed 1, 2, 3 at rates 16, 32,
    # inf), with vLLM's per-iteration line for the record
    for policy in ${ISSUE34_POLICIES:-prefill_first balanced mixed}; do
    due policy-$policy || continue
      start policy-$policy --policy $policy
      load policy-$policy-rate16 1 16
      load policy-$policy-rate32 2 32
      load policy-$policy-rateinf 3 inf
      stop policy-$policy
      pack
    done
  }
  for section in ${ISSUE34_SECTIONS:-A B C}; do section_$section; done
  pack
  # (not the archive below: the per-request logs would take it past what a device call returns)
  rm -rf $OUT/logs $OUT/runs
  echo "done: $OUT/reports.tgz (logs/issue34-summary.md first)"
  exit 0
fi
if [ -f $OUT/bench-nano-hf.json ] && [ -f $OUT/bench-nano-graph.json ]; then
  step 30 python3 -m labkit bench compare $OUT/bench-nano-hf.json $OUT/bench-nano-graph.json --variable backend --out $OUT/compare-backend.json
fi
# The device returns a limited number of files: keep the reports (not the event logs and logits arrays) in one.
[ "$what" = labs ] || tar czf $OUT/reports.tgz -C $OUT logs $(cd $OUT && ls -d runs/*.json runs/*.md runs/*/*.json runs/*/*.md runs/*/*.json.gz runs/*/*/*.json runs/*/*/*.md 2>/dev/null | grep -v events) 2>/dev/null
# Then delete what this call made (files newer than its start, and the folders it left empty): nothing else.
for d in "$OUT/logs" "$OUT/runs" "$OUT/report"; do
  [ -d "$d" ] || continue
  find "$d" -type f -newer "$started" -delete
  find "$d" -depth -type d -empty -newer "$started" -delete
done
rm -f "$started"
echo "done: $OUT"
