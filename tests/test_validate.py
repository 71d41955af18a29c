"""Event-log validation against hand-written logs of EXPECTED.md's cases A, seed-chunk, preempt.

The logs below are written by hand from EXPECTED.md's tables (physical block ids are free, so
they are chosen out of order to exercise the slot formula). No simulator is involved.
"""
from __future__ import annotations

import json

import pytest

from labkit.errors import LabkitError
from labkit.trace.cases import load_case
from labkit.trace.events import read_jsonl, write_jsonl
from labkit.trace.tables import TSV_COLUMNS, steps_table, tsv_rows, write_tsv
from labkit.trace.validate import Report, change_text, validate


def ev(event, step=None, **fields):
    return {"v": 1, "event": event, "run": "hand", "t_ns": 0, "step": step, **fields}


def stamp(events):
    for i, e in enumerate(events):
        e["t_ns"] = 1_000 * (i + 1)
    return events


def S(seq_id, rid, total, cached, scheduled, table):
    return {"seq_id": seq_id, "request_id": rid, "num_tokens": total, "num_cached_tokens": cached,
            "num_scheduled_tokens": scheduled, "block_table": table}


def P(seq_id, rid, total, cached, outputs, status, table, accepted, token, refs):
    return {"seq_id": seq_id, "request_id": rid, "num_tokens": total, "num_cached_tokens": cached,
            "num_completion_tokens": outputs, "status": status, "block_table": table,
            "accepted": accepted, "token_id": token, "ref_counts": refs}


def prefill_inputs(positions, slots, cu_q, cu_k, max_q, max_k, block_tables=None):
    return dict(num_input_ids=len(positions), positions=positions, slot_mapping=slots,
                cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
                context_lens=None, block_tables=block_tables, execution="eager", graph_batch=None)


def decode_inputs(positions, slots, ctx, tables):
    return dict(num_input_ids=len(positions), positions=positions, slot_mapping=slots,
                cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=1, max_seqlen_k=None,
                context_lens=ctx, block_tables=tables, execution="eager", graph_batch=None)


def run_start(bs=256, blocks=64, **cfg):
    config = {"max_num_batched_tokens": 512, "max_num_seqs": 16, "max_model_len": 1024,
              "kvcache_block_size": bs, "num_kvcache_blocks": blocks, "enforce_eager": True}
    config.update(cfg)
    return ev("run_start", config=config, model={"path": "fake", "config_sha256": "0"},
              device="cpu", versions={}, block_size=bs, num_kvcache_blocks=blocks)


def added(seq_id, rid, prompt_len, max_tokens):
    return ev("request_added", seq_id=seq_id, request_id=rid, prompt_len=prompt_len,
              max_tokens=max_tokens, ignore_eos=True)


def a_log():
    """EXPECTED case A: R1 = 3 tokens, 3 outputs; R1 holds physical block 7."""
    return stamp([
        run_start(max_num_seqs=2),
        added(0, "R1", 3, 3),
        ev("before_schedule", 1, waiting=[0], running=[], free_blocks=64),
        ev("scheduled", 1, phase="prefill", seqs=[S(0, "R1", 3, 0, 3, [7])]),
        ev("gpu_inputs", 1, **prefill_inputs([0, 1, 2], [1792, 1793, 1794], [0, 3], [0, 3], 3, 3)),
        ev("sampled", 1, tokens=[{"seq_id": 0, "token_id": 500}]),
        ev("after_postprocess", 1, seqs=[P(0, "R1", 4, 3, 1, "RUNNING", [7], True, 500, [1])],
           free_blocks=63),
        ev("before_schedule", 2, waiting=[], running=[0], free_blocks=63),
        ev("scheduled", 2, phase="decode", seqs=[S(0, "R1", 4, 3, 1, [7])]),
        ev("gpu_inputs", 2, **decode_inputs([3], [1795], [4], [[7]])),
        ev("sampled", 2, tokens=[{"seq_id": 0, "token_id": 501}]),
        ev("after_postprocess", 2, seqs=[P(0, "R1", 5, 4, 2, "RUNNING", [7], True, 501, [1])],
           free_blocks=63),
        ev("before_schedule", 3, waiting=[], running=[0], free_blocks=63),
        ev("scheduled", 3, phase="decode", seqs=[S(0, "R1", 5, 4, 1, [7])]),
        ev("gpu_inputs", 3, **decode_inputs([4], [1796], [5], [[7]])),
        ev("sampled", 3, tokens=[{"seq_id": 0, "token_id": 502}]),
        ev("after_postprocess", 3, seqs=[P(0, "R1", 6, 0, 3, "FINISHED", [], True, 502, [])],
           free_blocks=64),
        ev("run_end", steps=3, wall_s=0.01),
    ])


A_TABLE = [4, 1, 7]   # physical blocks of A (700 tokens); B (32 tokens) holds block 0


def chunk_log():
    """EXPECTED seed-chunk: A = 700 tokens, B = 32, budget 512, 3 outputs each."""
    s1_slots = list(range(4 * 256, 5 * 256)) + list(range(1 * 256, 2 * 256))   # pos 0..511
    s2_slots = list(range(7 * 256, 7 * 256 + 188)) + list(range(0, 32))         # 512..699, 0..31
    return stamp([
        run_start(),
        added(0, "A", 700, 3),
        added(1, "B", 32, 3),
        ev("before_schedule", 1, waiting=[0, 1], running=[], free_blocks=64),
        ev("scheduled", 1, phase="prefill", seqs=[S(0, "A", 700, 0, 512, A_TABLE)]),
        ev("gpu_inputs", 1, **prefill_inputs(list(range(512)), s1_slots, [0, 512], [0, 512], 512, 512)),
        ev("sampled", 1, tokens=[{"seq_id": 0, "token_id": 900}]),
        ev("after_postprocess", 1,
           seqs=[P(0, "A", 700, 512, 0, "WAITING", A_TABLE, False, 900, [1, 1, 1])], free_blocks=61),
        ev("before_schedule", 2, waiting=[0, 1], running=[], free_blocks=61),
        ev("scheduled", 2, phase="prefill",
           seqs=[S(0, "A", 700, 512, 188, A_TABLE), S(1, "B", 32, 0, 32, [0])]),
        ev("gpu_inputs", 2, **prefill_inputs(list(range(512, 700)) + list(range(32)), s2_slots,
                                             [0, 188, 220], [0, 700, 732], 188, 700,
                                             block_tables=[A_TABLE, [0, -1, -1]])),
        ev("sampled", 2, tokens=[{"seq_id": 0, "token_id": 901}, {"seq_id": 1, "token_id": 902}]),
        ev("after_postprocess", 2,
           seqs=[P(0, "A", 701, 700, 1, "RUNNING", A_TABLE, True, 901, [1, 1, 1]),
                 P(1, "B", 33, 32, 1, "RUNNING", [0], True, 902, [1])], free_blocks=60),
        ev("before_schedule", 3, waiting=[], running=[0, 1], free_blocks=60),
        ev("scheduled", 3, phase="decode",
           seqs=[S(0, "A", 701, 700, 1, A_TABLE), S(1, "B", 33, 32, 1, [0])]),
        ev("gpu_inputs", 3, **decode_inputs([700, 32], [7 * 256 + 188, 32], [701, 33],
                                            [A_TABLE, [0, -1, -1]])),
        ev("sampled", 3, tokens=[{"seq_id": 0, "token_id": 903}, {"seq_id": 1, "token_id": 904}]),
        ev("after_postprocess", 3,
           seqs=[P(0, "A", 702, 701, 2, "RUNNING", A_TABLE, True, 903, [1, 1, 1]),
                 P(1, "B", 34, 33, 2, "RUNNING", [0], True, 904, [1])], free_blocks=60),
        ev("before_schedule", 4, waiting=[], running=[0, 1], free_blocks=60),
        ev("scheduled", 4, phase="decode",
           seqs=[S(0, "A", 702, 701, 1, A_TABLE), S(1, "B", 34, 33, 1, [0])]),
        ev("gpu_inputs", 4, **decode_inputs([701, 33], [7 * 256 + 189, 33], [702, 34],
                                            [A_TABLE, [0, -1, -1]])),
        ev("sampled", 4, tokens=[{"seq_id": 0, "token_id": 905}, {"seq_id": 1, "token_id": 906}]),
        ev("after_postprocess", 4,
           seqs=[P(0, "A", 703, 0, 3, "FINISHED", [], True, 905, []),
                 P(1, "B", 35, 0, 3, "FINISHED", [], True, 906, [])], free_blocks=64),
        ev("run_end", steps=4, wall_s=0.02),
    ])


def preempt_log():
    """EXPECTED seed-preempt: block size 4, 4 blocks, A/B/C 4 tokens each, 3 outputs."""
    return stamp([
        run_start(bs=4, blocks=4, max_model_len=64),
        added(0, "A", 4, 3), added(1, "B", 4, 3), added(2, "C", 4, 3),
        ev("before_schedule", 1, waiting=[0, 1, 2], running=[], free_blocks=4),
        ev("scheduled", 1, phase="prefill",
           seqs=[S(0, "A", 4, 0, 4, [0]), S(1, "B", 4, 0, 4, [1]), S(2, "C", 4, 0, 4, [2])]),
        ev("gpu_inputs", 1, **prefill_inputs([0, 1, 2, 3] * 3, list(range(12)), [0, 4, 8, 12],
                                             [0, 4, 8, 12], 4, 4)),
        ev("sampled", 1, tokens=[{"seq_id": i, "token_id": 10 + i} for i in range(3)]),
        ev("after_postprocess", 1,
           seqs=[P(0, "A", 5, 4, 1, "RUNNING", [0], True, 10, [1]),
                 P(1, "B", 5, 4, 1, "RUNNING", [1], True, 11, [1]),
                 P(2, "C", 5, 4, 1, "RUNNING", [2], True, 12, [1])], free_blocks=1),
        ev("before_schedule", 2, waiting=[], running=[0, 1, 2], free_blocks=1),
        ev("preempted", 2, seq_id=2, request_id="C"),
        ev("scheduled", 2, phase="decode", seqs=[S(0, "A", 5, 4, 1, [0, 3]), S(1, "B", 5, 4, 1, [1, 2])]),
        ev("gpu_inputs", 2, **decode_inputs([4, 4], [12, 8], [5, 5], [[0, 3], [1, 2]])),
        ev("sampled", 2, tokens=[{"seq_id": 0, "token_id": 20}, {"seq_id": 1, "token_id": 21}]),
        ev("after_postprocess", 2,
           seqs=[P(0, "A", 6, 5, 2, "RUNNING", [0, 3], True, 20, [1, 1]),
                 P(1, "B", 6, 5, 2, "RUNNING", [1, 2], True, 21, [1, 1])], free_blocks=0),
        ev("before_schedule", 3, waiting=[2], running=[0, 1], free_blocks=0),
        ev("scheduled", 3, phase="decode", seqs=[S(0, "A", 6, 5, 1, [0, 3]), S(1, "B", 6, 5, 1, [1, 2])]),
        ev("gpu_inputs", 3, **decode_inputs([5, 5], [13, 9], [6, 6], [[0, 3], [1, 2]])),
        ev("sampled", 3, tokens=[{"seq_id": 0, "token_id": 30}, {"seq_id": 1, "token_id": 31}]),
        ev("after_postprocess", 3,
           seqs=[P(0, "A", 7, 0, 3, "FINISHED", [], True, 30, []),
                 P(1, "B", 7, 0, 3, "FINISHED", [], True, 31, [])], free_blocks=4),
        ev("before_schedule", 4, waiting=[2], running=[], free_blocks=4),
        ev("scheduled", 4, phase="prefill", seqs=[S(2, "C", 5, 0, 5, [1, 2])]),
        ev("gpu_inputs", 4, **prefill_inputs([0, 1, 2, 3, 4], [4, 5, 6, 7, 8], [0, 5], [0, 5], 5, 5)),
        ev("sampled", 4, tokens=[{"seq_id": 2, "token_id": 40}]),
        ev("after_postprocess", 4, seqs=[P(2, "C", 6, 5, 2, "RUNNING", [1, 2], True, 40, [1, 1])],
           free_blocks=2),
        ev("before_schedule", 5, waiting=[], running=[2], free_blocks=2),
        ev("scheduled", 5, phase="decode", seqs=[S(2, "C", 6, 5, 1, [1, 2])]),
        ev("gpu_inputs", 5, **decode_inputs([5], [9], [6], [[1, 2]])),
        ev("sampled", 5, tokens=[{"seq_id": 2, "token_id": 50}]),
        ev("after_postprocess", 5, seqs=[P(2, "C", 7, 0, 3, "FINISHED", [], True, 50, [])],
           free_blocks=4),
        ev("run_end", steps=5, wall_s=0.01),
    ])


def step_event(events, step, name):
    return next(e for e in events if e["event"] == name and e["step"] == step)


def failures(report: Report) -> list[str]:
    return [c.name for c in report.failures]


# ----------------------------------------------------------------------------- correct logs pass

@pytest.mark.parametrize("case,make", [("A", a_log), ("chunk", chunk_log), ("preempt", preempt_log)])
def test_correct_log_passes(case, make):
    report = validate(make(), load_case(case))
    assert report.ok, report.summary()
    assert report.first_failure is None
    assert report.judged
    assert report.steps == len(load_case(case).expect) - 1
    expects = report.of_kind("expect")
    assert len(expects) > 30 and all(c.ok for c in expects)
    held = {c.name for c in report.of_kind("invariant") if c.ok and not c.skipped}
    assert {"slots", "inputs.cu_seqlens_q", "inputs.cu_seqlens_k", "inputs.positions",
            "blocks.returned", "requests.finished", "accepted.counts", "refs"} <= held
    json.dumps(report.to_dict())     # JSON-ready


def test_invariants_without_case():
    for make in (a_log, chunk_log, preempt_log):
        report = validate(make())
        assert report.ok, report.summary()
        assert not report.judged
    names = {c.name for c in validate(chunk_log()).checks if c.ok and not c.skipped}
    assert "discarded" in names
    names = {c.name for c in validate(preempt_log()).checks if c.ok and not c.skipped}
    assert {"preempted", "queues"} <= names


# ----------------------------------------------------------------------------- broken logs fail

def test_wrong_slot_fails_naming_the_step():
    log = chunk_log()
    step_event(log, 2, "gpu_inputs")["slot_mapping"][5] += 1
    report = validate(log, load_case("chunk"))
    assert not report.ok
    ff = report.first_failure
    assert ff.name == "slots" and ff.step == 2 and ff.request == "A"
    assert "step 2" in ff.message and "slot_mapping[5]" in ff.message
    assert ff.expected == 7 * 256 + 5 and ff.actual == 7 * 256 + 6
    assert failures(report) == ["slots"]


def test_discarded_candidate_becoming_an_output_fails():
    log = chunk_log()
    a = step_event(log, 1, "after_postprocess")["seqs"][0]
    a["num_completion_tokens"] = 1
    report = validate(log)
    assert not report.ok
    ff = report.first_failure
    assert ff.name == "discarded" and ff.step == 1 and ff.request == "A"
    assert "a chunk or discarded row became an output" in ff.message


def test_discarded_candidate_marked_accepted_fails():
    log = chunk_log()
    a = step_event(log, 1, "after_postprocess")["seqs"][0]
    a["accepted"] = True
    report = validate(log)
    assert "accepted.rule" in failures(report)
    assert report.first_failure.step == 1


def test_wrong_expected_number_names_step_request_field(tmp_path):
    text = load_case("chunk").path.read_text()
    old = "A: {total: 701, cached: 700, outputs: 1, status: RUNNING, blocks: 3, accepted: true}"
    assert text.count(old) == 1
    bad = tmp_path / "chunk-bad.yaml"
    bad.write_text(text.replace(old, old.replace("cached: 700", "cached: 699")))
    report = validate(chunk_log(), load_case(str(bad)))
    assert not report.ok
    fails = report.failures
    assert len(fails) == 1
    f = fails[0]
    assert f.kind == "expect" and f.step == 2 and f.request == "A" and f.field == "cached"
    assert f.expected == 699 and f.actual == 700
    assert f.message == "step 2, request A, cached: expected 699, got 700"


def test_log_differing_from_expectation():
    log = chunk_log()
    # the log says A's second chunk started from 0 cached: both invariants and the case object
    step_event(log, 2, "scheduled")["seqs"][0]["num_cached_tokens"] = 0
    report = validate(log, load_case("chunk"))
    msgs = [c.message for c in report.failures if c.kind == "expect"]
    assert "step 2, request A, scheduled.cached: expected 512, got 0" in msgs



def test_an_expected_field_the_log_leaves_out_is_a_failed_expectation():
    """A log that does not report what the case expects (a field dropped from an event) fails that expectation:
    absent is not equal."""
    log = chunk_log()
    del step_event(log, 2, "scheduled")["seqs"][0]["num_cached_tokens"]
    report = validate(log, load_case("chunk"))
    bad = [c for c in report.failures if c.kind == "expect"]
    got = [(c.step, c.request, c.field, c.expected, c.actual) for c in bad]
    assert got == [(2, "A", "scheduled.cached", 512, None)]
    assert report.verdict == "FAIL"

def test_blocks_not_returned_fails():
    log = chunk_log()
    step_event(log, 4, "after_postprocess")["free_blocks"] = 63
    report = validate(log)
    # the step that lost it (accounting: free + held must be the pool) and the end of the run
    assert failures(report) == ["blocks.accounting", "blocks.returned"]
    assert "1 block(s) neither free nor held" in report.first_failure.message
    assert "not returned" in report.failures[1].message
    report = validate(log, load_case("chunk"))
    assert {"blocks.returned", "expect"} <= set(failures(report))


def test_unfinished_run_fails():
    log = [e for e in chunk_log() if e["step"] != 4 and e["event"] != "run_end"]
    names = failures(validate(log))
    assert {"run.end", "requests.finished", "blocks.returned"} <= set(names)


def test_cu_seqlens_k_and_positions_checked():
    log = chunk_log()
    step_event(log, 2, "gpu_inputs")["cu_seqlens_k"] = [0, 188, 220]
    assert failures(validate(log)) == ["inputs.cu_seqlens_k"]
    log = chunk_log()
    gi = step_event(log, 2, "gpu_inputs")
    gi["positions"] = list(range(188)) + list(range(32))
    report = validate(log)
    assert failures(report) == ["inputs.positions"]
    assert "512..699 + 0..31" in report.first_failure.message


def test_only_first_prefill_seq_may_be_chunked():
    log = chunk_log()
    step_event(log, 2, "scheduled")["seqs"][1]["num_scheduled_tokens"] = 16
    report = validate(log)
    assert "policy.chunk_first_only" in failures(report) and report.verdict == "FAIL"
    # nano's rule, not correctness: an experiment may change it (then it is part of the diff, while the
    # inputs that no longer match the scheduled counts still gate)
    changed = validate(log, expect_changes=True, why_changes="test")
    assert [c.name for c in changed.changes] == ["policy.chunk_first_only"]
    assert "policy.chunk_first_only" not in [c.name for c in changed.gating_failures]
    assert "step 2: B is chunked (16 of 32 tokens) but is not first" in change_text(changed.changes[0])


def test_mixed_phase_fails():
    log = chunk_log()
    step_event(log, 3, "scheduled")["phase"] = "prefill"
    assert "phase.mixed" in failures(validate(log))


def test_decode_shape_and_context_lens():
    log = a_log()
    step_event(log, 2, "gpu_inputs")["context_lens"] = [3]
    assert failures(validate(log)) == ["inputs.context_lens"]


def test_preempted_seq_state_tracked():
    log = preempt_log()
    # forgetting C's preemption makes the queues before step 3 disagree
    log = [e for e in log if e["event"] != "preempted"]
    report = validate(log, load_case("preempt"))
    assert "queues" in failures(report)
    assert any(c.field == "preempted" for c in report.failures if c.kind == "expect")


def test_ref_counts_checked():
    log = chunk_log()
    step_event(log, 2, "after_postprocess")["seqs"][0]["ref_counts"] = [2, 1, 1]
    assert failures(validate(log)) == ["refs"]


def test_missing_step_in_log_is_reported():
    log = [e for e in a_log() if e["step"] != 3]
    report = validate(log, load_case("A"))
    assert any("step 3, step: not in the log" in c.message for c in report.failures)


def test_schema_problems_reported_not_crashing():
    log = chunk_log()
    del step_event(log, 2, "scheduled")["seqs"][1]["block_table"]
    step_event(log, 3, "gpu_inputs")["v"] = 2
    report = validate(log)
    assert not report.ok
    schema = [c for c in report.failures if c.kind == "schema"]
    assert len(schema) == 2


# ----------------------------------------------------------------------------- files and tables

def test_jsonl_round_trip_and_errors(tmp_path):
    p = write_jsonl(chunk_log(), tmp_path / "events.jsonl")
    assert read_jsonl(p) == chunk_log()
    lines = p.read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines[:2] + ["{not json"] + lines[3:]) + "\n")
    with pytest.raises(LabkitError, match=r"bad.jsonl:3: not valid JSON"):
        read_jsonl(bad)
    e = json.loads(lines[4])
    e["v"] = 2
    bad.write_text("\n".join(lines[:4] + [json.dumps(e)] + lines[5:]) + "\n")
    with pytest.raises(LabkitError, match=r"bad.jsonl:5: .*v=2"):
        read_jsonl(bad)
    e = json.loads(lines[4])
    del e["seqs"]
    bad.write_text("\n".join(lines[:4] + [json.dumps(e)]) + "\n")
    with pytest.raises(LabkitError, match=r"bad.jsonl:5: scheduled event lacks seqs"):
        read_jsonl(bad)
    with pytest.raises(LabkitError, match="cannot read"):
        read_jsonl(tmp_path / "absent.jsonl")


def test_steps_table_uses_expected_notation():
    rows = steps_table(chunk_log())
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    r1, r2, r3 = rows[0], rows[1], rows[2]
    assert r1["scheduled"] == "A 700/0/512/3"
    assert r1["after"] == "A 700/512/0 WAITING 3 discarded"
    assert r1["free"] == 61
    assert r2["scheduled"] == "A 700/512/188/3; B 32/0/32/1"
    assert r2["inputs"] == "T=220 pos 512..699 + 0..31 cu_q [0, 188, 220] cu_k [0, 700, 732]"
    assert r2["after"] == "A 701/700/1 RUNNING 3 acc; B 33/32/1 RUNNING 1 acc"
    assert r3["inputs"] == "T=2 pos [700, 32] ctx [701, 33]"
    assert r3["waiting"] == [] and r3["running"] == ["A", "B"]
    assert steps_table(preempt_log())[1]["preempted"] == "C"


def test_write_tsv(tmp_path):
    p = write_tsv(preempt_log(), tmp_path / "trace.tsv")
    lines = p.read_text().splitlines()
    assert lines[0].split("\t") == list(TSV_COLUMNS)
    rows = tsv_rows(preempt_log())
    assert len(lines) == len(rows) + 1
    # step 1: 3 seqs; step 2: A, B + C preempted; step 3: 2; step 4: 1; step 5: 1
    assert [r["step"] for r in rows] == [1, 1, 1, 2, 2, 2, 3, 3, 4, 5]
    pre = [r for r in rows if r["note"] == "preempted"]
    assert len(pre) == 1 and pre[0]["request_id"] == "C" and pre[0]["step"] == 2
    first = dict(zip(TSV_COLUMNS, lines[1].split("\t")))
    assert first["request_id"] == "A" and first["total"] == "5" and first["cached"] == "4"
    assert first["scheduled"] == "4" and first["status"] == "RUNNING" and first["accepted"] == "1"
    chunk_rows = tsv_rows(chunk_log())
    assert chunk_rows[0]["accepted"] == 0 and chunk_rows[0]["note"] == "discarded"


# ----------------------------------------------------------------------------- verdicts

def test_sampled_event_is_required():
    log = [e for e in chunk_log() if not (e["event"] == "sampled" and e["step"] == 2)]
    report = validate(log)
    assert failures(report) == ["step.events"]
    assert report.first_failure.message == "step 2: 0 sampled events (expected exactly one)"


def test_verdicts_follow_what_was_expected(tmp_path):
    assert validate(chunk_log(), load_case("chunk")).verdict == "PASS"
    assert validate(chunk_log()).verdict == "RECORDED"          # nothing to judge against
    text = load_case("chunk").path.read_text()
    bad = tmp_path / "chunk-other.yaml"
    bad.write_text(text.replace("A: {total: 701, cached: 700, outputs: 1", "A: {total: 701, cached: 699, outputs: 1"))
    strict = validate(chunk_log(), load_case(str(bad)))
    assert strict.verdict == "FAIL" and not strict.passed
    changed = validate(chunk_log(), load_case(str(bad)), expect_changes=True,
                       why_changes="override --max-num-batched-tokens 9")
    assert changed.verdict == "CHANGED" and changed.passed and not changed.gating_failures
    assert [change_text(c) for c in changed.changes] == ["step 2: A cached 700 instead of 699"]
    assert "override --max-num-batched-tokens 9" in changed.summary()
    d = changed.to_dict()
    assert d["verdict"] == "CHANGED" and d["first_failure"] is None and d["changes"][0]["actual"] == 700
    # an invariant failure is FAIL whatever was expected
    log = chunk_log()
    step_event(log, 2, "gpu_inputs")["slot_mapping"][5] += 1
    assert validate(log, load_case(str(bad)), expect_changes=True).verdict == "FAIL"


def test_scheduled_list_change_reads_as_a_diff():
    log = a_log()
    step_event(log, 3, "scheduled")["seqs"] = []
    report = validate(log, load_case("A"), expect_changes=True)
    texts = [change_text(c) for c in report.changes]
    assert "step 3: scheduled nothing instead of R1" in texts


@pytest.mark.parametrize("field, value", [("model", "just-a-path"), ("model", {"path": 7}), ("config", [1]),
                                          ("versions", "x"), ("device", {"type": "cpu"})])
def test_a_run_start_of_the_wrong_shape_is_refused_naming_it(tmp_path, capsys, field, value):
    """Issue 22: `trace check` on a log whose run_start.model is a string ended in a one-line AttributeError."""
    from .helpers import run_cli

    events = chunk_log()
    events[0][field] = value
    log = write_jsonl(events, tmp_path / "events.jsonl")
    code, _, err = run_cli(["trace", "check", str(log), "--case", "chunk"], capsys)
    where = "run_start.model.path" if isinstance(value, dict) and field == "model" else f"run_start.{field}"
    assert code == 2 and f"events.jsonl:1: {where} must be" in err and "Error" not in err
