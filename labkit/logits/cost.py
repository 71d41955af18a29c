"""What an FP8 KV cache costs in numbers: the `fp8-kv` suite's second judgement and its ratio.

The suite's main judgement (labkit/logits/anchored.py) holds the FP8 engine (lhs) to the float32 truth, with
Transformers doing the same FP8 arithmetic (its K/V round-tripped through e4m3, labkit/logits/hf_fp8.py) as
the noise yardstick: is the engine's FP8 path as good as an accepted FP8 implementation? This module sets the
same engine with the model-dtype pool (the *baseline*, same token paths and states) beside it:

    cost            pooled rel-L2 to the truth of the FP8 engine / that of the baseline engine: how much
                    further from the model's function FP8 puts the engine. Stated, not judged.
    reference cost  the same ratio for Transformers (its e4m3 run over its plain run): what FP8 costs an
                    accepted implementation on these paths; the engine's cost should sit near it.
    baseline        judged by the anchored rule against its own reference (Transformers in the model dtype,
                    no quantisation): a wrong denominator would make the cost meaningless, so its verdict
                    joins the suite's.
    quantised       the FP8 engine must be nearer the FP8 reference's distance than the plain reference's (on a
                    log scale: at least their geometric mean). An engine that does not store (or read) its K/V
                    as e4m3 sits at the plain distance: FAIL, "not the FP8 arithmetic". Where Transformers' own
                    cost is under DISCERNIBLE, FP8 is lost in the model dtype's noise on these paths and the
                    check cannot tell: it says so (status n/a) and does not judge.

Figures measured on CPU, tiny fake model, seeds 0-2 (docs/logits-check.md has the table): bf16 reference cost
3.50-3.69x, engine cost 4.19-4.26x (its bf16 baseline is nearer the truth than Transformers' bf16 run); fp16
26.8-27.8x and 32.2-32.5x; the geometric-mean bound sits 1.85x (bf16) under the honest FP8 distance. An engine
whose pool is not FP8: cost ~1x, quantised FAIL (tests/test_logits_fp8_kv.py).
"""
from __future__ import annotations

import math

import numpy as np

from labkit.errors import LabkitError
from labkit.logits import anchored, gates
from labkit.logits.collect import Collection

# Transformers' own FP8 cost (its e4m3 distance over its plain one) from which FP8 is visible in the logits.
DISCERNIBLE = 2.0


def _pooled(col: Collection, order: list[dict], truth: np.ndarray) -> float:
    return gates.pooled_rel(anchored.aligned_logits(col, order), truth)


def check_roles(lhs: Collection, baseline: Collection, reference: Collection | None,
                baseline_reference: Collection | None) -> None:
    """Refuse (exit 2) what the cost cannot be computed from."""
    if not anchored.kv_fp8(lhs):
        raise LabkitError("--baseline: the cost of an FP8 KV cache is the lhs's distance over the baseline's, so "
                          f"the lhs must have kv_cache_dtype fp8 (it has {lhs.meta.get('kv_cache_dtype') or 'auto'})",
                          code=2)
    if anchored.kv_fp8(baseline):
        raise LabkitError("--baseline: the baseline must be the same engine with the model-dtype pool (kv_cache_dtype "
                          "auto); this one is FP8 too", code=2)
    if anchored.dtype_of(baseline) != anchored.dtype_of(lhs):
        raise LabkitError(f"--baseline: the lhs is {anchored.dtype_of(lhs)} and the baseline "
                          f"{anchored.dtype_of(baseline)}: only the KV cache dtype may differ", code=2)
    if reference is None:
        raise LabkitError("--baseline: the cost needs the FP8 reference (--reference)", code=2)
    if anchored.needs_reference(baseline) and baseline_reference is None:
        dt = anchored.dtype_of(baseline)
        raise LabkitError(f"--baseline is {dt}: judge it against Transformers' own {dt} run, without quantisation "
                          f"(--baseline-reference PREFIX, from `collect --backend hf --dtype {dt}`)", code=2)
    if baseline_reference is not None and anchored.kv_fp8(baseline_reference):
        raise LabkitError("--baseline-reference: its K/V went through e4m3; the baseline's reference is "
                          "Transformers without quantisation", code=2)


def judge(lhs: Collection, baseline: Collection, truth: Collection, reference: Collection,
          baseline_reference: Collection | None) -> dict:
    """The cost section of the check: the baseline's own judgement, the two ratios and the quantised check."""
    order = lhs.meta["rows"]
    t = anchored.aligned_logits(truth, order)
    base_body = anchored.compare(baseline, truth, baseline_reference)
    fp8_d = _pooled(lhs, order, t)
    base_d = _pooled(baseline, order, t)
    ref_fp8 = _pooled(reference, order, t)
    floor = gates.FLOORS.get(anchored.dtype_of(baseline), gates.FLOORS["float32"])["rel_l2"]
    ref_plain = _pooled(baseline_reference, order, t) if baseline_reference is not None else None
    plain = max(ref_plain, floor) if ref_plain is not None else floor
    cost = fp8_d / base_d if base_d > 0 else math.inf
    ref_cost = ref_fp8 / plain
    quantised = _quantised(fp8_d, ref_fp8, plain, ref_cost)
    s = base_body["summary_counts"]
    row = s["first_failure_row"] or (None if s["overall_failure"] else s["first_review_row"])
    base_first = (f"row {row['index']} ({row['request_id']} output {row['output_index']}): {row['reason']}" if row
                  else s["overall_failure"] or s["overall_review"])
    status = anchored.worst(base_body["verdict"], quantised["status"] if quantised["status"] != "n/a" else "PASS")
    return {
        "status": status,
        "ratio": cost,
        "reference_ratio": ref_cost,
        "rel_l2": {"fp8": fp8_d, "baseline": base_d, "reference_fp8": ref_fp8, "reference_plain": ref_plain},
        "text": cost_text(cost, ref_cost),
        "baseline": {
            "verdict": base_body["verdict"], "rows": s["rows"], "passed": s["passed"], "review": s["review"],
            "failed": s["failed"], "worst_ratio": s["worst_ratio"]["value"], "overall": base_body["overall"]["lhs"],
            "first_problem": base_first, "notes": base_body["notes"],
            "rows_to_truth": [{"rel_l2": r["rel_l2"], "max_abs": r["max_abs"], "ratio": r["ratio"],
                               "status": r["status"]} for r in base_body["rows"]],
        },
        "quantised": quantised,
        "rule": {"discernible": DISCERNIBLE,
                 "quantised": "the FP8 engine's pooled rel-L2 to the truth >= the geometric mean of the FP8 "
                              "reference's and the plain reference's (floored), where the reference's own cost is "
                              f">= {DISCERNIBLE:g}x"},
    }


def _quantised(fp8_d: float, ref_fp8: float, plain: float, ref_cost: float) -> dict:
    if not math.isfinite(fp8_d):
        return {"status": "PASS", "bound": None, "text": "non-finite logits: judged by the rows"}
    if ref_cost < DISCERNIBLE:
        return {"status": "n/a", "bound": None,
                "text": f"Transformers' own FP8 cost is {ref_cost:.2f}x (< {DISCERNIBLE:g}x): FP8 is lost in the "
                        "model dtype's noise on these paths, so the logits cannot show whether the engine quantised"}
    bound = math.sqrt(ref_fp8 * plain)
    if fp8_d < bound:
        return {"status": "FAIL", "bound": bound,
                "text": f"not the FP8 arithmetic: the FP8 engine's pooled rel-L2 to the truth {fp8_d:.3g} is nearer "
                        f"the model-dtype reference's {plain:.3g} than the FP8 reference's {ref_fp8:.3g} (under their "
                        f"geometric mean {bound:.3g}): its K/V were not stored or read as e4m3"}
    return {"status": "PASS", "bound": bound,
            "text": f"the FP8 engine's pooled rel-L2 {fp8_d:.3g} is at least the geometric mean {bound:.3g} of the FP8 "
                    f"reference's {ref_fp8:.3g} and the model-dtype reference's {plain:.3g}: it quantised"}


def cost_text(cost: float, ref_cost: float) -> str:
    return (f"FP8 KV puts the engine {cost:.2f}x as far from the float32 truth as its model-dtype pool "
            f"(pooled rel-L2; Transformers: {ref_cost:.2f}x)")
