"""`labkit trace`'s texts and files at their edges (labkit/trace/command.py): a live window that cut rows but no
steps says so, exactly 20 failures list them all, an expected-changes run that FAILs calls its diff a change, a
flag given says what it says, state-neutral options are no reason to expect changes, a replay writes its own file
and judges a log without a trace_context strictly, a KV size in KiB, a zero KV cell, a clean commit."""
from __future__ import annotations

import io
import json

from rich.console import Console

from labkit.engine_args import EngineArgs
from labkit.trace import command
from labkit.trace.cases import repo_root
from labkit.trace.validate import Check, Report
from tests.helpers import run_cli
from tests.test_validate import chunk_log


def _console() -> Console:
    return Console(file=io.StringIO(), width=200, color_system=None)


def _flat(console: Console) -> str:
    return " ".join(console.file.getvalue().split())


def test_a_window_that_cut_only_rows_says_where_the_rest_is():
    events = chunk_log()
    con = _console()
    command._print_steps(events, con, "w", last_steps=10, max_rows=1)   # every step kept, step 2's B row cut
    text = _flat(con)
    assert "... 1 more row(s) of step 2" in text
    assert "at most 1 rows each: every step is in steps.tsv" in text


def _failures(n: int) -> Report:
    return Report(checks=[Check(name=f"inv{i}", ok=False, step=1, message=f"broken number {i}") for i in range(n)],
                  steps=1)


def test_exactly_twenty_failures_are_all_listed_and_nothing_said_about_more():
    con = _console()
    command._print_report(_failures(20), con)
    text = _flat(con)
    assert text.count("FAIL broken number") == 20 and "more failures" not in text
    con = _console()
    command._print_report(_failures(21), con)
    assert "... and 1 more failures" in _flat(con)


def test_a_failing_run_that_was_meant_to_change_calls_its_diff_a_change():
    report = Report(checks=[Check(name="inv", ok=False, step=1, message="broken"),
                            Check(name="expect", ok=False, step=1, field="free", expected=61, actual=60,
                                  kind="expect")],
                    steps=1, case="chunk", expect_changes=True, why_changes="override --max-num-seqs 2")
    assert report.verdict == "FAIL"
    con = _console()
    command._print_report(report, con)
    text = _flat(con)
    assert "changed from the case: 1 difference(s)" in text and "differs from the case" not in text


def test_a_flag_given_decides_whatever_the_overrides(monkeypatch):
    monkeypatch.setattr(command, "engine_changes", lambda: (True, "engine/ differs from HEAD: a.py"))
    assert command.changes_expected(EngineArgs(max_num_seqs=2), False) == \
        (False, "--no-expect-changes: the case's states gate")
    assert command.changes_expected(EngineArgs(), True) == (True, "--expect-changes")


def test_async_scheduling_and_an_fp8_pool_are_no_reason_to_expect_changes(monkeypatch):
    monkeypatch.setattr(command, "engine_changes", lambda: (False, "engine/ is HEAD's"))
    assert command.changes_expected(EngineArgs(async_scheduling=True), None) == (False, "")
    assert command.changes_expected(EngineArgs(kv_cache_dtype="fp8"), None) == (False, "")


def _chunk_case_with_free(tmp_path, free: int):
    text = (repo_root() / "workloads" / "cases" / "chunk.yaml").read_text()
    assert "    free: 61\n" in text
    path = tmp_path / "chunk-edited.yaml"
    path.write_text(text.replace("    free: 61\n", f"    free: {free}\n", 1))
    return path


def test_a_replay_writes_check_replay_json_beside_the_log_and_leaves_check_json(tmp_path, capsys):
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in chunk_log()))
    (tmp_path / "check.json").write_text('{"the run": "own"}')
    code, out, err = run_cli(["trace", "check", str(log), "--case", "chunk"], capsys)
    assert code == 0, out + err
    assert json.loads((tmp_path / "check.json").read_text()) == {"the run": "own"}
    assert json.loads((tmp_path / "check-replay.json").read_text())["verdict"] == "PASS"


def test_a_log_without_a_trace_context_is_judged_strictly(tmp_path, capsys):
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in chunk_log()))
    case = _chunk_case_with_free(tmp_path, 62)   # the log has 61 free after step 1
    code, out, err = run_cli(["trace", "check", str(log), "--case", str(case), "--out", str(tmp_path / "r.json")],
                             capsys)
    assert code == 1, out + err
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == "FAIL"
    code, out, err = run_cli(["trace", "check", str(log), "--case", str(case), "--expect-changes",
                              "--out", str(tmp_path / "r2.json")], capsys)
    assert code == 0 and json.loads((tmp_path / "r2.json").read_text())["verdict"] == "CHANGED", out + err


def test_the_shapes_table_gives_the_kv_size_in_kib():
    events = [{"event": "run_start", "tp_size": 1, "kv_bytes_per_token": 2048, "num_kvcache_blocks": 64,
               "block_size": 256},
              {"event": "scheduled", "step": 1, "phase": "prefill"},
              {"event": "model_shape", "step": 1, "module": "logits", "shape": [4, 100]}]
    con = _console()
    command._print_shapes(events, con)
    assert "KV cache: 2048 bytes (2 KiB) per token per rank, 64 blocks of 256" in _flat(con)


def test_a_row_with_nothing_cached_after_shows_its_zero():
    row = {"id": "A", "kind": "prefill", "new": 0, "cached_before": 0, "cached_after": 0, "total": 5,
           "outputs": 0, "token": None, "accepted": None, "status": "WAITING", "blocks": 0}
    assert command._compact_cells(row)[3] == "0 → 0 of 5"


def test_check_md_calls_only_a_dirty_tree_dirty():
    report = Report(case="chunk", steps=1)
    clean = command.check_markdown({"case": "chunk", "git_head": "abc", "git_dirty": False}, report)
    assert "- commit: abc\n" in clean and "dirty" not in clean
    dirty = command.check_markdown({"case": "chunk", "git_head": "abc", "git_dirty": True}, report)
    assert "- commit: abc (dirty)" in dirty
