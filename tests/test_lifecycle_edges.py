"""`labkit serve lifecycle`'s pure pieces at their edges, no server started: the idle baseline's every key, how a
stream's end is told, each judge's rarer failures (no token, lost step records, nothing sent, a negative exit code,
a stream without [DONE]), the one-line and Markdown views, the step stream's bookkeeping, the sizes of the streams
it sends and its reading of /metrics."""
from __future__ import annotations

import asyncio
import copy

import pytest

from labkit.serve import lifecycle as L

from .test_serve_lifecycle import HELD, _done

HEALTHY = {"status": "ok", "running": 0, "waiting": 0, "live": 0, "queued": 0, "free_blocks": 8, "num_blocks": 8}


def judged(name: str, **changes) -> list[str]:
    o = copy.deepcopy(HELD[name])
    o.update(changes)
    return L.JUDGES[name](o)


@pytest.mark.parametrize("key,words", [("running", "running in the engine"), ("waiting", "waiting in the engine"),
                                       ("live", "open in the frontend"), ("queued", "queued for a first token")])
def test_each_request_count_in_health_keeps_the_server_from_its_baseline(key, words):
    assert L.baseline_problems({**HEALTHY, key: 2}) == [f"2 request(s) {words}"]


def test_how_a_stream_ended_is_told_in_a_few_words():
    assert L.ended({}) == "never answered"
    assert L.ended({"status": None}) == "never answered"
    assert L.ended({"status": 503, "error": "busy"}) == "HTTP 503: busy"
    assert L.ended({"status": 200}) == "cut without a finish reason or an error"
    assert L.ended({"status": 200, "error": "boom", "done": True}) == "error: boom"
    assert L.ended({"status": 200, "error": "boom"}) == "error: boom (no [DONE])"
    assert L.ended({"status": 200, "finish_reason": "length"}) == "length (no [DONE])"


def test_another_request_without_done_did_not_finish_normally():
    assert judged("cancel-running", others=[_done("other", done=False)]) == [
        "the other request other did not finish normally: length (no [DONE])"]


def test_cancel_running_fails_when_the_victim_never_got_a_token():
    v = _done("v", tokens=0, finish_reason=None, done=False)
    assert judged("cancel-running", victim=v) == ["the request to cancel got no token before it was cancelled"]


def test_cancel_waiting_fails_when_the_step_stream_lost_records():
    [problem] = judged("cancel-waiting", engine_tokens=None)
    assert "lost records" in problem and "unknown" in problem


def test_overload_fails_with_nothing_sent_or_health_never_asked():
    assert judged("overload", excess=[]) == ["no excess request was sent"]
    assert judged("overload", health_s=[]) == ["/health was never asked meanwhile"]


def test_slow_consumer_fails_on_the_other_clients_errors_silence_or_a_slow_stream_without_done():
    fast = {"tokens": 32, "errors": ["HTTP 500: boom"], "max_gap_s": 0.1}
    assert judged("slow-consumer", fast=fast) == ["the other client's request failed: HTTP 500: boom"]
    assert judged("slow-consumer", fast={"tokens": 0, "errors": [], "max_gap_s": None}) == [
        "the other client got no token while the slow one paused"]
    [problem] = judged("slow-consumer", slow=_done("slow", done=False))
    assert problem == "the slow client's stream did not end with a reason: length (no [DONE])"


def test_shutdown_fails_on_a_server_killed_by_a_signal_and_on_no_stream_in_flight():
    assert judged("shutdown", exit_code=-9) == ["the server exited -9 after SIGTERM, not 0"]
    assert judged("shutdown", stream=_done("inflight", tokens=0, finish_reason=None, error="x")) == [
        "no stream was in flight when SIGTERM came"]


def test_the_overload_line_gives_the_slowest_health_answer():
    line = L.observed("overload", copy.deepcopy(HELD["overload"]))
    assert "/health max 100 ms over 2 asks" in line


def test_a_bar_in_an_observation_does_not_break_the_markdown_table():
    r = {"verdict": "FAIL", "headline": "0/1 scenarios hold", "device": {"type": "cpu"}, "git_head": "abc",
         "model": {"path": "m"}, "servers": [],
         "scenarios": [{"name": "overload", "verdict": "FAIL", "observed": "a | b"}]}
    [row] = [line for line in L.markdown(r).splitlines() if line.startswith("| overload")]
    assert row == "| overload | FAIL | a / b |"


def _step(t: float, rows: list[tuple]) -> dict:
    rid, tok, kv, reason = (list(c) for c in zip(*rows))
    return {"t": t, "rows": {"request_id": rid, "token_id": tok, "kv_tokens": kv, "finish_reason": reason}}


def test_the_step_stream_counts_tokens_after_a_time_and_names_what_unfinished_rows_hold():
    s = L.Steps("http://unused")
    s._on_step(_step(1.0, [("a", 5, 10, None), ("b", 6, 20, None)]))
    s._on_step(_step(2.0, [("a", 7, 11, None), ("b", 8, 21, "length"), ("c", None, 4, None)]))
    assert s.last_rows == {"a": 11, "c": 4}          # b finished: it holds nothing any more
    assert (s.count("a"), s.count("b"), s.count("c")) == (2, 2, 0)
    assert s.count("a", after=1.0) == 1               # the token booked at that instant is not after it
    s.dropped = True
    assert s.count("a") is None


def test_streams_are_sized_within_the_context_and_the_vocabulary(tmp_path):
    srv = L.Server("main", [], tmp_path)
    srv.rate, srv.max_model_len, srv.vocab_size = 100.0, 512, 1000
    assert srv.tokens_for(60) == 512 - 64 and srv.tokens_for(0.01) == 16
    srv.max_model_len = 4096
    ids = srv.long_prompt()
    assert len(ids) == 4 * 100 * int(L.LONG_PROMPT_S)
    assert min(ids) >= 100 and max(ids) < srv.vocab_size


def test_aborts_are_summed_from_every_line_of_the_metrics_page(tmp_path):
    page = ("# HELP labkit:request_success_total Finished requests by finish reason\n"
            "# TYPE labkit:request_success_total counter\n"
            'labkit:request_success_total{finished_reason="length",model_name="m"} 7.0\n'
            'labkit:request_success_total{finished_reason="abort",model_name="m"} 2.0\n'
            'labkit:request_success_total{finished_reason="abort",model_name="n"} 1.0\n'
            "labkit:engine_steps_total 40.0\n")

    class Client:
        async def get(self, url, timeout=None):
            assert url.endswith("/metrics")
            return type("R", (), {"text": page})()

    assert asyncio.run(L.aborts(Client(), L.Server("main", [], tmp_path))) == 3.0


def test_a_scenario_that_raises_against_a_server_never_started_fails_with_its_reason(tmp_path):
    # (the engine's step raising, say: the scenario fails with what was raised, and the server that does not answer
    # is asked for its exit, which a server never started does not have)
    async def raises(o):
        o["stage"] = "sending the request"
        raise ValueError("bad step")

    r = asyncio.run(L.run_scenario("cancel-running", raises, L.Server("main", [], tmp_path), deadline_s=5))
    assert r["verdict"] == "FAIL" and r["problems"] == ["sending the request: ValueError: bad step"]


def test_a_scenario_broken_on_the_way_ends_at_its_stage_and_keeps_no_stage_in_its_observations(tmp_path):
    async def breaks(o):
        o["stage"] = "waiting for the idle baseline"
        o["others"] = []
        raise L.Broken("the main server was not at its idle baseline")

    async def holds(o):
        o["stage"] = "waiting for the idle baseline"
        o.update(copy.deepcopy(HELD["cancel-running"]))

    srv = L.Server("main", [], tmp_path)
    r = asyncio.run(L.run_scenario("cancel-running", breaks, srv, deadline_s=5))
    assert r["verdict"] == "FAIL" and r["problems"] == ["the main server was not at its idle baseline"]
    assert r["ended_at_stage"] == "waiting for the idle baseline" and "stage" not in r["observations"]
    r = asyncio.run(L.run_scenario("cancel-running", holds, srv, deadline_s=5))
    assert r["verdict"] == "PASS" and r["ended_at_stage"] is None and "stage" not in r["observations"]
