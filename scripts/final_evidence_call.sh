#!/usr/bin/env bash
# Issue 32's evidence at a final commit, in one device call on one H200 with the fake Qwen3-0.6B in bf16 (~7-8
# minutes; DEVICE=cpu FAKE_MODEL=DIR runs the plumbing on the CPU, as its test does):
#   tests     the fused decode's and the Gumbel sampler's tests on the device
#   evidence  scripts/gpu_session.sh evidence (doctor, smoke, every trace case, the baseline/graph/kv/mixed logits
#             suites, the mixed-policy cases through their graphs), then the fp8-kv suite (graph)
#   nano      `bench --workload nano --repeats 3`, bf16 then FP8 KV
#   batch     `bench --workload batch1`, its profile (kernels a token), then batches 4 and 16 (batch1_sweep.sh)
#   hf        scripts/hf_batch1.py: Transformers' batch-1 decode, static cache, compiled (the reference)
#   serve     (session 17) `bench load --workload nano`: one --kv-cache-dtype fp8 server loaded twice at rate inf
#             (cold, then with its prefix cache warm, as offline repeats 1-2 are), each against the offline FP8
#             median (the nano section's) and its repeat 0; then (SERVE_MIXED=0: not) --scheduling-policy mixed at
#             rates 16 and 32 on a fresh server each (ITL p99 over tpot median). Needs the serving wheels on
#             PYTHONPATH (/tmp/site) (~3 minutes)
# SECTIONS (default "tests evidence nano batch hf"); WORK: where it makes a new folder (default /tmp). Back:
# $OUT/call.tgz (logs, JSON and Markdown; no logits arrays or traces) and $OUT/summary.txt (each step's exit code
# and the figures).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
# A new folder every run: session 17's call 3 archived session 16's batch-1 and Transformers files beside its own
# (the device had kept its working folder), though only this run's lines reach the summary.
S=$OUT/summary.txt; mkdir -p ${WORK:-/tmp}; W=$(mktemp -d ${WORK:-/tmp}/final-evidence.XXXXXX); mkdir -p $W/logs
M=${FAKE_MODEL:-/tmp/qwen3-fake}; D=${DEVICE:-cuda}
pack() {
  # (evidence/reports.tgz: gpu_session.sh's own logs, one a step; session 26 lost a failed step's log without it)
  (cd $W && find . -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \
     -o -name reports.tgz \) ! -name '*.trace.json' ! -name '*perfetto*' -size -5M -print0 | tar czf $OUT/call.tgz --null -T -)
}
trap pack EXIT
[ -f $M/config.json ] || python3 -m labkit model fake --preset qwen3-0.6b --out $M > /dev/null
med() { python3 -c "import json,sys;print(round(json.load(open(sys.argv[1]))['median'][sys.argv[2]], 4))" "$1" "$2" 2>/dev/null; }
for section in ${SECTIONS:-tests evidence nano batch hf}; do
  case $section in
    tests)
      timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_fused_decode.py tests/test_gumbel_sampler.py \
        > $W/logs/tests.log 2>&1
      echo "rc=$? @$SECONDS tests: $(tail -1 $W/logs/tests.log)" >> $S ;;
    evidence)
      OUT=$W/evidence FAKE_MODEL=$M timeout ${EVIDENCE_TIMEOUT:-300} bash scripts/gpu_session.sh evidence \
        > $W/logs/evidence.log 2>&1
      echo "rc=$? @$SECONDS evidence: $(grep -c '^rc=0 ' $W/logs/evidence.log) steps rc=0, $(grep -c '^rc=[1-9]' \
        $W/logs/evidence.log) not" >> $S
      grep '^rc=[1-9]' $W/logs/evidence.log >> $S
      timeout 300 python3 -m labkit logits-check run --suite fp8-kv --attention-backend triton --execution graph \
        --device $D --dtype bfloat16 --model $M --out $W/evidence/runs/lc-fp8-kv > $W/logs/lc-fp8-kv.log 2>&1
      echo "rc=$? @$SECONDS logits-check fp8-kv: $(grep -m1 -o 'VERDICT: [A-Z]*' $W/logs/lc-fp8-kv.log);\
 $(grep -m1 -o 'worst ratio [0-9.]*x' $W/logs/lc-fp8-kv.log)" >> $S ;;
    nano)
      for kv in auto fp8; do
        timeout 200 python3 -m labkit bench --model $M --device $D ${NANO_BENCH:---workload nano --repeats 3} \
          --kv-cache-dtype $kv --out $W/nano-$kv.json > $W/logs/nano-$kv.log 2>&1
        echo "rc=$? @$SECONDS nano kv $kv: $(med $W/nano-$kv.json output_throughput) tok/s (median)" >> $S
      done ;;
    batch)
      timeout 120 python3 -m labkit bench --workload batch1 --model $M --device $D --out $W/batch1.json \
        > $W/logs/batch1.log 2>&1
      echo "rc=$? @$SECONDS batch1: $(med $W/batch1.json decode_ms_per_token) ms a token" >> $S
      timeout 120 python3 -m labkit bench --workload batch1 --model $M --device $D --repeats 3 --profile \
        --profile-steps 64 --out $W/batch1-profile.json > $W/logs/batch1-profile.log 2>&1
      echo "rc=$? @$SECONDS batch1 profile: $(grep -m1 -o '[0-9.,]* kernels per token' $W/logs/batch1-profile.log)" >> $S
      OUT=$W/sweep VARIANTS="base:" BATCHES=${BATCHES:-"4 16"} ROUNDS=1 DEVICE=$D FAKE_MODEL=$M \
        bash scripts/batch1_sweep.sh > $W/logs/sweep.log 2>&1
      cat $W/sweep/summary.md >> $S 2>/dev/null ;;
    hf)
      timeout ${HF_TIMEOUT:-240} python3 scripts/hf_batch1.py --model $M --device $D --repeats 3 ${HF_ARGS:-} \
        --out $W/hf-batch1.json > $W/logs/hf-batch1.log 2>&1
      echo "rc=$? @$SECONDS Transformers batch1: $(python3 -c "import json,sys; r = json.load(open(sys.argv[1])); \
print(round(r['decode_ms_per_token'], 4), 'ms a token, cache', r['cache'], 'compiled' if r['compiled'] else 'eager')" \
        $W/hf-batch1.json 2>/dev/null)" >> $S ;;
    serve)
      # Issue 32's serving bars: FP8 at rate inf against its offline median (the nano section's, when it ran in
      # this call), and mixed's ITL p99 against its tpot median at rates 16 and 32; a fresh server each load.
      LOAD="python3 -m labkit bench load --model $M --device $D --workload ${LOAD_WORKLOAD:-nano}"
      [ -f $W/nano-fp8.json ] || { timeout 200 python3 -m labkit bench --model $M --device $D \
        ${NANO_BENCH:---workload nano --repeats 3} --kv-cache-dtype fp8 --out $W/nano-fp8.json > $W/logs/nano-fp8.log 2>&1
        echo "rc=$? @$SECONDS nano kv fp8: $(med $W/nano-fp8.json output_throughput) tok/s (median)" >> $S; }
      # Offline repeats after the first find their prompts in the prefix cache; so does a server's second load of
      # the same prompts: one FP8 server, the nano load twice (cold, then warm), each against the offline median
      # and against offline repeat 0 (cold).
      python3 -m labkit serve --model $M --device $D --kv-cache-dtype fp8 --port 8311 --log-level warning \
        > $W/logs/serve-fp8.log 2>&1 & spid=$!
      for _ in $(seq 240); do curl -sf localhost:8311/health > /dev/null && break; sleep 1; done
      for r in 1 2; do
        timeout 200 python3 -m labkit bench load --workload ${LOAD_WORKLOAD:-nano} --url http://127.0.0.1:8311 \
          --rate inf --out $W/load-fp8-inf-$r.json \
          > $W/logs/load-fp8-inf-$r.log 2>&1
        echo "rc=$? @$SECONDS serve fp8 at rate inf, load $r on one server: $(python3 -c "import json,sys
a = json.load(open(sys.argv[1]))['metrics']['output_throughput']; o = json.load(open(sys.argv[2]))
b, c = o['median']['output_throughput'], o['runs'][0]['output_throughput']
print(f'{a:.0f} tok/s, {a / b:.1%} of offline {b:.0f} (median), {a / c:.1%} of offline repeat 0 {c:.0f}')" \
          $W/load-fp8-inf-$r.json $W/nano-fp8.json 2>/dev/null)" >> $S
      done
      kill -TERM $spid; wait $spid
      [ "${SERVE_MIXED:-1}" = 1 ] || continue
      for rate in 16 32; do
        timeout 200 $LOAD --rate $rate --scheduling-policy mixed --seed $rate --out $W/load-mixed-r$rate.json \
          > $W/logs/load-mixed-r$rate.log 2>&1
        echo "rc=$? @$SECONDS serve mixed at rate $rate: $(python3 -c "import json,sys
m = json.load(open(sys.argv[1]))['metrics']; i, t = m['itl_ms']['p99'], m['tpot_ms']['median']
print(f'ITL p99 {i:.2f} ms, tpot median {t:.2f} ms: {i / t:.2f}x; {m[\"failed\"]} failed')" $W/load-mixed-r$rate.json \
          2>/dev/null)" >> $S
      done ;;
    *) echo "final_evidence_call.sh: unknown section $section" >> $S ;;
  esac
done
echo "done @$SECONDS" >> $S
