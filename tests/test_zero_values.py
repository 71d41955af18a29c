"""Options whose 0 is a real value, each taken at 0 (issue 35, "checks that missed": a falsy but valid value
treated by truthiness passed every test). None means "unset, take the default"; 0 means 0:

    request seed 0        its own random stream (None: the engine's seed and the sequence's id)
    temperature 0         greedy (the HTTP default is 1.0, a bench workload's 0.6)
    top_k 0               off, as -1 (vLLM's convention)
    bench --warmup 0      no warm-up round (None: the workload's rounds)
    --profile-skip 0      profile from the first step (None: the default skip)
    fixed gate --max-abs 0 / --rel-l2 0 / --kv-max-abs 0   an exact gate (None: the dtype's default)
    a case's expected free: 0, cached: 0, outputs: 0      checked, not skipped

and options whose 0 is not valid (--num-kvcache-blocks, --max-num-batched-tokens, --max-num-seqs,
--kvcache-block-size, max_tokens) refuse it, naming it, instead of taking it as unset."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from engine import LLM, SamplingParams
from labkit.bench.profile import DEFAULT_SKIP, check_request
from labkit.bench.workloads import parse_workload
from labkit.logits.compare import thresholds_for
from labkit.serve.protocol import CompletionRequest, sampling_dict, sampling_params
from labkit.trace.cases import load_case, parse_case
from labkit.trace.validate import validate

from .helpers import run_cli

PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def llm(tiny_model):
    engine = LLM(tiny_model, device="cpu", enforce_eager=True, max_model_len=256, max_num_batched_tokens=256)
    yield engine
    engine.exit()


def _tokens(llm, *params: SamplingParams) -> list[list[int]]:
    return [o["token_ids"] for o in llm.generate([PROMPT] * len(params), list(params), use_tqdm=False)]


def _sampled(seed=None, **kw) -> SamplingParams:
    return SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, seed=seed, **kw)


# --- seed 0 -----------------------------------------------------------------------------------------------------
def test_seed_0_is_a_seed_of_its_own_not_the_engines_stream(llm):
    """Two requests of one batch with seed 0 draw the same tokens (one stream, whatever their sequence); two
    with no seed draw from the engine's stream per sequence, so they differ."""
    a, b = _tokens(llm, _sampled(0), _sampled(0))
    assert a == b
    c, d = _tokens(llm, _sampled(None), _sampled(None))
    assert c != d
    assert a == _tokens(llm, _sampled(0))[0]  # and it is the same stream in another batch


def test_seed_0_crosses_the_http_boundary_as_0():
    limits = SimpleNamespace(max_model_len=256, vocab_size=2048, block_size=256, num_blocks=64,
                             check=lambda *a, **k: None)
    sp = sampling_params(CompletionRequest(prompt="hi", seed=0), [100, 101], limits, 16)
    assert sp.seed == 0 and sampling_dict(sp)["seed"] == 0 and SamplingParams(**sampling_dict(sp)).seed == 0
    sp = sampling_params(CompletionRequest(prompt="hi", temperature=0.0, top_k=0), [100], limits, 16)
    assert (sp.temperature, sp.top_k) == (0.0, 0)


def test_a_cases_seed_0_reaches_the_engine(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nrequests:\n  - {id: A, prompt: {range: [100, 110]}, max_tokens: 2, seed: 0, "
                    "temperature: 0.7, top_k: 0}\n  - {id: B, prompt: {random: 10, seed: 0}, max_tokens: 2}\n")
    case = load_case(path)
    kw = case.request("A").sampling_kwargs()
    assert kw["seed"] == 0 and kw["top_k"] == 0 and kw["temperature"] == 0.7
    assert case.request("B").prompt["seed"] == 0 and case.request("B").sampling_kwargs()["seed"] is None


# --- temperature 0 and top_k 0 ----------------------------------------------------------------------------------
def test_temperature_0_is_greedy(llm):
    greedy = _tokens(llm, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, seed=3),
                     SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    assert greedy[0] == greedy[1]
    sampled = _tokens(llm, *[_sampled(s) for s in range(4)])
    assert any(t != greedy[0] for t in sampled)  # temperature 1 with other seeds does not give the greedy text


def test_top_k_0_is_off_as_minus_1(llm):
    off = _tokens(llm, _sampled(11, top_k=-1), _sampled(11, top_k=0))
    assert off[0] == off[1]
    assert _tokens(llm, _sampled(11, top_k=1))[0] == _tokens(llm, SamplingParams(temperature=0.0, max_tokens=8,
                                                                                  ignore_eos=True))[0]


def test_a_workloads_temperature_0_is_0():
    w = parse_workload({"requests": 2, "prompt_len": 4, "output_len": 2, "temperature": 0}, "w.yaml")
    assert w.temperature == 0.0 and w.params()["temperature"] == 0.0
    assert parse_workload({"requests": 2, "prompt_len": 4, "output_len": 2}, "w.yaml").temperature == 0.6


# --- bench --warmup 0, --profile-skip 0 -------------------------------------------------------------------------
def test_bench_warmup_0_runs_no_warm_up_round(tiny_model, tmp_path, capsys):
    out = tmp_path / "b.json"
    code, _, err = run_cli(["bench", "--workload", "fixed", "--num-requests", "2", "--warmup", "0", "--repeats", "1",
                            "--model", tiny_model, "--device", "cpu", "--out", str(out)], capsys)
    assert code == 0, err
    result = json.loads(out.read_text())
    assert result["workload"]["warmup"] == 0 and result["warmup_rounds"] == []
    # Left out, the workload's own rounds (fixed.yaml: 2).
    assert parse_workload({"requests": 2, "prompt_len": 4, "output_len": 2, "warmup": 2}, "w").warmup.rounds == 2


def test_profile_skip_0_profiles_from_the_first_step():
    assert check_request(3, 0, True).skip == 0
    assert check_request(3, None, True).skip == DEFAULT_SKIP != 0


# --- an exact fixed gate ----------------------------------------------------------------------------------------
def test_fixed_thresholds_of_0_are_exact_gates_not_the_defaults():
    side = SimpleNamespace(meta={"dtype": "bfloat16"})
    th = thresholds_for(side, side, 0.0, 0.0, 0.0)
    assert (th["max_abs"], th["rel_l2"], th["kv_max_abs"]) == (0.0, 0.0, 0.0)
    assert th["given"] == {"max_abs": True, "rel_l2": True, "kv_max_abs": True}
    default = thresholds_for(side, side, None, None, None)
    assert default["max_abs"] > 0 and default["given"] == {"max_abs": False, "rel_l2": False, "kv_max_abs": False}


# --- a case's expected 0 ----------------------------------------------------------------------------------------
CASE = {"name": "z", "engine": {"max_num_batched_tokens": 64, "max_num_seqs": 4, "max_model_len": 128,
                                "kvcache_block_size": 16, "num_kvcache_blocks": 8, "enforce_eager": True},
        "requests": [{"id": "A", "prompt": {"range": [100, 140]}, "max_tokens": 2}]}


def _events(llm_dir, tmp_path):
    from labkit.trace.run import run_case

    return run_case(parse_case(CASE), llm_dir, tmp_path / "events.jsonl", device="cpu").events


@pytest.mark.parametrize("entry, field, holds", [
    ({"step": 1, "free": 0}, "free", False),                                   # 5 blocks are free after step 1
    ({"step": 1, "after": {"A": {"outputs": 0}}}, "outputs", False),           # it sampled its first token
    ({"step": 1, "scheduled": {"A": {"cached": 0, "scheduled": 40}}}, "scheduled.cached", True),
    ({"step": 1, "before": {"free": 0}}, "before.free", False),
])
def test_an_expected_0_is_checked_not_skipped(tiny_model, tmp_path, entry, field, holds):
    case = parse_case({**CASE, "expect": [entry]})
    report = validate(_events(tiny_model, tmp_path), case)
    checks = [c for c in report.checks if c.kind == "expect" and c.field == field]
    assert checks and all(c.ok == holds for c in checks), [(c.field, c.ok, c.message) for c in checks]


# --- where 0 is not a value: refused, never taken as unset ------------------------------------------------------
@pytest.mark.parametrize("flag", ["--num-kvcache-blocks", "--max-num-batched-tokens", "--max-num-seqs",
                                  "--kvcache-block-size"])
def test_an_engine_option_whose_0_is_not_a_value_refuses_it(flag, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the usage error's box on one line
    code, _, err = run_cli(["trace", "--case", "chunk", flag, "0", "-q"], capsys)
    assert code == 2 and f"Invalid value for '{flag}'" in err and "greater than or equal to 1" in err, err


def test_max_tokens_0_is_refused_naming_it():
    with pytest.raises(ValueError, match="^max_tokens: "):
        SamplingParams(max_tokens=0)
