"""The engine's kernels compiled for sm_90 by the H200's own Triton (3.6; CI installs it beside the venv's and
names it in LABKIT_DEVICE_TRITON): every launch compiles, and the e4m3 decode kernel with V keys-contiguous keeps
its registers (3.6 alone loaded that tile byte by byte until the kernel stated the tile's alignment: 254
registers, two programs an SM). What the CPU tests cannot see: they interpret the kernels, and the venv's
Triton compiles them otherwise."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .helpers import load_script, needs_sm90_tools

DIR = os.environ.get("LABKIT_DEVICE_TRITON")


def _device_triton() -> str:
    needs_sm90_tools()
    if not DIR:
        pytest.skip("LABKIT_DEVICE_TRITON not set (.ci/run sets it: pip install --target DIR triton==3.6.0)")
    assert (Path(DIR) / "triton").is_dir(), f"LABKIT_DEVICE_TRITON={DIR} holds no Triton"
    return DIR


@pytest.mark.slow
def test_every_launch_compiles_with_the_devices_triton(capsys):
    d = _device_triton()
    rc = load_script("sm90_compile").main(["--triton", d, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"] and out["triton"].startswith("3.6"), out
    assert len(out["launches"]) >= 30


@pytest.mark.slow
def test_the_devices_triton_keeps_the_keys_contiguous_decode_kernel_lean(tmp_path):
    d = _device_triton()
    md = tmp_path / "sass.md"
    assert load_script("kernel_sass").main(["--triton", d, "--variants", "fp8 fp8:vt=1", "--out", str(md)]) == 0
    rows = {r[0].strip(): r for r in (line.split("|")[1:-1] for line in md.read_text().splitlines()[2:])}
    regs, per_sm = int(rows["fp8:vt=1"][3]), int(rows["fp8:vt=1"][5])
    assert regs <= 160 and per_sm >= 3, rows["fp8:vt=1"]
    assert per_sm > int(rows["fp8"][5])
