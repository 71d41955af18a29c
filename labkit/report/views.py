"""Lab views: a lab whose question is answered only by its results read together gets a section of its own in
the report, with a headline, a table, a few sentences and a picture drawn across its results.

A lab names its view in workloads/labs.yaml (`view: NAME`) and labels its result slots as the view expects
(VIEWS[NAME].slots; the plan is refused otherwise). A slot without a result leaves its cells "-" and the
view says what is missing; a result of unexpected content loses its figure, never the report.

    speed-and-numbers      (slots A, B, compare, logits) an optimisation that trades numbers for speed, e.g.
                           the FP8 KV cache: B/A output tok/s with its bootstrap interval (`bench compare`)
                           beside the logits verdict and the cost in distance to the float32 truth (the
                           fp8-kv suite's kv_cost); picture: tok/s against the pooled distance, A and B.
    kernels-before-after   (slots before, after, compare) a kernel change at batch 1: decode ms a token,
                           kernels a token and the GPU's idle share in the decode steps, before and after
                           (`bench --profile`), the B/A of decode ms/token; picture: one decoder layer's
                           kernels in time, before above after, on one time axis.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from labkit.report import figures


@dataclass
class LabView:
    lab: str
    title: str
    headline: str
    head: list[str]
    rows: list[list[str]]
    lines: list[str]
    picture_title: str
    png: bytes | None = None
    note: str = ""                      # why there is no picture
    data: dict = field(default_factory=dict)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _f(v: Any, spec: str = ",.1f", unit: str = "") -> str:
    return format(v, spec) + unit if _num(v) else "-"


def _get(d: Any, *path: str) -> Any:
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _slot(status, label: str) -> dict | None:
    for s in status.slots:
        if s.label == label and s.result is not None:
            return s.result.data
    return None


def _missing(status, labels: tuple[str, ...]) -> list[str]:
    return [label for label in labels if _slot(status, label) is None]


def _engine(data: dict | None, key: str) -> str:
    """A bench run's recorded engine setting, as text ("-" without the run)."""
    return "-" if data is None else str(_get(data, "config", "engine", key))


def _profile(data: dict | None) -> dict:
    p = (data or {}).get("profile")
    return p if isinstance(p, dict) else {}


def _layer_text(t: dict) -> str:
    if not t.get("found"):
        return "-"
    return f"{len(t['kernels'])} kernels, {_f(t.get('span_us'), ',.1f')} us, gaps {_f(t.get('gap_us'), ',.1f')} us"


def _spread(data: dict | None, key: str) -> tuple[float | None, float | None, float | None, int]:
    """median, min, max and n of a bench run's repeats for `key`."""
    if data is None:
        return None, None, None, 0
    values = [r.get(key) for r in data.get("runs") or [] if isinstance(r, dict) and _num(r.get(key))]
    med = _get(data, "median", key)
    return (med if _num(med) else None, min(values) if values else None, max(values) if values else None,
            len(values))


def _spread_text(data: dict | None, key: str, spec: str) -> str:
    med, lo, hi, n = _spread(data, key)
    if med is None:
        return "-"
    return f"{format(med, spec)} ({format(lo, spec)} - {format(hi, spec)}, n {n})" if n > 1 else format(med, spec)


# ------------------------------------------------------------------------------------ speed and numbers


def speed_and_numbers(status, draw: bool) -> LabView:
    a, b, cmp, lg = (_slot(status, x) for x in ("A", "B", "compare", "logits"))
    kv = (lg or {}).get("kv_cost") if isinstance((lg or {}).get("kv_cost"), dict) else None
    speed = _get(cmp, "metrics", "output_throughput", "text") or (f"B/A {_f(_get(cmp, 'ratio'), '.3f')}x"
                                                                  if cmp else None)
    parts = [f"tok/s B/A {speed}" if speed else "tok/s B/A: not compared"]
    if lg is None:
        parts.append("logits: not run")
    elif kv is None:
        parts.append(f"logits {lg.get('verdict')} (no cost of FP8 in this check)")
    else:
        parts.append(f"logits {lg.get('verdict')}: {_f(kv.get('ratio'), '.2f')}x the model-dtype distance to the "
                     f"truth (Transformers {_f(kv.get('reference_ratio'), '.2f')}x)")
    d_a = _get(kv, "rel_l2", "baseline")
    d_b = _get(kv, "rel_l2", "fp8")
    rows = [
        ["kv_cache_dtype", _engine(a, "kv_cache_dtype"), _engine(b, "kv_cache_dtype")],
        ["output tok/s, median (min - max)", _spread_text(a, "output_throughput", ",.0f"),
         _spread_text(b, "output_throughput", ",.0f")],
        ["KV blocks", _f(_get(a, "kv_blocks"), ","), _f(_get(b, "kv_blocks"), ",")],
        ["pooled rel-L2 to the float32 truth", _f(d_a, ".3g"), _f(d_b, ".3g")],
        ["logits verdict", str(_get(kv, "baseline", "verdict") or "-"), str((lg or {}).get("verdict") or "-")],
    ]
    lines = []
    if cmp:
        bs = cmp.get("bootstrap") or {}
        lines.append(f"Speed (bench compare --variable {cmp.get('variable')}): B/A median output tok/s {speed}; "
                     f"{bs.get('resamples', '?')} bootstrap resamples, seed {bs.get('seed', '?')}.")
    if kv is not None:
        q = kv.get("quantised") or {}
        lines.append(f"Numbers (logits-check {lg.get('suite')}): {lg.get('verdict')}. {kv.get('text')}. The "
                     f"model-dtype baseline is {_get(kv, 'baseline', 'verdict')}; quantised: {q.get('status')}.")
        if lg.get("verdict") != "PASS":
            lines.append(f"What the check says: {lg.get('what_this_shows')}")
    missing = _missing(status, ("A", "B", "compare", "logits"))
    if missing:
        lines.append(f"Not run yet: {', '.join(missing)} (the lab's command lists them).")
    if {_get(a, "evidence"), _get(b, "evidence")} - {"gpu-measured", None}:
        lines.append("The tok/s are CPU executions: they show the commands run, not what FP8 buys on a GPU.")
    view = LabView(status.lab.id, status.lab.title, "; ".join(parts), ["", "A", "B"], rows, lines,
                   "tok/s against the distance to the float32 truth, A and B",
                   data={"tok_s": [_spread(a, "output_throughput")[0], _spread(b, "output_throughput")[0]],
                         "distance": [d_a, d_b], "speed_ratio": _get(cmp, "ratio"),
                         "speed_interval": _get(cmp, "interval"), "logits_verdict": (lg or {}).get("verdict"),
                         "cost": _get(kv, "ratio"), "reference_cost": _get(kv, "reference_ratio")})
    points = []
    for label, data, dist in (("A", a, d_a), ("B", b, d_b)):
        med, lo, hi, _ = _spread(data, "output_throughput")
        if med is not None and _num(dist):
            points.append((f"{label}: kv {_engine(data, 'kv_cache_dtype')}", dist, med, lo, hi))
    _draw(view, draw, lambda: figures.speed_vs_distance(points, _wrap_title(view)) if points else None,
          "needs a bench run and the logits check's distance for at least one side")
    return view


# ------------------------------------------------------------------------------------ kernels before and after


def kernels_before_after(status, draw: bool) -> LabView:
    before, after, cmp = (_slot(status, x) for x in ("before", "after", "compare"))
    p0, p1 = _profile(before), _profile(after)
    ms = [_spread(d, "decode_ms_per_token")[0] for d in (before, after)]
    kpt = [p.get("kernels_per_decode_token") for p in (p0, p1)]
    idle = [p.get("decode_gpu_idle_pct") for p in (p0, p1)]
    lt = [p.get("layer_timeline") if isinstance(p.get("layer_timeline"), dict) else {} for p in (p0, p1)]
    speed = _get(cmp, "metrics", "decode_ms_per_token", "text")
    headline = f"decode ms/token {_f(ms[0], '.3f')} -> {_f(ms[1], '.3f')}" + (f" (B/A {speed})" if speed else "")
    if any(_num(x) for x in kpt + idle):
        headline += (f"; kernels a token {_f(kpt[0], ',.0f')} -> {_f(kpt[1], ',.0f')}; GPU idle "
                     f"{_f(idle[0], '.1f', '%')} -> {_f(idle[1], '.1f', '%')}")
    else:
        headline += "; kernels a token and GPU idle: no GPU profile"
    rows = [
        ["fused_decode", _engine(before, "fused_decode"), _engine(after, "fused_decode")],
        ["decode ms/token, median (min - max)", _spread_text(before, "decode_ms_per_token", ".3f"),
         _spread_text(after, "decode_ms_per_token", ".3f")],
        ["kernels per decode token (profiled)", _f(kpt[0], ",.1f"), _f(kpt[1], ",.1f")],
        ["GPU idle, share of the decode steps", _f(idle[0], ".1f", "%"), _f(idle[1], ".1f", "%")],
        ["one decoder layer", _layer_text(lt[0]), _layer_text(lt[1])],
    ]
    lines = []
    if cmp:
        lines.append(f"Speed (bench compare --variable {cmp.get('variable')}): B/A median decode ms/token "
                     f"{speed or '-'}; output tok/s {_get(cmp, 'metrics', 'output_throughput', 'text') or '-'}.")
    missing = _missing(status, ("before", "after", "compare"))
    if missing:
        lines.append(f"Not run yet: {', '.join(missing)} (the lab's command lists them).")
    for label, p in (("before", p0), ("after", p1)):
        if (before if label == "before" else after) is not None and not p:
            lines.append(f"{label}: the bench ran without --profile: no kernel count, idle share or layer.")
        elif p.get("gpu_note"):
            lines.append(f"{label}: {p['gpu_note']}")
    view = LabView(status.lab.id, status.lab.title, headline, ["", "before", "after"], rows, lines,
                   "one decoder layer's kernels in time, before and after",
                   data={"decode_ms_per_token": ms, "kernels_per_decode_token": kpt, "decode_gpu_idle_pct": idle,
                         "decode_ms_ratio": _get(cmp, "metrics", "decode_ms_per_token", "ratio")})
    panels = [(label, t) for label, t in (("before", lt[0]), ("after", lt[1])) if t.get("found")]
    _draw(view, draw, lambda: figures.layer_timelines(panels, _wrap_title(view)) if panels else None,
          "needs a GPU profile (bench --profile on CUDA) on at least one side")
    return view


# ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ViewKind:
    slots: tuple[str, ...]
    build: Callable


VIEWS: dict[str, ViewKind] = {
    "speed-and-numbers": ViewKind(("A", "B", "compare", "logits"), speed_and_numbers),
    "kernels-before-after": ViewKind(("before", "after", "compare"), kernels_before_after),
}


def _wrap_title(view: LabView) -> str:
    return f"{view.lab}: {view.picture_title}"


def _draw(view: LabView, draw: bool, make: Callable[[], bytes | None], why_none: str) -> None:
    if not draw:
        view.note = "pictures are not drawn here"
        return
    try:
        view.png = make()
    except Exception as exc:  # noqa: BLE001 - a result of odd content loses its picture, not the report
        figures.close_all()
        view.note = f"could not draw it ({type(exc).__name__}: {exc})"
        return
    if view.png is None:
        view.note = why_none


def build(statuses: list, draw: bool = False) -> list[LabView]:
    """The view of every lab that names one (pictures only when `draw`)."""
    return [VIEWS[s.lab.view].build(s, draw) for s in statuses if getattr(s.lab, "view", None) in VIEWS]


def headline(status) -> str:
    return VIEWS[status.lab.view].build(status, False).headline
