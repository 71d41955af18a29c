"""The `fp8-kv` logits suite: the engine with kv_cache_dtype fp8 judged against the float32 truth, measured by
Transformers doing the same FP8 arithmetic (its K/V round-tripped through e4m3), beside the same engine with the
model-dtype pool: the cost of FP8 in numbers.

On CPU, tiny model, bf16: the reference's round trip is bit-equal to the engine's quantiser and changes nothing
else in Transformers' attention; the honest engine passes (the full suite through the CLI, and a smaller suite of
the same kinds of cases); planted bugs each change the verdict as they should: a pool that is not FP8, a KV
write with the wrong scale, a reference that does not quantise, a broken baseline; what cannot be judged is
refused in one line; `report verify` re-judges the check from its arrays.
"""
from __future__ import annotations

import json

import pytest
import torch

from labkit.errors import LabkitError
from labkit.logits import compare as cmp, cost, gates, hf_fp8
from labkit.logits.collect import collect_engine, collect_hf, load_hf, read_collection
from labkit.logits.suites import SUITES, Case, Request, Suite, _baseline_cases

from .helpers import run_cli

# The fp8-kv suite's kinds of case, smaller: a short decode, a chunked prefill, a longer decode over one
# block's boundary, a prefix hit. The full suite runs once, through the CLI (test_cli_run_end_to_end).
MINI = Suite("fp8-kv", "fp8-kv's kinds of case, fewer rows",
             (_baseline_cases()[0], _baseline_cases()[3],
              Case("long", "a 230-id prompt, 40 decodes over the block boundary",
                   (Request("long", {"random": 230, "seed": 41}, 40),)),
              SUITES["prefix"].cases[0]),
             "hf", kv_cache_dtype="fp8", hf_one_forward=True)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """As in test_logits_check.py: a busy 2-core machine runs the tiny model's small ops faster on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def sides(tiny_model):
    """The five collections of an fp8-kv check on the MINI suite, bf16."""
    return {
        "lhs": collect_engine(MINI, tiny_model, device="cpu", dtype="bfloat16", kv_cache_dtype="fp8"),
        "baseline": collect_engine(MINI, tiny_model, device="cpu", dtype="bfloat16"),
        "truth": collect_hf(MINI, tiny_model, device="cpu", dtype="float32"),
        "reference": collect_hf(MINI, tiny_model, device="cpu", dtype="bfloat16", kv_cache_dtype="fp8"),
        "baseline_reference": collect_hf(MINI, tiny_model, device="cpu", dtype="bfloat16"),
    }


def judge(sides: dict, **replace) -> dict:
    s = {**sides, **replace}
    return cmp.compare(s["lhs"], s["truth"], reference=s["reference"], baseline=s["baseline"],
                       baseline_reference=s["baseline_reference"])


# --- the reference's arithmetic ---------------------------------------------------------------------------


def _edges() -> torch.Tensor:
    """Every e4m3 value, the midpoints between neighbours (ties), a hair either side, values past 448."""
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    pos = values[torch.isfinite(values) & (values >= 0)].unique()
    mids = (pos[1:] + pos[:-1]) / 2
    grid = torch.cat([pos, mids, mids * (1 + 2 ** -20), mids * (1 - 2 ** -20), torch.tensor([447.9, 460.0, 1e6])])
    return torch.cat([grid, -grid])


@pytest.mark.parametrize("scale", [1.0, 0.37, 4.0])
def test_round_trip_is_the_engines_quantiser_bit_for_bit(scale):
    from engine.kv_quant import quantize

    x = _edges() * scale
    want = quantize(x, scale).float() * scale
    assert torch.equal(hf_fp8.round_trip(x, scale), want)
    xb = x.to(torch.bfloat16)
    assert torch.equal(hf_fp8.round_trip(xb, scale), (quantize(xb, scale).float() * scale).to(torch.bfloat16))


def test_the_engine_stores_with_the_scale_the_reference_assumes():
    from engine.layers.attention import Attention

    layer = Attention(4, 32, 1.0, 2, backend=None)
    assert (layer.k_scale, layer.v_scale) == (hf_fp8.KV_SCALE, hf_fp8.KV_SCALE)


def test_registered_attention_is_eager_attention_after_the_round_trip(tiny_model, monkeypatch):
    """With the round trip made the identity, the registered attention gives eager's logits bit for bit: the
    round trip is the only thing it changes. With it, every key and value eager attention sees is an e4m3
    value, and the logits move."""
    ids = torch.tensor([list(range(100, 400))])
    eager = load_hf(tiny_model, "bfloat16", "cpu")
    fp8 = load_hf(tiny_model, "bfloat16", "cpu", hf_fp8.register())
    with torch.inference_mode():
        plain = eager(input_ids=ids, use_cache=False).logits
        seen = []
        from transformers.models.qwen3 import modeling_qwen3

        real_eager = modeling_qwen3.eager_attention_forward

        def spy(module, q, k, v, *a, **kw):
            seen.append((k, v))
            return real_eager(module, q, k, v, *a, **kw)

        monkeypatch.setattr(modeling_qwen3, "eager_attention_forward", spy)
        hf_fp8.register.cache_clear()
        quantised = load_hf(tiny_model, "bfloat16", "cpu", hf_fp8.register())(input_ids=ids, use_cache=False).logits
        assert len(seen) == 2  # one call per layer
        for k, v in seen:
            for t in (k, v):
                assert torch.equal(t.float(), t.float().to(torch.float8_e4m3fn).float())  # e4m3 values
        assert not torch.equal(quantised, plain)
        monkeypatch.setattr(hf_fp8, "round_trip", lambda x, scale=1.0: x)
        assert torch.equal(fp8(input_ids=ids, use_cache=False).logits, plain)
    hf_fp8.register.cache_clear()


def test_one_forward_rows_equal_a_recompute_per_row(tiny_model):
    """hf_one_forward computes the same function as a forward per row: within the float32 gates (1e-5 rel-L2,
    1e-4 max-abs; only the matmuls' shapes differ)."""
    one = collect_hf(MINI, tiny_model, device="cpu", dtype="float32")
    per_row = Suite(MINI.name, MINI.about, MINI.cases[:2], "hf", kv_cache_dtype="fp8")
    each = collect_hf(per_row, tiny_model, device="cpu", dtype="float32")
    n = each.arrays["logits"].shape[0]
    assert one.meta["code_path"] == {"hf one forward per request": MINI.rows}
    d = gates.row_distances(one.arrays["logits"][:n], each.arrays["logits"])
    assert d["rel_l2"].max() < 1e-5 and d["max_abs"].max() < 1e-4


# --- the honest engine and planted bugs ----------------------------------------------------------------------


def test_honest_fp8_engine_passes_and_states_its_cost(sides):
    res = judge(sides)
    c = res["kv_cost"]
    assert res["verdict"] == "PASS", res["what_this_shows"]
    assert c["baseline"]["verdict"] == "PASS" and c["quantised"]["status"] == "PASS"
    # FP8 is visible: several times the model dtype's distance, for Transformers as for the engine.
    assert c["reference_ratio"] > cost.DISCERNIBLE and c["ratio"] > cost.DISCERNIBLE
    assert 0.6 < c["ratio"] / c["reference_ratio"] < 1.7
    assert c["rel_l2"]["fp8"] == pytest.approx(c["ratio"] * c["rel_l2"]["baseline"])
    words = res["what_this_shows"]
    assert words.startswith("On these fixed token paths") and f"{c['ratio']:.2f}x" in words
    assert "shows that it quantised" in words
    named = {"lhs": "lhs", "rhs": "truth", "reference": "reference", "baseline": "baseline",
             "baseline_reference": "baseline_reference"}
    md = cmp.markdown({**res, **{k: cmp.side_summary(sides[v], f"/lc/{v}") for k, v in named.items()}})
    assert "## What FP8 costs in numbers" in md and f"**{c['ratio']:.3g}x**" in md


def test_planted_pool_that_is_not_fp8_fails_as_not_quantised(tiny_model, sides, monkeypatch):
    """kv_cache_dtype fp8 asked for, but the pool keeps the model dtype: the logits are the baseline's, the
    cost ~1x, and the check says the path does not compute what FP8 computes."""
    import engine.runner

    monkeypatch.setattr(engine.runner, "cache_dtype", lambda kv_cache_dtype, model_dtype: model_dtype)
    broken = collect_engine(MINI, tiny_model, device="cpu", dtype="bfloat16", kv_cache_dtype="fp8")
    res = judge(sides, lhs=broken)
    c = res["kv_cost"]
    assert res["verdict"] == "FAIL" and c["quantised"]["status"] == "FAIL"
    assert c["judged_verdict"] == "PASS"  # closer to the truth than FP8 allows is not a row failure ...
    assert c["ratio"] < 1.3  # ... but the cost is gone
    assert res["what_this_shows"].startswith("The FP8 path does not compute what FP8 computes")
    assert "not the FP8 arithmetic" in res["summary"]["first_failure"]


def test_planted_kv_write_with_the_wrong_scale_fails_its_rows(tiny_model, sides, monkeypatch):
    """The KV write stores e4m3(x / 0.5) while attention multiplies back 1.0: K and V doubled."""
    from engine.backends import torch_ref

    real = torch_ref.store_kvcache
    monkeypatch.setattr(torch_ref, "store_kvcache", lambda k, v, kc, vc, slots, k_scale=1.0, v_scale=1.0:
                        real(k, v, kc, vc, slots, 0.5 * k_scale, 0.5 * v_scale))
    broken = collect_engine(MINI, tiny_model, device="cpu", dtype="bfloat16", kv_cache_dtype="fp8")
    res = judge(sides, lhs=broken)
    assert res["verdict"] == "FAIL" and res["kv_cost"]["judged_verdict"] == "FAIL"
    assert res["summary"]["failed"] > MINI.rows // 2
    assert res["what_this_shows"].startswith("This path does not compute the model's logits")
    assert res["summary"]["first_failure"].startswith("row ")


def test_planted_reference_that_does_not_quantise_fails_the_honest_engine(tiny_model, sides, monkeypatch):
    """A yardstick without the round trip is the model dtype's noise: the honest FP8 engine is then far beyond
    it (the suite's rule depends on the reference doing FP8's arithmetic)."""
    monkeypatch.setattr(hf_fp8, "round_trip", lambda x, scale=1.0: x)
    plain = collect_hf(MINI, tiny_model, device="cpu", dtype="bfloat16", kv_cache_dtype="fp8")
    res = judge(sides, reference=plain)
    assert res["verdict"] == "FAIL"
    assert res["summary"]["worst_ratio"]["value"] > 5
    assert res["kv_cost"]["reference_ratio"] < 1.5


def test_planted_broken_baseline_fails_with_words_about_the_cost(tiny_model, sides, monkeypatch):
    """The model-dtype engine (the cost's denominator) computes wrong attention: the FP8 side still passes, the
    check fails and says the cost cannot be stated."""
    from engine.backends import torch_ref

    real = torch_ref.decode
    monkeypatch.setattr(torch_ref, "decode", lambda *a, **kw: real(*a, **kw) * 1.5)
    broken = collect_engine(MINI, tiny_model, device="cpu", dtype="bfloat16")
    res = judge(sides, baseline=broken)
    c = res["kv_cost"]
    assert res["verdict"] == "FAIL" and c["judged_verdict"] == "PASS" and c["baseline"]["verdict"] == "FAIL"
    words = res["what_this_shows"]
    assert words.startswith("The cost of FP8 cannot be stated") and "own rows are within" in words
    assert "baseline" in res["summary"]["first_failure"]


def test_what_cannot_be_judged_is_refused(sides):
    s = sides
    with pytest.raises(LabkitError) as err:  # an FP8 side measured by a plain reference
        cmp.compare(s["lhs"], s["truth"], reference=s["baseline_reference"])
    assert err.value.code == 2 and "--kv-cache-dtype fp8" in str(err.value)
    with pytest.raises(LabkitError) as err:  # a plain side measured by an FP8 reference
        cmp.compare(s["baseline"], s["truth"], reference=s["reference"])
    assert err.value.code == 2 and "without --kv-cache-dtype" in str(err.value)
    with pytest.raises(LabkitError) as err:  # a quantised truth
        cmp.compare(s["lhs"], s["reference"], truth=s["reference"], reference=s["reference"])
    assert err.value.code == 2
    with pytest.raises(LabkitError) as err:  # the baseline must be the model-dtype pool
        judge(sides, baseline=s["lhs"])
    assert err.value.code == 2 and "model-dtype pool" in str(err.value)
    with pytest.raises(LabkitError) as err:
        cmp.compare(s["baseline"], s["truth"], reference=s["baseline_reference"], baseline=s["baseline"])
    assert err.value.code == 2 and "kv_cache_dtype fp8" in str(err.value)


def test_cli_refuses_fp8_where_it_cannot_be_judged(tiny_model, tmp_path, capsys):
    for args, words in ((["--suite", "fp8-kv", "--kv-cache-dtype", "auto"], "judges an FP8 KV cache"),
                        (["--suite", "kv", "--kv-cache-dtype", "fp8"], "compares engines with each other"),
                        (["--suite", "fp8-kv", "--gate", "fixed"], "anchored gate")):
        code, _, err = run_cli(["logits-check", "run", *args, "--model", tiny_model, "--device", "cpu",
                                "--out", str(tmp_path / "x")], capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


def test_cli_run_end_to_end_and_report_verify(tiny_model, tmp_path, capsys):
    """The whole suite as a user runs it (bf16 on CPU), then `labkit report` and `report verify`."""
    runs = tmp_path / "runs"
    out = runs / "logits-fp8-kv"
    code, stdout, err = run_cli(["logits-check", "run", "--suite", "fp8-kv", "--model", tiny_model, "--device", "cpu",
                                 "--dtype", "bfloat16", "--out", str(out)], capsys)
    assert code == 0, err
    for name in ("engine-fp8", "engine", "hf-float32", "hf-bfloat16-fp8", "hf-bfloat16"):
        assert (out / f"{name}.json").is_file() and (out / f"{name}.npz").is_file(), name
    check = json.loads((out / "check.json").read_text())
    c = check["kv_cost"]
    assert check["verdict"] == "PASS" and check["summary"]["rows"] == SUITES["fp8-kv"].rows == 277
    assert read_collection(out / "engine-fp8").meta["kv_cache_dtype"] == "fp8"
    assert read_collection(out / "hf-bfloat16-fp8").meta["config"]["kv_quantization"]["k_scale"] == 1.0
    assert check["baseline"]["prefix"].endswith("engine") and check["baseline_reference"]["dtype"] == "bfloat16"
    assert c["ratio"] > cost.DISCERNIBLE and c["baseline"]["verdict"] == "PASS"
    assert "VERDICT: PASS" in stdout and f"what FP8 costs: {c['text']}" in " ".join(stdout.split())
    assert "## What FP8 costs in numbers" in (out / "check.md").read_text()
    rows = {r["case"] for r in check["rows"]}
    assert rows == {"A", "B", "C", "chunk", "long", "prefix"}
    assert max(r["context_len"] for r in check["rows"] if r["case"] == "long") == 64 + 255
    assert any(r["cached_tokens"] == 512 for r in check["rows"] if r["case"] == "prefix")
    code, _, err = run_cli(["report", "--runs", str(runs), "--out", str(tmp_path / "report")], capsys)
    assert code == 0, err
    code, stdout, err = run_cli(["report", "verify", str(tmp_path / "report" / "evidence.tar.gz")], capsys)
    assert code == 0, err + stdout
    assert "1 logits check(s) re-judged" in " ".join(stdout.split())
