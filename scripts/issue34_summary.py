"""Issue 34's GPU call, summarised (scripts/gpu_session.sh issue34 writes the logs; this reads them):

    python scripts/issue34_summary.py LOGS_DIR > issue34-summary.md

A. The streams' cost: output tok/s at rate inf with the step stream, KV events and a watch client attached against
   the same server without them, round by round; the bar: the mean with streams within 2% of the mean without.
B. trace --url over nano at rate 16 under mixed: its verdict and invariant counts; the bar: 0 failures.
C. The policies at the default budget: ITL p99 at rates 16 and 32, output tok/s and TTFT p99 at rate inf, and
   Deliver 7's rule (the lowest ITL p99 at 16 and 32 among the policies within 3% of the best rate-inf throughput
   and TTFT p99).
D. /metrics' prompt tokens over every load against the load's input tokens (the bar: equal under every policy).
Files that a cut-short call did not write are reported missing.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

POLICIES = ("prefill_first", "balanced", "mixed")


def metric(text: str, name: str) -> float | None:
    """The sum of a metric's samples (all labels) in a Prometheus exposition."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    return total if seen else None


def load(logs: Path, name: str) -> dict | None:
    p = logs / f"load-{name}.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def prompt_check(logs: Path, name: str) -> tuple[float | None, int | None]:
    """(/metrics prompt tokens counted over the load, the load's input tokens)."""
    r = load(logs, name)
    try:
        before = metric((logs / f"metrics-{name}-before.txt").read_text(), "labkit:prompt_tokens_total")
        after = metric((logs / f"metrics-{name}-after.txt").read_text(), "labkit:prompt_tokens_total")
    except OSError:
        return None, (r or {}).get("metrics", {}).get("input_tokens")
    counted = None if before is None or after is None else after - before
    return counted, (r or {}).get("metrics", {}).get("input_tokens")


def _ms(m: dict, key: str, q: str = "p99") -> float | None:
    v = (m.get(key) or {})
    return v.get(q) if isinstance(v, dict) else None


def summarize(logs: Path) -> tuple[str, dict]:
    out, verdicts = [], {}
    # A
    out.append("## A. The streams' cost at rate inf (nano, output tok/s)\n")
    out.append("| round | without | with step stream + KV events + watch | ratio |")
    out.append("| --- | --- | --- | --- |")
    plain, streams = [], []
    for r in (1, 2, 3):
        a, b = load(logs, f"overhead-plain-r{r}"), load(logs, f"overhead-streams-r{r}")
        ta = a and a["metrics"].get("output_throughput")
        tb = b and b["metrics"].get("output_throughput")
        if ta:
            plain.append(ta)
        if tb:
            streams.append(tb)
        ratio = f"{tb / ta:.3f}" if ta and tb else "-"
        out.append(f"| {r} | {ta or 'missing'} | {tb or 'missing'} | {ratio} |")
    if plain and streams:
        ratio = (sum(streams) / len(streams)) / (sum(plain) / len(plain))
        verdicts["streams_within_2pct"] = ratio >= 0.98
        out.append(f"\nmean with / mean without: {ratio:.4f} -> {'PASS' if ratio >= 0.98 else 'FAIL'} (bar: >= 0.98)")
    for r in (1, 2, 3):
        taps = logs / f"taps-r{r}.json"
        watch = logs / f"watch-r{r}.json"
        if taps.exists():
            try:
                taps_text = "; ".join(f"{t['endpoint']}: {t['messages']} messages, {t['bytes']} bytes, gaps {t['gaps']}"
                                      for t in json.loads(taps.read_text()))
            except (ValueError, KeyError, TypeError):
                taps_text = "unreadable"
            out.append(f"- round {r} subscribers: {taps_text}")
        if watch.exists():
            try:
                text = watch.read_text()
                w = json.loads(text[text.index("{"):])
                out.append(f"- round {r} watch: {w.get('steps_seen')} step records seen, dropped {w.get('dropped')}")
            except (ValueError, OSError):
                out.append(f"- round {r} watch: unreadable output")
    # B
    out.append("\n## B. trace --url over nano at rate 16 under mixed\n")
    check = logs.parent / "runs" / "trace-live-mixed" / "check.json"
    try:
        c = json.loads(check.read_text())
        counts = c["report"]["counts"]
        failed = sum(v.get("failed", 0) for v in counts.values())
        verdicts["trace_url_zero_failures"] = failed == 0 and c["verdict"] == "PASS"
        out.append(f"verdict {c['verdict']}, steps {c.get('first_step')}-{c.get('last_step')} ({c.get('steps')}), "
                   f"{c.get('live_at_open')} requests live at the start; counts {json.dumps(counts)}")
        if c["report"].get("first_failure"):
            out.append(f"first failure: {c['report']['first_failure'].get('message')}")
    except (OSError, ValueError, KeyError):
        out.append("missing (no runs/trace-live-mixed/check.json)")
    # C
    out.append("\n## C. The policies at the default budget (fresh server each, same prompts)\n")
    out.append("| policy | r16 ITL p99 ms | r16 tpot med | r32 ITL p99 ms | r32 out tok/s | inf out tok/s | "
               "inf TTFT p99 ms |")
    out.append("| --- | --- | --- | --- | --- | --- | --- |")
    rows = {}
    for p in POLICIES:
        r16, r32, rinf = (load(logs, f"policy-{p}-rate{x}") for x in ("16", "32", "inf"))
        if not (r16 and r32 and rinf):
            out.append(f"| {p} | missing | | | | | |")
            continue
        m16, m32, mi = r16["metrics"], r32["metrics"], rinf["metrics"]
        rows[p] = {"itl16": _ms(m16, "itl_ms"), "itl32": _ms(m32, "itl_ms"), "inf_tput": mi.get("output_throughput"),
                   "inf_ttft": _ms(mi, "ttft_ms")}
        out.append(f"| {p} | {rows[p]['itl16']:.1f} | {_ms(m16, 'tpot_ms', 'median'):.2f} | {rows[p]['itl32']:.1f} | "
                   f"{m32.get('output_throughput'):,.0f} | {rows[p]['inf_tput']:,.0f} | {rows[p]['inf_ttft']:.0f} |")
    if rows:
        best_t = max(r["inf_tput"] for r in rows.values())
        best_ttft = min(r["inf_ttft"] for r in rows.values())
        ok = [p for p, r in rows.items() if r["inf_tput"] >= 0.97 * best_t and r["inf_ttft"] <= 1.03 * best_ttft]
        out.append(f"\nwithin 3% of the best rate-inf throughput ({best_t:,.0f}) and TTFT p99 ({best_ttft:.0f} ms): "
                   f"{', '.join(ok) or 'none'}")
        pool = ok or list(rows)
        pick = min(pool, key=lambda p: (rows[p]["itl16"] + rows[p]["itl32"]) / 2)
        verdicts["default_policy"] = pick
        out.append(f"Deliver 7's rule picks: **{pick}** (lowest mean of ITL p99 at rates 16 and 32 among "
                   f"{'those' if ok else 'all (none kept rate inf within 3%)'})")
    # D
    out.append("\n## D. /metrics prompt tokens against the loads' input tokens\n")
    out.append("| load | /metrics prompt_tokens_total (delta) | load input tokens | equal |")
    out.append("| --- | --- | --- | --- |")
    all_equal = True
    names = [f"policy-{p}-rate{x}" for p in POLICIES for x in ("16", "32", "inf")] + ["live-mixed-rate16"] + \
        [f"overhead-{c}-r{r}" for r in (1, 2, 3) for c in ("plain", "streams")]
    for name in names:
        counted, want = prompt_check(logs, name)
        if counted is None and want is None:
            continue
        eq = counted is not None and want is not None and int(counted) == int(want)
        all_equal &= eq
        out.append(f"| {name} | {counted} | {want} | {'yes' if eq else 'NO'} |")
    verdicts["prompt_tokens_equal"] = all_equal
    out.append(f"\nverdicts: {json.dumps(verdicts)}")
    return "\n".join(out) + "\n", verdicts


if __name__ == "__main__":
    text, _ = summarize(Path(sys.argv[1]))
    sys.stdout.write(text)
