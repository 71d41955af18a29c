"""The judges at their edges: every gate and threshold of logits-check, each boundary value on both sides.

The collections here are synthetic (four logits per row), built so that every distance and ratio is an exact
binary fraction: a ratio meant to be 2.5 is 2.5, and the value just past it is the next float32 up. Where a
threshold is not a binary fraction (the dtype floors, 0.02), the two sides are 0.1% below and above it.
"""
from __future__ import annotations

import numpy as np
import pytest

from labkit.errors import LabkitError
from labkit.logits import compare as cmp
from labkit.logits.collect import Collection

# The documented figures (gates.py, compare.py), written out: a test that read them from the module would move
# with a wrong edit of them.
ROW_PASS = 2.5
FLOORS = {"bfloat16": {"rel_l2": 2e-3, "max_abs": 2e-2}, "float16": {"rel_l2": 2.5e-4, "max_abs": 2.5e-3},
          "float32": {"rel_l2": 4e-6, "max_abs": 4e-5}}
FIXED_MAX_ABS = {"bfloat16": 0.5, "float16": 0.5, "float32": 1e-4}
FIXED_KV_MAX_ABS = 0.1  # bf16 / fp16


def _up(v: float) -> np.float32:
    """The next float32 above v: the smallest step past a boundary the collections can hold."""
    return np.nextafter(np.float32(v), np.float32(np.inf))


def _col(logits, dtype="bfloat16", backend="engine") -> Collection:
    logits = np.asarray(logits, dtype=np.float32)
    rows = [{"index": i, "request_id": "R", "output_index": i, "case": "edge", "context_len": i + 1}
            for i in range(len(logits))]
    return Collection({"suite": {"name": "edge"}, "model_files": {}, "token_path_sha256": "p", "rows": rows,
                       "dtype": dtype, "backend": backend}, {"logits": logits})


# Truth rows [4, 0, 0, 0]; the bf16 reference is 0.5 off in one logit: noise rel-L2 0.125, max-abs 0.5 per row
# (above the bf16 floors), pooled rel-L2 0.125. A path d off in one logit has row ratio 2d (both measures).
TRUTH = np.array([[4.0, 0, 0, 0]] * 4)
REFERENCE = TRUTH + np.array([0, 0.5, 0, 0])


def _anchored(offsets) -> dict:
    """A bf16 path whose row i is offsets[i] off the truth in logit 1."""
    x = TRUTH.copy()
    x[:, 1] = np.asarray(offsets, dtype=np.float32)
    return cmp.compare(_col(x), _col(TRUTH, "float32", "hf"), reference=_col(REFERENCE, backend="hf"))


def _statuses(result) -> list[str]:
    return [r["status"] for r in result["rows"]]


@pytest.mark.parametrize("d, row, verdict", [
    (1.25, "PASS", "PASS"),           # row ratio 2.5 = ROW_PASS
    (_up(1.25), "REVIEW", "REVIEW"),  # just over
    (2.5, "REVIEW", "REVIEW"),        # 5.0 = ROW_FAIL
    (_up(2.5), "FAIL", "FAIL"),
])
def test_row_factors_at_their_boundaries(d, row, verdict):
    # One row off, three exact: the pooled ratio is d / 2 <= 1.25 + (PASS or REVIEW), so the row decides.
    result = _anchored([d, 0, 0, 0])
    assert result["rows"][0]["to_truth"]["lhs"]["ratio"] == pytest.approx(2 * float(d), rel=1e-12)
    assert _statuses(result) == [row, "PASS", "PASS", "PASS"]
    assert result["summary"]["overall"]["lhs"]["status"] != "FAIL"
    assert result["verdict"] == verdict


@pytest.mark.parametrize("d, overall, rows, verdict", [
    (0.75, "PASS", "PASS", "PASS"),          # pooled ratio 1.5 = OVERALL_PASS, rows 1.5
    (_up(0.75), "REVIEW", "PASS", "REVIEW"),
    (1.0, "REVIEW", "PASS", "REVIEW"),       # pooled 2.0: within the row factor, past the overall one
    (1.5, "REVIEW", "REVIEW", "REVIEW"),     # 3.0 = OVERALL_FAIL (rows 3.0: REVIEW)
    (_up(1.5), "FAIL", "REVIEW", "FAIL"),    # the overall figure alone turns REVIEW rows into a FAIL
])
def test_overall_factors_at_their_boundaries(d, overall, rows, verdict):
    result = _anchored([d] * 4)
    o = result["summary"]["overall"]["lhs"]
    assert o["ratio"] == pytest.approx(2 * float(d), rel=1e-12)
    assert o["status"] == overall and _statuses(result) == [rows] * 4
    assert result["verdict"] == verdict


def _flip(runner_up) -> dict:
    """Truth [4, runner_up, 0, 0]; the path swaps the top two, each moved 0.51 toward the other (row ratio 1.44,
    under the overall factor too); the reference is 0.5 off in logit 2: the wide-margin bound is 2 x 0.5 = 1.0."""
    t = np.array([[4.0, runner_up, 0, 0]], dtype=np.float32)
    x = t.copy()
    x[0, 0], x[0, 1] = t[0, 0] - 0.51, t[0, 1] + 0.51
    ref = t + np.array([0, 0, 0.5, 0], dtype=np.float32)
    return cmp.compare(_col(x), _col(t, "float32", "hf"), reference=_col(ref, backend="hf"))


def test_a_top1_flip_on_a_margin_of_exactly_twice_the_noise_is_a_near_tie():
    tie = _flip(3.0)  # margin 1.0 = WIDE_MARGIN x 0.5
    row = tie["rows"][0]["to_truth"]["lhs"]
    assert not row["top1_agree"] and row["ratio"] <= ROW_PASS
    assert row["status"] == "PASS" and row["near_tie_flip"] and tie["verdict"] == "PASS"


def test_a_top1_flip_on_a_margin_just_over_twice_the_noise_fails():
    wide = _flip(float(np.nextafter(np.float32(3.0), np.float32(0))))  # margin just over 1.0
    row = wide["rows"][0]["to_truth"]["lhs"]
    assert not row["top1_agree"] and row["ratio"] <= ROW_PASS
    assert row["status"] == "FAIL" and wide["verdict"] == "FAIL" and "is wide" in row["reason"]



def test_each_rows_top1_is_its_own_truths():
    """Rows whose truths peak in different logits, the path on each truth exactly: every row agrees on its own
    top-1 and passes (a top-1 taken across the rows instead of along each row's logits failed the second row on a
    wide margin it does not have)."""
    t = np.array([[4.0, 3.0, 0, 0], [0, 0, 5.0, 1.0], [0, 2.0, 0, 7.0]], dtype=np.float32)
    result = cmp.compare(_col(t), _col(t, "float32", "hf"), reference=_col(t + 0.5, backend="hf"))
    assert [r["truth_top1"] for r in result["rows"]] == [0, 2, 3]
    assert [r["truth_top2_margin"] for r in result["rows"]] == [1.0, 4.0, 5.0]
    assert all(r["top1_agree"] for r in result["rows"]) and result["verdict"] == "PASS", _statuses(result)


def test_rel_l2_is_measured_against_the_truths_norm():
    """rel-L2 = ||x - t|| / ||t||: a path 1.25 off in one logit of [4, 0, 0, 0] is 1.25 / 4 away (not over its own
    norm, sqrt(16 + 1.25**2)); the rows and the pooled figure both say so."""
    result = _anchored([1.25, 0, 0, 0])
    lhs = result["rows"][0]["to_truth"]["lhs"]
    assert lhs["rel_l2"] == pytest.approx(1.25 / 4, rel=1e-12) and lhs["ratio_rel_l2"] == pytest.approx(2.5)
    assert result["summary"]["overall"]["lhs"]["rel_l2"] == pytest.approx(1.25 / 8, rel=1e-12)  # ||t|| = 8


def _fp8_col(logits, dtype, backend="engine"):
    col = _col(logits, dtype, backend)
    col.meta["kv_cache_dtype"] = "fp8"
    return col


def test_a_float32_path_with_an_fp8_kv_cache_is_measured_against_an_fp8_reference():
    """An e4m3 KV cache rounds more than float32 at any model dtype: such a float32 path needs Transformers'
    own float32 run with its K/V round-tripped through e4m3, and is measured against that reference's distance,
    never against the float32 floor (which would fail every honest FP8 row)."""
    truth = _col(TRUTH, "float32", "hf")
    x = TRUTH.copy()
    x[:, 1] = 1.0
    with pytest.raises(LabkitError) as err:
        cmp.compare(_fp8_col(x, "float32"), truth)
    assert err.value.code == 2 and "--kv-cache-dtype fp8" in str(err.value)
    result = cmp.compare(_fp8_col(x, "float32"), truth, reference=_fp8_col(REFERENCE, "float32", "hf"))
    assert [r["to_truth"]["lhs"]["ratio"] for r in result["rows"]] == pytest.approx([2.0] * 4)
    assert result["verdict"] == "REVIEW"   # rows 2.0 (PASS), pooled 2.0 (past 1.5)

def test_non_finite_logits_fail_whatever_the_ratio():
    x = TRUTH.copy()
    x[2, 3] = np.nan
    result = cmp.compare(_col(x), _col(TRUTH, "float32", "hf"), reference=_col(REFERENCE, backend="hf"))
    assert _statuses(result) == ["PASS", "PASS", "FAIL", "PASS"] and result["verdict"] == "FAIL"
    assert result["rows"][2]["reason"] == "non-finite logits"


# The floors: a reference closer to the truth than one rounding is credited with the floor instead.
@pytest.mark.parametrize("dtype, measure", [("bfloat16", "max_abs"), ("bfloat16", "rel_l2"),
                                            ("float16", "max_abs"), ("float16", "rel_l2"),
                                            ("float32", "max_abs"), ("float32", "rel_l2")])
def test_dtype_floors_on_both_sides(dtype, measure):
    floor = FLOORS[dtype][measure]
    if measure == "rel_l2":
        # A truth of norm 1 and the offset spread over 100 logits: rel-L2 is the offset's size, max-abs a tenth
        # of it, so the rel-L2 ratio decides.
        truth = np.zeros((1, 101))
        truth[0, 0] = 1.0
        spread = np.r_[0.0, np.full(100, 0.1)]
    else:
        # A truth of norm 100 and one logit off: the rel-L2 ratio is a tenth of the max-abs one, which decides.
        truth = np.array([[100.0, 0, 0, 0]])
        spread = np.array([0, 1.0, 0, 0])
    ref = {"reference": _col(truth, dtype, "hf")} if dtype != "float32" else {}  # exact: below any floor
    for k, want in ((0.999, "PASS"), (1.001, "REVIEW")):
        x = truth + k * ROW_PASS * floor * spread
        result = cmp.compare(_col(x, dtype), _col(truth, "float32", "hf"), **ref)
        assert result["rows"][0]["status"] == want, (dtype, measure, k, result["rows"][0]["reason"])


# --- the fixed gate (--gate fixed): thresholds of lhs against rhs --------------------------------------------

def _fixed(x, b, dtype="bfloat16") -> dict:
    return cmp.compare(_col(x, dtype), _col(b, dtype), gate="fixed")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_fixed_max_abs_threshold_on_both_sides(dtype):
    th = FIXED_MAX_ABS[dtype]
    # b's norm is large enough that rel-L2 stays far inside its threshold.
    b = np.array([[1e4, 0, 0, 0]], dtype=np.float32) if dtype == "float32" else np.array([[100.0, 0, 0, 0]])
    at = b.copy()
    at[0, 1] = th
    assert _fixed(at, b, dtype)["rows"][0]["status"] == "PASS"
    past = b.copy()
    past[0, 1] = _up(th) if th == 0.5 else th * 1.001
    r = _fixed(past, b, dtype)["rows"][0]
    assert r["status"] == "FAIL" and "max|diff|" in r["reason"]


def test_fixed_rel_l2_threshold_on_both_sides():
    # rel-L2 0.02 against a norm of 50: ||diff|| = 1.0, spread over 16 logits of 0.25 (max-abs well inside 0.5).
    b = np.zeros((1, 17), dtype=np.float32)
    b[0, 0] = 50.0
    at = b.copy()
    at[0, 1:] = 0.25
    assert _fixed(at, b)["rows"][0]["rel_l2"] == 0.02
    assert _fixed(at, b)["rows"][0]["status"] == "PASS"
    past = at.copy()
    past[0, 1] = _up(0.25)
    r = _fixed(past, b)["rows"][0]
    assert r["status"] == "FAIL" and "rel-L2" in r["reason"] and "max|diff|" not in r["reason"]


def test_fixed_top1_flip_reviews_a_margin_the_error_can_explain_and_fails_a_wider_one():
    # The rhs's top two are `margin` apart; the lhs swaps them, moving each by 0.25 (max|diff| 0.25).
    def flip(margin):
        # (a norm of 140: rel-L2 stays far inside 0.02)
        b = np.array([[100.0, 100.0 - margin, 0, 0]], dtype=np.float32)
        x = b.copy()
        x[0, 0], x[0, 1] = b[0, 0] - 0.25, b[0, 1] + 0.25
        return _fixed(x, b)["rows"][0]
    at = flip(0.25)  # margin = max|diff|
    assert not at["top1_agree"] and at["status"] == "REVIEW"
    past = flip(float(np.float32(100.0) - np.nextafter(np.float32(99.75), np.float32(0))))
    assert not past["top1_agree"] and past["status"] == "FAIL" and "top-1" in past["reason"]


# --- new K/V (the kv suite): per step with the row factors, pooled with the overall ones; fixed kv-max-abs -----

def _with_kv(col: Collection, k: np.ndarray, steps, layers: int = 1) -> Collection:
    """col plus new K/V: one token per step (request R, positions 0..), `layers` layers of one head of k's last
    dimension (k: [steps, dim] for every layer, or [steps, layers, dim]); V equals K."""
    k = np.asarray(k, dtype=np.float32)
    if k.ndim == 2:
        k = np.repeat(k[:, None, :], layers, axis=1)
    k = k.reshape(len(steps), k.shape[1], 1, -1)
    n = len(steps)
    meta = {**col.meta, "kv": {"requests": ["R"], "cases": ["edge"]},
            "steps": [{"case": "edge", "step": s, "phase": "decode"} for s in steps]}
    return Collection(meta, {**col.arrays, "kv_k": k, "kv_v": k.copy(), "kv_request": np.zeros(n, np.int32),
                             "kv_position": np.arange(n, dtype=np.int32), "kv_step": np.asarray(steps, np.int32),
                             "kv_case": np.zeros(n, np.int32)})


def _anchored_kv(offsets) -> dict:
    """Four steps of one new token each, K = [4, offsets[i], 0, 0] against a truth [4, 0, 0, 0] and a bf16
    reference 0.5 off: the step ratio is 2 x offset, the pooled one 2 x the root mean square offset."""
    truth_kv = np.tile([4.0, 0, 0, 0], (4, 1))
    x = truth_kv.copy()
    x[:, 1] = np.asarray(offsets, dtype=np.float32)
    steps = [1, 2, 3, 4]
    lhs = _with_kv(_col(TRUTH), x, steps)
    truth = _with_kv(_col(TRUTH, "float32", "hf"), truth_kv, [-1] * 4)
    ref = _with_kv(_col(TRUTH, backend="hf"), truth_kv + [0, 0.5, 0, 0], [-1] * 4)
    return cmp.compare(lhs, truth, reference=ref)


@pytest.mark.parametrize("d, step, verdict", [(1.25, "PASS", "PASS"), (_up(1.25), "REVIEW", "REVIEW"),
                                              (2.5, "REVIEW", "REVIEW"), (_up(2.5), "FAIL", "FAIL")])
def test_new_kv_per_step_at_the_row_factors(d, step, verdict):
    result = _anchored_kv([d, 0, 0, 0])  # pooled ratio d, within OVERALL_FAIL: the step decides
    kv = result["kv"]
    assert [e["status"] for e in kv["sides"]["lhs"]["steps"]] == [step, "PASS", "PASS", "PASS"]
    assert kv["sides"]["lhs"]["overall"]["k"]["status"] != "FAIL"
    assert kv["status"] == result["verdict"] == verdict  # the logits rows all pass: K/V decide the verdict


@pytest.mark.parametrize("d, overall, verdict", [(0.75, "PASS", "PASS"), (_up(0.75), "REVIEW", "REVIEW"),
                                                 (1.5, "REVIEW", "REVIEW"), (_up(1.5), "FAIL", "FAIL")])
def test_new_kv_pooled_at_the_overall_factors(d, overall, verdict):
    result = _anchored_kv([d] * 4)
    assert result["kv"]["sides"]["lhs"]["overall"]["k"]["status"] == overall
    assert result["kv"]["status"] == result["verdict"] == verdict


def test_fixed_kv_max_abs_threshold_on_both_sides():
    # Against K = [100, 0, 0, 0] (rel-L2 far inside 0.02), one value off by exactly the threshold, then just past.
    b_kv = np.tile([100.0, 0, 0, 0], (2, 1))
    rhs = _with_kv(_col(TRUTH), b_kv, [1, 2])
    for off, want in ((FIXED_KV_MAX_ABS, "PASS"), (FIXED_KV_MAX_ABS * 1.001, "FAIL")):
        x = b_kv.copy()
        x[0, 1] = off
        result = cmp.compare(_with_kv(_col(TRUTH), x, [1, 2]), rhs, gate="fixed")
        assert [e["status"] for e in result["kv"]["steps"]] == [want, "PASS"], off
        assert result["verdict"] == want


# --- bench compare: "within noise" exactly when the ratio's interval holds 1.0 -------------------------------

def _offline(tok_s: list[float]) -> dict:
    from .test_bench_compare import _synthetic

    return _synthetic(tok_s)


# A's repeats are all 1000 tok/s, so each resampled ratio is median(B's resample) / 1000: with B = [v, v, w] the
# ratio is v/1000 in 74% of the resamples and w/1000 in the rest, and the interval runs from one to the other.
@pytest.mark.parametrize("b, within, bound", [
    ([1000.0, 1000.0, 2000.0], True, (1.0, 2.0)),            # the interval starts at exactly 1.0
    ([1000.0 * (1 + 1e-9)] * 2 + [2000.0], False, None),     # ... or just above it: B is faster
    ([1000.0, 1000.0, 500.0], True, (0.5, 1.0)),             # the interval ends at exactly 1.0
    ([1000.0 * (1 - 1e-9)] * 2 + [500.0], False, None),      # ... or just below it: B is slower
])
def test_bench_compare_within_noise_on_both_sides_of_one(b, within, bound):
    from labkit.bench import compare as bench

    res = bench.compare(_offline([1000.0] * 3), _offline(b), "code")
    if bound is not None:
        assert tuple(res["interval"]) == bound
    assert res["within_noise"] is within
    assert res["headline"].startswith("B/A median output tok/s: within noise") is within
    # a ratio is said as the result only outside the noise
    assert res["headline"].startswith(f"B/A median output tok/s: {res['ratio']:.3f}x (") is not within


# --- RequestLimits: each limit at it, and one past ---------------------------------------------------------

def _limits(**kw):
    from engine.request_limits import RequestLimits

    return RequestLimits(**{"max_model_len": 64, "vocab_size": 1000, "block_size": 16, "num_blocks": 8, **kw})


def _sp(**kw):
    from engine import SamplingParams

    return SamplingParams(**kw)


LIMIT_CASES = [
    ("prompt at max_model_len", {}, [1] * 64, {"max_tokens": 1}, False, None),
    ("prompt one past max_model_len", {}, [1] * 65, {"max_tokens": 1}, False, "prompt"),
    ("prompt + max_tokens at max_model_len (API rule)", {}, [1] * 60, {"max_tokens": 4}, True, None),
    ("prompt + max_tokens one past max_model_len (API rule)", {}, [1] * 60, {"max_tokens": 5}, True, "max_tokens"),
    ("the engine itself stops at max_model_len", {}, [1] * 60, {"max_tokens": 5}, False, None),
    ("top_k at the vocabulary size", {}, [1], {"top_k": 1000}, False, None),
    ("top_k one past the vocabulary size", {}, [1], {"top_k": 1001}, False, "top_k"),
    # KV: the last sampled token needs none, so 40 + 9 - 1 = 48 tokens = 3 blocks of 16
    ("KV at the pool", {"num_blocks": 3}, [1] * 40, {"max_tokens": 9}, False, None),
    ("KV one token past the pool", {"num_blocks": 3}, [1] * 40, {"max_tokens": 10}, False, "prompt"),
    # ... and never more than max_model_len tokens: 64 tokens = 4 blocks however many are asked for
    ("KV capped at max_model_len, at the pool", {"num_blocks": 4}, [1] * 10, {"max_tokens": 10 ** 6}, False, None),
    ("KV capped at max_model_len, one block short", {"num_blocks": 3}, [1] * 10, {"max_tokens": 10 ** 6}, False,
     "prompt"),
]


@pytest.mark.parametrize("what, limits, ids, sp, api, field", LIMIT_CASES, ids=[c[0] for c in LIMIT_CASES])
def test_request_limits_at_each_limit_and_one_past(what, limits, ids, sp, api, field):
    check = lambda: _limits(**limits).check(ids, _sp(**sp), within_model_len=api)  # noqa: E731
    if field is None:
        check()
    else:
        with pytest.raises(ValueError, match=f"^{field}:"):
            check()


@pytest.mark.parametrize("ids, ok", [([0], True), ([-1], False), ([999], True), ([1000], False)])
def test_request_limits_token_ids_at_the_ends_of_the_vocabulary(ids, ok):
    if ok:
        assert _limits().check_token_ids(ids) == ids
    else:
        with pytest.raises(ValueError, match="^prompt: token id"):
            _limits().check_token_ids(ids)


# ------------------------------------------------------------------------------------------ the distances' edges

def test_rel_l2_against_a_truth_row_of_norm_under_one_and_of_norm_zero():
    """rel-L2 divides by the truth's norm whatever it is (0.5 here), and a zero truth row gives 0 where the row
    matches it and inf where it does not; the same for the pooled distance."""
    from labkit.logits.gates import pooled_rel, row_distances

    t = np.array([[0.3, 0.4, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    x = np.array([[0.3, 0.4, 0.125, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.25, 0.0, 0.0]])
    d = row_distances(x, t)
    assert d["rel_l2"].tolist() == [0.25, 0.0, np.inf]  # 0.125 / 0.5
    assert d["max_abs"].tolist() == [0.125, 0.0, 0.25]
    assert pooled_rel(x[:1], t[:1]) == 0.25
    assert pooled_rel(x[1:2], t[1:2]) == 0.0 and pooled_rel(x[1:], t[1:]) == np.inf


def test_new_kv_is_judged_layer_by_layer():
    """judge_kv_group's rows are layers ([tokens, layers, heads, dim] in): an error in one layer of every token
    shows in that layer alone, and a reference's error in a layer raises that layer's noise alone."""
    from labkit.logits.gates import judge_kv_group

    rng = np.random.default_rng(0)
    t = rng.standard_normal((3, 4, 2, 8))
    x = t.copy()
    x[:, 2] *= 1.5            # layer 2 off by half its norm
    x[:, 1] *= 1.25           # layer 1 off by a quarter, but the reference is off there by as much
    ref = t.copy()
    ref[:, 1] *= 1.25
    got = judge_kv_group(x, t, ref, "bfloat16")
    assert got["rel_l2"] == pytest.approx([0.0, 0.25, 0.5, 0.0])
    assert got["noise_rel_l2"] == pytest.approx([2e-3, 0.25, 2e-3, 2e-3])  # the floor, but where the ref is off
    assert got["worst_layer"] == 2 and got["worst_ratio"] == pytest.approx(0.5 / 2e-3)
    assert got["ratio"][1] == pytest.approx(max(1.0, got["max_abs"][1] / got["noise_max_abs"][1]))


def _kv_side(k_offsets, v_offsets, col=None) -> Collection:
    """A bf16 engine side whose new K in step i is k_offsets[i] off the truth [4, 0, 0, 0], V v_offsets[i]."""
    k, v = np.tile([4.0, 0, 0, 0], (4, 1)), np.tile([4.0, 0, 0, 0], (4, 1))
    k[:, 1], v[:, 1] = k_offsets, v_offsets
    side = _with_kv(_col(TRUTH) if col is None else col, k, [1, 2, 3, 4])
    side.arrays["kv_v"] = v.astype(np.float32).reshape(side.arrays["kv_k"].shape)
    return side


def test_new_kv_summary_takes_each_steps_worse_of_k_and_v_and_each_sides_worst():
    """A step's ratio is the worse of its K and V (2 x offset against the 0.5-off reference); a side's worst ratio
    and max|diff| are over its steps, the comparison's over both sides, all below 1 included."""
    truth = _with_kv(_col(TRUTH, "float32", "hf"), np.tile([4.0, 0, 0, 0], (4, 1)), [-1] * 4)
    ref = _with_kv(_col(TRUTH, backend="hf"), np.tile([4.0, 0.5, 0, 0], (4, 1)), [-1] * 4)
    lhs = _kv_side([0.25, 0.5, 0.125, 0.0], [0.125, 0.0, 0.25, 0.0])
    rhs = _kv_side([0.0625] * 4, [0.0] * 4)
    kv = cmp.compare(lhs, rhs, truth=truth, reference=ref)["kv"]
    left, right = kv["sides"]["lhs"], kv["sides"]["rhs"]
    assert [e["ratio"] for e in left["steps"]] == [0.5, 1.0, 0.5, 0.0]
    assert [e["ratio"] for e in right["steps"]] == [0.125] * 4
    assert (left["worst_ratio"], left["worst_max_abs"]) == (1.0, 0.5)
    assert (right["worst_ratio"], right["worst_max_abs"]) == (0.125, 0.0625)
    assert (kv["worst_ratio"], kv["worst_max_abs"]) == (1.0, 0.5)
    assert kv["status"] == "PASS" and kv["failed_steps"] == kv["review_steps"] == 0


def test_a_step_with_non_finite_new_k_fails_and_still_reports_its_v():
    truth = _with_kv(_col(TRUTH, "float32", "hf"), np.tile([4.0, 0, 0, 0], (4, 1)), [-1] * 4)
    ref = _with_kv(_col(TRUTH, backend="hf"), np.tile([4.0, 0.5, 0, 0], (4, 1)), [-1] * 4)
    lhs = _kv_side([0.0, np.nan, 0.0, 0.0], [0.0, 0.25, 0.0, 0.0])
    kv = cmp.compare(lhs, truth, reference=ref)["kv"]
    step = kv["sides"]["lhs"]["steps"][1]
    assert step["status"] == "FAIL" and step["ratio"] == np.inf and "layer 0 K" in step["reason"]
    assert step["v"]["max_abs"] == [0.25]
    assert kv["status"] == "FAIL" and kv["failed_steps"] == 1 and "step 2" in kv["first_failure"]


def test_new_kv_equal_to_the_truth_is_at_ratio_zero_in_every_step():
    result = _anchored_kv([0, 0, 0, 0])
    side = result["kv"]["sides"]["lhs"]
    assert [e["ratio"] for e in side["steps"]] == [0.0] * 4 and side["worst_ratio"] == 0.0
    assert result["verdict"] == "PASS"


def test_a_truth_that_is_not_transformers_is_judged_with_a_note():
    x = TRUTH.copy()
    result = cmp.compare(_col(x), _col(TRUTH, "float32", "engine"), reference=_col(REFERENCE, backend="hf"))
    assert any("not Transformers" in n for n in result["notes"]), result["notes"]
    hf = cmp.compare(_col(x), _col(TRUTH, "float32", "hf"), reference=_col(REFERENCE, backend="hf"))
    assert not any("not Transformers" in n for n in hf["notes"])


def test_kv_on_one_judged_side_only_is_not_compared_and_says_which_side_lacks_it():
    """Both sides judged against one truth (--truth): K/V are compared only when both sides recorded them."""
    truth_kv = np.tile([4.0, 0, 0, 0], (4, 1))
    lhs = _with_kv(_col(TRUTH), truth_kv, [1, 2, 3, 4])
    truth = _with_kv(_col(TRUTH, "float32", "hf"), truth_kv, [-1] * 4)
    ref = _with_kv(_col(REFERENCE, backend="hf"), truth_kv + [0, 0.5, 0, 0], [-1] * 4)
    result = cmp.compare(lhs, _col(TRUTH), truth=truth, reference=ref)
    assert result["kv"]["compared"] is False and result["kv"]["reason"] == "rhs holds no K/V", result["kv"]
    both = cmp.compare(lhs, lhs, truth=truth, reference=ref)
    assert both["kv"]["compared"] is True


def test_a_truth_without_kv_is_refused_and_a_reference_without_kv_only_where_a_side_needs_it():
    """A float32 side is judged against the truth alone: the truth must hold K/V, a reference need not."""
    from labkit.errors import LabkitError

    truth_kv = np.tile([4.0, 0, 0, 0], (4, 1))
    lhs32 = _with_kv(_col(TRUTH, "float32"), truth_kv, [1, 2, 3, 4])
    truth = _with_kv(_col(TRUTH, "float32", "hf"), truth_kv, [-1] * 4)
    with pytest.raises(LabkitError, match="the truth holds no K/V"):
        cmp.compare(lhs32, _col(TRUTH, "float32", "hf"))
    result = cmp.compare(lhs32, truth, reference=_col(REFERENCE, "float32", backend="hf"))
    assert result["kv"]["compared"] is True and result["verdict"] == "PASS"
