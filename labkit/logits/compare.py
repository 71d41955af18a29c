"""Compare collections row by row and judge them under one of two gates.

anchored (default; labkit/logits/gates.py has the rule and the figures behind it): every judged side (the
lhs; the rhs too when a separate float32 truth is given, as for engine-vs-engine suites) is judged by its
distance to the float32 truth (Transformers float32, same device and token path) against the distance of the
reference (Transformers in the judged dtype) to the same truth. A float32 side is held to the float32 floor.

fixed (--gate fixed; starting gates, not a measured noise level): lhs against rhs with fixed thresholds per dtype.
    FAIL    a non-finite value, max |diff| > --max-abs, or rel-L2 > --rel-l2 (||a - b|| / ||b||, b = rhs);
            or top-1 differs although the rhs's top two logits are further apart than the row's max |diff|
    REVIEW  within both thresholds, but top-1 differs and the rhs's top-two margin is no larger than the
            row's measured max |diff| (a near-tie that the measured error can flip)
    PASS    within both thresholds and the same top-1
    Defaults follow the less precise dtype of the two sides: bf16/fp16 use max-abs 0.5, rel-L2 0.02, new-KV
    max-abs 0.1; float32 uses 1e-4 / 1e-5 / 1e-4. On random-weight fake models the bf16 noise floor sits at
    these bf16 gates (docs/logits-check.md): a bf16 verdict under them is decided by rounding luck.

Verdict: FAIL if any row, overall figure or KV step fails, else REVIEW if any is REVIEW, else PASS. The
report's "What this shows" paragraph is written from the verdict.

Collections are refused (LabkitError, exit 2) when their suites, weights (config.json or any *.safetensors
sha256), token paths or row sets differ.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from labkit.errors import LabkitError
from labkit.logits import anchored, cost, gates
from labkit.logits.collect import Collection, prefix_of

GATES = ("anchored", "fixed")

DEFAULT_THRESHOLDS = {
    "float32": {"max_abs": 1e-4, "rel_l2": 1e-5, "kv_max_abs": 1e-4},
    "bfloat16": {"max_abs": 0.5, "rel_l2": 0.02, "kv_max_abs": 0.1},
    "float16": {"max_abs": 0.5, "rel_l2": 0.02, "kv_max_abs": 0.1},
}
_PRECISION = {"float32": 2, "float16": 1, "bfloat16": 0}

DOES_NOT_PROVE = ("It says nothing about sampling, EOS handling, cancellation or throughput, nor about other "
                  "inputs, batch shapes, models or devices; CPU-executed evidence shows the code path computes "
                  "the same function, not that a GPU kernel does.")


def _short(sha: str | None) -> str:
    return (sha or "none")[:12]


def refusal_reasons(lhs: Collection, rhs: Collection, names: tuple[str, str] = ("lhs", "rhs")) -> list[str]:
    """Why two collections cannot be compared (empty: they can); `names` label the two in the reasons."""
    a, b = lhs.meta, rhs.meta
    na, nb = names
    reasons = []
    sa, sb = a.get("suite", {}).get("name"), b.get("suite", {}).get("name")
    if sa != sb:
        reasons.append(f"suites differ: {na} {sa}, {nb} {sb}")
    fa, fb = a.get("model_files", {}), b.get("model_files", {})
    for name in sorted(set(fa) | set(fb)):
        if name not in fa or name not in fb:
            reasons.append(f"weights differ: {name} only in {na if name in fa else nb}")
        elif fa[name] != fb[name]:
            what = "model config differs" if name == "config.json" else "weights differ"
            reasons.append(f"{what}: {name} sha256 {_short(fa[name])} ({na}) vs {_short(fb[name])} ({nb})")
    if a.get("token_path_sha256") != b.get("token_path_sha256"):
        reasons.append("token paths differ: " + _path_difference(a, b, names))
    if not reasons:
        ka = {(r["request_id"], r["output_index"]) for r in a["rows"]}
        kb = {(r["request_id"], r["output_index"]) for r in b["rows"]}
        if ka != kb:
            only = sorted(ka ^ kb)[:3]
            reasons.append(f"row sets differ: {na} {len(ka)} rows, {nb} {len(kb)} (e.g. {only})")
        elif lhs.arrays["logits"].shape[1] != rhs.arrays["logits"].shape[1]:
            reasons.append(f"vocabularies differ: {lhs.arrays['logits'].shape[1]} vs {rhs.arrays['logits'].shape[1]}")
    return reasons


def _path_difference(a: dict, b: dict, names: tuple[str, str]) -> str:
    pa, pb = a.get("inputs", {}), b.get("inputs", {})
    seeds = f" (seed {a.get('seed')} vs {b.get('seed')})" if a.get("seed") != b.get("seed") else ""
    for rid in list(pa) + [r for r in pb if r not in pa]:
        if rid not in pa or rid not in pb:
            return f"request {rid} only in {names[0] if rid in pa else names[1]}{seeds}"
        for part in ("prompt", "continuation"):
            x, y = pa[rid][part], pb[rid][part]
            if x != y:
                if len(x) != len(y):
                    return f"request {rid} {part}: {len(x)} vs {len(y)} ids{seeds}"
                i = next(i for i, (u, v) in enumerate(zip(x, y)) if u != v)
                return f"request {rid} {part}[{i}]: {x[i]} vs {y[i]}{seeds}"
    return f"token path hashes differ{seeds}"


def check_comparable(lhs: Collection, rhs: Collection, names: tuple[str, str] = ("lhs", "rhs")) -> None:
    reasons = refusal_reasons(lhs, rhs, names)
    if reasons:
        raise LabkitError("cannot compare these collections: " + "; ".join(reasons), code=2)


def thresholds_for(lhs: Collection, rhs: Collection, max_abs: float | None, rel_l2: float | None,
                   kv_max_abs: float | None) -> dict:
    dtypes = [c.meta.get("dtype") or "float32" for c in (lhs, rhs)]
    basis = min(dtypes, key=lambda d: _PRECISION.get(d, 2))
    basis = basis if basis in DEFAULT_THRESHOLDS else "float32"
    d = DEFAULT_THRESHOLDS[basis]
    for name, v in (("--max-abs", max_abs), ("--rel-l2", rel_l2), ("--kv-max-abs", kv_max_abs)):
        if v is not None and (not math.isfinite(v) or v < 0):
            raise LabkitError(f"{name} must be a finite number >= 0, got {v}")
    return {
        "max_abs": d["max_abs"] if max_abs is None else float(max_abs),
        "rel_l2": d["rel_l2"] if rel_l2 is None else float(rel_l2),
        "kv_max_abs": d["kv_max_abs"] if kv_max_abs is None else float(kv_max_abs),
        "dtype_basis": basis,
        "given": {"max_abs": max_abs is not None, "rel_l2": rel_l2 is not None, "kv_max_abs": kv_max_abs is not None},
    }


def row_label(row: dict) -> str:
    where = f"step {row['step']} {row['phase']}" if row.get("step") is not None else "hf recompute"
    return (f"row {row['index']} ({row['request_id']} output {row['output_index']}, case {row['case']}, "
            f"{where}, context {row['context_len']} ids)")


def compare_rows(lhs: Collection, rhs: Collection, th: dict) -> list[dict]:
    rows_l = lhs.meta["rows"]
    index_r = {(r["request_id"], r["output_index"]): i for i, r in enumerate(rhs.meta["rows"])}
    order = [index_r[(r["request_id"], r["output_index"])] for r in rows_l]
    a = lhs.arrays["logits"].astype(np.float64)
    b = rhs.arrays["logits"][order].astype(np.float64)
    finite = np.isfinite(a).all(1) & np.isfinite(b).all(1)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = a - b
        max_abs = np.abs(diff).max(1)
        num, den = np.linalg.norm(diff, axis=1), np.linalg.norm(b, axis=1)
        rel = np.where(den > 0, num / np.where(den > 0, den, 1), np.where(num > 0, np.inf, 0.0))
    top_l, top_r = a.argmax(1), b.argmax(1)
    top2 = np.sort(np.where(np.isfinite(b), b, -np.inf), axis=1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    out = []
    for i, r in enumerate(rows_l):
        ma, rl, mg = float(max_abs[i]), float(rel[i]), float(margin[i])
        same = bool(top_l[i] == top_r[i])
        if not finite[i]:
            status, reason = "FAIL", "non-finite logits"
        elif ma > th["max_abs"] or rl > th["rel_l2"]:
            parts = []
            if ma > th["max_abs"]:
                parts.append(f"max|diff| {ma:.3g} > {th['max_abs']:g}")
            if rl > th["rel_l2"]:
                parts.append(f"rel-L2 {rl:.3g} > {th['rel_l2']:g}")
            status, reason = "FAIL", ", ".join(parts) + ("" if same else f", top-1 {top_l[i]} vs {top_r[i]}")
        elif not same:
            if mg <= ma:
                status, reason = "REVIEW", (f"top-1 {top_l[i]} vs {top_r[i]}: reference top-two margin {mg:.3g} "
                                            f"<= measured max|diff| {ma:.3g}")
            else:
                status, reason = "FAIL", (f"top-1 {top_l[i]} vs {top_r[i]} although the reference's top-two "
                                          f"margin {mg:.3g} > measured max|diff| {ma:.3g}")
        else:
            status, reason = "PASS", ""
        out.append({
            "index": r["index"], "request_id": r["request_id"], "output_index": r["output_index"], "case": r["case"],
            "context_len": r["context_len"], "step": r.get("step"), "phase": r.get("phase"),
            "execution": r.get("execution"), "graph_batch": r.get("graph_batch"),
            "cached_tokens": r.get("cached_tokens"), "max_abs": ma, "rel_l2": rl,
            "top1_lhs": int(top_l[i]), "top1_rhs": int(top_r[i]), "top1_agree": same,
            "ref_top2_margin": mg, "status": status, "reason": reason, "label": row_label(r),
        })
    return out


def _kv_keys(col: Collection) -> list[tuple]:
    reqs = col.meta["kv"]["requests"]
    seen: dict[tuple, int] = {}
    keys = []
    for c, r, p in zip(col.arrays["kv_case"].tolist(), col.arrays["kv_request"].tolist(),
                       col.arrays["kv_position"].tolist()):
        base = (int(c), reqs[r], int(p))
        n = seen.get(base, 0)
        seen[base] = n + 1
        keys.append(base + (n,))
    return keys


def compare_kv(lhs: Collection, rhs: Collection, th: dict) -> dict:
    has_l, has_r = "kv_k" in lhs.arrays, "kv_k" in rhs.arrays
    if not (has_l and has_r):
        missing = [s for s, h in (("lhs", has_l), ("rhs", has_r)) if not h]
        what = f"{' and '.join(missing)} {'hold' if len(missing) > 1 else 'holds'} no K/V"
        if th["given"]["kv_max_abs"]:
            raise LabkitError(f"--kv-max-abs: {what} (collect the kv suite with --backend engine on both sides)",
                              code=2)
        if len(missing) == 2:
            what = f"suite {lhs.meta['suite']['name']} records no K/V"
        return {"compared": False, "reason": what}
    kl, kr = _kv_keys(lhs), _kv_keys(rhs)
    index_r = {k: i for i, k in enumerate(kr)}
    if set(kl) != set(index_r) or len(kl) != len(kr):
        raise LabkitError(f"cannot compare K/V: the collections wrote different (request, position) sets "
                          f"({len(kl)} vs {len(kr)} tokens)", code=2)
    if lhs.arrays["kv_k"].shape[1:] != rhs.arrays["kv_k"].shape[1:]:
        raise LabkitError(f"cannot compare K/V: shapes differ {list(lhs.arrays['kv_k'].shape[1:])} vs "
                          f"{list(rhs.arrays['kv_k'].shape[1:])} ([layer, kv_head, head_dim])", code=2)
    order = np.asarray([index_r[k] for k in kl], dtype=np.int64)
    cases = lhs.meta["kv"]["cases"]
    steps_l = lhs.arrays["kv_step"]
    case_l = lhs.arrays["kv_case"]
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (c, s) in enumerate(zip(case_l.tolist(), steps_l.tolist())):
        groups.setdefault((c, s), []).append(i)
    phases = {(s["case"], s["step"]): s["phase"] for s in lhs.meta.get("steps", [])}
    out_steps = []
    for (c, s), idx in groups.items():
        idx_a = np.asarray(idx)
        entry = {"case": cases[c], "step": s, "phase": phases.get((cases[c], s)), "tokens": len(idx)}
        bad: list[tuple[int, int, str]] = []  # (layer, 0 for K / 1 for V, text)
        for which, name in enumerate(("k", "v")):
            a = lhs.arrays[f"kv_{name}"][idx_a].astype(np.float32, copy=False)
            b = rhs.arrays[f"kv_{name}"][order[idx_a]].astype(np.float32, copy=False)
            layers = a.shape[1]
            with np.errstate(invalid="ignore", over="ignore"):
                d = a - b
                per_max = np.abs(d).reshape(len(idx), layers, -1).max(axis=(0, 2))
                num2 = np.square(d, dtype=np.float64).reshape(len(idx), layers, -1).sum(axis=(0, 2))
                den2 = np.square(b, dtype=np.float64).reshape(len(idx), layers, -1).sum(axis=(0, 2))
                num, den = np.sqrt(num2), np.sqrt(den2)
            per_rel = np.where(den > 0, num / np.where(den > 0, den, 1), np.where(num > 0, np.inf, 0.0))
            finite = np.isfinite(a).reshape(len(idx), layers, -1).all(axis=(0, 2)) & \
                np.isfinite(b).reshape(len(idx), layers, -1).all(axis=(0, 2))
            per_max = np.where(finite, per_max, np.inf)
            per_rel = np.where(finite, per_rel, np.inf)
            den_all = math.sqrt(float(den2.sum())) if finite.all() else 0.0
            entry[f"{name}_max_abs"] = float(per_max.max())
            entry[f"{name}_rel_l2"] = (math.sqrt(float(num2.sum())) / den_all if den_all > 0
                                       else (0.0 if entry[f"{name}_max_abs"] == 0 else math.inf))
            entry[f"{name}_max_abs_per_layer"] = [float(x) for x in per_max]
            for layer in range(layers):
                if per_max[layer] > th["kv_max_abs"] or per_rel[layer] > th["rel_l2"]:
                    bad.append((layer, which, f"layer {layer} {name.upper()}: max|diff| {per_max[layer]:.3g}, "
                                              f"rel-L2 {per_rel[layer]:.3g}"))
        entry["status"] = "FAIL" if bad else "PASS"
        entry["reason"] = min(bad)[2] if bad else ""
        out_steps.append(entry)
    first = next((e for e in out_steps if e["status"] == "FAIL"), None)
    return {
        "compared": True,
        "tokens": len(kl),
        "steps": out_steps,
        "worst_max_abs": max((max(e["k_max_abs"], e["v_max_abs"]) for e in out_steps), default=0.0),
        "worst_rel_l2": max((max(e["k_rel_l2"], e["v_rel_l2"]) for e in out_steps), default=0.0),
        "failed_steps": sum(e["status"] == "FAIL" for e in out_steps),
        "first_failure": None if first is None else
        f"case {first['case']} step {first['step']} ({first['phase']}): {first['reason']}",
    }


def side_summary(col: Collection, prefix: str | Path) -> dict:
    m = col.meta
    cfg = m.get("config", {})
    return {
        "prefix": str(prefix_of(prefix)),
        "backend": m.get("backend"),
        "dtype": m.get("dtype"),
        "device": m.get("device"),
        "evidence": m.get("evidence"),
        "requested": m.get("requested"),
        "attention": cfg.get("attention_backend") or cfg.get("attn_implementation"),
        "tensor_parallel_size": cfg.get("tensor_parallel_size"),
        "code_path": m.get("code_path"),
        "model": m.get("model"),
        "seed": m.get("seed"),
        "versions": m.get("versions"),
        "git_head": m.get("git_head"),
        "wall_s": m.get("wall_s"),
    }


def _notes(cols: dict[str, Collection], judged_pair: bool) -> list[str]:
    """judged_pair: lhs and rhs are both judged (a dtype difference between them is worth a note)."""
    notes = []
    for label, col in cols.items():
        req = col.meta.get("requested") or {}
        if col.meta.get("backend") == "engine" and req.get("execution") == "graph":
            ran = {s.get("execution") for s in col.meta.get("steps", [])}
            if "graph" not in ran:
                notes.append(f"{label} asked for --execution graph but every step ran "
                             f"{'/'.join(sorted(x for x in ran if x)) or 'eager'}: no graph replay was exercised")
    if judged_pair and cols["lhs"].meta.get("dtype") != cols["rhs"].meta.get("dtype"):
        notes.append(f"dtypes differ: lhs {cols['lhs'].meta.get('dtype')}, rhs {cols['rhs'].meta.get('dtype')}")
    if len({(c.meta.get("device") or {}).get("type") for c in cols.values()}) > 1:
        notes.append("the collections ran on different device types: "
                     + ", ".join(f"{n} {(c.meta.get('device') or {}).get('type')}" for n, c in cols.items()))
    return notes


def _fixed(lhs: Collection, rhs: Collection, max_abs, rel_l2, kv_max_abs) -> dict:
    th = thresholds_for(lhs, rhs, max_abs, rel_l2, kv_max_abs)
    rows = compare_rows(lhs, rhs, th)
    kv = compare_kv(lhs, rhs, th)
    n_fail = sum(r["status"] == "FAIL" for r in rows)
    n_review = sum(r["status"] == "REVIEW" for r in rows)
    kv_fail = kv.get("compared") and kv["failed_steps"] > 0
    verdict = "FAIL" if (n_fail or kv_fail) else ("REVIEW" if n_review else "PASS")
    first_fail = next((r for r in rows if r["status"] == "FAIL"), None)
    first_review = next((r for r in rows if r["status"] == "REVIEW"), None)
    worst_abs = max(rows, key=lambda r: r["max_abs"])
    worst_rel = max(rows, key=lambda r: r["rel_l2"])
    return {
        "verdict": verdict,
        "gate": {"rule": "fixed", **{k: th[k] for k in ("max_abs", "rel_l2", "kv_max_abs", "dtype_basis")}},
        "thresholds": th,
        "summary": {
            "rows": len(rows), "passed": len(rows) - n_fail - n_review, "review": n_review, "failed": n_fail,
            "top1_agree": sum(r["top1_agree"] for r in rows),
            "worst_max_abs": {"value": worst_abs["max_abs"], "row": worst_abs["label"]},
            "worst_rel_l2": {"value": worst_rel["rel_l2"], "row": worst_rel["label"]},
            "first_failure": None if first_fail is None else f"{first_fail['label']}: {first_fail['reason']}",
            "first_failing_row": None if first_fail is None else first_fail["index"],
            "first_review": None if first_review is None else f"{first_review['label']}: {first_review['reason']}",
            "kv_first_failure": kv.get("first_failure"),
        },
        "rows": rows,
        "kv": kv,
    }


def _anchored(lhs: Collection, rhs: Collection, truth: Collection | None, reference: Collection | None) -> dict:
    judged_rhs = rhs if truth is not None else None
    truth = truth if truth is not None else rhs
    body = anchored.compare(lhs, truth, reference, judged_rhs)
    rows, c = body["rows"], body["summary_counts"]
    for r, src in zip(rows, lhs.meta["rows"]):
        r["label"] = row_label(src)
    by_index = {r["index"]: r for r in rows}
    ff, fr = c["first_failure_row"], c["first_review_row"]
    first_failure = f"{ff['label']}: {ff['reason']}" if ff else c["overall_failure"]
    first_review = f"{fr['label']}: {fr['reason']}" if fr else c["overall_review"]
    kv = body["kv"]
    if first_failure is None and kv.get("first_failure"):
        first_failure = f"new K/V {kv['first_failure']}"
    if first_review is None and kv.get("first_review") and body["verdict"] != "FAIL":
        first_review = f"new K/V {kv['first_review']}"
    worst_abs = max(rows, key=lambda r: r["max_abs"])
    worst_rel = max(rows, key=lambda r: r["rel_l2"])
    wr = c["worst_ratio"]
    return {
        "verdict": body["verdict"],
        "gate": {**gates.rule(), "judged": body["judged"]},
        "summary": {
            "rows": c["rows"], "passed": c["passed"], "review": c["review"], "failed": c["failed"],
            "top1_agree": c["top1_agree"], "top1_against": "truth", "near_tie_flips": c["near_tie_flips"],
            "worst_ratio": {**wr, "row": by_index[wr["row"]]["label"]},
            "worst_max_abs": {"value": worst_abs["max_abs"], "row": worst_abs["label"], "against": "truth"},
            "worst_rel_l2": {"value": worst_rel["rel_l2"], "row": worst_rel["label"], "against": "truth"},
            "overall": body["overall"],
            "first_failure": first_failure,
            "first_failing_row": ff["index"] if ff else None,
            "first_review": first_review,
            "kv_first_failure": kv.get("first_failure"),
            "lhs_to_rhs": None if "lhs_to_rhs" not in rows[0] else {
                "worst_rel_l2": max(r["lhs_to_rhs"]["rel_l2"] for r in rows),
                "worst_max_abs": max(r["lhs_to_rhs"]["max_abs"] for r in rows),
                "top1_agree": sum(r["lhs_to_rhs"]["top1_agree"] for r in rows),
                "note": "for information: bounded by the sum of the two distances to the truth"},
        },
        "rows": rows,
        "kv": kv,
        "gate_notes": body["notes"],
    }


def compare(lhs: Collection, rhs: Collection, *, gate: str = "anchored", truth: Collection | None = None,
            reference: Collection | None = None, max_abs: float | None = None, rel_l2: float | None = None,
            kv_max_abs: float | None = None, baseline: Collection | None = None,
            baseline_reference: Collection | None = None) -> dict:
    """Everything the report says, as a dict (no envelope). Raises LabkitError(2) when not comparable.

    anchored: rhs is the float32 truth unless `truth` is given, in which case lhs and rhs are both judged
    against it; `reference` is Transformers in the judged dtype (needed for bf16/fp16 sides; with e4m3 K/V for
    an FP8 KV cache). `baseline` (an FP8 lhs only): the same engine with the model-dtype pool, judged against
    `baseline_reference` (Transformers in its dtype), and the cost of FP8 stated (labkit/logits/cost.py)."""
    if gate not in GATES:
        raise LabkitError(f"--gate must be one of {', '.join(GATES)}, not {gate!r}")
    check_comparable(lhs, rhs)
    cols = {"lhs": lhs, "rhs": rhs}
    if baseline_reference is not None and baseline is None:
        raise LabkitError("--baseline-reference: only with --baseline (the model-dtype engine it judges)")
    if gate == "fixed":
        given = [n for n, v in (("--truth", truth), ("--reference", reference), ("--baseline", baseline))
                 if v is not None]
        if given:
            raise LabkitError(f"{' and '.join(given)}: only the anchored gate uses a truth and a reference "
                              "(drop them, or drop --gate fixed)")
        body = _fixed(lhs, rhs, max_abs, rel_l2, kv_max_abs)
    else:
        given = [n for n, v in (("--max-abs", max_abs), ("--rel-l2", rel_l2), ("--kv-max-abs", kv_max_abs))
                 if v is not None]
        if given:
            raise LabkitError(f"{', '.join(given)}: fixed thresholds belong to --gate fixed (the default gate, "
                              "anchored, judges against a float32 truth)")
        if truth is None and anchored.dtype_of(rhs) != "float32":
            raise LabkitError(f"--gate anchored: rhs is {anchored.dtype_of(rhs)}, so it cannot be the float32 truth: "
                              "give --truth PREFIX (collect --backend hf --dtype float32) to judge both sides "
                              "against it, or use --gate fixed", code=2)
        for name, col in (("truth", truth), ("reference", reference), ("baseline", baseline),
                          ("baseline_reference", baseline_reference)):
            if col is not None:
                check_comparable(lhs, col, ("lhs", name))
                cols[name] = col
        if baseline is not None:
            if truth is not None:
                raise LabkitError("--baseline: the cost of FP8 is stated for one judged side against the truth "
                                  "(--rhs); drop --truth", code=2)
            cost.check_roles(lhs, baseline, reference, baseline_reference)
        body = _anchored(lhs, rhs, truth, reference)
        if baseline is not None:
            _add_cost(body, cost.judge(lhs, baseline, rhs, reference, baseline_reference))
    result = {
        "verdict": body["verdict"],
        "suite": lhs.meta["suite"]["name"],
        **body,
        "token_path_sha256": lhs.meta.get("token_path_sha256"),
        "model_files": lhs.meta.get("model_files"),
        "notes": body.pop("gate_notes", []) + _notes(cols, gate == "fixed" or truth is not None),
        "does_not_prove": DOES_NOT_PROVE,
    }
    result["what_this_shows"] = what_this_shows(result, {n: anchored.arithmetic(c) for n, c in cols.items()})
    return result


def _add_cost(body: dict, kv_cost: dict) -> None:
    """Join the cost section's judgement (the baseline's verdict, the quantised check) to the check's."""
    body["kv_cost"] = kv_cost
    kv_cost["judged_verdict"] = body["verdict"]  # the FP8 side's own rows, overall and K/V, before the cost's
    body["verdict"] = anchored.worst(body["verdict"], kv_cost["status"])
    s = body["summary"]
    b, q = kv_cost["baseline"], kv_cost["quantised"]
    problems = {"FAIL": [], "REVIEW": []}
    if q["status"] == "FAIL":
        problems["FAIL"].append(q["text"])
    if b["verdict"] in problems:
        problems[b["verdict"]].append(f"the model-dtype baseline (the cost's denominator) is {b['verdict']}: "
                                      f"{b['first_problem']}")
    s["cost_failure"] = "; ".join(problems["FAIL"]) or None
    s["cost_review"] = "; ".join(problems["REVIEW"]) or None
    if s["first_failure"] is None and s["cost_failure"]:
        s["first_failure"] = s["cost_failure"]
    if s["first_review"] is None and s["cost_review"]:
        s["first_review"] = s["cost_review"]


# ------------------------------------------------------------------------------------------------
# What the verdict means, in words written from the verdict (a FAIL or REVIEW never reads as agreement)


def _yardstick(dtypes: dict[str, str], judged: list[str]) -> str:
    """What the judged sides' distances are measured against, as a noun phrase. dtypes: each side's arithmetic
    ("bfloat16", "float32 with e4m3 K/V"); only plain float32 is held to the floor."""
    low = sorted({dtypes[n] for n in judged if dtypes[n] != "float32"})
    parts = [f"the distance of Transformers' own {d} run" for d in low]
    if any(dtypes[n] == "float32" for n in judged):
        fl = gates.FLOORS["float32"]
        parts.append(f"the float32 floor (rel-L2 {fl['rel_l2']:g}, max|diff| {fl['max_abs']:g})")
    return " / ".join(parts)


def what_this_shows(result: dict, dtypes: dict[str, str]) -> str:
    s, verdict, g = result["summary"], result["verdict"], result["gate"]
    kv = result["kv"]
    if g["rule"] == "fixed":
        th = result["thresholds"]
        if verdict == "PASS":
            return (f"On these fixed token paths, with these weights, dtype, device and settings, the lhs's logits "
                    f"(last position of every accepted step) are within max|diff| {th['max_abs']:g} and rel-L2 "
                    f"{th['rel_l2']:g} of the rhs on all {s['rows']} rows, with the same top-1. These fixed "
                    f"thresholds are starting gates, not a measured noise level; --gate anchored judges against a "
                    f"float32 truth.")
        if verdict == "REVIEW":
            return (f"Not a pass: {s['review']} of {s['rows']} rows changed top-1 where the rhs's top two logits are "
                    f"no further apart than the measured error, although every row is within the fixed thresholds. "
                    f"A person must read those rows before relying on this path.")
        hint = (" Under fixed thresholds a low-precision FAIL can be rounding noise rather than a bug: rerun with "
                "--gate anchored to judge against a float32 truth." if th["dtype_basis"] in gates.LOW_PRECISION else "")
        first = s["first_failure"] or (f"new K/V {kv['first_failure']}" if kv.get("first_failure") else "")
        return (f"The lhs differs from the rhs beyond the fixed thresholds (max|diff| {th['max_abs']:g}, rel-L2 "
                f"{th['rel_l2']:g}) on {s['failed']} of {s['rows']} rows; first: {first}.{hint}")
    judged = g["judged"]
    who = "the lhs" if judged == ["lhs"] else "the lhs and the rhs"
    yard = _yardstick(dtypes, judged)
    wr = s["worst_ratio"]
    c = result.get("kv_cost")
    if c is not None and verdict != "PASS" and c["judged_verdict"] != verdict:
        return _cost_shows(c, verdict, who, yard, dtypes)
    cost_text = "" if c is None else " " + _cost_sentence(c, dtypes)
    if verdict == "PASS":
        kv_text = (" The new K/V every layer wrote at every step pass the same rule against Transformers' float32 "
                   "K/V." if kv.get("compared") else "")
        flips = (f" {s['near_tie_flips']} row(s) changed top-1 on a near tie that rounding alone can flip."
                 if s["near_tie_flips"] else "")
        return (f"On these fixed token paths, with these weights and settings, {who} computed logits whose distance "
                f"to the float32 truth (Transformers float32) is within {gates.ROW_PASS:g}x {yard} on every row "
                f"(worst {wr['value']:.2g}x) and within {gates.OVERALL_PASS:g}x overall, with the truth's top-1 "
                f"wherever the truth's top-two margin is wide.{flips}{kv_text}{cost_text}")
    if verdict == "REVIEW":
        return (f"Not a pass: {who} is further from the float32 truth than {gates.ROW_PASS:g}x {yard} per row or "
                f"{gates.OVERALL_PASS:g}x overall, but within the FAIL bound ({s['review']} of {s['rows']} rows "
                f"REVIEW; first: {s['first_review']}). A person must decide whether this path lost precision "
                f"before relying on it.{cost_text}")
    return (f"This path does not compute the model's logits within the noise of its dtype (the FAIL bound is "
            f"{gates.ROW_FAIL:g}x {yard} per row, {gates.OVERALL_FAIL:g}x overall, or a top-1 change against a wide "
            f"truth margin): {s['failed']} of {s['rows']} rows fail; first failure: {s['first_failure']}.")


def _cost_sentence(c: dict, dtypes: dict[str, str]) -> str:
    """The cost of FP8, as a PASS or REVIEW of the FP8 side may state it."""
    base = dtypes.get("baseline", "model-dtype")
    q = c["quantised"]
    seen = ("; its distance shows that it quantised" if q["status"] == "PASS" else
            f"; whether it quantised cannot be seen ({q['text']})" if q["status"] == "n/a" else "")
    return (f"{c['text']}. The {base} baseline on the same paths is {c['baseline']['verdict']} against "
            f"Transformers' own {base} run{seen}.")


def _cost_shows(c: dict, verdict: str, who: str, yard: str, dtypes: dict[str, str]) -> str:
    """The words of a REVIEW or FAIL that comes from the cost section, not from the FP8 side's own rows."""
    own = {"PASS": f"{who}'s own rows are within {gates.ROW_PASS:g}x {yard}",
           "REVIEW": f"{who}'s own rows need a look too (REVIEW against {yard})",
           "FAIL": f"{who}'s own rows fail against {yard}"}[c["judged_verdict"]]
    b, q = c["baseline"], c["quantised"]
    if verdict == "FAIL":
        if q["status"] == "FAIL":
            return (f"The FP8 path does not compute what FP8 computes: {q['text']}. {c['text']}, against "
                    f"Transformers' {c['reference_ratio']:.2f}x; {own}, but an engine that keeps more precision "
                    "than it stores is not the FP8 KV cache it claims to be.")
        return (f"The cost of FP8 cannot be stated: the {dtypes.get('baseline', 'model-dtype')} baseline (its "
                f"denominator) fails against Transformers' own run ({b['failed']} of {b['rows']} rows; first: "
                f"{b['first_problem']}); {own}.")
    return (f"Not a pass: the {dtypes.get('baseline', 'model-dtype')} baseline (the denominator of FP8's cost) is "
            f"REVIEW against Transformers' own run ({b['review']} of {b['rows']} rows; first: {b['first_problem']}), "
            f"so the cost ({c['ratio']:.2f}x) is not yet a figure to rely on; {own}. A person must look at the "
            "baseline's rows.")


# ------------------------------------------------------------------------------------------------
# Markdown


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return "inf" if math.isinf(x) else f"{x:.3g}"
    return "-" if x is None else str(x)


def worst_rows(rows: list[dict], n: int = 10) -> list[dict]:
    """FAIL rows first, then REVIEW, then PASS; within each, the largest ratio (anchored) or max |diff| (fixed)."""
    rank = {"FAIL": 0, "REVIEW": 1, "PASS": 2}

    def size(r: dict) -> float:
        v = r.get("ratio", r["max_abs"])
        return -v if math.isfinite(v) else -1e300

    return sorted(rows, key=lambda r: (rank[r["status"]], size(r)))[:n]


def code_path_text(code_path: dict | None) -> str:
    return ", ".join(f"{k} x{v}" for k, v in (code_path or {}).items()) or "-"


def path_text(r: dict) -> str:
    path = r["execution"] or "-"
    if path == "hf-full-recompute":
        path = "hf"
    if r.get("graph_batch") is not None:
        path += f"/{r['graph_batch']}"
    return path


def _side_line(name: str, side: dict | None) -> str:
    if side is None:
        return f"- {name}: none"
    dev = side["device"].get("type") if side.get("device") else "-"
    return (f"- {name}: `{side['prefix']}` ({side['backend']}, {side['dtype']}, {dev}, attention {side['attention']}, "
            f"TP {side['tensor_parallel_size']}; code path {code_path_text(side['code_path'])})")


def rule_text(g: dict) -> str:
    if g["rule"] == "fixed":
        return (f"fixed thresholds ({g['dtype_basis']} defaults unless given): max-abs {g['max_abs']:g}, "
                f"rel-L2 {g['rel_l2']:g}, new-KV max-abs {g['kv_max_abs']:g}")
    return (f"anchored: distance to the float32 truth over the reference's (floored); per row PASS <= "
            f"{g['row_factor']:g}x, REVIEW <= {g['row_fail_factor']:g}x, FAIL beyond or on a top-1 change where the "
            f"{g['wide_margin']}; overall (pooled rel-L2) PASS <= {g['overall_factor']:g}x, REVIEW <= "
            f"{g['overall_fail_factor']:g}x")


def cost_markdown(c: dict) -> list[str]:
    """The fp8-kv suite's section: what FP8 costs in numbers."""
    d, b, q = c["rel_l2"], c["baseline"], c["quantised"]
    return ["", "## What FP8 costs in numbers", "", f"**{c['text']}.**", "",
            "| path | pooled rel-L2 to the float32 truth |", "| --- | --- |",
            f"| engine, FP8 KV cache (lhs) | {_fmt(d['fp8'])} |",
            f"| engine, model-dtype pool (baseline) | {_fmt(d['baseline'])} |",
            f"| Transformers, e4m3 K/V (reference) | {_fmt(d['reference_fp8'])} |",
            f"| Transformers, model dtype (baseline's reference) | {_fmt(d['reference_plain'])} |", "",
            f"- engine FP8 / model-dtype: **{c['ratio']:.3g}x**; Transformers: {c['reference_ratio']:.3g}x",
            f"- baseline: **{b['verdict']}** (rows pass {b['passed']}, review {b['review']}, fail {b['failed']}, "
            f"worst ratio {_fmt(b['worst_ratio'])}; {b['overall']['text']})"
            + (f"; first: {b['first_problem']}" if b["first_problem"] else ""),
            f"- quantised: **{q['status']}**: {q['text']}"]


def markdown(result: dict) -> str:
    s, g = result["summary"], result["gate"]
    lines = [f"# logits-check {result['suite']}: **{result['verdict']}** (gate {g['rule']})", ""]
    if g["rule"] == "fixed":
        lines += [_side_line("lhs", result["lhs"]), _side_line("rhs (reference)", result["rhs"])]
    else:
        judged = g["judged"]
        lines += [_side_line("lhs (judged)", result["lhs"]),
                  _side_line("rhs (judged)" if "rhs" in judged else "rhs (the truth)", result["rhs"])]
        if "rhs" in judged:
            lines.append(_side_line("truth", result.get("truth")))
        lines.append(_side_line("reference", result.get("reference")))
        if result.get("kv_cost") is not None:
            lines += [_side_line("baseline (model-dtype pool, judged)", result.get("baseline")),
                      _side_line("baseline's reference", result.get("baseline_reference"))]
    lines += [f"- evidence: {result.get('evidence')}; token path sha256 `{_fmt(result.get('token_path_sha256'))[:16]}`",
              f"- rule: {rule_text(g)}", ""]
    if g["rule"] == "fixed":
        lines += ["| rows | pass | review | fail | same top-1 | worst max abs | worst rel-L2 |",
                  "| --- | --- | --- | --- | --- | --- | --- |",
                  f"| {s['rows']} | {s['passed']} | {s['review']} | {s['failed']} | {s['top1_agree']}/{s['rows']} | "
                  f"{_fmt(s['worst_max_abs']['value'])} | {_fmt(s['worst_rel_l2']['value'])} |", ""]
    else:
        lines += ["| rows | pass | review | fail | top-1 = truth | near-tie flips | worst ratio "
                  "| worst rel-L2 to truth |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |",
                  f"| {s['rows']} | {s['passed']} | {s['review']} | {s['failed']} | {s['top1_agree']}/{s['rows']} | "
                  f"{s['near_tie_flips']} | {_fmt(s['worst_ratio']['value'])} ({s['worst_ratio']['side']}) | "
                  f"{_fmt(s['worst_rel_l2']['value'])} |", ""]
        for name, o in s["overall"].items():
            lines.append(f"- overall {name}: {o['status']}: {o['text']}")
        if s.get("lhs_to_rhs"):
            m = s["lhs_to_rhs"]
            lines.append(f"- lhs vs rhs ({m['note']}): worst rel-L2 {_fmt(m['worst_rel_l2'])}, worst max abs "
                         f"{_fmt(m['worst_max_abs'])}, same top-1 on {m['top1_agree']}/{s['rows']} rows")
    lines += [f"- first failure: {s['first_failure'] or 'none'}",
              f"- first REVIEW: {s['first_review'] or 'none'}",
              f"- worst rel-L2: {s['worst_rel_l2']['row']}"]
    kv = result["kv"]
    if kv.get("compared") and kv.get("rule") == "anchored":
        lines.append(f"- new K/V: {kv['tokens']} tokens, {kv['status']}: failed steps {kv['failed_steps']}, "
                     f"REVIEW steps {kv['review_steps']}, worst ratio {_fmt(kv['worst_ratio'])}, worst max abs to "
                     f"the truth {_fmt(kv['worst_max_abs'])}; first failing step: {kv['first_failure'] or 'none'}")
    elif kv.get("compared"):
        lines.append(f"- new K/V: {kv['tokens']} tokens in {len(kv['steps'])} steps, worst max abs "
                     f"{_fmt(kv['worst_max_abs'])}, worst rel-L2 {_fmt(kv['worst_rel_l2'])}, "
                     f"first failing step: {kv['first_failure'] or 'none'}")
    else:
        lines.append(f"- new K/V: not compared ({kv.get('reason')})")
    for note in result["notes"]:
        lines.append(f"- note: {note}")
    if result.get("kv_cost") is not None:
        lines += cost_markdown(result["kv_cost"])
    lines += ["", "## Worst rows", ""]
    if g["rule"] == "fixed":
        lines += ["| row | request | out | case | step | path | context | max abs | rel-L2 | top-1 lhs/rhs | status |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in worst_rows(result["rows"]):
            lines.append(f"| {r['index']} | {r['request_id']} | {r['output_index']} | {r['case']} | "
                         f"{_fmt(r['step'])} {r['phase'] or ''} | {path_text(r)} | {r['context_len']} | "
                         f"{_fmt(r['max_abs'])} | {_fmt(r['rel_l2'])} | {r['top1_lhs']}/{r['top1_rhs']} | "
                         f"{r['status']} |")
    else:
        sides = g["judged"]
        head = " | ".join(f"{n} to truth (rel-L2 / max abs) | {n} ratio" for n in sides)
        cols = 10 + 2 * len(sides)
        lines += [f"| row | request | out | case | step | path | context | reference to truth | {head} | "
                  f"top-1 {'/'.join(sides)}/truth | status |", "| " + " | ".join(["---"] * cols) + " |"]
        for r in worst_rows(result["rows"]):
            ref = r["reference_to_truth"]
            refs = "-" if ref is None else f"{_fmt(ref['rel_l2'])} / {_fmt(ref['max_abs'])}"
            cells = " | ".join(f"{_fmt(r['to_truth'][n]['rel_l2'])} / {_fmt(r['to_truth'][n]['max_abs'])} | "
                               f"{_fmt(r['to_truth'][n]['ratio'])}" for n in sides)
            tops = "/".join(str(r["to_truth"][n]["top1"]) for n in sides) + f"/{r['truth_top1']}"
            lines.append(f"| {r['index']} | {r['request_id']} | {r['output_index']} | {r['case']} | "
                         f"{_fmt(r['step'])} {r['phase'] or ''} | {path_text(r)} | {r['context_len']} | {refs} | "
                         f"{cells} | {tops} | {r['status']} |")
    lines += ["", "## What this shows", "", result["what_this_shows"], "", result["does_not_prove"], ""]
    return "\n".join(lines)
