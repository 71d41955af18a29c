"""Compare two collections row by row: max |diff|, relative L2 (||a - b|| / ||b||, b = the right-hand
side, the reference), top-1 agreement; for kv collections, the K/V each layer wrote at each step.

Row status:
    FAIL    a non-finite value, max |diff| > --max-abs, or rel-L2 > --rel-l2; or top-1 differs although
            the reference's top two logits are further apart than the row's measured max |diff|
    REVIEW  within both thresholds, but top-1 differs and the reference's top-two margin is no larger
            than the row's measured max |diff| (a near-tie that the measured error can flip)
    PASS    within both thresholds and the same top-1
Verdict: FAIL if any row or KV step fails, else REVIEW if any row is REVIEW, else PASS.

Default thresholds follow the less precise dtype of the two sides: bf16/fp16 use the seeds' starting
gates (max-abs 0.5, rel-L2 0.02, new-KV max-abs 0.1); float32 uses 1e-4 / 1e-5 / 1e-4.
Measured (engine vs transformers, worst row):
  float32, tiny, CPU: 5.3e-5 max-abs, 3.7e-6 rel-L2 over suites baseline/graph/prefix x seeds 0-5;
  float32, tiny, H200 (triton attention, graph replay for buckets 1/16): 5.8e-5 / 4.6e-6;
  float32, qwen3-0.6b-shaped fake weights, H200, baseline: 4.4e-5 / 2.6e-6 (triton and torch attention);
  bf16, qwen3-0.6b-shaped fake, H200: baseline 0.375 / 0.0187, prefix 0.34 / 0.018 (PASS), graph 0.44 /
  0.023 (rel-L2 over 0.02 on 70 of 126 rows, 5 near-tie top-1 flips: FAIL/REVIEW by honest bf16 noise);
  bf16, tiny, CPU: 0.66 / 0.052, but transformers bf16 against transformers float32 is as far (0.70 / 0.052).
So the float32 defaults hold with about 2x margin on max-abs and 2.5x on rel-L2; the bf16 gates are the
seeds' uncalibrated starting points and sit at the edge of bf16 noise on random weights: calibrate them on
repeated baselines of the real model before trusting a bf16 verdict either way.

Collections are refused (LabkitError, exit 2) when their suites, weights (config.json or any
*.safetensors sha256), token paths or row sets differ.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from labkit.errors import LabkitError
from labkit.logits.collect import Collection, prefix_of

DEFAULT_THRESHOLDS = {
    "float32": {"max_abs": 1e-4, "rel_l2": 1e-5, "kv_max_abs": 1e-4},
    "bfloat16": {"max_abs": 0.5, "rel_l2": 0.02, "kv_max_abs": 0.1},
    "float16": {"max_abs": 0.5, "rel_l2": 0.02, "kv_max_abs": 0.1},
}
_PRECISION = {"float32": 2, "float16": 1, "bfloat16": 0}

PROVES = ("On these fixed token paths, with these weights, dtype, device and settings, the engine's forward "
          "results (last-position logits of every accepted step) agree with the reference within the stated "
          "thresholds.")
DOES_NOT_PROVE = ("It says nothing about sampling, EOS handling, cancellation or throughput, nor about other "
                  "inputs, batch shapes, models or devices; CPU-executed evidence shows the code path computes "
                  "the same function, not that a GPU kernel does. Thresholds are starting gates: widen them only "
                  "with a repeated-baseline error distribution.")


def _short(sha: str | None) -> str:
    return (sha or "none")[:12]


def refusal_reasons(lhs: Collection, rhs: Collection) -> list[str]:
    """Why two collections cannot be compared (empty: they can)."""
    a, b = lhs.meta, rhs.meta
    reasons = []
    sa, sb = a.get("suite", {}).get("name"), b.get("suite", {}).get("name")
    if sa != sb:
        reasons.append(f"suites differ: lhs {sa}, rhs {sb}")
    fa, fb = a.get("model_files", {}), b.get("model_files", {})
    for name in sorted(set(fa) | set(fb)):
        if name not in fa or name not in fb:
            reasons.append(f"weights differ: {name} only in {'lhs' if name in fa else 'rhs'}")
        elif fa[name] != fb[name]:
            what = "model config differs" if name == "config.json" else "weights differ"
            reasons.append(f"{what}: {name} sha256 {_short(fa[name])} (lhs) vs {_short(fb[name])} (rhs)")
    if a.get("token_path_sha256") != b.get("token_path_sha256"):
        reasons.append("token paths differ: " + _path_difference(a, b))
    if not reasons:
        ka = {(r["request_id"], r["output_index"]) for r in a["rows"]}
        kb = {(r["request_id"], r["output_index"]) for r in b["rows"]}
        if ka != kb:
            only = sorted(ka ^ kb)[:3]
            reasons.append(f"row sets differ: lhs {len(ka)} rows, rhs {len(kb)} (e.g. {only})")
        elif lhs.arrays["logits"].shape[1] != rhs.arrays["logits"].shape[1]:
            reasons.append(f"vocabularies differ: {lhs.arrays['logits'].shape[1]} vs {rhs.arrays['logits'].shape[1]}")
    return reasons


def _path_difference(a: dict, b: dict) -> str:
    pa, pb = a.get("inputs", {}), b.get("inputs", {})
    seeds = f" (seed {a.get('seed')} vs {b.get('seed')})" if a.get("seed") != b.get("seed") else ""
    for rid in list(pa) + [r for r in pb if r not in pa]:
        if rid not in pa or rid not in pb:
            return f"request {rid} only in {'lhs' if rid in pa else 'rhs'}{seeds}"
        for part in ("prompt", "continuation"):
            x, y = pa[rid][part], pb[rid][part]
            if x != y:
                if len(x) != len(y):
                    return f"request {rid} {part}: {len(x)} vs {len(y)} ids{seeds}"
                i = next(i for i, (u, v) in enumerate(zip(x, y)) if u != v)
                return f"request {rid} {part}[{i}]: {x[i]} vs {y[i]}{seeds}"
    return f"token path hashes differ{seeds}"


def check_comparable(lhs: Collection, rhs: Collection) -> None:
    reasons = refusal_reasons(lhs, rhs)
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


def _notes(lhs: Collection, rhs: Collection) -> list[str]:
    notes = []
    for label, col in (("lhs", lhs), ("rhs", rhs)):
        req = col.meta.get("requested") or {}
        if col.meta.get("backend") == "engine" and req.get("execution") == "graph":
            ran = {s.get("execution") for s in col.meta.get("steps", [])}
            if "graph" not in ran:
                notes.append(f"{label} asked for --execution graph but every step ran "
                             f"{'/'.join(sorted(x for x in ran if x)) or 'eager'}: no graph replay was exercised")
    if lhs.meta.get("dtype") != rhs.meta.get("dtype"):
        notes.append(f"dtypes differ: lhs {lhs.meta.get('dtype')}, rhs {rhs.meta.get('dtype')}")
    if lhs.meta.get("device", {}).get("type") != rhs.meta.get("device", {}).get("type"):
        notes.append("the two sides ran on different device types")
    return notes


def compare(lhs: Collection, rhs: Collection, *, max_abs: float | None = None, rel_l2: float | None = None,
            kv_max_abs: float | None = None) -> dict:
    """Everything the report says, as a dict (no envelope). Raises LabkitError(2) when not comparable."""
    check_comparable(lhs, rhs)
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
        "suite": lhs.meta["suite"]["name"],
        "thresholds": th,
        "summary": {
            "rows": len(rows),
            "passed": len(rows) - n_fail - n_review,
            "review": n_review,
            "failed": n_fail,
            "top1_agree": sum(r["top1_agree"] for r in rows),
            "worst_max_abs": {"value": worst_abs["max_abs"], "row": worst_abs["label"]},
            "worst_rel_l2": {"value": worst_rel["rel_l2"], "row": worst_rel["label"]},
            "first_failure": None if first_fail is None else f"{first_fail['label']}: {first_fail['reason']}",
            "first_failing_row": None if first_fail is None else first_fail["index"],
            "first_review": None if first_review is None else f"{first_review['label']}: {first_review['reason']}",
            "kv_first_failure": kv.get("first_failure"),
        },
        "token_path_sha256": lhs.meta.get("token_path_sha256"),
        "model_files": lhs.meta.get("model_files"),
        "rows": rows,
        "kv": kv,
        "notes": _notes(lhs, rhs),
        "proves": PROVES,
        "does_not_prove": DOES_NOT_PROVE,
    }


# ------------------------------------------------------------------------------------------------
# Markdown


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return "inf" if math.isinf(x) else f"{x:.3g}"
    return "-" if x is None else str(x)


def worst_rows(rows: list[dict], n: int = 10) -> list[dict]:
    rank = {"FAIL": 0, "REVIEW": 1, "PASS": 2}
    return sorted(rows, key=lambda r: (rank[r["status"]], -r["max_abs"] if math.isfinite(r["max_abs"]) else -1e300))[:n]


def code_path_text(code_path: dict | None) -> str:
    return ", ".join(f"{k} x{v}" for k, v in (code_path or {}).items()) or "-"


def markdown(result: dict) -> str:
    s, th = result["summary"], result["thresholds"]
    lhs, rhs = result["lhs"], result["rhs"]
    lines = [
        f"# logits-check {result['suite']}: **{result['verdict']}**",
        "",
        f"- lhs: `{lhs['prefix']}` ({lhs['backend']}, {lhs['dtype']}, {lhs['device'].get('type') if lhs['device'] else '-'}"
        f", attention {lhs['attention']}, TP {lhs['tensor_parallel_size']}; code path {code_path_text(lhs['code_path'])})",
        f"- rhs (reference): `{rhs['prefix']}` ({rhs['backend']}, {rhs['dtype']}, "
        f"{rhs['device'].get('type') if rhs['device'] else '-'}, attention {rhs['attention']}, "
        f"TP {rhs['tensor_parallel_size']}; code path {code_path_text(rhs['code_path'])})",
        f"- evidence: {result.get('evidence')}; token path sha256 `{_fmt(result.get('token_path_sha256'))[:16]}`",
        f"- thresholds ({th['dtype_basis']} defaults unless given): max-abs {th['max_abs']:g}, "
        f"rel-L2 {th['rel_l2']:g}, new-KV max-abs {th['kv_max_abs']:g}",
        "",
        "| rows | pass | review | fail | top-1 agree | worst max abs | worst rel-L2 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| {s['rows']} | {s['passed']} | {s['review']} | {s['failed']} | {s['top1_agree']}/{s['rows']} | "
        f"{_fmt(s['worst_max_abs']['value'])} | {_fmt(s['worst_rel_l2']['value'])} |",
        "",
        f"- first failing row: {s['first_failure'] or 'none'}",
        f"- first REVIEW row: {s['first_review'] or 'none'}",
        f"- worst max abs: {s['worst_max_abs']['row']}",
        f"- worst rel-L2: {s['worst_rel_l2']['row']}",
    ]
    kv = result["kv"]
    if kv.get("compared"):
        lines.append(f"- new K/V: {kv['tokens']} tokens in {len(kv['steps'])} steps, worst max abs "
                     f"{_fmt(kv['worst_max_abs'])}, worst rel-L2 {_fmt(kv['worst_rel_l2'])}, "
                     f"first failing step: {kv['first_failure'] or 'none'}")
    else:
        lines.append(f"- new K/V: not compared ({kv.get('reason')})")
    for note in result["notes"]:
        lines.append(f"- note: {note}")
    lines += ["", "## Worst rows", "",
              "| row | request | out | case | step | path | context | max abs | rel-L2 | top-1 lhs/rhs | status |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in worst_rows(result["rows"]):
        path = r["execution"] or "-"
        if r.get("graph_batch") is not None:
            path += f" (bucket {r['graph_batch']})"
        lines.append(f"| {r['index']} | {r['request_id']} | {r['output_index']} | {r['case']} | "
                     f"{_fmt(r['step'])} {r['phase'] or ''} | {path} | {r['context_len']} | {_fmt(r['max_abs'])} | "
                     f"{_fmt(r['rel_l2'])} | {r['top1_lhs']}/{r['top1_rhs']} | {r['status']} |")
    lines += ["", "## What this shows", "", result["proves"], "", result["does_not_prove"], ""]
    return "\n".join(lines)
