"""report.md / the report command at their edges: the labs' count line, policy pictures, which policy a load run
used, where --out may be, and how a long command is broken for the screen."""
from __future__ import annotations

from types import SimpleNamespace

from labkit.report import render
from labkit.report.command import command_screen_lines

from .helpers import run_cli


def test_the_labs_line_lists_the_commonest_verdict_first():
    statuses = [SimpleNamespace(verdict=v) for v in ("PASS", "MISSING", "MISSING", "MISSING", "PASS", "FAIL")]
    assert render._counts(statuses) == "3 MISSING, 2 PASS, 1 FAIL"


def _load_run(policy):
    return SimpleNamespace(command="bench load", rel=f"load-{policy}.json",
                           data={"config": {"server": {"--scheduling-policy": policy}}, "metrics": {"x": 1.0}})


def test_a_lab_with_runs_under_one_policy_has_no_comparison_picture():
    status = SimpleNamespace(lab=SimpleNamespace(id="load-policies"), results=[_load_run("fcfs"), _load_run("fcfs")])
    assert render.lab_pictures([status]) == []


def test_a_started_server_without_a_policy_flag_ran_the_default_policy():
    started = SimpleNamespace(data={"config": {"server": {"started": True}}})
    not_ours = SimpleNamespace(data={"config": {"server": {}}})
    given = SimpleNamespace(data={"config": {"server": {"--scheduling-policy": "decode_first", "started": True}}})
    assert render.load_policy(started) == "prefill_first"
    assert render.load_policy(not_ours) is None
    assert render.load_policy(given) == "decode_first"


def test_the_report_refuses_to_write_into_the_runs_folder_itself(tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    code, _, err = run_cli(["report", "--runs", str(runs), "--out", str(runs)], capsys)
    assert code == 2 and "would hold the results" in err
    assert not (runs / "report.md").exists()


def test_a_command_that_fits_the_width_stays_on_one_line():
    line = "labkit abc --x y"   # 16 characters
    assert command_screen_lines(line, 18) == [line]
    assert command_screen_lines(line, 80) == [line]
    broken = command_screen_lines("labkit bench --workload some-long-name --out runs/x", 30)
    assert len(broken) > 1 and all(part.endswith(" \\") for part in broken[:-1])


def test_a_report_is_as_strong_as_its_weakest_result(tmp_path, capsys):
    import json

    runs = tmp_path / "runs"
    runs.mkdir()
    for name, evidence in (("a", "gpu-measured"), ("b", "cpu-executed"), ("c", "gpu-measured")):
        (runs / f"{name}.json").write_text(json.dumps({"command": "something else", "evidence": evidence,
                                                       "device": {"type": "cpu"}}))
    code, _, err = run_cli(["report", "--runs", str(runs), "--out", str(tmp_path / "rep"), "--json"], capsys)
    assert code == 0, err
    manifest = json.loads((tmp_path / "rep" / "manifest.json").read_text())
    assert manifest["evidence"] == "cpu-executed"


def test_a_lab_missing_one_of_its_results_gets_its_commands_listed():
    lab = SimpleNamespace(id="lab-x", evidence="cpu-executed", command="labkit a\nlabkit b\n", producer=None)
    half = SimpleNamespace(lab=lab, slots=[SimpleNamespace(result=object()), SimpleNamespace(result=None)])
    full = SimpleNamespace(lab=lab, slots=[SimpleNamespace(result=object())])
    assert render.missing_howto([half]) == [("lab-x", "cpu-executed", ["labkit a", "labkit b"], "")]
    assert render.missing_howto([full]) == []


def test_one_unreadable_file_is_named_without_an_and_more(tmp_path, capsys):
    import json

    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "good.json").write_text(json.dumps({"command": "something else", "evidence": "cpu-executed"}))
    (runs / "bad.json").write_text(json.dumps({"command": 5}))
    code, _, err = run_cli(["report", "--runs", str(runs), "--out", str(tmp_path / "rep"), "--json"], capsys)
    assert code == 1
    assert "bad.json is UNREADABLE" in err and "more)" not in err
