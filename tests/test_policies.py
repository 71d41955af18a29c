"""A scheduling policy is one class in engine/policies.py: the engine, Config and the trace validator read the
registry and the class's attributes, never a policy's name. A toy policy (shortest prompt first, the walk-through
in docs/architecture.md) runs through the engine and the validator with nothing else changed."""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.policies import POLICIES, PrefillFirst, register

REPO = Path(__file__).resolve().parents[1]


class ShortestPromptFirst(PrefillFirst):
    """nano-vLLM's rules, but the shortest waiting prompt is prefilled first (docs/architecture.md)."""

    name = "shortest_prompt_first"

    def pick(self, s):
        s.order_waiting(key=lambda seq: seq.num_prompt_tokens)
        return super().pick(s)


@pytest.fixture
def toy_policy():
    register(ShortestPromptFirst)
    yield ShortestPromptFirst.name
    POLICIES.pop(ShortestPromptFirst.name)


def _case(tmp_path: Path, policy: str) -> Path:
    # One sequence a step: the prefill order is the policy's choice. A (40 tokens) arrives first, B (8) second,
    # C (20) third; shortest-prompt-first prefills B, C, A. The decodes then serve the head of `running`.
    path = tmp_path / "shortest.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: shortest
        about: the shortest waiting prompt is prefilled first
        engine: {{scheduling_policy: {policy}, max_num_seqs: 1, max_num_batched_tokens: 64, max_model_len: 128,
                 kvcache_block_size: 16, num_kvcache_blocks: 16, enforce_eager: true}}
        requests:
          - {{id: A, prompt: {{random: 40, seed: 1}}, max_tokens: 2}}
          - {{id: B, prompt: {{random: 8, seed: 2}}, max_tokens: 2}}
          - {{id: C, prompt: {{random: 20, seed: 3}}, max_tokens: 2}}
        expect:
          - {{step: 1, phase: prefill, scheduled: {{B: 8}}}}
          - {{step: 2, phase: prefill, scheduled: {{C: 20}}}}
          - {{step: 3, phase: prefill, scheduled: {{A: 40}}}}
          - {{step: 4, phase: decode, scheduled: {{B: 1}}, after: {{B: {{outputs: 2, status: FINISHED}}}}}}
          - final: {{A: {{outputs: 2, status: FINISHED}}, B: {{outputs: 2, status: FINISHED}},
                     C: {{outputs: 2, status: FINISHED}}}}
        """))
    return path


def test_a_new_policy_is_one_class_and_runs_through_the_engine_and_the_validator(toy_policy, tiny_model, tmp_path):
    from labkit.trace.cases import load_case
    from labkit.trace.run import run_case
    from labkit.trace.validate import validate

    case = load_case(str(_case(tmp_path, toy_policy)))
    run = run_case(case, Path(tiny_model), tmp_path / "events.jsonl", device="cpu")
    report = validate(run.events, case)
    assert report.verdict == "PASS", [c.message for c in report.failures]
    # The same case under nano's policy prefills in arrival order: the expectations are the toy's.
    nano = load_case(str(_case(tmp_path, "prefill_first")))
    run = run_case(nano, Path(tiny_model), tmp_path / "nano.jsonl", device="cpu")
    assert validate(run.events, nano).verdict == "FAIL"


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_toy_policy_keeps_a_prompt_mid_chunk_first_and_every_request_finishes(toy_policy, tiny_model,
                                                                                   async_scheduling, monkeypatch):
    from tests.conftest import replay_graphs

    replay_graphs(monkeypatch, "every")
    llm = LLM(tiny_model, device="cpu", scheduling_policy=toy_policy, async_scheduling=async_scheduling,
              max_num_batched_tokens=16, kvcache_block_size=4, num_kvcache_blocks=24)
    lengths = [30, 3, 12, 5, 40, 2]
    for i, n in enumerate(lengths):
        llm.add_request(list(range(100 + i, 100 + i + n)), SamplingParams(max_tokens=3, ignore_eos=True))
    first_prefill: dict[int, int] = {}
    while not llm.is_finished():
        r = llm.step()
        for seq_id in r.seq_ids:
            first_prefill.setdefault(seq_id, r.step)
    assert sorted(first_prefill, key=first_prefill.get) == sorted(range(len(lengths)), key=lambda i: lengths[i])
    assert all(len(llm.get_sequence(i).completion_token_ids) == 3 for i in range(len(lengths)))
    llm.exit()


def test_an_unknown_policy_in_a_log_is_a_schema_failure_not_a_crash(tiny_model, tmp_path):
    from labkit.trace.cases import load_case
    from labkit.trace.run import run_case
    from labkit.trace.validate import validate

    case = load_case("chunk")
    events = run_case(case, Path(tiny_model), tmp_path / "events.jsonl", device="cpu").events
    assert validate(events, case).verdict == "PASS"
    for value in ("round_robin", ["mixed"]):
        bad = [dict(e, config={**e["config"], "scheduling_policy": value}) if e["event"] == "run_start" else e
               for e in events]
        report = validate(bad, case)
        assert report.verdict == "FAIL"
        assert any(c.kind == "schema" and "scheduling_policy" in c.message for c in report.failures)


# --------------------------------------------------------------- no policy's name outside engine/policies.py

def policy_name_comparisons(source: str, name: str = "<src>", policies=tuple(POLICIES)) -> list[str]:
    """Comparisons (==, !=, in, not in) with a policy's name. "mixed" is also a step's phase: a comparison with
    it counts when an operand mentions a policy (`self.policy == "mixed"`, `cfg["scheduling_policy"] != ...`)."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        names = set()
        for op in operands:
            for c in ast.walk(op):
                if isinstance(c, ast.Constant) and c.value in policies:
                    names.add(c.value)
        about_policy = any("polic" in ast.unparse(op).lower() for op in operands
                           if not isinstance(op, ast.Constant))
        if names - {"mixed"} or (names and about_policy):
            found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_policy_name_is_compared_outside_engine_policies():
    files = [p for d in ("engine", "labkit", "scripts") for p in sorted((REPO / d).rglob("*.py"))
             if p != REPO / "engine" / "policies.py"]
    found = [hit for p in files for hit in policy_name_comparisons(p.read_text(encoding="utf-8"),
                                                                    str(p.relative_to(REPO)))]
    assert not found, "a policy's name compared outside engine/policies.py:\n" + "\n".join(found)


def test_the_scan_sees_name_comparisons_but_not_the_mixed_phase():
    src = ('if config.scheduling_policy == "mixed": pass\n'
           'if plan.phase == "mixed": pass\n'
           'ok = name in ("prefill_first", "balanced")\n'
           'x = {"scheduling_policy": "mixed"}\n')
    assert policy_name_comparisons(src) == ['<src>:1: config.scheduling_policy == \'mixed\'',
                                            "<src>:3: name in ('prefill_first', 'balanced')"]


@pytest.mark.parametrize("attrs, fault", [
    ({"name": ""}, "no name"),
    ({"name": "p", "chunked_row": "middle"}, "a chunked row neither first nor last"),
    ({"name": "", "chunked_row": "middle"}, "both"),
])
def test_a_policy_without_a_name_or_a_chunked_row_is_refused_at_registration(attrs, fault):
    """A nameless policy would sit in the registry under "" (no Config could choose it, yet every validator loop
    over POLICIES would meet it); a chunked row outside first/last has no meaning for the batch plan."""
    cls = type("Faulty", (PrefillFirst,), attrs)
    before = dict(POLICIES)
    with pytest.raises(ValueError, match="needs a name and chunked_row"):
        register(cls)
    assert POLICIES == before, fault


def test_a_shorter_prompt_arriving_mid_chunk_waits_behind_the_chunk(toy_policy, tiny_model):
    """order_waiting sorts everything behind a prompt mid-chunk: it holds blocks, so a shorter prompt arriving
    while it chunks is prefilled after the chunk's rest, in the same step when the budget allows."""
    llm = LLM(tiny_model, device="cpu", scheduling_policy=toy_policy, max_num_batched_tokens=16,
              kvcache_block_size=4, num_kvcache_blocks=24, enforce_eager=True)
    llm.add_request(list(range(100, 130)), SamplingParams(max_tokens=2, ignore_eos=True))  # 30 tokens: 16 + 14
    first = llm.step()
    assert first.seq_ids == [0] and llm.get_sequence(0).block_table  # mid-chunk, holding blocks
    llm.add_request([7, 8], SamplingParams(max_tokens=2, ignore_eos=True))
    second = llm.step()
    assert second.seq_ids == [0, 1]  # the chunk's last 14 tokens first, then the 2-token prompt
    while not llm.is_finished():
        llm.step()
    assert all(len(llm.get_sequence(i).completion_token_ids) == 2 for i in (0, 1))
    llm.exit()
