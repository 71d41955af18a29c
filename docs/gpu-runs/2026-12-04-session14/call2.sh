#!/usr/bin/env bash
# Session 14, device call 2 (call 1's machine, at once): call 1 found the batch-1 GEMV faster at 4 warps than 8
# (0.744 against 0.839 ms a token); this sweep asks how far that goes and whether it holds at batch 16:
# GEMV programs of 16 rows x 4 and x 2 warps, 32 x 4, 64 x 4, and 16 x 4 with session 13's split64 attention,
# at batches 1 and 16, 3 interleaved rounds under a 420 s deadline (one round fitted: g16x2 and g64x4 take 11-13 ms
# a token at batch 1, their tiles spilling). Prediction: 16 x 2 near 16 x 4; 4 warps at batch 16 within 5% of 8.
# Both wrong: 2 warps spill (13x slower), and at batch 16 4 warps are 6.8x slower than 8 (the tensor-core tile).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=$OUT/b1s2 BATCHES="1 16" ROUNDS=3 DEADLINE=420 \
  VARIANTS="base: g16x4:LABKIT_DECODE_GEMV=16,4 g16x2:LABKIT_DECODE_GEMV=16,2 g32x4:LABKIT_DECODE_GEMV=32,4 g64x4:LABKIT_DECODE_GEMV=64,4 g16x4s64:LABKIT_DECODE_GEMV=16,4,LABKIT_DECODE_SHORT_CONTEXT=0,LABKIT_DECODE_MERGE_PDL=1,LABKIT_DECODE_BLOCK_N=64" \
  bash scripts/batch1_sweep.sh
