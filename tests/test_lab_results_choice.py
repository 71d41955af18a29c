"""Which results answer a lab (labkit/report/plan.py, status.py): a slot takes a result only when every condition
holds, `null` among the accepted values taking a field absent or null (an option left at its default is written
either way); a result of exactly the evidence the lab needs is enough; among the results a slot takes, stronger
evidence wins over a command line nearer the lab's."""
from __future__ import annotations

from pathlib import Path

from labkit.report.plan import parse
from labkit.report.results import summarise
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
