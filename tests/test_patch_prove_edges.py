"""`labkit patch prove`: how a proof is judged, how its runs are shown, and the overall verdict and exit code."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from labkit import patch, patch_prove
from labkit.errors import LabkitError
from labkit.patch_prove import CheckRun, CheckSpec, Proof

from .helpers import run_cli

REPO = Path(__file__).resolve().parents[1]


def _judged(spec: CheckSpec, clean_rc, patched_rc, failed=()):
    proof = Proof("p", spec.text, clean=CheckRun(clean_rc, 1.0), patched=CheckRun(patched_rc, 1.0, list(failed),
                                                                                   "boom"))
    patch_prove.judge(proof, spec)
    return proof


def test_a_check_that_cannot_run_on_the_patched_tree_is_not_a_catch():
    # exit 2 = the check could not run (a usage error), not a failed check: the fault is not proven caught.
    spec = CheckSpec("test", ("tests/test_x.py::t",))
    assert _judged(spec, 0, 2).result == "NOT CAUGHT"
    assert _judged(spec, 0, 1).result == "CAUGHT"
    assert _judged(spec, 1, 1).result == "BASELINE FAILS"


def test_a_trace_catch_must_fail_the_invariant_the_index_names():
    spec = CheckSpec("trace", ("C", "slots"))
    assert _judged(spec, 0, 1, ["slots"]).result == "CAUGHT"
    other = _judged(spec, 0, 1, ["refs"])
    assert other.result == "NOT CAUGHT" and "slots" in other.why


@pytest.mark.parametrize("text", ["test a b", "trace C", "trace C slots extra", "logits"])
def test_a_check_with_the_wrong_number_of_arguments_is_refused(text):
    with pytest.raises(LabkitError):
        patch_prove.parse_check(text, "p.patch")


def test_run_cells_name_pass_fail_timeout_and_other_exits():
    assert patch._run_cell(None) == "-"
    assert patch._run_cell(CheckRun(0, 2.0)).startswith("passes")
    assert patch._run_cell(CheckRun(1, 2.0)).startswith("fails")
    assert patch._run_cell(CheckRun(2, 2.0)).startswith("exit 2")
    assert patch._run_cell(CheckRun(None, 2.0)).startswith("timed out")


def test_a_check_that_exits_2_is_reported_as_could_not_run(tmp_path):
    # pytest exits 2 when a test run is interrupted: the check did not run to a verdict.
    interrupted = tmp_path / "test_interrupted.py"
    interrupted.write_text("def test_x():\n    raise KeyboardInterrupt\n")
    spec = CheckSpec("test", (str(interrupted),))
    run = patch_prove.run_check(spec, REPO, Path("/nonexistent-model"), tmp_path / "out", patched=False)
    assert run.rc == 2
    assert run.detail.startswith("could not run (exit 2)")


@pytest.fixture
def project(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    for part in ("engine", "patches", "workloads"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("LAB_ROOT", str(root))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.setenv("RUNS_DIR", str(tmp_path / "runs"))
    return root


def _fake_prove(results):
    def prove(entries, root, model, work, jobs, progress=None):
        proofs = [Proof(e.name[:-6], e.caught_by, CheckRun(0, 1.0), CheckRun(1, 1.0), results[i % len(results)], "w")
                  for i, e in enumerate(entries)]
        return proofs, {"engine_source": "copy", "commit": None, "checks_from": str(root), "note": None}
    return prove


@pytest.mark.parametrize("results, code, verdict", [(["CAUGHT"], 0, "PASS"), (["CAUGHT", "NOT CAUGHT"], 1, "FAIL")])
def test_prove_passes_only_when_every_fault_is_caught(project, tmp_path, monkeypatch, capsys, results, code, verdict):
    faults = [e for e in patch.index() if e.kind == "fault"]
    assert len(faults) >= 2
    monkeypatch.setattr(patch_prove, "prove", _fake_prove(results))
    import labkit.model
    monkeypatch.setattr(labkit.model, "resolve_model", lambda m: tmp_path)
    out = tmp_path / "prove-out"
    got, _, err = run_cli(["patch", "prove", "--all", "--out", str(out)], capsys)
    assert got == code, err
    assert json.loads((out / "prove.json").read_text())["verdict"] == verdict


def test_the_check_column_of_the_index_is_what_a_fault_is_caught_by(tmp_path, monkeypatch):
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "f.patch").write_text("")
    (tmp_path / "patches" / "README.md").write_text(
        "| patch | kind | what | how | caught by |\n| --- | --- | --- | --- | --- |\n"
        "| f.patch | fault | breaks x | see x | `test tests/t.py::a` |\n")
    monkeypatch.setenv("LAB_ROOT", str(tmp_path))
    [e] = patch.index()
    assert (e.kind, e.what, e.how, e.caught_by) == ("fault", "breaks x", "see x", "test tests/t.py::a")


def test_a_trace_proof_names_the_failed_invariants_not_the_policy_rules(tmp_path):
    check = tmp_path / "check.json"
    check.write_text(json.dumps({"report": {"verdict": "FAIL", "checks": [
        {"ok": False, "kind": "policy", "name": "prefill-first", "message": "policy says no"},
        {"ok": True, "kind": "invariant", "name": "refs", "message": "fine"},
        {"ok": False, "kind": "invariant", "name": "slots", "message": "slot 3 in the wrong block"}]}}))
    assert patch_prove._trace_outcome(check) == (["slots"], "slot 3 in the wrong block")
