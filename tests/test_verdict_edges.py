"""The verdicts' bookkeeping at its edges: which side, row, reason and count a logits-check verdict names, and
what `bench compare`'s interval and samples are made of.

Synthetic collections of four logits per row (as tests/test_judges_at_edges.py builds them): every distance is
chosen so that the right figure and the plausible wrong one are far apart.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from labkit.bench import compare as bench
from labkit.logits import compare as cmp

from .test_bench_compare import _load_result, _synthetic
from .test_judges_at_edges import REFERENCE, TRUTH, _col, _with_kv

# Truth rows [4, 0, 0, 0]; the bf16 reference is 0.5 off in logit 1: noise rel-L2 0.125, max-abs 0.5 per row
# (test_judges_at_edges' collections).


def _off(offsets, logit=1) -> np.ndarray:
    x = TRUTH.copy()
    x[:, logit] = offsets
    return x


def _anchored(x, dtype="bfloat16", truth=TRUTH, reference=REFERENCE) -> dict:
    ref = {} if reference is None else {"reference": _col(reference, backend="hf")}
    return cmp.compare(_col(x, dtype), _col(truth, "float32", "hf"), **ref)


def _two_sided(lhs, rhs) -> dict:
    """lhs and rhs (bf16 engines) both judged against the float32 truth, with the bf16 reference."""
    return cmp.compare(_col(lhs), _col(rhs), truth=_col(TRUTH, "float32", "hf"),
                       reference=_col(REFERENCE, backend="hf"))


# --- one judged side --------------------------------------------------------------------------------------


def test_a_review_row_on_a_near_tie_keeps_its_review_reason():
    """Truth [4, 3, 0, 0], reference 0.5 off in logit 2 (a flip needs a margin over 2 x 0.5 = 1.0 to fail): the
    path swaps the top two (max|diff| 1, rel-L2 sqrt(2)/5 against the noise 0.1: ratio 2.83, a REVIEW). The
    flip is a near tie, but the row is REVIEW for its distance, and its reason says so."""
    t = np.array([[4.0, 3.0, 0, 0]])
    ref = t + np.array([0, 0, 0.5, 0])
    result = _anchored(np.array([[3.0, 4.0, 0, 0]]), truth=t, reference=ref)
    row = result["rows"][0]
    lhs = row["to_truth"]["lhs"]
    assert lhs["ratio"] == pytest.approx(2 * math.sqrt(2), rel=1e-6) and lhs["near_tie_flip"]
    assert row["status"] == "REVIEW" and result["verdict"] == "REVIEW"
    assert "above 2.5x, within 5x" in row["reason"] and "not judged" not in row["reason"]
    assert "above 2.5x" in result["summary"]["first_review"]


def test_a_non_finite_row_is_a_failure_not_a_near_tie_flip():
    """Truth [4, 3.5, 0, 0] (margin 0.5, a near tie for noise 0.5); the path's logit 0 is NaN, so its top-1 is
    logit 1: the row fails as non-finite and is not counted among the flips rounding can explain."""
    t = np.tile([4.0, 3.5, 0, 0], (2, 1))
    x = t.copy()
    x[0, 0] = np.nan
    result = _anchored(x, truth=t, reference=t + np.array([0, 0, 0.5, 0]))
    row = result["rows"][0]
    assert row["status"] == "FAIL" and row["reason"] == "non-finite logits"
    assert row["to_truth"]["lhs"]["near_tie_flip"] is False
    assert result["summary"]["near_tie_flips"] == 0


def test_a_non_finite_truth_row_fails_the_row():
    """A NaN in the truth makes that row unjudgeable: it fails as non-finite (its distance would otherwise read
    as 0, a PASS)."""
    t = TRUTH.copy()
    t[1, 2] = np.nan
    result = _anchored(TRUTH, truth=t)
    assert [r["status"] for r in result["rows"]] == ["PASS", "FAIL", "PASS", "PASS"]
    assert result["rows"][1]["reason"] == "non-finite logits" and result["verdict"] == "FAIL"


def test_a_path_off_an_all_zero_truth_fails_overall_too():
    """An all-zero truth has no norm: a path that is not zero is infinitely far from it (rows and pooled)."""
    zero = np.zeros((2, 4))
    x = zero.copy()
    x[0, 1] = 1.0
    result = _anchored(x, "float32", truth=zero, reference=None)
    assert result["rows"][0]["status"] == "FAIL"
    o = result["summary"]["overall"]["lhs"]
    assert o["rel_l2"] == math.inf and o["status"] == "FAIL"


def test_a_float32_side_given_a_reference_is_still_held_to_the_float32_floor():
    """A bf16 reference means nothing to a float32 path: a float32 path 0.01 off (rel-L2 0.0025, 625x the float32
    floor's 4e-6) fails, although the bf16 reference is 0.5 off itself (against which it would pass)."""
    result = _anchored(_off([0.01] * 4), "float32")
    assert any("reference is not used" in n for n in result["notes"])
    assert [r["status"] for r in result["rows"]] == ["FAIL"] * 4
    assert result["rows"][0]["to_truth"]["lhs"]["ratio"] == pytest.approx(0.01 / 4 / 4e-6, rel=1e-4)
    assert result["summary"]["overall"]["lhs"]["noise_rel_l2"] == 4e-6


def test_counts_and_worst_ratio_follow_the_rows():
    """Rows 0.25 / 1.0 / 2.0 off (ratios 0.5, 2.0, 4.0: PASS, PASS, REVIEW) and one NaN row (FAIL): one of each
    count, and the worst ratio is the worst finite one (4.0, row 2), not the NaN row's infinity."""
    x = _off([0.25, 1.0, 2.0, 0.0])
    x[3, 2] = np.nan
    result = _anchored(x)
    assert [r["status"] for r in result["rows"]] == ["PASS", "PASS", "REVIEW", "FAIL"]
    s = result["summary"]
    assert (s["rows"], s["passed"], s["review"], s["failed"]) == (4, 2, 1, 1)
    assert s["worst_ratio"]["value"] == pytest.approx(4.0) and "row 2 " in s["worst_ratio"]["row"]
    # the Worst rows table: FAIL first, then REVIEW, then the PASS rows largest ratio first
    assert [r["index"] for r in cmp.worst_rows(result["rows"])] == [3, 2, 1, 0]


def test_an_overall_only_failure_is_named_as_the_first_failure():
    """Every row 1.5 + a hair off: rows 3.0x (REVIEW), pooled past 3.0x (FAIL). The FAIL comes from the overall
    figure, and the summary and the words name it."""
    result = _anchored(_off([float(np.nextafter(np.float32(1.5), np.float32(2)))] * 4))
    assert result["verdict"] == "FAIL" and {r["status"] for r in result["rows"]} == {"REVIEW"}
    first = result["summary"]["first_failure"]
    assert first is not None and first.startswith("overall: pooled rel-L2") and "> 3x" in first
    assert f"first failure: {first}" in result["what_this_shows"]
    assert result["summary"]["first_failing_row"] is None


# --- two judged sides -------------------------------------------------------------------------------------


def test_a_two_sided_row_takes_the_worse_sides_ratio_status_and_reason():
    """lhs 3.0 off in row 0 (ratio 6: FAIL), rhs 1.5 off (ratio 3: REVIEW): the row is the lhs's FAIL, with
    the lhs's ratio and only the lhs's reason; the other rows, exact on both sides, pass."""
    result = _two_sided(_off([3.0, 0, 0, 0]), _off([1.5, 0, 0, 0]))
    row = result["rows"][0]
    assert row["to_truth"]["lhs"]["status"] == "FAIL" and row["to_truth"]["rhs"]["status"] == "REVIEW"
    assert row["status"] == "FAIL" and row["ratio_side"] == "lhs" and row["ratio"] == pytest.approx(6.0)
    assert row["rel_l2"] == pytest.approx(3.0 / 4) and row["max_abs"] == pytest.approx(3.0)
    assert row["reason"].startswith("lhs: distance to the truth") and "rhs:" not in row["reason"]
    # the other way round: the rhs is the worse side
    row = _two_sided(_off([1.5, 0, 0, 0]), _off([3.0, 0, 0, 0]))["rows"][0]
    assert row["ratio_side"] == "rhs" and row["ratio"] == pytest.approx(6.0)
    assert row["reason"].startswith("rhs: ") and "lhs:" not in row["reason"]


def test_a_two_sided_row_agrees_on_top1_only_when_both_sides_do():
    """The rhs swaps the truth's top logit away on row 0 (a FAIL); the lhs is exact: the row does not agree."""
    rhs = TRUTH.copy()
    rhs[0] = [0.0, 4.0, 0, 0]
    result = _two_sided(TRUTH, rhs)
    assert result["rows"][0]["to_truth"]["lhs"]["top1_agree"] and not result["rows"][0]["top1_agree"]
    assert result["summary"]["top1_agree"] == 3
    assert result["rows"][0]["lhs_to_rhs"]["top1_agree"] is False


def test_lhs_to_rhs_distance_is_over_the_rhs_norm():
    """lhs 0.5 off the truth in one logit, rhs exact: ||lhs - rhs|| / ||rhs|| = 0.5 / 4 (not over the lhs's norm,
    sqrt(16.25))."""
    result = _two_sided(_off([0.5] * 4), TRUTH)
    m = result["rows"][0]["lhs_to_rhs"]
    assert m["rel_l2"] == pytest.approx(0.125, rel=1e-9) and m["max_abs"] == pytest.approx(0.5)
    assert result["summary"]["lhs_to_rhs"]["worst_rel_l2"] == pytest.approx(0.125, rel=1e-9)


# --- new K/V ----------------------------------------------------------------------------------------------


def test_a_kv_step_is_judged_by_the_larger_of_its_two_ratios():
    """K truth [4, 0, 0, 0], the bf16 reference 0.5 off in one value (noise rel-L2 0.125, max-abs 0.5). Step 1's
    K is 1.0 off in three values: max-abs ratio 2.0 (a PASS alone), rel-L2 ratio sqrt(3)/4 / 0.125 = 3.46
    (a REVIEW): the step is REVIEW, and the K/V's worst ratio is that step's."""
    truth_kv = np.tile([4.0, 0, 0, 0], (4, 1))
    x = truth_kv.copy()
    x[0, 1:] = 1.0
    steps = [1, 2, 3, 4]
    result = cmp.compare(_with_kv(_col(TRUTH), x, steps), _with_kv(_col(TRUTH, "float32", "hf"), truth_kv, [-1] * 4),
                         reference=_with_kv(_col(TRUTH, backend="hf"), truth_kv + [0, 0.5, 0, 0], [-1] * 4))
    kv = result["kv"]
    side = kv["sides"]["lhs"]
    assert [e["status"] for e in side["steps"]] == ["REVIEW", "PASS", "PASS", "PASS"]
    assert side["steps"][0]["ratio"] == pytest.approx(2 * math.sqrt(3), rel=1e-6)
    assert side["worst_ratio"] == kv["worst_ratio"] == pytest.approx(2 * math.sqrt(3), rel=1e-6)
    assert side["review_steps"] == kv["review_steps"] == 1 and kv["status"] == result["verdict"] == "REVIEW"


def test_fixed_kv_gate_fails_a_step_on_rel_l2_alone():
    """K [1, 0, 0, 0] against the rhs; the lhs 0.05 off in three values: max|diff| 0.05 is inside the bf16
    kv-max-abs 0.1, rel-L2 0.087 is past 0.02: the step fails, naming the layer."""
    b_kv = np.tile([1.0, 0, 0, 0], (2, 1))
    x = b_kv.copy()
    x[0, 1:] = 0.05
    result = cmp.compare(_with_kv(_col(TRUTH), x, [1, 2]), _with_kv(_col(TRUTH), b_kv, [1, 2]), gate="fixed")
    assert [e["status"] for e in result["kv"]["steps"]] == ["FAIL", "PASS"] and result["verdict"] == "FAIL"
    assert result["kv"]["steps"][0]["reason"].startswith("layer 0 K:")


def test_fixed_kv_step_names_its_first_bad_layer():
    """Two layers, both bad in K and V: the step's reason names layer 0's K."""
    b_kv = np.tile([100.0, 0, 0, 0], (2, 1))
    x = np.repeat(b_kv[:, None, :], 2, axis=1)
    x[0, :, 1] = 1.0  # both layers 1.0 off (past kv-max-abs 0.1)
    result = cmp.compare(_with_kv(_col(TRUTH), x, [1, 2]), _with_kv(_col(TRUTH), b_kv, [1, 2], layers=2),
                         gate="fixed")
    assert result["kv"]["steps"][0]["reason"].startswith("layer 0 K:")
    assert result["kv"]["first_failure"].startswith("case edge step 1 (decode): layer 0 K:")


# --- the fixed gate's thresholds -----------------------------------------------------------------------------


def test_fixed_thresholds_follow_the_less_precise_side():
    """A bf16 lhs against a float32 rhs: the bf16 defaults (max-abs 0.5, rel-L2 0.02) apply, so 0.3 off a row of
    norm 100 passes (the float32 ones, 1e-4, would fail it)."""
    b = np.tile([100.0, 0, 0, 0], (2, 1))
    x = b.copy()
    x[:, 1] = 0.3
    result = cmp.compare(_col(x), _col(b, "float32"), gate="fixed")
    assert result["thresholds"]["dtype_basis"] == "bfloat16" and result["thresholds"]["max_abs"] == 0.5
    assert result["verdict"] == "PASS"


# --- bench compare ---------------------------------------------------------------------------------------------


def _median_cdf(values: list[float]) -> dict[float, float]:
    """P(median of a same-size resample with replacement <= v) for each value of an odd-sized sample of distinct
    values: the median is <= the j-th smallest exactly when at least (n + 1) / 2 of the n draws are."""
    n = len(values)
    need = (n + 1) // 2
    out = {}
    for j, v in enumerate(sorted(values), 1):
        p = j / n
        out[v] = sum(math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(need, n + 1))
    return out


def test_the_interval_is_the_central_95_percent_of_the_resampled_ratios():
    """A's repeats are all 1000 tok/s, so a resampled ratio is median(B's resample) / 1000, whose distribution is
    known exactly. B's 2.5th and 97.5th percentiles lie where at most 2.5% of that distribution is beyond each
    bound (a 90% interval would cut 5% from each end)."""
    # 9 distinct repeats, 920..1080: P(median <= 920) = 0.14%, <= 940 3.0%, <= 960 14% (and mirrored above)
    b = [1000.0 + 20.0 * i for i in range(-4, 5)]
    cdf = _median_cdf(b)
    res = bench.compare(_synthetic([1000.0] * 3), _synthetic(b), "code")
    lo, hi = (v * 1000.0 for v in res["interval"])
    below = max((c for v, c in cdf.items() if v < lo - 1e-6), default=0.0)  # mass strictly under lo
    at_or_below_hi = max(c for v, c in cdf.items() if v <= hi + 1e-6)
    assert below <= 0.025 and 1 - at_or_below_hi <= 0.025, (lo, hi, cdf)  # here: 920 under, 1080 over
    # and it is not wider than that: the bounds are where the distribution's 2.5% tails start
    assert cdf[min(v for v in cdf if v >= lo - 1e-6)] > 0.025 - 0.005


def test_the_interval_resamples_each_side_at_its_own_size():
    """A has three repeats 900 / 1000 / 1100: a 3-draw resample's median is 900 or 1100 each 7/27 of the time, so
    the ratio's interval runs from 1000/1100 to 1000/900 whatever B's size (B: 50 repeats of 1000)."""
    res = bench.compare(_synthetic([900.0, 1000.0, 1100.0]), _synthetic([1000.0] * 50), "code")
    assert res["interval"] == pytest.approx([1000 / 1100, 1000 / 900], rel=1e-12)
    assert res["within_noise"] is True


def test_a_zero_median_resample_does_not_make_the_interval_infinite():
    """A has one repeat at 0 tok/s out of three: a resample with two zeros has a median of 0 and no ratio; the
    interval is of the ratios there are, finite, and the result stays valid JSON."""
    a = _synthetic([1000.0] * 3)
    a["runs"][0]["output_throughput"] = 0.0
    res = bench.compare(a, _synthetic([1000.0] * 3), "code")
    assert res["metrics"]["output_throughput"]["a"]["min"] == 0.0
    assert res["interval"] == [1.0, 1.0] and res["within_noise"] is True
    json.dumps(res, allow_nan=False)


def test_a_failed_request_is_not_a_load_sample_even_with_a_latency(tmp_path):
    """`bench load` records a request that streamed no tokens as failed with its e2el set (the stream ended):
    such a request is not a sample of the completed requests' latency."""
    a = _load_result(tmp_path, "a", [100.0] * 10, failed=0)
    b = _load_result(tmp_path, "b", [100.0] * 10, failed=0)
    recs = tmp_path / "b.requests.jsonl"
    recs.write_text(recs.read_text() + "".join(
        json.dumps({"id": f"nt{i}", "output_tokens": 0, "ttft_ms": None, "tpot_ms": None, "e2el_ms": 5000.0,
                    "error": "no tokens streamed"}) + "\n" for i in range(15)))
    res = bench.compare(bench.load_bench(a), bench.load_bench(b), "code")
    e2el = res["metrics"]["e2el_ms"]
    assert e2el["b"]["n"] == 10 and e2el["b"]["max"] == 100.0 and res["ratio"] == 1.0


def test_the_evidence_of_a_comparison_is_the_weaker_sides():
    gpu, cpu = {"evidence": "gpu-measured"}, {"evidence": "cpu-executed"}
    assert bench.weakest_evidence(gpu, cpu) == bench.weakest_evidence(cpu, gpu) == "cpu-executed"
    assert bench.weakest_evidence(gpu, gpu) == "gpu-measured"
