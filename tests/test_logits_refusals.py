"""Why two logits collections cannot be compared (labkit/logits/compare.refusal_reasons), one reason at a time
on collections made here: a weight file on one side only, one whose hash differs, the model config, a request
or a token that differs in the token path, the row sets, the vocabulary. Each reason must name what differs
and where; two collections that differ in nothing have none."""
from __future__ import annotations

import copy

import numpy as np

from labkit.logits.collect import Collection
from labkit.logits.compare import refusal_reasons


def _col(**meta) -> Collection:
    base = {"suite": {"name": "baseline"},
            "model_files": {"config.json": "c" * 64, "model.safetensors": "a" * 64},
            "token_path_sha256": "p" * 64, "seed": 0,
            "inputs": {"A": {"prompt": [1, 2, 3], "continuation": [7, 8]},
                       "B": {"prompt": [4, 5], "continuation": [9]}},
            "rows": [{"request_id": "A", "output_index": 0}, {"request_id": "B", "output_index": 0}]}
    base.update(meta)
    return Collection(meta=base, arrays={"logits": np.zeros((2, 16), np.float32)})


def _other(col: Collection, **changes) -> Collection:
    meta = copy.deepcopy(col.meta)
    meta.update(changes)
    return Collection(meta=meta, arrays=dict(col.arrays))


def test_two_collections_that_differ_in_nothing_can_be_compared():
    a = _col()
    assert refusal_reasons(a, _other(a)) == []


def test_a_weight_file_on_one_side_only_names_that_side():
    a = _col()
    extra = _other(a, model_files={**a.meta["model_files"], "extra.safetensors": "e" * 64})
    assert refusal_reasons(a, extra) == ["weights differ: extra.safetensors only in rhs"]
    assert refusal_reasons(extra, a, ("engine", "hf")) == ["weights differ: extra.safetensors only in engine"]


def test_a_file_whose_hash_differs_is_named_and_the_config_is_the_model():
    a = _col()
    weights = _other(a, model_files={**a.meta["model_files"], "model.safetensors": "b" * 64})
    assert refusal_reasons(a, weights) == [
        f"weights differ: model.safetensors sha256 {'a' * 12} (lhs) vs {'b' * 12} (rhs)"]
    config = _other(a, model_files={**a.meta["model_files"], "config.json": "d" * 64})
    assert refusal_reasons(a, config) == [
        f"model config differs: config.json sha256 {'c' * 12} (lhs) vs {'d' * 12} (rhs)"]
    unhashed = _other(a, model_files={**a.meta["model_files"], "config.json": None})
    assert refusal_reasons(a, unhashed) == [f"model config differs: config.json sha256 {'c' * 12} (lhs) vs none (rhs)"]


def test_a_token_path_that_differs_names_the_request_and_the_first_token():
    a = _col()
    inputs = copy.deepcopy(a.meta["inputs"])
    inputs["B"]["continuation"] = [6]
    assert refusal_reasons(a, _other(a, inputs=inputs, token_path_sha256="q" * 64)) == [
        "token paths differ: request B continuation[0]: 9 vs 6"]
    inputs = copy.deepcopy(a.meta["inputs"])
    inputs["A"]["prompt"] = [1, 2]
    assert refusal_reasons(a, _other(a, inputs=inputs, token_path_sha256="q" * 64, seed=1)) == [
        "token paths differ: request A prompt: 3 vs 2 ids (seed 0 vs 1)"]
    inputs = {**copy.deepcopy(a.meta["inputs"]), "C": {"prompt": [1], "continuation": [2]}}
    assert refusal_reasons(a, _other(a, inputs=inputs, token_path_sha256="q" * 64)) == [
        "token paths differ: request C only in rhs"]
    fewer = {"A": copy.deepcopy(a.meta["inputs"]["A"])}
    assert refusal_reasons(a, _other(a, inputs=fewer, token_path_sha256="q" * 64), ("x", "y")) == [
        "token paths differ: request B only in x"]


def test_the_rows_and_the_vocabulary_are_compared_when_nothing_else_differs():
    a = _col()
    one_row = _other(a, rows=a.meta["rows"][:1])
    assert refusal_reasons(a, one_row) == ["row sets differ: lhs 2 rows, rhs 1 (e.g. [('B', 0)])"]
    wider = _other(a)
    wider.arrays = {"logits": np.zeros((2, 17), np.float32)}
    assert refusal_reasons(a, wider) == ["vocabularies differ: 16 vs 17"]
