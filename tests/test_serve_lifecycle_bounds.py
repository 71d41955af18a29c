"""`labkit serve lifecycle`'s judges exactly at their bounds: a bound is the most that still holds (an excess
request answered in HEALTH_MAX_S, a gap of GAP_MAX_S while the slow client pauses), and a request that ended on a
stop sequence / EOS ("stop") finished as normally as one that reached max_tokens ("length")."""
from __future__ import annotations

from labkit.serve import lifecycle as L

IDLE = {"ok": True, "seconds": 0.2, "problems": [], "holders": {}}
# The documented bounds, written out (lifecycle.py's module docstring and constants).
HEALTH_MAX_S = 1.0
GAP_MAX_S = 1.5


def _done(rid: str, **kw) -> dict:
    return {"rid": rid, "status": 200, "tokens": 8, "chunks": 8, "finish_reason": "length", "error": None,
            "done": True, **kw}


def test_an_excess_request_answered_in_exactly_the_bound_holds():
    o = {"queue_full": True, "health_s": [0.01, HEALTH_MAX_S], "health_errors": 0,
         "excess": [{"status": 503, "type": "overloaded_error", "seconds": HEALTH_MAX_S}] * 4,
         "others": [_done("ahead")], "baseline": IDLE}
    assert L.judge_overload(o) == []
    o["excess"] = [{"status": 503, "type": "overloaded_error", "seconds": HEALTH_MAX_S + 0.01}] * 4
    assert L.judge_overload(o) == [f"4 excess requests waited over {HEALTH_MAX_S:g} s for their answer"]


def test_a_gap_of_exactly_the_bound_holds():
    o = {"fast": {"tokens": 100, "errors": [], "max_gap_s": GAP_MAX_S}, "slow": _done("slow"), "baseline": IDLE}
    assert L.judge_slow_consumer(o) == []
    o["fast"]["max_gap_s"] = GAP_MAX_S + 0.01
    assert "stopped for 1.51 s" in L.judge_slow_consumer(o)[0]


def test_a_request_that_ended_on_stop_finished_normally():
    o = {"victim": _done("v", tokens=3, finish_reason=None, done=False), "abort_counted": True, "late_tokens": 0,
         "others": [_done("other", finish_reason="stop")], "baseline": IDLE}
    assert L.judge_cancel_running(o) == []
    o["others"] = [_done("other", finish_reason=None, done=False)]
    assert L.judge_cancel_running(o)[0].startswith("the other request other did not finish normally")


def test_the_idle_baseline_needs_every_kv_block_free_and_counted():
    idle = {"status": "ok", "running": 0, "waiting": 0, "live": 0, "queued": 0, "free_blocks": 8, "num_blocks": 8}
    assert L.baseline_problems(idle) == []
    assert L.baseline_problems({**idle, "free_blocks": 6}) == ["2 of 8 KV blocks in use"]
    blind = {k: v for k, v in idle.items() if k not in ("free_blocks", "num_blocks")}
    assert L.baseline_problems(blind) == ["/health gives no KV block counts (free_blocks, num_blocks)"]
