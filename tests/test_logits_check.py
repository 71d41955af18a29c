"""`labkit logits-check`: teacher-forced engine logits against Transformers, on CPU.

baseline, graph (eager) and prefix pass against the float32 truth; tp passes TP=2 vs TP=1 (both judged
against the truth) where the engine has tensor parallel and refuses in one line (exit 2) where it has not;
the kv suite passes engine vs engine and against Transformers' K/V; a deliberately broken engine fails with
its first bad row (or K/V step) named; the anchored gate passes an honest bf16 path that the fixed 0.02 gate
fails, fails a float32 path with one layer's weights perturbed, grades REVIEW and FAIL by the factors, and
its words never say "agree" under FAIL or REVIEW; the fixed gate stays available; collections whose suite,
token path or weights differ are refused; `run` works end to end.
"""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from labkit.errors import LabkitError
from labkit.logits import compare as cmp, gates
from labkit.logits.collect import Collection, collect_engine, collect_hf, load_hf, read_collection, write_collection
from labkit.logits.suites import SUITES, continuation, token_path

from .helpers import run_cli


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model needs no intra-op threads; with them, a busy 2-core machine makes the engine's many small
    ops wait on spinning OpenMP workers (measured 10x slower under load). Restored after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def hf_ref(tiny_model):
    return load_hf(tiny_model, "float32", "cpu")


@pytest.fixture(scope="module")
def collections(tiny_model, hf_ref):
    """(engine, hf) collections per suite, made once for the module."""
    made: dict[str, tuple[Collection, Collection]] = {}

    def get(name: str) -> tuple[Collection, Collection]:
        if name not in made:
            suite = SUITES[name]
            made[name] = (collect_engine(suite, tiny_model, device="cpu", dtype="float32"),
                          collect_hf(suite, tiny_model, device="cpu", dtype="float32", model=hf_ref))
        return made[name]

    return get


@pytest.fixture(scope="module")
def bf16_baseline(tiny_model):
    """(engine bf16, Transformers bf16) on the baseline suite: an honest bf16 path and the reference."""
    suite = SUITES["baseline"]
    return (collect_engine(suite, tiny_model, device="cpu", dtype="bfloat16"),
            collect_hf(suite, tiny_model, device="cpu", dtype="bfloat16"))


# --- suites ---------------------------------------------------------------------------------------


def test_suite_compositions():
    assert {n: s.rows for n, s in SUITES.items()} == {"baseline": 15, "graph": 126, "prefix": 6, "tp": 15, "mixed": 27,
                                                      "kv": 49, "fp8-kv": 277}
    graph = SUITES["graph"]
    assert [len(c.requests) for c in graph.cases] == [1, 9, 16, 17, 20]
    assert all(c.engine_kwargs()["max_num_seqs"] == 20 for c in graph.cases)
    lengths = [len(p["prompt"]) for p in token_path(graph, 2048, 0).values()]
    assert len(set(lengths)) > 20  # uneven batches
    path = token_path(SUITES["baseline"], 2048, 0)
    assert path["C.R1"]["prompt"] == list(range(100, 356))
    assert [len(path[r]["prompt"]) for r in ("chunk.A", "chunk.B")] == [700, 32]
    assert continuation(0, "A.R1", 3, 2048) == path["A.R1"]["continuation"]
    assert continuation(1, "A.R1", 3, 2048) != path["A.R1"]["continuation"]


@pytest.mark.parametrize("name", ["baseline", "graph", "prefix", "mixed"])
def test_suite_matches_transformers(collections, name):
    eng, hf = collections(name)
    result = cmp.compare(eng, hf)  # anchored: the float32 engine against the float32 truth and its floor
    s = result["summary"]
    assert result["verdict"] == "PASS", s["first_failure"] or s["first_review"]
    assert result["gate"]["rule"] == "anchored" and result["gate"]["judged"] == ["lhs"]
    assert s["rows"] == SUITES[name].rows and s["top1_agree"] == s["rows"]
    # Honest float32 noise, well inside the float32 floor x the row factor (= the old fixed gates).
    assert 0 < s["worst_max_abs"]["value"] < 1e-4 / 1.5
    assert s["worst_rel_l2"]["value"] < 1e-5 / 2
    assert s["worst_ratio"]["value"] < gates.ROW_PASS / 1.5
    assert s["overall"]["lhs"]["status"] == "PASS" and s["overall"]["lhs"]["reference_rel_l2"] is None
    row = result["rows"][0]
    assert row["reference_to_truth"] is None and set(row["to_truth"]) == {"lhs"}
    assert row["to_truth"]["lhs"]["rel_l2"] == row["rel_l2"] and row["status"] == "PASS"
    assert eng.arrays["logits"].dtype == np.float32 and eng.arrays["logits"].shape == (SUITES[name].rows, 2048)
    fixed = cmp.compare(eng, hf, gate="fixed")
    assert fixed["verdict"] == "PASS" and fixed["gate"]["rule"] == "fixed"
    assert (fixed["thresholds"]["max_abs"], fixed["thresholds"]["rel_l2"]) == (1e-4, 1e-5)


def test_baseline_rows_cover_chunk_decode_and_page_crossing(collections):
    eng, _ = collections("baseline")
    rows = {(r["request_id"], r["output_index"]): r for r in eng.rows}
    # chunk: step 1 computes 512 of A (no row); step 2 A's last 188 with B's 32 gives both rows.
    assert (rows["chunk.A", 0]["step"], rows["chunk.A", 0]["cached_tokens"], rows["chunk.A", 0]["scheduled_tokens"]) \
        == (2, 512, 188)
    assert rows["chunk.B", 0]["step"] == 2 and rows["chunk.B", 0]["batch"] == 2
    chunk_steps = [s for s in eng.meta["steps"] if s["case"] == "chunk"]
    assert [seq["row"] for seq in chunk_steps[0]["seqs"]] == [False]
    # C: the first decode computes position 256, the first slot of the second block.
    assert rows["C.R1", 1]["phase"] == "decode" and rows["C.R1", 1]["context_len"] == 257
    # B: uneven batch, R1 leaves after step 2.
    assert [r["batch"] for r in eng.rows if r["case"] == "B"] == [2, 2, 2, 2, 1, 1, 1]
    assert eng.meta["model_files"].keys() == {"config.json", "model.safetensors"}
    assert all(r["execution"] == "eager" for r in eng.rows)


def test_graph_suite_in_eager_records_the_path(collections):
    eng, _ = collections("graph")
    decodes = [s for s in eng.meta["steps"] if s["phase"] == "decode"]
    assert [s["num_seqs"] for s in decodes] == [1, 9, 16, 17, 20]
    assert {s["execution"] for s in eng.meta["steps"]} == {"eager"}
    assert eng.meta["config"]["execution"] == "eager"


def test_prefix_suite_hits_the_cache(collections):
    eng, _ = collections("prefix")
    first = {r["request_id"]: r for r in eng.rows if r["output_index"] == 0}
    assert (first["cold"]["cached_tokens"], first["cold"]["scheduled_tokens"]) == (0, 620)
    assert (first["hot"]["cached_tokens"], first["hot"]["scheduled_tokens"]) == (512, 108)
    assert (first["share"]["cached_tokens"], first["share"]["scheduled_tokens"]) == (512, 108)
    assert eng.meta["inputs"]["hot"]["prompt"] == eng.meta["inputs"]["cold"]["prompt"]
    assert eng.meta["inputs"]["hot"]["continuation"] == eng.meta["inputs"]["cold"]["continuation"]
    logits = eng.arrays["logits"]
    idx = {(r["request_id"], r["output_index"]): i for i, r in enumerate(eng.rows)}
    for k in range(2):  # cold and hot rows: same inputs, same numbers (within float noise)
        assert np.abs(logits[idx["cold", k]] - logits[idx["hot", k]]).max() < 1e-4


@pytest.fixture(scope="module")
def kv_truth(tiny_model, hf_ref):
    return collect_hf(SUITES["kv"], tiny_model, device="cpu", dtype="float32", model=hf_ref)


def test_kv_suite_engine_vs_engine(tiny_model, kv_truth):
    suite = SUITES["kv"]
    a = collect_engine(suite, tiny_model, device="cpu", dtype="float32")
    b = collect_engine(suite, tiny_model, device="cpu", dtype="float32")
    result = cmp.compare(a, b, gate="fixed")  # two runs of one path: identical, K/V included
    assert result["verdict"] == "PASS"
    kv = result["kv"]
    assert kv["compared"] and kv["worst_max_abs"] == 0.0 and kv["failed_steps"] == 0
    arrays = a.arrays
    # [token, layer, kv_head, head_dim]: tiny has 2 layers, 2 kv heads of 32.
    assert arrays["kv_k"].shape[1:] == (2, 2, 32) and arrays["kv_k"].shape == arrays["kv_v"].shape
    written = sum(len(p["prompt"]) + p_rows - 1 for p, p_rows in
                  ((a.meta["inputs"][r.id], r.max_tokens) for r in suite.requests))
    assert arrays["kv_k"].shape[0] == written  # every position written exactly once
    assert len(arrays["kv_position"]) == len(arrays["kv_request"]) == len(arrays["kv_step"]) == written
    # The K written at C's position 256 is the pool's first slot of C's second block, and is not zero.
    assert np.abs(arrays["kv_k"]).max() > 0
    # Transformers' cache gives the truth's K/V for the same positions, in the same layout.
    assert kv_truth.arrays["kv_k"].shape == arrays["kv_k"].shape
    anchored = cmp.compare(a, b, truth=kv_truth)
    assert anchored["verdict"] == "PASS" and anchored["gate"]["judged"] == ["lhs", "rhs"]
    akv = anchored["kv"]
    assert akv["rule"] == "anchored" and akv["status"] == "PASS" and set(akv["sides"]) == {"lhs", "rhs"}
    assert 0 < akv["worst_max_abs"] < 1e-4  # float32 engine K/V against Transformers' float32 K/V
    assert anchored["summary"]["lhs_to_rhs"]["worst_rel_l2"] == 0.0


def test_kv_compare_names_the_first_bad_step(tiny_model, kv_truth, monkeypatch):
    from engine.backends import torch_ref
    from engine.context import get_context

    suite = SUITES["kv"]
    clean = collect_engine(suite, tiny_model, device="cpu", dtype="float32")
    real_store = torch_ref.store_kvcache

    def store(k, v, k_cache, v_cache, slot_mapping, **scales):  # scales: an FP8 pool's (engine/kv_quant.py)
        if get_context().prefill is None:  # a decode step
            v = v + 0.01
        real_store(k, v, k_cache, v_cache, slot_mapping, **scales)

    monkeypatch.setattr(torch_ref, "store_kvcache", store)
    broken = collect_engine(suite, tiny_model, device="cpu", dtype="float32")
    result = cmp.compare(broken, clean, gate="fixed")
    assert result["verdict"] == "FAIL"
    assert result["kv"]["first_failure"].startswith("case A step 2 (decode): layer 0 V")
    # Anchored, engine vs engine: the broken side is judged against Transformers' K/V and named.
    for lhs, rhs, side in ((broken, clean, "lhs"), (clean, broken, "rhs")):
        result = cmp.compare(lhs, rhs, truth=kv_truth)
        assert result["verdict"] == "FAIL"
        assert result["kv"]["first_failure"].startswith(f"{side}: case A step 2 (decode): layer 0 V"), \
            result["kv"]["first_failure"]
        assert result["kv"]["sides"]["lhs" if side == "rhs" else "rhs"]["failed_steps"] == 0


# --- failures and refusals ------------------------------------------------------------------------


def _baseline_with(monkeypatch, tiny_model, owner, name: str, replacement) -> Collection:
    """The float32 engine's baseline collection with owner.name replaced (a planted bug) while it runs."""
    monkeypatch.setattr(owner, name, replacement)
    try:
        return collect_engine(SUITES["baseline"], tiny_model, device="cpu", dtype="float32")
    finally:
        monkeypatch.undo()


def test_perturbed_engine_fails_with_first_bad_row(tiny_model, collections, monkeypatch, tmp_path, capsys):
    from engine.runner import ModelRunner

    real_step_inputs = ModelRunner.step_inputs

    def late_positions(self, plan):
        # Decode tokens get RoPE one position late (their KV still goes to the right slot). Shifting every
        # position, prefill included, would cancel out: RoPE only sees position differences.
        inputs = real_step_inputs(self, plan)
        nd = inputs.num_decodes
        inputs.positions = [p + 1 for p in inputs.positions[:nd]] + inputs.positions[nd:]
        return inputs

    broken = _baseline_with(monkeypatch, tiny_model, ModelRunner, "step_inputs", late_positions)
    _, hf = collections("baseline")
    result = cmp.compare(broken, hf)
    s = result["summary"]
    assert result["verdict"] == "FAIL"
    assert s["first_failing_row"] == 1
    assert s["first_failure"].startswith("row 1 (A.R1 output 1, case A, step 2 decode, context 4 ids): distance "
                                         "to the truth")
    assert cmp.compare(broken, hf, gate="fixed")["summary"]["first_failure"].startswith(
        "row 1 (A.R1 output 1, case A, step 2 decode, context 4 ids): max|diff|")
    assert result["rows"][0]["status"] == "PASS"  # the prefill row is untouched
    # Through the CLI: exit 1, the first failing row printed, JSON + Markdown written.
    lhs, _ = write_collection(broken, tmp_path / "broken")
    rhs, _ = write_collection(copy.deepcopy(hf), tmp_path / "hf")
    code, out, _ = run_cli(["logits-check", "compare", "--lhs", str(tmp_path / "broken"), "--rhs", str(rhs),
                            "--out", str(tmp_path / "check.json")], capsys)
    assert code == 1
    assert "VERDICT: FAIL" in out and "first failure: row 1 (A.R1 output 1" in " ".join(out.split())
    report = json.loads((tmp_path / "check.json").read_text())
    assert report["verdict"] == "FAIL" and report["command"] == "logits-check compare"
    assert report["summary"]["first_failing_row"] == 1
    assert "FAIL" in (tmp_path / "check.md").read_text()


def _with(col: Collection, **meta) -> Collection:
    return Collection({**copy.deepcopy(col.meta), **meta}, dict(col.arrays))


def test_refuses_different_suite_path_or_weights(tiny_model, collections, hf_ref, tmp_path_factory):
    from labkit.fake_model import make_fake_model

    eng, hf = collections("baseline")
    _, prefix_hf = collections("prefix")
    with pytest.raises(LabkitError) as err:
        cmp.compare(eng, prefix_hf)
    assert err.value.code == 2 and "suites differ: lhs baseline, rhs prefix" in str(err.value)

    seed1 = collect_hf(SUITES["baseline"], tiny_model, device="cpu", dtype="float32", seed=1, model=hf_ref)
    with pytest.raises(LabkitError) as err:
        cmp.compare(eng, seed1)
    assert err.value.code == 2 and "token paths differ: request A.R1 continuation[0]" in str(err.value)
    assert "(seed 0 vs 1)" in str(err.value)

    other = tmp_path_factory.mktemp("models") / "tiny-seed1"
    make_fake_model("tiny", other, seed=1)
    other_weights = collect_engine(SUITES["baseline"], other, device="cpu", dtype="float32")
    with pytest.raises(LabkitError) as err:
        cmp.compare(eng, other_weights)
    assert err.value.code == 2 and "weights differ: model.safetensors sha256" in str(err.value)
    # The same weights read through another config (say, another rope_theta) are another model.
    files = dict(hf.meta["model_files"])
    assert "config.json" in files
    files["config.json"] = "0" * 64
    with pytest.raises(LabkitError) as err:
        cmp.compare(eng, _with(hf, model_files=files))
    assert err.value.code == 2 and "model config differs: config.json sha256" in str(err.value)

    # Same path but one side's recorded prompt changed: named down to the position.
    path = copy.deepcopy(hf.meta["inputs"])
    path["C.R1"]["prompt"][7] += 1
    with pytest.raises(LabkitError, match=r"request C\.R1 prompt\[7\]: 107 vs 108"):
        cmp.compare(eng, _with(hf, inputs=path, token_path_sha256="x"))


def test_fixed_gate_review_when_a_near_tie_flips(collections):
    _, hf = collections("baseline")
    ref = hf.arrays["logits"].copy()
    t1, t2 = np.argsort(ref[0])[-1], np.argsort(ref[0])[-2]
    ref[0, t2] = ref[0, t1] - 4e-5           # the reference's top two are 4e-5 apart
    lhs = ref.copy()
    lhs[0, t2] = ref[0, t1] + 1e-5           # moved by 5e-5 (within 1e-4): top-1 flips
    result = cmp.compare(Collection(hf.meta, {"logits": lhs}), Collection(hf.meta, {"logits": ref}), gate="fixed")
    assert result["verdict"] == "REVIEW" and result["rows"][0]["status"] == "REVIEW"
    ref[0, t2] = ref[0, t1] - 8e-5           # a clear margin the measured error cannot explain
    lhs = ref.copy()
    lhs[0, t1] -= 4.5e-5
    lhs[0, t2] += 4.5e-5
    result = cmp.compare(Collection(hf.meta, {"logits": lhs}), Collection(hf.meta, {"logits": ref}), gate="fixed")
    assert result["verdict"] == "FAIL" and "top-1" in result["summary"]["first_failure"]
    # bf16 collections get the seeds' gates.
    bf = _with(hf, dtype="bfloat16")
    th = cmp.compare(bf, bf, gate="fixed")["thresholds"]
    assert (th["max_abs"], th["rel_l2"], th["kv_max_abs"], th["dtype_basis"]) == (0.5, 0.02, 0.1, "bfloat16")


# --- the anchored gate ----------------------------------------------------------------------------


def _as(col: Collection, logits: np.ndarray, dtype: str = "bfloat16", backend: str = "engine") -> Collection:
    """A collection with col's rows and token path, other logits, and the given dtype/backend."""
    return Collection({**copy.deepcopy(col.meta), "dtype": dtype, "backend": backend},
                      {"logits": np.asarray(logits, dtype=np.float32)})


def test_anchored_identical_paths_pass(collections):
    _, truth = collections("baseline")
    result = cmp.compare(truth, truth)
    s = result["summary"]
    assert result["verdict"] == "PASS" and s["passed"] == s["rows"] == 15
    assert s["worst_ratio"]["value"] == 0.0 and s["overall"]["lhs"]["ratio"] == 0.0


def test_anchored_fails_a_float32_path_with_one_layer_perturbed(tiny_model, collections, monkeypatch):
    import engine.runner as runner

    real_load = runner.load_model

    def perturbed(model, path):  # one layer's weights + 1e-2 x N(0, 1)
        real_load(model, path)
        w = model.get_parameter("model.layers.0.mlp.down_proj.weight")
        noise = torch.randn(w.shape, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            w.add_(1e-2 * noise.to(w.dtype))

    broken = _baseline_with(monkeypatch, tiny_model, runner, "load_model", perturbed)
    _, truth = collections("baseline")
    result = cmp.compare(broken, truth)
    s = result["summary"]
    assert result["verdict"] == "FAIL" and s["failed"] == s["rows"]
    assert s["overall"]["lhs"]["status"] == "FAIL" and s["worst_ratio"]["value"] > 100 * gates.ROW_FAIL
    assert s["first_failure"].startswith("row 0 (A.R1 output 0, case A, step 1 prefill, context 3 ids): distance to "
                                         "the truth")


def test_anchored_passes_honest_bf16_noise_that_the_fixed_gate_fails(collections, bf16_baseline):
    _, truth = collections("baseline")
    eng, ref = bf16_baseline
    # The fixed 0.02 gate: the bf16 engine fails against Transformers bf16 and against the float32 truth, and
    # Transformers bf16 fails against its own float32 run.
    for lhs, rhs in ((eng, ref), (eng, truth), (ref, truth)):
        fixed = cmp.compare(lhs, rhs, gate="fixed")
        assert fixed["verdict"] == "FAIL" and fixed["thresholds"]["rel_l2"] == 0.02
    result = cmp.compare(eng, truth, reference=ref)
    s = result["summary"]
    assert result["verdict"] == "PASS", s["first_failure"] or s["first_review"]
    assert s["worst_rel_l2"]["value"] > 0.02  # well over the fixed gate: it is bf16 noise
    assert s["worst_ratio"]["value"] <= gates.ROW_PASS and s["overall"]["lhs"]["ratio"] <= gates.OVERALL_PASS
    # The JSON records the rule, its factors and, per row, both distances to the truth and the verdict.
    g = result["gate"]
    assert (g["rule"], g["row_factor"], g["row_fail_factor"], g["overall_factor"]) == \
        ("anchored", gates.ROW_PASS, gates.ROW_FAIL, gates.OVERALL_PASS)
    row = result["rows"][0]
    assert row["reference_to_truth"]["rel_l2"] > 0 and row["to_truth"]["lhs"]["rel_l2"] > 0
    assert row["status"] == row["to_truth"]["lhs"]["status"] == "PASS"
    with pytest.raises(LabkitError, match=r"lhs is bfloat16: .*--reference") as err:
        cmp.compare(eng, truth)
    assert err.value.code == 2
    with pytest.raises(LabkitError, match="cannot be the float32 truth"):
        cmp.compare(eng, ref)


def _graded(truth: Collection, ref: Collection, k: float) -> dict:
    """A bf16 path k times as far from the truth as the reference, on every row and in every logit."""
    t, r = truth.arrays["logits"].astype(np.float64), ref.arrays["logits"].astype(np.float64)
    return cmp.compare(_as(truth, t + k * (r - t)), truth, reference=ref)


def test_anchored_grades_by_the_factors(collections, bf16_baseline):
    _, truth = collections("baseline")
    _, ref = bf16_baseline
    assert _graded(truth, ref, 1.0)["verdict"] == "PASS"
    review = _graded(truth, ref, 2.8)
    assert review["verdict"] == "REVIEW" and review["summary"]["review"] == 15
    assert review["summary"]["overall"]["lhs"]["status"] == "REVIEW"
    assert review["rows"][0]["to_truth"]["lhs"]["ratio"] == pytest.approx(2.8, rel=1e-3)
    fail = _graded(truth, ref, 6.0)
    assert fail["verdict"] == "FAIL" and fail["summary"]["failed"] == 15


def test_anchored_top1_flip_fails_on_a_wide_margin_only(collections):
    _, truth = collections("baseline")
    rng = np.random.default_rng(0)
    t = truth.arrays["logits"].astype(np.float64)
    a, b = int(t[0].argmax()), int(np.argsort(t[0])[-2])
    t[0, a] = t[0].max() + 1.0  # a clear top-1 ...

    def flipped(margin: float, move: float) -> dict:
        tt = t.copy()
        tt[0, b] = tt[0, a] - margin  # ... and a runner-up `margin` below it
        ref = tt + rng.uniform(-0.05, 0.05, tt.shape)  # noise max-abs ~0.05 on every row
        lhs = tt + rng.uniform(-0.05, 0.05, tt.shape)
        lhs[0, a], lhs[0, b] = tt[0, a] - move, tt[0, b] + move  # the two swap places, each moved by `move`
        return cmp.compare(_as(truth, lhs), _as(truth, tt, "float32", "hf"), reference=_as(truth, ref, backend="hf"))

    wide = flipped(0.2, 0.11)  # margin 0.2 > 2 x 0.05; each logit moved 0.11 < 2.5 x 0.05
    row = wide["rows"][0]["to_truth"]["lhs"]
    assert row["ratio"] < gates.ROW_PASS and row["top1"] == b
    assert wide["verdict"] == "FAIL" and wide["rows"][0]["status"] == "FAIL"
    assert f"top-1 {b} differs from the truth's {a} although the truth's top-two margin 0.2 is wide" in row["reason"]
    tie = flipped(0.05, 0.03)  # margin 0.05 <= 2 x 0.05: rounding can flip it
    assert tie["verdict"] == "PASS" and tie["summary"]["near_tie_flips"] == 1
    assert "near tie" in tie["rows"][0]["reason"]


def test_verdict_words_follow_the_verdict(collections, bf16_baseline, tmp_path, capsys):
    _, truth = collections("baseline")
    eng, ref = bf16_baseline
    t, r = truth.arrays["logits"].astype(np.float64), ref.arrays["logits"].astype(np.float64)
    cases = {"REVIEW": (_as(truth, t + 2.8 * (r - t)), truth), "FAIL": (_as(truth, t + 6 * (r - t)), truth)}
    for verdict, (lhs, rhs) in cases.items():
        for name, col in (("lhs", lhs), ("rhs", rhs), ("reference", ref)):
            write_collection(copy.deepcopy(col), tmp_path / f"{verdict}-{name}")
        code, out, err = run_cli(["logits-check", "compare", "--lhs", str(tmp_path / f"{verdict}-lhs"),
                                  "--rhs", str(tmp_path / f"{verdict}-rhs"), "--reference",
                                  str(tmp_path / f"{verdict}-reference"), "--out", str(tmp_path / f"{verdict}.json")],
                                 capsys)
        assert code == (1 if verdict == "FAIL" else 0), err
        report = json.loads((tmp_path / f"{verdict}.json").read_text())
        md = (tmp_path / f"{verdict}.md").read_text()
        assert report["verdict"] == verdict and f"VERDICT: {verdict}" in out
        assert f"**{verdict}**" in md and report["what_this_shows"] in " ".join(md.split("\n"))
        words = " ".join([out, md, report["what_this_shows"]] + [r["reason"] for r in report["rows"]]).lower()
        assert "agree" not in words, verdict
    # The fixed gate's FAIL and REVIEW words too.
    fail = cmp.compare(eng, ref, gate="fixed")
    tie = truth.arrays["logits"].copy()
    t2, t1 = np.argsort(tie[0])[-2:]
    tie[0, t2] = tie[0, t1] - 4e-5  # top two 4e-5 apart ...
    flip = tie.copy()
    flip[0, t2] = tie[0, t1] + 1e-5  # ... flipped by a change within the float32 thresholds
    review = cmp.compare(_as(truth, flip, "float32"), _as(truth, tie, "float32"), gate="fixed")
    assert (fail["verdict"], review["verdict"]) == ("FAIL", "REVIEW")
    for res in (fail, review):
        res.update(lhs=cmp.side_summary(eng, "lhs"), rhs=cmp.side_summary(ref, "rhs"), evidence="cpu-executed")
        assert "agree" not in (cmp.markdown(res) + res["what_this_shows"]).lower()
    assert review["what_this_shows"].startswith("Not a pass")


# --- the CLI --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_tp_suite_passes_or_refuses_cleanly(tiny_model, tmp_path, capsys):
    """TP=2 against TP=1 on baseline's inputs. An engine without tensor parallel refuses in one line (exit 2);
    one with it must match TP=1 (exit 0, PASS)."""
    out = tmp_path / "tp"
    code, stdout, err = run_cli(["logits-check", "run", "--suite", "tp", "--model", tiny_model, "--device", "cpu",
                                 "--dtype", "float32", "--out", str(out)], capsys)
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and "--tensor-parallel-size 2" in lines[0] and "tensor" in lines[0], err
        assert not (out / "check.json").exists()
    else:
        assert code == 0, err
        report = json.loads((out / "check.json").read_text())
        assert report["verdict"] == "PASS" and report["summary"]["rows"] == 15
        assert (report["lhs"]["tensor_parallel_size"], report["rhs"]["tensor_parallel_size"]) == (2, 1)
        # Both sides judged against the float32 truth, not only against each other.
        assert report["gate"]["judged"] == ["lhs", "rhs"] and report["truth"]["backend"] == "hf"
        assert set(report["rows"][0]["to_truth"]) == {"lhs", "rhs"} and "lhs_to_rhs" in report["rows"][0]
        assert (out / "tp2.npz").is_file() and (out / "tp1.npz").is_file()
    code, _, err = run_cli(["logits-check", "run", "--suite", "tp", "--tensor-parallel-size", "1",
                            "--model", tiny_model,
                            "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and "--tensor-parallel-size 1" in err and len(err.strip().splitlines()) == 1


def test_engine_refusing_tp_is_reported_in_one_line(tiny_model, monkeypatch, tmp_path, capsys):
    import engine

    real_llm = engine.LLM

    def refuse_tp(model, **kwargs):  # e.g. heads that do not divide by the TP size
        if kwargs.get("tensor_parallel_size", 1) > 1:
            raise ValueError("tensor_parallel_size: num_key_value_heads (2) is not divisible by 4")
        return real_llm(model, **kwargs)

    monkeypatch.setattr(engine, "LLM", refuse_tp)
    code, _, err = run_cli(["logits-check", "run", "--suite", "tp", "--model", tiny_model, "--device", "cpu",
                            "--out", str(tmp_path / "tp")], capsys)
    assert code == 2
    assert err.strip() == ("labkit: --tensor-parallel-size 2: tensor_parallel_size: num_key_value_heads (2) is "
                           "not divisible by 4")


def test_cli_run_baseline_end_to_end(tiny_model, tmp_path, capsys):
    out = tmp_path / "logits-baseline"
    code, stdout, err = run_cli(["logits-check", "run", "--suite", "baseline", "--model", tiny_model,
                                 "--device", "cpu", "--out", str(out)], capsys)
    assert code == 0, err
    assert "VERDICT: PASS" in stdout
    for name in ("engine.json", "engine.npz", "hf-float32.json", "hf-float32.npz", "check.json", "check.md"):
        assert (out / name).is_file(), name
    assert not (out / "hf-bfloat16.json").exists()  # a float32 engine needs no bf16 reference
    report = json.loads((out / "check.json").read_text())
    for key in ("command", "argv", "versions", "device", "model", "git_head", "started_at", "ended_at", "evidence"):
        assert key in report
    assert report["verdict"] == "PASS" and report["evidence"] == "cpu-executed"
    assert report["summary"]["rows"] == 15 and report["summary"]["top1_agree"] == 15
    eng = read_collection(out / "engine")
    assert eng.meta["status"] == "COLLECTED" and len(eng.meta["rows"]) == 15
    assert eng.meta["model_files"]["model.safetensors"] == report["model_files"]["model.safetensors"]
    assert {s["execution"] for s in eng.meta["steps"]} == {"eager"}
    assert report["gate"]["rule"] == "anchored" and report["lhs"]["backend"] == "engine"
    assert report["rhs"]["dtype"] == "float32" and report["reference"] is None
    assert "# logits-check baseline: **PASS** (gate anchored)" in (out / "check.md").read_text()
    # The fixed thresholds stay available, explicitly.
    code, stdout, err = run_cli(["logits-check", "compare", "--lhs", str(out / "engine"),
                                 "--rhs", str(out / "hf-float32"),
                                 "--gate", "fixed", "--out", str(out / "fixed.json")], capsys)
    assert code == 0, err
    fixed = json.loads((out / "fixed.json").read_text())
    assert fixed["gate"]["rule"] == "fixed" and fixed["thresholds"]["rel_l2"] == 1e-5 and fixed["verdict"] == "PASS"
    code, _, err = run_cli(["logits-check", "compare", "--lhs", str(out / "engine"), "--rhs", str(out / "hf-float32"),
                            "--rel-l2", "0.1", "--out", str(out / "x.json")], capsys)
    assert code == 2 and "--gate fixed" in err and len(err.strip().splitlines()) == 1
    # A different suite's collection is refused through the CLI, with exit 2 and the reason.
    code, _, err = run_cli(["logits-check", "collect", "--suite", "prefix", "--backend", "hf", "--model", tiny_model,
                            "--device", "cpu", "--out", str(out / "hf-prefix")], capsys)
    assert code == 0
    code, _, err = run_cli(["logits-check", "compare", "--lhs", str(out / "engine"), "--rhs", str(out / "hf-prefix"),
                            "--out", str(out / "bad.json")], capsys)
    assert code == 2 and "suites differ" in err and not (out / "bad.json").exists()
