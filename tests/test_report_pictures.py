"""The report's pictures read at the size report.html shows them: text of 11 px or more, gates drawn where a
check has them, distances only (never token ids) on a logits axis, KV blocks on the scale a small case uses,
a CHANGED trace as expected against actual, and every kind of bench result drawn. Figures from hand-made
inputs; the HTML against its Markdown twin from real CPU runs."""
from __future__ import annotations

import json
import struct

import pytest

pytest.importorskip("matplotlib")

from labkit.bench import compare as cmp  # noqa: E402
from labkit.report import figures  # noqa: E402
from labkit.trace.cases import load_case  # noqa: E402

from .helpers import run_cli  # noqa: E402
from .test_bench_compare import _load_result, _synthetic  # noqa: E402
from .test_validate import chunk_log  # noqa: E402

figures.unavailable()   # selects the Agg backend


def anchored_check(ratios=(0.2, 3.0, 6.0)):
    statuses = ["PASS" if r <= 2.5 else "REVIEW" if r <= 5 else "FAIL" for r in ratios]
    return {"suite": "baseline", "verdict": "FAIL",
            "gate": {"rule": "anchored", "row_factor": 2.5, "row_fail_factor": 5.0, "judged": ["lhs"]},
            "rows": [{"index": i, "truth_top1": 140000 + i, "truth_top2_margin": 0.5, "max_abs": r * 4e-5,
                      "rel_l2": r * 4e-6, "status": s, "to_truth": {"lhs": {"ratio": r, "status": s}}}
                     for i, (r, s) in enumerate(zip(ratios, statuses))]}


def fixed_check():
    return {"suite": "graph", "verdict": "PASS", "gate": {"rule": "fixed"},
            "thresholds": {"max_abs": 0.5, "rel_l2": 0.02},
            "rows": [{"max_abs": 0.01 * (i + 1), "rel_l2": 0.001 * (i + 1), "status": "PASS"} for i in range(4)]}


def load_comparison(tmp_path):
    a = _load_result(tmp_path, "a", [100.0 + i for i in range(20)])
    b = _load_result(tmp_path, "b", [150.0 + i for i in range(20)], **{"--max-num-seqs": 16})
    return cmp.compare(cmp.load_bench(a), cmp.load_bench(b), "max_num_seqs")


def offline_comparison():
    a, b = _synthetic([100.0, 101.0, 102.0]), _synthetic([150.0, 151.0, 152.0], enforce_eager=False)
    res = cmp.compare(a, b, "eager")
    res["a"], res["b"] = cmp.side(a, "a.json"), cmp.side(b, "b.json")
    return res


def bench_result():
    return {"workload": {"name": "batch1"}, "backend": "engine", "execution": "graph", "evidence": "gpu-measured",
            "runs": [{"repeat": i, "output_throughput": 700.0 + i, "decode_ms_per_token": 1.0 + i / 100}
                     for i in range(3)], "median": {"output_throughput": 701.0, "decode_ms_per_token": 1.01}}


def every_figure(tmp_path):
    return {
        "trace": figures.trace_timeline_figure(chunk_log(), "case chunk"),
        "changed": figures.trace_changed_figure(chunk_log(), load_case("D").expect, [{"step": 1}], "case chunk"),
        "anchored": figures.logits_rows_figure(anchored_check()),
        "fixed": figures.logits_rows_figure(fixed_check()),
        "compare offline": figures.compare_figure(offline_comparison()),
        "compare load": figures.compare_figure(load_comparison(tmp_path)),
        "bench": figures.bench_figure(bench_result()),
        "policies": figures.policies_figure([(p, _arrivals_run(p, 1, 1.0)["metrics"])
                                             for p in ("prefill_first", "balanced", "mixed")], "lab arrivals"),
        "load": figures.load_distributions_figure([{"ttft_ms": 10.0 + i, "itl_ms": [1.0, 2.0]} for i in range(9)],
                                                  "bench load fixed at rate 4"),
        "speed vs distance": figures.speed_vs_distance_figure(
            [("A: kv auto", 0.0427, 26100.0, 26000.0, 26200.0), ("B: kv fp8", 0.181, 36200.0, 36000.0, 36400.0)],
            "fp8-kv: tok/s against the distance to the float32 truth, A and B"),
        "layer timelines": figures.layer_timelines_figure(
            [(side, {"span_us": 12.0 * n, "busy_us": 10.0 * n, "gap_us": 2.0 * n, "step": 17, "repeats": 27,
                     "kernels": [{"name": f"k{i}", "family": "gemm", "start_us": 3.0 * i, "dur_us": 2.5}
                                 for i in range(4 * n)]}) for side, n in (("before", 3), ("after", 2))],
            "batch1-kernels: one decoder layer's kernels in time, before and after"),
    }


def shown_px(fig) -> tuple[int, float]:
    """The PNG's width in pixels and its smallest text in pixels once the page fits it into its column."""
    from matplotlib.text import Text

    png = figures._png(fig)
    width = struct.unpack(">I", png[16:20])[0]
    smallest = min(t.get_fontsize() for t in fig.findobj(Text) if t.get_text().strip() and t.get_visible())
    return width, smallest * figures.DPI / 72 * min(1.0, figures.PAGE_PX / width)


def test_every_picture_keeps_its_text_legible_in_the_page(tmp_path):
    for name, fig in every_figure(tmp_path).items():
        width, text_px = shown_px(fig)
        assert width <= figures.PAGE_PX, (name, width)
        assert text_px >= 11, (name, text_px)


def _hlines(ax) -> list[float]:
    return [line.get_ydata()[0] for line in ax.get_lines() if len(set(line.get_ydata())) == 1]


def test_logits_pictures_draw_their_gate_and_no_token_ids():
    fig = figures.logits_rows_figure(anchored_check())
    (ax,) = fig.axes[:1]
    assert sorted(_hlines(ax)) == [2.5, 5.0]                       # PASS up to 2.5x, FAIL beyond 5x
    assert sorted(ax.collections[0].get_offsets()[:, 1].tolist()) == [0.2, 3.0, 6.0]
    assert ax.get_yscale() == "linear" and ax.get_ylim()[1] >= 6.0
    titles = " ".join(a.get_title() for a in fig.axes)
    assert "top1" not in titles and "top2" not in titles            # token ids are labels, not magnitudes
    fixed = figures.logits_rows_figure(fixed_check())
    assert [_hlines(a) for a in fixed.axes] == [[0.5], [0.02]]


def test_kv_blocks_of_a_small_case_are_drawn_on_their_own_scale():
    fig = figures.trace_timeline_figure(chunk_log(), "case chunk")
    kv = fig.axes[1]
    (line,) = kv.get_lines()
    assert line.get_ydata().tolist() == [3, 4, 4, 0]              # in use, of a pool of 64
    assert kv.get_ylim()[1] < 10 and "pool of 64" in kv.get_title()


def test_a_changed_trace_is_drawn_as_expected_against_actual():
    """chunk's run against case D's expectations (the same requests under budget 256): the top panel holds D's
    chunks, the bottom the run's, the differing step shaded in both."""
    fig = figures.trace_changed_figure(chunk_log(), load_case("D").expect, [{"step": 1}, {"step": 1}], "case chunk")
    expected, actual = fig.axes[0], fig.axes[1]
    labels = [[t.get_text() for t in ax.texts] for ax in (expected, actual)]
    assert labels == [["256", "256", "188", "32"], ["512", "188", "32"]]
    assert "expects" in expected.get_title() and "run did" in actual.get_title()
    for ax in (expected, actual):
        shaded = [p for p in ax.patches if p.get_facecolor()[:3] != (1, 1, 1)]
        assert any(abs(p.get_x() - 0.5) < 1e-9 for p in shaded)   # step 1, from 0.5 to 1.5


def test_a_load_comparison_draws_each_side_spread(tmp_path):
    res = load_comparison(tmp_path)
    fig = figures.compare_figure(res)
    assert [a.get_title().split(":")[0] for a in fig.axes] == ["e2el ms", "ttft ms", "tpot ms"]
    e2el = fig.axes[0]
    segments = [seg for c in e2el.collections if hasattr(c, "get_segments") for seg in c.get_segments()]
    spans = sorted((float(s[0][1]), float(s[1][1])) for s in segments)
    m = res["metrics"]["e2el_ms"]
    assert spans == [(m["a"]["min"], m["a"]["max"]), (m["b"]["min"], m["b"]["max"])]


def test_report_html_has_every_section_of_its_markdown_and_a_changed_picture(tiny_model, tmp_path, capsys,
                                                                              monkeypatch):
    runs = tmp_path / "runs"
    tiny = ["--model", tiny_model, "--device", "cpu", "-q"]
    code, _, err = run_cli(["trace", "--case", "lifecycle", "--max-num-batched-tokens", "100", *tiny, "--out",
                            str(runs / "trace-lifecycle")], capsys)
    assert code == 0, err
    (runs / "perfetto.json").write_text(json.dumps({"traceEvents": []}))     # not a labkit result
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli(["report", "--runs", str(runs), "--out", str(tmp_path / "report")], capsys)
    assert code == 0, err
    # The terminal table at 80 columns: every lab's headline whole, the short evidence marked and explained.
    shown = set(out.split())
    for lab in json.loads((tmp_path / "report" / "manifest.json").read_text())["labs"]:
        assert all(word in shown for word in lab["headline"].split()), lab["headline"]
    assert "cpu-executed*" in shown and "* weaker evidence than the lab needs" in " ".join(out.split())
    md = (tmp_path / "report" / "report.md").read_text()
    page = (tmp_path / "report" / "report.html").read_text()
    sections = [line[3:] for line in md.splitlines() if line.startswith("## ")]
    assert "How to produce what is MISSING" in sections
    for title in sections:
        assert f"<h2>{title}</h2>" in page, title
    assert "<code>labkit trace --case A</code>" in page
    assert "JSON files that are not labkit results (not judged): <code>perfetto.json</code>" in page
    assert 'alt="trace lifecycle: expected against actual (trace-lifecycle/check.json)"' in page


def test_a_load_run_with_request_classes_is_read_and_drawn_per_class():
    """The scheduling-under-arrivals lab: the headline names the policy and each class's ITL / TTFT p99, and the
    picture has a row of TTFT and ITL per class."""
    from labkit.report.results import _load

    records = [{"id": f"s{i}", "class": "short", "ttft_ms": 10.0 + i, "itl_ms": [2.0, 3.0, 40.0]} for i in range(6)]
    records += [{"id": f"l{i}", "class": "long", "ttft_ms": 300.0 + i, "itl_ms": [5.0]} for i in range(3)]
    fig = figures.load_distributions_figure(records, "mixed")
    titles = [ax.get_title() for ax in fig.axes]
    figures.close_all()
    assert titles == ["short: TTFT (ms), per request: n=6", "short: ITL (ms), every gap: n=18",
                      "long: TTFT (ms), per request: n=3", "long: ITL (ms), every gap: n=3"]
    stat = {"p99": 41.0}
    d = {"status": "ok", "config": {"server": {"--scheduling-policy": "mixed"}, "source": {"arrivals": "a.jsonl"}},
         "metrics": {"completed": 9, "requests": 9, "output_throughput": 100.0, "ttft_ms": {"median": 11},
                     "tpot_ms": {"median": 3}, "classes": {"short": {"itl_ms": stat, "ttft_ms": {"p99": 15}},
                                                         "long": {"itl_ms": {"p99": 5}, "ttft_ms": {"p99": 302}}}}}
    verdict, text = _load(d)
    assert verdict == "RECORDED" and "(policy mixed)" in text
    assert "short: itl p99 41.0 ms, ttft p99 15.0 ms" in text and "long: itl p99 5.0 ms, ttft p99 302.0 ms" in text


def test_a_comparison_names_its_sides_by_the_variables_values_and_a_median_reads_as_a_figure(tmp_path):
    offline = figures.compare_figure(offline_comparison())
    assert [t.get_text() for t in offline.axes[0].get_xticklabels()] == ["A: enforce_eager\nTrue",
                                                                          "B: enforce_eager\nFalse"]
    load = figures.compare_figure(load_comparison(tmp_path))
    ticks = [t.get_text().replace("\n", " ") for t in load.axes[0].get_xticklabels()]
    assert ticks == ["A: max-num-seqs default", "B: max-num-seqs 16"]
    nano = bench_result()
    nano["median"]["output_throughput"] = 26580.4
    legend = figures.bench_figure(nano).axes[0].get_legend().get_texts()[0].get_text()
    assert legend == "median 26,580"


def _arrivals_run(policy: str, n: int, scale: float) -> dict:
    def stats(ttft, itl):
        return {"ttft_ms": {"p99": ttft * scale, "median": ttft}, "itl_ms": {"p99": itl * scale, "median": itl},
                "completed": 8, "requests": 8}
    return {"command": "bench load", "evidence": "gpu-measured", "status": "ok",
            "started_at": f"2026-12-02T10:0{n}:00.000Z",
            "argv": ["labkit", "bench", "load", "--arrivals", "workloads/arrivals/short-and-long.jsonl",
                     "--scheduling-policy", policy],
            "config": {"source": {"arrivals": "workloads/arrivals/short-and-long.jsonl"},
                       "server": {"started": True, "--scheduling-policy": policy}},
            "metrics": {**stats(100.0, 10.0), "output_throughput": 500.0,
                        "classes": {"short": stats(20.0, 8.0), "long": stats(300.0, 12.0)}}}


def test_the_arrivals_lab_draws_its_three_policies_side_by_side(tmp_path, capsys):
    """scheduling-under-arrivals asks which policy makes which class pay: one picture, a column per policy,
    both runs of each as dots, per class."""
    runs = tmp_path / "runs"
    runs.mkdir()
    scale = {"prefill_first": 1.0, "balanced": 1.5, "mixed": 2.0}
    for policy in scale:
        for n in (1, 2):
            (runs / f"arrivals-{policy}-{n}.json").write_text(json.dumps(_arrivals_run(policy, n, scale[policy])))
    code, _, err = run_cli(["report", "--runs", runs, "--out", tmp_path / "report"], capsys)
    assert code == 0, err
    pics = json.loads((tmp_path / "report" / "manifest.json").read_text())["pictures"]
    side_by_side = [p for p in pics if p["title"].startswith("lab scheduling-under-arrivals")]
    assert len(side_by_side) == 1 and side_by_side[0]["drawn"] and "3 policies" in side_by_side[0]["title"]
    from labkit.report.plan import load_plan
    from labkit.report.results import gather
    from labkit.report.status import assign

    statuses = assign(load_plan(), gather(runs).results)
    lab = next(s for s in statuses if s.lab.id == "scheduling-under-arrivals")
    from labkit.report.render import load_policy

    fig = figures.policies_figure([(load_policy(r), r.data["metrics"]) for r in lab.results], "t")
    assert [a.get_title() for a in fig.axes] == ["short: TTFT p99 (ms)", "short: ITL p99 (ms)",
                                                 "long: TTFT p99 (ms)", "long: ITL p99 (ms)"]
    ax = fig.axes[2]
    assert [t.get_text().replace("\n", "") for t in ax.get_xticklabels()] == list(scale)
    dots = sorted(float(y) for c in ax.collections for y in c.get_offsets()[:, 1])
    assert dots == [300.0, 300.0, 450.0, 450.0, 600.0, 600.0]   # the long prompts' TTFT p99, two runs a policy
