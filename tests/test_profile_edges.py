"""The profile summariser at its edges, on hand-made traces: nested host ranges that start together, kernels at a
step's end, per-kernel means, the window's token counts, the layer timeline's span and ties, the checks'
tolerance and the console summary. No profiler, no GPU."""
from __future__ import annotations

import pytest

from labkit.bench import profile as prof
from labkit.bench.timing import StepTime


def _x(name, cat, ts, dur, tid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def _k(name, ts, dur):
    return _x(name, "kernel", ts, dur, tid=20)


def test_profile_prompts_wrap_the_first_id_within_the_vocabulary():
    assert prof.profile_prompts([[99, 5, 6], [3]], vocab_size=100) == [[0, 5, 6], [4]]


def test_a_range_starting_with_its_step_gets_its_time():
    """engine::forward starts the same microsecond as its step (a clipped or immediate range): the inner, shorter
    range holds the time, not the step around it."""
    trace = {"traceEvents": [_x("labkit::step 1", "user_annotation", 0, 100),
                             _x("engine::forward", "user_annotation", 0, 60)]}
    t = prof.analyze(trace, [StepTime(1, "decode", 1, 1, 1, 1e-4)], cuda=False)
    host = {r["part"]: r["ms"] * 1000 for r in t["host"]}
    assert host["forward"] == pytest.approx(60) and host["step_rest"] == pytest.approx(40)


def _two_steps_trace(kernels):
    return {"traceEvents": [_x("labkit::step 1", "user_annotation", 0, 100),
                            _x("labkit::step 2", "user_annotation", 150, 50), *kernels]}


TWO_STEPS = [StepTime(1, "prefill", 2, 24, 2, 1e-4), StepTime(2, "decode", 4, 4, 4, 5e-5)]


def test_a_kernel_starting_as_its_step_ends_is_between_steps():
    t = prof.analyze(_two_steps_trace([_k("_prefill_kernel", 10, 20), _k("_small_gemm_kernel", 100, 10),
                                       _k("_decode_split_kernel", 160, 5)]), TWO_STEPS, cuda=True)
    assert t["kernels_by_phase"] == {"prefill": 1, "decode": 1, "between": 1}


def test_a_kernels_mean_is_its_time_over_its_calls():
    t = prof.analyze(_two_steps_trace([_k("_small_gemm_kernel", 10, 4), _k("_small_gemm_kernel", 20, 8),
                                       _k("_small_gemm_kernel", 160, 12)]), TWO_STEPS, cuda=True)
    (gemm,) = t["top_kernels"]
    assert gemm["calls"] == 3 and gemm["ms"] == pytest.approx(0.024) and gemm["mean_us"] == pytest.approx(8.0)


def test_window_counts_prompt_tokens_for_prefill_and_the_decode_batch_range():
    steps = [StepTime(1, "prefill", 2, 24, 2, 1e-4), StepTime(2, "decode", 2, 2, 2, 5e-5),
             StepTime(3, "decode", 4, 4, 4, 5e-5)]
    trace = {"traceEvents": [_x(f"labkit::step {i}", "user_annotation", 100 * (i - 1), 50) for i in (1, 2, 3)]}
    w = prof.analyze(trace, steps, cuda=False)["window"]
    assert (w["first_step"], w["last_step"], w["prefill_steps"], w["decode_steps"]) == (1, 3, 1, 2)
    assert w["prefill_tokens"] == 24 and w["decode_tokens"] == 6
    assert w["decode_batch"] == [2, 4]
    assert w["decode_ms_per_token"] == pytest.approx(0.1 / 6)


def test_a_layers_span_ends_with_its_last_ending_kernel():
    """Kernels that overlap (a short one started inside a long one): the layer spans to the end of the kernel that
    ends last, not of the one that starts last, and each gap is measured from the latest end so far."""
    layer = [("_rms_norm_kernel", 0, 2), ("_small_gemm_kernel", 3, 10), ("_silu_kernel", 4, 1),
             ("_split_k_reduce_kernel", 14, 10), ("_qk_norm_rope_kernel", 15, 1)]
    kernels = [_k(name, 10 + 30 * n + start, dur) for n in range(3) for name, start, dur in layer]
    trace = {"traceEvents": [_x("labkit::step 1", "user_annotation", 0, 100), *kernels]}
    t = prof.analyze(trace, [StepTime(1, "decode", 1, 1, 1, 1e-4)], cuda=True)
    lt = t["layer_timeline"]
    assert lt["found"] and (lt["period"], lt["repeats"], lt["first"]) == (5, 3, 0)
    assert lt["step_ms"] == pytest.approx(0.1) and lt["step_kernels"] == 15
    assert (lt["span_us"], lt["busy_us"], lt["gap_us"]) == pytest.approx((24, 22, 2))
    md = prof.markdown({**t, "workload": "x", "files": {"trace": "t.json"}, "tolerance": "1 us",
                        "kernel_families": [{"family": f, "pattern": p} for f, p in prof.KERNEL_FAMILIES]})
    assert "| 2 | 4.00 | 1.00 | -9.00 |" in md and "| 3 | 14.00 | 10.00 | 1.00 |" in md


def test_repeating_block_takes_the_smaller_period_on_a_tie():
    assert prof.repeating_block(list("abababab")) == (0, 2, 4)   # "abab" twice covers as much


def test_check_tolerance_is_the_larger_of_its_two_bounds():
    assert prof.tolerance_ms(0.0) == pytest.approx(0.001)        # 1 us
    assert prof.tolerance_ms(100_000.0) == pytest.approx(10.0)   # 0.01%


def test_summary_says_the_gpus_busy_and_idle_shares():
    t = prof.analyze(_two_steps_trace([_k("_prefill_kernel", 0, 50)]), TWO_STEPS, cuda=True)
    line = next(x for x in prof.summary_lines(t) if x.startswith("GPU:"))
    assert "busy 0.050 ms (25.0%)" in line and "idle 0.150 ms (75.0%)" in line
