"""scripts/kernel_sass.py: the decode kernel compiled for sm_90 here (no GPU), its main loop found and counted."""
from __future__ import annotations

from .helpers import load_script, needs_sm90_tools


def _load():
    return load_script("kernel_sass")


SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_CTAID.X ;
.L_x_1:
        /*0020*/                   LDS R2, [R3] ;
        /*0030*/               @P0 IMAD R4, R2, R2, RZ ;
        /*0040*/                   HMMA.16816.F32 R8, R4, R6, R8 ;
        /*0050*/               @!P1 BRA `(.L_x_1) ;
        /*0060*/                   STG.E [R10], R8 ;
.L_x_2:
        /*0070*/                   NOP ;
        /*0080*/                   BRA 0x70 ;
"""


def test_the_main_loop_is_the_longest_branch_back():
    ks = _load()
    loop = ks.main_loop(SASS.replace("`(.L_x_1)", "0x20"))
    assert [t.split()[0] for t in loop] == ["LDS", "IMAD", "HMMA.16816.F32", "BRA"]
    assert ks.main_loop("/*0000*/ EXIT ;") == []


def test_a_bad_variant_is_refused(capsys):
    ks = _load()
    assert ks.main(["--variants", "fp8:depth=3"]) == 2
    assert "unknown key 'depth'" in capsys.readouterr().err
    assert ks.main(["--variants", "fp16"]) == 2


def test_the_decode_kernel_compiles_for_sm90_and_its_loop_is_counted(tmp_path):
    needs_sm90_tools()
    ks = _load()
    out = tmp_path / "sass.md"
    assert ks.main(["--variants", "bf16 fp8 fp8:fp8_dot=swap", "--out", str(out)]) == 0
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines()[2:]]
    cost = {r[0].strip(): (int(r[1]), float(r[2])) for r in rows}
    assert set(cost) == {"bf16", "fp8", "fp8:fp8_dot=swap"} and all(n > 100 for n, _ in cost.values())
    # an 8-bit K/V tile costs more instructions a byte than a 16-bit one (its values converted before the MMAs)
    assert cost["fp8"][1] > cost["bf16"][1]
