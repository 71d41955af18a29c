"""`labkit bench`: workload draws, the engine and HF runs end to end on the tiny model (compare:
test_bench_compare.py)."""
import json
import os
import random
import statistics

import pytest

from labkit import cli
from labkit.bench.command import _summary_rows
from labkit.bench.workloads import draw, draw_repeat, draw_warmup, load_workload, parse_workload
from labkit.errors import LabkitError

ENVELOPE_KEYS = {"command", "argv", "versions", "device", "model", "git_head", "started_at", "ended_at", "evidence"}


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    code = exited.value.code
    return (0 if code is None else code), captured.out, captured.err


@pytest.fixture
def runs(tmp_path, monkeypatch):
    out = tmp_path / "runs"
    monkeypatch.setenv("RUNS_DIR", str(out))
    return out


# ------------------------------------------------------------------------------ workloads

def test_nano_reproduces_upstream_draws_and_totals():
    w = load_workload("nano")
    d = draw(w)
    assert len(d) == 256
    assert d.prompt_tokens == 142_827
    assert d.output_tokens == 133_966
    # Upstream bench.py, draw for draw (module-level random, seed(0)).
    rng = random.Random()
    rng.seed(0)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(100, 1024))] for _ in range(256)]
    max_tokens = [rng.randint(100, 1024) for _ in range(256)]
    assert d.prompts == prompts and d.max_tokens == max_tokens
    assert w.temperature == 0.6 and w.ignore_eos and w.engine["max_model_len"] == 4096
    # Scaling down keeps a prefix of the full workload.
    small = draw(w.scaled(8))
    assert small.prompts == prompts[:8] and small.max_tokens == max_tokens[:8]


def test_fixed_workload_shape():
    w = load_workload("fixed")
    assert (w.requests, w.warmup.rounds, w.warmup.full, w.repeats) == (16, 2, True, 3)
    reps = [draw_repeat(w, i) for i in range(3)]
    for d in reps:
        assert len(d) == 16 and all(len(p) == 128 for p in d.prompts) and d.max_tokens == [32] * 16
    # Fresh prompts per repeat (seed + i) and for warm-up: no repeat can hit the prefix cache.
    assert [d.seed for d in reps] == [0, 1, 2]
    warm = draw_warmup(w, 0)
    assert len(warm) == 16 and warm.max_tokens == [32] * 16
    firsts = {tuple(d.prompts[0]) for d in reps + [warm, draw_warmup(w, 1)]}
    assert len(firsts) == 5


def test_uniform_and_warmup_forms_parse():
    w = parse_workload({"requests": 4, "prompt_len": {"uniform": [5, 9]}, "output_len": 3,
                        "warmup": {"rounds": 1, "requests": 2, "output_len": 2}, "engine": {"max_num_seqs": 8}})
    d = draw(w)
    assert all(5 <= len(p) <= 9 for p in d.prompts) and d.max_tokens == [3] * 4
    assert draw_warmup(w, 0).max_tokens == [2, 2]
    with pytest.raises(LabkitError, match="num-requests"):
        w.scaled(5)


@pytest.mark.parametrize("text, needle", [
    ("requests: 2\nprompt_len: {uniform: [9, 3]}\noutput_len: 4\n", "prompt_len"),
    ("requests: 2\nprompt_len: 3\noutput_len: 4\nbogus: 1\n", "bogus"),
    ("requests: 0\nprompt_len: 3\noutput_len: 4\n", "requests"),
    ("requests: 2\nprompt_len: 3\n", "output_len"),
    ("requests: 2\nprompt_len: 3\noutput_len: 4\nengine: {tracer: x}\n", "tracer"),
    ("requests: [2\n", "YAML"),
])
def test_bad_workload_file_exits_2_with_one_line(tmp_path, runs, capsys, text, needle):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    code, out, err = run_cli(["bench", "--workload", bad], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("labkit: ") and needle in lines[0]
    assert not runs.exists()


def test_unknown_workload_and_hf_with_engine_flags_exit_2(runs, capsys):
    code, _, err = run_cli(["bench", "--workload", "nope"], capsys)
    assert code == 2 and "nano" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["bench", "--backend", "hf", "--tensor-parallel-size", "2"], capsys)
    assert code == 2 and "--tensor-parallel-size" in err


# ------------------------------------------------------------------------------ end to end

def _check_bench_json(data: dict, backend: str, requests: int, output_tokens: int, repeats: int):
    assert ENVELOPE_KEYS <= set(data)
    assert data["command"] == "bench" and data["evidence"] == "cpu-executed" and data["tracing"] is False
    assert data["backend"] == backend and data["config"]["backend"] == backend
    for key in ("init_s", "warmup_s"):
        assert isinstance(data[key], float) and data[key] >= 0
    assert "graph_capture_s" in data
    assert len(data["runs"]) == repeats
    for r in data["runs"]:
        assert r["requests"] == requests and r["output_tokens"] == output_tokens
        assert r["output_throughput"] == pytest.approx(r["output_tokens"] / r["wall_s"])
        assert r["total_token_throughput"] == pytest.approx((r["prompt_tokens"] + r["output_tokens"]) / r["wall_s"])
    med = data["median"]
    assert med["output_throughput"] == pytest.approx(statistics.median(r["output_throughput"] for r in data["runs"]))
    assert med["total_token_throughput"] == pytest.approx(
        statistics.median(r["total_token_throughput"] for r in data["runs"]))
    assert data["peak_memory"]["per_rank"][0]["rank"] == 0
    assert data["peak_memory"]["per_rank"][0]["peak_bytes"] > 0 and data["peak_memory"]["max_bytes"] > 0
    cfg = data["config"]
    assert cfg["model_config_sha256"] == data["model"]["config_sha256"] and cfg["model_config_sha256"]
    assert cfg["device"]["type"] == "cpu" and cfg["dtype"] == "float32" and cfg["workload"]["requests"] == requests


def test_bench_fixed_end_to_end(tiny_model, runs, capsys):
    code, out, err = run_cli(["bench", "--workload", "fixed", "--model", tiny_model, "--device", "cpu"], capsys)
    assert code == 0, err
    path = runs / "bench-fixed-engine-eager-model-tiny.json"  # --model another folder: a record of its own
    data = json.loads(path.read_text())
    _check_bench_json(data, "engine", 16, 16 * 32, 3)
    assert len(data["warmup_rounds"]) == 2 and data["kv_blocks"] > 0
    eng = data["config"]["engine"]
    assert eng["enforce_eager"] is True and eng["attention_backend"] == "torch" and eng["tensor_parallel_size"] == 1
    assert data["config"]["hf"] is None and data["execution"] == "eager"
    # Where init went, phase by phase (CPU: no warm-up forward, no graphs), adding up to init_s.
    phases = data["startup_s"]
    assert list(phases) == ["tokenizer", "kernels and device", "build model", "load weights", "kv cache", "other"]
    assert all(v >= 0 for v in phases.values()) and abs(sum(phases.values()) - data["init_s"]) < 0.01
    assert [r["seed"] for r in data["runs"]] == [0, 1, 2]
    assert path.with_suffix(".md").read_text().startswith("# labkit bench: fixed (engine)")
    assert "tok/s" in out and "median" in out
    backend = dict(_summary_rows(data))["backend"]
    assert backend.startswith("engine: eager, attention torch, tp 1")      # nothing asked: no "(asked: eager)"
    data["config"]["engine"]["enforce_eager"] = data["engine"]["enforce_eager"] = False
    assert dict(_summary_rows(data))["backend"].startswith("engine: eager (asked: graph), attention torch")


def test_a_bench_result_records_the_engine_knobs_set(tiny_model, runs, capsys, monkeypatch):
    """A knob (LABKIT_GUMBEL_NOISE and the like) makes the engine compute along another path: the result says
    which were set, in its JSON and its Markdown, and records none when none is."""
    for k in [k for k in os.environ if k.startswith(("LABKIT_DECODE_", "LABKIT_GUMBEL_", "LABKIT_GRAPH_"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("LABKIT_GUMBEL_NOISE", "philox")
    monkeypatch.setenv("LABKIT_DEBUG", "0")  # not an engine knob
    out = runs / "knob.json"
    code, _, err = run_cli(["bench", "--workload", "fixed", "--num-requests", "2", "--model", tiny_model,
                            "--device", "cpu", "--out", out], capsys)
    assert code == 0, err
    assert json.loads(out.read_text())["knobs"] == {"LABKIT_GUMBEL_NOISE": "philox"}
    assert "Engine knobs: LABKIT_GUMBEL_NOISE=philox." in out.with_suffix(".md").read_text()
    monkeypatch.delenv("LABKIT_GUMBEL_NOISE")
    code, _, err = run_cli(["bench", "--workload", "fixed", "--num-requests", "2", "--model", tiny_model,
                            "--device", "cpu", "--out", out], capsys)
    assert code == 0, err
    assert json.loads(out.read_text())["knobs"] == {}
    assert "Engine knobs: none set (the engine's defaults)." in out.with_suffix(".md").read_text()


def test_bench_run_subcommand_nano_scaled(tiny_model, runs, capsys):
    out = runs / "nano.json"
    code, _, err = run_cli(["bench", "run", "--workload", "nano", "--num-requests", "3", "--model", tiny_model,
                            "--device", "cpu", "--out", out, "--max-num-batched-tokens", "4096"], capsys)
    assert code == 0, err
    data = json.loads(out.read_text())
    want = draw(load_workload("nano").scaled(3))
    _check_bench_json(data, "engine", 3, want.output_tokens, 1)
    assert data["runs"][0]["prompt_tokens"] == want.prompt_tokens
    assert data["warmup_rounds"][0]["output_tokens"] == 3 * 16
    assert data["workload"]["scaled_from"] == 256 and data["config"]["engine"]["max_num_batched_tokens"] == 4096
    assert data["prompt_ids_folded"] is True  # the tiny model's vocab (2048) is smaller than the id range


def test_bench_hf_end_to_end(tiny_model, runs, capsys):
    out = runs / "hf.json"
    code, _, err = run_cli(["bench", "--workload", "fixed", "--backend", "hf", "--num-requests", "4", "--warmup", "1",
                            "--repeats", "1", "--hf-batch", "3", "--model", tiny_model, "--device", "cpu",
                            "--out", out], capsys)
    assert code == 0, err
    data = json.loads(out.read_text())
    _check_bench_json(data, "hf", 4, 4 * 32, 1)
    assert data["config"]["engine"] is None and data["kv_blocks"] is None
    assert data["config"]["hf"] == {"batch": 3, "attn_implementation": "sdpa"}
    assert data["runs"][0]["batches"] == 2 and data["hf"]["sampling"]["top_k"] == 0
