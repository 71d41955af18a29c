"""The report's pictures at their edges, read from what each figure plots (the data on its lines, bars and
collections, its titles and labels), never from pixels: which rows a timeline draws and in what order, a
discarded chunk drawn pale, preemptions where they happened, KV blocks in use when the pool is only in the
run's config, the expected schedule a case describes, each logits gate, a comparison or bench run with a side
or repeat missing, the load histogram's p99, the speed-vs-distance error bar and the layer timelines' axis."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from matplotlib.colors import to_hex  # noqa: E402

from labkit.report import figures  # noqa: E402

figures.unavailable()   # selects the Agg backend


@pytest.fixture(autouse=True)
def _closed():
    yield
    figures.close_all()


def added(*rids):
    return [{"event": "request_added", "step": 0, "request_id": r} for r in rids]


def scheduled(step, phase, **tokens):
    return {"event": "scheduled", "step": step, "phase": phase,
            "seqs": [{"request_id": r, "num_scheduled_tokens": n} for r, n in tokens.items()]}


def cells_by_row(ax) -> dict[int, set[str]]:
    """Row index -> the colours its bars are drawn in."""
    rows: dict[int, set[str]] = {}
    for c in ax.collections:
        colour = to_hex(c.get_facecolor()[0])
        for path in c.get_paths():
            rows.setdefault(round(float(path.vertices[:, 1].min()) + 0.35), set()).add(colour)
    return rows


def test_a_timeline_of_exactly_max_rows_requests_draws_them_all_and_says_nothing_of_the_rest():
    n = figures.MAX_ROWS
    events = added(*(f"r{i}" for i in range(n))) + [scheduled(0, "prefill", **{f"r{i}": 4 for i in range(n)})]
    fig = figures.trace_timeline_figure(events, "case many")
    assert "first" not in fig.axes[0].get_title()
    assert len(fig.axes[0].get_yticklabels()) == n
    more = added(*(f"r{i}" for i in range(n + 1))) + [scheduled(0, "prefill", r0=4)]
    fig = figures.trace_timeline_figure(more, "case many")
    assert fig.axes[0].get_title().endswith(f"(first {n} of {n + 1} requests)")
    assert len(fig.axes[0].get_yticklabels()) == n


def test_a_discarded_prefill_chunk_is_pale_and_one_without_an_accepted_field_is_not():
    events = added("a", "b") + [
        scheduled(0, "prefill", a=16, b=16),
        {"event": "after_postprocess", "step": 0, "free_blocks": 60,
         "seqs": [{"request_id": "a", "accepted": False}, {"request_id": "b"}]},
    ]
    ax = figures.trace_timeline_figure(events, "case pale").axes[0]
    assert cells_by_row(ax) == {0: {figures.PHASE_COLORS["prefill chunk (no output)"]},
                                1: {figures.PHASE_COLORS["prefill"]}}


def test_a_malformed_seqs_draws_its_well_formed_entries_only():
    # The report draws logs it did not validate: a `seqs` that is not a list, or holds a non-object, draws what is
    # well formed (here a's chunk, pale because after_postprocess discarded it) instead of raising.
    for bad in ("ab", 3, [7]):
        events = added("a", "b") + [
            scheduled(0, "prefill", a=16),
            {"event": "scheduled", "step": 1, "phase": "prefill", "seqs": bad},
            {"event": "after_postprocess", "step": 0, "free_blocks": 60,
             "seqs": [{"request_id": "a", "accepted": False}] + (bad if isinstance(bad, list) else [])},
            {"event": "after_postprocess", "step": 1, "free_blocks": 60, "seqs": bad},
        ]
        ax = figures.trace_timeline_figure(events, "case bad").axes[0]
        assert cells_by_row(ax) == {0: {figures.PHASE_COLORS["prefill chunk (no output)"]}}, bad


def test_chunk_token_counts_are_written_only_while_the_run_is_short_enough_to_read_them():
    short = added("a") + [scheduled(s, "prefill", a=8) for s in range(figures.MAX_LABELLED_STEPS)]
    ax = figures.trace_timeline_figure(short, "case short").axes[0]
    assert [t.get_text() for t in ax.texts] == ["8"] * figures.MAX_LABELLED_STEPS
    long = added("a") + [scheduled(s, "prefill", a=8) for s in range(figures.MAX_LABELLED_STEPS + 1)]
    ax = figures.trace_timeline_figure(long, "case long").axes[0]
    assert len(ax.texts) == 0


def test_a_preemption_is_marked_at_its_step_on_its_requests_row_and_the_first_request_is_on_top():
    events = added("a", "b", "c") + [scheduled(s, "decode", a=1, b=1, c=1) for s in range(6)]
    events.append({"event": "preempted", "step": 4, "request_id": "c"})
    ax = figures.trace_timeline_figure(events, "case preempt").axes[0]
    (mark,) = [line for line in ax.get_lines() if line.get_marker() == "x"]
    assert mark.get_xdata().tolist() == [4] and mark.get_ydata().tolist() == [2]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    bottom, top = ax.get_ylim()
    assert top < 0 < 2 < bottom                    # row 0 (a) at the top, row 2 (c) at the bottom


def test_a_request_added_twice_is_one_row():
    events = added("a", "b", "a") + [scheduled(0, "prefill", a=4, b=4)]
    ax = figures.trace_timeline_figure(events, "case twice").axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]


def test_kv_blocks_in_use_when_the_pool_is_only_in_the_run_config():
    events = [{"event": "run_start", "step": 0, "config": {"num_kvcache_blocks": 10}}] + added("a") + [
        scheduled(0, "prefill", a=4),
        {"event": "after_postprocess", "step": 0, "free_blocks": 7, "seqs": []},
        {"event": "after_postprocess", "step": 1, "free_blocks": 9, "seqs": []},
    ]
    kv = figures.trace_timeline_figure(events, "case cfg").axes[1]
    (line,) = kv.get_lines()
    assert line.get_ydata().tolist() == [3, 1]
    assert "pool of 10" in kv.get_title() and kv.get_ylabel() == "blocks in use"


def test_the_expected_schedule_reads_both_forms_and_defaults_to_prefill():
    expect = [{"step": 0, "scheduled": {"a": {"scheduled": 12}, "b": 5}},
              {"step": 1, "phase": "decode", "scheduled": {"a": 1}},
              {"step": "x", "scheduled": {"z": 1}}]                      # not a step: skipped
    requests, cells = figures.expected_cells(expect, ["b"])
    assert requests == ["b", "a"]
    assert cells == [("a", 0, "prefill", 12), ("b", 0, "prefill", 5), ("a", 1, "decode", 1)]


def test_an_anchored_row_judged_on_two_sides_is_drawn_at_its_worse_side():
    check = {"suite": "s", "verdict": "FAIL",
             "gate": {"rule": "anchored", "row_factor": 2.5, "row_fail_factor": 5.0, "judged": ["lhs", "rhs"]},
             "rows": [{"status": "FAIL", "to_truth": {"lhs": {"ratio": 1.0}, "rhs": {"ratio": 7.0}}},
                      {"status": "PASS", "to_truth": {"lhs": {"ratio": 0.5}, "rhs": {"ratio": 0.2}}}]}
    ax = figures.logits_rows_figure(check).axes[0]
    assert ax.collections[0].get_offsets()[:, 1].tolist() == [7.0, 0.5]


def test_a_fixed_gate_of_zero_draws_no_threshold_line_and_a_partly_missing_metric_keeps_its_panel():
    check = {"suite": "graph", "verdict": "PASS", "gate": {"rule": "fixed"},
             "thresholds": {"max_abs": 0, "rel_l2": 0.02},
             "rows": [{"max_abs": 0.1, "rel_l2": 0.001, "status": "PASS"}, {"max_abs": 0.2, "status": "PASS"}]}
    fig = figures.logits_rows_figure(check)
    assert [a.get_title().split()[0] for a in fig.axes] == ["max_abs", "rel_l2"]
    assert [[line.get_ydata()[0] for line in a.get_lines()] for a in fig.axes] == [[], [0.02]]


def _side(lo, med, hi, n=3):
    return {"n": n, "min": lo, "median": med, "max": hi}


def test_a_comparison_skips_a_metric_missing_on_a_side_and_draws_the_headline_first():
    cmp = {"variable": "eager", "headline_metric": "tput",
           "metrics": {"lat": {"label": "lat", "a": _side(1, 2, 3), "b": _side(4, 5, 6)},
                       "gone": {"label": "gone", "a": _side(1, 2, 3), "b": {"n": 0}},
                       "tput": {"label": "tput", "a": _side(10, 20, 30), "b": _side(40, 50, 60)}},
           "values": {"a": {"eager": True}, "b": {"eager": False}}}
    fig = figures.compare_figure(cmp)
    assert [a.get_title().split(":")[0] for a in fig.axes] == ["tput", "lat"]
    none = figures.compare_figure({"metrics": {"gone": {"a": _side(1, 2, 3), "b": {"n": 0}}}})
    assert [t.get_text() for t in none.axes[0].texts] == ["no samples on a side"]


def test_a_bench_run_with_one_repeat_missing_its_decode_time_keeps_the_decode_panel():
    result = {"workload": {"name": "w"}, "backend": "engine", "execution": "eager", "evidence": "cpu-executed",
              "runs": [{"repeat": 0, "output_throughput": 10.0, "decode_ms_per_token": 2.0},
                       {"repeat": 1, "output_throughput": 11.0}],
              "median": {"output_throughput": 10.5, "decode_ms_per_token": 2.0}}
    fig = figures.bench_figure(result)
    assert [a.get_title() for a in fig.axes] == ["output tok/s, every repeat", "decode ms per token, every repeat"]
    heights = [p.get_height() for p in fig.axes[1].patches]
    assert heights[0] == 2.0 and np.isnan(heights[1])


def test_the_load_histogram_marks_p50_and_p99():
    values = [float(i) for i in range(1, 101)]
    fig = figures.load_distributions_figure([{"ttft_ms": v, "itl_ms": [v]} for v in values], "t")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [f"p50 {np.percentile(values, 50):.1f}",
                                                                   f"p99 {np.percentile(values, 99):.1f}"]
    assert [line.get_xdata()[0] for line in ax.get_lines()] == [np.percentile(values, 50),
                                                                 np.percentile(values, 99)]


def test_speed_vs_distance_error_bar_spans_min_to_max_and_the_axis_holds_its_top():
    fig = figures.speed_vs_distance_figure([("A", 0.04, 100.0, 60.0, 101.0), ("B", 0.2, 150.0, 149.0, 400.0)], "t")
    ax = fig.axes[0]
    spans = []
    for container in ax.containers:
        (bars,) = container.lines[2]
        (seg,) = bars.get_segments()
        spans.append((float(seg[0][1]), float(seg[1][1])))
    assert spans == [(60.0, 101.0), (149.0, 400.0)]
    assert ax.get_ylim()[1] >= 400.0


def test_layer_timelines_share_the_longer_sides_span():
    def side(n):
        return {"span_us": 10.0 * n, "busy_us": 8.0 * n, "gap_us": 2.0 * n, "step": 1, "repeats": 1,
                "kernels": [{"name": f"k{i}", "family": "gemm", "start_us": 10.0 * i, "dur_us": 8.0} for i in range(n)]}
    fig = figures.layer_timelines_figure([("before", side(5)), ("after", side(2))], "t")
    for ax in fig.axes:
        assert ax.get_xlim() == pytest.approx((0, 50.0 * 1.02))
