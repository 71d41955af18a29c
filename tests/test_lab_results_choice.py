"""Which results answer a lab (labkit/report/plan.py, status.py): a slot takes a result only when every condition
holds, `null` among the accepted values taking a field absent or null (an option left at its default is written
either way); a result of exactly the evidence the lab needs is enough; among the results a slot takes, stronger
evidence wins over a command line nearer the lab's; a live trace is a kind of its own; an integer of at most
MAX_INT_DIGITS digits, either sign, is read, one more digit makes the file unreadable."""
from __future__ import annotations

from pathlib import Path

import pytest

from labkit.report.plan import parse
from labkit.report.results import MAX_INT_DIGITS, Unreadable, parse_json_bytes, summarise
from labkit.report.status import assign


def _lab(match: dict, evidence: str = "cpu-executed", command: str = "labkit bench"):
    lab = {"id": "x", "title": "X", "command": command, "evidence": evidence,
           "results": [{"label": "r", "match": match}]}
    return parse({"labs": [lab]}, "plan").pop()


def _slot(match: dict):
    return _lab(match).slots[0]


def _result(name: str, evidence: str, argv: list[str] | None = None, started: str = "2026-01-01T00:00:00"):
    d = {"command": "smoke", "evidence": evidence, "status": "PASS", "started_at": started}
    if argv is not None:
        d["argv"] = argv
    return summarise(Path(name), name, d)


def test_null_accepts_a_field_absent_or_null_and_only_those_besides_the_values_listed():
    slot = _slot({"command": "bench load", "config.server.--scheduling-policy": ["prefill_first", None]})
    for server, ok in (({}, True), ({"--scheduling-policy": None}, True), ({"--scheduling-policy": "prefill_first"},
                       True), ({"--scheduling-policy": "mixed"}, False)):
        data = {"command": "bench load", "config": {"server": server}}
        assert slot.accepts(data, "runs/a.json") is ok, server
    assert not slot.accepts({"command": "bench", "config": {"server": {}}}, "runs/a.json")   # every condition


def test_a_result_of_exactly_the_evidence_needed_is_enough_and_a_weaker_one_is_short():
    lab = _lab({"command": "smoke"}, evidence="cpu-executed", command="labkit smoke")
    for have, short in (("gpu-measured", False), ("cpu-executed", False), ("static-estimate", True)):
        (status,) = assign([lab], [_result("runs/a.json", have)])
        assert status.evidence == have and status.evidence_short is short, have


def test_stronger_evidence_wins_over_a_nearer_command_line():
    lab = _lab({"command": "smoke"}, evidence="cpu-executed", command="labkit smoke --device cpu")
    near = _result("runs/near.json", "cpu-executed", ["labkit", "smoke", "--device", "cpu"], "2026-01-02T00:00:00")
    far = _result("runs/far.json", "gpu-measured", ["labkit", "smoke", "--device", "cuda", "--tp", "2"])
    (status,) = assign([lab], [near, far])
    assert status.slots[0].result.rel == "runs/far.json"
    (status,) = assign([lab], [near, _result("runs/far.json", "cpu-executed", ["labkit", "smoke", "--tp", "2"])])
    assert status.slots[0].result.rel == "runs/near.json"     # (same evidence: the nearer line)


def test_a_live_trace_is_its_own_kind_of_result_with_its_own_headline():
    d = {"command": "trace", "live": True, "evidence": "cpu-executed", "passed": True, "url": "http://h:1",
         "first_step": 4, "last_step": 9, "steps": 6, "seconds": 2.0, "policy": "mixed", "tp": 1, "live_at_open": 3,
         "report": {"counts": {"invariant": {"passed": 40, "failed": 0}, "expect": {"passed": 5, "failed": 0}}}}
    r = summarise(Path("runs/live.json"), "runs/live.json", d)
    assert r.kind == "Live traces (trace --url)" and r.verdict == "PASS"
    assert r.headline.startswith("http://h:1: steps 4-9 (6)") and "40/40 invariant checks hold" in r.headline
    case = summarise(Path("runs/c.json"), "runs/c.json", {**d, "live": False, "case": "chunk", "judged": True})
    assert case.kind == "Traced cases" and case.headline.startswith("case chunk")


@pytest.mark.parametrize("sign", ["", "-"])
def test_an_integer_of_max_int_digits_is_read_and_one_more_digit_is_not(sign):
    at_limit = sign + "9" * MAX_INT_DIGITS
    assert parse_json_bytes(f'{{"x": {at_limit}}}'.encode()) == {"x": int(at_limit)}
    with pytest.raises(Unreadable, match=f"an integer of {MAX_INT_DIGITS + 1} digits"):
        parse_json_bytes(f'{{"x": {sign}1{"0" * MAX_INT_DIGITS}}}'.encode())


def test_of_two_runs_with_the_labs_options_the_one_written_where_its_line_writes_is_its_own():
    """The H200 lab plan (session 13): bench-offline's `bench --workload nano --repeats 3` (default place) and
    fp8-kv's same bench with `--out runs/bench-nano-kv-auto.json` (run later) both have the lab's options, --out
    being neutral; bench-offline showed fp8-kv's as the newer. Each lab shows the one its own line writes."""
    offline = _lab({"command": "smoke"}, command="labkit bench --workload nano --device cuda --repeats 3")
    fp8 = _lab({"command": "smoke"},
               command="labkit bench --workload nano --repeats 3 --out runs/bench-nano-kv-auto.json")
    own = _result("runs/bench-nano-engine-graph-repeats-3.json", "gpu-measured",
                  ["/x/labkit/__main__.py", "bench", "--workload", "nano", "--device", "cuda", "--repeats", "3"],
                  "2026-12-03T19:14:00")
    other = _result("runs/bench-nano-kv-auto.json", "gpu-measured",
                    ["/x/labkit/__main__.py", "bench", "--workload", "nano", "--repeats", "3", "--out",
                     "/tmp/labs/runs/bench-nano-kv-auto.json"], "2026-12-03T19:16:00")
    for lab, want in ((offline, own), (fp8, other)):
        (status,) = assign([lab], [own, other])
        assert status.slots[0].result.rel == want.rel, lab.command
        assert "written where the lab's command writes" in status.which()
