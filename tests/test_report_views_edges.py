"""The report's lab views and page texts at their edges (labkit/report/views.py, labkit/report/render.py): a spread
of two repeats is shown as a range, the CPU note only for a side that ran on a CPU, the idle share alone is a
profile, a REVIEW logits verdict is explained; the verdict counts most first, the commit's ten characters, the
policy of a load run that says nothing of its server, the how-to for a lab missing one result of several."""
from __future__ import annotations

from types import SimpleNamespace as NS

from labkit.report import render, views


def _status(lab_id="lab", **slots):
    return NS(lab=NS(id=lab_id, title="a lab", evidence="gpu-measured", command="labkit x\nlabkit y", producer=""),
              slots=[NS(label=k, result=None if v is None else NS(data=v)) for k, v in slots.items()])


def _bench(values, key="output_throughput", evidence="gpu-measured", **engine):
    return {"runs": [{key: v} for v in values], "median": {key: sorted(values)[len(values) // 2]},
            "evidence": evidence, "kv_blocks": 100, "config": {"engine": {"kv_cache_dtype": "auto", **engine}}}


def test_two_repeats_show_their_range_and_one_repeat_its_value_alone():
    v = views.speed_and_numbers(_status(A=_bench([100.0, 300.0]), B=_bench([50.0])), draw=False)
    row = dict((r[0], r[1:]) for r in v.rows)["output tok/s, median (min - max)"]
    assert row[0] == "300 (100 - 300, n 2)"
    assert row[1] == "50"


def test_the_cpu_note_comes_from_a_cpu_side_not_from_a_missing_one():
    only_gpu = views.speed_and_numbers(_status(A=_bench([1.0]), B=None), draw=False)
    assert not any("CPU executions" in x for x in only_gpu.lines)
    assert any(x.startswith("Not run yet: B") for x in only_gpu.lines)
    cpu = views.speed_and_numbers(_status(A=_bench([1.0]), B=_bench([1.0], evidence="cpu-executed")), draw=False)
    assert any("CPU executions" in x for x in cpu.lines)


def _logits(verdict):
    return {"verdict": verdict, "suite": "fp8-kv", "what_this_shows": f"words for {verdict}",
            "kv_cost": {"ratio": 2.0, "reference_ratio": 1.5, "text": "cost", "rel_l2": {"fp8": 0.2, "baseline": 0.1},
                        "baseline": {"verdict": "PASS"}, "quantised": {"status": "PASS"}}}


def test_any_logits_verdict_but_pass_is_explained():
    for verdict, explained in (("PASS", False), ("REVIEW", True), ("FAIL", True)):
        v = views.speed_and_numbers(_status(logits=_logits(verdict)), draw=False)
        assert any(x == f"What the check says: words for {verdict}" for x in v.lines) is explained, verdict


def test_an_idle_share_alone_is_a_gpu_profile_in_the_headline():
    before = {**_bench([2.0], key="decode_ms_per_token"), "profile": {"decode_gpu_idle_pct": 12.5}}
    after = {**_bench([1.0], key="decode_ms_per_token"), "profile": {"decode_gpu_idle_pct": 4.0}}
    v = views.kernels_before_after(_status(before=before, after=after), draw=False)
    assert "GPU idle 12.5% -> 4.0%" in v.headline and "no GPU profile" not in v.headline


# ----------------------------------------------------------------------------- render


def test_the_verdict_counts_list_the_most_common_first():
    statuses = [NS(verdict=v) for v in ("FAIL", "PASS", "PASS", "MISSING", "PASS", "MISSING")]
    assert render._counts(statuses) == "3 PASS, 2 MISSING, 1 FAIL"


def test_a_results_commit_is_its_first_ten_characters():
    assert render._commit(NS(git_head="0123456789abcdef", git_dirty=False)) == "0123456789"
    assert render._commit(NS(git_head="0123456789abcdef", git_dirty=True)) == "0123456789 (dirty)"


def test_a_load_run_whose_server_labkit_did_not_start_and_did_not_say_has_no_known_policy():
    assert render.load_policy(NS(data={"config": {"server": {"url": "http://x"}}})) is None
    assert render.load_policy(NS(data={"config": {"server": {"started": True}}})) == "prefill_first"
    assert render.load_policy(NS(data={"config": {"server": {}}, "server": {"policy": "mixed"}})) == "mixed"


def test_a_lab_missing_one_result_of_several_gets_its_how_to():
    partly = _status("half", A={"x": 1}, B=None)
    done = _status("done", A={"x": 1}, B={"x": 2})
    howto = render.missing_howto([partly, done])
    assert [h[0] for h in howto] == ["half"]
    assert howto[0][2] == ["labkit x", "labkit y"]
