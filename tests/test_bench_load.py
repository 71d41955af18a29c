"""`labkit bench load`: arrivals, option parsing and metric arithmetic on synthetic outcomes; the SSE reader
on crafted bytes; then the command against a fake server (tests/fake_sse_server.py: any /health we like)
and against real tiny `labkit serve` processes (CPU)."""
from __future__ import annotations

import importlib.util
import json
import math
import threading

import numpy as np
import pytest

from labkit.bench import load as L, load_metrics as M
from labkit.bench.workloads import load_workload
from labkit.errors import LabkitError

from .fake_sse_server import start_in_thread
from .helpers import run_cli

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


def test_poisson_arrivals_are_seeded_and_follow_the_rate():
    w = load_workload("nano").scaled(200)
    at_once = L.poisson_arrivals(w, math.inf)
    assert len(at_once) == 200 and all(a.t == 0.0 for a in at_once)
    a = L.poisson_arrivals(w, 10.0, seed=3)
    assert [x.t for x in a] == [x.t for x in L.poisson_arrivals(w, 10.0, seed=3)]
    assert [x.t for x in a] != [x.t for x in L.poisson_arrivals(w, 10.0, seed=4)]
    gaps = [b.t - c.t for b, c in zip(a[1:], a)]
    assert all(g >= 0 for g in gaps) and 0.07 < sum(gaps) / len(gaps) < 0.13  # mean gap 1 / rate
    assert [x.prompt for x in a] == [x.prompt for x in at_once]  # the workload's requests, re-timed
    with pytest.raises(LabkitError, match="--rate"):
        L.poisson_arrivals(w, 0.0)


def test_arrivals_file_is_read_sorted_and_every_bad_line_is_named(tmp_path):
    good = tmp_path / "a.jsonl"
    good.write_text('# a comment\n{"t": 1.5, "prompt_len": 5, "max_tokens": 2, "id": "late"}\n'
                    '{"t": 0, "prompt_ids": [7, 8], "max_tokens": 1}\n{"t": 0.5, "prompt": "hi", "max_tokens": 3}\n')
    arr = L.load_arrivals(good, vocab_range=(100, 200), seed=1)
    assert [a.id for a in arr] == ["line3", "line4", "late"] and [a.t for a in arr] == [0.0, 0.5, 1.5]
    assert arr[0].prompt == [7, 8] and arr[1].prompt == "hi"
    assert len(arr[2].prompt) == 5 and all(100 <= x < 200 for x in arr[2].prompt)
    assert L.load_arrivals(good, vocab_range=(100, 200), seed=1)[2].prompt == arr[2].prompt
    bad = {
        "{nope": "not valid JSON",
        '{"t": -1, "prompt_len": 3, "max_tokens": 1}': "t must be",
        '{"t": 0, "prompt_len": 3}': "max_tokens",
        '{"t": 0, "prompt_len": 3, "prompt": "x", "max_tokens": 1}': "exactly one",
        '{"t": 0, "prompt_ids": [], "max_tokens": 1}': "prompt_ids",
        '{"t": 0, "prompt_len": 3, "max_tokens": 1, "speed": 2}': "unknown key",
    }
    for line, msg in bad.items():
        p = tmp_path / "bad.jsonl"
        p.write_text('{"t": 0, "prompt_len": 3, "max_tokens": 1}\n' + line + "\n")
        with pytest.raises(LabkitError, match=msg) as e:
            L.load_arrivals(p)
        assert "bad.jsonl:2" in str(e.value)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("# nothing\n")
    with pytest.raises(LabkitError, match="no requests"):
        L.load_arrivals(empty)


def test_slo_and_percentile_parsing():
    assert M.parse_slo("ttft:500, tpot:50") == {"ttft": 500.0, "tpot": 50.0}
    assert M.parse_slo(None) == {}
    for bad in ("ttft", "itl:5", "ttft:-3", "tpot:abc"):
        with pytest.raises(LabkitError, match="--slo"):
            M.parse_slo(bad)
    assert M.parse_percentiles(None) == [50.0, 90.0, 99.0]
    assert M.parse_percentiles("99.9, 50,99.9,0,100") == [99.9, 50.0, 0.0, 100.0]
    assert [M.percentile_key(p) for p in (50.0, 99.0, 99.9, 0.5)] == ["p50", "p99", "p99.9", "p0.5"]
    for bad in ("", "50,,90", "101", "-1", "p99", "nan"):
        if bad:
            with pytest.raises(LabkitError, match="--percentiles: expected numbers from 0 to 100"):
                M.parse_percentiles(bad)


def _outcome(i, ttft, e2el, tokens, itl=(), error=None, t0=0, chunks=None, endpoint="http://a"):
    itl = list(itl)
    if chunks is None and not error:
        chunks = [tokens - len(itl)] + [1] * len(itl)   # one token per event after the first
    o = L.Outcome(id=f"r{i}", scheduled_s=0.0, endpoint=endpoint, prompt_tokens=10, output_tokens=tokens,
                  ttft_ms=ttft, itl_ms=itl, chunk_tokens=list(chunks or []), e2el_ms=e2el, sent_ns=t0,
                  done_ns=None if error else t0 + int(e2el * 1e6), error=error)
    return o


def test_metrics_follow_vllm_definitions():
    outs = [_outcome(0, 10.0, 100.0, 10, itl=[10.0] * 9),          # tpot (100 - 10) / 9 = 10
            _outcome(1, 30.0, 230.0, 11, itl=[20.0] * 10, t0=50_000_000),   # tpot 20
            _outcome(2, 5.0, 5.0, 1),                                # one token: no tpot, no itl
            _outcome(3, None, None, 0, error="HTTP 503: overloaded")]
    s = M.summarize(outs, {"ttft": 20.0, "tpot": 15.0})
    assert (s["requests"], s["completed"], s["failed"]) == (4, 3, 1)
    assert s["duration_s"] == pytest.approx(0.28)  # first sent (0 ms) to last done (50 + 230 ms)
    assert s["output_tokens"] == 22 and s["input_tokens"] == 30
    assert s["output_throughput"] == pytest.approx(22 / 0.28)
    assert s["request_throughput"] == pytest.approx(3 / 0.28)
    assert s["total_token_throughput"] == pytest.approx((30 + 22) / 0.28)  # prompts of completed requests too
    assert s["tpot_ms"]["mean"] == pytest.approx(15.0) and s["tpot_ms"]["n"] == 2
    assert s["ttft_ms"]["median"] == pytest.approx(10.0) and s["itl_ms"]["n"] == 19
    assert s["e2el_ms"]["p99"] == pytest.approx(100 + 0.98 * 130)  # numpy's linear percentile
    # std is the population std (numpy's default, as vLLM): tpot 10 and 20 -> 5, not 7.07.
    assert s["tpot_ms"]["std"] == pytest.approx(5.0)
    assert s["e2el_ms"]["std"] == pytest.approx(float(np.std([100.0, 230.0, 5.0])))
    assert set(s["itl_ms"]) == {"mean", "median", "std", "p50", "p90", "p99", "n"}  # the old keys stay
    # Good: r0 (ttft 10, tpot 10) and r2 (ttft 5, no tpot); r1 misses both bounds; r3 failed.
    assert s["good_requests"] == 2 and s["goodput"] == pytest.approx(2 / 0.28)
    assert s["errors"] == {"HTTP 503: overloaded": 1}


@pytest.mark.slow
def test_bench_load_end_to_end_against_a_started_server(tiny_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MODEL_DIR", tiny_model)
    monkeypatch.setenv("LABKIT_GUMBEL_PER_SM", "4")  # an engine knob: the server it starts runs with it, and says so
    out = tmp_path / "load.json"
    code, stdout, err = run_cli(["bench", "load", "--workload", "fixed", "--num-requests", "4", "--rate", "50",
                                 "--device", "cpu", "--slo", "ttft:60000", "--no-async-scheduling", "--out", out],
                                capsys)
    assert code == 0, err + stdout
    r = json.loads(out.read_text())
    # The started server got the engine flag, and the record says so (what `bench compare` keys on).
    assert r["config"]["server"]["--async-scheduling"] is False
    assert '"async_scheduling": false' in json.dumps(r), "the server's /health (recorded) names the setting"
    assert r["command"] == "bench load" and r["evidence"] == "cpu-executed" and r["device"]["server"] == "cpu"
    m = r["metrics"]
    assert (m["completed"], m["failed"]) == (4, 0)
    assert m["output_tokens"] == 4 * 32 and m["input_tokens"] == 4 * 128  # ignore_eos: every request runs out
    assert m["ttft_ms"]["n"] == 4 and m["tpot_ms"]["n"] == 4 and m["good_requests"] == 4
    assert 0 < m["ttft_ms"]["median"] <= m["e2el_ms"]["median"]
    lines = out.with_suffix(".requests.jsonl").read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(x)["output_tokens"] == 32 for x in lines)
    assert r["config"]["source"]["rate"] == 50.0 and out.with_suffix(".md").is_file()
    assert out.with_suffix(".server.log").is_file()
    assert r["knobs"] == {"LABKIT_GUMBEL_PER_SM": "4"} == r["servers"][0]["health"]["knobs"]
    assert "- engine knobs: LABKIT_GUMBEL_PER_SM=4" in out.with_suffix(".md").read_text()


def test_bench_load_arrivals_file_and_bad_inputs(tmp_path, capsys):
    fake = start_in_thread()  # the arrivals' path through the client; a real server is the test above's
    arr = tmp_path / "two.jsonl"
    arr.write_text('{"t": 0, "prompt_len": 20, "max_tokens": 3}\n{"t": 0.2, "prompt": "hello", "max_tokens": 2}\n')
    out = tmp_path / "two.json"
    code, stdout, err = run_cli(["bench", "load", "--arrivals", arr, "--url", fake.url, "--no-warmup", "--out", out],
                                capsys)
    assert code == 0, err + stdout
    r = json.loads(out.read_text())
    m = r["metrics"]
    assert m["completed"] == 2 and m["output_tokens"] == 5 and fake.completions == 2
    assert r["knobs"] is None and "- engine knobs: unknown" in out.with_suffix(".md").read_text()  # its /health: none
    # Server settings with --url: refused before anything runs.
    code, _, err = run_cli(["bench", "load", "--url", "http://127.0.0.1:9", "--max-num-seqs", "4"], capsys)
    assert code == 2 and "--max-num-seqs" in err and len(err.strip().splitlines()) == 1
    # Nobody listening: a one-line error, exit 2.
    code, _, err = run_cli(["bench", "load", "--url", "http://127.0.0.1:9", "--num-requests", "1"], capsys)
    assert code == 2 and "cannot reach" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["bench", "load", "--slo", "speed:3", "--device", "cpu"], capsys)
    assert code == 2 and "--slo" in err


# ------------------------------------------------------------------------------------------ new metrics

def test_custom_percentiles_and_std_on_known_values():
    outs = [_outcome(i, ttft=float(v), e2el=float(v) + 1, tokens=1) for i, v in enumerate([1, 2, 3, 4, 10])]
    s = M.summarize(outs, {}, percentiles=[25.0, 99.9])
    t = s["ttft_ms"]
    assert set(t) == {"mean", "median", "std", "p25", "p99.9", "n"} and s["percentiles"] == [25.0, 99.9]
    assert t["p25"] == pytest.approx(2.0) and t["p99.9"] == pytest.approx(4 + 0.996 * 6)
    assert t["mean"] == pytest.approx(4.0) and t["std"] == pytest.approx(math.sqrt((9 + 4 + 1 + 0 + 36) / 5))
    assert s["tpot_ms"] == {"mean": None, "median": None, "std": None, "p25": None, "p99.9": None, "n": 0}


def test_peak_output_throughput_counts_tokens_per_1s_bucket():
    # r0 sent at 0 s: events at 0.90 (1 token), 1.05 (3, coalesced), 1.95 s (2).
    # r1 sent at 0.5 s: events at 1.02 (2) and 1.62 s (5).
    # Buckets from the first request sent (0 s): [0, 1) holds 1 token, [1, 2) holds 3 + 2 + 2 + 5 = 12.
    r0 = _outcome(0, ttft=900.0, e2el=2000.0, tokens=6, itl=[150.0, 900.0], chunks=[1, 3, 2])
    r1 = _outcome(1, ttft=520.0, e2el=1200.0, tokens=7, itl=[600.0], chunks=[2, 5], t0=500_000_000)
    failed = _outcome(2, None, None, 0, error="HTTP 503: overloaded", t0=0)
    s = M.summarize([r0, r1, failed], {})
    assert s["max_output_tokens_per_s"] == pytest.approx(12.0)
    assert M.max_output_tokens_per_s([r0]) == pytest.approx(5.0)  # [1, 2): 3 + 2
    assert M.summarize([failed], {})["max_output_tokens_per_s"] is None


def test_peak_concurrency_is_a_sweep_with_finishes_before_sends():
    def span(i, start_s, end_s):
        return _outcome(i, ttft=1.0, e2el=(end_s - start_s) * 1000, tokens=1, t0=int(start_s * 1e9))

    # [0, 10) and [5, 15) overlap; [10, 20) starts exactly when the first ends: never three at once.
    assert M.summarize([span(0, 0, 10), span(1, 5, 15), span(2, 10, 20)], {})["max_concurrent_requests"] == 2
    assert M.max_concurrent_requests([span(0, 0, 10), span(1, 5, 15), span(2, 6, 8), span(3, 20, 21)]) == 3
    assert M.max_concurrent_requests([span(i, 0, 1) for i in range(4)]) == 4


def test_endpoints_get_arrivals_round_robin_in_arrival_order():
    arr = [L.Arrival(t=t, prompt=[1], max_tokens=1, id=str(i)) for i, t in enumerate([0.5, 0.0, 0.2, 0.0, 0.9])]
    # Arrival order: #1 (0.0), #3 (0.0, later in the list), #2, #0, #4.
    assert L.assign_endpoints(arr, ["A", "B"]) == ["B", "A", "A", "B", "A"]
    assert L.assign_endpoints(arr, ["A"]) == ["A"] * 5
    assert L.assign_endpoints(arr, ["A", "B", "C"]) == ["A", "A", "C", "B", "B"]


def test_per_endpoint_split_adds_up_to_the_combined_metrics():
    outs = [_outcome(0, 10.0, 100.0, 10, itl=[10.0] * 9, endpoint="http://a"),
            _outcome(1, 30.0, 230.0, 11, itl=[20.0] * 10, t0=50_000_000, endpoint="http://b"),
            _outcome(2, 5.0, 5.0, 1, endpoint="http://a"),
            _outcome(3, None, None, 0, error="HTTP 503: overloaded", endpoint="http://b")]
    s = M.summarize(outs, {"ttft": 20.0})
    a, b = s["endpoints"]
    assert (a["url"], a["requests"], a["completed"], a["output_tokens"]) == ("http://a", 2, 2, 11)
    assert (b["url"], b["requests"], b["completed"], b["failed"], b["output_tokens"]) == ("http://b", 2, 1, 1, 11)
    assert a["duration_s"] == b["duration_s"] == s["duration_s"] == pytest.approx(0.28)
    assert a["output_throughput"] + b["output_throughput"] == pytest.approx(s["output_throughput"])
    assert a["tpot_ms"]["median"] == pytest.approx(10.0) and b["tpot_ms"]["median"] == pytest.approx(20.0)
    assert (a["good_requests"], b["good_requests"]) == (2, 0) and b["errors"] == {"HTTP 503: overloaded": 1}
    assert "endpoints" not in M.summarize(outs[:1], {})  # one endpoint: nothing to split


# ------------------------------------------------------------------------------------------ the SSE reader

def _sse(*payloads) -> bytes:
    return b"".join(b"data: " + (p if isinstance(p, bytes) else json.dumps(p).encode()) + b"\n\n" for p in payloads)


def test_sse_reader_counts_coalesced_tokens_and_handles_any_split():
    tok = {"id": "x", "choices": [{"index": 0, "finish_reason": None, "text": "a", "token_ids": [5]}]}
    three = {"id": "x", "choices": [{"index": 0, "finish_reason": None, "text": "bcd", "token_ids": [6, 7, 8]}]}
    fin = {"id": "x", "choices": [{"index": 0, "finish_reason": "length", "text": "", "token_ids": []}]}
    usage = {"id": "x", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 4}}
    stream = b": keep-alive\n\n" + _sse(tok, three, fin, usage, b"[DONE]") + _sse(tok)  # after [DONE]: ignored
    for step in (len(stream), 7, 1):   # in one read, in pieces, byte by byte
        o = L.Outcome(id="r", scheduled_s=0.0, sent_ns=0)
        r = L._Stream(o)
        for i in range(0, len(stream), step):
            r.feed(stream[i:i + step])
            if r.done:
                break
        assert r.done and o.output_tokens == 4 and o.chunk_tokens == [1, 3] and len(o.itl_ms) == 1
        assert o.finish_reason == "length" and o.prompt_tokens == 12 and o.ttft_ms is not None
    o = L.Outcome(id="r", scheduled_s=0.0, sent_ns=0)
    L._Stream(o).feed(_sse(tok, three).replace(b"\n", b"\r\n"))  # CRLF line ends
    assert o.chunk_tokens == [1, 3]
    with pytest.raises(L._StreamError, match="mid-stream: boom"):
        L._Stream(o).feed(_sse({"error": {"message": "boom", "type": "engine_error", "code": 500}}))


@pytest.mark.parametrize("payload", [
    b'{"id": "x", "choices": [{"index": 0, "finish_reason": null, "text": "a", "token_ids": [5]}]}',
    b'{"id":"x","choices":[{"index":0,"finish_reason":null,"text":"a","token_ids":[5,6,7]}]}',  # vLLM's compact form
    b'{"id": "x", "choices": [{"index": 0, "finish_reason": null, "text": "", "token_ids": []}]}',
    b'{"id": "x", "choices": [{"index": 0, "finish_reason": "stop", "text": "", "token_ids": [9]}]}',
    b'{"id": "x", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}',
    b'{"error": {"message": "the \\"token_ids\\": [1, 2] ...", "code": 500}}',
    # vLLM's continuous usage stats: a token event that carries usage too (read in full, for prompt_tokens).
    b'{"choices":[{"index":0,"finish_reason":null,"text":"a","token_ids":[5]}],"usage":{"prompt_tokens":3}}',
    b'{"error": {"message": "x"}, "choices": [{"index": 0, "finish_reason": null, "token_ids": [1]}]}',
    b'{"id": "x", "choices": [{"index": 0, "finish_reason": null, "text": "\\"token_ids\\": [1, 2]", '
    b'"token_ids": [4]}]}',
])
def test_plain_token_count_agrees_with_a_full_parse(payload):
    n = L.plain_token_count(payload)
    data = json.loads(payload)
    plain = ("error" not in data and "usage" not in data and len(data["choices"]) == 1
             and data["choices"][0]["finish_reason"] is None)
    assert n == (len(data["choices"][0]["token_ids"]) if plain else None)


@pytest.mark.parametrize("client", [c for c in L.CLIENTS if importlib.util.find_spec(c)])
def test_client_reads_coalesced_events_from_a_server(client):
    fake = start_in_thread(tokens_per_step=3)
    arr = [L.Arrival(t=0.0, prompt=[1, 2, 3, 4], max_tokens=10, id=f"r{i}") for i in range(3)]
    outs = L.run_load([fake.url], arr, temperature=0.0, ignore_eos=True, client=client)
    for o in outs:
        assert o.ok, o.error
        assert (o.output_tokens, o.chunk_tokens, o.prompt_tokens, o.finish_reason) == (10, [3, 3, 3, 1], 4, "length")
        assert len(o.itl_ms) == 3 and o.tpot_ms is not None and o.endpoint == fake.url


# ------------------------------------------------------------------------------------------ provenance (/health)

FULL_HEALTH = {"status": "ok", "model_name": "qwen3-fake",
               "model": {"path": "/models/qwen3", "config_sha256": "a" * 64},
               "device": "cuda:0", "device_name": "NVIDIA H200", "vocab_size": 151936, "max_model_len": 4096, "tp": 1,
               "git_head": "0123abcd", "labkit_version": "0.1.0", "running": 0}


def test_provenance_comes_from_the_servers_health_with_url(tmp_path, capsys):
    fake = start_in_thread(health=FULL_HEALTH)
    out = tmp_path / "gpu.json"
    code, stdout, err = run_cli(["bench", "load", "--url", fake.url, "--num-requests", "2", "--no-warmup",
                                 "--out", out], capsys)
    assert code == 0, err + stdout
    r = json.loads(out.read_text())
    assert r["evidence"] == "gpu-measured"            # the client ran on a CPU; the server measured on a GPU
    assert r["device"]["type"] == "cuda" and r["device"]["name"] == "NVIDIA H200" and r["device"]["server"] == "cuda:0"
    assert r["model"]["config_sha256"] == "a" * 64 and r["model"]["path"] == "/models/qwen3"
    assert r["servers"] == [{"url": fake.url, "health": FULL_HEALTH}]
    assert r["client"]["library"] in L.CLIENTS and r["client"]["cpu_s"] > 0 and r["client"]["host"]["type"] == "cpu"
    assert "0123abcd" in out.with_suffix(".md").read_text() and fake.completions == 2
    # An older /health with only some fields: recorded as it is, the rest None, a CPU server's evidence.
    old = start_in_thread(health={"status": "ok", "device": "cpu", "vocab_size": 1000})
    code, stdout, err = run_cli(["bench", "load", "--url", old.url, "--num-requests", "1", "--out", out], capsys)
    assert code == 0, err + stdout
    r = json.loads(out.read_text())
    assert r["evidence"] == "cpu-executed" and r["model"]["config_sha256"] is None and r["device"]["type"] == "cpu"
    assert r["servers"][0]["health"] == {"status": "ok", "device": "cpu", "vocab_size": 1000}


def test_warm_up_requests_go_first_and_are_not_counted(tmp_path, capsys):
    fake = start_in_thread(health=FULL_HEALTH)
    out = tmp_path / "warm.json"
    code, stdout, err = run_cli(["bench", "load", "--url", fake.url, "--num-requests", "3", "--out", out], capsys)
    assert code == 0, err + stdout
    r = json.loads(out.read_text())
    warm = r["warmup"]
    assert warm["requests"] >= 1 and warm["failed"] == 0
    assert fake.completions == 3 + warm["requests"] and r["metrics"]["completed"] == 3
    cold = start_in_thread(health=FULL_HEALTH)
    code, stdout, err = run_cli(["bench", "load", "--url", cold.url, "--num-requests", "3", "--no-warmup",
                                 "--out", out], capsys)
    assert code == 0, err + stdout
    cold_r = json.loads(out.read_text())
    assert cold.completions == 3 and cold_r["config"]["warmup"] is None and cold_r["warmup"] is None


def test_endpoints_serving_different_models_are_refused_unless_allowed(tmp_path, capsys):
    a = start_in_thread(health=FULL_HEALTH)
    b = start_in_thread(health={**FULL_HEALTH, "model": {"path": "/models/other", "config_sha256": "b" * 64}})
    out = tmp_path / "mixed.json"
    args = ["bench", "load", "--endpoints", f"{a.url},{b.url}", "--num-requests", "4", "--no-warmup", "--out", out]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "different models" in err and "--allow-mixed" in err and len(err.strip().splitlines()) == 1
    assert a.completions == b.completions == 0 and not out.exists()
    code, stdout, err = run_cli(args + ["--allow-mixed"], capsys)
    assert code == 0, err + stdout
    r = json.loads(out.read_text())
    assert r["model"]["mixed"] is True and r["model"]["config_sha256"] is None
    assert [e["url"] for e in r["metrics"]["endpoints"]] == [a.url, b.url] and a.completions == b.completions == 2
    # Same hash, another vocabulary is another model too.
    c = start_in_thread(health={**FULL_HEALTH, "vocab_size": 1000})
    code, _, err = run_cli(["bench", "load", "--endpoints", f"{a.url},{c.url}", "--out", out], capsys)
    assert code == 2 and "vocab_size" in err


def test_endpoint_option_errors(capsys):
    for args, msg in ((["--url", "http://127.0.0.1:9", "--endpoints", "http://127.0.0.1:9"], "give one of them"),
                      (["--endpoints", "http://127.0.0.1:9,,http://127.0.0.1:8"], "empty entries"),
                      (["--endpoints", "127.0.0.1:9"], "not an http"),
                      (["--endpoints", "http://127.0.0.1:9", "--tensor-parallel-size", "2"], "--tensor-parallel-size"),
                      (["--percentiles", "50,200"], "--percentiles"),
                      (["--client", "curl"], "--client")):
        code, _, err = run_cli(["bench", "load", *args], capsys)
        assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, (args, err)


# ------------------------------------------------------------------------------------------ real servers

@pytest.fixture(scope="module")
def two_servers(tiny_model, tmp_path_factory):
    """Two tiny `labkit serve` processes, started side by side (each takes seconds to import torch)."""
    logs = tmp_path_factory.mktemp("servers")
    servers: list = [None, None]
    errors: list = []

    def start(i):
        try:
            servers[i] = L.SpawnedServer(["--model", tiny_model, "--device", "cpu"], logs / f"s{i}.log", 300)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        yield servers
    finally:
        for s in servers:
            if s is not None:
                s.close()


@pytest.mark.slow
def test_endpoints_spread_one_load_over_two_real_servers(two_servers, tmp_path, capsys):
    a, b = two_servers
    out = tmp_path / "replicas.json"
    code, stdout, err = run_cli(["bench", "load", "--workload", "fixed", "--num-requests", "5", "--rate", "100",
                                 "--endpoints", f"{a.url},{b.url}", "--percentiles", "50,99.9", "--out", out], capsys)
    assert code == 0, err + stdout
    r = json.loads(out.read_text())
    m = r["metrics"]
    assert (m["completed"], m["output_tokens"]) == (5, 5 * 32)
    ea, eb = m["endpoints"]
    assert (ea["url"], ea["completed"], ea["output_tokens"]) == (a.url, 3, 3 * 32)   # arrivals 1, 3, 5
    assert (eb["url"], eb["completed"], eb["output_tokens"]) == (b.url, 2, 2 * 32)   # arrivals 2, 4
    assert ea["output_throughput"] + eb["output_throughput"] == pytest.approx(m["output_throughput"])
    assert "p99.9" in m["tpot_ms"] and "p99" not in m["tpot_ms"]
    assert 1 <= m["max_concurrent_requests"] <= 5 and 0 < m["max_output_tokens_per_s"] <= 5 * 32
    # Each server's own /health is recorded (today's server: a subset of the fields); both are CPU servers.
    assert [s["url"] for s in r["servers"]] == [a.url, b.url] and r["evidence"] == "cpu-executed"
    assert all(s["health"]["device"] == "cpu" for s in r["servers"])
    lines = [json.loads(x) for x in out.with_suffix(".requests.jsonl").read_text().splitlines()]
    assert [x["endpoint"] for x in lines] == [a.url, b.url, a.url, b.url, a.url]
    assert all(sum(x["chunk_tokens"]) == x["output_tokens"] == 32 for x in lines)


@pytest.mark.slow
def test_max_concurrency_one_sends_each_request_after_the_previous_finished(two_servers):
    server = two_servers[0]
    arr = [L.Arrival(t=0.0, prompt=[101 + i, 102, 103], max_tokens=4, id=f"r{i}") for i in range(3)]
    outs = L.run_load([server.url], arr, temperature=0.0, ignore_eos=True, max_concurrency=1)
    assert all(o.ok and o.output_tokens == 4 for o in outs)
    spans = sorted((o.sent_ns, o.done_ns) for o in outs)
    assert all(prev[1] <= nxt[0] for prev, nxt in zip(spans, spans[1:]))  # never two in flight
    assert M.max_concurrent_requests(outs) == 1


def test_the_summary_fits_80_columns_with_each_latency_on_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    fake = start_in_thread(health=FULL_HEALTH)
    out = tmp_path / "narrow.json"
    code, stdout, err = run_cli(["bench", "load", "--url", fake.url, "--num-requests", "3", "--no-warmup",
                                 "--out", out], capsys)
    assert code == 0, err + stdout
    lines = stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    stats = json.loads(out.read_text())["metrics"]
    for key in M.LATENCIES:
        row = next(line for line in lines if line.strip("│ ").startswith(key[:-3] + " "))
        numbers = [float(x.replace(",", "")) for x in row.replace("│", " ").split()[1:]]
        # p50 is the median: shown once
        assert numbers == pytest.approx([stats[key][k] for k in ("mean", "median", "std", "p90", "p99")],
                                        abs=0.006), row


def test_request_classes_are_measured_apart(tmp_path, capsys):
    """An arrivals file's "class": each class gets its own ttft/itl/tpot figures (the scheduling-under-arrivals
    lab reads the short streams' ITL and the long prompts' TTFT apart), and each request record names its class."""
    fake = start_in_thread()
    arr = tmp_path / "classes.jsonl"
    arr.write_text('{"t": 0, "prompt_len": 8, "max_tokens": 6, "id": "s0", "class": "short"}\n'
                   '{"t": 0, "prompt_len": 8, "max_tokens": 6, "id": "s1", "class": "short"}\n'
                   '{"t": 0.05, "prompt_len": 40, "max_tokens": 2, "id": "l0", "class": "long"}\n'
                   '{"t": 0.05, "prompt_len": 9, "max_tokens": 1, "id": "plain"}\n')
    out = tmp_path / "classes.json"
    code, stdout, err = run_cli(["bench", "load", "--arrivals", arr, "--url", fake.url, "--no-warmup", "--out", out],
                                capsys)
    assert code == 0, err + stdout
    m = json.loads(out.read_text())["metrics"]
    assert set(m["classes"]) == {"short", "long"}       # a request with no class is in the totals only
    short, long_ = m["classes"]["short"], m["classes"]["long"]
    assert (short["completed"], short["output_tokens"], short["itl_ms"]["n"]) == (2, 12, 10)
    assert (long_["completed"], long_["output_tokens"], long_["ttft_ms"]["n"]) == (1, 2, 1)
    assert m["completed"] == 4 and m["itl_ms"]["n"] == 11
    records = [json.loads(line) for line in out.with_suffix(".requests.jsonl").read_text().splitlines()]
    assert {r["id"]: r["class"] for r in records} == {"s0": "short", "s1": "short", "l0": "long", "plain": None}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"t": 0, "prompt_len": 3, "max_tokens": 1, "class": ""}\n')
    with pytest.raises(LabkitError, match="class must be"):
        L.load_arrivals(bad)


def test_a_request_at_its_slo_bound_is_good_and_a_failed_one_never_is():
    """vLLM's goodput counts a request whose metric equals the bound (<=); a request that failed counts as bad
    however quick its first token was (a mid-stream error after one token keeps its ttft)."""
    at = _outcome(0, 20.0, 110.0, 10, itl=[10.0] * 9)                    # ttft 20 = bound, tpot 10 = bound
    over = _outcome(1, 20.0 + 1e-9, 110.0, 10, itl=[10.0] * 9)
    failed = _outcome(2, 1.0, 2.0, 1, error="mid-stream: boom")
    s = M.summarize([at, over, failed], {"ttft": 20.0, "tpot": 10.0})
    assert M.meets_slo(at, {"ttft": 20.0, "tpot": 10.0}) and not M.meets_slo(over, {"ttft": 20.0})
    assert not M.meets_slo(failed, {"ttft": 20.0}) and failed.ttft_ms == 1.0
    assert s["good_requests"] == 1


def test_sse_reader_times_each_gap_from_the_previous_arrival(monkeypatch):
    """ttft is sent -> first token event; each itl is the gap since the previous token event (not since the
    request was sent); an event without tokens (the finish, usage) adds no gap."""
    tok = {"id": "x", "choices": [{"index": 0, "finish_reason": None, "text": "a", "token_ids": [5]}]}
    two = {"id": "x", "choices": [{"index": 0, "finish_reason": None, "text": "bc", "token_ids": [6, 7]}]}
    fin = {"id": "x", "choices": [{"index": 0, "finish_reason": "stop", "text": "", "token_ids": []}]}
    clock = iter([10, 25, 45, 60, 61])   # ms after the send, one per feed
    monkeypatch.setattr(L.time, "monotonic_ns", lambda: next(clock) * 1_000_000)
    o = L.Outcome(id="r", scheduled_s=0.0, sent_ns=0)
    r = L._Stream(o)
    for p in (tok, tok, two, fin, b"[DONE]"):
        r.feed(_sse(p))
    assert o.ttft_ms == pytest.approx(10.0) and o.itl_ms == pytest.approx([15.0, 20.0])
    assert o.chunk_tokens == [1, 1, 2] and o.output_tokens == 4 and r.done
