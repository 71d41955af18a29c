"""Every invariant of labkit/trace/validate.py, silent on real logs of shipped cases and fired by one edit of
that log that breaks it (and only what the edit says). A new invariant without an edit here fails
test_every_invariant_has_an_edit_that_fires_it.

(tests/test_trace.py::test_every_case_passes_through_the_engine runs every shipped case; here each invariant must
also have been *checked* on the log its edit starts from, so that its silence there means something.)
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from labkit.trace.cases import load_case
from labkit.trace.run import run_case
from labkit.trace.validate import INVARIANTS, validate


@pytest.fixture(scope="module")
def logs(tiny_model, tmp_path_factory) -> dict:
    out = {}
    for name in ("chunk", "preempt-order", "prefix-reuse", "mixed-preempt"):
        run = run_case(load_case(name), Path(tiny_model), tmp_path_factory.mktemp(name) / "events.jsonl", device="cpu")
        out[name] = run.events
    # A live window (labkit trace --url) of steps 2-5, as a server with --live-trace would have sent it.
    from labkit.serve.live_trace import cut_window

    out["mixed-preempt@window"] = cut_window(out["mixed-preempt"], 1, 5)
    return out


def _closing(events):
    return next(e for e in events if e.get("event") == "live_state" and e["kind"] == "close")


def at(events, step, name):
    return next(e for e in events if e.get("event") == name and e.get("step") == step)


def row(event, rid):
    return next(s for s in event["seqs"] if s["request_id"] == rid)


def added(events, rid):
    return next(e for e in events if e.get("event") == "request_added" and e["request_id"] == rid)


def _insert_after(events, anchor, new):
    events.insert(events.index(anchor) + 1, new)


def _first_prefix_hit(events):
    """The first prefill that starts from cached blocks: (scheduled event, its entry)."""
    held = set()
    for e in events:
        if e.get("event") == "scheduled":
            for s in e["seqs"]:
                if e["phase"] == "prefill" and s["num_cached_tokens"] > 0 and s["seq_id"] not in held:
                    return e, s
            held |= {s["seq_id"] for s in e["seqs"]}
        if e.get("event") == "after_postprocess":
            held -= {s["seq_id"] for s in e["seqs"] if not s["block_table"]}
    raise AssertionError("no prefix hit in this log")


def _bump(d, key, by=1):
    d[key] += by


def _pop_event(events, step, name):
    events.remove(at(events, step, name))


def _pool_blocks(ev) -> int:
    """The pool's block count as the log states it (run_start, else the config): one past the last valid id."""
    n = ev[0].get("num_kvcache_blocks") or ev[0]["config"]["num_kvcache_blocks"]
    assert isinstance(n, int) and n > 0
    return n


def _slots(ev):
    ev["slot_mapping"][0] += 1


# invariant -> (the case whose log it edits, the edit, in place). chunk: A (700 ids, blocks of 256) is prefilled
# 512 + 188, B (32) joins A's second chunk, both decode twice; preempt-order: step 2 preempts D and C;
# prefix-reuse: Q's first block is a prefix-cache hit.
EDITS = {
    "window.end": ("mixed-preempt@window", lambda ev: _closing(ev)["seqs"].pop()),
    "log.single_run": ("chunk", lambda ev: ev[3].update(run="another-run")),
    "log.run_start": ("chunk", lambda ev: ev.insert(1, copy.deepcopy(ev[0]))),
    "time.monotonic": ("chunk", lambda ev: at(ev, 2, "scheduled").update(t_ns=0)),
    "steps.contiguous": ("chunk", lambda ev: [e.update(step=5) for e in ev if e.get("step") == 4]),
    "step.events": ("chunk", lambda ev: _pop_event(ev, 2, "sampled")),
    "seq.known": ("preempt-order", lambda ev: at(ev, 2, "preempted").update(seq_id=99)),
    "phase": ("chunk", lambda ev: at(ev, 1, "scheduled").update(phase="warm-up")),
    "phase.mixed": ("chunk", lambda ev: [at(ev, 3, "scheduled").update(phase="prefill")]
                    + [s.update(kind="prefill") for s in at(ev, 3, "scheduled")["seqs"]]),
    "async.discarded": ("chunk", lambda ev: row(at(ev, 3, "after_postprocess"), "A").update(
        accepted=False, token_id=None, discarded=True)),
    "queues": ("chunk", lambda ev: at(ev, 3, "before_schedule")["waiting"].append(99)),
    "free.continuity": ("chunk", lambda ev: _bump(at(ev, 2, "before_schedule"), "free_blocks")),
    "preempted": ("preempt-order", lambda ev: _insert_after(ev, at(ev, 2, "preempted"), {
        **at(ev, 2, "preempted"), "seq_id": row(at(ev, 2, "scheduled"), "A")["seq_id"], "request_id": "A"})),
    "state.continuity": ("chunk", lambda ev: _bump(row(at(ev, 3, "scheduled"), "B"), "num_cached_tokens", -1)),
    "block_table.size": ("chunk", lambda ev: row(at(ev, 1, "scheduled"), "A")["block_table"].pop()),
    "block_table.ids": ("chunk", lambda ev: row(at(ev, 1, "scheduled"), "A")["block_table"].__setitem__(
        2, row(at(ev, 1, "scheduled"), "A")["block_table"][1])),
    "decode.shape": ("chunk", lambda ev: _bump(row(at(ev, 3, "scheduled"), "A"), "num_scheduled_tokens")),
    "chunk.fits": ("chunk", lambda ev: row(at(ev, 1, "scheduled"), "A").update(num_scheduled_tokens=0)),
    "policy.chunk_first_only": ("chunk", lambda ev: row(at(ev, 2, "scheduled"), "B").update(num_scheduled_tokens=16)),
    "budget": ("chunk", lambda ev: ev[0]["config"].update(max_num_seqs=1)),
    "inputs.num_input_ids": ("chunk", lambda ev: _bump(at(ev, 2, "gpu_inputs"), "num_input_ids")),
    "inputs.positions": ("chunk", lambda ev: _bump(at(ev, 3, "gpu_inputs")["positions"], 0)),
    "slots": ("chunk", lambda ev: _slots(at(ev, 2, "gpu_inputs"))),
    "inputs.cu_seqlens_q": ("chunk", lambda ev: _bump(at(ev, 2, "gpu_inputs")["cu_seqlens_q"], 1)),
    "inputs.cu_seqlens_k": ("chunk", lambda ev: _bump(at(ev, 2, "gpu_inputs")["cu_seqlens_k"], 1)),
    "inputs.max_seqlen": ("chunk", lambda ev: _bump(at(ev, 1, "gpu_inputs"), "max_seqlen_q")),
    "inputs.context_lens": ("chunk", lambda ev: _bump(at(ev, 3, "gpu_inputs")["context_lens"], 0)),
    "inputs.block_tables": ("chunk", lambda ev: at(ev, 3, "gpu_inputs")["block_tables"][1].__setitem__(0, 63)),
    "inputs.execution": ("chunk", lambda ev: at(ev, 1, "gpu_inputs").update(execution="graph", graph_batch=1)),
    "sampled": ("chunk", lambda ev: at(ev, 1, "sampled")["tokens"].append(
        {"seq_id": added(ev, "B")["seq_id"], "token_id": 7})),
    "after.complete": ("chunk", lambda ev: at(ev, 2, "after_postprocess")["seqs"].remove(
        row(at(ev, 2, "after_postprocess"), "B"))),
    "accepted.rule": ("chunk", lambda ev: row(at(ev, 1, "after_postprocess"), "A").update(accepted=True)),
    "accepted.counts": ("chunk", lambda ev: _bump(row(at(ev, 2, "after_postprocess"), "B"), "num_completion_tokens")),
    "discarded": ("chunk", lambda ev: _bump(row(at(ev, 1, "after_postprocess"), "A"), "num_completion_tokens")),
    "after.cached": ("chunk", lambda ev: _bump(row(at(ev, 2, "after_postprocess"), "A"), "num_cached_tokens", -1)),
    "finished.released": ("chunk", lambda ev: row(at(ev, 4, "after_postprocess"), "A").update(
        block_table=row(at(ev, 3, "after_postprocess"), "A")["block_table"])),
    "max_tokens": ("chunk", lambda ev: added(ev, "A").update(max_tokens=2)),
    "refs": ("chunk", lambda ev: _bump(row(at(ev, 2, "after_postprocess"), "B")["ref_counts"], 0)),
    "prefix.content": ("prefix-reuse", lambda ev: _bump(added(ev, "Q")["prompt_token_ids"], 0)),
    "blocks.accounting": ("chunk", lambda ev: _bump(at(ev, 3, "after_postprocess"), "free_blocks", -1)),
    "engine.raised": ("chunk", lambda ev: ev.insert(-1, {**ev[-1], "event": "engine_error", "step": 4,
                                                         "error": "RuntimeError", "message": "planted"})),
    "run.end": ("chunk", lambda ev: ev.pop()),
    "requests.finished": ("chunk", lambda ev: row(at(ev, 4, "after_postprocess"), "B").update(status="RUNNING")),
    "requests.outputs": ("chunk", lambda ev: added(ev, "B").update(max_tokens=4)),
    "blocks.returned": ("chunk", lambda ev: _bump(at(ev, 4, "after_postprocess"), "free_blocks", -1)),
}


# Both sides of a two-sided rule: a second edit, breaking it the other way.
OTHER_SIDE = {
    # more blocks counted than the pool has (the edit above leaks one)
    "blocks.accounting": ("chunk", lambda ev: _bump(at(ev, 3, "after_postprocess"), "free_blocks", 1)),
    # one token over the token budget: chunk's first step schedules exactly its 512 (the edit above breaks the
    # seat count instead)
    "budget": ("chunk", lambda ev: ev[0]["config"].update(max_num_batched_tokens=511)),
    # max_tokens reached but not finished (the edit above goes past max_tokens)
    "max_tokens": ("chunk", lambda ev: row(at(ev, 4, "after_postprocess"), "A").update(status="RUNNING")),
    # one token scheduled, but not on top of all the others cached (the edit above schedules two)
    "decode.shape": ("chunk", lambda ev: _bump(row(at(ev, 3, "scheduled"), "A"), "num_cached_tokens", -1)),
    # an id one past the pool's last block (the edit above repeats an id)
    "block_table.ids": ("chunk", lambda ev: row(at(ev, 1, "scheduled"), "A")["block_table"].__setitem__(
        2, _pool_blocks(ev))),
    # the key length (the edit above moves the query length)
    "inputs.max_seqlen": ("chunk", lambda ev: _bump(at(ev, 1, "gpu_inputs"), "max_seqlen_k")),
}
CASES = [(name, *EDITS[name]) for name in sorted(EDITS)] + [(name, *OTHER_SIDE[name]) for name in sorted(OTHER_SIDE)]
IDS = sorted(EDITS) + [f"{name}-other-side" for name in sorted(OTHER_SIDE)]


def test_every_invariant_has_an_edit_that_fires_it():
    assert set(EDITS) == set(INVARIANTS)


def _judged(events, name):
    report = validate(events, None if "@" in name else load_case(name))   # a window is judged by its invariants
    fired = {c.name for c in report.failures if c.kind in ("invariant", "policy")}
    checked = {c.name for c in report.checks if c.kind in ("invariant", "policy") and c.ok and not c.skipped}
    return report, fired, checked


@pytest.mark.parametrize("invariant, case, edit", CASES, ids=IDS)
def test_an_edit_that_breaks_an_invariant_fires_it(logs, invariant, case, edit):
    report, fired, checked = _judged(logs[case], case)
    assert not fired and report.verdict == "PASS"  # silent on the real log ...
    assert invariant in checked                    # ... where it was checked
    events = copy.deepcopy(logs[case])
    edit(events)
    report, fired, _ = _judged(events, case)
    assert invariant in fired, (invariant, sorted(fired))
    assert report.verdict == "FAIL"


def test_a_prefix_hit_is_where_the_prefix_edit_expects_it(logs):
    """(The prefix.content edit changes Q's prompt: Q must be the request whose first prefill hits the cache.)"""
    event, entry = _first_prefix_hit(logs["prefix-reuse"])
    assert entry["request_id"] == "Q" and entry["num_cached_tokens"] == 4


AT_THE_LIMIT = """name: at-the-limit
about: A (10 ids, max_tokens 20, ignore_eos) reaches max_model_len 16 after 6 outputs
engine: {max_num_batched_tokens: 64, max_num_seqs: 4, max_model_len: 16, kvcache_block_size: 4,
         num_kvcache_blocks: 8, enforce_eager: true}
requests:
  - id: A
    prompt: {range: [100, 110]}
    max_tokens: 20
    ignore_eos: true
"""


def test_a_request_stopped_at_max_model_len_has_its_outputs_and_one_stopped_short_does_not(tiny_model, tmp_path):
    """requests.outputs at its edge: the engine stops a request at the context limit (finish_reason length), with
    fewer than max_tokens outputs; that is no failure. The same log read with a limit one token higher is one."""
    path = tmp_path / "at-the-limit.yaml"
    path.write_text(AT_THE_LIMIT)
    case = load_case(str(path))
    events = run_case(case, Path(tiny_model), tmp_path / "events.jsonl", device="cpu").events
    report = validate(events, case)
    assert report.verdict == "RECORDED" and not report.failures
    assert {c.name for c in report.checks if c.ok and not c.skipped} >= {"requests.outputs", "max_tokens"}
    final = [e for e in events if e.get("event") == "after_postprocess"][-1]["seqs"][0]
    assert (final["num_tokens"], final["num_completion_tokens"], final["status"]) == (16, 6, "FINISHED")
    short = copy.deepcopy(events)
    short[0]["config"]["max_model_len"] = 17
    assert "requests.outputs" in {c.name for c in validate(short, case).failures}


def test_a_step_without_its_scheduled_event_fails_step_events(logs):
    events = [e for e in copy.deepcopy(logs["chunk"]) if not (e.get("event") == "scheduled" and e.get("step") == 2)]
    report, fired, _ = _judged(events, "chunk")
    assert "step.events" in fired and any("0 scheduled events" in c.message for c in report.failures), sorted(fired)


def test_every_time_reversal_fails_past_the_ones_listed(logs, monkeypatch):
    """The log keeps the first MAX_KEPT reversals with their events and counts the rest: each one still fails."""
    from labkit.trace import events as trace_events

    monkeypatch.setattr(trace_events, "MAX_KEPT", 2)
    events = copy.deepcopy(logs["chunk"])
    timed = [e for e in events if isinstance(e.get("t_ns"), int)]
    for e in timed[2:12:2]:  # five events, each earlier than the one before it
        e["t_ns"] = 0
    report = validate(events, load_case("chunk"))
    assert sum(c.name == "time.monotonic" for c in report.failures) == 5
    assert sum("(more times)" in c.message for c in report.failures) == 3


def test_every_engine_error_fails_past_the_ones_listed(logs, monkeypatch):
    """As time reversals: the log keeps the first MAX_KEPT engine_error events and counts the rest; each fails
    engine.raised (a server's live window can hold thousands)."""
    from labkit.trace import events as trace_events

    monkeypatch.setattr(trace_events, "MAX_KEPT", 2)
    events = copy.deepcopy(logs["chunk"])
    for i in range(5):
        events.insert(-1, {**events[-1], "event": "engine_error", "step": 4, "error": "RuntimeError",
                           "message": f"boom {i}"})
    report = validate(events, load_case("chunk"))
    raised = [c for c in report.failures if c.name == "engine.raised"]
    assert len(raised) == 5 and sum("(more times)" in c.message for c in raised) == 3
    assert "boom 0" in raised[0].message
