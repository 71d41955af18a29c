"""`labkit bench --profile`, step-timed workloads (batch1) and --no-custom-kernels, on the tiny model (CPU);
the GPU half of the profile table on hand-made traces (kernels on two streams, copies, a sync)."""
import gzip
import json
import statistics
from pathlib import Path

import pytest

from labkit.bench import profile as prof
from labkit.bench.timing import StepTime
from labkit.bench.workloads import load_workload
from tests.test_bench import run_cli

# A small step-timed workload: 2 requests, so prefill and decode steps both happen in a few steps.
SMALL = """name: small
requests: 2
prompt_len: 12
output_len: 6
seed: 0
vary_seed: true
warmup: {rounds: 1, output_len: 2}
repeats: 2
timing: steps
engine: {max_model_len: 64, max_num_seqs: 2, kvcache_block_size: 16}
"""


@pytest.fixture
def small(tmp_path) -> Path:
    p = tmp_path / "small.yaml"
    p.write_text(SMALL)
    return p


@pytest.fixture
def runs(tmp_path, monkeypatch):
    out = tmp_path / "runs"
    monkeypatch.setenv("RUNS_DIR", str(out))
    return out


def _within(parts: float, whole: float) -> bool:
    return abs(parts - whole) <= prof.tolerance_ms(whole)


# ------------------------------------------------------------------------------ the CPU run, end to end

def test_profile_cpu_writes_trace_and_a_table_that_adds_up(tiny_model, small, runs, capsys):
    out = runs / "p.json"
    code, stdout, err = run_cli(["bench", "--workload", small, "--model", tiny_model, "--device", "cpu",
                                 "--profile", "--profile-steps", "4", "--profile-skip", "1", "--out", out], capsys)
    assert code == 0, err
    bench = json.loads(out.read_text())
    files = bench["files"]
    assert files["profile_json"] == str(out.with_suffix(".profile.json"))
    trace_path = Path(files["profile_trace"])
    opener = gzip.open if trace_path.suffix == ".gz" else open
    with opener(trace_path, "rt") as f:
        trace = json.load(f)  # valid JSON
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"labkit::step 2", "labkit::step 5", "engine::schedule", "engine::forward", "engine::sample"} <= names
    assert "labkit::step 1" not in names and "labkit::step 6" not in names  # the window only

    table = json.loads(Path(files["profile_json"]).read_text())
    win = table["window"]
    assert (win["first_step"], win["last_step"], win["steps"]) == (2, 5, 4)
    assert win["prefill_steps"] + win["decode_steps"] == 4 and win["decode_ms_per_token"] > 0
    wall = table["wall_ms"]
    assert wall > 0
    host = {r["part"]: r for r in table["host"]}
    assert list(host) == [k for k, _, _ in prof.HOST_ROWS]
    assert _within(sum(r["ms"] for r in table["host"]), wall)
    for part in ("scheduling", "input_prep", "forward", "sampling", "postprocess", "between"):
        assert host[part]["ms"] > 0, part
    for r in table["host"]:
        assert _within(sum(r["by_phase_ms"].values()), r["ms"])
    assert host["between"]["by_phase_ms"]["between"] == pytest.approx(host["between"]["ms"])
    assert all(c["ok"] for c in table["checks"]) and len(table["checks"]) == 1
    assert table["gpu"] is None and "n/a" in table["gpu_note"]
    md = Path(files["profile_md"]).read_text()
    assert "| scheduling |" in md and "engine::schedule" in md and "n/a" in md
    assert "profile: host phase" in stdout and str(trace_path) in stdout.replace("\n", "")
    # The bench half is unchanged by the profiled run: its repeats, and decode ms/token from step timing.
    assert len(bench["runs"]) == 2 and bench["profile"]["window"]["steps"] == 4


def test_profile_window_past_the_run_exits_2(tiny_model, small, runs, capsys):
    code, _, err = run_cli(["bench", "--workload", small, "--model", tiny_model, "--device", "cpu", "--repeats", "1",
                            "--warmup", "0", "--profile", "--profile-skip", "50"], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[-1].startswith("labkit: --profile-skip") and "lower --profile-skip" in lines[-1]


@pytest.mark.parametrize("args, needle", [
    (["--profile", "--profile-steps", "0"], "--profile-steps"),
    (["--profile-steps", "3"], "only with --profile"),
    (["--profile-skip", "2"], "only with --profile"),
    (["--profile", "--profile-skip", "-1"], "--profile-skip"),
    (["--backend", "hf", "--profile"], "--profile"),
    (["--backend", "hf", "--workload", "batch1"], "timing steps"),
    (["--backend", "hf", "--no-custom-kernels"], "--no-custom-kernels"),
])
def test_bad_profile_flags_exit_2_with_one_line(runs, capsys, args, needle):
    code, _, err = run_cli(["bench", *args], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("labkit: ") and needle in lines[0]
    assert not runs.exists()


# ------------------------------------------------------------------------------ step timing, custom kernels

def test_step_timed_runs_report_decode_ms_per_token_and_compare(tiny_model, small, runs, capsys):
    a, b = runs / "a.json", runs / "b.json"
    for path, flag in ((a, "--custom-kernels"), (b, "--no-custom-kernels")):
        code, _, err = run_cli(["bench", "--workload", small, "--model", tiny_model, "--device", "cpu", flag,
                                "--out", path], capsys)
        assert code == 0, err
    data = json.loads(b.read_text())
    assert data["config"]["workload"]["timing"] == "steps" and data["config"]["engine"]["custom_kernels"] is False
    for r in data["runs"]:
        # 2 requests x 6 tokens: the first token of each comes from its prefill step, 5 more from decode steps.
        assert r["output_tokens"] == 12 and r["decode_tokens"] == 10 and r["decode_steps"] == 5
        assert r["decode_ms_per_token"] == pytest.approx(r["decode_s"] * 1000 / r["decode_tokens"])
        assert r["steps"] == r["prefill_steps"] + r["decode_steps"] and r["max_decode_batch"] == 2
    assert data["median"]["decode_ms_per_token"] == pytest.approx(
        statistics.median(r["decode_ms_per_token"] for r in data["runs"]))
    assert "decode ms/token" in b.with_suffix(".md").read_text()
    code, out, err = run_cli(["bench", "compare", a, b, "--variable", "custom_kernels",
                              "--out", runs / "cmp.json"], capsys)
    assert code == 0, err
    cmp = json.loads((runs / "cmp.json").read_text())
    assert cmp["differing"] == ["engine.custom_kernels"]
    assert cmp["metrics"]["decode_ms_per_token"]["a"]["n"] == 2


def test_batch1_workload_is_one_sequence_timed_by_steps():
    w = load_workload("batch1")
    assert (w.requests, w.timing, w.engine["max_num_seqs"]) == (1, "steps", 1)
    assert w.prompt_len.lo == 128 and w.output_len.lo == 257 and w.repeats >= 3
    assert w.params()["timing"] == "steps"
    assert "timing" not in load_workload("nano").params()  # generate-timed runs keep their recorded config


# ------------------------------------------------------------------------------ the GPU half, on made-up traces

def _x(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _gpu_trace():
    """Two steps (a prefill 0-100 us, a decode 110-160 us) with engine ranges, a sync, and kernels on two
    streams (tid 20, 21) that overlap for 10 us; a copy each way (only the one to the host is a wait); one
    kernel nobody knows."""
    host = [
        _x("labkit::step 3", "user_annotation", 0, 100),
        _x("engine::schedule", "user_annotation", 2, 8),
        _x("engine::prepare", "user_annotation", 10, 5),
        _x("engine::forward", "user_annotation", 15, 40),
        _x("engine::upload", "user_annotation", 16, 4),
        _x("cudaMemcpyAsync", "cuda_runtime", 17, 2, correlation=11),        # to the device: not a wait
        _x("engine::sample", "user_annotation", 55, 40),
        _x("cudaMemcpyAsync", "cuda_runtime", 60, 28, correlation=12),       # to pageable host memory: a wait
        _x("cudaStreamSynchronize", "cuda_runtime", 88, 2),
        _x("engine::postprocess", "user_annotation", 95, 3),
        _x("labkit::step 4", "user_annotation", 110, 50),
        _x("engine::forward", "user_annotation", 115, 20),
        _x("ProfilerStep#1", "user_annotation", 0, 110),            # ignored: not a labkit/engine range
        _x("labkit::step 4", "gpu_user_annotation", 110, 50, tid=20),  # ignored: the GPU-side mirror
        _x("some other thread", "user_annotation", 0, 160, tid=2),
    ]
    gpu = [
        _x("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 20, 5, tid=20, correlation=11),
        _x("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 85, 1, tid=20, correlation=12),
        _x("_prefill_kernel", "kernel", 25, 20, tid=20),
        _x("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "kernel", 45, 20, tid=20),
        _x("triton_red_fused_add_mean_mul_pow_rsqrt_0", "kernel", 55, 20, tid=21),   # overlaps 55-65
        _x("_gumbel_chunk_kernel", "kernel", 75, 10, tid=20),
        _x("_decode_split_kernel", "kernel", 120, 15, tid=20),
        _x("mystery_kernel_v2", "kernel", 140, 5, tid=20),
        _x("_decode_merge_kernel", "kernel", 155, 10, tid=20),                       # clipped at 160
    ]
    return {"traceEvents": host + gpu}


STEPS = [StepTime(3, "prefill", 2, 24, 2, 1e-4), StepTime(4, "decode", 2, 2, 2, 5e-5)]


def test_gpu_partition_on_a_made_up_trace():
    t = prof.analyze(_gpu_trace(), STEPS, cuda=True)
    assert t["wall_ms"] == pytest.approx(0.160)
    gpu = {r["part"]: r["ms"] * 1000 for r in t["gpu"]}  # in us
    assert gpu["copy_memset"] == pytest.approx(5 + 1)
    assert gpu["attention_prefill"] == pytest.approx(20)
    assert gpu["gemm"] == pytest.approx(10 + 5)            # 45-55 alone, 55-65 shared with the norm kernel
    assert gpu["norm_rope_act"] == pytest.approx(5 + 10)
    assert gpu["sampler"] == pytest.approx(10)
    assert gpu["attention_decode"] == pytest.approx(15 + 5)
    assert gpu["other"] == pytest.approx(5)
    busy = 5 + 20 + 20 + 10 + 10 + 1 + 15 + 5 + 5          # the union of the intervals
    assert gpu["idle"] == pytest.approx(160 - busy)
    assert t["gpu_busy_ms"] * 1000 == pytest.approx(busy)
    assert all(c["ok"] for c in t["checks"]) and len(t["checks"]) == 3
    by_phase = {r["part"]: r["by_phase_ms"] for r in t["gpu"]}
    assert by_phase["idle"]["between"] * 1000 == pytest.approx(10)   # 100-110: no step, no kernel
    assert by_phase["attention_decode"]["decode"] * 1000 == pytest.approx(20)
    idle = {r["part"]: r["ms"] * 1000 for r in t["gpu_idle_by_host"]}
    assert idle["scheduling"] == pytest.approx(8) and idle["between"] == pytest.approx(10)
    assert idle["gpu_wait"] == pytest.approx(4)                       # 86-90 waiting, no kernel left
    assert [k["name"] for k in t["unclassified"]] == ["mystery_kernel_v2"]
    merge = next(k for k in t["top_kernels"] if k["name"] == "_decode_merge_kernel")
    assert merge["ms"] * 1000 == pytest.approx(5) and merge["calls"] == 1   # the part inside the window
    assert t["top_kernels"][0]["name"] in ("_prefill_kernel", "nvjet_tst_64x8_64x16_4x1_v_bz_TNT",
                                           "triton_red_fused_add_mean_mul_pow_rsqrt_0")


def test_host_partition_on_a_made_up_trace():
    t = prof.analyze(_gpu_trace(), STEPS, cuda=True)
    host = {r["part"]: r["ms"] * 1000 for r in t["host"]}
    assert host["scheduling"] == pytest.approx(8)
    assert host["input_prep"] == pytest.approx(5 + 4)       # prepare, and upload nested in forward
    assert host["forward"] == pytest.approx(36 + 20)
    assert host["sampling"] == pytest.approx(40 - 30)
    assert host["gpu_wait"] == pytest.approx(28 + 2)        # the copy to the host, then the sync
    assert host["postprocess"] == pytest.approx(3)
    assert host["between"] == pytest.approx(10)
    assert host["step_rest"] == pytest.approx(100 - 8 - 5 - 40 - 40 - 3 + 50 - 20)
    assert sum(host.values()) == pytest.approx(160)
    md = prof.markdown({**t, "workload": "x", "files": {"trace": "t.json"}, "tolerance": "1 us",
                        "kernel_families": [{"family": f, "pattern": p} for f, p in prof.KERNEL_FAMILIES]})
    assert "mystery_kernel_v2" in md and "| attention, decode |" in md


@pytest.mark.parametrize("name, family", [
    ("_decode_split_kernel", "attention_decode"),
    ("void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t>>",
     "attention_decode"),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>",
     "attention_prefill"),
    ("_prefill_kernel", "attention_prefill"),
    ("_store_kv_kernel", "kv_write"),
    ("_small_gemm_kernel", "gemm"),
    ("_split_k_reduce_kernel", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>", "gemm"),
    ("void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4, false>", "gemm"),
    ("_qk_norm_rope_kernel", "norm_rope_act"),
    ("triton_poi_fused_cat_index_mul_neg_slice_0", "norm_rope_act"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1", "norm_rope_act"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", "norm_rope_act"),
    ("_gumbel_chunk_kernel", "sampler"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>", "sampler"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>", "sampler"),
    ("void at::native::elementwise_kernel<128, 2, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>",
     "copy_memset"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>", "copy_memset"),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>",
     "other"),
])
def test_kernel_families_by_name(name, family):
    assert prof.classify_kernel(name) == family


# Each Triton kernel the engine defines, and its family: a new kernel must be placed here (the test below fails
# until it is), or a profile would count it as "other" or, by a loose pattern, in the wrong row. Session 27 found
# the fused decode step's attention (its name holds "attention") counted as prefill attention in decode steps.
ENGINE_KERNELS = {
    "_decode_split_kernel": "attention_decode", "_decode_merge_kernel": "attention_decode",
    "_qkv_attention_kernel": "attention_decode", "_prefill_kernel": "attention_prefill",
    "_gemv_kernel": "gemm", "_smem_gemv_kernel": "gemm", "_small_gemm_kernel": "gemm",
    "_split_k_reduce_kernel": "gemm",
    "_partials_norm_kernel": "norm_rope_act", "_qk_norm_rope_kernel": "norm_rope_act",
    "_rms_norm_kernel": "norm_rope_act", "_silu_and_mul_kernel": "norm_rope_act",
    "_store_kv_kernel": "kv_write", "_gumbel_chunk_kernel": "sampler", "_pick_chunk_kernel": "sampler",
}


def test_every_engine_kernel_is_counted_in_its_own_family():
    import re
    engine = Path(__file__).resolve().parent.parent / "engine"
    defined = {name for f in engine.rglob("*.py") for name in re.findall(r"^def (_\w+_kernel)\(", f.read_text(), re.M)}
    assert defined == set(ENGINE_KERNELS), "a kernel added or removed: place it in ENGINE_KERNELS"
    assert {name: prof.classify_kernel(name) for name in defined} == ENGINE_KERNELS


def test_memcpy_and_memset_activities_are_copies():
    assert prof.classify_kernel("Memset (Device)", "gpu_memset") == "copy_memset"
    assert prof.classify_kernel("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy") == "copy_memset"


def test_a_trace_without_steps_is_refused():
    with pytest.raises(prof.LabkitError, match="labkit::step"):
        prof.analyze({"traceEvents": [_x("engine::forward", "user_annotation", 0, 5)]}, STEPS, cuda=False)
    with pytest.raises(prof.LabkitError, match="traceEvents"):
        prof.analyze({"nope": []}, STEPS, cuda=False)


# ------------------------------------------------------------------------------ the engine's ranges

def test_engine_ranges_cost_no_record_function_without_a_profiler(monkeypatch):
    import torch
    from torch.profiler import ProfilerActivity, profile

    from engine import profiling

    calls = []
    real = profiling.record_function
    monkeypatch.setattr(profiling, "record_function", lambda name: calls.append(name) or real(name))

    @profiling.phase("engine::test")
    def work(x):
        return x + 1

    assert work(1) == 2 and calls == []
    with profile(activities=[ProfilerActivity.CPU]) as p:
        assert work(torch.ones(1)).item() == 2
    assert calls == ["engine::test"]
    assert any(e.name == "engine::test" for e in p.events())


def test_large_traces_are_gzipped_and_the_table_is_written(tmp_path, monkeypatch):
    src = tmp_path / "work" / "trace.json"
    src.parent.mkdir()
    src.write_text(json.dumps(_gpu_trace()))
    out = tmp_path / "bench.json"
    out.with_suffix(".trace.json").write_text("stale")  # an earlier run's plain trace must not stay beside it
    monkeypatch.setattr(prof, "GZIP_OVER_BYTES", 0)
    run = prof.ProfiledRun(src, STEPS, prof.ProfileRequest(2, 2), ["cpu", "cuda"])
    table = prof.finish_profile(run, out, {"workload": "made-up"})
    trace = Path(table["files"]["trace"])
    assert trace.name == "bench.trace.json.gz" and not out.with_suffix(".trace.json").exists()
    assert prof.load_trace(trace) == _gpu_trace()
    assert not src.parent.exists()  # the temporary copy is gone
    on_disk = json.loads(out.with_suffix(".profile.json").read_text())
    assert on_disk["workload"] == "made-up" and on_disk["gpu"] is not None and all(c["ok"] for c in on_disk["checks"])
    assert out.with_suffix(".profile.md").read_text().startswith("# labkit bench --profile: made-up")


# ------------------------------------------------------------------------------ kernels a token, one layer in time

LAYER = ["_add_rms_norm_kernel", "_small_gemm_kernel", "_qk_norm_rope_kernel", "_store_kv_kernel",
         "_decode_split_kernel", "_decode_merge_kernel", "_small_gemm_kernel", "_add_rms_norm_kernel",
         "_small_gemm_kernel", "_silu_and_mul_kernel", "_small_gemm_kernel"]


def _decode_trace(steps: int = 3, layers: int = 4, gap: float = 1.0, kernel: float = 2.0, layer: list | None = None,
                  batch: int = 1):
    """`steps` batch-1 decode steps of 200 us each; in each, an embedding kernel, `layers` layers of LAYER (the
    first starting with a plain RMSNorm, as layer 0 does), the final norm, the LM head and the sampler; every
    kernel `kernel` us long, `gap` us after the previous one; `batch` rows a step (a token each)."""
    layer = layer or LAYER
    events, window = [], []
    for n in range(steps):
        t0 = 1000.0 * n
        events.append(_x(f"labkit::step {n + 2}", "user_annotation", t0, 200))
        names = (["embedding_kernel"] + ["_rms_norm_kernel"] + layer[1:] + layer * (layers - 1)
                 + ["_rms_norm_kernel", "_small_gemm_kernel", "_gumbel_chunk_kernel"])
        t = t0 + 5
        for name in names:
            events.append(_x(name, "kernel", t, kernel, tid=20))
            t += kernel + gap
        window.append(StepTime(n + 2, "decode", batch, batch, batch, 2e-4))
    return {"traceEvents": events}, window


def test_repeating_block_finds_the_period_and_where_it_starts():
    assert prof.repeating_block(list("xabcabcabcy")) == (1, 3, 3)
    assert prof.repeating_block(list("abcd")) is None
    names = ["E", "N"] + LAYER[1:] + LAYER * 3 + ["N", "G", "S"]
    start, period, repeats = prof.repeating_block(names)
    assert period == len(LAYER) and repeats == 3 and start == 2  # layer 0's plain norm is not part of it
    # Four copies of one kernel in a row repeat more often than a layer does, but cover less of the step.
    assert prof.repeating_block(["copy"] * 4 + LAYER * 3) == (4, len(LAYER), 3)


def test_kernels_per_token_idle_share_and_one_layer_in_time():
    trace, window = _decode_trace(steps=3, layers=4, gap=1.0, kernel=2.0)
    t = prof.analyze(trace, window, cuda=True, layers=4)
    per_step = 1 + 4 * len(LAYER) + 3
    assert t["kernels_by_phase"] == {"prefill": 0, "decode": 3 * per_step, "between": 0}
    assert t["kernels_per_decode_token"] == pytest.approx(per_step)    # batch 1: a token a step
    assert t["kernels_per_decode_step"] == pytest.approx(per_step)
    busy = per_step * 2.0
    assert t["decode_gpu_idle_pct"] == pytest.approx(100 * (200 - busy) / 200)
    lt = t["layer_timeline"]
    assert lt["found"] and lt["period"] == len(LAYER) and lt["repeats"] == 3 and lt["model_layers"] == 4
    assert [k["name"] for k in lt["kernels"]] == LAYER[1:] + LAYER[:1]  # rotated: the repetition starts at the GEMM
    assert [k["start_us"] for k in lt["kernels"]] == pytest.approx([3.0 * i for i in range(len(LAYER))])
    assert lt["busy_us"] == pytest.approx(2.0 * len(LAYER)) and lt["gap_us"] == pytest.approx(len(LAYER) - 1)
    assert lt["kernels"][3]["family"] == "attention_decode"
    lines = prof.summary_lines(t)
    assert any(f"{per_step:,.1f} kernels per token" in line for line in lines)
    md = prof.markdown({**t, "workload": "x", "files": {"trace": "t.json"}, "tolerance": "1 us",
                        "kernel_families": [{"family": f, "pattern": p} for f, p in prof.KERNEL_FAMILIES]})
    assert "## One decoder layer in time" in md and "| 1 | 3.00 | 2.00 | 1.00 |" in md



def test_a_decode_step_of_several_rows_shares_its_kernels_among_their_tokens():
    """Kernels per token divide a step's kernels by the tokens it decoded (4 rows: a quarter of a step's), kernels
    per step by the steps."""
    t = prof.analyze(*_decode_trace(steps=2, layers=2, batch=4), cuda=True, layers=2)
    per_step = 1 + 2 * len(LAYER) + 3
    assert t["kernels_per_decode_step"] == pytest.approx(per_step)
    assert t["kernels_per_decode_token"] == pytest.approx(per_step / 4)


def test_overlapping_kernels_count_once_in_a_layers_busy_time():
    """Under PDL a kernel starts before its predecessor ends: the layer's busy time is the union of the kernels'
    spans (overlaps counted once), its gaps what the union leaves of the span."""
    assert prof._union([(0.0, 4.0), (3.0, 6.0), (5.0, 7.0), (9.0, 10.0)]) == pytest.approx(8.0)
    assert prof._union([(0.0, 10.0), (2.0, 3.0)]) == pytest.approx(10.0)   # one inside another
    lt = prof.analyze(*_decode_trace(steps=1, layers=3, gap=-0.5, kernel=2.0), cuda=True)["layer_timeline"]
    n = len(LAYER)
    assert lt["found"] and lt["period"] == n
    assert lt["busy_us"] == pytest.approx(1.5 * (n - 1) + 2.0) and lt["gap_us"] == pytest.approx(0.0)

def test_fused_kernels_show_as_fewer_kernels_and_smaller_gaps():
    """What the batch1-kernels lab compares: the same layer in fewer, back-to-back kernels."""
    before = prof.analyze(*_decode_trace(gap=3.0), cuda=True)
    fused = ["_add_rms_norm_kernel", "_fused_norm_qkv_kernel", "_fused_qk_rope_store_kernel", "_decode_split_kernel",
             "_fused_oproj_add_norm_kernel", "_fused_gate_up_silu_kernel", "_fused_down_add_kernel"]
    after = prof.analyze(*_decode_trace(gap=0.5, layer=fused), cuda=True)
    assert after["kernels_per_decode_token"] < before["kernels_per_decode_token"]
    assert after["layer_timeline"]["period"] == 7 and before["layer_timeline"]["period"] == 11
    assert after["layer_timeline"]["gap_us"] < before["layer_timeline"]["gap_us"]


def test_cpu_profile_has_no_layer_timeline(tiny_model, small, runs, capsys):
    out = runs / "cpu.json"
    code, _, err = run_cli(["bench", "--workload", small, "--model", tiny_model, "--device", "cpu", "--repeats", "1",
                            "--warmup", "0", "--profile", "--profile-steps", "3", "--out", out], capsys)
    assert code == 0, err
    p = json.loads(out.read_text())["profile"]
    assert p["layer_timeline"] is None and p["kernels_per_decode_token"] is None
    assert "no CUDA activity" in p["gpu_note"]
