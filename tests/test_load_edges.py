"""The load bench's pure parts at their edges: arrival schedules and arrivals files, the run's metrics (duration,
errors, per-class figures, per-request records), HTTP error text and the servers' provenance. No server."""
from __future__ import annotations

import json

import pytest

from labkit.bench import load as L, load_metrics as M
from labkit.bench.workloads import load_workload
from labkit.errors import LabkitError


def _outcome(i, ttft, e2el, tokens, itl=(), error=None, t0=0, cls=None, endpoint="http://a"):
    itl = list(itl)
    chunks = [] if error else [tokens - len(itl)] + [1] * len(itl)
    return L.Outcome(id=f"r{i}", scheduled_s=0.0, cls=cls, endpoint=endpoint, prompt_tokens=10, output_tokens=tokens,
                     ttft_ms=ttft, itl_ms=itl, chunk_tokens=chunks, e2el_ms=e2el, sent_ns=t0,
                     done_ns=None if error else t0 + int(e2el * 1e6), error=error)


def _arrivals(tmp_path, text, **kw):
    p = tmp_path / "a.jsonl"
    p.write_text(text)
    return L.load_arrivals(p, **kw)


# ------------------------------------------------------------------------------------------ arrivals

def test_the_first_poisson_arrival_goes_at_once():
    a = L.poisson_arrivals(load_workload("nano").scaled(5), 2.0, seed=1)
    assert a[0].t == 0.0 and all(x.t > 0 for x in a[1:])


def test_blank_lines_in_an_arrivals_file_are_skipped(tmp_path):
    arr = _arrivals(tmp_path, '{"t": 0, "prompt_len": 2, "max_tokens": 1}\n\n   \n'
                              '{"t": 1, "prompt": "x", "max_tokens": 1}\n')
    assert [a.id for a in arr] == ["line1", "line4"]


@pytest.mark.parametrize("line, msg", [
    ('{"t": 0, "prompt_len": 3, "max_tokens": 0}', "max_tokens"),
    ('{"t": true, "prompt_len": 3, "max_tokens": 1}', "t must be"),
    ('{"t": 0, "prompt_len": 0, "max_tokens": 1}', "prompt_len"),
])
def test_arrivals_lines_at_the_edge_are_refused(tmp_path, line, msg):
    with pytest.raises(LabkitError, match=msg):
        _arrivals(tmp_path, line + "\n")


def test_token_id_zero_is_a_valid_prompt_id(tmp_path):
    assert _arrivals(tmp_path, '{"t": 0, "prompt_ids": [0, 5], "max_tokens": 1}\n')[0].prompt == [0, 5]


def test_an_arrivals_file_may_hold_exactly_max_requests(tmp_path, monkeypatch):
    monkeypatch.setattr(L, "MAX_REQUESTS", 2)
    line = '{"t": 0, "prompt_ids": [1], "max_tokens": 1}\n'
    assert len(_arrivals(tmp_path, line * 2)) == 2
    with pytest.raises(LabkitError, match="more than 2 requests"):
        _arrivals(tmp_path, line * 3)


def test_prompt_len_lines_may_draw_exactly_the_token_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(L, "MAX_TOKENS", 10)
    ok = '{"t": 0, "prompt_len": 4, "max_tokens": 1}\n{"t": 0, "prompt_len": 6, "max_tokens": 1}\n'
    assert sum(len(a.prompt) for a in _arrivals(tmp_path, ok)) == 10
    with pytest.raises(LabkitError, match="draw 11 tokens"):
        _arrivals(tmp_path, ok + '{"t": 0, "prompt_len": 1, "max_tokens": 1}\n')


def test_prompt_len_lines_of_one_length_get_different_prompts(tmp_path):
    """Identical drawn prompts would hit the server's prefix cache and flatter its TTFT."""
    arr = _arrivals(tmp_path, '{"t": 0, "prompt_len": 16, "max_tokens": 1}\n' * 3)
    assert len({tuple(a.prompt) for a in arr}) == 3


# ------------------------------------------------------------------------------------------ metrics

def test_an_empty_percentiles_option_gives_the_defaults():
    assert M.parse_percentiles("") == M.parse_percentiles("  ") == [50.0, 90.0, 99.0]


def test_slo_of_zero_ms_is_refused():
    with pytest.raises(LabkitError, match="positive"):
        M.parse_slo("ttft:0")


def test_an_slo_below_one_millisecond_is_kept():
    assert M.parse_slo("ttft:0.5, tpot:0.25") == {"ttft": 0.5, "tpot": 0.25}


@pytest.mark.parametrize("slo, good", [
    ({"tpot": 10.0}, ["one-token"]),                      # the 20 ms tpot misses; a one-token request has none
    ({"tpot": 20.0}, ["slow-tpot", "one-token"]),          # a bound met exactly counts
    ({"ttft": 15.0}, ["slow-tpot"]),                       # the one-token request's 30 ms ttft misses
    ({"e2el": 90.0, "tpot": 25.0}, ["slow-tpot", "one-token"]),
    ({"e2el": 80.0}, ["one-token"]),
    ({"ttft": 15.0, "tpot": 10.0}, []),
])
def test_goodput_counts_the_requests_that_meet_every_bound(slo, good):
    outs = [L.Outcome(**{**_outcome(0, 10.0, 90.0, 5, itl=[20.0] * 4).__dict__, "id": "slow-tpot"}),
            L.Outcome(**{**_outcome(1, 30.0, 30.0, 1).__dict__, "id": "one-token"}),
            _outcome(2, None, None, 0, error="HTTP 503: overloaded")]
    assert outs[0].tpot_ms == pytest.approx(20.0) and outs[1].tpot_ms is None  # (90 - 10) / 4
    assert [o.id for o in outs if M.meets_slo(o, slo)] == good
    assert M.summarize(outs, slo)["good_requests"] == len(good)


def test_a_request_whose_prompt_length_is_unknown_adds_no_input_tokens():
    """(A server that sends no usage leaves prompt_tokens unknown: it is not counted, never guessed.)"""
    known, unknown = _outcome(0, 10.0, 50.0, 3, itl=[20.0] * 2), _outcome(1, 10.0, 50.0, 3, itl=[20.0] * 2)
    unknown = L.Outcome(**{**unknown.__dict__, "prompt_tokens": None})
    s = M.summarize([known, unknown], {})
    assert s["input_tokens"] == 10 and s["output_tokens"] == 6


def test_a_failed_request_sent_first_starts_the_run():
    failed = _outcome(0, None, None, 0, error="HTTP 503: overloaded", t0=0)
    ok = _outcome(1, 10.0, 100.0, 5, itl=[20.0] * 4, t0=100_000_000)
    s = M.summarize([failed, ok], {})
    assert s["duration_s"] == pytest.approx(0.2)
    assert s["output_throughput"] == pytest.approx(5 / 0.2)


def test_the_errors_table_counts_each_repeat():
    outs = [_outcome(i, None, None, 0, error="HTTP 503: overloaded") for i in range(3)]
    outs.append(_outcome(3, None, None, 0, error="mid-stream: boom"))
    assert M.summarize(outs, {})["errors"] == {"HTTP 503: overloaded": 3, "mid-stream: boom": 1}


def test_class_throughputs_are_over_the_runs_duration_and_add_up():
    outs = [_outcome(0, 10.0, 100.0, 4, itl=[30.0] * 3, cls="short"),
            _outcome(1, 10.0, 50.0, 2, itl=[40.0], t0=350_000_000, cls="long")]
    s = M.summarize(outs, {})
    assert s["duration_s"] == pytest.approx(0.4)
    short, long_ = s["classes"]["short"], s["classes"]["long"]
    assert short["duration_s"] == long_["duration_s"] == pytest.approx(0.4)
    assert short["output_throughput"] + long_["output_throughput"] == pytest.approx(s["output_throughput"])


def test_a_request_record_keeps_each_latency_under_its_own_name():
    o = _outcome(0, 19.0, 100.0, 10, itl=[9.0] * 9)
    rec = M.outcome_record(o)
    assert (rec["ttft_ms"], rec["tpot_ms"], rec["e2el_ms"]) == pytest.approx((19.0, 9.0, 100.0))   # (100 - 19) / 9
    assert rec["itl_ms"] == [9.0] * 9 and rec["output_tokens"] == 10
    json.dumps(rec)


def test_an_event_with_two_choices_counts_the_tokens_of_both():
    ev = {"id": "x", "choices": [{"index": 0, "finish_reason": None, "token_ids": [1]},
                                 {"index": 1, "finish_reason": None, "token_ids": [2, 3]}]}
    assert L.plain_token_count(json.dumps(ev).encode()) is None   # left to the full parse
    o = L.Outcome(id="r", scheduled_s=0.0, sent_ns=0)
    L._Stream(o).feed(b"data: " + json.dumps(ev).encode() + b"\n\n")
    assert o.output_tokens == 3 and o.chunk_tokens == [3]


# ------------------------------------------------------------------------------------------ errors, provenance

def test_http_error_text_is_the_servers_message():
    assert L._error_text(503, b'{"error": {"message": "overloaded", "code": 503}}') == "HTTP 503: overloaded"
    assert L._error_text(502, b"bad gateway") == "HTTP 502: bad gateway"


def _health(device="cuda:0", sha="abc", knobs=None):
    return {"device": device, "device_name": "X", "vocab_size": 100, "model_name": "m",
            "model": {"path": "/m", "config_sha256": sha}, "knobs": knobs}


def test_a_run_over_a_cpu_and_a_gpu_endpoint_is_not_gpu_evidence():
    p = L.server_provenance([("http://a", _health("cuda:0")), ("http://b", _health("cpu"))])
    assert p["evidence"] == "cpu-executed" and p["device"]["type"] == "mixed"
    assert L.server_provenance([("http://a", _health("cuda:0")), ("http://b", _health("cuda:1"))]
                               )["evidence"] == "gpu-measured"


def test_one_model_is_not_mixed_and_two_are_when_allowed():
    same = L.server_provenance([("http://a", _health()), ("http://b", _health())])
    assert same["model"]["mixed"] is False and same["model"]["config_sha256"] == "abc"
    assert L.server_provenance([("http://a", _health())])["model"]["mixed"] is False
    two = L.server_provenance([("http://a", _health(sha="abc")), ("http://b", _health(sha="def"))], allow_mixed=True)
    assert two["model"]["mixed"] is True and two["model"]["config_sha256"] is None


def test_knobs_are_recorded_only_when_every_endpoint_agrees():
    k = {"max_num_seqs": 8}
    agree = L.server_provenance([("http://a", _health(knobs=k)), ("http://b", _health(knobs=dict(k)))])
    assert agree["knobs"] == k
    differ = L.server_provenance([("http://a", _health(knobs=k)), ("http://b", _health(knobs={"max_num_seqs": 4}))])
    assert differ["knobs"] is None
    one_silent = L.server_provenance([("http://a", _health(knobs=k)), ("http://b", _health(knobs=None))])
    assert one_silent["knobs"] is None


def test_each_endpoints_split_is_flat_and_the_classes_split_is_over_all_endpoints():
    outs = [_outcome(0, 10.0, 100.0, 4, itl=[30.0] * 3, cls="short", endpoint="http://a"),
            _outcome(1, 10.0, 50.0, 2, itl=[40.0], t0=350_000_000, cls="long", endpoint="http://b")]
    s = M.summarize(outs, {})
    assert [e["url"] for e in s["endpoints"]] == ["http://a", "http://b"]
    assert set(s["classes"]) == {"short", "long"}
    # One level deep: an endpoint's entry is not split again by class (nor a class's by endpoint).
    assert all("classes" not in e and "endpoints" not in e for e in s["endpoints"])
    assert all("classes" not in c and "endpoints" not in c for c in s["classes"].values())
