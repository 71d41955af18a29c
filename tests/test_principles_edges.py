"""`labkit principles` at its edges: the verdict logic (PASS / FAIL / RECORDED), configs other than the preset's,
--out, `all`'s exit code and --json, the .md twin, and the `how` arithmetic of the memory lab."""
# ruff: noqa: F811  (a test taking the imported `runs` fixture reads to ruff as redefining it)
from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import pytest

from .helpers import run_cli
from .test_principles import _load, runs  # noqa: F401  (runs: the fixture the tests below take)


def _model(tmp_path: Path, cfg: dict | str, name: str = "m") -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return str(folder)


def _qwen3_06b() -> dict:
    from labkit.fake_model import preset_config

    return dict(preset_config("qwen3-0.6b"))


def _tiny(tiny_model) -> dict:
    return json.loads((Path(tiny_model) / "config.json").read_text())


def test_a_computed_list_of_another_length_fails_its_check():
    from labkit.principles import Checks

    c = Checks()
    c.eq("short", [1, 2], [1, 2, 3])
    c.eq("long", [1, 2, 3, 4], [1, 2, 3])
    assert [i["passed"] for i in c.items] == [False, False] and c.verdict() == "FAIL"


def test_a_real_qwen3_config_with_torch_dtype_passes_memory(runs, capsys, tmp_path):
    # Hugging Face's Qwen3-0.6B config.json names its dtype torch_dtype (older) or "torch.bfloat16": the same model.
    for i, dtype in enumerate(({"torch_dtype": "bfloat16"}, {"torch_dtype": "torch.bfloat16"})):
        cfg = {k: v for k, v in _qwen3_06b().items() if k not in ("dtype", "torch_dtype")} | dtype
        code, out, err = run_cli(["principles", "memory", "--model", _model(tmp_path, cfg, f"m{i}")], capsys)
        r = _load(runs, "memory")
        assert code == 0 and r["verdict"] == "PASS", (dtype, r["checks"])
        assert r["values"]["geometry"]["dtype"] == "bfloat16" and r["values"]["kv_bytes_per_token"] == 114688


def test_memory_of_another_geometry_computes_from_its_config(runs, capsys, tmp_path, tiny_model):
    # No head_dim: hidden_size / num_attention_heads (128 / 4 = 32); float32: 4 bytes an element.
    cfg = {k: v for k, v in _tiny(tiny_model).items() if k != "head_dim"}
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (128, 4, 2)
    assert cfg["dtype"] == "float32" and cfg["num_hidden_layers"] == 2
    code, out, err = run_cli(["principles", "memory", "--model", _model(tmp_path, cfg)], capsys)
    assert code == 0, err
    v = _load(runs, "memory")["values"]
    assert v["geometry"]["head_dim"] == 32
    assert v["kv_bytes_per_token"] == 2 * 2 * 2 * 32 * 4
    assert v["kv_kib_per_token_if_q_heads_used"] == 2 * 2 * 4 * 32 * 4 / 1024


@pytest.mark.parametrize("cfg, message", [
    ("{not json", "cannot read config.json"),
    (json.dumps({"num_attention_heads": 0, "hidden_size": 128, "num_key_value_heads": 1}), "lacks what a Qwen3"),
])
def test_a_config_it_cannot_use_exits_2_with_one_line(runs, capsys, tmp_path, cfg, message):
    code, out, err = run_cli(["principles", "memory", "--model", _model(tmp_path, cfg)], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_shapes_of_an_odd_kv_head_count_skip_tp2_and_record(runs, capsys, tmp_path, tiny_model):
    cfg = _tiny(tiny_model) | {"num_key_value_heads": 1}
    code, out, err = run_cli(["principles", "shapes", "--model", _model(tmp_path, cfg)], capsys)
    assert code == 0, err
    r = _load(runs, "shapes")
    assert r["verdict"] == "RECORDED" and r["values"]["tp2_per_rank"] is None
    assert r["values"]["lifecycle_prefill"]["k"] == [160, 1, 32]


def test_a_lab_given_a_model_records_that_model(runs, capsys, tiny_model):
    code, out, err = run_cli(["principles", "memory", "--model", tiny_model], capsys)
    assert code == 0, err
    model = _load(runs, "memory")["model"]
    assert model["path"] == str(Path(tiny_model).resolve())
    assert model["config_sha256"] == hashlib.sha256((Path(tiny_model) / "config.json").read_bytes()).hexdigest()


def test_out_names_where_the_result_and_its_markdown_go(runs, capsys, tmp_path):
    target = tmp_path / "elsewhere" / "slots-result.json"
    code, out, err = run_cli(["principles", "slots", "--out", str(target)], capsys)
    assert code == 0, err
    assert json.loads(target.read_text())["verdict"] == "PASS"
    assert target.with_suffix(".md").read_text().startswith("# principles slots: **PASS**")
    assert not (runs / "slots.json").exists()


def test_checks_skipped_for_another_geometry_stay_skipped_even_when_they_match(runs, capsys, tiny_model):
    # The tiny model has 4 Q heads over 2 KV heads: its GQA map starts [0, 0, 1, 1] like Qwen3-0.6B's, but the
    # expected value follows from Qwen3-0.6B's geometry, so the check is skipped, not passed.
    code, out, err = run_cli(["principles", "operators", "--model", tiny_model], capsys)
    assert code == 0, err
    r = _load(runs, "operators")
    gqa = next(c for c in r["checks"] if c["name"].startswith("GQA"))
    assert gqa["computed"] == gqa["expected"] == [0, 0, 1, 1]
    assert gqa["passed"] is None and "Qwen3-0.6B" in gqa["skipped"] and r["verdict"] == "RECORDED"


def test_the_markdown_marks_skipped_checks_and_the_recorded_verdict(runs, capsys, tiny_model):
    code, out, err = run_cli(["principles", "memory", "--model", tiny_model], capsys)
    assert code == 0, err
    md = (runs / "memory.md").read_text()
    assert md.startswith("# principles memory: **RECORDED**")
    rows = {line.split(" | ")[0].lstrip("| "): line.rstrip(" |").rsplit(" | ", 1)[-1]
            for line in md.splitlines()[6:]}
    assert rows["KV bytes per token (KiB)"] == "skipped" and rows["eight such requests (GiB)"] == "skipped"
    assert rows["TTFT (ms)"] == "PASS"


def test_the_markdown_shows_six_significant_digits_and_cuts_long_values():
    from labkit.principles import markdown

    result = {"lab": "x", "verdict": "FAIL", "title": "t", "evidence": "cpu-executed", "headline": "h",
              "checks": [{"name": "a", "computed": [0.6652409557748219, 1 / 3], "expected": list(range(40)),
                          "how": "by hand", "tolerance": 5e-6, "passed": False}]}
    row = markdown(result).splitlines()[-1]
    assert "[0.665241, 0.333333]" in row and " | FAIL |" in row and "5e-06" in row
    shown = row.split(" | ")[2]
    assert len(shown) == 70 and shown.endswith("...") and shown.startswith("[0, 1, 2")


def test_all_exits_1_when_a_lab_in_the_middle_fails_and_json_is_only_json(runs, capsys, monkeypatch, tiny_model):
    from labkit import principles

    # A RoPE that forgets to rotate: only the operators lab (7th of 8) FAILs; the first and last do not.
    monkeypatch.setattr(principles, "_rope", lambda vec, pos, theta: vec * 1.0)
    code, out, err = run_cli(["principles", "all", "--model", tiny_model, "--json"], capsys)
    assert code == 1
    verdicts = {r["lab"]: r["verdict"] for r in json.loads(out)}
    assert verdicts["operators"] == "FAIL" and verdicts["tokenizer"] == "PASS" and verdicts["shapes"] != "FAIL"
    assert [name for name, v in verdicts.items() if v == "FAIL"] == ["operators"]


def test_a_cache_whose_outputs_drift_fails_the_cache_lab(runs, capsys, monkeypatch):
    from labkit import principles

    attention = principles._attention

    def drifting(q, k, v, causal):   # the cached path (the last query against every key) drifts by 1e-3
        w, out = attention(q, k, v, causal)
        return w, out if causal else out + 1e-3

    monkeypatch.setattr(principles, "_attention", drifting)
    code, out, err = run_cli(["principles", "cache"], capsys)
    assert code == 1 and _load(runs, "cache")["verdict"] == "FAIL"
    failed = [c["name"] for c in _load(runs, "cache")["checks"] if c["passed"] is False]
    assert failed == ["same last output on both paths (max |diff|, float64)"]


def test_the_memory_hows_arithmetic_gives_the_expected_values(runs, capsys):
    # Each geometry-bound memory check says how its value follows: "2 x 28 x 8 x 128 x 2 = 114688 B = 112 KiB".
    code, out, err = run_cli(["principles", "memory"], capsys)
    assert code == 0, err
    geometry = [c for c in _load(runs, "memory")["checks"] if "KiB" in c["how"] or "MiB" in c["how"]]
    assert len(geometry) == 4
    for c in geometry:
        parts = c["how"].split("=")
        factors = [float(x) for x in re.findall(r"\b\d+(?:\.\d+)?\b", parts[0])]
        first = float(re.match(r"\s*(\d+(?:\.\d+)?)", parts[1]).group(1))
        last = float(re.match(r"\s*(\d+(?:\.\d+)?)", parts[-1]).group(1))
        assert math.prod(factors) == first and last == c["expected"], c
    per_token = geometry[0]["how"]
    for part in ("28 layers", "8 KV heads", "head_dim 128", "2 bytes (bf16)"):
        assert part in per_token


def test_a_sampler_five_points_off_fails_the_tokenizer_lab(runs, capsys, monkeypatch, tiny_model):
    import numpy as np

    real = np.random.default_rng

    class Biased:
        def __init__(self, seed):
            self.rng = real(seed)

        def choice(self, n, size, p):   # draws index 0 five points too seldom, index 1 five points too often
            return self.rng.choice(n, size=size, p=np.asarray(p) + [-0.05, 0.05, 0.0])

    monkeypatch.setattr(np.random, "default_rng", Biased)
    code, out, err = run_cli(["principles", "tokenizer", "--model", tiny_model], capsys)
    assert code == 1
    failed = [c["name"] for c in _load(runs, "tokenizer")["checks"] if c["passed"] is False]
    assert failed == ["sampled frequencies near the probabilities (20000 draws, |diff| <= 0.01)"]
