"""Edges of labkit/trace/validate.py that the hand-written logs of test_validate.py did not reach: each test starts
from a correct log (which passes), breaks one rule, and asserts the validator names that failure; plus the tracer
seam (engine/trace.py) and the caps on how many failures a report lists."""
from __future__ import annotations

import copy

import pytest

from engine.trace import JsonlTracer, ListTracer
from labkit.trace.cases import load_case
from labkit.trace.validate import validate

from .test_validate import A_TABLE, a_log, chunk_log, ev, preempt_log, stamp, step_event


def names(report) -> list[str]:
    return [c.name for c in report.failures]


def messages(report, name) -> list[str]:
    return [c.message for c in report.failures if c.name == name]


def held(report) -> set[str]:
    return {c.name for c in report.checks if c.ok and not c.skipped}


def _insert_after(events, anchor, new):
    events.insert(events.index(anchor) + 1, new)


# ----------------------------------------------------------------------------- step.events and phase

@pytest.mark.parametrize("name, why", [("gpu_inputs", "exactly one"), ("sampled", "exactly one"),
                                       ("before_schedule", "at most one")])
def test_a_step_with_a_duplicated_event_fails_step_events(name, why):
    log = a_log()
    e = step_event(log, 2, name)
    _insert_after(log, e, copy.deepcopy(e))
    report = validate(stamp(log))
    assert f"step 2: 2 {name} events (expected {why})" in messages(report, "step.events")
    assert report.verdict == "FAIL"


def test_a_step_that_schedules_nothing_fails_phase():
    log = a_log()
    step_event(log, 3, "scheduled")["seqs"] = []
    report = validate(log)
    assert "step 3: nothing scheduled" in messages(report, "phase")


def test_a_mixed_step_must_list_its_decode_rows_first():
    def mixed(order):
        log = chunk_log()
        log[0]["config"]["scheduling_policy"] = "mixed"
        sch = step_event(log, 3, "scheduled")
        sch["phase"] = "mixed"
        for e, k in zip(sch["seqs"], order):
            e["kind"] = k
        return validate(log)

    assert "phase" not in names(mixed(["decode", "prefill"]))
    report = mixed(["prefill", "decode"])
    assert any("rows ['prefill', 'decode'] (decode rows come first" in m for m in messages(report, "phase"))


def test_without_before_schedule_a_decode_row_of_a_waiting_sequence_fails():
    log = [e for e in a_log() if e["event"] != "before_schedule"]
    report = validate(log)
    assert report.ok, report.summary()
    assert "phase.mixed" in held(report)
    step_event(log, 1, "after_postprocess")["seqs"][0]["status"] = "WAITING"
    report = validate(log)
    assert "step 2, request R1: scheduled as a decode row while WAITING" in messages(report, "phase.mixed")


def test_before_schedule_running_queue_is_compared():
    log = a_log()
    step_event(log, 2, "before_schedule")["running"] = [0, 5]
    report = validate(log)
    assert names(report) == ["queues"]
    assert "running ['R1', 'seq5']" in report.first_failure.message


def test_preempting_a_waiting_sequence_fails():
    log = preempt_log()
    # C was preempted at step 2 and is WAITING at step 3
    _insert_after(log, step_event(log, 3, "before_schedule"), ev("preempted", 3, seq_id=2, request_id="C"))
    report = validate(stamp(log))
    assert messages(report, "preempted") == ["step 3, request C: preempted while WAITING"]


def test_max_num_seqs_is_an_inclusive_bound():
    log = preempt_log()
    log[0]["config"]["max_num_seqs"] = 3          # step 1 schedules exactly 3
    report = validate(log)
    assert report.ok, report.summary()
    assert "budget" in held(report)
    log[0]["config"]["max_num_seqs"] = 2
    assert messages(validate(log), "budget") == ["step 1: 3 sequences scheduled, max_num_seqs is 2"]


def test_rescheduled_with_other_blocks_fails_state_continuity():
    log = chunk_log()
    b = step_event(log, 3, "scheduled")["seqs"][1]
    assert b["request_id"] == "B"
    b["block_table"] = [5]
    gi = step_event(log, 3, "gpu_inputs")
    gi["slot_mapping"][1] = 5 * 256 + 32
    gi["block_tables"][1] = [5, -1, -1]
    report = validate(log)
    assert "state.continuity" in names(report)
    assert any("holds blocks [0] with cached 32, scheduled with blocks [5]" in m
               for m in messages(report, "state.continuity"))


# ----------------------------------------------------------------------------- gpu_inputs

def test_an_eager_step_with_extra_positions_fails():
    log = a_log()
    step_event(log, 2, "gpu_inputs")["positions"] = [3, 0]
    assert names(validate(log)) == ["inputs.positions"]


def test_extra_slots_pass_only_when_they_are_padding():
    log = a_log()
    step_event(log, 2, "gpu_inputs")["slot_mapping"] = [1795, -1]
    assert validate(log).ok
    step_event(log, 2, "gpu_inputs")["slot_mapping"] = [1795, 5]
    report = validate(log)
    assert messages(report, "slots") == ["step 2: slot_mapping has 2 entries for 1 positions"]


def test_a_decode_step_reporting_cu_seqlens_k_is_checked_against_context_lengths():
    log = a_log()
    step_event(log, 2, "gpu_inputs")["cu_seqlens_k"] = [0, 4]
    report = validate(log)
    assert report.ok, report.summary()
    step_event(log, 2, "gpu_inputs")["cu_seqlens_k"] = [0, 3]
    assert names(validate(log)) == ["inputs.cu_seqlens_k"]


def test_a_prefill_step_with_context_lens_fails():
    log = a_log()
    step_event(log, 1, "gpu_inputs")["context_lens"] = [3]
    report = validate(log)
    assert names(report) == ["inputs.context_lens"]
    assert "context_lens should be null in prefill, got [3]" in report.first_failure.message


def test_block_tables_missing_a_row_fails():
    log = chunk_log()
    step_event(log, 3, "gpu_inputs")["block_tables"] = [A_TABLE]
    assert messages(validate(log), "inputs.block_tables") == ["step 3: block_tables has 1 rows for 2 sequences"]


def test_an_eager_step_with_a_graph_batch_fails():
    log = a_log()
    step_event(log, 2, "gpu_inputs")["graph_batch"] = 1
    assert names(validate(log)) == ["inputs.execution"]


def _graph_decode(log, batch):
    gi = step_event(log, 3, "gpu_inputs")
    gi.update(execution="graph", graph_batch=batch)
    return log


def test_a_cuda_graph_must_hold_the_decode_batch():
    log = chunk_log()
    log[0]["config"]["enforce_eager"] = False
    assert validate(_graph_decode(copy.deepcopy(log), 2)).ok
    assert validate(_graph_decode(copy.deepcopy(log), 4)).ok
    assert names(validate(_graph_decode(copy.deepcopy(log), 1))) == ["inputs.execution"]


def test_a_graph_step_under_enforce_eager_fails():
    log = _graph_decode(chunk_log(), 2)           # enforce_eager: true
    report = validate(log)
    assert names(report) == ["inputs.execution"]
    assert "(enforce_eager True)" in report.first_failure.message


# ----------------------------------------------------------------------------- after_postprocess

def test_an_accepted_token_other_than_the_sampled_one_fails():
    log = a_log()
    step_event(log, 2, "after_postprocess")["seqs"][0]["token_id"] = 999
    report = validate(log)
    assert names(report) == ["sampled"]
    assert report.first_failure.message == "step 2, request R1: token_id 999 differs from the sampled 501"


def test_an_accepted_token_must_add_one_token():
    log = a_log()
    step_event(log, 2, "after_postprocess")["seqs"][0]["num_tokens"] = 6
    report = validate(log)
    assert any("total 4 -> 6" in m for m in messages(report, "accepted.counts"))


def test_a_chunk_that_grows_the_sequence_fails_discarded():
    log = chunk_log()
    step_event(log, 1, "after_postprocess")["seqs"][0]["num_tokens"] = 701
    report = validate(log)
    assert any("total 700 -> 701" in m for m in messages(report, "discarded"))


def test_a_finished_sequence_with_cached_tokens_fails():
    log = a_log()
    step_event(log, 3, "after_postprocess")["seqs"][0]["num_cached_tokens"] = 5
    report = validate(log)
    assert names(report) == ["finished.released"]
    assert "FINISHED but still holds blocks [] / cached 5" in report.first_failure.message


# ----------------------------------------------------------------------------- the end of the run and the case

def test_run_end_must_count_the_steps():
    log = a_log()
    log[-1]["steps"] = 2
    report = validate(log)
    assert names(report) == ["run.end"]
    assert report.first_failure.message == "run: run_end.steps is 2 but the log has 3 steps"


def test_an_aborted_request_that_ignores_eos_need_not_reach_max_tokens():
    log = [e for e in a_log() if e["step"] != 3]
    log[-1]["steps"] = 2
    _insert_after(log, step_event(log, 2, "after_postprocess"),
                  ev("aborted", 2, seq_id=0, request_id="R1", num_completion_tokens=2, free_blocks=64))
    report = validate(stamp(log))
    assert report.ok, report.summary()
    assert "requests.finished" in held(report)
    # the same log without the abort's reason is a request stopped short
    log = [e for e in log if e["event"] != "aborted"]
    step_event(log, 2, "after_postprocess")["seqs"][0].update(status="FINISHED", block_table=[], num_cached_tokens=0,
                                                             ref_counts=[])
    step_event(log, 2, "after_postprocess")["free_blocks"] = 64
    assert "requests.outputs" in names(validate(stamp(log)))


def test_a_request_the_case_does_not_name_fails_the_case():
    log = a_log()
    _insert_after(log, log[1], ev("request_added", seq_id=9, request_id="R9", prompt_len=3, max_tokens=3))
    report = validate(stamp(log), load_case("A"))
    case = [c for c in report.failures if c.kind == "case"]
    assert [c.message for c in case] == ["run: requests not in the case were added: R9"]
    assert report.verdict == "FAIL"


def test_a_config_pool_of_zero_blocks_means_unknown():
    log = a_log()
    del log[0]["num_kvcache_blocks"]
    log[0]["config"]["num_kvcache_blocks"] = 0     # not yet allocated when the config was written
    report = validate(log)
    assert report.ok, report.summary()
    skipped = {c.name: c.message for c in report.checks if c.skipped}
    assert "num_kvcache_blocks unknown" in skipped["blocks.accounting"]


# ----------------------------------------------------------------------------- how many failures a report lists

def _unknown_preemptions(k):
    log = a_log()
    anchor = step_event(log, 2, "before_schedule")
    for i in range(k):
        _insert_after(log, anchor, ev("preempted", 2, seq_id=100 + i, request_id=f"X{i}"))
    return validate(stamp(log))


def test_fifty_failures_of_one_invariant_are_all_listed():
    report = _unknown_preemptions(50)
    known = [c for c in report.failures if c.name == "seq.known"]
    assert len(known) == 50 and not any("more failures not listed" in c.message for c in known)


def test_past_fifty_failures_one_line_says_more():
    report = _unknown_preemptions(52)
    known = [c for c in report.failures if c.name == "seq.known"]
    assert len(known) == 51
    assert known[-1].message == "seq.known: more failures not listed"
    assert all("preempted an unknown sequence" in c.message for c in known[:50])


def test_schema_failures_are_listed_up_to_fifty_and_none_passes():
    junk = [{"v": 2, "event": "junk", "run": "hand", "t_ns": 0, "step": None} for _ in range(60)]
    report = validate(a_log() + junk)
    schema = report.of_kind("schema")
    assert len(schema) == 51 and not any(c.ok for c in schema)
    assert all(c.message.startswith("event #") for c in schema[:50])
    assert schema[-1].message == "schema: 10 more events fail the schema, not listed (60 of 78 in all)"
    assert report.counts()["schema"] == {"passed": 0, "failed": 51, "skipped": 0}
    one = validate(a_log() + junk[:1]).of_kind("schema")
    assert [c.ok for c in one] == [False]
    assert [c.ok for c in validate(a_log()).of_kind("schema")] == [True]


# ----------------------------------------------------------------------------- the tracer (engine/trace.py)

def test_tracer_stamps_come_first_and_fields_follow():
    t = ListTracer(run="r1")
    t.step = 3
    t.emit("scheduled", phase="decode", seqs=[])
    t.step = None
    t.emit("run_end", steps=3, wall_s=0.5)
    a, b = t.events
    assert list(a) == ["v", "event", "run", "t_ns", "step", "phase", "seqs"]
    assert a["step"] == 3 and a["phase"] == "decode" and a["run"] == "r1" and a["v"] == 1
    assert b["step"] is None and b["steps"] == 3 and b["t_ns"] >= a["t_ns"]


def test_a_closed_jsonl_tracer_refuses_to_write(tmp_path):
    t = JsonlTracer(tmp_path / "sub" / "events.jsonl", run="r2", keep=True)
    t.emit("run_end", steps=0, wall_s=0.0)
    t.close()
    t.close()                                           # twice is harmless
    with pytest.raises(RuntimeError, match="is closed"):
        t.emit("run_end", steps=0, wall_s=0.0)
    lines = (tmp_path / "sub" / "events.jsonl").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith('{"v":1,"event":"run_end","run":"r2"')
    assert t.events == [{**t.events[0], "steps": 0}]


# ----------------------------------------------------------------------------- empty and saved logs

def test_an_empty_log_fails_naming_the_missing_run_start():
    report = validate([])
    assert report.verdict == "FAIL" and report.steps == 0 and not report.judged
    assert report.first_failure.message == "run: expected one run_start event, found 0"
    assert [c.ok for c in report.of_kind("schema")] == [True]


def test_a_saved_log_streamed_from_disk_judges_as_in_memory(tmp_path):
    from labkit.errors import LabkitError
    from labkit.trace.events import EventLog, write_jsonl
    from labkit.trace.validate import validate_log

    p = write_jsonl(a_log(), tmp_path / "events.jsonl")
    disk, mem = validate_log(EventLog.from_file(p), load_case("A")), validate(a_log(), load_case("A"))
    assert disk.verdict == mem.verdict == "PASS" and disk.steps == mem.steps == 3
    assert [(c.name, c.ok, c.kind) for c in disk.checks] == [(c.name, c.ok, c.kind) for c in mem.checks]
    log = a_log()
    log[-1]["steps"] = 2
    p = write_jsonl(log, tmp_path / "short.jsonl")
    assert [c.name for c in validate_log(EventLog.from_file(p)).failures] == ["run.end"]
    cut = tmp_path / "cut.jsonl"          # a recording cut off mid-line
    text = p.read_text()
    cut.write_text(text[:-10])
    with pytest.raises(LabkitError, match=rf"cut.jsonl:{len(log)}: not valid JSON"):
        EventLog.from_file(cut)


# ----------------------------------------------------------------------------- prefix-cache hits

R1_PROMPT = list(range(10, 18))         # 8 ids: blocks 2 and 5 (block size 4)


def prefix_log(second, cached, r2_ids=None):
    """R1 (8 ids, 1 output) runs and finishes; R2 (`second`, 8 ids) then hits `cached` of them in R1's blocks."""
    from .test_validate import P, S, prefill_inputs, run_start

    start = min(cached, 7)
    ns = 8 - start
    table2 = [2, 5] if cached == 8 else [2, 6]
    positions = list(range(start, 8))
    slots = [table2[p // 4] * 4 + p % 4 for p in positions]
    return stamp([
        run_start(bs=4, blocks=8),
        ev("request_added", seq_id=0, request_id="R1", prompt_len=8, max_tokens=1, ignore_eos=True,
           prompt_token_ids=R1_PROMPT),
        ev("before_schedule", 1, waiting=[0], running=[], free_blocks=8),
        ev("scheduled", 1, phase="prefill", seqs=[S(0, "R1", 8, 0, 8, [2, 5])]),
        ev("gpu_inputs", 1, **prefill_inputs(list(range(8)), [8, 9, 10, 11, 20, 21, 22, 23], [0, 8], [0, 8], 8, 8)),
        ev("sampled", 1, tokens=[{"seq_id": 0, "token_id": 500}]),
        ev("after_postprocess", 1, seqs=[P(0, "R1", 9, 0, 1, "FINISHED", [], True, 500, [])], free_blocks=8),
        ev("request_added", seq_id=1, request_id="R2", prompt_len=8, max_tokens=1, ignore_eos=True,
           prompt_token_ids=second if r2_ids is None else r2_ids),
        ev("before_schedule", 2, waiting=[1], running=[], free_blocks=8),
        ev("scheduled", 2, phase="prefill", seqs=[S(1, "R2", 8, cached, ns, table2)]),
        ev("gpu_inputs", 2, **prefill_inputs(positions, slots, [0, ns], [0, 8], ns, 8, block_tables=[table2])),
        ev("sampled", 2, tokens=[{"seq_id": 1, "token_id": 501}]),
        ev("after_postprocess", 2, seqs=[P(1, "R2", 9, 0, 1, "FINISHED", [], True, 501, [])], free_blocks=8),
        ev("run_end", steps=2, wall_s=0.01),
    ])


def test_a_whole_prompt_cached_recomputes_its_last_token():
    """A hit on every block of the prompt: the prefill feeds only the last position (its logits are needed)."""
    report = validate(prefix_log(R1_PROMPT, 8))
    assert report.ok, report.summary()
    assert {"prefix.content", "chunk.fits", "inputs.positions", "slots", "inputs.cu_seqlens_k"} <= held(report)


def test_a_partial_prefix_hit_compares_the_cached_block():
    second = R1_PROMPT[:4] + [99, 98, 97, 96]
    report = validate(prefix_log(second, 4))
    assert report.ok, report.summary()
    assert "prefix.content" in held(report)
    other = [11] + second[1:]
    report = validate(prefix_log(other, 4))
    assert names(report) == ["prefix.content"]
    assert "holds token 10 at position 0 where this prompt has 11" in report.first_failure.message


def test_prompt_ids_of_the_wrong_length_are_not_trusted():
    """prompt_token_ids that do not match prompt_len say nothing about the prompt: the hit is not checked."""
    report = validate(prefix_log(None, 4, r2_ids=[99] * 7))
    assert report.ok, report.summary()
    skipped = {c.name: c.message for c in report.checks if c.skipped}
    assert "request_added carries no prompt_token_ids" in skipped["prefix.content"]


def test_counts_tell_skipped_checks_from_passed_ones():
    report = validate(a_log())
    inv = report.of_kind("invariant")
    d = report.counts()["invariant"]
    assert d == {"passed": sum(c.ok and not c.skipped for c in inv), "failed": 0,
                 "skipped": sum(c.skipped for c in inv)}
    assert d["skipped"] > 0 and f"{d['skipped']} skipped" in report.summary()


# ----------------------------------------------------------------------------- a live window

def test_a_window_closing_with_other_free_blocks_fails_window_end():
    from labkit.serve.live_trace import cut_window

    window = cut_window(prefix_log(R1_PROMPT[:4] + [99, 98, 97, 96], 4), 1, 2)
    report = validate(window)
    assert report.ok and report.live, report.summary()
    assert {"window.end", "steps.contiguous"} <= held(report)
    close = next(e for e in window if e.get("event") == "live_state" and e["kind"] == "close")
    close["free_blocks"] -= 1
    report = validate(window)
    assert names(report) == ["window.end"]
    assert report.first_failure.message == "window end: free_blocks 7, the window's last step left 8"


def test_a_tracer_field_cannot_overwrite_the_stamps_the_validator_trusts():
    t = ListTracer(run="r")
    t.step = 3
    for field in ("step", "t_ns", "run", "v"):
        with pytest.raises(TypeError, match=f"'{field}'"):
            t.emit("kv_alloc", **{field: 9})
    t.emit("kv_alloc", seq_id=1)
    assert len(t.events) == 1 and t.events[0]["step"] == 3 and t.events[0]["run"] == "r" and t.events[0]["v"] == 1


@pytest.mark.parametrize("asked", [-1, 7, 999])
def test_the_pool_is_judged_by_the_blocks_the_engine_allocated_not_the_config_asked(asked):
    """config.num_kvcache_blocks is what was asked (-1: as many as fit, on a GPU); run_start.num_kvcache_blocks is
    what the pool has. A correct log whose config asked for another count still passes."""
    log = chunk_log()
    for e in log:
        if e["event"] == "run_start":
            assert e["num_kvcache_blocks"] == 64
            e["config"] = {**e["config"], "num_kvcache_blocks": asked}
    report = validate(log, load_case("chunk"))
    assert report.verdict == "PASS", [c.message for c in report.failures]
    for e in log:  # (and the count it reports is the one judged: one block short fails)
        if e["event"] == "run_start":
            e["num_kvcache_blocks"] = 63
    assert validate(log, load_case("chunk")).verdict == "FAIL"


@pytest.mark.parametrize("kind", ["scheduled", "after_postprocess"])
@pytest.mark.parametrize("bad", ["x", 5, [5], None, {"seq_id": 0}, True])
def test_a_step_events_seqs_that_is_not_a_list_of_objects_fails_the_schema_not_the_validator(kind, bad):
    """validate() as a library (the CLI's reader refuses such a line first): a malformed seqs is a schema failure
    and the rest of the log is still judged, never an exception."""
    log = chunk_log()
    for e in log:
        if e["event"] == kind and e["step"] == 2:
            e["seqs"] = bad
    report = validate(log, load_case("chunk"))
    assert report.verdict == "FAIL"
    assert any(c.kind == "schema" and f"{kind}.seqs" in c.message for c in report.failures)


def test_a_step_whose_checks_cannot_run_fails_step_events_and_the_next_steps_are_judged():
    log = chunk_log()
    for e in log:
        if e["event"] == "gpu_inputs" and e["step"] == 2:
            e["positions"] = 5
    report = validate(log, load_case("chunk"))
    failed = [c for c in report.failures if c.name == "step.events"]
    assert failed and "step 2: could not check this step (TypeError" in failed[0].message
    assert any(c.step == 3 and c.ok for c in report.checks)  # (step 3 is still judged)


def test_after_postprocess_reporting_an_unknown_sequence_fails_seq_known():
    log = chunk_log()
    for e in log:
        if e["event"] == "after_postprocess" and e["step"] == 2:
            e["seqs"].append({**e["seqs"][0], "seq_id": 99, "request_id": "Z"})
    report = validate(log, load_case("chunk"))
    assert any(c.name == "seq.known" and "after_postprocess reports unknown seq 99" in c.message
               for c in report.failures), [c.message for c in report.failures]
