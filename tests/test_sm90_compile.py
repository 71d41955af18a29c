"""scripts/sm90_compile.py: every Triton kernel a step launches, recorded on the CPU and compiled for sm_90 here,
with this Triton and with the H200's (3.6): the interpreter the CPU tests use never compiles a kernel, and
session 16 lost a device call to a kernel that Triton 3.9 compiles and 3.6 does not."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import load_script, needs_sm90_tools

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "sm90_compile.py"
DEVICE_TRITON = "3.6.0"  # the H200's (the device tool's README)
KERNELS = {"_gemv_kernel", "_qkv_attention_kernel", "_decode_merge_kernel", "_partials_norm_kernel",  # fused decode
           "_store_kv_kernel", "_prefill_kernel", "_decode_split_kernel",  # the Triton attention backend
           "_rms_norm_kernel", "_silu_and_mul_kernel", "_qk_norm_rope_kernel", "_small_gemm_kernel",
           "_gumbel_chunk_kernel", "_pick_chunk_kernel"}


def _load():
    return load_script("sm90_compile")


def test_every_launch_of_a_step_compiles_for_sm90(capsys):
    needs_sm90_tools()
    rc = _load().main(["--json"])
    out = json.loads(capsys.readouterr().out)
    assert {r["kernel"] for r in out["launches"]} == KERNELS
    assert len(out["launches"]) >= 20  # (one split and three, bf16 and FP8 pools: variants of several)
    assert rc == 0 and out["ok"], [r for r in out["launches"] if not r["ok"]]


def test_a_launch_that_does_not_compile_is_named_with_its_error(tmp_path):
    needs_sm90_tools()
    sm = _load()
    launch = {"kernel": "_partials_norm_kernel", "module": "engine.kernels.decode_layer",
              "sig": {"part_ptr": "*fp32", "res_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "M": "i32",
                      "K": "i32", "eps": "fp32"},
              "constexprs": {"S_IN": 2, "BLOCK": 100, "USE_PDL": True},  # tl.arange needs a power of two
              "options": {"num_warps": 4}}
    path = tmp_path / "launches.json"
    path.write_text(json.dumps([launch, {**launch, "constexprs": {**launch["constexprs"], "BLOCK": 128}}]))
    bad, good, version = json.loads(sm._run("--compile", str(path), interpret=False))
    assert not bad["ok"] and "power of 2" in bad["error"] and good["ok"] and version["triton"]


def test_a_launchs_ptx_fingerprint_follows_its_code_not_its_source_lines(tmp_path):
    """--json's "ptx": equal for the same kernel compiled twice, different for other constexprs (other code), and
    blind to the source locations that move with every edit of a kernel's file."""
    needs_sm90_tools()
    sm = _load()
    launch = {"kernel": "_partials_norm_kernel", "module": "engine.kernels.decode_layer",
              "sig": {"part_ptr": "*fp32", "res_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "M": "i32",
                      "K": "i32", "eps": "fp32"},
              "constexprs": {"S_IN": 2, "BLOCK": 128, "USE_PDL": True}, "options": {"num_warps": 4}}
    other = {**launch, "constexprs": {**launch["constexprs"], "S_IN": 3}}
    path = tmp_path / "launches.json"
    path.write_text(json.dumps([launch, launch, other]))
    a, b, c, _ = json.loads(sm._run("--compile", str(path), interpret=False))
    assert a["ok"] and a["ptx"] == b["ptx"] != c["ptx"] and a["constexprs"] == launch["constexprs"]
    ptx = "\n".join([".version 8.7", ".file 1 \"decode_layer.py\"", "\tld.global.b32 %r1, [%rd1];",
                     "\t.loc 1 310 5", "$L__tmp1:", "\tadd.f32 %f1, %f2, %f3;"])
    moved = ptx.replace(".loc 1 310 5", ".loc 1 312 5").replace("decode_layer.py", "x.py").replace(
        "$L__tmp1:\n\tadd.f32 %f1, %f2, %f3;", "\tadd.f32 %f1, %f2, %f3;\n$L__tmp2:")
    assert sm.ptx_fingerprint(ptx) == sm.ptx_fingerprint(moved) != sm.ptx_fingerprint(ptx.replace("add", "sub"))


@pytest.mark.slow
def test_every_launch_compiles_with_the_devices_triton(tmp_path_factory):
    """Triton 3.6 (the H200's) installed into a folder of its own: the same launches must compile there."""
    needs_sm90_tools()
    target = tmp_path_factory.mktemp("triton36")
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                          f"triton=={DEVICE_TRITON}"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    res = subprocess.run([sys.executable, str(SCRIPT), "--json", "--triton", str(target)], capture_output=True,
                         text=True, timeout=900)
    out = json.loads(res.stdout)
    assert out["triton"] == DEVICE_TRITON
    assert res.returncode == 0 and out["ok"], [r for r in out["launches"] if not r["ok"]]
