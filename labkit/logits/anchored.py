"""Compare collections under the anchored gate (labkit/logits/gates.py has the rule and its figures).

One or two judged sides (lhs; rhs too for engine-vs-engine suites), each against the float32 truth, with
the reference (Transformers in the judged dtype; with its K/V round-tripped through e4m3 for a side with an FP8
KV cache, labkit/logits/hf_fp8.py) as the noise yardstick. Every row records each side's
distances to the truth, the reference's, the ratio and the status; two judged sides also get their distance
to each other (for information: it is bounded by the sum of their distances to the truth).
"""
from __future__ import annotations

import math

import numpy as np

from labkit.errors import LabkitError
from labkit.logits import gates
from labkit.logits.collect import Collection
from labkit.logits.suites import is_fp8

_RANK = {"PASS": 0, "REVIEW": 1, "FAIL": 2}


def worst(*statuses: str) -> str:
    return max(statuses, key=_RANK.__getitem__, default="PASS")


def dtype_of(col: Collection) -> str:
    return col.meta.get("dtype") or "float32"


def kv_fp8(col: Collection) -> bool:
    """The collection's KV cache (engine) or its K/V round trip (Transformers) is FP8."""
    return is_fp8(col.meta.get("kv_cache_dtype"))


def needs_reference(col: Collection) -> bool:
    """A side that rounds more than float32 does somewhere (a bf16/fp16 model, or an FP8 KV cache at any model
    dtype) is measured against a reference of the same arithmetic; a float32 one against the float32 floor."""
    return dtype_of(col) in gates.LOW_PRECISION or kv_fp8(col)


def arithmetic(col: Collection) -> str:
    """The side's arithmetic in words: "bfloat16", "bfloat16 with e4m3 K/V"."""
    return dtype_of(col) + (" with e4m3 K/V" if kv_fp8(col) else "")


def aligned_logits(col: Collection, order_rows: list[dict]) -> np.ndarray:
    """col's logits in the row order of `order_rows` (rows are keyed by request and output index)."""
    index = {(r["request_id"], r["output_index"]): i for i, r in enumerate(col.meta["rows"])}
    return col.arrays["logits"][[index[(r["request_id"], r["output_index"])] for r in order_rows]]


def check_roles(sides: dict[str, Collection], truth: Collection, reference: Collection | None) -> list[str]:
    """Refuse what the rule cannot judge (LabkitError, exit 2); return notes on what it judges loosely."""
    notes = []
    if dtype_of(truth) != "float32":
        raise LabkitError(f"--gate anchored: the truth must be a float32 collection, this one is {dtype_of(truth)} "
                          "(collect it with --backend hf --dtype float32, or use --gate fixed)", code=2)
    if kv_fp8(truth):
        raise LabkitError("--gate anchored: the truth's K/V went through e4m3: the truth must be Transformers "
                          "float32 without quantisation (collect it without --kv-cache-dtype)", code=2)
    if truth.meta.get("backend") != "hf":
        notes.append(f"the truth is a {truth.meta.get('backend')} collection, not Transformers: the rule assumes "
                     "an independent implementation")
    low = {name: c for name, c in sides.items() if needs_reference(c)}
    if low and reference is None:
        name, c = next(iter(low.items()))
        fp8 = " --kv-cache-dtype fp8" if kv_fp8(c) else ""
        raise LabkitError(f"--gate anchored: {name} is {arithmetic(c)}: the rule needs Transformers' own "
                          f"{arithmetic(c)} run as the reference (--reference PREFIX, from `collect --backend hf "
                          f"--dtype {dtype_of(c)}{fp8}`), or use --gate fixed", code=2)
    if reference is not None:
        for name, c in low.items():
            if dtype_of(c) != dtype_of(reference):
                raise LabkitError(f"--gate anchored: {name} is {dtype_of(c)} but the reference is "
                                  f"{dtype_of(reference)}: the reference must be Transformers in the judged dtype",
                                  code=2)
            if kv_fp8(c) != kv_fp8(reference):
                how = ("collect it with --kv-cache-dtype fp8" if kv_fp8(c) else "collect it without --kv-cache-dtype")
                raise LabkitError(f"--gate anchored: {name} is {arithmetic(c)} but the reference is "
                                  f"{arithmetic(reference)}: the reference must do the judged side's arithmetic "
                                  f"({how})", code=2)
        if not low:
            notes.append(f"every judged side is float32: the {arithmetic(reference)} reference is not used (the "
                         "float32 floor is)")
        elif reference.meta.get("backend") != "hf":
            notes.append(f"the reference is a {reference.meta.get('backend')} collection, not Transformers")
    return notes


def compare_rows(sides: dict[str, Collection], truth: Collection, reference: Collection | None) -> tuple[list, dict]:
    """Per-row judgement of every side; the per-side overall judgement."""
    first = next(iter(sides.values()))
    order = first.meta["rows"]
    t = aligned_logits(truth, order)
    ref = aligned_logits(reference, order) if reference is not None else None
    ref_d = gates.row_distances(ref, t) if ref is not None else None
    top_t, margin = gates.truth_margins(t)
    judged, overall, logits = {}, {}, {}
    for name, col in sides.items():
        x = aligned_logits(col, order)
        logits[name] = x
        use_ref = ref_d if needs_reference(col) else None
        judged[name] = gates.judge_side(x, t, dtype_of(col), use_ref)
        overall[name] = gates.judge_overall(x, t, dtype_of(col), ref if use_ref is not None else None)
    mutual = None
    if len(sides) == 2:
        a, b = logits.values()
        mutual = gates.row_distances(a, b)
    rows = []
    for i, r in enumerate(order):
        per = {name: judged[name][i] for name in sides}
        status = worst(*(p["status"] for p in per.values()))
        reasons = [(f"{name}: " if len(sides) > 1 else "") + p["reason"]
                   for name, p in per.items() if p["status"] == status and p["reason"]]
        if status == "PASS":  # near-tie notes only
            reasons = [(f"{name}: " if len(sides) > 1 else "") + p["reason"] for name, p in per.items() if p["reason"]]
        worst_side = max(per, key=lambda n: per[n]["ratio"] if math.isfinite(per[n]["ratio"]) else math.inf)
        row = {
            "index": r["index"], "request_id": r["request_id"], "output_index": r["output_index"], "case": r["case"],
            "context_len": r["context_len"], "step": r.get("step"), "phase": r.get("phase"),
            "execution": r.get("execution"), "graph_batch": r.get("graph_batch"),
            "cached_tokens": r.get("cached_tokens"),
            "truth_top1": int(top_t[i]), "truth_top2_margin": float(margin[i]),
            "reference_to_truth": None if ref_d is None else
            {"rel_l2": float(ref_d["rel_l2"][i]), "max_abs": float(ref_d["max_abs"][i]), "top1": int(ref_d["top1"][i])},
            "to_truth": per,
            "ratio": per[worst_side]["ratio"], "ratio_side": worst_side,
            "rel_l2": max(p["rel_l2"] for p in per.values()), "max_abs": max(p["max_abs"] for p in per.values()),
            "top1_agree": all(p["top1_agree"] for p in per.values()),
            "status": status, "reason": "; ".join(reasons),
        }
        if mutual is not None:
            row["lhs_to_rhs"] = {"rel_l2": float(mutual["rel_l2"][i]), "max_abs": float(mutual["max_abs"][i]),
                                 "top1_agree": bool(per["lhs"]["top1"] == per["rhs"]["top1"])}
        rows.append(row)
    return rows, overall


# ------------------------------------------------------------------------------------------------
# New K/V


def _kv_index(col: Collection) -> dict[tuple, int]:
    """(case name, request id, position) -> the last token that wrote it."""
    reqs, cases = col.meta["kv"]["requests"], col.meta["kv"]["cases"]
    return {(cases[c], reqs[r], p): i for i, (c, r, p) in enumerate(zip(
        col.arrays["kv_case"].tolist(), col.arrays["kv_request"].tolist(), col.arrays["kv_position"].tolist()))}


def compare_kv(sides: dict[str, Collection], truth: Collection, reference: Collection | None) -> dict:
    missing = [n for n, c in sides.items() if "kv_k" not in c.arrays]
    if len(missing) == len(sides):
        return {"compared": False, "reason": f"suite {truth.meta['suite']['name']} records no K/V"}
    if missing:
        return {"compared": False, "reason": f"{' and '.join(missing)} holds no K/V"}
    for role, col in (("the truth", truth), ("the reference", reference)):
        if col is not None and "kv_k" not in col.arrays and (role == "the truth" or any(
                needs_reference(c) for c in sides.values())):
            raise LabkitError(f"--gate anchored: {role} holds no K/V for the kv suite (collect it again with this "
                              f"labkit: `collect --suite kv --backend hf`)", code=2)
    t_index = _kv_index(truth)
    r_index = _kv_index(reference) if reference is not None and "kv_k" in reference.arrays else None
    out_sides = {}
    for name, col in sides.items():
        low = needs_reference(col)
        reqs, cases = col.meta["kv"]["requests"], col.meta["kv"]["cases"]
        keys = [(cases[c], reqs[r], p) for c, r, p in zip(col.arrays["kv_case"].tolist(),
                                                          col.arrays["kv_request"].tolist(),
                                                          col.arrays["kv_position"].tolist())]
        absent = [k for k in keys if k not in t_index or (low and r_index is not None and k not in r_index)]
        if absent:
            raise LabkitError(f"cannot compare K/V: {name} wrote (case, request, position) {absent[0]} that the "
                              "truth or reference did not", code=2)
        groups: dict[tuple, list[int]] = {}
        for i, (c, s) in enumerate(zip(col.arrays["kv_case"].tolist(), col.arrays["kv_step"].tolist())):
            groups.setdefault((cases[c], s), []).append(i)
        phases = {(s["case"], s["step"]): s["phase"] for s in col.meta.get("steps", [])}
        steps = []
        for (case, step), idx in groups.items():
            tidx = [t_index[keys[i]] for i in idx]
            ridx = [r_index[keys[i]] for i in idx] if (low and r_index is not None) else None
            entry = {"case": case, "step": step, "phase": phases.get((case, step)), "tokens": len(idx)}
            worst_ratio, worst_text = 0.0, ""
            for kind in ("k", "v"):
                g = gates.judge_kv_group(col.arrays[f"kv_{kind}"][idx], truth.arrays[f"kv_{kind}"][tidx],
                                         None if ridx is None else reference.arrays[f"kv_{kind}"][ridx],
                                         dtype_of(col))
                entry[kind] = g
                r = g["worst_ratio"]
                # Both K and V are judged (the step's summary reads each); a non-finite K stays the cause.
                if math.isfinite(worst_ratio) and (not math.isfinite(r) or r > worst_ratio):
                    L = g["worst_layer"]
                    worst_ratio = r
                    worst_text = (f"layer {L} {kind.upper()}: distance to the truth {r:.2g}x the noise (rel-L2 "
                                  f"{g['rel_l2'][L]:.3g} vs {g['noise_rel_l2'][L]:.3g}, max|diff| "
                                  f"{g['max_abs'][L]:.3g} vs {g['noise_max_abs'][L]:.3g})")
            entry["ratio"] = worst_ratio
            entry["status"] = gates.grade(worst_ratio, gates.ROW_PASS, gates.ROW_FAIL)
            entry["reason"] = "" if entry["status"] == "PASS" else worst_text
            steps.append(entry)
        all_t = list(t_index[k] for k in keys)
        overall = {}
        for kind in ("k", "v"):
            x = col.arrays[f"kv_{kind}"].reshape(len(keys), -1)
            t = truth.arrays[f"kv_{kind}"][all_t].reshape(len(keys), -1)
            ref = (reference.arrays[f"kv_{kind}"][[r_index[k] for k in keys]].reshape(len(keys), -1)
                   if low and r_index is not None else None)
            overall[kind] = gates.judge_overall(x, t, dtype_of(col), ref)
        first_fail = next((e for e in steps if e["status"] == "FAIL"), None)
        first_review = next((e for e in steps if e["status"] == "REVIEW"), None)
        where = (lambda e: None if e is None else f"case {e['case']} step {e['step']} ({e['phase']}): {e['reason']}")
        out_sides[name] = {
            "steps": steps, "overall": overall,
            "failed_steps": sum(e["status"] == "FAIL" for e in steps),
            "review_steps": sum(e["status"] == "REVIEW" for e in steps),
            "worst_ratio": max((e["ratio"] for e in steps), default=0.0),
            "worst_max_abs": max((max(e["k"]["max_abs"] + e["v"]["max_abs"]) for e in steps), default=0.0),
            "first_failure": where(first_fail), "first_review": where(first_review),
        }
    label = (lambda n: f"{n}: " if len(sides) > 1 else "")
    overall_bad = [(n, k, o) for n, s in out_sides.items() for k, o in s["overall"].items() if o["status"] != "PASS"]
    first = next((f"{label(n)}{s['first_failure']}" for n, s in out_sides.items() if s["first_failure"]), None)
    if first is None:
        first = next((f"{label(n)}new {k.upper()} overall: {o['reason']}" for n, k, o in overall_bad
                      if o["status"] == "FAIL"), None)
    review = next((f"{label(n)}{s['first_review']}" for n, s in out_sides.items() if s["first_review"]), None)
    if review is None:
        review = next((f"{label(n)}new {k.upper()} overall: {o['reason']}" for n, k, o in overall_bad
                       if o["status"] == "REVIEW"), None)
    status = worst(*(e["status"] for s in out_sides.values() for e in s["steps"]),
                   *(o["status"] for s in out_sides.values() for o in s["overall"].values()))
    return {
        "compared": True, "rule": "anchored", "status": status,
        "tokens": len(next(iter(sides.values())).arrays["kv_k"]),
        "sides": out_sides,
        "steps": next(iter(out_sides.values()))["steps"],
        "failed_steps": sum(s["failed_steps"] for s in out_sides.values()),
        "review_steps": sum(s["review_steps"] for s in out_sides.values()),
        "worst_ratio": max(s["worst_ratio"] for s in out_sides.values()),
        "worst_max_abs": max(s["worst_max_abs"] for s in out_sides.values()),
        "worst_rel_l2": max(o["rel_l2"] for s in out_sides.values() for o in s["overall"].values()),
        "first_failure": first, "first_review": review,
    }


# ------------------------------------------------------------------------------------------------


def compare(lhs: Collection, truth: Collection, reference: Collection | None = None,
            rhs: Collection | None = None) -> dict:
    """The anchored result body (rows, per-side overall, K/V, summary); the caller checks comparability."""
    sides = {"lhs": lhs} if rhs is None else {"lhs": lhs, "rhs": rhs}
    notes = check_roles(sides, truth, reference)
    rows, overall = compare_rows(sides, truth, reference)
    kv = compare_kv(sides, truth, reference)
    row_status = worst(*(r["status"] for r in rows))
    overall_status = worst(*(o["status"] for o in overall.values()))
    verdict = worst(row_status, overall_status, kv.get("status", "PASS") if kv.get("compared") else "PASS")
    n_fail = sum(r["status"] == "FAIL" for r in rows)
    n_review = sum(r["status"] == "REVIEW" for r in rows)
    first_fail = next((r for r in rows if r["status"] == "FAIL"), None)
    first_review = next((r for r in rows if r["status"] == "REVIEW"), None)
    label = (lambda n: f"{n} " if len(sides) > 1 else "")
    overall_fail = next((f"{label(n)}overall: {o['reason']}" for n, o in overall.items() if o["status"] == "FAIL"),
                        None)
    overall_review = next((f"{label(n)}overall: {o['reason']}" for n, o in overall.items()
                           if o["status"] == "REVIEW"), None)
    finite = [r for r in rows if math.isfinite(r["ratio"])] or rows
    worst_ratio = max(finite, key=lambda r: r["ratio"])
    return {
        "verdict": verdict,
        "rows": rows,
        "overall": overall,
        "kv": kv,
        "judged": list(sides),
        "notes": notes,
        "summary_counts": {
            "rows": len(rows), "passed": len(rows) - n_fail - n_review, "review": n_review, "failed": n_fail,
            "top1_agree": sum(r["top1_agree"] for r in rows),
            "near_tie_flips": sum(any(p["near_tie_flip"] for p in r["to_truth"].values()) for r in rows),
            "worst_ratio": {"value": worst_ratio["ratio"], "side": worst_ratio["ratio_side"],
                            "row": worst_ratio["index"]},
            "first_failure_row": first_fail, "first_review_row": first_review,
            "overall_failure": overall_fail, "overall_review": overall_review,
        },
    }
