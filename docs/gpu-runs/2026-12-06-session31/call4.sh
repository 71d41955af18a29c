#!/usr/bin/env bash
# Session 31's fourth device call (bash docs/gpu-runs/2026-12-06-session31/call4.sh): gate/up's weight stream started
# under attention (LABKIT_DECODE_O_PROJ_PDL=first: o_proj lets gate/up launch at its start) again, now that attention's
# programs can keep SMs of their own (LABKIT_DECODE_ATTN_SMEM=120), and with gate/up at 8 warps (108 registers a
# thread, so o_proj's programs fit beside two of its). Batch 1, three rounds interleaved. ~2 min. BUDGET (default 200).
set -u
cd "$(dirname "$0")/../../.."
BUDGET=${BUDGET:-200}
source scripts/call_preamble.sh
S120=LABKIT_DECODE_ATTN_SMEM=120; OPF=LABKIT_DECODE_O_PROJ_PDL=first
sweep sweep "base: opf:$OPF s120opf:$S120,$OPF s120g8opf:$S120,$OPF,LABKIT_DECODE_GATE_UP_WARPS=8" "${BATCHES:-1}" 3 9/10
echo "done @$SECONDS" >> $S
