"""`labkit bench compare`: config checks, each side's spread, the seeded bootstrap interval of the ratio of
medians ("within noise" when it holds 1.0), the single-repeat refusal, and the same for `bench load` results
(their completed requests are the samples). Synthetic results only: no model, no timing."""
import copy
import json

import pytest

from labkit.bench import compare as cmp
from labkit.errors import LabkitError

from .helpers import run_cli


@pytest.fixture
def runs(tmp_path, monkeypatch):
    out = tmp_path / "runs"
    monkeypatch.setenv("RUNS_DIR", str(out))
    return out


def _synthetic(tok_s: float | list[float], **engine) -> dict:
    """An offline bench result; tok_s: each repeat's output tok/s (one number: three repeats within 1%)."""
    per = tok_s if isinstance(tok_s, list) else [tok_s * 0.99, tok_s, tok_s * 1.01]
    eng = {"enforce_eager": True, "attention_backend": "triton", "tensor_parallel_size": 1, "max_num_seqs": 512,
           "max_num_batched_tokens": 16384, "kvcache_block_size": 256, "scheduling_policy": "prefill_first"}
    eng.update(engine)
    tokens = 1000
    runs = [{"repeat": i, "output_tokens": tokens, "wall_s": tokens / v, "output_throughput": v,
             "total_token_throughput": 2 * v, "request_throughput": v / 100} for i, v in enumerate(per)]
    med = sorted(per)[len(per) // 2] if len(per) % 2 else sum(sorted(per)[len(per) // 2 - 1:len(per) // 2 + 1]) / 2
    return {
        "command": "bench", "evidence": "gpu-measured", "device": {"type": "cuda", "name": "NVIDIA H200"},
        "model": {"path": "/m", "config_sha256": "abc"}, "execution": "eager" if eng["enforce_eager"] else "graph",
        "config": {"backend": "engine", "workload": {"name": "nano", "requests": 256, "seed": 0},
                   "model_config_sha256": "abc", "device": {"type": "cuda", "name": "NVIDIA H200"},
                   "dtype": "bfloat16", "engine": eng, "hf": None},
        "median": {"output_throughput": med, "total_token_throughput": 2 * med, "request_throughput": med / 100,
                   "wall_s": tokens / med},
        "runs": runs,
        "init_s": 10.0, "warmup_s": 1.0, "graph_capture_s": None, "kv_blocks": 1000,
        "peak_memory": {"max_bytes": 2 ** 30},
    }


def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return str(p)


def test_separated_repeats_give_a_ratio_with_its_interval(tmp_path, runs, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # a log (xdist's workers set 80): each spread on one line
    a = _write(tmp_path, "a.json", _synthetic([100.0, 101.0, 102.0]))
    b = _write(tmp_path, "b.json", _synthetic([150.0, 151.0, 152.0], enforce_eager=False))
    code, out, err = run_cli(["bench", "compare", a, b, "--variable", "eager"], capsys)
    assert code == 0, err
    res = json.loads((runs / "bench-compare-eager.json").read_text())
    assert res["command"] == "bench compare" and res["evidence"] == "gpu-measured"
    assert res["ratio"] == pytest.approx(151 / 101) and res["within_noise"] is False
    lo, hi = res["interval"]
    assert 150 / 102 <= lo < res["ratio"] < hi <= 152 / 100
    m = res["metrics"]["output_throughput"]
    assert (m["a"]["min"], m["a"]["median"], m["a"]["max"], m["a"]["n"]) == (100.0, 101.0, 102.0, 3)
    assert res["metrics"]["wall_s"]["ratio"] == pytest.approx(101 / 151)
    assert not res["metrics"]["wall_s"]["within_noise"]
    assert res["single_measurements"]["graph_capture_s"]["ratio"] is None
    assert res["differing"] == ["engine.enforce_eager"]
    assert res["a"]["config"]["engine"]["enforce_eager"] is True
    assert res["bootstrap"]["seed"] == 0 and res["bootstrap"]["resamples"] == cmp.BOOTSTRAP_RESAMPLES
    flat = " ".join(out.split())
    assert "B/A median output tok/s: 1.495x (95% interval" in flat and "within noise" not in flat
    assert "100.000 / 101.000 / 102.000 (n 3)" in flat  # A's spread
    md = (runs / "bench-compare-eager.md").read_text()
    assert "**B/A median output tok/s: 1.495x (95% interval" in md


def test_overlapping_repeats_are_within_noise_and_no_ratio_is_the_result(tmp_path, runs, capsys):
    # The issue's pair: walls [3.20, 2.63, 1.52] s and [6.38, 4.43, 0.54] s for the same 1000 tokens.
    a = _synthetic([1000 / w for w in (3.20, 2.63, 1.52)])
    b = _synthetic([1000 / w for w in (6.38, 4.43, 0.54)])
    res = cmp.compare(a, b, "code")
    lo, hi = res["interval"]
    assert res["within_noise"] is True and lo < 1.0 < hi
    assert res["ratio"] == pytest.approx(2.63 / 4.43)  # kept in the JSON, never said as the result
    assert res["headline"].startswith("B/A median output tok/s: within noise (95% interval of the ratio")
    assert "0.594" not in res["headline"] and "0.595" not in res["headline"]
    p_a, p_b = _write(tmp_path, "a.json", a), _write(tmp_path, "b.json", b)
    code, out, _ = run_cli(["bench", "compare", p_a, p_b, "--variable", "code"], capsys)
    flat = " ".join(out.split())
    assert code == 0 and "B/A median output tok/s: within noise" in flat
    assert "0.594x" not in flat and "0.595x" not in flat


def test_a_single_repeat_is_refused_unless_allowed(tmp_path, runs, capsys):
    one = _synthetic([8000.0])
    three = _synthetic(12000.0, enforce_eager=False)
    a, b = _write(tmp_path, "a.json", one), _write(tmp_path, "b.json", three)
    code, _, err = run_cli(["bench", "compare", a, b, "--variable", "eager"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "has 1 repeat" in lines[0] and "--allow-single" in lines[0]
    assert not (runs / "bench-compare-eager.json").exists()
    code, out, err = run_cli(["bench", "compare", a, b, "--variable", "eager", "--allow-single"], capsys)
    assert code == 0, err
    res = json.loads((runs / "bench-compare-eager.json").read_text())
    assert res["single_sample"] and res["interval"] is None and res["within_noise"] is None
    assert "1.500x with no interval" in res["headline"] and "no interval" in " ".join(out.split())


def test_compare_refuses_two_differing_fields_and_unknown_variables(tmp_path, runs, capsys):
    a = _write(tmp_path, "a.json", _synthetic(8000.0))
    b = _write(tmp_path, "b.json", _synthetic(12000.0, enforce_eager=False, max_num_seqs=256))
    code, _, err = run_cli(["bench", "compare", a, b, "--variable", "eager"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "engine.max_num_seqs" in lines[0] and "eager" in lines[0]
    code, _, err = run_cli(["bench", "compare", a, a, "--variable", "nonsense"], capsys)
    assert code == 2 and "nonsense" in err and len(err.strip().splitlines()) == 1
    not_bench = _write(tmp_path, "x.json", {"command": "smoke"})
    code, _, err = run_cli(["bench", "compare", a, not_bench, "--variable", "eager"], capsys)
    assert code == 2 and "not a `labkit bench` or `labkit bench load` result" in err
    assert not (runs / "bench-compare-eager.json").exists()


def test_compare_variable_mapping():
    a = _synthetic(100.0)
    tp = _synthetic(150.0, tensor_parallel_size=2)
    assert cmp.compare(a, tp, "tp")["ratio"] == pytest.approx(1.5)
    assert cmp.compare(a, tp, "engine.tensor_parallel_size")["differing"] == ["engine.tensor_parallel_size"]
    with pytest.raises(LabkitError, match="tensor_parallel_size"):
        cmp.compare(a, tp, "attention")
    hf = copy.deepcopy(a)
    hf["config"].update(backend="hf", engine=None, hf={"batch": 64, "attn_implementation": "sdpa"})
    res = cmp.compare(a, hf, "backend")
    assert "backend" in res["differing"] and res["ratio"] == pytest.approx(1.0) and res["within_noise"]
    same = cmp.compare(a, _synthetic(110.0), "code")
    assert same["same_value"] and same["ratio"] == pytest.approx(1.1)
    other_model = copy.deepcopy(a)
    other_model["config"]["model_config_sha256"] = "def"
    with pytest.raises(LabkitError, match="model_config_sha256"):
        cmp.compare(a, other_model, "eager")


def test_runs_with_different_engine_knobs_compare_only_on_the_knobs():
    """A knob set on one side is a difference like any engine setting: refused under another --variable, the
    comparison under --variable knobs; results written before knobs were recorded read as none set."""
    a, b = _synthetic(100.0), _synthetic(103.0)
    a["knobs"], b["knobs"] = {}, {"LABKIT_GUMBEL_NOISE": "philox"}
    with pytest.raises(LabkitError, match="knobs.LABKIT_GUMBEL_NOISE"):
        cmp.compare(a, b, "code")
    res = cmp.compare(a, b, "knobs")
    assert res["differing"] == ["knobs.LABKIT_GUMBEL_NOISE"] and res["ratio"] == pytest.approx(1.03)
    old = _synthetic(100.0)  # no "knobs" key at all
    assert cmp.compare(old, a, "code")["same_value"]


def test_compare_allows_different_repeats_and_warmup_and_lists_them():
    a = _synthetic(700.0)
    a["config"]["workload"] = {"name": "nano", "repeats": 3, "warmup": {"rounds": 1, "requests": 8}}
    b = _synthetic(21000.0)
    b["config"]["workload"] = {"name": "nano", "repeats": 5, "warmup": {"rounds": 2, "requests": 8}}
    res = cmp.compare(a, b, "code")
    assert res["ratio"] == pytest.approx(30.0)
    assert res["measurement_differs"] == {"workload.repeats": {"a": 3, "b": 5},
                                          "workload.warmup.rounds": {"a": 1, "b": 2}}
    b["config"]["workload"]["name"] = "fixed"  # what is measured differs: still refused
    with pytest.raises(LabkitError, match="workload.name"):
        cmp.compare(a, b, "code")


# ------------------------------------------------------------------------------ load results

def _load_result(tmp_path, name: str, e2el: list[float], failed: int = 1, **server) -> str:
    """A `bench load` JSON and its .requests.jsonl: one completed request per e2el value (ms), then `failed`
    failed requests (not samples)."""
    path = tmp_path / f"{name}.json"
    requests = path.with_suffix(".requests.jsonl")
    records = [{"id": f"r{i}", "output_tokens": 8, "ttft_ms": v / 4, "tpot_ms": v / 10, "e2el_ms": v, "itl_ms": [],
                "error": None} for i, v in enumerate(e2el)]
    records += [{"id": f"failed{i}", "output_tokens": 0, "ttft_ms": None, "tpot_ms": None, "e2el_ms": None,
                 "error": "HTTP 503"} for i in range(failed)]
    requests.write_text("".join(json.dumps(r) + "\n" for r in records))
    data = {"command": "bench load", "evidence": "cpu-executed", "device": {"type": "cpu", "name": None},
            "model": {"config_sha256": "abc"},
            "config": {"source": {"workload": {"name": "fixed"}, "rate": 4.0, "seed": 0}, "requests": len(records),
                       "max_concurrency": None, "server": {"started": True, "--device": "cpu", **server}},
            "metrics": {"requests": len(records), "completed": len(e2el), "failed": failed, "duration_s": 10.0,
                        "output_throughput": 8 * len(e2el) / 10.0, "request_throughput": len(e2el) / 10.0},
            "files": {"requests": str(tmp_path / "elsewhere" / requests.name)}}  # moved: found next to the JSON
    path.write_text(json.dumps(data))
    return str(path)


def test_load_results_written_with_the_old_flag_names_compare_with_new_ones(tmp_path):
    """`bench load` records the flags of the server it started; before the flags took their Config fields' names
    they were --budget, --tp, --eager/--graph, ...: such a result compares with a new one under the new names."""
    base = [100.0 + i for i in range(20)]
    old = _load_result(tmp_path, "old", base, **{"--budget": 512, "--tp": 2, "--eager/--graph": True,
                                                 "--policy": "mixed"})
    new = _load_result(tmp_path, "new", [2 * v for v in base], **{
        "--max-num-batched-tokens": 1024, "--tensor-parallel-size": 2, "--enforce-eager": True,
        "--scheduling-policy": "mixed"})
    for variable in ("budget", "max_num_batched_tokens"):
        res = cmp.compare(cmp.load_bench(old), cmp.load_bench(new), variable)
        assert res["values"]["a"] == {"server.--max-num-batched-tokens": 512}
        assert res["values"]["b"] == {"server.--max-num-batched-tokens": 1024}
    with pytest.raises(LabkitError, match=r"server\.--max-num-batched-tokens"):
        cmp.compare(cmp.load_bench(old), cmp.load_bench(new), "tp")


def test_load_results_compare_per_request_e2el(tmp_path, runs, capsys):
    import random

    rng = random.Random(0)
    base = [rng.uniform(80, 120) for _ in range(40)]
    a = _load_result(tmp_path, "a", base, **{"--max-num-seqs": 8})
    noisy = _load_result(tmp_path, "b", [v * rng.uniform(0.9, 1.1) for v in base], **{"--max-num-seqs": 16})
    slow = _load_result(tmp_path, "c", [v * 2 for v in base], **{"--max-num-seqs": 16})
    res = cmp.compare(cmp.load_bench(a), cmp.load_bench(noisy), "max_num_seqs")
    assert res["kind"] == "load" and res["headline_metric"] == "e2el_ms" and res["samples_are"] == "completed requests"
    assert res["metrics"]["e2el_ms"]["a"]["n"] == 40 and res["within_noise"] is True
    assert res["differing"] == ["server.--max-num-seqs"]
    # Seeded: the same inputs give the same interval, to the last digit.
    assert cmp.compare(cmp.load_bench(a), cmp.load_bench(noisy), "max_num_seqs")["interval"] == res["interval"]
    res = cmp.compare(cmp.load_bench(a), cmp.load_bench(slow), "max_num_seqs")
    assert res["within_noise"] is False and res["ratio"] == pytest.approx(2.0)
    assert res["headline"].startswith("B/A median e2el ms: 2.000x (95% interval")
    assert res["single_measurements"]["output_throughput"]["ratio"] == pytest.approx(1.0)
    code, out, err = run_cli(["bench", "compare", a, slow, "--variable", "max_num_seqs"], capsys)
    assert code == 0 and "B/A median e2el ms: 2.000x" in " ".join(out.split()), err
    # One completed request is one sample: refused unless allowed; other server settings: refused.
    one = _load_result(tmp_path, "d", [100.0], failed=40, **{"--max-num-seqs": 16})
    code, _, err = run_cli(["bench", "compare", a, one, "--variable", "max_num_seqs"], capsys)
    assert code == 2 and "has 1 completed request" in err and len(err.strip().splitlines()) == 1
    other = _load_result(tmp_path, "e", base, **{"--max-num-seqs": 16, "--tensor-parallel-size": 2})
    with pytest.raises(LabkitError, match=r"server\.--tensor-parallel-size"):
        cmp.compare(cmp.load_bench(a), cmp.load_bench(other), "max_num_seqs")
    # An offline result against a load result: refused.
    offline = _write(tmp_path, "offline.json", _synthetic(100.0))
    code, _, err = run_cli(["bench", "compare", offline, a, "--variable", "code"], capsys)
    assert code == 2 and "compare offline runs with offline runs" in err
    # The per-request records are needed.
    (tmp_path / "a.requests.jsonl").unlink()
    code, _, err = run_cli(["bench", "compare", a, slow, "--variable", "max_num_seqs"], capsys)
    assert code == 2 and "per-request records are missing" in err


def test_two_real_load_runs_compare_on_rate(tmp_path, runs, capsys):
    """Two `bench load` runs that differ only in --rate, each with its warm-up, against a fake server: their
    configs hold what was asked, so the comparison goes through (it refused on warmup.wall_s before)."""
    from .fake_sse_server import start_in_thread

    fake = start_in_thread()
    paths = []
    for rate in ("4", "8"):
        paths.append(tmp_path / f"load-{rate}.json")
        code, out, err = run_cli(["bench", "load", "--url", fake.url, "--num-requests", "4", "--rate", rate,
                                  "--out", paths[-1]], capsys)
        assert code == 0, err + out
        assert "warm-up: " in out and out.index("warm-up: ") < out.index("labkit bench load:")
        r = json.loads(paths[-1].read_text())
        assert r["config"]["warmup"] == {"requests": r["warmup"]["requests"]} and r["warmup"]["wall_s"] > 0
    code, out, err = run_cli(["bench", "compare", *map(str, paths), "--variable", "rate"], capsys)
    assert code == 0, err
    res = json.loads((runs / "bench-compare-rate.json").read_text())
    assert res["differing"] == ["source.rate"]
    assert res["values"] == {"a": {"source.rate": 4.0}, "b": {"source.rate": 8.0}}


def test_load_results_with_the_warm_up_time_in_their_config_still_compare(tmp_path):
    """Results written before the warm-up's outcome left the config: its time is a measurement, listed."""
    a, b = (json.loads(open(_load_result(tmp_path, n, [100.0, 110.0, 120.0])).read()) for n in ("a", "b"))
    a["config"]["warmup"] = {"requests": 2, "failed": 0, "wall_s": 0.5}
    b["config"]["warmup"] = {"requests": 2, "failed": 0, "wall_s": 0.7}
    a["_records"] = b["_records"] = [{"e2el_ms": v, "ttft_ms": 1.0, "tpot_ms": 1.0} for v in (100.0, 110.0, 120.0)]
    res = cmp.compare(a, b, "code")
    assert res["measurement_differs"] == {"warmup.wall_s": {"a": 0.5, "b": 0.7}}
    b["config"]["warmup"]["requests"] = 3     # how many were sent is the configuration: refused
    with pytest.raises(LabkitError, match=r"warmup\.requests"):
        cmp.compare(a, b, "code")


def test_a_metric_with_no_ratio_says_why():
    """A median of 0 on A's side (a count no run of A saw, say), or a side without samples: the text says which,
    not a bare n/a."""
    m = cmp.sampled_metric([0.0, 0.0, 0.0], [1.0, 2.0, 3.0], "preemptions", higher_is_better=False)
    assert m["ratio"] is None and m["text"] == "no ratio: A's median is 0 (B's 2)"
    assert cmp.sampled_metric([], [1.0, 2.0], "x", True)["text"] == "no ratio: A has no samples"
    assert cmp.sampled_metric([1.0, 2.0], [], "x", True)["text"] == "no ratio: B has no samples"


def test_the_bootstrap_resamples_every_run_of_each_side():
    """Two runs a side: a resample of b = [3, 1] draws (3, 3), (3, 1), (1, 3) or (1, 1), medians 3, 2, 2, 1,
    each of the outer two a quarter of the time: the 95% interval spans both. A resampler that never drew the
    first run would give b's median 1 every time."""
    assert cmp.ratio_interval([1.0, 1.0], [3.0, 1.0]) == pytest.approx((1.0, 3.0))
    assert cmp.ratio_interval([3.0, 1.0], [1.0, 1.0]) == pytest.approx((1 / 3, 1.0))


def test_an_offline_result_that_carries_a_metrics_dict_stays_offline(tmp_path):
    data = _synthetic(1000.0)
    data["metrics"] = {"note": "a field an offline result may carry"}
    loaded = cmp.load_bench(_write(tmp_path, "offline.json", data))
    assert cmp.kind_of(loaded) == "offline" and "_records" not in loaded


def test_a_float_of_a_thousand_or_more_is_shown_whole():
    assert (cmp._short(999.5), cmp._short(1000.0), cmp._short(12345.678)) == ("999.500", "1,000", "12,346")


def test_a_ratio_is_said_with_both_ends_of_its_interval():
    assert cmp.ratio_text(1.2, (1.1, 1.3), 3, 3) == "1.200x (95% interval 1.100x to 1.300x)"
    assert cmp.ratio_text(1.01, (0.97, 1.04), 3, 3) == "within noise (95% interval of the ratio 0.970x to 1.040x " \
                                                       "holds 1.0)"
    assert cmp.ratio_text(0.8, (0.7, 1.0), 3, 3).startswith("within noise")  # (an end at 1.0 holds it)
    assert cmp.ratio_text(1.2, (1.0, 1.3), 3, 3).startswith("within noise")
    assert cmp.ratio_text(1.5, None, 1, 3) == "1.500x with no interval (1 vs 3 samples: a single sample shows no " \
                                              "spread)"


def test_a_rate_is_better_higher_and_a_time_better_lower():
    for kind, metrics in cmp.SAMPLED.items():
        for name, (_, label, higher_is_better) in metrics.items():
            assert higher_is_better == label.endswith("/s"), (kind, name, label)


def test_a_comparison_is_only_as_strong_as_its_weaker_run():
    gpu, cpu = {"evidence": "gpu-measured"}, {"evidence": "cpu-executed"}
    assert cmp.weakest_evidence(gpu, gpu) == "gpu-measured"
    assert cmp.weakest_evidence(gpu, cpu) == cmp.weakest_evidence(cpu, gpu) == "cpu-executed"
    assert cmp.weakest_evidence(gpu, {"evidence": "rumour"}) == "simulated"  # (unknown: the weakest there is)
