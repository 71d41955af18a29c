"""`labkit trace` end to end on the tiny model: every shipped case passes, wrong expectations and
tampered logs fail with named steps, the Perfetto file is valid, `trace check` agrees."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from labkit.trace.cases import list_cases, load_case
from labkit.trace.events import read_jsonl
from labkit.trace.run import run_case
from labkit.trace.validate import validate

REPO = Path(__file__).resolve().parents[1]


def _labkit(*args, env_extra=None, cwd=REPO):
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=600)


@pytest.mark.parametrize("name", list_cases())
def test_every_case_passes_through_the_engine(name, tiny_model, tmp_path):
    case = load_case(name)
    run = run_case(case, Path(tiny_model), tmp_path / "events.jsonl", device="cpu")
    report = validate(run.events, case)
    assert report.ok, report.first_failure.message if report.first_failure else report.summary()
    # What went to disk is what was validated.
    assert validate(read_jsonl(tmp_path / "events.jsonl"), case).ok


def test_cli_case_with_a_wrong_expectation_fails_naming_it(tiny_model, tmp_path):
    data = yaml.safe_load((REPO / "workloads/cases/chunk.yaml").read_text())
    for entry in data["expect"]:
        if entry.get("step") == 2:
            entry["after"]["A"]["cached"] = 699  # the truth is 700
    bad = tmp_path / "chunk-wrong.yaml"
    bad.write_text(yaml.safe_dump(data))
    # --no-expect-changes: judged strictly whatever state the checkout's engine/ is in (an edit, a merge)
    res = _labkit("trace", "--case", str(bad), "--model", tiny_model, "--device", "cpu", "--out", str(tmp_path / "o"),
                  "-q", "--no-expect-changes")
    assert res.returncode == 1, res.stdout + res.stderr
    text = " ".join(res.stdout.split())
    assert "step 2" in text and "A" in text and "cached" in text and "699" in text and "700" in text
    check = json.loads((tmp_path / "o" / "check.json").read_text())
    assert check["passed"] is False and check["command"] == "trace"


def test_cli_writes_log_tsv_check_and_perfetto(tiny_model, tmp_path):
    perfetto = tmp_path / "trace.perfetto.json"
    res = _labkit("trace", "--case", "preempt", "--model", tiny_model, "--device", "cpu", "--out", str(tmp_path / "o"),
                  "--perfetto", str(perfetto))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "preempt" in res.stdout
    out = tmp_path / "o"
    check = json.loads((out / "check.json").read_text())
    for key in ("command", "argv", "versions", "device", "model", "git_head", "started_at", "ended_at", "evidence"):
        assert key in check
    assert check["evidence"] == "cpu-executed" and check["passed"] is True
    tsv = (out / "steps.tsv").read_text().splitlines()
    assert tsv[0].split("\t")[:3] == ["step", "phase", "request_id"] and len(tsv) > 5
    trace = json.loads(perfetto.read_text())
    events = trace["traceEvents"]
    assert {e["ph"] for e in events} >= {"M", "X", "C", "i"}
    for e in events:
        assert "ph" in e and "pid" in e and "name" in e
        if e["ph"] in ("X", "C", "i"):
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] > 0
    lanes = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any(name.startswith("C ") for name in lanes)
    assert any(e["name"] == "preempted" for e in events)
    # trace check agrees with the live run
    res = _labkit("trace", "check", str(out / "events.jsonl"), "--case", "preempt")
    assert res.returncode == 0, res.stdout + res.stderr


def _tamper(src: Path, dst: Path, mutate):
    events = read_jsonl(src)
    mutate(events)
    dst.write_text("".join(json.dumps(e) + "\n" for e in events))


def test_tampered_logs_fail_trace_check(tiny_model, tmp_path):
    case = load_case("chunk")
    run_case(case, Path(tiny_model), tmp_path / "events.jsonl", device="cpu")

    def wrong_slot(events):
        gi = next(e for e in events if e["event"] == "gpu_inputs" and e["step"] == 3)
        gi["slot_mapping"][0] += 1

    def lost_output(events):
        ap = next(e for e in events if e["event"] == "after_postprocess" and e["step"] == 3)
        ap["seqs"][0]["num_completion_tokens"] -= 1

    for name, mutate in (("slot", wrong_slot), ("output", lost_output)):
        bad = tmp_path / f"bad-{name}.jsonl"
        _tamper(tmp_path / "events.jsonl", bad, mutate)
        report = validate(read_jsonl(bad), None)
        assert not report.ok and report.first_failure.step == 3, name
        res = _labkit("trace", "check", str(bad))
        assert res.returncode == 1 and "step 3" in " ".join(res.stdout.split())


def test_shapes_are_recorded_for_layer_zero(tiny_model, tmp_path):
    from labkit.fake_model import PRESETS

    case = load_case("lifecycle")
    run = run_case(case, Path(tiny_model), tmp_path / "events.jsonl", device="cpu", shapes=True)
    cfg = PRESETS["tiny"]
    step1 = {e["module"]: e["shape"] for e in run.events if e["event"] == "model_shape" and e["step"] == 1}
    qkv = (cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) * cfg["head_dim"]
    assert step1["qkv_proj"] == [160, qkv]
    assert step1["q"] == [160, cfg["num_attention_heads"], cfg["head_dim"]]
    assert step1["k"] == [160, cfg["num_key_value_heads"], cfg["head_dim"]]
    assert step1["embed_tokens"] == [160, cfg["hidden_size"]]
    assert step1["gate_up_proj"] == [160, 2 * cfg["intermediate_size"]]
    assert step1["logits"] == [2, cfg["vocab_size"]]  # one row per sequence in prefill
    step2 = {e["module"]: e["shape"] for e in run.events if e["event"] == "model_shape" and e["step"] == 2}
    assert step2["qkv_proj"] == [2, qkv]


def test_bad_case_input_exits_2(tmp_path):
    res = _labkit("trace", "--case", "no-such-case")
    assert res.returncode == 2 and res.stderr.startswith("labkit:") and "Traceback" not in res.stderr
    res = _labkit("trace", "check", str(tmp_path / "missing.jsonl"))
    assert res.returncode == 2 and "Traceback" not in res.stderr


def test_shapes_on_qwen3_0_6b_geometry(tmp_path):
    """The issue's reference figure: qkv [160, 4096] for the lifecycle prefill on Qwen3-0.6B (one layer of
    the 0.6b preset is enough: the shapes of layer 0 do not depend on depth)."""
    from labkit.fake_model import make_fake_model

    model = make_fake_model("qwen3-0.6b", tmp_path / "q06", overrides={"num_hidden_layers": 1})
    run = run_case(load_case("lifecycle"), Path(model), tmp_path / "events.jsonl", device="cpu", shapes=True)
    step1 = {e["module"]: e["shape"] for e in run.events if e["event"] == "model_shape" and e["step"] == 1}
    assert step1["qkv_proj"] == [160, 4096]
    assert step1["q"] == [160, 16, 128] and step1["k"] == [160, 8, 128]
    assert step1["gate_up_proj"] == [160, 6144] and step1["logits"] == [2, 151936]


def test_balanced_case_shows_the_alternation(tiny_model, tmp_path):
    """The same mixed workload under both policies: prefill_first runs the long prompts' chunks back to
    back while S1/S2 wait to decode; balanced interleaves a decode step between chunks."""
    case = load_case("balanced")
    phases = {}
    for policy in ("prefill_first", "balanced"):
        run = run_case(case, Path(tiny_model), tmp_path / f"{policy}.jsonl", device="cpu",
                       overrides={"scheduling_policy": policy})
        assert validate(run.events, case).ok
        phases[policy] = "".join("P" if e["phase"] == "prefill" else "D" for e in run.events
                                 if e["event"] == "scheduled")
    assert "PPPP" in phases["prefill_first"]
    first_long = phases["balanced"].index("P", 1)
    tail = phases["balanced"][first_long:phases["balanced"].rindex("P") + 1]
    assert "PP" not in tail and tail.count("P") == phases["prefill_first"].count("P") - 1


# ----------------------------------------------------------------------------- overrides and experiments

def _copy_tree(dst: Path) -> Path:
    """engine/, labkit/ and workloads/ outside any git checkout (PYTHONPATH and LAB_ROOT point at it)."""
    import shutil

    for part in ("engine", "labkit", "workloads"):
        shutil.copytree(REPO / part, dst / part, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _apply(tree: Path, patch: str):
    res = subprocess.run(["git", "apply", str(REPO / "patches" / patch)], cwd=tree, capture_output=True,
                         text=True, env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)})
    assert res.returncode == 0, res.stderr


def _in_tree(tree: Path, tmp_path: Path) -> dict:
    return {"PYTHONPATH": str(tree), "LAB_ROOT": str(tree), "RUNS_DIR": str(tmp_path / "runs"),
            "GIT_CEILING_DIRECTORIES": str(tree.parent)}


def test_override_that_changes_the_schedule_is_changed_with_a_step_diff(tiny_model, tmp_path):
    res = _labkit("trace", "--case", "lifecycle", "--max-num-batched-tokens", "100", "--model", tiny_model,
                  "--device", "cpu",
                  "--out", str(tmp_path / "o"), "-q")
    assert res.returncode == 0, res.stdout + res.stderr
    text = " ".join(res.stdout.split())
    assert "changed from the case" in text and "CHANGED" in text and "override --max-num-batched-tokens 100" in text
    assert "step 1: scheduled R1 instead of R1+R2" in text       # R2 no longer fits beside R1
    # FAIL is named only as what --no-expect-changes would say of the same run, never as this verdict.
    assert "FAIL" not in text.replace("(a FAIL there)", "")
    check = json.loads((tmp_path / "o" / "check.json").read_text())
    assert check["verdict"] == "CHANGED" and check["passed"] is True
    changes = check["report"]["changes"]
    assert {"step": 1, "field": "scheduled", "expected": ["R1", "R2"], "actual": ["R1"]}.items() <= changes[0].items()
    assert check["report"]["first_failure"] is None
    assert all(c["ok"] for c in check["report"]["checks"] if c["kind"] == "invariant")
    # a replay of the log is judged as the run was (the decision travels in its trace_context event)
    log = str(tmp_path / "o" / "events.jsonl")
    res = _labkit("trace", "check", log, "--case", "lifecycle", "--out", str(tmp_path / "replay.json"))
    assert res.returncode == 0 and "CHANGED" in res.stdout
    assert "override --max-num-batched-tokens 100" in " ".join(res.stdout.split())
    res = _labkit("trace", "check", log, "--case", "lifecycle", "--no-expect-changes",
                  "--out", str(tmp_path / "r2.json"))
    assert res.returncode == 1 and "differs from the case" in " ".join(res.stdout.split())


def test_override_with_a_fault_applied_still_fails_on_the_invariant(tiny_model, tmp_path):
    tree = _copy_tree(tmp_path / "tree")
    _apply(tree, "fault-slot-off-by-one.patch")
    res = _labkit("trace", "--case", "lifecycle", "--max-num-batched-tokens", "100", "--model", tiny_model,
                  "--device", "cpu",
                  "--out", str(tmp_path / "o"), "-q", env_extra=_in_tree(tree, tmp_path), cwd=tree)
    assert res.returncode == 1, res.stdout + res.stderr
    text = " ".join(res.stdout.split())
    assert "changed from the case" in text and "first failure: step 3, request R1: slot_mapping[0]" in text
    check = json.loads((tmp_path / "o" / "check.json").read_text())
    assert check["verdict"] == "FAIL"
    assert check["report"]["first_failure"]["name"] == "slots"


def test_engine_change_is_detected_by_git_and_unknown_without_it(tiny_model, tmp_path):
    """A case written for the clean engine, run on an engine with an experiment applied: CHANGED when git
    says engine/ differs from HEAD, FAIL (saying why) when there is no git to ask, or with --no-expect-changes."""
    data = yaml.safe_load((REPO / "workloads/cases/lifecycle.yaml").read_text())
    data["engine"]["max_num_batched_tokens"] = 100
    data["expect"] = [{"step": 1, "phase": "prefill", "scheduled": {"R1": 64}}]
    case = tmp_path / "lifecycle-100.yaml"
    case.write_text(yaml.safe_dump(data))
    tree = _copy_tree(tmp_path / "tree")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for cmd in (["init", "-q"], ["add", "engine"], ["commit", "-q", "-m", "engine"]):
        subprocess.run(git + cmd, cwd=tree, check=True, capture_output=True)
    _apply(tree, "exp-chunk-any-sequence.patch")
    # Bytecode a run leaves beside the engine (no .gitignore in this tree) is not a change of the engine.
    (tree / "engine" / "__pycache__").mkdir(exist_ok=True)
    (tree / "engine" / "__pycache__" / "planted.cpython-311.pyc").write_bytes(b"")
    args = ("trace", "--case", str(case), "--model", tiny_model, "--device", "cpu", "-q")
    res = _labkit(*args, "--out", str(tmp_path / "a"), env_extra=_in_tree(tree, tmp_path), cwd=tree)
    text = " ".join(res.stdout.split())
    assert res.returncode == 0 and "CHANGED" in text, res.stdout + res.stderr
    assert "engine/ differs from HEAD: scheduler.py" in text
    assert "a change meant to keep behaviour is judged with --no-expect-changes (a FAIL there)" in text
    assert "step 1: R2 is chunked (36 of 96 tokens) but is not first" in text   # nano's rule, changed on purpose
    assert "scheduled R1+R2 instead of R1" in text
    res = _labkit(*args, "--no-expect-changes", "--out", str(tmp_path / "b"), env_extra=_in_tree(tree, tmp_path),
                  cwd=tree)
    assert res.returncode == 1 and "differs from the case" in " ".join(res.stdout.split())
    import shutil

    shutil.rmtree(tree / ".git")
    res = _labkit(*args, "--out", str(tmp_path / "c"), env_extra=_in_tree(tree, tmp_path), cwd=tree)
    text = " ".join(res.stdout.split())
    assert res.returncode == 1 and "engine changes unknown" in text and "--expect-changes" in text


def test_trace_diff_marks_the_first_divergent_step(tiny_model, tmp_path, capsys):
    """The balanced case under both policies: the same steps until the long prompts arrive, then
    prefill_first runs their chunks back to back where balanced interleaves a decode."""
    from labkit.trace.tables import diff_rows
    from tests.helpers import run_cli

    case = load_case("balanced")
    logs, phases = {}, {}
    for policy in ("prefill_first", "balanced"):
        logs[policy] = tmp_path / f"{policy}.jsonl"
        run = run_case(case, Path(tiny_model), logs[policy], device="cpu", overrides={"scheduling_policy": policy})
        phases[policy] = [e["phase"] for e in run.events if e["event"] == "scheduled"]
    a, b = phases["prefill_first"], phases["balanced"]
    want = next(i for i, (x, y) in enumerate(zip(a, b), 1) if x != y)   # the first step whose phase differs
    assert want > 3
    rows, first = diff_rows(read_jsonl(logs["prefill_first"]), read_jsonl(logs["balanced"]))
    assert first == want
    assert all(not r["differs"] for r in rows[:want - 1]) and "phase" in rows[want - 1]["differs"]
    code, out, err = run_cli(["trace", "diff", str(logs["prefill_first"]), str(logs["balanced"])], capsys)
    text = " ".join(out.split())
    assert code == 0, err
    assert f"first divergence at step {want}" in text and "scheduling_policy: prefill_first -> balanced" in text
    code, out, err = run_cli(["trace", "diff", str(logs["balanced"]), str(tmp_path / "missing.jsonl")], capsys)
    assert code == 2 and "missing.jsonl" in err
    same, first = diff_rows(read_jsonl(logs["balanced"]), read_jsonl(logs["balanced"]))
    assert first is None and all(not r["differs"] for r in same)


def test_engine_error_is_a_failed_step_not_a_crash(tiny_model, tmp_path, monkeypatch):
    """An engine that raises mid-run: the steps before it are still judged and the trace fails on
    engine.raised at that step (exit 1), not with a traceback."""
    from engine.scheduler import Scheduler

    real = Scheduler.schedule

    def schedule(self):
        if self.running and not self.waiting:      # the first decode step
            raise StopIteration("no bucket")
        return real(self)
    monkeypatch.setattr(Scheduler, "schedule", schedule)
    case = load_case("A")
    run = run_case(case, Path(tiny_model), tmp_path / "events.jsonl", device="cpu")
    report = validate(read_jsonl(tmp_path / "events.jsonl"), case)
    assert report.verdict == "FAIL"
    raised = [c for c in report.failures if c.name == "engine.raised"]
    assert len(raised) == 1 and raised[0].step == 2 and "StopIteration: no bucket" in raised[0].message
    assert run.events[-1]["event"] == "run_end"


def test_prefix_hit_on_a_block_holding_other_tokens_fails(tiny_model, tmp_path):
    """prefix-reuse passes; the same log where Q's first four prompt ids differ from the block it hits
    (P's) fails prefix.content at step 3."""
    case = load_case("prefix-reuse")
    run = run_case(case, Path(tiny_model), tmp_path / "events.jsonl", device="cpu")
    assert validate(run.events, case).ok
    events = read_jsonl(tmp_path / "events.jsonl")
    q = next(e for e in events if e["event"] == "request_added" and e["request_id"] == "Q")
    q["prompt_token_ids"][2] += 1
    report = validate(events, None)
    assert [c.name for c in report.failures] == ["prefix.content"]
    f = report.failures[0]
    assert f.step == 3 and f.request == "Q" and "block" in f.message and "position 2" in f.message
