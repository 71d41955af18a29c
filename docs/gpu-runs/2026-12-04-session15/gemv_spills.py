"""Spill loads/stores of the fused GEMV (engine/kernels/decode_layer.py) compiled for sm_90 here, by K_CHUNK
(session 15, docs/perf.md). Run without TRITON_INTERPRET: env -u TRITON_INTERPRET python gemv_spills.py"""
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.kernels.decode_layer import _gemv_kernel


def sass(silu, k_chunk, norm_chunk=128, warps=8, s_in=2):
    sig = {"w_ptr": "*bf16", "x_ptr": "*bf16", "part_ptr": "*fp32", "res_ptr": "*bf16", "res_out_ptr": "*bf16",
           "nw_ptr": "*bf16", "y_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "KS": "i32",
           "stride_wn": "i32", "stride_xm": "i32", "up_rows": "i32", "eps": "fp32"}
    consts = dict(S_IN=s_in, RESIDUAL=True, NORM=True, SILU=silu, PARTIALS=False, EVEN=True, FULL_EVEN=True,
                  BLOCK_M=16, BLOCK_N=16, BLOCK_K=1024, K_FULL=1024, USE_PDL=True, EARLY=True,
                  DOT_PRECISION="tf32", NORM_CHUNK=norm_chunk, K_CHUNK=k_chunk)
    sig.update({k: "constexpr" for k in consts})
    names = list(sig)
    aligned = ["w_ptr", "x_ptr", "part_ptr", "res_ptr", "res_out_ptr", "nw_ptr", "y_ptr", "K", "KS", "stride_wn",
               "stride_xm", "up_rows", "N"]
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = ASTSource(_gemv_kernel, sig, constexprs=consts, attrs=attrs)
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 2})
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "k.cubin"
        p.write_bytes(c.asm["cubin"])
        out = subprocess.run([str(tool), "-sass", str(p)], capture_output=True, text=True, check=True).stdout
    return out, c.metadata

if __name__ == "__main__":
  for silu in (False, True):
    for kc in (0, 64, 128, 256):
        out, md = sass(silu, kc)
        ldl, stl = len(re.findall(r"\bLDL", out)), len(re.findall(r"\bSTL", out))
        print(f"{'gate/up' if silu else 'q/k/v'} K_CHUNK={kc}: spill loads {ldl} stores {stl}", flush=True)
