"""`labkit trace`'s terminal output: the compact per-step table fits an 80-column terminal without breaking a
word, each row says what it computes (prefill, prefill chunk, decode) even in a step that mixes them, and the
texts around the verdict say what a diff leaves out (steps past the case, the first cause, unrelated logs)."""
from __future__ import annotations

import io
import json

from rich.console import Console

from labkit.trace.cases import load_case
from labkit.trace.command import _print_report, _print_steps
from labkit.trace.tables import case_mismatch, compact_steps, row_kind
from labkit.trace.validate import Report, validate
from tests.helpers import run_cli
from tests.test_validate import S, a_log, chunk_log, preempt_log, step_event

HEADER = ("id", "row", "new", "KV cached", "outputs", "status", "blocks")


def render(events, width=80, wide=False) -> list[str]:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    _print_steps(events, console, "case chunk: A=700 tokens, B=32, budget 512", wide)
    return console.file.getvalue().splitlines()


def assert_fits(lines: list[str], width: int, max_lines: int):
    assert len(lines) <= max_lines, "\n".join(lines)
    assert all(len(line) <= width for line in lines)
    # The header on one line, in order, every word whole: a folded header shows "cache" / "d" pieces instead.
    header = next(line for line in lines if line.split()[:2] == ["id", "row"])
    assert header.split() == " ".join(HEADER).split()


def test_the_chunk_case_fits_80_columns_with_every_cell_whole():
    lines = render(chunk_log())
    assert_fits(lines, 80, 17)
    text = "\n".join(lines)
    for step in compact_steps(chunk_log()):
        for r in step["rows"]:
            kv = f"{r['cached_before']} → {r['cached_after']} of {r['total']}"
            assert any(kv in line and f" {r['id']} " in line for line in lines), kv
    assert "step 1 · prefill · 512 of 512 tokens · free blocks 64 → 61" in text
    assert " A prefill chunk 512 0 → 512 of 700" in text and "0 (dropped)" in text
    assert " A decode " in text and "1 (+901)" in text


def test_the_wide_table_keeps_every_model_input():
    text = " ".join(" ".join(render(chunk_log(), width=220, wide=True)).split())
    assert "model inputs" in text and "cu_q [0, 188, 220] cu_k [0, 700, 732]" in text


def test_cli_chunk_at_80_columns_is_at_most_24_lines(tiny_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli(["trace", "--case", "chunk", "--model", tiny_model, "--device", "cpu",
                              "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err
    lines = out.rstrip("\n").splitlines()
    assert_fits(lines, 80, 24)
    assert "wrote " in out and "events.jsonl (the log)" in " ".join(out.split())


def test_rows_of_a_mixed_step_each_say_what_they_compute():
    """A step that decodes A and B while it prefills a chunk of C: the phase says "mixed", each row its kind."""
    log = chunk_log()
    log.insert(2, {"v": 1, "event": "request_added", "run": "hand", "t_ns": 0, "step": None, "seq_id": 2,
                   "request_id": "C", "prompt_len": 600, "max_tokens": 3})
    sched = step_event(log, 3, "scheduled")
    sched["phase"] = "mixed"
    sched["seqs"].append(S(2, "C", 600, 0, 256, [9, 10, 11]))
    rows = compact_steps(log)[2]["rows"]
    assert [(r["id"], r["kind"]) for r in rows] == [("A", "decode"), ("B", "decode"), ("C", "prefill chunk")]
    assert "step 3 · mixed · 258 of 512 tokens" in "\n".join(render(log))
    # A row's counts decide, not the request's history: a prompt whose last token is all that is left to
    # compute is a prefill, though it computes one token like a decode.
    assert row_kind(S(5, "D", 257, 256, 1, [1, 2]), "mixed", 257) == "prefill"
    assert row_kind(S(5, "D", 258, 257, 1, [1, 2]), "mixed", 257) == "decode"


def test_preempted_requests_get_their_own_row():
    rows = compact_steps(preempt_log())[1]["rows"]
    assert [(r["id"], r["kind"], r["status"], r["blocks"]) for r in rows][-1] == ("C", "preempted", "WAITING", 0)


def report_text(report, case) -> str:
    console = Console(file=io.StringIO(), width=300, color_system=None)
    _print_report(report, console, case)
    return console.file.getvalue()


def test_a_changed_run_names_its_first_cause_and_the_steps_past_the_case(tmp_path):
    """Case A expects 3 steps. A run that took 4 (as `--max-num-batched-tokens` can make it) shows step 4 as outside the
    case, and the first difference is named with what changed the run."""
    other = tmp_path / "A-other.yaml"
    other.write_text(load_case("A").path.read_text().replace("outputs: 2,", "outputs: 9,", 1))
    case = load_case(str(other))
    judged = validate(a_log(), case, expect_changes=True, why_changes="override --max-num-batched-tokens 2")
    longer = Report(checks=judged.checks, steps=4, case="A", expect_changes=True,
                    why_changes="override --max-num-batched-tokens 2")
    assert longer.verdict == "CHANGED"
    text = report_text(longer, case)
    assert "first cause (override --max-num-batched-tokens 2): step 2: R1 outputs 2 instead of 9" in text
    assert "step 4: not in the case (its expected states end at step 3; the run took 4)" in text
    assert "not in the case" not in report_text(judged, case)       # 3 steps: none past the case
    longer.steps = 6
    assert "steps 4-6: not in the case" in report_text(longer, case)


def test_trace_diff_warns_when_the_logs_are_not_one_case(tmp_path, capsys):
    def write(name, events):
        p = tmp_path / f"{name}.jsonl"
        p.write_text("".join(json.dumps(e) + "\n" for e in events))
        return str(p)
    chunk, other = write("chunk", chunk_log()), write("a", a_log())
    code, out, err = run_cli(["trace", "diff", chunk, other], capsys)
    text = " ".join(out.split())
    assert code == 0, err
    assert "warning: the two runs added different requests: A A (700 prompt tokens, 3 out), B (32 prompt tokens, " \
           "3 out); B R1 (3 prompt tokens, 3 out): not two runs of one case" in text
    code, out, err = run_cli(["trace", "diff", chunk, chunk], capsys)
    assert code == 0 and "warning" not in out
    # The case name a run records wins over the requests (two cases may add the same requests).
    named = [{"v": 1, "event": "trace_context", "run": "hand", "t_ns": 0, "step": None, "case": c,
              "expect_changes": False} for c in ("chunk", "D")]
    assert case_mismatch([named[0]] + chunk_log(), [named[1]] + chunk_log()) == \
        "A is a run of case chunk and B of case D"
    assert case_mismatch([named[0]] + chunk_log(), [named[0]] + chunk_log()) is None


def test_trace_list_says_recorded_once(capsys):
    code, out, err = run_cli(["trace", "--list"], capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert text.count("(recorded, not judged)") == 1   # balanced is the one case without expectations
    assert "balanced: Mixed workload" in text
