# Session 25's sweep (run from the repository root on the device; scripts/merge_in_gemv_call.sh at this commit),
# each against the default, three rounds interleaved, batches 1 and 4:
#   opf  gate/up launched under attention (o_proj's PDL point at its start)
#   gu8  gate/up's one-row GEMV at 8 warps (108 registers against 255: one program fits beside two of o_proj's)
#   pfo  the attention kernel asks the L2 for its layer's o_proj and gate/up weights (LABKIT_DECODE_L2_PREFETCH)
#   pfd  ... and down's
OPF=LABKIT_DECODE_O_PROJ_PDL=first; GU8=LABKIT_DECODE_GATE_UP_WARPS=8; PF=LABKIT_DECODE_L2_PREFETCH
BUDGET=${BUDGET:-560} BATCHES=${BATCHES:-"1 4"} ROUNDS=${ROUNDS:-3} PROFILES=${PROFILES:-"pfd:$PF=o+gu+down"} \
LC_KNOBS="$GU8,$PF=o+gu+down" \
VARIANTS=${VARIANTS:-"base: opf:$OPF gu8:$GU8 pfo:$PF=o+gu pfd:$PF=o+gu+down"} bash scripts/merge_in_gemv_call.sh
cat $OUT/summary.txt
