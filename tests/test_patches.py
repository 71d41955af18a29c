"""Every shipped patch applies to the engine at HEAD and every fault names a check; `labkit patch prove`
passes a caught fault and fails one its check cannot see. (That every shipped fault is caught is
`labkit patch prove --all`, which .ci/run runs after the tests.)"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from labkit.errors import LabkitError
from labkit.patch import index
from labkit.patch_prove import parse_check

from .helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
PATCHES = sorted((REPO / "patches").glob("*.patch"))


def test_the_index_lists_every_patch_and_every_fault_names_its_check():
    text = (REPO / "patches" / "README.md").read_text()
    listed = set(re.findall(r"^\| ([\w.-]+\.patch) \|", text, flags=re.M))
    assert listed == {p.name for p in PATCHES}
    faults = [e for e in index() if e.kind == "fault"]
    assert len(faults) >= 10
    for e in faults:
        spec = parse_check(e.caught_by, e.name)
        if spec.kind == "trace":
            assert (REPO / "workloads" / "cases" / f"{spec.args[0]}.yaml").is_file(), e.name
        if spec.kind == "test":
            assert (REPO / spec.args[0].split("::")[0]).is_file(), e.name


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.stem)
def test_patch_applies(patch):
    res = subprocess.run(["git", "apply", "--check", str(patch)], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_check_specs_are_parsed_strictly():
    assert parse_check("`trace C slots`", "p").args == ("C", "slots")
    assert parse_check("test tests/test_x.py::t", "p").kind == "test"
    for bad in ("", "-", "trace C", "logits", "bench nano"):
        with pytest.raises(LabkitError, match="patch prove: p"):
            parse_check(bad, "p")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A copy of the project outside any git checkout, with two faults of its own: one its check catches,
    one (a comment) that changes nothing, so its check cannot catch it; and a fault without a check."""
    root = tmp_path / "proj"
    for part in ("engine", "labkit", "workloads", "tests"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "patches").mkdir()
    shutil.copy(REPO / "patches" / "fault-slot-off-by-one.patch", root / "patches")
    runner = (root / "engine" / "runner.py").read_text()
    (root / "patches" / "fault-harmless.patch").write_text(_comment_patch(runner))
    shutil.copy(REPO / "patches" / "exp-chunk-any-sequence.patch", root / "patches")
    (root / "patches" / "README.md").write_text(
        "| patch | kind | what | how | caught by |\n| --- | --- | --- | --- | --- |\n"
        "| fault-slot-off-by-one.patch | fault | slot + 1 | trace | `trace A slots` |\n"
        "| fault-harmless.patch | fault | a comment | nothing | `trace A slots` |\n"
        "| exp-chunk-any-sequence.patch | experiment | chunks | trace | - |\n")
    monkeypatch.setenv("LAB_ROOT", str(root))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.setenv("RUNS_DIR", str(tmp_path / "runs"))
    return root


def _comment_patch(runner: str) -> str:
    import difflib

    line = "    def step_inputs(self, plan: BatchPlan) -> StepInputs:\n"
    after = runner.replace(line, line + "        # a comment changes no behaviour\n")
    diff = difflib.unified_diff(runner.splitlines(keepends=True), after.splitlines(keepends=True),
                                "a/engine/runner.py", "b/engine/runner.py")
    return "diff --git a/engine/runner.py b/engine/runner.py\n" + "".join(diff)


@pytest.mark.slow
def test_prove_passes_a_caught_fault_and_fails_an_uncaught_one(project, tmp_path, capsys):
    code, out, err = run_cli(["patch", "prove", "--all", "--out", str(tmp_path / "p")], capsys)
    text = " ".join(out.split())
    assert code == 1, out + err
    proofs = {p["patch"]: p for p in json.loads((tmp_path / "p" / "prove.json").read_text())["proofs"]}
    assert set(proofs) == {"fault-slot-off-by-one", "fault-harmless"}    # experiments are not proved
    caught, harmless = proofs["fault-slot-off-by-one"], proofs["fault-harmless"]
    assert caught["result"] == "CAUGHT" and caught["clean"]["rc"] == 0 and caught["patched"]["rc"] == 1
    assert "slots" in caught["patched"]["failed"]
    assert harmless["result"] == "NOT CAUGHT" and harmless["patched"]["rc"] == 0
    assert "1 of 2 fault patch(es) proven caught" in text and "FAIL" in text
    assert "copy of engine/ as found" in text       # no git: the baseline is the engine as it is


def test_prove_refuses_what_it_cannot_prove(project, tmp_path, capsys):
    code, _, err = run_cli(["patch", "prove", "exp-chunk-any-sequence"], capsys)
    assert code == 2 and "not a fault" in err
    code, _, err = run_cli(["patch", "prove"], capsys)
    assert code == 2 and "--all" in err
    readme = project / "patches" / "README.md"
    readme.write_text(readme.read_text().replace("`trace A slots` |\n| fault-harmless", "- |\n| fault-harmless"))
    code, out, _ = run_cli(["patch", "prove", "fault-slot-off-by-one", "--out", str(tmp_path / "p")], capsys)
    proof = json.loads((tmp_path / "p" / "prove.json").read_text())["proofs"][0]
    assert code == 1 and proof["result"] == "NO CHECK" and "names no check" in proof["why"]


def test_a_trace_check_must_fail_the_invariant_the_index_names():
    from labkit.patch_prove import CheckRun, Proof, judge

    spec = parse_check("trace C slots", "p")
    proof = Proof("p", spec.text, clean=CheckRun(0, 1.0), patched=CheckRun(1, 1.0, failed=["inputs.positions"]))
    judge(proof, spec)
    assert proof.result == "NOT CAUGHT" and "names invariant slots" in proof.why
    proof.patched = CheckRun(1, 1.0, failed=["slots"], detail="step 2 ...")
    judge(proof, spec)
    assert proof.result == "CAUGHT"
    proof.clean = CheckRun(1, 1.0, detail="x")
    judge(proof, spec)
    assert proof.result == "BASELINE FAILS"
    proof.clean, proof.patched = CheckRun(0, 1.0), CheckRun(2, 1.0, detail="could not run (exit 2): boom")
    judge(proof, spec)
    assert proof.result == "NOT CAUGHT" and "could not run" in proof.why
