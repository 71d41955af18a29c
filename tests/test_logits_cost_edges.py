"""The cost of an FP8 KV cache (labkit/logits/cost.py) at its edges, on synthetic collections whose distances are
exact binary fractions. Truth rows [4, 0, 0, 0] (4 rows: pooled norm 8); a side d off in logit 1 of every row has
pooled rel-L2 2d / 8 = d / 4 to the truth. The rule, from cost.py's docstring: the reference cost is the FP8
reference's distance over the plain reference's (floored at the dtype's floor, bf16 2e-3); where it is under
DISCERNIBLE (2x) the quantised check is n/a and judges nothing; otherwise the FP8 engine passes when its distance is
at least the geometric mean of the two references' distances."""
from __future__ import annotations

import math

import numpy as np
import pytest

from labkit.logits import compare as cmp
from labkit.logits.collect import Collection

TRUTH = np.array([[4.0, 0, 0, 0]] * 4)
BF16_FLOOR_REL_L2 = 2e-3   # gates.FLOORS["bfloat16"]["rel_l2"], written out
DISCERNIBLE = 2.0


def _col(offset: float, dtype: str, backend: str, kv: str = "auto") -> Collection:
    logits = TRUTH.copy()
    logits[:, 1] = offset
    rows = [{"index": i, "request_id": "R", "output_index": i, "case": "edge", "context_len": i + 1}
            for i in range(len(logits))]
    return Collection({"suite": {"name": "edge"}, "model_files": {}, "token_path_sha256": "p", "rows": rows,
                       "dtype": dtype, "backend": backend, "kv_cache_dtype": kv},
                      {"logits": logits.astype(np.float32)})


def _cost(lhs: float, baseline: float, reference: float, baseline_reference: float) -> dict:
    """compare() of an FP8 bf16 engine `lhs` off, its model-dtype pool `baseline` off, the FP8 reference and the
    plain reference; returns the result (its kv_cost section is the cost)."""
    return cmp.compare(_col(lhs, "bfloat16", "engine", "fp8"), _col(0.0, "float32", "hf"),
                       reference=_col(reference, "bfloat16", "hf", "fp8"),
                       baseline=_col(baseline, "bfloat16", "engine"),
                       baseline_reference=_col(baseline_reference, "bfloat16", "hf"))


def test_a_reference_cost_of_exactly_discernible_is_judged():
    # FP8 reference 1.0 off (0.25), plain 0.5 off (0.125): reference cost exactly 2.0 = DISCERNIBLE: judged.
    res = _cost(lhs=1.0, baseline=0.5, reference=1.0, baseline_reference=0.5)
    c = res["kv_cost"]
    assert c["reference_ratio"] == DISCERNIBLE
    assert c["quantised"]["status"] == "PASS"
    assert c["quantised"]["bound"] == pytest.approx(math.sqrt(0.25 * 0.125))
    assert c["ratio"] == 2.0   # the engine's cost: 0.25 / 0.125


def test_an_fp8_engine_exactly_at_the_geometric_mean_passes():
    # FP8 reference 2 off (0.5), plain 0.5 off (0.125): bound sqrt(0.5 * 0.125) = 0.25; the engine 1 off: 0.25.
    res = _cost(lhs=1.0, baseline=0.5, reference=2.0, baseline_reference=0.5)
    q = res["kv_cost"]["quantised"]
    assert q["bound"] == 0.25 and res["kv_cost"]["rel_l2"]["fp8"] == 0.25
    assert q["status"] == "PASS"
    # A hair nearer the truth than the bound: not the FP8 arithmetic.
    below = _cost(lhs=0.99, baseline=0.5, reference=2.0, baseline_reference=0.5)
    assert below["kv_cost"]["quantised"]["status"] == "FAIL" and below["verdict"] == "FAIL"


def test_an_indiscernible_fp8_cost_judges_nothing_and_the_baseline_decides():
    # Both references equally far: reference cost 1 (< 2): n/a, and the cost's status is the baseline's (PASS).
    res = _cost(lhs=0.5, baseline=0.5, reference=0.5, baseline_reference=0.5)
    c = res["kv_cost"]
    assert c["quantised"]["status"] == "n/a" and c["quantised"]["bound"] is None
    assert c["baseline"]["verdict"] == "PASS"
    assert c["status"] == "PASS"
    assert res["verdict"] == "PASS"


def test_a_plain_reference_nearer_than_the_floor_is_floored():
    # Plain reference 0.002 off: 0.0005 to the truth, under the bf16 floor 2e-3, which replaces it.
    # FP8 reference 0.016 off: 0.004; reference cost 0.004 / 2e-3 = 2 (the raw distance would give 8).
    res = _cost(lhs=0.016, baseline=0.002, reference=0.016, baseline_reference=0.002)
    c = res["kv_cost"]
    assert c["rel_l2"]["reference_plain"] == pytest.approx(0.0005, rel=1e-6)
    assert c["reference_ratio"] == pytest.approx(0.004 / BF16_FLOOR_REL_L2, rel=1e-6)
