#!/usr/bin/env bash
# Issue 32's device calls (one H200). Each mode writes logs and JSON under $OUT/r and packs them into $OUT/r.tgz.
#   probe:  the kernel tests on the GPU (fused decode, FP8 KV, Triton kernels), batch-1 with the fused decode
#           kernels under each PDL mode and without them (interleaved), their profiles, offline nano bf16 and fp8,
#           the FP8 decode-attention knob sweep, and the budget cliff (scripts/budget_cliff.py).
#   probe3: the FP8 decode knobs (tile, stages, warps, splits) and batch-1 profiles with their traces.
#   probe2: the same after the first round of fixes (fused and unfused batch-1 only, no profile traces kept).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
R=${OUT:-/tmp/out}/r
mkdir -p "$R"
export RUNS_DIR=$R/runs
M=/tmp/qwen3-fake
trap 'tar czf "${OUT:-/tmp/out}/r.tgz" -C "$R" . 2>/dev/null' EXIT
st() { local t=$1 name=$2; shift 2; local s=$SECONDS; timeout "$t" "$@" > "$R/$name.log" 2>&1; echo "rc=$? ${SECONDS}-${s}s $name"; }
B="python3 -m labkit bench --model $M --device cuda"
[ -f $M/config.json ] || st 120 fake python3 -m labkit model fake --preset qwen3-0.6b --out $M
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$R/gpu.txt" 2>&1
mode=${1:-probe}
if [ "$mode" = probe3 ]; then
  st 200 sweep python3 scripts/fp8_decode_sweep.py --out $R/sweep.json
  st 120 prof-fused $B --workload batch1 --repeats 1 --profile --out $R/prof-fused.json
  st 120 prof-unfused $B --workload batch1 --repeats 1 --no-fused-decode --profile --out $R/prof-unfused.json
fi
if [ "$mode" = probe2 ]; then
  st 240 pytest python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_fused_decode.py tests/test_fp8_kv.py tests/test_triton_kernels.py
  for round in 1 2; do
    st 90 b1-unfused-$round $B --workload batch1 --no-fused-decode --out $R/b1-unfused-$round.json
    st 90 b1-fused-$round $B --workload batch1 --out $R/b1-fused-$round.json
  done
  st 120 prof-fused $B --workload batch1 --repeats 1 --profile --out $R/prof-fused.json
  st 150 nano-bf16 $B --workload nano --graph --repeats 3 --out $R/nano-bf16.json
  st 150 nano-fp8 $B --workload nano --graph --repeats 3 --kv-cache-dtype fp8 --out $R/nano-fp8.json
  st 60 sweep python3 scripts/fp8_decode_sweep.py --out $R/sweep.json
  st 200 cliff python3 scripts/budget_cliff.py --model $M --budgets 2048,8192 --out $R/cliff.json
  rm -f $R/*.trace.json
fi
if [ "$mode" = probe ]; then
  st 240 pytest python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_fused_decode.py tests/test_fp8_kv.py tests/test_triton_kernels.py
  for round in 1 2; do
    st 90 b1-unfused-$round $B --workload batch1 --no-fused-decode --out $R/b1-unfused-$round.json
    LABKIT_DECODE_PDL=early st 90 b1-early-$round $B --workload batch1 --out $R/b1-early-$round.json
    if [ $round = 1 ]; then
      LABKIT_DECODE_PDL=late st 90 b1-late-$round $B --workload batch1 --out $R/b1-late-$round.json
      LABKIT_DECODE_PDL=off st 90 b1-off-$round $B --workload batch1 --out $R/b1-off-$round.json
    fi
  done
  st 120 prof-unfused $B --workload batch1 --repeats 1 --no-fused-decode --profile --out $R/prof-unfused.json
  st 120 prof-fused $B --workload batch1 --repeats 1 --profile --out $R/prof-fused.json
  st 150 nano-bf16 $B --workload nano --graph --repeats 3 --out $R/nano-bf16.json
  st 150 nano-fp8 $B --workload nano --graph --repeats 3 --kv-cache-dtype fp8 --out $R/nano-fp8.json
  st 60 sweep python3 scripts/fp8_decode_sweep.py --out $R/sweep.json
  st 240 cliff python3 scripts/budget_cliff.py --model $M --out $R/cliff.json
  python3 - "$R" <<'PY' > "$R/summary.txt" 2>&1
import json, glob, os, sys
r = sys.argv[1]
for f in sorted(glob.glob(os.path.join(r, "*.json"))):
    try:
        d = json.load(open(f))
    except Exception as e:
        print(os.path.basename(f), "unreadable", e); continue
    if not isinstance(d, dict): continue
    med = d.get("median") or {}
    prof = (d.get("profile") or {})
    print(os.path.basename(f), {k: med.get(k) for k in ("decode_ms_per_token", "output_tok_s") if k in med},
          "kv_blocks", d.get("kv_blocks"), "profile kernels", (prof.get("table") or {}).get("kernels") if isinstance(prof, dict) else None)
PY
  cat "$R/summary.txt"
fi
