"""How numbers and names are written at their edges: the bench's figures and file names and its notes
(labkit/bench/command.py), the report pictures' figures, request rows and merged bars (labkit/report/figures.py),
and the trace table's step line and output cells (labkit/trace/command.py)."""
from __future__ import annotations

import pytest

from labkit.bench.command import _f, _gib, build_result, default_name
from labkit.bench.workloads import parse_workload
from labkit.report import figures
from labkit.trace.command import _compact_cells, _step_line


def test_bench_figures_keep_decimals_below_a_thousand_only():
    assert _f(1000.0) == "1,000" and _f(12345.6) == "12,346"
    assert _f(999.5, 1) == "999.5" and _f(12) == "12" and _f(None) == "-"


def test_bench_memory_is_in_gibibytes():
    assert _gib(3 * 2**30) == "3.00 GiB" and _gib(None) == "-"


def test_bench_file_names_say_eager_or_graph_for_the_engine_only():
    w = parse_workload({"name": "x", "requests": 1, "prompt_len": 2, "output_len": 2})
    assert default_name(w, "engine", {"engine": {"enforce_eager": True}}) == "bench-x-engine-eager.json"
    assert default_name(w, "engine", {"engine": {"enforce_eager": False}}) == "bench-x-engine-graph.json"
    assert default_name(w, "hf", {}) == "bench-x-hf.json"


def _result(repeats: int) -> dict:
    w = parse_workload({"name": "x", "requests": 1, "prompt_len": 2, "output_len": 2, "repeats": repeats})
    env = {"model": {"config_sha256": "0" * 64}, "device": {"type": "cpu", "name": "cpu"},
           "evidence": "gpu-measured"}
    m = {"dtype": "bfloat16", "engine": {"enforce_eager": True}, "execution": "eager", "init_s": 1.0,
         "init_wall_s": 1.0, "graph_capture_s": None, "warmup_s": 0.0, "warmup_rounds": [], "runs": [],
         "median": {}, "kv_blocks": 1, "peak_memory": {}, "vocab_size": 10, "prompt_ids_folded": False}
    return build_result(env, w, "engine", m)


def test_the_prefix_cache_note_needs_a_second_identical_repeat():
    note = "every repeat runs identical prompts"
    assert not any(note in n for n in _result(1)["notes"])
    assert any(note in n for n in _result(2)["notes"])


# ----------------------------------------------------------------------------- report pictures


def test_picture_figures_switch_to_thousands_at_1000_and_keep_zero_plain():
    assert figures.figure(1000) == "1,000" and figures.figure(999.5) == "999.5"
    assert figures.figure(0) == "0" and figures.figure(0.0005) == "5.00e-04"


def test_a_timeline_draws_up_to_its_row_limit_and_says_how_many_more():
    rows = [f"R{i}" for i in range(figures.MAX_ROWS)]
    assert figures.shown_requests(rows) == (rows, "")
    more = rows + ["extra"]
    assert figures.shown_requests(more) == (rows, f" (first {figures.MAX_ROWS} of {figures.MAX_ROWS + 1} requests)")


def test_an_expected_step_without_a_phase_is_drawn_as_a_prefill():
    requests, cells = figures.expected_cells([{"step": 1, "scheduled": {"A": 5}},
                                              {"step": 2, "phase": "decode", "scheduled": {"A": {"scheduled": 1}}}],
                                             [])
    assert requests == ["A"] and cells == [("A", 1, "prefill", 5), ("A", 2, "decode", 1)]


def test_cells_of_consecutive_steps_merge_into_one_bar():
    # Bars 0.9 wide one step apart: steps 0, 1, 2 touch across their 0.1 gaps; step 5 stands alone.
    merged = figures._merged([(0, 0.9), (1, 0.9), (2, 0.9), (5, 0.9)])
    assert len(merged) == 2
    assert merged[0] == (0, pytest.approx(2.9)) and merged[1] == (5, 0.9)


# ----------------------------------------------------------------------------- the trace table


def _st(execution):
    return {"step": 3, "phase": "decode", "tokens": 2, "budget": 512, "execution": execution, "graph_batch": 4,
            "free_before": 5, "free_after": 4}


def test_a_step_line_names_a_cuda_graph_only_for_a_graph_step():
    assert "CUDA graph, batch 4" in _step_line(_st("graph"))
    assert "CUDA graph" not in _step_line(_st("eager")) and "CUDA graph" not in _step_line(_st(None))
    assert _step_line(_st("eager")) == "step 3 · decode · 2 of 512 tokens · free blocks 5 → 4"


def test_a_preempted_row_has_no_output_cell_and_a_discarded_one_says_dropped():
    base = {"id": "A", "kind": "prefill chunk", "new": 4, "cached_before": 0, "cached_after": 4, "total": 8,
            "outputs": 0, "token": 9, "status": "RUNNING", "blocks": 1}
    assert _compact_cells({**base, "accepted": False})[4] == "0 (dropped)"
    assert _compact_cells({**base, "accepted": True, "outputs": 1})[4] == "1 (+9)"
    preempted = {**base, "kind": "preempted", "cached_after": None, "outputs": None, "accepted": None}
    assert _compact_cells(preempted)[3:5] == ["-", "-"]
