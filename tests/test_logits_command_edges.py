"""`labkit logits-check collect | run` at their edges, with the collectors replaced by fakes that record what they
were asked for (the sides of a run, each side's settings), so every plan and every refusal is checked in
milliseconds: the hf backend refuses what it cannot honour in one line (exit 2); `run` refuses before collecting
anything; the tp suite refuses TP=1 against TP=1; the fp8-kv suite is an FP8 run by default; the fixed gate's
Transformers side runs in the engine's dtype; engine-vs-engine keeps both engines and adds the truth."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from labkit.errors import LabkitError
from labkit.logits import command
from labkit.logits.collect import (
    Collection,
    collect_engine,
    collect_hf,
    read_collection,
    write_collection,
)
from labkit.logits.suites import Case, Request, Suite, continuation
from labkit.output import file_mode

from .helpers import run_cli

LOGITS = np.array([[4.0, 0, 0, 0], [0, 3.0, 0, 0], [0, 0, 2.0, 0]], dtype=np.float32)


def _fake(backend: str, calls: list, suite, *, dtype: str = "auto", kv_cache_dtype: str = "auto", **kw) -> Collection:
    dt = "float32" if dtype == "auto" else dtype
    calls.append({"backend": backend, "dtype": dt, "kv_cache_dtype": kv_cache_dtype,
                  **{k: kw.get(k) for k in ("execution", "attention", "tp")}})
    rows = [{"index": i, "request_id": "R", "output_index": i, "case": "c", "context_len": i + 1}
            for i in range(len(LOGITS))]
    meta = {"kind": "logits-collection", "status": "COLLECTED", "suite": {"name": suite.name}, "model_files": {},
            "token_path_sha256": "p", "rows": rows, "dtype": dt, "backend": backend, "kv_cache_dtype": kv_cache_dtype,
            "evidence": "cpu-executed", "device": {"type": "cpu"}, "code_path": {}, "wall_s": 0.0,
            "steps": [{"execution": "eager", "phase": "prefill"}],
            "requested": {k: kw.get(k) for k in ("execution", "attention", "tp")},
            "config": {"attention_backend": kw.get("attention"), "tensor_parallel_size": kw.get("tp", 1)}}
    return Collection(meta, {"logits": LOGITS.copy()})


@pytest.fixture
def calls(monkeypatch, tiny_model):
    made: list[dict] = []
    monkeypatch.setattr(command, "collect_engine",
                        lambda suite, model_dir, **kw: _fake("engine", made, suite, **kw))
    monkeypatch.setattr(command, "collect_hf",
                        lambda suite, model_dir, **kw: _fake("hf", made, suite, **kw))
    return made


def _run(args, capsys, tiny_model):
    return run_cli(["logits-check", *args, "--model", tiny_model, "--device", "cpu"], capsys)



@pytest.mark.parametrize("option", [["--tensor-parallel-size", "2"], ["--execution", "graph"],
                                    ["--attention-backend", "triton"]])
def test_the_hf_backend_refuses_what_it_cannot_honour_in_one_line(calls, option, tmp_path, capsys, tiny_model):
    """Transformers runs TP=1, eagerly, with eager attention: another setting is refused (exit 2), never run as
    something else under the asked-for name."""
    code, _, err = _run(["collect", "--suite", "baseline", "--backend", "hf", *option, "--out", str(tmp_path / "hf")],
                        capsys, tiny_model)
    assert code == 2 and len(err.strip().splitlines()) == 1 and option[0] in err, err
    assert calls == [] and not (tmp_path / "hf.json").exists()


@pytest.mark.parametrize("args, words", [
    (["--suite", "fp8-kv", "--kv-cache-dtype", "auto"], "judges an FP8 KV cache"),
    (["--suite", "kv", "--kv-cache-dtype", "fp8"], "compares engines with each other"),
    (["--suite", "baseline", "--kv-cache-dtype", "fp8", "--gate", "fixed"], "--gate fixed"),
    (["--suite", "fp8-kv", "--gate", "fixed"], "--gate fixed"),
    (["--suite", "baseline", "--rel-l2", "0.1"], "--rel-l2"),
    (["--suite", "baseline", "--max-abs", "0.5", "--kv-max-abs", "0.1"], "--max-abs, --kv-max-abs"),
    (["--suite", "tp", "--tensor-parallel-size", "1"], "--tensor-parallel-size 1"),
])
def test_run_refuses_before_collecting_anything(calls, args, words, tmp_path, capsys, tiny_model):
    """A run that cannot be judged as asked is refused in one line (exit 2) before minutes of collecting: no
    collector is called, no file written."""
    out = tmp_path / "run"
    code, _, err = _run(["run", *args, "--out", str(out)], capsys, tiny_model)
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err
    assert calls == [] and not out.exists()


def _report(out):
    return json.loads((out / "check.json").read_text())


def test_the_fp8_kv_suite_is_an_fp8_run_by_default(calls, tmp_path, capsys, tiny_model):
    """No --kv-cache-dtype: the suite's fp8 pool, beside the same engine with the model-dtype pool, the truth,
    Transformers bf16 with e4m3 K/V (the FP8 side's reference) and without (the baseline's)."""
    out = tmp_path / "fp8"
    code, _, err = _run(["run", "--suite", "fp8-kv", "--dtype", "bfloat16", "--out", str(out)], capsys, tiny_model)
    assert code == 0, err
    assert sorted(p.name for p in out.glob("*.json")) == ["check.json", "engine-fp8.json", "engine.json",
                                                         "hf-bfloat16-fp8.json", "hf-bfloat16.json", "hf-float32.json"]
    assert [(c["backend"], c["dtype"], c["kv_cache_dtype"]) for c in calls] == [
        ("engine", "bfloat16", "fp8"), ("engine", "bfloat16", "auto"), ("hf", "float32", "auto"),
        ("hf", "bfloat16", "fp8"), ("hf", "bfloat16", "auto")]
    r = _report(out)
    assert r["lhs"]["prefix"].endswith("engine-fp8") and r["reference"]["prefix"].endswith("hf-bfloat16-fp8")
    assert r["baseline"]["prefix"].endswith("engine") and r["baseline_reference"]["prefix"].endswith("hf-bfloat16")


def test_engine_vs_engine_keeps_both_engines_and_adds_the_truth(calls, tmp_path, capsys, tiny_model):
    """The kv suite: the second engine takes the first one's attention backend unless --ref-attention names
    another, and the float32 truth joins as a third side, not in place of the second engine."""
    out = tmp_path / "kv"
    code, _, err = _run(["run", "--suite", "kv", "--attention-backend", "torch", "--ref-execution", "graph",
                         "--out", str(out)], capsys, tiny_model)
    assert code == 0, err
    r = _report(out)
    assert r["rhs"]["prefix"].endswith("engine-ref") and r["rhs"]["backend"] == "engine"
    assert r["truth"]["prefix"].endswith("hf-float32") and r["truth"]["dtype"] == "float32"
    assert r["gate"]["judged"] == ["lhs", "rhs"]
    assert [(c["backend"], c["execution"], c["attention"]) for c in calls] == [
        ("engine", "eager", "torch"), ("engine", "graph", "torch"), ("hf", None, None)]
    assert r["rhs"]["attention"] == "torch"
    calls.clear()
    code, _, err = _run(["run", "--suite", "kv", "--attention-backend", "torch", "--ref-attention", "triton",
                         "--out", str(tmp_path / "kv2")], capsys, tiny_model)
    assert code == 0, err
    assert [c["attention"] for c in calls[:2]] == ["torch", "triton"]


def test_the_fixed_gate_compares_with_transformers_in_the_engines_dtype(calls, tmp_path, capsys, tiny_model):
    out = tmp_path / "fixed"
    code, _, err = _run(["run", "--suite", "baseline", "--gate", "fixed", "--dtype", "bfloat16", "--out", str(out)],
                        capsys, tiny_model)
    assert code == 0, err
    r = _report(out)
    assert (r["lhs"]["dtype"], r["rhs"]["dtype"], r["rhs"]["backend"]) == ("bfloat16", "bfloat16", "hf")
    assert r["truth"] is None and r["thresholds"]["dtype_basis"] == "bfloat16"
    assert sorted(p.name for p in out.glob("*.json")) == ["check.json", "engine.json", "hf.json"]


@pytest.mark.parametrize("ran, noted", [("eager", True), ("graph", False)])
def test_collect_says_when_graph_was_asked_for_but_every_step_ran_eager(monkeypatch, ran, noted, tmp_path, capsys,
                                                                        tiny_model):
    made: list[dict] = []

    def engine(suite, model_dir, **kw):
        col = _fake("engine", made, suite, **kw)
        col.meta["steps"] = [{"execution": ran, "phase": "prefill"}, {"execution": ran, "phase": "decode"}]
        return col

    monkeypatch.setattr(command, "collect_engine", engine)
    code, out, err = _run(["collect", "--suite", "baseline", "--execution", "graph", "--out", str(tmp_path / "e")],
                          capsys, tiny_model)
    assert code == 0, err
    assert made[0]["execution"] == "graph" and (tmp_path / "e.json").is_file()
    assert ("every step ran eager" in " ".join(out.split())) is noted, out


# --- the collectors and the collection files -----------------------------------------------------------------

MINI = Suite("mini", "one short request", (Case("A", "3-id prompt, 2 outputs",
                                                 (Request("A.R1", {"tokens": [100, 101, 102]}, 2),)),), "hf")
MINI_KV = Suite("mini-kv", "one short request with its K/V", MINI.cases, "engine", record_kv=True)


def test_an_engine_error_at_tp1_is_not_blamed_on_the_tp_option(tiny_model, monkeypatch):
    """An engine that refuses its settings at TP=1 (a message naming tensor_parallel_size among others) is an
    engine error, not a --tensor-parallel-size 1 problem."""
    import engine

    def refuse(model, **kwargs):
        raise ValueError("max_model_len 1024 with tensor_parallel_size 1 does not fit the pool")

    monkeypatch.setattr(engine, "LLM", refuse)
    with pytest.raises(LabkitError) as err:
        collect_engine(MINI, tiny_model, device="cpu", dtype="float32")
    assert err.value.code == 2 and str(err.value).startswith("engine: max_model_len 1024"), str(err.value)
    with pytest.raises(LabkitError, match=r"^--tensor-parallel-size 2: max_model_len") as err:
        collect_engine(MINI, tiny_model, device="cpu", dtype="float32", tp=2)


def test_an_unfinished_collection_is_refused(tmp_path):
    """A collection whose JSON says it is not COLLECTED (a run that stopped) is never read as one."""
    rows = [{"index": 0, "request_id": "R", "output_index": 0, "case": "c", "context_len": 1}]
    col = Collection({"kind": "logits-collection", "status": "RUNNING", "rows": rows}, {"logits": LOGITS[:1]})
    write_collection(col, tmp_path / "col")
    with pytest.raises(LabkitError, match="not a complete logits-check collection"):
        read_collection(tmp_path / "col")
    col.meta.update(status="COLLECTED", kind="something-else")
    write_collection(col, tmp_path / "col")
    with pytest.raises(LabkitError, match="not a complete logits-check collection"):
        read_collection(tmp_path / "col")


def test_both_files_of_a_collection_are_as_readable_as_any_result(tmp_path):
    rows = [{"index": 0, "request_id": "R", "output_index": 0, "case": "c", "context_len": 1}]
    js, npz = write_collection(Collection({"kind": "logits-collection", "status": "COLLECTED", "rows": rows},
                                          {"logits": LOGITS[:1]}), tmp_path / "col")
    assert (js.stat().st_mode & 0o777) == (npz.stat().st_mode & 0o777) == file_mode()


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_transformers_collection_leaves_the_float32_precision_as_it_found_it(tiny_model, hf_model, precision):
    """The truth runs at "highest" whatever the process chose, and gives the process its choice back, so that a
    second collection in the same process (`run` makes two or three) starts from it. (Under "medium" the
    restore once left torch unable to say its precision, and the second collection raised.)"""
    before = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
              torch.backends.cudnn.allow_tf32)
    torch.set_float32_matmul_precision(precision)
    try:
        for _ in range(2):
            col = collect_hf(MINI, tiny_model, device="cpu", dtype="float32", model=hf_model)
            assert torch.get_float32_matmul_precision() == precision
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[1], before[2]
        torch.set_float32_matmul_precision(before[0])
    assert col.meta["config"]["float32_matmul"].startswith("highest")


def test_transformers_k_v_are_recorded_at_step_minus_one(tiny_model, hf_model):
    """Transformers has no steps: its K/V rows are each position once, step -1 (the engine's are >= 1)."""
    col = collect_hf(MINI_KV, tiny_model, device="cpu", dtype="float32", model=hf_model)
    assert col.arrays["kv_step"].tolist() == [-1] * 4  # 3 prompt ids + 1 fed continuation id
    assert col.arrays["kv_position"].tolist() == [0, 1, 2, 3]


def test_a_config_without_vocab_size_is_refused_in_words(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float32"}))
    with pytest.raises(LabkitError, match="cannot read vocab_size"):
        collect_hf(MINI, tmp_path, device="cpu", dtype="float32", model=object())


class _Logits:
    """A stand-in for Transformers' causal LM: zero logits for the positions asked for."""

    def __call__(self, input_ids, use_cache, logits_to_keep):
        return type("Out", (), {"logits": torch.zeros(1, logits_to_keep, 200)})()


def test_hf_auto_dtype_follows_a_float16_config(tmp_path):
    """--dtype auto: the model's own dtype (float16 too), float32 for anything else."""
    for dt, want in (("float16", "float16"), ("bfloat16", "bfloat16"), ("int8", "float32")):
        (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 200, "torch_dtype": dt}))
        col = collect_hf(MINI, tmp_path, device="cpu", dtype="auto", model=_Logits())
        assert (col.meta["dtype"], col.meta["requested"]["dtype"]) == (want, want), dt
        assert col.arrays["logits"].shape == (2, 200)


def test_an_unknown_kv_cache_dtype_is_refused_by_the_hf_collector(tiny_model):
    with pytest.raises(LabkitError, match="--kv-cache-dtype must be one of"):
        collect_hf(MINI, tiny_model, device="cpu", dtype="float32", kv_cache_dtype="int4", model=object())


def test_the_code_path_counts_prefill_and_decode_steps_apart(tiny_model):
    col = collect_engine(MINI, tiny_model, device="cpu", dtype="float32")
    assert col.meta["code_path"] == {"prefill eager": 1, "decode eager": 1}


# --- the suites ----------------------------------------------------------------------------------------------


def test_fp8_e4m3_is_the_explicit_name_of_an_fp8_run(calls, tmp_path, capsys, tiny_model):
    """--kv-cache-dtype fp8_e4m3 is fp8 by its full name: the same FP8 plan (the FP8 engine beside the model-dtype
    pool, and Transformers with e4m3 K/V as its reference)."""
    out = tmp_path / "e4m3"
    code, _, err = _run(["run", "--suite", "baseline", "--kv-cache-dtype", "fp8_e4m3", "--dtype", "bfloat16",
                         "--out", str(out)], capsys, tiny_model)
    assert code == 0, err
    assert [(c["backend"], c["kv_cache_dtype"]) for c in calls] == [
        ("engine", "fp8_e4m3"), ("engine", "auto"), ("hf", "auto"), ("hf", "fp8_e4m3"), ("hf", "auto")]
    assert (out / "engine-fp8.json").is_file() and (out / "hf-bfloat16-fp8.json").is_file()
    code, _, err = _run(["run", "--suite", "kv", "--kv-cache-dtype", "fp8_e4m3", "--out", str(tmp_path / "kv")],
                        capsys, tiny_model)
    assert code == 2 and "compares engines with each other" in err


def test_random_ids_need_a_vocabulary_above_the_lowest_random_id():
    """Random ids are drawn from [100, min(vocab, 10000)): a vocabulary of 100 ids leaves nothing to draw from and
    is refused in words; one of 101 draws id 100 only."""
    with pytest.raises(LabkitError, match="vocab_size 100 is too small"):
        continuation(0, "A.R1", 3, 100)
    assert continuation(0, "A.R1", 3, 101) == [100, 100, 100]

