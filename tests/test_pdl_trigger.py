"""Where a fused decode kernel lets its successor launch (LABKIT_DECODE_PDL), in the code the H200 runs: off CUDA
PDL is compiled out, so no interpreted test sees it. Each mode is compiled for sm_90 here (scripts/gemv_spills.py
--sass-of, the engine's launch of a one-row gate/up GEMV) and the SASS read: PREEXIT is
griddepcontrol.launch_dependents, ACQBULK griddepcontrol.wait, LDG a global load. "first" must trigger before the
weight loads (the successor's programs land while this kernel streams), "early" after the wait, "late" after
the product (its stores and exit last), and "off" neither waits nor triggers."""
from __future__ import annotations

import re

import pytest

from .helpers import load_script, needs_sm90_tools

GATE_UP = {"name": "gate/up", "M": 1, "N": 3072, "K": 1024, "s_in": 4, "residual": True, "norm": True,
           "silu": True, "partials_out": False, "split": 1}


def _sass(mode: str) -> list[str]:
    sass = load_script("gemv_spills").sass_of(GATE_UP, {"LABKIT_DECODE_PDL": mode})
    return [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)]


@pytest.mark.parametrize("mode", ["first", "early", "late", "off"])
def test_each_pdl_mode_triggers_where_it_says(mode):
    needs_sm90_tools()
    ops = _sass(mode)
    if mode == "off":
        assert "PREEXIT" not in ops and "ACQBULK" not in ops
        return
    assert ops.count("PREEXIT") == 1 and ops.count("ACQBULK") == 1, (ops.count("PREEXIT"), ops.count("ACQBULK"))
    trigger, wait = ops.index("PREEXIT"), ops.index("ACQBULK")
    loads = [i for i, op in enumerate(ops) if op.startswith("LDG")]
    assert loads[0] < wait  # the weight tile is loaded before the wait in every mode
    after_wait = [i for i in loads if i > wait]
    assert after_wait  # (the partials and the residual: the previous kernels' outputs)
    if mode == "first":
        assert trigger < loads[0]
    elif mode == "early":
        assert wait < trigger < after_wait[0]
    else:  # late: after every load
        assert trigger > loads[-1]
