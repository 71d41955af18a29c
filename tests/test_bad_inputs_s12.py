"""Bad inputs to the surfaces of sessions 11-12 (--kv-cache-dtype, the engine flags under their Config names and
their old aliases, watch / trace --url / bench load --url --behind, serve's streams and endpoints, report): each
is refused with one line naming the flag, exit 2, no traceback, and before any model is loaded or server started
where the refusal can come first. The first tests hold the defects fixed in session 12; the parametrised ones
at the end guard inputs that were handled well already."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import run_cli

REPO = Path(__file__).resolve().parent.parent
MISSING_MODEL = "/nonexistent/labkit-model"
# An address no interface here has (TEST-NET-1): a serve that got past its checks fails to listen, never loading
# its model or serving.
NO_LISTEN = ["--host", "192.0.2.1", "--allow-remote", "--port", "8000"]


@pytest.fixture(autouse=True)
def _runs(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNS_DIR", str(tmp_path / "runs"))


def refused(args, capsys, *words, code=2) -> str:
    rc, _, err = run_cli(args, capsys)
    assert rc == code, (rc, err)
    assert "Traceback" not in err
    for word in words:
        assert word in err, (word, err)
    return err


# ------------------------------------------------------------------ old flag names given beside the new ones

@pytest.mark.parametrize("args, words", [
    (["bench", "--workload", "nano", "--budget", "100", "--max-num-batched-tokens", "200"],
     ["--budget 100", "--max-num-batched-tokens 200", "old name"]),
    (["bench", "run", "--budget=100", "--max-num-batched-tokens=200"], ["--budget", "--max-num-batched-tokens"]),
    (["bench", "--tp", "1", "--tensor-parallel-size", "2"], ["--tp 1", "--tensor-parallel-size 2"]),
    (["bench", "--eager", "--no-enforce-eager"], ["--eager", "--no-enforce-eager", "give it once"]),
    (["bench", "--graph", "--enforce-eager"], ["--graph", "--enforce-eager"]),
    (["bench", "--eager", "--graph"], ["--eager", "--graph"]),
    (["bench", "load", "--policy", "mixed", "--scheduling-policy", "balanced"], ["--policy", "--scheduling-policy"]),
    (["trace", "--case", "chunk", "--num-blocks", "5", "--num-kvcache-blocks", "6"],
     ["--num-blocks 5", "--num-kvcache-blocks 6"]),
    (["serve", "--block-size", "16", "--kvcache-block-size", "32"], ["--block-size", "--kvcache-block-size"]),
    (["logits-check", "run", "--suite", "fp8-kv", "--attention", "torch", "--attention-backend", "triton"],
     ["--attention torch", "--attention-backend triton"]),
])
def test_an_old_name_and_its_new_one_with_different_values_are_refused(args, words, capsys):
    refused([*args, "--model", MISSING_MODEL], capsys, *words)


def test_an_old_name_and_its_new_one_with_one_value_are_one_setting(capsys):
    from labkit.engine_args import rename_old_flags

    rc, out, err = run_cli(["bench", "--budget", "100", "--max-num-batched-tokens", "100", "--list"], capsys)
    assert rc == 0, err
    assert rename_old_flags(["--budget", "7", "--eager"]) == ["--max-num-batched-tokens", "7", "--enforce-eager"]


def test_old_names_are_renamed_as_options_only():
    from labkit.engine_args import rename_old_flags

    # the value of an option that takes one stays as given; so does everything after `--`
    assert rename_old_flags(["--prompt", "--budget", "--tp", "2", "--", "--eager"], {"--prompt"}) == \
        ["--prompt", "--budget", "--tensor-parallel-size", "2", "--", "--eager"]
    assert rename_old_flags(["-w", "--budget"], {"-w"}) == ["-w", "--budget"]


def test_a_choice_that_shares_an_old_name_is_shown_as_itself(capsys):
    # The logits suites `graph` and `tp` were listed as 'no-enforce-eager' and 'tensor-parallel-size'.
    err = refused(["logits-check", "run", "--suite", "bogus"], capsys, "'graph'", "'tp'")
    assert "no-enforce-eager" not in err and "tensor-parallel-size" not in err


# ------------------------------------------------------------------ serve: endpoints and options

@pytest.mark.parametrize("option, endpoint", [
    ("--step-stream-zmq", "tcp://127.0.0.1:99999"),   # ZeroMQ binds port 34463 instead
    ("--step-stream-zmq", "tcp://127.0.0.1:-1"),
    ("--kv-events", "tcp://127.0.0.1:0"),
    ("--kv-events", "tcp://:5557"),
    ("--kv-events", "tcp://127.0.0.1:abc"),
    ("--step-stream-zmq", "ipc://"),
    ("--kv-events", "bogus"),
])
def test_serve_refuses_an_endpoint_it_cannot_bind_as_given(option, endpoint, tiny_model, capsys):
    refused(["serve", "--model", tiny_model, "--device", "cpu", *NO_LISTEN, option, endpoint], capsys,
            f"{option} {endpoint}", "expected tcp://HOST:PORT")


@pytest.mark.parametrize("args, words", [
    (["--kv-events-topic", "foo"], ["--kv-events-topic foo", "give --kv-events"]),
    (["--log-level", "bogus"], ["--log-level bogus", "critical, error, warning, info, debug, trace"]),
    (["--served-model-name", " "], ["--served-model-name", "empty"]),
])
def test_serve_refuses_options_it_would_ignore_or_fail_on_later(args, words, tiny_model, capsys):
    refused(["serve", "--model", tiny_model, "--device", "cpu", *NO_LISTEN, *args], capsys, *words)


# ------------------------------------------------------------------ URLs: watch, trace --url, bench load

@pytest.mark.parametrize("args, words", [
    (["watch", "http://[::1"], ["URL 'http://[::1'", "not a URL"]),
    (["watch", "http://127.0.0.1:99999", "--seconds", "1"], ["URL 'http://127.0.0.1:99999'", "out of range"]),
    (["watch", "http://"], ["URL 'http://'", "expected http://HOST:PORT"]),
    (["trace", "--url", "http://[::1"], ["--url 'http://[::1'", "not a URL"]),
    (["trace", "--url", "http://127.0.0.1:0"], ["--url", "port 0 is not in 1-65535"]),
    (["bench", "load", "--url", "http://[::1"], ["--url 'http://[::1'", "not a URL"]),
    (["bench", "load", "--url", "foo"], ["--url 'foo'", "expected http://HOST:PORT"]),
    (["bench", "load", "--endpoints", "http://127.0.0.1:1,http://127.0.0.1:99999"], ["--endpoints", "99999"]),
    (["bench", "load", "--url", "http://127.0.0.1:1", "--behind", "foo,bar"], ["--behind 'foo'"]),
    (["bench", "load", "--url", "http://127.0.0.1:1", "--behind", ","], ["--behind: expected URL,URL"]),
])
def test_a_malformed_url_is_named_with_its_option(args, words, capsys):
    refused(args, capsys, *words)


def test_bench_load_behind_without_url_is_refused_before_a_server_starts(capsys):
    # (it was refused once the server it started had loaded its model: the missing model shows it is not)
    refused(["bench", "load", "--behind", "http://127.0.0.1:1", "--model", MISSING_MODEL], capsys,
            "--behind", "--url")


@pytest.mark.parametrize("args, words", [
    (["--url", "http://127.0.0.1:1", "--device", "cpu"], ["--device", "with --url"]),
    (["--url", "http://127.0.0.1:1", "--no-expect-changes"], ["--no-expect-changes", "with --url"]),
    (["--case", "chunk", "--seconds", "5", "--model", MISSING_MODEL], ["--seconds", "--url"]),
])
def test_trace_refuses_options_of_the_other_mode(args, words, capsys):
    refused(["trace", *args], capsys, *words)


# ------------------------------------------------------------------ FP8 with flash_attn, in a file

def test_a_case_file_with_fp8_and_flash_attn_is_refused_naming_its_key(tmp_path, capsys):
    case = (REPO / "workloads/cases/chunk.yaml").read_text()
    path = tmp_path / "fp8-flash.yaml"
    path.write_text(case.replace("enforce_eager: true}", "enforce_eager: true, kv_cache_dtype: fp8, "
                                 "attention_backend: flash_attn}"))
    refused(["trace", "--case", str(path), "--model", MISSING_MODEL], capsys,
            f"{path}: engine.kv_cache_dtype", "needs attention_backend triton or torch")


# ------------------------------------------------------------------ handled well already: regressions

_KV_BOGUS = ["--kv-cache-dtype", "bogus"]


@pytest.mark.parametrize("args, words", [
    (["trace", "--case", "chunk", *_KV_BOGUS], ["--kv-cache-dtype", "fp8_e4m3"]),
    (["trace", "--case", "chunk", "--kv-cache-dtype", "FP8"], ["--kv-cache-dtype"]),
    (["bench", *_KV_BOGUS], ["--kv-cache-dtype"]),
    (["bench", "load", *_KV_BOGUS], ["--kv-cache-dtype"]),
    (["serve", *_KV_BOGUS], ["--kv-cache-dtype"]),
    (["logits-check", "run", "--suite", "fp8-kv", *_KV_BOGUS], ["--kv-cache-dtype"]),
    (["bench", "--max-num-batched-tokens", "0"], ["--max-num-batched-tokens"]),
    (["bench", "--budget", "0"], ["--max-num-batched-tokens"]),
    (["bench", "--kvcache-block-size", "0"], ["--kvcache-block-size"]),
    (["bench", "--num-kvcache-blocks", "-5"], ["--num-kvcache-blocks"]),
    (["bench", "--max-num-seqs", "0"], ["--max-num-seqs"]),
    (["bench", "--gpu-memory-utilization", "1.5"], ["--gpu-memory-utilization"]),
    (["bench", "--tensor-parallel-size", "9"], ["--tensor-parallel-size"]),
    (["serve", "--max-num-seqs", "0"], ["--max-num-seqs"]),
    (["watch", "http://127.0.0.1:1", "--seconds", "-1"], ["--seconds"]),
    (["trace", "--url", "http://127.0.0.1:1", "--seconds", "0"], ["--seconds"]),
    (["trace", "--url", "http://127.0.0.1:1", "--seconds", "99999"], ["--seconds"]),
    (["watch", "foo"], ["URL 'foo'"]),
    (["trace", "--url", "foo"], ["--url 'foo'"]),
    (["trace", "--url", "http://127.0.0.1:1", "--case", "chunk"], ["--case or --url"]),
    (["trace", "--url", "http://127.0.0.1:1", "--kv-cache-dtype", "fp8"], ["--kv-cache-dtype", "with --url"]),
    (["bench", "load", "--url", "http://127.0.0.1:1", "--kv-cache-dtype", "fp8"], ["--kv-cache-dtype"]),
    (["bench", "load", "--url", "http://127.0.0.1:1", "--endpoints", "http://127.0.0.1:2"], ["--url and --endpoints"]),
    (["logits-check", "run", "--suite", "fp8-kv", "--kv-cache-dtype", "auto"], ["fp8-kv suite judges an FP8"]),
    (["logits-check", "run", "--suite", "fp8-kv", "--gate", "fixed"], ["--gate fixed"]),
    (["logits-check", "run", "--suite", "tp", "--kv-cache-dtype", "fp8"], ["--kv-cache-dtype fp8", "tp suite"]),
    (["logits-check", "run", "--suite", "kv", "--kv-cache-dtype", "fp8_e4m3"], ["kv suite"]),
])
def test_bad_inputs_handled_already(args, words, capsys):
    refused([*args, *(["--model", MISSING_MODEL] if args[0] in ("bench", "serve", "logits-check") and
                      "--url" not in args else [])], capsys, *words)


def test_unreachable_servers_are_one_line(capsys):
    refused(["watch", "http://127.0.0.1:1", "--seconds", "1"], capsys, "cannot read the step stream")
    refused(["trace", "--url", "http://127.0.0.1:1", "--seconds", "1"], capsys, "cannot record the live trace")
    refused(["bench", "load", "--url", "http://127.0.0.1:1"], capsys, "cannot reach http://127.0.0.1:1")


@pytest.mark.parametrize("engine, words", [
    ("kv_cache_dtype: bogus", ["engine.kv_cache_dtype", "auto, fp8, fp8_e4m3"]),
    ("kv_cache_dtype: 8", ["engine.kv_cache_dtype", "must be a string"]),
    ("fused_decode: maybe", ["engine.fused_decode", "true or false"]),
    ("kvcache_block_size: 0", ["engine.kvcache_block_size", "positive integer"]),
    ("num_kvcache_blocks: -5", ["engine.num_kvcache_blocks"]),
    ("gpu_memory_utilization: 1.5", ["engine.gpu_memory_utilization"]),
])
def test_bad_engine_settings_in_case_and_workload_files(engine, words, tmp_path, capsys):
    case = tmp_path / "case.yaml"
    case.write_text(re.sub(r"engine: \{.*?\}", f"engine: {{max_num_batched_tokens: 512, {engine}}}",
                           (REPO / "workloads/cases/chunk.yaml").read_text(), flags=re.S))
    refused(["trace", "--case", str(case), "--model", MISSING_MODEL], capsys, str(case), *words)
    workload = tmp_path / "workload.yaml"
    workload.write_text((REPO / "workloads/bench/nano.yaml").read_text() + f"  {engine}\n")
    refused(["bench", "--workload", str(workload), "--model", MISSING_MODEL], capsys, str(workload), *words)


def test_report_on_a_truncated_result_lists_it_unreadable(tmp_path, capsys):
    runs = tmp_path / "odd"
    runs.mkdir()
    (runs / "doctor.json").write_text(json.dumps({"command": "doctor", "evidence": "cpu-executed"})[:25])
    refused(["report", "--runs", str(runs), "--out", str(tmp_path / "out")], capsys, "UNREADABLE", "truncated",
            code=1)
    refused(["report", "--runs", str(tmp_path / "empty-or-missing")], capsys, "not a folder of results")


def test_a_bad_decode_pdl_mode_is_one_line(tiny_model):
    env = {**os.environ, "LABKIT_DECODE_PDL": "sideways", "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "labkit", "smoke", "--model", tiny_model, "--device", "cpu"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert "LABKIT_DECODE_PDL: must be first, early, late or off, got 'sideways'" in p.stderr
