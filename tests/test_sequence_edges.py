"""One request's state at its edges (engine/sequence.py): the prompt it was given stays the caller's, the block
helpers at an exact block boundary, the completion's tokens, and the async placeholders filled and dropped."""
from __future__ import annotations

import pytest

from engine import SamplingParams
from engine.sequence import Sequence


def _seq(tokens: list[int], block_size: int = 4, request_id: str | None = None) -> Sequence:
    return Sequence(tokens, SamplingParams(max_tokens=8), seq_id=7, block_size=block_size, request_id=request_id)


def test_the_callers_prompt_list_is_not_touched_by_the_tokens_a_sequence_gains():
    prompt = [10, 11, 12]
    s = _seq(prompt)
    s.append_token(13)
    assert prompt == [10, 11, 12]
    assert s.token_ids == [10, 11, 12, 13] and len(s) == 4 and s.last_token == 13


def test_blocks_at_an_exact_boundary_and_past_the_last_one():
    s = _seq(list(range(8)), block_size=4)
    assert s.num_blocks == 2
    assert s.block(0) == [0, 1, 2, 3] and s.block(1) == [4, 5, 6, 7]
    with pytest.raises(AssertionError):
        s.block(2)
    s.append_token(8)
    assert s.num_blocks == 3 and s.block(2) == [8]
    assert _seq([1], block_size=4).num_blocks == 1


def test_the_completion_is_every_token_after_the_prompt():
    s = _seq([5, 6, 7])
    assert s.completion_token_ids == [] and s.num_completion_tokens == 0
    s.append_token(40)
    s.append_token(41)
    assert s.completion_token_ids == [40, 41] and s.num_completion_tokens == 2


def test_an_empty_request_id_is_kept_and_none_takes_the_seq_id():
    assert _seq([1], request_id="").request_id == ""
    assert _seq([1]).request_id == "7"


def test_placeholders_fill_oldest_first_and_the_last_token_stays_the_newest():
    s = _seq([1, 2, 3])
    s.append_placeholder()
    s.append_placeholder()
    assert len(s) == 5 and s.pending == 2 and s.num_known_tokens == 3 and s.last_token == -1
    s.fill_placeholder(50)
    # The newer placeholder is still unknown: it, not the value just filled in, is the last token.
    assert s.token_ids == [1, 2, 3, 50, -1] and s.pending == 1 and s.num_known_tokens == 4 and s.last_token == -1
    s.fill_placeholder(51)
    assert s.token_ids == [1, 2, 3, 50, 51] and s.pending == 0 and s.num_known_tokens == 5 and s.last_token == 51


def test_a_dropped_placeholder_is_no_longer_pending():
    s = _seq([1, 2, 3])
    s.append_placeholder()
    s.append_placeholder()
    s.drop_placeholder()
    assert s.token_ids == [1, 2, 3, -1] and len(s) == 4 and s.pending == 1 and s.num_known_tokens == 3
    s.fill_placeholder(9)
    assert s.token_ids == [1, 2, 3, 9] and s.pending == 0 and s.num_known_tokens == 4 and s.last_token == 9
    s.append_placeholder()
    s.drop_placeholder()
    assert s.token_ids == [1, 2, 3, 9] and s.pending == 0 and s.num_known_tokens == 4 and s.last_token == 9
