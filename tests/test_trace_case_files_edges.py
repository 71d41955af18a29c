"""Case files at their edges (labkit/trace/cases.py): the longest request id, an empty range, sharing an earlier
prompt whole, a prompt exactly max_model_len long, a one-position range, a second final entry, the request
defaults (ignore_eos, the seed of a random prompt), an expectation for step 0."""
from __future__ import annotations

import pytest

from labkit.errors import LabkitError
from labkit.trace.cases import build_prompt_ids, expand_positions, format_positions, parse_case


def _case(*requests, **top):
    reqs = list(requests) or [{"id": "A", "prompt": {"range": [0, 5]}}]
    return parse_case({"name": "x", "requests": reqs, **top})


def test_a_request_id_may_be_100_characters_and_no_more():
    assert _case({"id": "A" * 100, "prompt": {"range": [0, 5]}}).request_ids == ["A" * 100]
    with pytest.raises(LabkitError, match="at most 100 printable characters"):
        _case({"id": "A" * 101, "prompt": {"range": [0, 5]}})


def test_an_empty_range_prompt_is_refused():
    assert _case({"id": "A", "prompt": {"range": [5, 6]}}).requests[0].prompt_len == 1
    with pytest.raises(LabkitError, match="stop must be greater than start"):
        _case({"id": "A", "prompt": {"range": [5, 5]}})


def test_a_prompt_may_share_an_earlier_prompt_whole():
    case = _case({"id": "A", "prompt": {"range": [100, 104]}},
                 {"id": "B", "prompt": {"range": [200, 206], "share_prefix": {"with": "A", "tokens": 4}}})
    assert build_prompt_ids(case, 1000)["B"] == [100, 101, 102, 103, 204, 205]
    with pytest.raises(LabkitError, match="asks 5 tokens but request A's prompt has only 4"):
        _case({"id": "A", "prompt": {"range": [100, 104]}},
              {"id": "B", "prompt": {"range": [200, 206], "share_prefix": {"with": "A", "tokens": 5}}})


def test_a_prompt_may_be_exactly_max_model_len_long():
    engine = {"max_model_len": 16, "max_num_batched_tokens": 16}
    assert _case({"id": "A", "prompt": {"range": [0, 16]}}, engine=engine).requests[0].prompt_len == 16
    with pytest.raises(LabkitError, match="prompt has 17 tokens, more than engine.max_model_len 16"):
        _case({"id": "A", "prompt": {"range": [0, 17]}}, engine=engine)


def test_a_one_position_range_reads_as_that_position():
    assert expand_positions("5..5 + 7") == [5, 7]
    with pytest.raises(ValueError, match="runs backwards"):
        expand_positions("6..5")


def test_a_case_has_at_most_one_final_entry():
    final = {"final": {"A": {"outputs": 1}}}
    assert _case(expect=[final]).expect == [final]
    with pytest.raises(LabkitError, match="a second 'final' entry"):
        _case(expect=[final, final])


def test_a_requests_defaults_ignore_eos_and_draw_random_ids_with_seed_zero():
    case = _case({"id": "A", "prompt": {"random": 8}}, {"id": "B", "prompt": {"random": 8, "seed": 0}})
    assert case.requests[0].ignore_eos is True and case.requests[0].sampling_kwargs()["ignore_eos"] is True
    ids = build_prompt_ids(case, 5000)
    assert ids["A"] == ids["B"]


def test_an_expectation_for_step_0_is_refused():
    assert _case(expect=[{"step": 1, "free": 3}]).expect[0]["step"] == 1
    with pytest.raises(LabkitError, match="step: must be >= 1, got 0"):
        _case(expect=[{"step": 0, "free": 3}])


@pytest.mark.parametrize("requests, message", [
    ([], "requests: must be a non-empty list"),
    ([{"id": "A", "prompt": {"tokens": []}}], "tokens: must be a non-empty list of token ids"),
    ([{"id": "A", "prompt": {"text": ""}}], "text: must be a non-empty string"),
    ([{"id": "A", "prompt": {"range": 5}}], r"range: must be \[start, stop\] integers, got 5"),
    ([{"id": "A", "prompt": {"range": [1, 2, 3]}}], r"range: must be \[start, stop\] integers, got \[1, 2, 3\]"),
    # a prefix longer than the prompt that shares it (its own length known before any tokenizer runs)
    ([{"id": "A", "prompt": {"range": [100, 104]}},
      {"id": "B", "prompt": {"range": [200, 202], "share_prefix": {"with": "A", "tokens": 3}}}],
     "share_prefix.tokens: asks 3 tokens but this prompt has only 2"),
])
def test_an_empty_or_malformed_prompt_is_refused_by_name(requests, message):
    with pytest.raises(LabkitError, match=message):
        parse_case({"name": "x", "requests": requests})


def test_a_step_expectation_names_eager_or_graph_and_an_empty_queue_may_be_null():
    case = _case(expect=[{"step": 1, "inputs": {"execution": "graph"}, "before": {"waiting": None, "free": 3}}])
    assert case.expect[0]["inputs"] == {"execution": "graph"}
    assert case.expect[0]["before"] == {"waiting": [], "free": 3}
    with pytest.raises(LabkitError, match="execution: must be eager or graph, got 'cuda'"):
        _case(expect=[{"step": 1, "inputs": {"execution": "cuda"}}])


def test_positions_in_brackets_and_a_list_cut_into_parts_with_a_remainder():
    assert expand_positions("[0..2 + 5]") == [0, 1, 2, 5]
    # cut at the sequences' lengths; what is left past them is one more part, not dropped
    assert format_positions([0, 1, 7, 8, 9], parts=[2]) == "0..1 + 7..9"


def test_a_prompt_may_be_a_shared_prefix_whole_and_errors_name_the_case():
    case = _case({"id": "A", "prompt": {"range": [100, 106]}},
                 {"id": "B", "prompt": {"range": [200, 203], "share_prefix": {"with": "A", "tokens": 3}}})
    assert build_prompt_ids(case, 1000)["B"] == [100, 101, 102]
    with pytest.raises(LabkitError, match=r"^x: vocab_size must be a positive integer, got 0"):
        build_prompt_ids(case, 0)
