# Session 30, call 1: batch 1's four GEMVs a layer in one persistent kernel against one kernel a phase
# (scripts/persistent_chain.py), and the engine's own chain of the four fused GEMVs (scripts/gemv_bench.py) beside
# it. Run from the repository root on the device: bash docs/gpu-runs/2026-12-06-session30/call.sh
. scripts/call_preamble.sh
timeout $(( BUDGET - SECONDS - 120 )) python3 scripts/persistent_chain.py --rounds 5 --out $W/chain.json \
  > $W/logs/chain.log 2>&1
echo "rc=$? @$SECONDS persistent_chain" >> $S; cat $W/chain.md >> $S 2>/dev/null
timeout $(( BUDGET - SECONDS - 20 )) python3 scripts/gemv_bench.py --out $W/gemv.json > $W/logs/gemv.log 2>&1
echo "rc=$? @$SECONDS gemv_bench" >> $S; cat $W/gemv.md >> $S 2>/dev/null
tail -5 $W/logs/chain.log >> $S
