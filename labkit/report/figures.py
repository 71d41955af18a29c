"""The report's pictures, drawn with matplotlib (an optional dependency: the `plot` and `test` extras) into
PNG bytes: per trace a step timeline and the KV blocks in use, per logits check each row's distance against
the gate, per bench comparison every repeat of each side, per load run the TTFT and ITL distributions."""
from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

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


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _subplots(rows: int, cols: int = 1, height: float = 2.6, width: float = 8.0, **kw):
    import matplotlib.pyplot as plt

    return plt.subplots(rows, cols, figsize=(width, height * rows), squeeze=False, layout="constrained", **kw)


def trace_timeline(events: list[dict], title: str) -> bytes:
    """Top: one row per request, one cell per step it was scheduled in (prefill chunks labelled with their
    token count, decodes, preemptions marked). Bottom: KV blocks used and free after every step."""
    requests: list[str] = []
    cells: list[tuple[str, int, str, int]] = []     # request, step, phase, scheduled tokens
    accepted: dict[tuple[str, int], bool] = {}
    preempted: list[tuple[str, int]] = []
    free: list[tuple[int, int]] = []
    total = None
    for e in events:
        kind, step = e.get("event"), e.get("step")
        if kind == "run_start":
            total = e.get("num_kvcache_blocks") or (e.get("config") or {}).get("num_kvcache_blocks")
        elif kind == "request_added" and str(e.get("request_id")) not in requests:
            requests.append(str(e.get("request_id")))
        elif kind == "scheduled":
            for s in e.get("seqs") or []:
                cells.append((str(s.get("request_id")), int(step), str(e.get("phase")),
                              int(s.get("num_scheduled_tokens") or 0)))
        elif kind == "preempted":
            preempted.append((str(e.get("request_id")), int(step)))
        elif kind == "after_postprocess":
            for s in e.get("seqs") or []:
                accepted[(str(s.get("request_id")), int(step))] = bool(s.get("accepted", True))
            if isinstance(e.get("free_blocks"), int):
                free.append((int(step), int(e["free_blocks"])))
    for r, *_ in cells:
        if r not in requests:
            requests.append(r)
    row = {r: i for i, r in enumerate(requests)}
    fig, axes = _subplots(2, height=max(1.8, 0.45 * len(requests) + 1.0))
    ax = axes[0][0]
    for r, step, phase, n in cells:
        if phase == "prefill" and not accepted.get((r, step), True):
            phase = "prefill chunk (no output)"   # postprocess discarded this step's candidate
        ax.broken_barh([(step - 0.45, 0.9)], (row[r] - 0.35, 0.7), facecolors=PHASE_COLORS.get(phase, "#8172b2"))
        if phase.startswith("prefill"):
            ax.text(step, row[r], str(n), ha="center", va="center", fontsize=7, color="black")
    for r, step in preempted:
        if r in row:
            ax.plot([step], [row[r]], marker="x", color="#c44e52", markersize=10, mew=2)
    ax.set_yticks(range(len(requests)), requests)
    ax.invert_yaxis()
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("engine step")
    ax.set_title(f"{title}: scheduled tokens per request and step; x = preempted", fontsize=9)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=p) for p, c in PHASE_COLORS.items()], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax = axes[1][0]
    if free:
        steps = [s for s, _ in free]
        ax.plot(steps, [f for _, f in free], marker="o", label="free", color="#4c72b0")
        if isinstance(total, int):
            ax.plot(steps, [total - f for _, f in free], marker="o", label="used", color="#c44e52")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("engine step")
    ax.set_ylabel("KV blocks")
    ax.set_title(f"KV blocks after each step (pool of {total if total is not None else '?'})", fontsize=9)
    return _png(fig)


def _finite(values: list[Any]) -> list[float]:
    return [float(v) if isinstance(v, (int, float)) and math.isfinite(v) else float("nan") for v in values]


def _row_verdict(row: dict) -> str | None:
    return row.get("verdict") or row.get("status")


def logits_rows(check: dict) -> bytes:
    """Each row's distances (to the reference, and to a float32 truth where the check records one) against the
    check's gates, coloured by the row's verdict."""
    rows = check.get("rows") or []
    th = check.get("thresholds") or {}
    keys = [k for k in ("max_abs", "rel_l2") if any(k in r for r in rows)]
    keys += sorted({k for r in rows for k, v in r.items()
                    if "truth" in k and isinstance(v, (int, float)) and not isinstance(v, bool)} - set(keys))
    keys = keys or ["max_abs"]
    fig, axes = _subplots(1, len(keys), height=2.8, width=4.5 * len(keys))
    colors = [STATUS_COLORS.get(_row_verdict(r), "#8172b2") for r in rows]
    x = list(range(len(rows)))
    for ax, key in zip(axes[0], keys):
        ys = _finite([r.get(key) for r in rows])
        ax.scatter(x, [max(y, 1e-12) for y in ys], c=colors, s=14)
        gate = th.get(key)
        if isinstance(gate, (int, float)) and not isinstance(gate, bool) and gate > 0:
            ax.axhline(gate, color="#c44e52", linestyle="--", linewidth=1, label=f"gate {gate:g}")
            ax.legend(fontsize=7)
        ax.set_yscale("log")
        ax.set_xlabel("row")
        ax.set_title(f"{key} per row (exact zeros at the bottom)", fontsize=9)
    fig.suptitle(f"logits-check {check.get('suite')}: {check.get('verdict')}", fontsize=10)
    return _png(fig)


def compare_repeats(cmp: dict) -> bytes:
    """Every timed repeat of A and B (output tok/s) with each side's median."""
    fig, axes = _subplots(1, height=2.6, width=6.0)
    ax = axes[0][0]
    for i, side in enumerate(("a", "b")):
        runs = (cmp.get(side) or {}).get("runs") or []
        ys = _finite([r.get("output_throughput") for r in runs])
        ax.scatter([i] * len(ys), ys, color="#4c72b0", zorder=3)
        good = sorted(y for y in ys if not math.isnan(y))
        if good:
            med = good[len(good) // 2] if len(good) % 2 else (good[len(good) // 2 - 1] + good[len(good) // 2]) / 2
            ax.hlines(med, i - 0.2, i + 0.2, color="#c44e52")
    ax.set_xticks([0, 1], ["A", "B"])
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylabel("output tok/s")
    ratio = cmp.get("ratio")
    said = cmp.get("headline") or (f"B/A {ratio:.3f}x" if isinstance(ratio, (int, float)) else "")
    ax.set_title(f"--variable {cmp.get('variable')}: every repeat, median as a bar"
                 + (f" ({said})" if said else ""), fontsize=9)
    return _png(fig)


def load_distributions(records: list[dict], title: str) -> bytes:
    """Histograms of TTFT per request and of every inter-token latency."""
    ttft = [v for v in _finite([r.get("ttft_ms") for r in records]) if not math.isnan(v)]
    itl = [v for v in _finite([x for r in records for x in (r.get("itl_ms") or [])]) if not math.isnan(v)]
    fig, axes = _subplots(1, 2, height=2.6, width=9.0)
    for ax, values, label in ((axes[0][0], ttft, "TTFT (ms), per request"), (axes[0][1], itl, "ITL (ms), every gap")):
        if values:
            ax.hist(values, bins=min(30, max(5, len(values) // 3)), color="#4c72b0")
            for q, style in ((50, "--"), (99, ":")):
                v = float(np.percentile(values, q))
                ax.axvline(v, color="#c44e52", linestyle=style, linewidth=1, label=f"p{q} {v:.1f}")
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"{label}: n={len(values)}", fontsize=9)
        ax.set_ylabel("count")
    fig.suptitle(title, fontsize=10)
    return _png(fig)
