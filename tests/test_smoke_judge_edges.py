"""`labkit smoke`'s checks at their edges: an id equal to the vocabulary size, no KV blocks, no tokens."""
from __future__ import annotations

from labkit import smoke


def _by_name(checks):
    return {c["name"]: c["passed"] for c in checks}


def test_a_token_id_equal_to_the_vocab_size_is_out_of_vocab():
    assert _by_name(smoke.judge([{}], [0, 9], 2, 10, 4))["ids in vocab"] is True
    assert _by_name(smoke.judge([{}], [0, 10], 2, 10, 4))["ids in vocab"] is False
    assert _by_name(smoke.judge([{}], [-1, 3], 2, 10, 4))["ids in vocab"] is False


def test_no_kv_blocks_fails_the_smoke():
    assert _by_name(smoke.judge([{}], [1, 2], 2, 10, 1))["kv blocks"] is True
    assert _by_name(smoke.judge([{}], [1, 2], 2, 10, 0))["kv blocks"] is False


def test_no_tokens_at_all_is_no_proof_that_the_ids_are_in_vocab():
    # smoke.json lists every check: an empty generation must not show "ids in vocab" as PASS.
    checks = _by_name(smoke.judge([{}], [], 2, 10, 4))
    assert checks["token count"] is False and checks["ids in vocab"] is False


def test_smoke_md_marks_each_check_by_its_own_result():
    result = {"status": "FAIL", "argv": ["smoke"], "model": {"path": "m"}, "device": {"name": "cpu"},
              "engine": {"device": "cpu", "execution": "eager", "tensor_parallel_size": 1},
              "prompt_tokens": 3, "token_ids": [1], "text": "x", "init_s": 0.1, "generate_s": 0.2,
              "checks": [{"name": "good one", "passed": True, "detail": "d"},
                         {"name": "bad one", "passed": False, "detail": "d"}]}
    md = smoke.markdown(result)
    assert "| good one | PASS | d |" in md and "| bad one | FAIL | d |" in md
