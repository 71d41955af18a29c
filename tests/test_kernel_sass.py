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
    assert ks.main(["--variants", "bf16 fp8 fp8:fp8_dot=swap fp8:vt=1", "--out", str(out)]) == 0
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines()[2:]]
    cost = {r[0].strip(): (int(r[1]), float(r[2]), int(r[3]), int(r[5])) for r in rows}
    assert set(cost) == {"bf16", "fp8", "fp8:fp8_dot=swap", "fp8:vt=1"} and all(c[0] > 100 for c in cost.values())
    # an 8-bit K/V tile costs more instructions a byte than a 16-bit one (its values converted before the MMAs)
    assert cost["fp8"][1] > cost["bf16"][1]
    # V keys-contiguous: no byte-wise reads of V, so fewer instructions and registers, more programs an SM
    assert cost["fp8:vt=1"][1] < 0.8 * cost["fp8"][1]
    assert cost["fp8:vt=1"][2] < 0.7 * cost["fp8"][2] and cost["fp8:vt=1"][3] > cost["fp8"][3] >= 1


def test_programs_an_sm_are_bound_by_registers_shared_memory_or_warps():
    ks = _load()
    assert ks.programs_per_sm(200, 40960, 4) == 2     # 200 -> 25,600 registers a program
    assert ks.programs_per_sm(112, 40960, 4) == 4     # 14,336 a program; shared memory would allow 5
    assert ks.programs_per_sm(128, 73728, 4) == 3     # shared memory binds (72 KiB + 1 KiB a program)
    assert ks.programs_per_sm(33, 0, 4) == 12         # 33 rounds up to 40 registers
    assert ks.programs_per_sm(16, 0, 8) == 8          # 64 warps an SM
