"""The report's pictures, drawn with matplotlib (an optional dependency: the `plot` and `test` extras) into
PNG bytes: per trace a step timeline and the KV blocks in use (a CHANGED trace: what the case expects above
what the run did), per logits check each row against the gate that judged it, per bench run its repeats, per
bench comparison each side's spread, per load run the TTFT and ITL distributions. Each `*_figure` function
returns the matplotlib figure (tests read it); its twin without the suffix returns the PNG."""
from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

from labkit.trace.events import seq_entries

PHASE_COLORS = {"prefill": "#4c72b0", "prefill chunk (no output)": "#a1b7da", "decode": "#55a868"}
STATUS_COLORS = {"PASS": "#55a868", "REVIEW": "#dd8452", "FAIL": "#c44e52"}


def unavailable() -> str | None:
    """Why pictures cannot be drawn here (None: they can)."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)  # no display: draw into memory only
        import matplotlib.pyplot  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"matplotlib is not available ({type(exc).__name__}: {exc}); install it with pip install 'labkit[plot]'"
    return None


def close_all() -> None:
    """Close every figure (one that failed half-way is never passed to _png)."""
    import matplotlib.pyplot as plt

    plt.close("all")


# The page shows a picture at most this wide (report.html's 72em column) and scales a wider one down, text and
# all: figures are sized to fit it, and their text to stay at 11 px or more once shown.
PAGE_PX = 1100
DPI = 100
FONT_PT = 9.5
_STYLE = {"font.size": FONT_PT, "axes.titlesize": FONT_PT + 1, "axes.labelsize": FONT_PT,
          "xtick.labelsize": FONT_PT - 0.5, "ytick.labelsize": FONT_PT - 0.5, "legend.fontsize": FONT_PT - 0.5,
          "figure.titlesize": FONT_PT + 2}


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _subplots(rows: int, cols: int = 1, height: float = 2.6, width: float = 8.0, **kw):
    import matplotlib.pyplot as plt

    plt.rcParams.update(_STYLE)
    return plt.subplots(rows, cols, figsize=(width, height * rows), squeeze=False, layout="constrained", **kw)


# A picture stays readable, and its cost bounded, whatever the log's length: at most this many request rows
# (the first added; the title says how many more), token counts written only where they fit, a value over each
# KV point only for a short run. Cells are drawn as one collection per row and phase, not one artist each.
MAX_ROWS = 40
MAX_LABELS = 150
MAX_LABELLED_STEPS = 60
MAX_ANNOTATED_POINTS = 40
MAX_MARKED_POINTS = 200
MAX_SEPARATE_STEPS = 400  # beyond, a row's consecutive cells of one phase are one bar


def _merged(xranges: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Bars of consecutive steps (each 0.9 wide, one step apart) as one bar each run."""
    out: list[list[float]] = []
    for x, w in xranges:
        if out and x <= out[-1][0] + out[-1][1] + 0.1 + 1e-9:
            out[-1][1] = x + w - out[-1][0]
        else:
            out.append([x, w])
    return [(x, w) for x, w in out]


def shown_requests(requests: list[str]) -> tuple[list[str], str]:
    """The request rows a timeline draws, and what its title says of the rest."""
    if len(requests) <= MAX_ROWS:
        return requests, ""
    return requests[:MAX_ROWS], f" (first {MAX_ROWS} of {len(requests)} requests)"


def _timeline_axis(ax, requests: list[str], cells: list[tuple[str, int, str, int]], discarded: set,
                   preempted: list[tuple[str, int]], title: str) -> None:
    """One row per request, one cell per step it was scheduled in: prefill chunks labelled with their token
    count (paler where postprocess discarded the candidate), decodes, preemptions as x."""
    requests, more = shown_requests(requests)
    row = {r: i for i, r in enumerate(requests)}
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    labels = []
    steps = set()
    for r, step, phase, n in cells:
        if r not in row:
            continue
        if phase == "prefill" and (r, step) in discarded:
            phase = "prefill chunk (no output)"
        bars.setdefault((row[r], phase), []).append((step - 0.45, 0.9))
        steps.add(step)
        if phase.startswith("prefill"):
            labels.append((step, row[r], str(n)))
    merge = len(steps) > MAX_SEPARATE_STEPS
    for (y, phase), xranges in bars.items():
        if merge:  # a long run: consecutive steps of one row and phase drawn as one bar
            xranges = _merged(sorted(xranges))
        ax.broken_barh(xranges, (y - 0.35, 0.7), facecolors=PHASE_COLORS.get(phase, "#8172b2"))
    if len(labels) <= MAX_LABELS and len(steps) <= MAX_LABELLED_STEPS:
        for x, y, text in labels:
            ax.text(x, y, text, ha="center", va="center", color="black")
    marks = [(step, row[r]) for r, step in preempted if r in row]
    if marks:
        ax.plot([x for x, _ in marks], [y for _, y in marks], linestyle="none", marker="x", color="#c44e52",
                markersize=10, mew=2)
    ax.set_yticks(range(len(requests)), requests)
    ax.set_ylim(len(requests) - 0.5, -0.5)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("engine step")
    ax.set_title(title + more)


def _phase_legend(ax) -> None:
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=p) for p, c in PHASE_COLORS.items()], loc="upper left",
              bbox_to_anchor=(1.01, 1.0))


def _trace_facts(events: list[dict]) -> dict:
    """What the trace pictures draw, read once from the event log."""
    facts = {"requests": [], "cells": [], "discarded": set(), "preempted": [], "free": [], "total": None}
    for e in events:
        kind, step = e.get("event"), e.get("step")
        if kind == "run_start":
            facts["total"] = e.get("num_kvcache_blocks") or (e.get("config") or {}).get("num_kvcache_blocks")
        elif kind == "request_added" and str(e.get("request_id")) not in facts["requests"]:
            facts["requests"].append(str(e.get("request_id")))
        elif kind == "scheduled":
            for s in seq_entries(e):
                facts["cells"].append((str(s.get("request_id")), int(step), str(e.get("phase")),
                                       int(s.get("num_scheduled_tokens") or 0)))
        elif kind == "preempted":
            facts["preempted"].append((str(e.get("request_id")), int(step)))
        elif kind == "after_postprocess":
            for s in seq_entries(e):
                if not s.get("accepted", True):
                    facts["discarded"].add((str(s.get("request_id")), int(step)))
            if isinstance(e.get("free_blocks"), int):
                facts["free"].append((int(step), int(e["free_blocks"])))
    for r, *_ in facts["cells"]:
        if r not in facts["requests"]:
            facts["requests"].append(r)
    return facts


def trace_timeline_figure(events: list[dict], title: str):
    """Top: the step timeline of every request. Bottom: the KV blocks in use after every step, on a scale of
    what the run used (a small case holds 3 of 64 blocks: drawn against the pool it would be a flat line)."""
    f = _trace_facts(events)
    fig, axes = _subplots(2, height=max(1.9, 0.45 * len(shown_requests(f["requests"])[0]) + 1.1))
    _timeline_axis(axes[0][0], f["requests"], f["cells"], f["discarded"], f["preempted"],
                   f"{title}: scheduled tokens per request and step; x = preempted")
    _phase_legend(axes[0][0])
    _kv_axis(axes[1][0], f["free"], f["total"])
    return fig


def trace_timeline(events: list[dict], title: str) -> bytes:
    return _png(trace_timeline_figure(events, title))


def _kv_axis(ax, free: list[tuple[int, int]], total) -> None:
    pool = total if isinstance(total, int) and not isinstance(total, bool) else None
    if free:
        steps = [s for s, _ in free]
        values = [pool - v for _, v in free] if pool is not None else [v for _, v in free]
        ax.step(steps, values, where="mid", marker="o" if len(steps) <= MAX_MARKED_POINTS else None,
                color="#c44e52" if pool is not None else "#4c72b0")
        if len(steps) <= MAX_ANNOTATED_POINTS:
            for x, y in zip(steps, values):
                ax.annotate(str(y), (x, y), textcoords="offset points", xytext=(0, 5), ha="center")
        ax.set_ylim(0, max(values) * 1.25 + 1)
        ax.yaxis.get_major_locator().set_params(integer=True)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("engine step")
    if pool is not None:
        ax.set_ylabel("blocks in use")
        ax.set_title(f"KV blocks in use after each step (pool of {pool}; free = {pool} - in use)")
    else:
        ax.set_ylabel("free blocks")
        ax.set_title("free KV blocks after each step (pool size not recorded)")


def expected_cells(expect: list[dict], known: list[str]) -> tuple[list[str], list[tuple[str, int, str, int]]]:
    """The schedule a case's expected states describe: (request, step, phase, scheduled tokens) per request
    of each step entry's `scheduled` (a token count, or the full form's `scheduled`)."""
    requests, cells = list(known), []
    for x in expect or []:
        if not isinstance(x, dict) or not isinstance(x.get("step"), int) or not isinstance(x.get("scheduled"), dict):
            continue
        for rid, v in x["scheduled"].items():
            n = v.get("scheduled") if isinstance(v, dict) else v
            cells.append((str(rid), x["step"], str(x.get("phase") or "prefill"), int(n) if isinstance(n, int) else 0))
            if str(rid) not in requests:
                requests.append(str(rid))
    return requests, cells


def trace_changed_figure(events: list[dict], expect: list[dict], changes: list[dict], title: str):
    """A CHANGED trace: what the case expects above what the run did, on the same requests and steps, with the
    steps that differ shaded in both."""
    f = _trace_facts(events)
    requests, want = expected_cells(expect, f["requests"])
    differs = sorted({c["step"] for c in changes if isinstance(c.get("step"), int)})
    fig, axes = _subplots(2, height=max(1.9, 0.45 * len(shown_requests(requests)[0]) + 1.1), sharex=True)
    panels = ((axes[0][0], want, set(), [], f"{title}: what the case expects"),
              (axes[1][0], f["cells"], f["discarded"], f["preempted"], "what the run did (steps that differ shaded)"))
    for ax, cells, discarded, preempted, label in panels:
        for st in differs:
            ax.axvspan(st - 0.5, st + 0.5, color="#fff1c1", zorder=0)
        _timeline_axis(ax, requests, cells, discarded, preempted, label)
    _phase_legend(axes[0][0])
    return fig


def trace_changed(events: list[dict], expect: list[dict], changes: list[dict], title: str) -> bytes:
    return _png(trace_changed_figure(events, expect, changes, title))


def _finite(values: list[Any]) -> list[float]:
    return [float(v) if isinstance(v, (int, float)) and math.isfinite(v) else float("nan") for v in values]


def _row_verdict(row: dict) -> str | None:
    return row.get("verdict") or row.get("status")


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def logits_rows_figure(check: dict):
    """Each row against the gate that judged it, coloured by the row's verdict. Anchored: the row's distance
    to the float32 truth over the reference's, with the PASS and FAIL factors drawn; fixed: max|diff| and
    rel-L2 against their thresholds. Only distances are drawn: token ids are labels, not magnitudes."""
    rows = check.get("rows") or []
    gate = check.get("gate") if isinstance(check.get("gate"), dict) else {}
    colors = [STATUS_COLORS.get(_row_verdict(r), "#8172b2") for r in rows]
    x = list(range(len(rows)))
    if gate.get("rule") == "anchored":
        fig, axes = _subplots(1, height=3.0, width=8.0)
        ax = axes[0][0]
        sides = gate.get("judged") or ["lhs"]
        ys = [max((((r.get("to_truth") or {}).get(s) or {}).get("ratio") or 0.0) for s in sides) for r in rows]
        ax.scatter(x, ys, c=colors, s=18, zorder=3)
        limits = [(gate.get("row_factor"), "PASS up to", "--"), (gate.get("row_fail_factor"), "FAIL beyond", ":")]
        for value, what, style in limits:
            if _num(value):
                ax.axhline(value, color="#c44e52", linestyle=style, linewidth=1.2, label=f"{what} {value:g}x")
        top = max([y for y in ys if _num(y)] + [v for v, _, _ in limits if _num(v)] + [1.0])
        ax.set_ylim(0, top * 1.15)
        ax.set_ylabel("distance / reference's")
        ax.set_title("per row: distance to the float32 truth over the reference's (the noise yardstick)")
        if any(_num(v) for v, _, _ in limits):
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.set_xlabel("row")
    else:
        th = check.get("thresholds") or {}
        keys = [k for k in ("max_abs", "rel_l2") if any(_num(r.get(k)) for r in rows)] or ["max_abs"]
        fig, axes = _subplots(1, len(keys), height=3.0, width=4.6 * len(keys))
        for ax, key in zip(axes[0], keys):
            ys = _finite([r.get(key) for r in rows])
            ax.scatter(x, [max(y, 1e-12) for y in ys], c=colors, s=18, zorder=3)
            gate_value = th.get(key)
            if _num(gate_value) and gate_value > 0:
                ax.axhline(gate_value, color="#c44e52", linestyle="--", linewidth=1.2,
                           label=f"threshold {gate_value:g}")
                ax.legend(loc="lower right")
            ax.set_yscale("log")
            ax.set_xlabel("row")
            ax.set_title(f"{key} per row (exact zeros at the bottom)")
    fig.suptitle(f"logits-check {check.get('suite')}: {check.get('verdict')}")
    return fig


def logits_rows(check: dict) -> bytes:
    return _png(logits_rows_figure(check))


def _wrapped(text: str, width: int = 70) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)) or text


def _value_text(v) -> str:
    return "default" if v is None else str(v)


def side_labels(cmp: dict) -> list[str]:
    """Each side named by its value of the variable ("A\nenforce_eager True"), not by a letter alone."""
    values = cmp.get("values") or {}
    keys = [k for k in cmp.get("differing") or [] if k in (values.get("a") or {})] or list(values.get("a") or {})
    out = []
    for side in ("a", "b"):
        shown = [f"{k.rsplit('.', 1)[-1].lstrip('-')} {_value_text((values.get(side) or {}).get(k))}"
                 for k in keys[:2]]
        out.append(_wrapped(f"{side.upper()}: " + ", ".join(shown), 18) if shown else side.upper())
    return out


def compare_figure(cmp: dict):
    """A bench comparison, offline or load: per sampled metric each side's min / median / max (a bar from min to
    max, the median marked), the offline repeats as dots, and the B/A sentence above."""
    metrics = {k: m for k, m in (cmp.get("metrics") or {}).items()
               if isinstance(m, dict) and (m.get("a") or {}).get("n") and (m.get("b") or {}).get("n")}
    head = cmp.get("headline_metric")
    names = ([head] if head in metrics else []) + [k for k in metrics if k != head]
    names = names[:3] or [None]
    fig, axes = _subplots(1, len(names), height=3.0, width=3.3 * len(names))
    for ax, name in zip(axes[0], names):
        if name is None:
            ax.text(0.5, 0.5, "no samples on a side", ha="center", va="center", transform=ax.transAxes)
            continue
        m = metrics[name]
        for i, side in enumerate(("a", "b")):
            s = m[side]
            ax.vlines(i, s["min"], s["max"], color="#4c72b0", linewidth=6, alpha=0.35)
            ax.plot([i], [s["median"]], marker="_", markersize=26, mew=2.5, color="#c44e52")
            runs = (cmp.get(side) or {}).get("runs") or []
            dots = [v for v in _finite([r.get(name) for r in runs]) if not math.isnan(v)]
            ax.scatter([i] * len(dots), dots, color="#4c72b0", s=16, zorder=3)
        ax.set_xticks([0, 1], side_labels(cmp))
        ax.set_xlim(-0.6, 1.6)
        ax.set_title(_wrapped(f"{m.get('label', name)}: {m.get('text', '')}", 34))
    fig.suptitle(_wrapped(f"bench compare --variable {cmp.get('variable')} ({cmp.get('kind', 'offline')} runs, "
                          f"{cmp.get('samples_are', 'samples')}): min to max, median marked", 90))
    return fig


def compare_repeats(cmp: dict) -> bytes:
    return _png(compare_figure(cmp))


def figure(x: float) -> str:
    """A figure as a person reads it: 26,580 (not 2.658e+04), 43.3, 0.0123."""
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


def bench_figure(result: dict):
    """One offline bench run: every timed repeat's output tok/s (and decode ms per token where the workload
    timed steps), the median drawn across."""
    runs = result.get("runs") or []
    panels = [("output_throughput", "output tok/s")]
    if any(_num(r.get("decode_ms_per_token")) for r in runs):
        panels.append(("decode_ms_per_token", "decode ms per token"))
    fig, axes = _subplots(1, len(panels), height=2.8, width=4.5 * len(panels))
    for ax, (key, label) in zip(axes[0], panels):
        ys = _finite([r.get(key) for r in runs])
        ax.bar(range(len(ys)), ys, color="#4c72b0")
        med = (result.get("median") or {}).get(key)
        if _num(med):
            ax.axhline(med, color="#c44e52", linestyle="--", linewidth=1.2, label=f"median {figure(med)}")
            ax.legend(loc="lower right")
        ax.set_xticks(range(len(ys)), [str(r.get("repeat", i)) for i, r in enumerate(runs)])
        ax.set_xlabel("timed repeat")
        ax.set_title(f"{label}, every repeat")
    w = result.get("workload") or {}
    fig.suptitle(f"bench {w.get('name')} ({result.get('backend')}, {result.get('execution')}, "
                 f"{result.get('evidence')})")
    return fig


def bench_repeats(result: dict) -> bytes:
    return _png(bench_figure(result))


def load_distributions_figure(records: list[dict], title: str):
    """Histograms of TTFT per request and of every inter-token latency; a row per request class when the
    arrivals file named classes (short streams' ITL apart from long prompts' TTFT)."""
    classes = list(dict.fromkeys(r.get("class") for r in records if r.get("class"))) or [None]
    fig, axes = _subplots(len(classes), 2, height=2.8 * len(classes), width=9.0)
    panels = []
    for i, c in enumerate(classes):
        mine = [r for r in records if c is None or r.get("class") == c]
        ttft = [v for v in _finite([r.get("ttft_ms") for r in mine]) if not math.isnan(v)]
        itl = [v for v in _finite([x for r in mine for x in (r.get("itl_ms") or [])]) if not math.isnan(v)]
        name = f"{c}: " if c else ""
        panels += [(axes[i][0], ttft, f"{name}TTFT (ms), per request"), (axes[i][1], itl, f"{name}ITL (ms), every gap")]
    for ax, values, label in panels:
        if values:
            ax.hist(values, bins=min(30, max(5, len(values) // 3)), color="#4c72b0")
            for q, style in ((50, "--"), (99, ":")):
                v = float(np.percentile(values, q))
                ax.axvline(v, color="#c44e52", linestyle=style, linewidth=1.2, label=f"p{q} {v:.1f}")
            ax.legend()
        else:
            ax.text(0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"{label}: n={len(values)}")
        ax.set_ylabel("count")
    fig.suptitle(_wrapped(title, 90))
    return fig


def load_distributions(records: list[dict], title: str) -> bytes:
    return _png(load_distributions_figure(records, title))


def policies_figure(runs: list[tuple[str, dict]], title: str):
    """Load runs under several scheduling policies side by side, a column per policy, a dot per run (repeats
    of a policy side by side): the figures a policy trades, TTFT p99 and ITL p99, per request class where the
    arrivals named classes (the long prompts' TTFT, the short streams' ITL), else over every request."""
    policies = list(dict.fromkeys(policy for policy, _ in runs))
    classes = list(dict.fromkeys(c for _, m in runs for c in (m.get("classes") or {}))) or [None]
    panels = [(c, key) for c in classes for key in ("ttft_ms", "itl_ms")]
    fig, axes = _subplots(1, len(panels), height=3.2, width=min(3.0 * len(panels), PAGE_PX / DPI - 0.5))
    for ax, (cls, key) in zip(axes[0], panels):
        for i, policy in enumerate(policies):
            values = []
            for p, m in runs:
                stats = ((m.get("classes") or {}).get(cls) if cls else m) or {}
                v = (stats.get(key) or {}).get("p99")
                if p == policy and _num(v):
                    values.append(float(v))
            offsets = [i + (j - (len(values) - 1) / 2) * 0.12 for j in range(len(values))]
            ax.scatter(offsets, values, color="#4c72b0", s=22, zorder=3)
            if values:
                ax.plot([i - 0.25, i + 0.25], [float(np.median(values))] * 2, color="#c44e52", linewidth=2)
        ax.set_xticks(range(len(policies)), [p.replace("_", "_\n") for p in policies])
        ax.set_xlim(-0.6, len(policies) - 0.4)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{cls + ': ' if cls else ''}{key[:-3].upper()} p99 (ms)")
    fig.suptitle(_wrapped(f"{title}: a dot per run, the line their median", 90))
    return fig


def policies_side_by_side(runs: list[tuple[str, dict]], title: str) -> bytes:
    return _png(policies_figure(runs, title))


def speed_vs_distance_figure(points: list[tuple[str, float, float, float | None, float | None]], title: str):
    """An optimisation that trades numbers for speed: each side's median output tok/s (bar: min to max of its
    repeats) against its pooled rel-L2 distance to the float32 truth, an arrow from the first to the second.
    Up is faster, right is further from the model's function; both axes start at 0 so ratios read true."""
    fig, axes = _subplots(1, height=3.4, width=6.5)
    ax = axes[0][0]
    colors = ["#4c72b0", "#c44e52", "#55a868", "#8172b2"]
    for (label, x, y, lo, hi), color in zip(points, colors):
        err = None
        if _num(lo) and _num(hi):
            err = [[max(y - lo, 0.0)], [max(hi - y, 0.0)]]
        ax.errorbar([x], [y], yerr=err, fmt="o", color=color, markersize=8, capsize=4, label=label)
        ax.annotate(f"{y:,.0f} tok/s\nrel-L2 {x:.3g}", (x, y), textcoords="offset points", xytext=(8, -4),
                    va="top")
    if len(points) == 2:
        (_, x0, y0, *_), (_, x1, y1, *_) = points
        ax.annotate("", (x1, y1), (x0, y0), arrowprops={"arrowstyle": "->", "color": "#555555"})
    xs = [p[1] for p in points]
    ys = [p[4] if _num(p[4]) else p[2] for p in points]
    ax.set_xlim(0, max(xs) * 1.45 if xs else 1)
    ax.set_ylim(0, max(ys) * 1.25 if ys else 1)
    ax.set_xlabel("pooled rel-L2 to the float32 truth (logits-check)")
    ax.set_ylabel("output tok/s (bench, median)")
    ax.yaxis.set_major_formatter("{x:,.0f}")
    ax.legend(loc="lower right")
    fig.suptitle(_wrapped(title, 80))
    return fig


def speed_vs_distance(points: list, title: str) -> bytes:
    return _png(speed_vs_distance_figure(points, title))


FAMILY_COLORS = {"attention_decode": "#c44e52", "attention_prefill": "#dd8452", "gemm": "#4c72b0",
                 "norm_rope_act": "#55a868", "kv_write": "#8172b2", "sampler": "#937860", "copy_memset": "#da8bc3",
                 "other": "#8c8c8c"}


def layer_timelines_figure(panels: list[tuple[str, dict]], title: str):
    """One decoder layer's kernels in time (bench --profile's layer_timeline), a row per side on one time axis:
    each kernel a bar from its start for its duration, coloured by family and numbered in launch order; the white
    between bars is time no kernel of the layer ran."""
    from matplotlib.patches import Patch

    fig, axes = _subplots(len(panels), height=1.9, width=9.0, sharex=True)
    longest = max(t["span_us"] for _, t in panels)
    seen: dict[str, str] = {}
    for (label, t), row in zip(panels, axes):
        ax = row[0]
        for n, k in enumerate(t["kernels"]):
            color = FAMILY_COLORS.get(k["family"], FAMILY_COLORS["other"])
            seen.setdefault(k["family"], color)
            ax.broken_barh([(k["start_us"], max(k["dur_us"], longest / 800))], (0.1, 0.8), facecolors=color,
                           edgecolors="white", linewidth=0.3)
            ax.text(k["start_us"] + k["dur_us"] / 2, 0.5, str(n), ha="center", va="center", fontsize=FONT_PT - 1.5,
                    color="white")
        ax.set_yticks([])
        ax.set_xlim(0, longest * 1.02)
        ax.set_title(f"{label}: {len(t['kernels'])} kernels in {t['span_us']:,.1f} us, busy {t['busy_us']:,.1f} "
                     f"us, gaps {t['gap_us']:,.1f} us (decode step {t.get('step')}, repeats {t.get('repeats')}x)")
    axes[-1][0].set_xlabel("us from the layer's first kernel")
    axes[0][0].legend(handles=[Patch(color=c, label=f) for f, c in seen.items()], loc="upper left",
                      bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(_wrapped(title, 90))
    return fig


def layer_timelines(panels: list[tuple[str, dict]], title: str) -> bytes:
    return _png(layer_timelines_figure(panels, title))
