"""What the offline bench computes from its measurements (labkit/bench/offline.py, labkit/bench/timing.py): the
rates of one repeat, the median over repeats, the peak memory per rank, the engine settings a workload asks, and
the per-step figures of a step-timed run, each checked against its definition."""
from __future__ import annotations

import statistics
import sys
import types

import pytest

from labkit.bench import offline
from labkit.bench.offline import engine_kwargs, maxrss_bytes, peak_memory_record, run_record, summarize
from labkit.bench.timing import StepTime, run_steps, step_stats
from labkit.bench.workloads import Draw, parse_workload
from labkit.engine_args import EngineArgs


def test_a_repeats_rates_are_tokens_over_its_wall_seconds():
    d = Draw(seed=3, prompts=[[1] * 10, [2] * 30], max_tokens=[5, 5])
    r = run_record(0, d, wall_s=2.0, output_tokens=8)
    assert r["prompt_tokens"] == 40 and r["output_tokens"] == 8 and r["requests"] == 2
    assert r["output_throughput"] == 8 / 2.0
    assert r["total_token_throughput"] == (40 + 8) / 2.0     # prompt tokens count in the total
    assert r["request_throughput"] == 2 / 2.0


def test_the_headline_is_the_median_repeat_not_the_mean():
    d = Draw(seed=0, prompts=[[1] * 4], max_tokens=[4])
    runs = [run_record(i, d, wall, 4) for i, wall in enumerate((1.0, 2.0, 10.0))]   # one slow outlier
    med = summarize(runs)
    assert med["wall_s"] == 2.0 and med["repeats"] == 3
    assert med["output_throughput"] == statistics.median([4 / 1.0, 4 / 2.0, 4 / 10.0]) == 2.0
    assert med["total_token_throughput"] == (4 + 4) / 2.0


def test_max_rss_is_reported_in_bytes_from_linux_kib(monkeypatch):
    if sys.platform == "darwin":
        pytest.skip("macOS reports bytes")
    monkeypatch.setattr(offline.resource, "getrusage", lambda who: types.SimpleNamespace(ru_maxrss=3))
    assert maxrss_bytes() == 3 * 1024      # ru_maxrss is KiB on Linux


def test_a_tensor_parallel_workers_peak_is_its_higher_of_whole_run_and_timed_part():
    overall = {"allocated": 500, "reserved": 600}
    timed = {"allocated": 400, "reserved": None}
    # Rank 1 peaked before the timed part (900) above what it reached during it (300).
    workers = [({"peak_bytes": 900, "peak_reserved_bytes": 950},
                {"peak_bytes": 300, "peak_reserved_bytes": 320, "device": "cuda:1", "source": "x"})]
    rec = peak_memory_record("cuda:0", overall, timed, tp=2, workers=workers)
    rank1 = rec["per_rank"][1]
    assert rank1["peak_bytes"] == 900 and rank1["peak_reserved_bytes"] == 950 and rank1["timed_peak_bytes"] == 300
    assert rec["max_bytes"] == 900


def test_a_worker_without_a_report_is_null_with_a_note_and_rank_0_names_its_device():
    overall, timed = {"allocated": 500, "reserved": 600}, {"allocated": 400, "reserved": 450}
    for workers in (None, []):   # no report at all, or none for rank 1
        rec = peak_memory_record("cuda", overall, timed, tp=2, workers=workers)
        rank0, rank1 = rec["per_rank"]
        assert rank0["device"] == "cuda:0" and rank0["peak_bytes"] == 500
        assert rank1 == {"rank": 1, "device": "cuda:1", "peak_bytes": None, "peak_reserved_bytes": None,
                         "timed_peak_bytes": None, "note": "worker process: not measurable from rank 0"}
        assert rec["max_bytes"] == 500   # the unmeasured rank is left out, not read as 0


def test_measure_engine_runs_without_a_stepper_and_marks_the_repeats_the_prefix_cache_can_serve(tiny_model):
    # A library call (no progress display). Repeats of one seed send the same prompts again, so from repeat 1
    # on the prefix cache can serve them; with vary_seed each repeat draws fresh prompts.
    for vary, possible in ((False, [False, True, True]), (True, [False, False, False])):
        w = parse_workload({"requests": 2, "prompt_len": 8, "output_len": 2, "repeats": 3, "vary_seed": vary,
                            "warmup": {"rounds": 0}})
        rec = offline.measure_engine(w, tiny_model, "cpu", EngineArgs())
        assert [r["prefix_cache_possible"] for r in rec["runs"]] == possible, vary
        assert rec["engine"]["num_kvcache_blocks"] == -1   # not asked: the engine sized its pool itself


def test_a_workloads_enforce_eager_is_kept_and_the_device_default_fills_the_gap():
    w = parse_workload({"requests": 1, "prompt_len": 4, "output_len": 2, "engine": {"enforce_eager": False}})
    assert engine_kwargs(w, EngineArgs(), "cpu")["enforce_eager"] is False   # asked: not overridden on the CPU
    bare = parse_workload({"requests": 1, "prompt_len": 4, "output_len": 2})
    assert engine_kwargs(bare, EngineArgs(), "cpu")["enforce_eager"] is True
    assert engine_kwargs(bare, EngineArgs(enforce_eager=False), "cpu")["enforce_eager"] is False


# ----------------------------------------------------------------------------- step timing


def _t(i, phase, batch, new, seconds):
    return StepTime(i, phase, batch, new, new, seconds)


def test_decode_ms_per_token_is_the_decode_seconds_in_ms_over_the_decode_tokens():
    times = [_t(1, "prefill", 4, 4, 0.5), _t(2, "decode", 4, 4, 0.02), _t(3, "decode", 2, 2, 0.01)]
    s = step_stats(times)
    assert s["steps"] == 3 and s["prefill_steps"] == 1 and s["decode_steps"] == 2
    assert s["decode_tokens"] == 6
    assert s["decode_ms_per_token"] == pytest.approx((0.02 + 0.01) * 1000 / 6)
    assert s["decode_ms_per_step_median"] == pytest.approx(15.0)


def test_the_largest_decode_batch_leaves_out_the_prefill_steps():
    times = [_t(1, "prefill", 8, 8, 0.5), _t(2, "decode", 3, 3, 0.01), _t(3, "decode", 2, 2, 0.01)]
    assert step_stats(times)["max_decode_batch"] == 3


def test_run_steps_numbers_the_steps_from_one_and_forgets_every_request():
    class FakeLLM:
        def __init__(self):
            self.left, self.forgotten, self.n = 2, [], 0

        def add_request(self, prompt, sp):
            self.n += 1
            return self.n

        def is_finished(self):
            return self.left == 0

        def step(self):
            self.left -= 1
            return types.SimpleNamespace(phase="decode", batch_size=2, num_computed_tokens=2, num_new_tokens=2)

        def abort(self, seq_id):
            return False

        def forget(self, seq_id):
            self.forgotten.append(seq_id)

    llm = FakeLLM()
    times = run_steps(llm, [[1], [2]], [None, None])
    assert [t.index for t in times] == [1, 2] and llm.forgotten == [1, 2]
