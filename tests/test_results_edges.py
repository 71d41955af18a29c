"""What the report reads from runs/ (labkit/report/results.py) at its edges: the order of the verdicts a lab takes
the worst of; results written before the `verdict` field (PASS only when something was judged, RECORDED when
nothing was); each kind's headline counting what it says it counts; logits collections being inputs, not
results; an excluded folder excluded at any depth; the companion files a result names, found where they are."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.report.results import Unreadable, attach, gather, parse_json_bytes, summarise, worst


def _sum(d: dict, name: str = "runs/r.json"):
    return summarise(Path(name), name, {"evidence": "cpu-executed", **d})


def test_a_lab_takes_the_worst_verdict_in_the_documented_order():
    """FAIL, UNREADABLE, MISSING, REVIEW, CHANGED, RECORDED, PASS: an unreadable result is worse than a missing one
    (it ran and cannot be read), and any pair is ordered the same way whichever comes first."""
    order = ["FAIL", "UNREADABLE", "MISSING", "REVIEW", "CHANGED", "RECORDED", "PASS"]
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            assert worst([a, b]) == worst([b, a]) == a, (a, b)
    assert worst([]) == "MISSING"


def test_a_trace_without_a_verdict_is_pass_only_when_it_was_judged():
    base = {"command": "trace", "passed": True, "case": "chunk", "steps": 3}
    assert _sum({**base, "judged": True}).verdict == "PASS"
    assert _sum({**base, "judged": False}).verdict == "RECORDED"
    assert _sum(base).verdict == "RECORDED"
    assert _sum({**base, "passed": False}).verdict == "FAIL"
    with pytest.raises(Unreadable, match="no `verdict` and no `passed`"):
        _sum({"command": "trace", "case": "chunk"})


def test_a_trace_headline_counts_every_check_that_ran_failed_ones_included():
    d = {"command": "trace", "passed": False, "judged": True, "case": "B", "steps": 7,
         "report": {"counts": {"invariant": {"passed": 30, "failed": 2}, "expect": {"passed": 5, "failed": 1}},
                    "first_failure": {"step": 4, "message": "slot reused"}}}
    r = _sum(d)
    assert r.verdict == "FAIL"
    assert r.headline == "case B, 7 steps, 35/38 checks hold; first failure at step 4: slot reused"


def test_a_live_trace_counts_its_invariant_and_policy_checks_only():
    d = {"command": "trace", "live": True, "passed": True, "url": "http://h:1", "first_step": 1, "last_step": 2,
         "steps": 2, "seconds": 1.0, "policy": "mixed", "tp": 1, "live_at_open": 0,
         "report": {"counts": {"invariant": {"passed": 10, "failed": 0}, "policy": {"passed": 4, "failed": 1},
                               "expect": {"passed": 100, "failed": 50}}}}
    r = _sum(d)
    assert r.kind == "Live traces (trace --url)"
    assert "14/15 invariant checks hold" in r.headline, r.headline


def test_the_logits_headline_counts_review_and_fail_rows_apart():
    d = {"command": "logits-check compare", "verdict": "REVIEW", "suite": "baseline",
         "summary": {"rows": 15, "passed": 11, "review": 3, "failed": 1, "top1_agree": 14,
                     "worst_max_abs": {"value": 0.25}, "worst_rel_l2": {"value": 0.0125}}}
    r = _sum(d)
    assert (r.kind, r.verdict) == ("Logits checks", "REVIEW")
    assert r.headline == "suite baseline: 15 rows (review 3, fail 1), worst max-abs 0.25, rel-L2 0.0125, top-1 14/15"


def test_an_old_bench_result_is_recorded_not_passed():
    d = {"command": "bench", "status": "ok", "backend": "engine", "execution": "graph", "workload": {"name": "nano"},
         "median": {"output_throughput": 1234.5}, "runs": [{}, {}, {}]}
    r = _sum(d)
    assert r.verdict == "RECORDED"
    assert r.headline == "nano via engine (graph): 1,234.5 output tok/s, median of 3"
    assert _sum({**d, "status": "error"}).verdict == "FAIL"


def test_a_load_result_names_its_policy_under_the_flags_old_name_too():
    base = {"command": "bench load", "status": "ok", "metrics": {"completed": 4, "requests": 4},
            "config": {"source": {"arrivals": "poisson"}}}
    for server in ({"--scheduling-policy": "mixed"}, {"--policy": "mixed"}):
        r = _sum({**base, "config": {**base["config"], "server": server}})
        assert r.headline.startswith("poisson (policy mixed): 4/4 done"), (server, r.headline)


def test_the_shapes_headline_counts_the_shapes_that_agree():
    checks = [{"passed": True}, {"passed": False}, {"passed": True}]
    r = _sum({"command": "shapes", "passed": False, "tensor_parallel_size": 2, "source": "tiny", "checks": checks})
    assert r.verdict == "FAIL" and r.headline == "tp 2, tiny: 2/3 shapes agree with the engine"
    static = _sum({"command": "shapes", "passed": True, "tensor_parallel_size": 2, "source": "tiny"})
    assert static.verdict == "RECORDED" and static.headline.endswith("static table (no --check)")


@pytest.mark.parametrize("status", ["PASS", "FAIL"])
def test_an_old_smoke_result_carries_its_status_as_its_verdict(status):
    r = _sum({"command": "smoke", "status": status, "token_ids": [1, 2]})
    assert r.verdict == status and r.headline == "token ids [1, 2]"
    with pytest.raises(Unreadable, match="is not a verdict"):
        _sum({"command": "smoke", "status": "ok"})


def test_the_lifecycle_headline_names_the_first_scenario_that_did_not_pass():
    scenarios = [{"name": "cancel", "verdict": "PASS"}, {"name": "slow", "verdict": "REVIEW", "observed": "gap 2.1 s"},
                 {"name": "crash", "verdict": "FAIL", "observed": "hung"}]
    r = _sum({"command": "serve lifecycle", "verdict": "FAIL", "scenarios": scenarios})
    assert r.headline == "1/3 scenarios hold: cancel PASS, slow REVIEW, crash FAIL; slow: gap 2.1 s"


def _write(path: Path, d) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(d))


def test_collections_are_inputs_and_an_excluded_folder_is_excluded_at_any_depth(tmp_path):
    smoke = {"command": "smoke", "evidence": "cpu-executed", "status": "PASS"}
    _write(tmp_path / "a.json", smoke)
    for backend in ("engine", "hf"):
        _write(tmp_path / "logits-baseline" / f"{backend}.json",
               {"command": f"logits-check collect --backend {backend}", "evidence": "cpu-executed",
                "kind": "logits-collection", "status": "COLLECTED"})
    _write(tmp_path / "report" / "manifest.json", smoke)
    _write(tmp_path / "report" / "deep" / "er" / "x.json", smoke)
    g = gather(tmp_path, exclude=tmp_path / "report")
    assert [r.rel for r in g.results] == ["a.json"] and g.unreadable == [] and g.other == []


def test_a_companion_file_is_found_beside_the_result_or_at_its_recorded_path(tmp_path):
    """bench load's records at the path its `files` records (not beside it); trace check's event log under the
    name its `log` gives, beside the result."""
    runs, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    (elsewhere).mkdir()
    (elsewhere / "load.requests.jsonl").write_text('{"id": 1}\n{"id": 2}\n')
    _write(runs / "load.json", {"command": "bench load", "evidence": "cpu-executed", "status": "ok",
                                "files": {"requests": str(elsewhere / "load.requests.jsonl")}})
    (runs / "check-log.jsonl").write_text('{"not": "an event"}\n')  # read, and reported as unreadable
    _write(runs / "check.json", {"command": "trace check", "evidence": "cpu-executed", "passed": True, "judged": True,
                                 "log": "/gone/check-log.jsonl"})
    g = gather(runs)
    attach(g, runs)
    by = {r.rel: r for r in g.results}
    assert by["load.json"].attached["requests"] == [{"id": 1}, {"id": 2}]
    # trace check's log, named by its `log` (moved with runs/): found beside the result, read, its fault reported.
    assert [rel for rel, _ in g.unreadable] == ["check-log.jsonl"], g.unreadable


@pytest.mark.parametrize("text", ['[1, 2,]', '{"a": 1,}'])
def test_a_broken_file_that_ends_properly_is_not_called_truncated(text):
    with pytest.raises(Unreadable) as err:
        parse_json_bytes(text.encode())
    assert "not valid JSON" in str(err.value) and "truncated" not in str(err.value)
    with pytest.raises(Unreadable, match="looks truncated"):
        parse_json_bytes(text[:-1].encode())


def test_the_device_column_shows_the_gpu_name_before_the_type():
    d = {"command": "smoke", "status": "PASS"}
    assert _sum({**d, "device": {"type": "cuda", "name": "NVIDIA H100"}}).device == "NVIDIA H100"
    assert _sum({**d, "device": {"type": "cpu"}}).device == "cpu"
    assert _sum({**d, "device": "cuda", "git_head": 12}).device is None
    assert _sum({**d, "git_head": 12}).git_head is None
