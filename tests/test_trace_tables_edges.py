"""The readable views of an event log at their edges (labkit/trace/tables.py): what a row computes when it
schedules the last prompt token, the TSV's after-step values, the step diff of two runs (the first divergence,
which run a step is missing from), the settings and requests that tell two runs apart."""
from __future__ import annotations

import csv

from labkit.trace.tables import (
    case_mismatch,
    compact_steps,
    config_differences,
    diff_rows,
    row_kind,
    write_tsv,
)


def sched(seq_id, rid, total, cached, new, blocks=1):
    return {"seq_id": seq_id, "request_id": rid, "num_tokens": total, "num_cached_tokens": cached,
            "num_scheduled_tokens": new, "block_table": list(range(blocks))}


def after(seq_id, rid, total, cached, outputs, status="RUNNING", accepted=True, token=7, blocks=1):
    return {"seq_id": seq_id, "request_id": rid, "num_tokens": total, "num_cached_tokens": cached,
            "num_completion_tokens": outputs, "status": status, "block_table": list(range(blocks)),
            "accepted": accepted, "token_id": token}


def step(n, phase, seqs, afters, free=10):
    return [{"event": "scheduled", "step": n, "phase": phase, "seqs": seqs},
            {"event": "after_postprocess", "step": n, "seqs": afters, "free_blocks": free}]


def added(seq_id, rid, prompt_len, max_tokens=4):
    return {"event": "request_added", "step": None, "seq_id": seq_id, "request_id": rid,
            "prompt_len": prompt_len, "max_tokens": max_tokens}


# ----------------------------------------------------------------------------- what a row computes


def test_a_row_scheduling_the_last_prompt_token_is_a_prefill_not_a_decode():
    # A 10-token prompt of which 9 are cached: the one token scheduled is the prompt's last, so the row is the
    # prompt's last prefill piece; a decode row computes a token past the prompt (total > prompt_len).
    last_prompt_token = sched(1, "A", total=10, cached=9, new=1)
    assert row_kind(last_prompt_token, "mixed", prompt_len=10) == "prefill"
    past_the_prompt = sched(1, "A", total=11, cached=10, new=1)
    assert row_kind(past_the_prompt, "mixed", prompt_len=10) == "decode"


def test_compact_steps_count_the_tokens_computed_and_the_kv_after_the_forward():
    events = [added(1, "A", 30), added(2, "B", 5),
              *step(1, "prefill", [sched(1, "A", 30, 10, 20, 2), sched(2, "B", 5, 0, 5)],
                    [after(1, "A", 31, 30, 1, blocks=2), after(2, "B", 6, 5, 1)])]
    (st,) = compact_steps(events)
    # Tokens computed this step: the scheduled counts (20 + 5), not the sequences' lengths (30 + 5).
    assert st["tokens"] == 20 + 5
    rows = {r["id"]: r for r in st["rows"]}
    # The KV after the forward holds what was cached plus what was computed.
    assert rows["A"]["cached_after"] == 10 + 20 and rows["B"]["cached_after"] == 0 + 5


# ----------------------------------------------------------------------------- the TSV


def test_the_tsv_total_is_the_length_after_the_step(tmp_path):
    # Scheduled with 10 tokens, the step samples one: after it the sequence holds 11 (the TSV's after-step values).
    events = [added(1, "A", 10), *step(1, "prefill", [sched(1, "A", 10, 0, 10)], [after(1, "A", 11, 10, 1)])]
    path = write_tsv(events, tmp_path / "steps.tsv")
    with path.open(encoding="utf-8") as f:
        (row,) = list(csv.DictReader(f, delimiter="\t"))
    assert row["total"] == "11" and row["cached"] == "10" and row["scheduled"] == "10" and row["outputs"] == "1"


# ----------------------------------------------------------------------------- two runs side by side


def _two_step_run(second_free: int, third: bool = False) -> list[dict]:
    ev = [added(1, "A", 4),
          *step(1, "prefill", [sched(1, "A", 4, 0, 4)], [after(1, "A", 5, 4, 1)], free=9),
          *step(2, "decode", [sched(1, "A", 5, 4, 1)], [after(1, "A", 6, 5, 2)], free=second_free)]
    if third:
        ev += step(3, "decode", [sched(1, "A", 6, 5, 1)], [after(1, "A", 7, 6, 3, status="FINISHED")], free=10)
    return ev


def test_the_first_divergence_is_the_earliest_differing_step_and_a_missing_step_names_its_run():
    a = _two_step_run(second_free=9, third=False)
    b = _two_step_run(second_free=8, third=True)    # differs at step 2, and has a step 3 A lacks
    rows, first = diff_rows(a, b)
    by_step = {r["step"]: r for r in rows}
    assert by_step[1]["differs"] == []
    assert by_step[2]["differs"] == ["free"]
    assert by_step[3]["differs"] == ["only in B"] and by_step[3]["a"] is None
    assert first == 2
    # The other way round the extra step is only in A.
    rows, first = diff_rows(b, a)
    assert {r["step"]: r for r in rows}[3]["differs"] == ["only in A"] and first == 2


def test_config_differences_leave_out_the_per_run_addresses():
    def start(**cfg):
        return [{"event": "run_start", "step": None, "config": cfg, "block_size": 256}]
    a = start(max_num_batched_tokens=512, shm_name="shm-a", dist_init_addr="tcp://127.0.0.1:1")
    b = start(max_num_batched_tokens=100, shm_name="shm-b", dist_init_addr="tcp://127.0.0.1:2")
    assert config_differences(a, b) == ["max_num_batched_tokens: 512 -> 100"]


def test_case_mismatch_counts_the_requests_it_does_not_list():
    a = [added(i, f"R{i}", 8) for i in range(6)]
    text = case_mismatch(a, [])
    # Four requests are named; of six, two are left: "and 2 more".
    assert "R0 (8 prompt tokens, 4 out)" in text and "R3 " in text and "R4 " not in text
    assert text.endswith("B none") and " and 2 more;" in text


# ----------------------------------------------------------------------------- a malformed log


def test_every_view_reads_a_malformed_seqs_as_its_well_formed_entries(tmp_path):
    # A step whose `seqs` holds a non-object beside a good entry, or is not a list at all: the CLI's reader
    # refuses such a line, but these views are library calls too (the report and the live recorder call them on
    # what they read), so they show what is well formed instead of raising.
    good = [added(1, "A", 4), *step(1, "prefill", [sched(1, "A", 4, 0, 4)], [after(1, "A", 5, 4, 1)])]
    for bad in ([5, sched(1, "A", 5, 4, 1)], "seqs", 7, {"seq_id": 1}):
        afters = [after(1, "A", 6, 5, 2)] + (bad[:1] if isinstance(bad, list) else [])
        events = good + [{"event": "scheduled", "step": 2, "phase": "decode", "seqs": bad},
                         {"event": "after_postprocess", "step": 2, "seqs": afters, "free_blocks": 9}]
        steps = {s["step"]: s for s in compact_steps(events)}
        listed = isinstance(bad, list)
        assert steps[2]["tokens"] == (1 if listed else 0), bad
        # Its after_postprocess entry still shows, as a row the step did not schedule when none is readable.
        assert [(r["id"], r["kind"]) for r in steps[2]["rows"]] == [("A", "decode" if listed else "not scheduled")], bad
        with write_tsv(events, tmp_path / "steps.tsv").open(encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f, delimiter="\t") if r["step"] == "2"]
        assert [(r["scheduled"], r["note"]) for r in rows] == [("1", "") if listed else ("0", "not scheduled")], bad
        rows, first = diff_rows(events, good)
        assert first == 2 and {r["step"]: r for r in rows}[2]["differs"] == ["only in A"], bad
