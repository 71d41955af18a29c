"""One decode-attention launch to put under Nsight Compute: the nano-mix batch (256 contexts, mean 809) over one
layer's pool, warmed up, then launched once more. What ncu says of it (achieved occupancy, DRAM throughput, where
warps stall) tells what bounds the kernel, which timing variants alone could not (docs/perf.md, sessions 13-18).

    ncu --clock-control none -k regex:_decode_split --launch-skip 3 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \\
        python3 scripts/decode_ncu.py --pool fp8 --layout v-keys-contiguous
    python scripts/decode_ncu.py --dry-run      # CPU: tiny shapes in Triton's interpreter (the script's test)

--pool bf16|fp8; --layout rows (head_dim contiguous, the default) or v-keys-contiguous (LABKIT_FP8_V_TRANSPOSED's
V). Four launches in all (three warm-up, the one to profile); prints the max error against the torch reference
and exits 1 when it is past the kernel bench's tolerance, 2 when there is no GPU and no --dry-run.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pool", choices=["bf16", "fp8"], default="fp8")
    ap.add_argument("--layout", choices=["rows", "v-keys-contiguous"], default="rows")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from engine.kernels.interpreter import script_device

    device = script_device(args.dry_run)
    if device is None:
        print("decode_ncu: no CUDA device (use --dry-run on the CPU)", file=sys.stderr)
        return 2
    import torch

    from engine.backends import torch_ref
    from engine.kernels.decode_attention import num_splits_for, paged_decode
    sys.path.insert(0, str(REPO / "scripts"))
    import kernel_bench as kb

    geo = kb.geometry(args.dry_run)
    lengths = geo["shapes"]["3 mixed" if args.dry_run else "256 nano-mix"]
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    inp = kb.decode_inputs(torch, geo, lengths, dtype, device, fp8=args.pool == "fp8")
    k, v = inp["k"], inp["v"]
    if args.layout == "v-keys-contiguous":
        v = v.transpose(-1, -2).contiguous().transpose(-1, -2)
    scale = geo["head_dim"] ** -0.5
    splits = num_splits_for(len(lengths), geo["kv_heads"], max(lengths), 132)
    block_n = 32 if args.dry_run else None  # (whole pages of the dry run's 64-token blocks)
    for _ in range(4):
        out = paged_decode(inp["q"], k, v, inp["tables"], inp["lens"], scale, splits, block_n=block_n)
    if device == "cuda":
        torch.cuda.synchronize()
    ref = torch_ref.decode(inp["q"], inp["k"], inp["v"], inp["ctx"], scale).float()
    err = (out.float() - ref).abs().max().item()
    print(f"decode_ncu: {args.pool} pool, {args.layout}, {len(lengths)} contexts (mean "
          f"{sum(lengths) / len(lengths):.0f}), {splits} split(s): max abs error {err:.2e}")
    return 0 if err <= kb.DECODE_TOL else 1


if __name__ == "__main__":
    sys.exit(main())
