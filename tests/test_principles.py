"""`labkit principles`: the seeds' CPU labs reproduce the seeds' numbers from first principles, and a wrong
computation is caught."""
from __future__ import annotations

import json

import pytest

from .helpers import run_cli


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs" / "principles"


def _load(runs, name) -> dict:
    return json.loads((runs / f"{name}.json").read_text())


def test_every_principles_lab_reproduces_the_seeds_numbers(runs, capsys, tiny_model):
    code, out, err = run_cli(["principles", "all", "--model", tiny_model], capsys)
    # --model: the tokenizer is the tiny model's; memory, operators and shapes then read a config whose
    # numbers the seeds do not state, so their geometry-bound checks are skipped (RECORDED), never passed.
    assert code == 0, err
    assert _load(runs, "memory")["verdict"] == "RECORDED"
    skipped = [c for c in _load(runs, "memory")["checks"] if c["passed"] is None]
    assert skipped and all("Qwen3-0.6B" in c["skipped"] for c in skipped)
    code, out, err = run_cli(["principles", "all"], capsys)
    assert code == 0, err
    results = {p.stem: json.loads(p.read_text()) for p in runs.glob("*.json")}
    assert set(results) == {"tokenizer", "attention", "timeline", "cache", "memory", "slots", "operators", "shapes"}
    for name, r in results.items():
        assert r["command"] == f"principles {name}" and r["verdict"] == "PASS", (name, r["checks"])
        assert all(c["passed"] is True for c in r["checks"]) and r["evidence"] in ("cpu-executed", "static-estimate")
        assert (runs / f"{name}.md").read_text().startswith(f"# principles {name}: **PASS**")
    v = {name: r["values"] for name, r in results.items()}
    assert v["memory"]["kv_bytes_per_token"] == 114688 and v["memory"]["kv_kib_per_token"] == 112
    assert v["memory"]["kv_mib_per_request_4096"] == 448 and v["memory"]["kv_mib_per_block_256"] == 28
    assert v["memory"]["kv_gib_eight_requests"] == 3.5 and v["memory"]["itl_ms"] == [40, 50, 40]
    assert v["cache"]["uncached_total"] == 540 and v["cache"]["cached_total"] == 71 and v["cache"]["max_error"] < 1e-12
    assert [p["slot"] for p in v["slots"]["positions"]] == [68, 22, 92] and v["slots"]["blocks_b256"] == [1, 1, 2]
    assert v["attention"]["masked_earlier_delta"] == 0
    assert v["attention"]["unmasked_earlier_delta"] == pytest.approx(8.15455, abs=1e-5)
    assert [round(x, 4) for x in v["attention"]["weights"][2]] == [0.2483, 0.2483, 0.5035]
    assert [len(r["forward_input"]) for r in v["timeline"]["rounds"]] == [3, 1, 1]
    assert v["shapes"]["lifecycle_prefill"]["qkv_proj"] == [160, 4096] and v["shapes"]["last_rows_chunk"] == [187, 219]
    assert v["shapes"]["tp2_per_rank"]["vocab_shard"] == 75968
    assert v["shapes"]["tp2_per_rank"]["kv_kib_per_token_per_rank"] == 56
    assert v["tokenizer"]["decoded"] == v["tokenizer"]["text"] and v["tokenizer"]["greedy_index"] == 0
    assert "<|im_start|>assistant" in v["tokenizer"]["chat_template_text"]
    assert v["operators"]["rope_pair_of_component_0"] == [0, 64]


def test_a_wrong_computation_fails_its_lab(runs, capsys, monkeypatch):
    from labkit import principles

    # A softmax that forgets to normalise: the attention lab's weights no longer sum to 1 and miss the seed's.
    monkeypatch.setattr(principles, "softmax", lambda z: __import__("numpy").exp(z - z.max(axis=-1, keepdims=True)))
    code, out, err = run_cli(["principles", "attention"], capsys)
    assert code == 1
    r = _load(runs, "attention")
    assert r["verdict"] == "FAIL"
    failed = {c["name"] for c in r["checks"] if c["passed"] is False}
    assert "every row's weights sum to 1" in failed and "last row weights" in failed
    assert "FAIL" in out


def test_principles_json_prints_the_result(runs, capsys):
    code, out, err = run_cli(["principles", "slots", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["verdict"] == "PASS" and data["values"]["block_table"] == [17, 5, 23]
    code, out, err = run_cli(["principles", "memory", "--model", "/no/such/model"], capsys)
    assert code == 2 and "cannot read config.json" in err and len(err.strip().splitlines()) == 1
