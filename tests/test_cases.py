"""Case files: the shipped cases load, prompts build deterministically, bad files fail clearly."""
from __future__ import annotations

import textwrap

import pytest
import yaml

from labkit.errors import LabkitError
from labkit.trace.cases import (
    ENGINE_KEYS,
    Case,
    build_prompt_ids,
    expand_positions,
    format_positions,
    list_cases,
    load_case,
)

SHIPPED = ["A", "B", "B-seqs1", "C", "chunk", "D", "lifecycle", "prefix", "preempt", "refs",
           "balanced"]


def test_shipped_cases_present():
    assert set(SHIPPED) <= set(list_cases())


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_case_loads(name):
    case = load_case(name)
    assert isinstance(case, Case)
    assert case.name == name
    assert case.about
    assert set(case.engine) <= set(ENGINE_KEYS)
    assert case.requests
    if name == "balanced":
        assert case.expect is None          # recorded, not judged
        return
    assert case.engine.get("num_kvcache_blocks", 0) > 0   # so `free` is checkable
    steps = [e["step"] for e in case.expect if "step" in e]
    assert steps == list(range(1, len(steps) + 1))
    finals = [e for e in case.expect if "final" in e]
    assert len(finals) == 1
    assert set(finals[0]["final"]) == set(case.request_ids)
    for e in case.expect:
        if "step" in e:
            # every row of EXPECTED.md is encoded in full
            for key in ("phase", "scheduled", "inputs", "preempted", "after", "free"):
                assert key in e, f"{name} step {e['step']} lacks {key}"


# Cases added so that a fault or a mutation of the engine has a check that sees it (docs/evidence.md):
# each pins the states that tell the right behaviour from the wrong one, not every field of every step.
CAUGHT_BY = {"prefix-reuse": "a stale prefix hit", "preempt-order": "preemption from the head",
             "decode-order": "served sequences sent to the tail", "preempt-queue": "preempted to the back",
             "budget-exact": "an exactly fitting prompt refused"}


@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_cases_for_faults_load_and_are_judged(name):
    case = load_case(name)
    assert case.name == name and case.about and case.judged
    assert case.engine.get("num_kvcache_blocks", 0) > 0
    steps = [e["step"] for e in case.expect if "step" in e]
    assert steps == list(range(1, len(steps) + 1))
    finals = [e for e in case.expect if "final" in e]
    assert len(finals) == 1 and set(finals[0]["final"]) == set(case.request_ids)
    assert all("scheduled" in e and "phase" in e for e in case.expect if "step" in e)


def test_case_by_path_and_lab_root(tmp_path, monkeypatch):
    src = load_case("A").path
    p = tmp_path / "mine.yaml"
    p.write_text(src.read_text())
    assert load_case(str(p)).request_ids == ["R1"]
    (tmp_path / "workloads" / "cases").mkdir(parents=True)
    (tmp_path / "workloads" / "cases" / "only.yaml").write_text(
        "requests: [{id: X, prompt: {tokens: [100, 101]}, max_tokens: 1}]\n")
    monkeypatch.setenv("LAB_ROOT", str(tmp_path))
    assert list_cases() == ["only"]
    c = load_case("only")
    assert c.name == "only" and c.requests[0].max_tokens == 1
    with pytest.raises(LabkitError, match="unknown case 'nope'.*only"):
        load_case("nope")


def test_missing_case_file():
    with pytest.raises(LabkitError, match="not found"):
        load_case("/nonexistent/dir/x.yaml")


def test_shipped_case_values():
    chunk = load_case("chunk")
    assert chunk.engine["max_num_batched_tokens"] == 512
    step2 = chunk.expect[1]
    assert step2["inputs"]["positions"] == list(range(512, 700)) + list(range(32))
    assert step2["scheduled"]["A"] == {"total": 700, "cached": 512, "scheduled": 188, "blocks": 3}
    prefix = load_case("prefix")
    assert prefix.request("B").after == "A"
    refs = load_case("refs")
    assert refs.request("Q1").after == "P" and refs.request("Q2").after == "P"
    pre = load_case("preempt")
    assert pre.engine["kvcache_block_size"] == 4 and pre.engine["num_kvcache_blocks"] == 4
    assert pre.expect[1]["preempted"] == ["C"]


# ----------------------------------------------------------------------------- prompts

def _case(tmp_path, text: str, name: str = "t.yaml") -> Case:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return load_case(str(p))


def test_prompt_building_deterministic_and_in_range(tmp_path):
    case = _case(tmp_path, """
        requests:
          - {id: A, prompt: {random: 300, seed: 5}, max_tokens: 1}
          - {id: B, prompt: {random: 300, seed: 6}, max_tokens: 1}
          - {id: C, prompt: {range: [200, 230]}, max_tokens: 1}
          - {id: D, prompt: {tokens: [105, 104, 103]}, max_tokens: 1}
    """)
    a = build_prompt_ids(case, 151936)
    b = build_prompt_ids(case, 151936)
    assert a == b
    assert [len(a[k]) for k in "ABCD"] == [300, 300, 30, 3]
    assert all(100 <= t < 10000 for t in a["A"] + a["B"])
    assert a["A"] != a["B"]
    assert a["C"] == list(range(200, 230))
    assert a["D"] == [105, 104, 103]
    assert all(isinstance(t, int) for t in a["A"])
    small = build_prompt_ids(case, 500)
    assert all(100 <= t < 500 for t in small["A"])
    assert len(small["A"]) == 300


def test_share_prefix(tmp_path):
    case = load_case("prefix")
    ids = build_prompt_ids(case, 151936)
    assert ids["A"] == list(range(100, 720))
    assert len(ids["B"]) == 620
    assert ids["B"][:512] == ids["A"][:512]
    assert ids["B"][512:] != ids["A"][512:]
    refs = build_prompt_ids(load_case("refs"), 151936)
    assert refs["Q1"][:512] == refs["Q2"][:512] == refs["P"][:512]
    assert refs["Q1"][512:] != refs["Q2"][512:]
    case = _case(tmp_path, """
        requests:
          - {id: A, prompt: {range: [100, 400]}, max_tokens: 1}
          - {id: B, prompt: {range: [1000, 1100], share_prefix: {with: A, tokens: 40}}, max_tokens: 1}
    """)
    ids = build_prompt_ids(case, 2000)
    assert ids["B"] == list(range(100, 140)) + list(range(1040, 1100))


def test_prompt_errors(tmp_path):
    case = _case(tmp_path, """
        requests:
          - {id: A, prompt: {tokens: [100, 5000]}, max_tokens: 1}
    """)
    with pytest.raises(LabkitError, match="5000.*vocabulary"):
        build_prompt_ids(case, 1000)
    case = _case(tmp_path, """
        requests:
          - {id: A, prompt: {random: 10}, max_tokens: 1}
    """, "r.yaml")
    with pytest.raises(LabkitError, match="vocabulary"):
        build_prompt_ids(case, 50)
    case = _case(tmp_path, """
        requests:
          - {id: A, prompt: {text: "hello there"}, max_tokens: 1}
    """, "text.yaml")
    with pytest.raises(LabkitError, match="tokenizer"):
        build_prompt_ids(case, 1000)
    ids = build_prompt_ids(case, 1000, tokenize=lambda s: [100 + len(w) for w in s.split()])
    assert ids == {"A": [105, 105]}


def test_positions_notation():
    assert expand_positions("0..2") == [0, 1, 2]
    assert expand_positions("512..699 + 0..31") == list(range(512, 700)) + list(range(32))
    assert expand_positions("3 + 5..6") == [3, 5, 6]
    assert expand_positions([4, 4]) == [4, 4]
    with pytest.raises(ValueError):
        expand_positions("0..x")
    with pytest.raises(ValueError):
        expand_positions("5..2")
    assert format_positions(list(range(512, 700)) + list(range(32)), [188, 32]) == "512..699 + 0..31"
    assert format_positions([0, 1, 2, 3] * 3, [4, 4, 4]) == "0..3 + 0..3 + 0..3"


# ----------------------------------------------------------------------------- malformed cases

GOOD_REQ = "  - {id: A, prompt: {tokens: [100, 101, 102]}, max_tokens: 2}\n"

BAD = {
    "unknown_top": ("expects: []\nrequests:\n" + GOOD_REQ, "'expects'"),
    "unknown_request_key": ("requests:\n  - {id: A, prompt: {tokens: [100]}, max_token: 2}\n",
                            "'max_token'"),
    "duplicate_id": ("requests:\n" + GOOD_REQ + GOOD_REQ, "duplicate request id 'A'"),
    "after_unknown": ("requests:\n" + GOOD_REQ
                      + "  - {id: B, prompt: {tokens: [100]}, after: Z}\n", "after: 'Z'"),
    "after_later": ("requests:\n  - {id: B, prompt: {tokens: [100]}, after: A}\n" + GOOD_REQ,
                    "(B).after"),
    "after_self": ("requests:\n  - {id: B, prompt: {tokens: [100]}, after: B}\n", "after"),
    "two_prompt_kinds": ("requests:\n  - {id: A, prompt: {tokens: [100], range: [1, 5]}}\n",
                         "exactly one of"),
    "no_prompt_kind": ("requests:\n  - {id: A, prompt: {seed: 3}}\n", "exactly one of"),
    "missing_prompt": ("requests:\n  - {id: A, max_tokens: 3}\n", "'prompt'"),
    "prompt_extra_key": ("requests:\n  - {id: A, prompt: {range: [100, 110], seed: 1}}\n",
                         "'seed'"),
    "share_unknown": ("requests:\n" + GOOD_REQ
                      + "  - {id: B, prompt: {random: 10, share_prefix: {with: Q, tokens: 2}}}\n",
                      "share_prefix.with"),
    "share_too_many": ("requests:\n" + GOOD_REQ
                       + "  - {id: B, prompt: {random: 10, share_prefix: {with: A, tokens: 5}}}\n",
                       "share_prefix.tokens"),
    "share_on_tokens": ("requests:\n" + GOOD_REQ
                        + "  - {id: B, prompt: {tokens: [1, 2], share_prefix: {with: A, tokens: 1}}}\n",
                        "share_prefix"),
    "negative_max_tokens": ("requests:\n  - {id: A, prompt: {tokens: [100]}, max_tokens: -1}\n",
                            "requests[0] (A).max_tokens: must be an integer >= 1, got -1"),
    "negative_random": ("requests:\n  - {id: A, prompt: {random: -5}}\n", "prompt.random"),
    "negative_range": ("requests:\n  - {id: A, prompt: {range: [-3, 5]}}\n", "prompt.range"),
    "negative_token": ("requests:\n  - {id: A, prompt: {tokens: [100, -1]}}\n", "tokens[1]"),
    "negative_temperature": ("requests:\n  - {id: A, prompt: {tokens: [1]}, temperature: -1}\n",
                             "temperature"),
    "engine_unknown": ("engine: {block_size: 16}\nrequests:\n" + GOOD_REQ, "'block_size'"),
    "engine_negative": ("engine: {max_num_seqs: -2}\nrequests:\n" + GOOD_REQ,
                        "engine.max_num_seqs"),
    "engine_type": ("engine: {enforce_eager: 3}\nrequests:\n" + GOOD_REQ, "engine.enforce_eager"),
    # values judged by the engine's own Config / SamplingParams checks, reported against the case's key
    "engine_choice": ("engine: {scheduling_policy: fifo}\nrequests:\n" + GOOD_REQ,
                      "engine.scheduling_policy: must be one of prefill_first, balanced, mixed, got 'fifo'"),
    "engine_device": ("engine: {device: gpu}\nrequests:\n" + GOOD_REQ, "engine.device: must be one of"),
    "engine_range": ("engine: {gpu_memory_utilization: 1.5}\nrequests:\n" + GOOD_REQ,
                     "engine.gpu_memory_utilization: must be in (0, 1], got 1.5"),
    "engine_not_a_number": ("engine: {gpu_memory_utilization: lots}\nrequests:\n" + GOOD_REQ,
                            "engine.gpu_memory_utilization: must be a number, got 'lots'"),
    "engine_run_field": ("engine: {model: /m}\nrequests:\n" + GOOD_REQ, "engine: unknown key 'model'"),
    "top_k_below_off": ("requests:\n  - {id: A, prompt: {tokens: [1]}, top_k: -2}\n",
                        "requests[0] (A).top_k: must be an integer >= 1, or -1/0 for off, got -2"),
    "top_p_zero": ("requests:\n  - {id: A, prompt: {tokens: [1]}, top_p: 0}\n", "(A).top_p: must be in (0, 1]"),
    "temperature_nan": ("requests:\n  - {id: A, prompt: {tokens: [1]}, temperature: .nan}\n",
                        "(A).temperature: must be a finite number"),
    "ignore_eos_type": ("requests:\n  - {id: A, prompt: {tokens: [1]}, ignore_eos: 1}\n",
                        "(A).ignore_eos: must be true or false, got 1"),
    "prompt_too_long": ("engine: {max_model_len: 2}\nrequests:\n" + GOOD_REQ, "max_model_len"),
    "no_requests": ("name: x\n", "'requests'"),
    "not_mapping": ("- 1\n- 2\n", "mapping"),
    "invalid_yaml": ("requests: [\n", "not valid YAML"),
    "expect_unknown_id": ("requests:\n" + GOOD_REQ + "expect:\n  - step: 1\n    scheduled: {Z: 3}\n",
                          "'Z'"),
    "expect_unknown_after_id": ("requests:\n" + GOOD_REQ
                                + "expect:\n  - step: 1\n    after: {Z: {total: 4}}\n", "'Z'"),
    "expect_unknown_field": ("requests:\n" + GOOD_REQ
                             + "expect:\n  - step: 1\n    after: {A: {cahced: 3}}\n", "'cahced'"),
    "expect_unknown_step_key": ("requests:\n" + GOOD_REQ + "expect:\n  - {step: 1, sheduled: {A: 3}}\n",
                                "'sheduled'"),
    "expect_unknown_input": ("requests:\n" + GOOD_REQ
                             + "expect:\n  - {step: 1, inputs: {cu_q: [0, 3]}}\n", "'cu_q'"),
    "expect_bad_status": ("requests:\n" + GOOD_REQ
                          + "expect:\n  - {step: 1, after: {A: {status: DONE}}}\n", "status"),
    "expect_bad_positions": ("requests:\n" + GOOD_REQ
                             + "expect:\n  - {step: 1, inputs: {positions: '0..z'}}\n", "positions"),
    "expect_no_step": ("requests:\n" + GOOD_REQ + "expect:\n  - {phase: prefill}\n", "'step'"),
    "expect_step_zero": ("requests:\n" + GOOD_REQ + "expect:\n  - {step: 0}\n", "step"),
    "expect_dup_step": ("requests:\n" + GOOD_REQ + "expect:\n  - {step: 1}\n  - {step: 1}\n",
                        "duplicate entry for step 1"),
    "expect_final_unknown": ("requests:\n" + GOOD_REQ + "expect:\n  - final: {Z: {outputs: 2}}\n",
                             "'Z'"),
    "expect_final_field": ("requests:\n" + GOOD_REQ + "expect:\n  - final: {A: {cached: 2}}\n",
                           "'cached'"),
    "expect_negative_free": ("requests:\n" + GOOD_REQ + "expect:\n  - {step: 1, free: -1}\n",
                             "free"),
}


def test_a_case_may_set_any_engine_setting_and_sampling_field(tmp_path):
    """SPEC 5: `engine` takes any Config field the run does not give itself; a request any SamplingParams field."""
    import dataclasses

    from engine.config import Config
    from engine.sampling_params import SamplingParams

    given_by_the_run = {"model", "tracer", "hf_config", "eos", "dist_init_addr", "shm_name", "shm_size",
                        "dist_timeout_s"}
    settings = {f.name: f.default for f in dataclasses.fields(Config) if f.name not in given_by_the_run}
    sampling = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    p = tmp_path / "all.yaml"
    p.write_text(yaml.safe_dump({"engine": settings, "requests": [{"id": "A", "prompt": {"tokens": [100]},
                                                                    **sampling}]}))
    case = load_case(str(p))
    assert case.engine == settings and set(case.engine) == set(ENGINE_KEYS)
    assert case.requests[0].sampling_kwargs() == sampling


@pytest.mark.parametrize("label", sorted(BAD))
def test_malformed_case_raises_naming_the_key(tmp_path, label):
    text, needle = BAD[label]
    p = tmp_path / f"bad_{label}.yaml"
    p.write_text(text)
    with pytest.raises(LabkitError) as ei:
        load_case(str(p))
    msg = str(ei.value)
    assert ei.value.code == 2
    assert f"bad_{label}.yaml" in msg, msg
    assert needle in msg, msg
