"""logits-check's token paths and collection files at their edges: prompt ids at the end of the vocabulary, the
path's hash (prompt AND continuation), each request's own continuation, a collection read back by any of its
names, and a collection whose arrays do not match its rows refused."""
from __future__ import annotations

import numpy as np
import pytest

from labkit.errors import LabkitError
from labkit.logits.collect import Collection, read_collection, write_collection
from labkit.logits.suites import get_suite, path_sha256, token_path


def test_prompt_ids_must_be_inside_the_vocabulary_up_to_its_last_id():
    """The baseline suite's largest prompt id is 355 (C: range(100, 356)): a vocabulary of 356 ids (0..355) holds
    it, one of 355 does not."""
    suite = get_suite("baseline")
    path = token_path(suite, 356, 0)
    assert max(max(p["prompt"]) for p in path.values()) == 355
    with pytest.raises(LabkitError) as err:
        token_path(suite, 355, 0)
    assert "cannot hold" in str(err.value) and "355" in str(err.value)


def test_the_path_hash_covers_the_continuation():
    """Another --seed changes only the forced continuations, and so the path's hash: two collections with
    different continuations must never look like the same path."""
    suite = get_suite("baseline")
    a, b = token_path(suite, 2048, 0), token_path(suite, 2048, 1)
    assert all(a[r]["prompt"] == b[r]["prompt"] for r in a)
    assert any(a[r]["continuation"] != b[r]["continuation"] for r in a)
    assert path_sha256(a) != path_sha256(b)
    assert path_sha256(a) == path_sha256(token_path(suite, 2048, 0))


def test_each_request_draws_its_own_continuation_and_hot_reuses_colds():
    """Continuations come from (seed, request key): hot (cont_key cold) follows cold's exactly; share, another key,
    follows its own."""
    path = token_path(get_suite("prefix"), 2048, 0)
    assert path["hot"]["continuation"] == path["cold"]["continuation"]
    assert path["share"]["continuation"] != path["cold"]["continuation"]
    base = token_path(get_suite("baseline"), 2048, 0)
    assert base["B.R1"]["continuation"] != base["B.R2"]["continuation"][:2]


def _collection(n_rows: int = 3) -> Collection:
    rows = [{"index": i, "request_id": "R", "output_index": i, "case": "c", "context_len": i + 1}
            for i in range(n_rows)]
    meta = {"kind": "logits-collection", "status": "COLLECTED", "rows": rows, "suite": {"name": "x"}}
    return Collection(meta, {"logits": np.arange(n_rows * 4, dtype=np.float32).reshape(n_rows, 4)})


def test_a_collection_is_read_back_by_its_prefix_or_either_file(tmp_path):
    js, npz = write_collection(_collection(), tmp_path / "col")
    for name in (tmp_path / "col", js, npz):
        back = read_collection(name)
        assert len(back.rows) == 3
        assert np.array_equal(back.arrays["logits"], np.arange(12, dtype=np.float32).reshape(3, 4))


@pytest.mark.parametrize("n_logits", [2, 4])
def test_a_collection_whose_logits_rows_do_not_match_its_rows_is_refused(tmp_path, n_logits):
    """Fewer or more logits rows than the JSON's rows: the file pair is not one collection."""
    write_collection(_collection(3), tmp_path / "col")
    np.savez(tmp_path / "col.npz", logits=np.zeros((n_logits, 4), dtype=np.float32))
    with pytest.raises(LabkitError) as err:
        read_collection(tmp_path / "col")
    assert "one logits row per row" in str(err.value)
