"""`labkit bench load`: arrivals, SLO parsing and metric arithmetic on their own, then the whole command
against a `labkit serve` it starts (tiny model, CPU)."""
from __future__ import annotations

import json
import math

import pytest

from labkit.bench import load as L
from labkit.bench.workloads import load_workload
from labkit.errors import LabkitError

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


def test_slo_parsing():
    assert L.parse_slo("ttft:500, tpot:50") == {"ttft": 500.0, "tpot": 50.0}
    assert L.parse_slo(None) == {}
    for bad in ("ttft", "itl:5", "ttft:-3", "tpot:abc"):
        with pytest.raises(LabkitError, match="--slo"):
            L.parse_slo(bad)


def _outcome(i, ttft, e2el, tokens, itl=(), error=None, t0=0):
    o = L.Outcome(id=f"r{i}", scheduled_s=0.0, prompt_tokens=10, output_tokens=tokens, ttft_ms=ttft,
                  itl_ms=list(itl), e2el_ms=e2el, sent_ns=t0, done_ns=None if error else t0 + int(e2el * 1e6),
                  error=error)
    return o


def test_metrics_follow_vllm_definitions():
    outs = [_outcome(0, 10.0, 100.0, 10, itl=[10.0] * 9),          # tpot (100 - 10) / 9 = 10
            _outcome(1, 30.0, 230.0, 11, itl=[20.0] * 10, t0=50_000_000),   # tpot 20
            _outcome(2, 5.0, 5.0, 1),                                # one token: no tpot, no itl
            _outcome(3, None, None, 0, error="HTTP 503: overloaded")]
    s = L.summarize(outs, {"ttft": 20.0, "tpot": 15.0})
    assert (s["requests"], s["completed"], s["failed"]) == (4, 3, 1)
    assert s["duration_s"] == pytest.approx(0.28)  # first sent (0 ms) to last done (50 + 230 ms)
    assert s["output_tokens"] == 22 and s["input_tokens"] == 30
    assert s["output_throughput"] == pytest.approx(22 / 0.28)
    assert s["request_throughput"] == pytest.approx(3 / 0.28)
    assert s["tpot_ms"]["mean"] == pytest.approx(15.0) and s["tpot_ms"]["n"] == 2
    assert s["ttft_ms"]["median"] == pytest.approx(10.0) and s["itl_ms"]["n"] == 19
    assert s["e2el_ms"]["p99"] == pytest.approx(100 + 0.98 * 130)  # numpy's linear percentile
    # Good: r0 (ttft 10, tpot 10) and r2 (ttft 5, no tpot); r1 misses both bounds; r3 failed.
    assert s["good_requests"] == 2 and s["goodput"] == pytest.approx(2 / 0.28)
    assert s["errors"] == {"HTTP 503: overloaded": 1}


def test_bench_load_end_to_end_against_a_started_server(tiny_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MODEL_DIR", tiny_model)
    out = tmp_path / "load.json"
    code, stdout, err = run_cli(["bench", "load", "--workload", "fixed", "--num-requests", "4", "--rate", "50",
                                 "--device", "cpu", "--slo", "ttft:60000", "--out", out], capsys)
    assert code == 0, err + stdout
    r = json.loads(out.read_text())
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


def test_bench_load_arrivals_file_and_bad_inputs(tiny_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MODEL_DIR", tiny_model)
    arr = tmp_path / "two.jsonl"
    arr.write_text('{"t": 0, "prompt_len": 20, "max_tokens": 3}\n{"t": 0.2, "prompt": "hello", "max_tokens": 2}\n')
    out = tmp_path / "two.json"
    code, stdout, err = run_cli(["bench", "load", "--arrivals", arr, "--device", "cpu", "--out", out], capsys)
    assert code == 0, err + stdout
    m = json.loads(out.read_text())["metrics"]
    assert m["completed"] == 2 and m["output_tokens"] == 5
    # Server settings with --url: refused before anything runs.
    code, _, err = run_cli(["bench", "load", "--url", "http://127.0.0.1:9", "--max-num-seqs", "4"], capsys)
    assert code == 2 and "--max-num-seqs" in err and len(err.strip().splitlines()) == 1
    # Nobody listening: a one-line error, exit 2.
    code, _, err = run_cli(["bench", "load", "--url", "http://127.0.0.1:9", "--num-requests", "1"], capsys)
    assert code == 2 and "cannot reach" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["bench", "load", "--slo", "speed:3", "--device", "cpu"], capsys)
    assert code == 2 and "--slo" in err


def test_max_concurrency_one_sends_each_request_after_the_previous_finished(tiny_model, tmp_path):
    server = L.SpawnedServer(["--model", tiny_model, "--device", "cpu"], tmp_path / "server.log", 120)
    try:
        arr = [L.Arrival(t=0.0, prompt=[101 + i, 102, 103], max_tokens=4, id=f"r{i}") for i in range(3)]
        outs = L.run_load(server.url, arr, temperature=0.0, ignore_eos=True, max_concurrency=1)
    finally:
        server.close()
    assert all(o.ok and o.output_tokens == 4 for o in outs)
    spans = sorted((o.sent_ns, o.done_ns) for o in outs)
    assert all(prev[1] <= nxt[0] for prev, nxt in zip(spans, spans[1:]))  # never two in flight
    assert server.proc.returncode is not None  # the server was shut down
