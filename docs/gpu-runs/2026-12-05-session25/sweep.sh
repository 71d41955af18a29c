# Session 25's sweep (run from the repository root on the device; scripts/merge_in_gemv_call.sh at this commit):
# gate/up launched under attention (o_proj's PDL point at its start) and gate/up's one-row GEMV at 8 warps (108
# registers against 255: one program fits beside two of o_proj's), alone and together, against the default.
OPF=LABKIT_DECODE_O_PROJ_PDL=first; GU8=LABKIT_DECODE_GATE_UP_WARPS=8
BUDGET=${BUDGET:-545} BATCHES=${BATCHES:-"1 4"} ROUNDS=${ROUNDS:-3} PROFILES="opf:$OPF gu8:$GU8" LC_KNOBS="$OPF,$GU8" \
VARIANTS="base: opf:$OPF gu8:$GU8 both:$OPF,$GU8" bash scripts/merge_in_gemv_call.sh
cat $OUT/summary.txt
