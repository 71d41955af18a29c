"""Case files, event schema and the trace verdict's texts at their edges (labkit/trace/cases.py, events.py,
command.py): a range prompt's length, positions written compactly and read back at the step limit, random ids in
the smallest vocabulary that has them, the last id of a vocabulary; a step event at step 0, two events at one
time, where a request first finished; the steps a run took past its case."""
from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from labkit.errors import LabkitError
from labkit.trace.cases import build_prompt_ids, expand_positions, format_positions, parse_case
from labkit.trace.command import _steps_past_the_case
from labkit.trace.events import EventLog, event_problems


def _case(prompt, **top):
    return parse_case({"name": "x", "requests": [{"id": "A", "prompt": prompt}], **top})


def test_a_range_prompts_length_is_the_number_of_ids_it_gives():
    case = _case({"range": [3, 8]})
    ids = build_prompt_ids(case, 100)["A"]
    assert ids == [3, 4, 5, 6, 7]
    assert case.requests[0].prompt_len == len(ids) == 5


def test_positions_are_written_as_runs_and_a_lone_position_as_itself():
    assert format_positions([5]) == "5"
    assert format_positions([0, 1, 2, 7]) == "0..2 + 7"
    assert format_positions([0, 1, 2, 0, 1], parts=[3, 1, 1]) == "0..2 + 0 + 1"


def test_expand_positions_takes_exactly_the_limit():
    assert expand_positions("0..9", limit=10) == list(range(10))
    with pytest.raises(ValueError, match="more than a step can hold"):
        expand_positions("0..9", limit=9)


def test_a_steps_positions_may_hold_the_token_budget_plus_a_decode_row_per_sequence():
    engine = {"max_num_batched_tokens": 16, "max_num_seqs": 4, "max_model_len": 16}
    case = _case({"range": [0, 5]}, engine=engine, expect=[{"step": 1, "inputs": {"positions": "0..19"}}])
    assert len(case.expect[0]["inputs"]["positions"]) == 16 + 4
    with pytest.raises(LabkitError, match="positions"):
        _case({"range": [0, 5]}, engine=engine, expect=[{"step": 1, "inputs": {"positions": "0..20"}}])


def test_random_ids_need_a_vocabulary_past_their_lowest_id():
    case = _case({"random": 4})
    with pytest.raises(LabkitError, match="vocabulary larger than 100"):
        build_prompt_ids(case, 100)
    assert build_prompt_ids(case, 101)["A"] == [100] * 4   # one id to draw from: [100, 101)


def test_an_id_equal_to_the_vocabulary_size_is_refused():
    assert build_prompt_ids(_case({"tokens": [0, 7]}), 8)["A"] == [0, 7]
    with pytest.raises(LabkitError, match="outside the model's vocabulary"):
        build_prompt_ids(_case({"tokens": [0, 8]}), 8)


# ----------------------------------------------------------------------------- the event log


def _ev(event, step, t, **kw):
    return {"v": 1, "event": event, "run": "r", "t_ns": t, "step": step, **kw}


def test_a_step_event_at_step_0_is_a_schema_problem():
    assert any("step >= 1" in p for p in event_problems(_ev("scheduled", 0, 0, phase="prefill", seqs=[])))
    assert event_problems(_ev("scheduled", 1, 0, phase="prefill", seqs=[])) == []


def test_two_events_at_one_time_are_not_time_going_backwards():
    log = EventLog([_ev("preempted", 1, 5, seq_id=1, request_id="A"),
                    _ev("preempted", 1, 5, seq_id=2, request_id="B"),
                    _ev("preempted", 1, 4, seq_id=3, request_id="C")])
    assert log.num_time_reversals == 1 and log.time_reversals == [("preempted", 1, 5, 4)]


def test_a_request_finished_at_its_first_finished_row():
    def done(step, t):
        return _ev("after_postprocess", step, t, free_blocks=1,
                   seqs=[{"seq_id": 1, "request_id": "A", "status": "FINISHED"}])
    log = EventLog([_ev("preempted", 1, 0, seq_id=2, request_id="B"), done(1, 1), done(2, 2)])
    assert log.finished_at == {"A": 1}


# ----------------------------------------------------------------------------- the verdict's texts


def test_the_steps_past_the_case_are_named_one_or_a_range():
    case = NS(expect=[{"step": 1}, {"step": 3}, {"final": {}}])
    assert _steps_past_the_case(NS(steps=3), case) == ""
    assert _steps_past_the_case(NS(steps=4), case) == \
        "  step 4: not in the case (its expected states end at step 3; the run took 4)"
    assert _steps_past_the_case(NS(steps=6), case).startswith("  steps 4-6: not in the case")
