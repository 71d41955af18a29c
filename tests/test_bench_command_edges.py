"""What `labkit bench` writes at its edges (labkit/bench/command.py), without running a workload: the summary's
rows (KV dtype, custom kernels, peak memory's source), the notes a result carries, the Markdown table's shape,
the profile's warnings, a model's layer count, and which engine flags `--backend hf` accepts."""
from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from labkit.bench.command import _f, _num_layers, _summary_rows, build_result, markdown, print_profile, print_result
from labkit.bench.workloads import parse_workload
from labkit.output import envelope
from tests.helpers import run_cli


def _run(repeat: int, decode: bool) -> dict:
    x = {"repeat": repeat, "requests": 2, "prompt_tokens": 8, "output_tokens": 4, "wall_s": 0.5,
         "output_throughput": 8.0, "total_token_throughput": 24.0}
    if decode:
        x |= {"decode_steps": 3, "decode_ms_per_token": 1.25}
    return x


def _result(*, device: str = "cpu", evidence: str = "cpu-executed", engine: dict | None = None,
            execution: str = "eager", decode: bool = False, source: str = "torch.cuda.max_memory_allocated") -> dict:
    w = parse_workload({"name": "x", "requests": 2, "prompt_len": 4, "output_len": 2, "repeats": 1})
    env = envelope("bench", device="cpu", model_dir=None, evidence=evidence)
    env["device"] = {"type": device, "name": device}
    env["model"] = {"config_sha256": "0" * 64}
    med = {k: v for k, v in _run(0, decode).items() if k in ("wall_s", "output_throughput", "total_token_throughput",
                                                             "decode_ms_per_token")}
    m = {"dtype": "bfloat16", "engine": {"enforce_eager": True, "attention_backend": "torch",
                                         "tensor_parallel_size": 1} if engine is None else engine,
         "execution": execution, "init_s": 1.0, "init_wall_s": 1.0, "graph_capture_s": None, "warmup_s": 0.0,
         "warmup_rounds": [], "runs": [_run(0, decode)], "median": med, "kv_blocks": 10,
         "peak_memory": {"per_rank": [{"rank": 0, "peak_bytes": 2**30}], "source": source, "max_bytes": 2**30},
         "vocab_size": 10, "prompt_ids_folded": False}
    return build_result(env, w, "engine", m)


def _rows(r: dict) -> dict:
    return dict(_summary_rows(r))


def test_the_kv_row_notes_a_one_byte_pool_only_when_one_was_asked_for():
    eng = {"enforce_eager": True, "attention_backend": "torch", "tensor_parallel_size": 1}
    assert _rows(_result(engine={**eng, "kv_cache_dtype": "auto"}))["kv blocks"] == "10"
    assert _rows(_result(engine=eng))["kv blocks"] == "10"
    assert "fp8_e4m3 pool: 1 byte an element" in _rows(_result(engine={**eng, "kv_cache_dtype": "fp8_e4m3"}))[
        "kv blocks"]


def test_custom_kernels_are_on_or_off_on_a_gpu_and_always_off_on_a_cpu():
    eng = {"enforce_eager": True, "attention_backend": "torch", "tensor_parallel_size": 1, "custom_kernels": True}
    assert _rows(_result(engine=eng, device="cuda:0"))["backend"].endswith(", custom kernels on")
    assert _rows(_result(engine={**eng, "custom_kernels": False}, device="cuda:0"))["backend"].endswith(
        ", custom kernels off")
    assert _rows(_result(engine=eng, device="cpu"))["backend"].endswith(", custom kernels off (CUDA only)")


def test_peak_memory_names_where_it_came_from():
    assert _rows(_result())["peak memory"] == "rank 0: 1.00 GiB (torch.cuda.max_memory_allocated)"
    assert _rows(_result(source="ru_maxrss"))["peak memory"] == "rank 0: 1.00 GiB (max RSS of the process)"


def test_the_cpu_note_and_the_eager_fallback_note_appear_only_when_true():
    cpu = "CPU run: it shows the bench executes"
    assert any(cpu in n for n in _result()["notes"])
    assert not any(cpu in n for n in _result(evidence="gpu-measured", device="cuda:0")["notes"])
    fallback = "graph execution was asked for (enforce_eager false) but the engine ran eager."
    base = {"attention_backend": "torch", "tensor_parallel_size": 1}
    assert fallback in _result(engine={**base, "enforce_eager": False})["notes"]
    assert fallback not in _result(engine={**base, "enforce_eager": None})["notes"]
    assert fallback not in _result(engine=base)["notes"]
    assert fallback not in _result(engine={**base, "enforce_eager": False}, execution="graph")["notes"]


@pytest.mark.parametrize("decode", [False, True])
def test_the_markdown_runs_table_has_one_separator_cell_a_column(decode):
    lines = markdown(_result(decode=decode)).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| repeat |"))
    columns = lines[head].count("|") - 1
    assert columns == (9 if decode else 7)
    assert lines[head + 1] == "| --- " * columns + "|"
    assert lines[head + 2].count("|") - 1 == columns


def test_a_bool_figure_is_written_as_a_word():
    assert _f(True) == "True" and _f(1234) == "1,234"


def _profile(checks: list[dict]) -> dict:
    window = {"first_step": 1, "last_step": 4, "prefill_steps": 0, "decode_steps": 4, "decode_batch": None,
              "decode_ms_per_token": None}
    host = [{"label": "forward", "ms": 2.0, "pct": 50.0, "by_phase_ms": {"prefill": 0.0, "decode": 2.0,
                                                                       "between": 0.0}}]
    return {"window": window, "wall_ms": 4.0, "host": host, "gpu": None, "gpu_note": "no GPU kernels on a CPU",
            "checks": checks}


def test_the_profile_warns_of_the_checks_that_fail_only():
    checks = [{"check": "steps add up", "ok": True, "diff_ms": 0.0, "tolerance_ms": 0.01},
              {"check": "phases add up", "ok": False, "diff_ms": 0.5, "tolerance_ms": 0.01}]
    buf = io.StringIO()
    print_profile(_profile(checks), Console(file=buf, width=200))
    text = buf.getvalue()
    assert "warning: phases add up: off by +0.5000 ms" in text and "steps add up" not in text
    assert "note: no GPU kernels on a CPU" in text


def test_print_result_shows_each_note(tmp_path):
    buf = io.StringIO()
    print_result(_result(), Console(file=buf, width=200))
    assert "note: CPU run: it shows the bench executes" in buf.getvalue()


def test_the_layer_count_is_an_integer_or_nothing(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 4}))
    assert _num_layers(tmp_path) == 4
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": "4"}))
    assert _num_layers(tmp_path) is None
    (tmp_path / "config.json").write_text("[1, 2]")
    assert _num_layers(tmp_path) is None
    assert _num_layers(tmp_path / "missing") is None


def test_backend_hf_takes_dtype_but_refuses_the_other_engine_settings(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RUNS_DIR", str(tmp_path))
    # --dtype is the baseline's too: the refusal that follows is batch1's step timing, not the flag.
    code, _, err = run_cli(["bench", "--workload", "batch1", "--backend", "hf", "--dtype", "float32"], capsys)
    assert code == 2 and "--dtype" not in err and "timing steps" in err
    code, _, err = run_cli(["bench", "--workload", "batch1", "--backend", "hf", "--dtype", "float32",
                            "--max-num-seqs", "4"], capsys)
    assert code == 2 and "--max-num-seqs" in err and "--dtype" not in err
