"""Why two logits collections cannot be compared (labkit/logits/compare.refusal_reasons), one reason at a time
on collections made here: a weight file on one side only, one whose hash differs, the model config, a request
or a token that differs in the token path, the row sets, the vocabulary. Each reason must name what differs
and where; two collections that differ in nothing have none. Then the fixed gate's K/V judgement
(compare_kv) on K/V made here: per layer, at the gate, against a zero layer, a position written twice."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from labkit.errors import LabkitError
from labkit.logits.collect import Collection
from labkit.logits.compare import compare_kv, refusal_reasons


def _col(**meta) -> Collection:
    base = {"suite": {"name": "baseline"},
            "model_files": {"config.json": "c" * 64, "model.safetensors": "a" * 64},
            "token_path_sha256": "p" * 64, "seed": 0,
            "inputs": {"A": {"prompt": [1, 2, 3], "continuation": [7, 8]},
                       "B": {"prompt": [4, 5], "continuation": [9]}},
            "rows": [{"request_id": "A", "output_index": 0}, {"request_id": "B", "output_index": 0}]}
    base.update(meta)
    return Collection(meta=base, arrays={"logits": np.zeros((2, 16), np.float32)})


def _other(col: Collection, **changes) -> Collection:
    meta = copy.deepcopy(col.meta)
    meta.update(changes)
    return Collection(meta=meta, arrays=dict(col.arrays))


def test_two_collections_that_differ_in_nothing_can_be_compared():
    a = _col()
    assert refusal_reasons(a, _other(a)) == []


def test_a_weight_file_on_one_side_only_names_that_side():
    a = _col()
    extra = _other(a, model_files={**a.meta["model_files"], "extra.safetensors": "e" * 64})
    assert refusal_reasons(a, extra) == ["weights differ: extra.safetensors only in rhs"]
    assert refusal_reasons(extra, a, ("engine", "hf")) == ["weights differ: extra.safetensors only in engine"]


def test_a_file_whose_hash_differs_is_named_and_the_config_is_the_model():
    a = _col()
    weights = _other(a, model_files={**a.meta["model_files"], "model.safetensors": "b" * 64})
    assert refusal_reasons(a, weights) == [
        f"weights differ: model.safetensors sha256 {'a' * 12} (lhs) vs {'b' * 12} (rhs)"]
    config = _other(a, model_files={**a.meta["model_files"], "config.json": "d" * 64})
    assert refusal_reasons(a, config) == [
        f"model config differs: config.json sha256 {'c' * 12} (lhs) vs {'d' * 12} (rhs)"]
    unhashed = _other(a, model_files={**a.meta["model_files"], "config.json": None})
    assert refusal_reasons(a, unhashed) == [f"model config differs: config.json sha256 {'c' * 12} (lhs) vs none (rhs)"]


def test_a_token_path_that_differs_names_the_request_and_the_first_token():
    a = _col()
    inputs = copy.deepcopy(a.meta["inputs"])
    inputs["B"]["continuation"] = [6]
    assert refusal_reasons(a, _other(a, inputs=inputs, token_path_sha256="q" * 64)) == [
        "token paths differ: request B continuation[0]: 9 vs 6"]
    inputs = copy.deepcopy(a.meta["inputs"])
    inputs["A"]["prompt"] = [1, 2]
    assert refusal_reasons(a, _other(a, inputs=inputs, token_path_sha256="q" * 64, seed=1)) == [
        "token paths differ: request A prompt: 3 vs 2 ids (seed 0 vs 1)"]
    inputs = {**copy.deepcopy(a.meta["inputs"]), "C": {"prompt": [1], "continuation": [2]}}
    assert refusal_reasons(a, _other(a, inputs=inputs, token_path_sha256="q" * 64)) == [
        "token paths differ: request C only in rhs"]
    fewer = {"A": copy.deepcopy(a.meta["inputs"]["A"])}
    assert refusal_reasons(a, _other(a, inputs=fewer, token_path_sha256="q" * 64), ("x", "y")) == [
        "token paths differ: request B only in x"]


def test_the_rows_and_the_vocabulary_are_compared_when_nothing_else_differs():
    a = _col()
    one_row = _other(a, rows=a.meta["rows"][:1])
    assert refusal_reasons(a, one_row) == ["row sets differ: lhs 2 rows, rhs 1 (e.g. [('B', 0)])"]
    wider = _other(a)
    wider.arrays = {"logits": np.zeros((2, 17), np.float32)}
    assert refusal_reasons(a, wider) == ["vocabularies differ: 16 vs 17"]


# ----------------------------------------------------------------------------- the fixed gate's K/V


def _kv(k: np.ndarray, v: np.ndarray, positions=(0, 1)) -> Collection:
    """K/V of one request at `positions` in one prefill step: arrays [token, layer, kv_head, head_dim]."""
    n = len(positions)
    meta = {"suite": {"name": "kv"}, "kv": {"requests": ["A"], "cases": ["c"]},
            "steps": [{"case": "c", "step": 1, "phase": "prefill"}]}
    arrays = {"kv_k": k.astype(np.float32), "kv_v": v.astype(np.float32),
              "kv_case": np.zeros(n, np.int64), "kv_request": np.zeros(n, np.int64),
              "kv_position": np.asarray(positions, np.int64), "kv_step": np.ones(n, np.int64)}
    return Collection(meta=meta, arrays=arrays)


def _th(kv_max_abs=0.5, rel_l2=10.0):
    return {"kv_max_abs": kv_max_abs, "rel_l2": rel_l2, "given": {"kv_max_abs": True}}


def test_kv_is_judged_layer_by_layer_and_a_step_takes_its_worst_layer():
    ones = np.ones((2, 3, 1, 4))                  # 2 tokens, 3 layers
    k = ones.copy()
    k[1, 2, 0, 3] += 0.5                          # layer 2: max|diff| 0.5, exactly the gate: passes
    v = ones.copy()
    v[0, 1, 0, 0] += 0.25                         # layer 1 of V: 0.25
    res = compare_kv(_kv(k, v), _kv(ones, ones), _th())
    (step,) = res["steps"]
    assert step["k_max_abs_per_layer"] == [0.0, 0.0, 0.5] and step["k_max_abs"] == 0.5
    assert step["v_max_abs_per_layer"] == [0.0, 0.25, 0.0] and step["v_max_abs"] == 0.25
    assert step["status"] == "PASS" and res["worst_max_abs"] == 0.5 and res["failed_steps"] == 0
    k[0, 0, 0, 0] += 0.5001                       # layer 0 past the gate
    res = compare_kv(_kv(k, v), _kv(ones, ones), _th())
    assert res["steps"][0]["status"] == "FAIL" and res["steps"][0]["reason"].startswith("layer 0 K: max|diff| 0.5")
    assert res["first_failure"] == "case c step 1 (prefill): " + res["steps"][0]["reason"]


def test_kv_rel_l2_is_per_layer_against_the_rhs_and_a_zero_rhs_layer_is_infinitely_far_unless_equal():
    a = np.ones((2, 2, 1, 4))
    b = np.ones((2, 2, 1, 4))
    b[:, 1] = 0.0                                 # layer 1 of the rhs is zero: any difference there is inf
    res = compare_kv(_kv(a, b), _kv(b, b), _th(kv_max_abs=5.0, rel_l2=0.1))
    step = res["steps"][0]
    assert step["status"] == "FAIL" and "layer 1 K" in step["reason"] and "rel-L2 inf" in step["reason"]
    same = compare_kv(_kv(b, b), _kv(b, b), _th(kv_max_abs=0.0, rel_l2=0.0))
    assert same["steps"][0]["status"] == "PASS" and same["worst_rel_l2"] == 0.0 and same["worst_max_abs"] == 0.0
    zeros = np.zeros((2, 2, 1, 4))                # all zero on both sides: equal, at distance 0
    same = compare_kv(_kv(zeros, zeros), _kv(zeros, zeros), _th(kv_max_abs=0.0, rel_l2=0.0))
    assert same["steps"][0]["status"] == "PASS" and same["worst_rel_l2"] == 0.0


def test_kv_written_twice_at_one_position_is_matched_in_order_and_other_sets_are_refused():
    k = np.stack([np.full((1, 1, 2), 1.0), np.full((1, 1, 2), 2.0)])   # position 0 written twice (a chunk redone)
    res = compare_kv(_kv(k, k, positions=(0, 0)), _kv(k, k, positions=(0, 0)), _th(kv_max_abs=0.0))
    assert res["tokens"] == 2 and res["steps"][0]["status"] == "PASS"
    with pytest.raises(LabkitError, match=r"different \(request, position\) sets \(2 vs 2 tokens\)"):
        compare_kv(_kv(k, k, positions=(0, 0)), _kv(k, k, positions=(0, 1)), _th())


# ----------------------------------------------------------------------------- the fixed gate's rows


def _rows_col(logits: np.ndarray, **meta) -> Collection:
    col = _col(**meta)
    col.meta["rows"] = [{"index": i, "request_id": rid, "output_index": 0, "case": "c", "context_len": 3,
                         "step": i + 1, "phase": "decode"} for i, rid in enumerate(("A", "B"))]
    col.meta.update(dtype="float32", device={"type": "cpu"}, backend="hf")
    col.arrays = {"logits": np.asarray(logits, np.float32)}
    return col


def test_fixed_rows_take_each_rows_own_top1_and_a_zero_reference_row_is_infinitely_far():
    from labkit.logits.compare import compare

    ref = [[0.0, 1.0, 5.0, 0.0], [4.0, 0.0, 1.0, 0.0]]    # row A peaks at 2, row B at 0 (no column's peak)
    res = compare(_rows_col(ref), _rows_col(ref), gate="fixed", max_abs=0.1, rel_l2=0.1)
    assert res["verdict"] == "PASS" and [r["top1_rhs"] for r in res["rows"]] == [2, 0]
    zero = [[0.0, 0.0, 0.0, 0.0], [4.0, 0.0, 1.0, 0.0]]
    near = [[0.5, 0.0, 0.0, 0.0], [4.0, 0.0, 1.0, 0.0]]   # 0.5 off a zero row: rel-L2 has no scale but inf
    res = compare(_rows_col(near), _rows_col(zero), gate="fixed", max_abs=10.0, rel_l2=0.1)
    assert res["rows"][0]["rel_l2"] == float("inf") and res["rows"][0]["status"] == "FAIL"
    assert res["rows"][0]["reason"].startswith("rel-L2 inf > 0.1")
    res = compare(_rows_col(zero), _rows_col(zero), gate="fixed", max_abs=0.0, rel_l2=0.0)
    assert res["rows"][0]["rel_l2"] == 0.0 and res["verdict"] == "PASS"    # equal zero rows: no distance


def test_the_first_review_named_is_the_first_row_in_review():
    from labkit.logits.compare import compare

    ref = [[0.0, 5.0, 1.0, 0.0], [4.0, 3.99, 1.0, 0.0]]   # row B's top two 0.01 apart
    flipped = [[0.0, 5.0, 1.0, 0.0], [3.99, 4.0, 1.0, 0.0]]
    res = compare(_rows_col(flipped), _rows_col(ref), gate="fixed", max_abs=0.1, rel_l2=0.1)
    assert [r["status"] for r in res["rows"]] == ["PASS", "REVIEW"] and res["verdict"] == "REVIEW"
    assert res["summary"]["first_review"].startswith("row 1 (B output 0")


# ----------------------------------------------------------------------------- the FP8 cost in the summary


def test_a_verdict_raised_by_the_fp8_cost_says_why_in_the_summary():
    from labkit.logits.compare import _add_cost

    def body(first_failure=None):
        return {"verdict": "PASS", "summary": {"first_failure": first_failure, "first_review": None}}

    quantised_ok = {"status": "PASS", "text": "the pool held e4m3"}
    review = {"status": "REVIEW", "baseline": {"verdict": "REVIEW", "first_problem": "row 3: near tie"},
              "quantised": quantised_ok}
    b = body()
    _add_cost(b, review)
    why = "the model-dtype baseline (the cost's denominator) is REVIEW: row 3: near tie"
    assert b["verdict"] == "REVIEW" and b["summary"]["cost_review"] == why == b["summary"]["first_review"]
    assert b["summary"]["cost_failure"] is None and b["summary"]["first_failure"] is None
    failed = {"status": "FAIL", "baseline": {"verdict": "PASS", "first_problem": None},
              "quantised": {"status": "FAIL", "text": "the pool held bfloat16, not e4m3"}}
    b = body()
    _add_cost(b, failed)
    assert b["verdict"] == "FAIL" and b["summary"]["first_failure"] == "the pool held bfloat16, not e4m3"
    b = body(first_failure="row 0: rel-L2 9 > 1")       # the rows' own first failure stays the first named
    _add_cost(b, failed)
    assert b["summary"]["first_failure"] == "row 0: rel-L2 9 > 1"
    assert b["summary"]["cost_failure"] == "the pool held bfloat16, not e4m3"


# ----------------------------------------------------------------------------- the notes and the thresholds


def test_the_notes_say_what_differs_between_the_sides_and_a_graph_that_never_ran():
    from labkit.logits.compare import compare

    ref = [[0.0, 1.0, 5.0, 0.0], [4.0, 0.0, 1.0, 0.0]]
    same = compare(_rows_col(ref), _rows_col(ref), gate="fixed")
    assert same["notes"] == []
    bf16 = _rows_col(ref)
    bf16.meta.update(dtype="bfloat16", device={"type": "cuda"}, backend="engine", requested={"execution": "graph"},
                     steps=[{"execution": "eager"}])
    notes = compare(bf16, _rows_col(ref), gate="fixed")["notes"]
    assert notes == ["lhs asked for --execution graph but every step ran eager: no graph replay was exercised",
                     "dtypes differ: lhs bfloat16, rhs float32",
                     "the collections ran on different device types: lhs cuda, rhs cpu"]
    bf16.meta["steps"] = [{"execution": "graph"}]
    assert not any("asked for --execution graph" in n for n in compare(bf16, _rows_col(ref), gate="fixed")["notes"])


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan"), -float("inf")])
def test_a_threshold_must_be_a_finite_number_at_least_zero(bad):
    from labkit.logits.compare import thresholds_for

    col = _col()
    assert thresholds_for(col, col, 0.0, None, None)["max_abs"] == 0.0
    with pytest.raises(LabkitError, match="--rel-l2 must be a finite number >= 0"):
        thresholds_for(col, col, None, bad, None)
