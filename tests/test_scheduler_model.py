"""Model-based test of scheduling: the engine's traced states, step by step, against tests/scheduler_model.py.

The reference model is written from the scheduling rules and never imports `engine`. The property test draws
request mixes (prompts around block boundaries, equal blocks after different prefixes, small budgets and
pools, arrivals and aborts between steps, every policy), runs them on the real engine with the tiny fake model
and a ListTracer, feeds the engine's sampled tokens to the model, and compares every step: the queues before
scheduling, the phase, who is scheduled with how many tokens, who is preempted, every scheduled sequence's
counts, block table and status after postprocess, and the free block count. Async scheduling must change
none of it, so each mix runs with it on and off.

The model itself is first checked, with no engine, against the seeds' step tables (EXPECTED.md) and against
small examples of the `mixed` policy worked out by hand from its specification.

Default tier: a fixed, derandomized set of examples per policy (a failure there is reproducible by anyone).
`pytest -m slow tests/test_scheduler_model.py` tries many more, freshly drawn.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from .scheduler_model import NothingCanRun, SchedulerModel

DEFAULT_EXAMPLES = int(os.environ.get("LABKIT_MODEL_EXAMPLES", "100"))
SLOW_EXAMPLES = int(os.environ.get("LABKIT_MODEL_SLOW_EXAMPLES", "500"))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model's matrices are too small to share: a second intra-op thread made every engine step here
    about 5x slower on a busy 2-core machine (spinning OpenMP workers). Restored after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- the model alone, against hand-checked tables ---------------------------------------------------------

def _model_rows(policy, engine, requests, token=7):
    """Drive the model alone; one line per step in EXPECTED.md's notation:
    `phase | id total/cached/scheduled/blocks; ... | preempted | id total/cached/outputs STATUS blocks acc|disc; ...
    | free`.
    requests: (label, prompt, max_tokens, after); after is None (from the start), a step number (submitted after
    that step) or a label (submitted once that request has finished)."""
    m = SchedulerModel(policy, engine["max_num_batched_tokens"], engine["max_num_seqs"],
                       engine["kvcache_block_size"], engine["num_kvcache_blocks"], engine["max_model_len"])
    label: dict[int, str] = {}
    pending = list(requests)

    def submit_ready(step):
        for r in list(pending):
            after = r[3]
            if isinstance(after, str):
                ready = any(v == after and m.seqs[k].status == "FINISHED" for k, v in label.items())
            else:
                ready = after is None or after <= step
            if ready:
                label[len(label)] = r[0]
                m.add(len(label) - 1, r[1], r[2])
                pending.remove(r)

    lines, step = [], 0
    submit_ready(step)
    while not m.is_finished():
        plan = m.schedule()
        step += 1
        sched = "; ".join(f"{label[s.seq_id]} {s.num_tokens}/{s.cached}/{s.scheduled}/{len(s.table)}"
                          for s in plan.rows)
        acc = m.postprocess(plan, {s.seq_id: token for s in plan.rows})
        after = "; ".join(f"{label[s.seq_id]} {s.num_tokens}/{s.cached}/{s.completion} {s.status} {len(s.table)} "
                          f"{'acc' if a else 'disc'}" for s, a in zip(plan.rows, acc))
        pre = ", ".join(label[i] for i in plan.preempted) or "-"
        lines.append(f"{plan.phase} | {sched} | {pre} | {after} | {m.free_blocks}")
        submit_ready(step)
    assert not pending
    return lines


def _engine(budget, seqs, len_, bs, blocks):
    return {"max_num_batched_tokens": budget, "max_num_seqs": seqs, "max_model_len": len_,
            "kvcache_block_size": bs, "num_kvcache_blocks": blocks}


SEEDS = {
    # EXPECTED.md "seed-chunk": only the first sequence of a prefill batch is chunked; its candidate is dropped.
    "seed-chunk": ("prefill_first", _engine(512, 16, 1024, 256, 64),
                   [("A", list(range(100, 800)), 3, None), ("B", list(range(200, 232)), 3, None)], [
        "prefill | A 700/0/512/3 | - | A 700/512/0 WAITING 3 disc | 61",
        "prefill | A 700/512/188/3; B 32/0/32/1 | - | A 701/700/1 RUNNING 3 acc; B 33/32/1 RUNNING 1 acc | 60",
        "decode | A 701/700/1/3; B 33/32/1/1 | - | A 702/701/2 RUNNING 3 acc; B 34/33/2 RUNNING 1 acc | 60",
        "decode | A 702/701/1/3; B 34/33/1/1 | - | A 703/0/3 FINISHED 0 acc; B 35/0/3 FINISHED 0 acc | 64"]),
    # "D": the same under budget 256, three chunks.
    "D": ("prefill_first", _engine(256, 16, 1024, 256, 64),
          [("A", list(range(100, 800)), 3, None), ("B", list(range(200, 232)), 3, None)], [
        "prefill | A 700/0/256/3 | - | A 700/256/0 WAITING 3 disc | 61",
        "prefill | A 700/256/256/3 | - | A 700/512/0 WAITING 3 disc | 61",
        "prefill | A 700/512/188/3; B 32/0/32/1 | - | A 701/700/1 RUNNING 3 acc; B 33/32/1 RUNNING 1 acc | 60",
        "decode | A 701/700/1/3; B 33/32/1/1 | - | A 702/701/2 RUNNING 3 acc; B 34/33/2 RUNNING 1 acc | 60",
        "decode | A 702/701/1/3; B 34/33/1/1 | - | A 703/0/3 FINISHED 0 acc; B 35/0/3 FINISHED 0 acc | 64"]),
    # "seed-prefix": B (same 620 tokens, after A) hits A's two full blocks, not the last one.
    "seed-prefix": ("prefill_first", _engine(1024, 16, 1024, 256, 64),
                    [("A", list(range(100, 720)), 2, None), ("B", list(range(100, 720)), 2, "A")], [
        "prefill | A 620/0/620/3 | - | A 621/620/1 RUNNING 3 acc | 61",
        "decode | A 621/620/1/3 | - | A 622/0/2 FINISHED 0 acc | 64",
        "prefill | B 620/512/108/3 | - | B 621/620/1 RUNNING 3 acc | 61",
        "decode | B 621/620/1/3 | - | B 622/0/2 FINISHED 0 acc | 64"]),
    # "seed-preempt": the decode that needs two blocks with one free preempts the tail C.
    "seed-preempt": ("prefill_first", _engine(512, 16, 64, 4, 4),
                     [("A", [1, 2, 3, 4], 3, None), ("B", [5, 6, 7, 8], 3, None), ("C", [9, 10, 11, 12], 3, None)], [
        "prefill | A 4/0/4/1; B 4/0/4/1; C 4/0/4/1 | - | A 5/4/1 RUNNING 1 acc; B 5/4/1 RUNNING 1 acc; "
        "C 5/4/1 RUNNING 1 acc | 1",
        "decode | A 5/4/1/2; B 5/4/1/2 | C | A 6/5/2 RUNNING 2 acc; B 6/5/2 RUNNING 2 acc | 0",
        "decode | A 6/5/1/2; B 6/5/1/2 | - | A 7/0/3 FINISHED 0 acc; B 7/0/3 FINISHED 0 acc | 4",
        "prefill | C 5/0/5/2 | - | C 6/5/2 RUNNING 2 acc | 2",
        "decode | C 6/5/1/2 | - | C 7/0/3 FINISHED 0 acc | 4"]),
    # "B with max_num_seqs 1": one seat, prefills first.
    "B-seqs1": ("prefill_first", _engine(512, 1, 1024, 256, 64),
                [("R1", [1, 2, 3], 2, None), ("R2", [4, 5, 6, 7], 5, None)], [
        "prefill | R1 3/0/3/1 | - | R1 4/3/1 RUNNING 1 acc | 63",
        "prefill | R2 4/0/4/1 | - | R2 5/4/1 RUNNING 1 acc | 62",
        "decode | R1 4/3/1/1 | - | R1 5/0/2 FINISHED 0 acc | 63",
        "decode | R2 5/4/1/1 | - | R2 6/5/2 RUNNING 1 acc | 63",
        "decode | R2 6/5/1/1 | - | R2 7/6/3 RUNNING 1 acc | 63",
        "decode | R2 7/6/1/1 | - | R2 8/7/4 RUNNING 1 acc | 63",
        "decode | R2 8/7/1/1 | - | R2 9/0/5 FINISHED 0 acc | 64"]),
    # workloads/cases/preempt-order.yaml: the tail D goes first, then C preempts itself; C comes back first and
    # revives its own freed block.
    "preempt-order": ("prefill_first", _engine(512, 16, 64, 4, 5),
                      [(x, [100 + 10 * i + k for k in range(4)], 2, None) for i, x in enumerate("ABCD")], [
        "prefill | A 4/0/4/1; B 4/0/4/1; C 4/0/4/1; D 4/0/4/1 | - | A 5/4/1 RUNNING 1 acc; B 5/4/1 RUNNING 1 acc; "
        "C 5/4/1 RUNNING 1 acc; D 5/4/1 RUNNING 1 acc | 1",
        "decode | A 5/4/1/2; B 5/4/1/2 | D, C | A 6/0/2 FINISHED 0 acc; B 6/0/2 FINISHED 0 acc | 5",
        "prefill | C 5/4/1/2; D 5/0/5/2 | - | C 6/0/2 FINISHED 0 acc; D 6/0/2 FINISHED 0 acc | 5"]),
}


def test_the_model_does_not_import_the_engine():
    """A model that shares the engine's code would share its bugs."""
    import ast

    tree = ast.parse((Path(__file__).parent / "scheduler_model.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m.split(".")[0] == "engine"], names


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_the_model_reproduces_the_seeds_step_tables(name):
    policy, engine, requests, want = SEEDS[name]
    assert _model_rows(policy, engine, requests) == want


# `mixed`, worked out by hand from its specification (issue 23), before any engine implements it.
MIXED = {
    # Budget 6, block size 4. A (5 tokens) prefills alone; next step A decodes (1 token) and B (8 tokens, arriving
    # after step 1) gets the 5 tokens left: B is chunked, stays in `waiting`, its candidate dropped. Then A's
    # decode and the 3 left of B's prompt share a step; then both decode.
    "decode-and-chunk": (_engine(6, 4, 64, 4, 16),
                         [("A", [1, 2, 3, 4, 5], 4, None), ("B", [11, 12, 13, 14, 15, 16, 17, 18], 2, 1)], [
        "prefill | A 5/0/5/2 | - | A 6/5/1 RUNNING 2 acc | 14",
        "mixed | A 6/5/1/2; B 8/0/5/2 | - | A 7/6/2 RUNNING 2 acc; B 8/5/0 WAITING 2 disc | 12",
        "mixed | A 7/6/1/2; B 8/5/3/2 | - | A 8/7/3 RUNNING 2 acc; B 9/8/1 RUNNING 2 acc | 12",
        "decode | A 8/7/1/2; B 9/8/1/3 | - | A 9/0/4 FINISHED 0 acc; B 10/0/2 FINISHED 0 acc | 16"]),
    # Unlike prefill_first, a later prompt may be chunked: with budget 5, A (3) is admitted whole and B (4) gets
    # the 2 left.
    "second-prompt-chunked": (_engine(5, 4, 64, 4, 16), [("A", [1, 2, 3], 1, None), ("B", [4, 5, 6, 7], 1, None)], [
        "prefill | A 3/0/3/1; B 4/0/2/1 | - | A 4/0/1 FINISHED 0 acc; B 4/2/0 WAITING 1 disc | 15",
        "prefill | B 4/2/2/1 | - | B 5/0/1 FINISHED 0 acc | 16"]),
    # Seats: max_num_seqs 2 with A and B decoding leaves no seat for C, which waits although tokens are left.
    "no-seat-left": (_engine(64, 2, 64, 4, 16),
                     [("A", [1, 2], 3, None), ("B", [3, 4], 3, None), ("C", [5, 6], 1, 1)], [
        "prefill | A 2/0/2/1; B 2/0/2/1 | - | A 3/2/1 RUNNING 1 acc; B 3/2/1 RUNNING 1 acc | 14",
        "decode | A 3/2/1/1; B 3/2/1/1 | - | A 4/3/2 RUNNING 1 acc; B 4/3/2 RUNNING 1 acc | 14",
        "decode | A 4/3/1/1; B 4/3/1/1 | - | A 5/0/3 FINISHED 0 acc; B 5/0/3 FINISHED 0 acc | 16",
        "prefill | C 2/0/2/1 | - | C 3/0/1 FINISHED 0 acc | 16"]),
    # Block size 2, 7 blocks, budget 4, 2 seats. Step 2: A and B decode and M (6 tokens, 3 blocks, arrived after
    # step 1) takes the 2 tokens left: chunked, holding all its blocks, the pool now full. Step 4: A's new token
    # starts a block, none is free: A preempts the tail B, which goes *behind* the mid-chunk M; after a preemption
    # nothing is admitted, but M, which holds its blocks, completes its prompt beside A's decode. Step 5: A and M
    # take both seats (B waits although tokens are left) and both finish. Step 6: B re-prefills from scratch,
    # chunked (4 of 5).
    "preempt-behind-a-chunk": (_engine(4, 4, 64, 2, 7),
                               [("A", [1, 2], 5, None), ("B", [3, 4], 4, None), ("M", [5, 6, 7, 8, 9, 10], 2, 1)], [
        "prefill | A 2/0/2/1; B 2/0/2/1 | - | A 3/2/1 RUNNING 1 acc; B 3/2/1 RUNNING 1 acc | 5",
        "mixed | A 3/2/1/2; B 3/2/1/2; M 6/0/2/3 | - | A 4/3/2 RUNNING 2 acc; B 4/3/2 RUNNING 2 acc; "
        "M 6/2/0 WAITING 3 disc | 0",
        "mixed | A 4/3/1/2; B 4/3/1/2; M 6/2/2/3 | - | A 5/4/3 RUNNING 2 acc; B 5/4/3 RUNNING 2 acc; "
        "M 6/4/0 WAITING 3 disc | 0",
        "mixed | A 5/4/1/3; M 6/4/2/3 | B | A 6/5/4 RUNNING 3 acc; M 7/6/1 RUNNING 3 acc | 1",
        "decode | A 6/5/1/3; M 7/6/1/4 | - | A 7/0/5 FINISHED 0 acc; M 8/0/2 FINISHED 0 acc | 7",
        "prefill | B 5/0/4/3 | - | B 5/4/3 WAITING 3 disc | 4",
        "prefill | B 5/4/1/3 | - | B 6/0/4 FINISHED 0 acc | 7"]),
}


@pytest.mark.parametrize("name", sorted(MIXED))
def test_the_model_of_mixed_matches_hand_worked_steps(name):
    engine, requests, want = MIXED[name]
    assert _model_rows("mixed", engine, requests) == want


def test_a_prompt_mid_chunk_goes_on_when_the_decode_part_preempted_everyone():
    """The edge where the decode part preempts (so nothing new is admitted) and the only running sequence
    preempted itself: the prompt mid-chunk, which holds the rest of the pool, still computes its last chunk, or
    no step could ever run again."""
    m = SchedulerModel("mixed", 4, 4, 2, 3, 64)
    m.add(0, [1, 2], 5)
    m.add(1, [3, 4, 5], 1)
    plan = m.schedule()  # A whole (1 block), W chunked: 2 of 3 tokens (its 2 blocks: none left)
    assert [(s.seq_id, s.scheduled) for s in plan.rows] == [(0, 2), (1, 2)]
    m.postprocess(plan, {0: 7, 1: 7})
    assert m.free_blocks == 0 and [s.seq_id for s in m.waiting] == [1]
    plan = m.schedule()  # A needs a block, W holds the other: A preempts itself, W goes on
    assert plan.preempted == [0] and plan.phase == "prefill"
    assert [(s.seq_id, s.scheduled) for s in plan.rows] == [(1, 1)]


# --- the engine against the model ----------------------------------------------------------------------------

@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    temperature: float
    after: int  # submitted after this step (0: before the first), or earlier if the engine runs out of work
    abort_after: int | None  # aborted after this step, if it is submitted and unfinished by then


@dataclass
class Workload:
    policy: str
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    num_blocks: int
    max_model_len: int
    requests: list[Request]

    def model(self) -> SchedulerModel:
        return SchedulerModel(self.policy, self.max_num_batched_tokens, self.max_num_seqs, self.block_size,
                              self.num_blocks, self.max_model_len)


def _blocks_needed(prompt_len: int, max_tokens: int, block_size: int, max_model_len: int) -> int:
    """RequestLimits' rule: the longest a sequence gets (its last sampled token needs no KV, and it stops at
    max_model_len) must fit the pool alone."""
    return -(-min(prompt_len + max_tokens - 1, max_model_len) // block_size)


@st.composite
def workloads(draw, policy: str) -> Workload:
    bs = draw(st.sampled_from([1, 2, 3, 4, 8]))
    # "crowded": several requests at once, each with a long output, in a pool that holds the largest alone and
    # little more: decodes outgrow the pool and preempt the tail of a long `running` queue.
    crowded = draw(st.booleans())
    max_model_len = draw(st.one_of(st.just(256), st.integers(bs, 8 * bs)))
    # A few whole blocks of tokens, reused across prompts in different orders: equal blocks after equal and
    # after different prefixes, and the same block twice in one prompt.
    vocab = st.integers(100, 103)
    pieces = draw(st.lists(st.lists(vocab, min_size=bs, max_size=bs), min_size=1, max_size=3))
    drafts = []
    for _ in range(draw(st.integers(3, 6) if crowded else st.integers(1, 6))):
        prompt = [t for i in draw(st.lists(st.integers(0, len(pieces) - 1), max_size=4)) for t in pieces[i]]
        # The tail decides where the prompt ends against a block boundary.
        tail = draw(st.one_of(st.sampled_from([0, 1, bs - 1, bs + 1]), st.integers(0, 2 * bs)))
        prompt = (prompt + draw(st.lists(vocab, min_size=tail, max_size=tail)))[:max_model_len] or [100]
        max_tokens = draw(st.integers(2 * bs, 4 * bs + 2) if crowded else st.integers(1, 4 * bs + 2))
        after = 0 if crowded else draw(st.one_of(st.just(0), st.integers(1, 12)))
        drafts.append(Request(prompt, max_tokens, draw(st.sampled_from([0.0, 1.0])), after,
                              draw(st.one_of(st.none(), st.integers(0, 12)))))
    # The pool: any size, or just what the largest request needs alone (plus a little), so that requests that
    # each fit crowd each other out and preempt.
    largest = max(_blocks_needed(len(r.prompt), r.max_tokens, bs, max_model_len) for r in drafts)
    tight = st.integers(largest, largest + 2)
    num_blocks = draw(tight if crowded else st.one_of(st.integers(1, 32), tight))
    # The budget: any, or exactly what the first few prompts need together (give or take one token), where a
    # prompt either just fits beside the others or is just chunked.
    first = [len(r.prompt) for r in drafts if r.after == 0]
    exact = sum(first[: draw(st.integers(min(2, len(first)), len(first)))]) + draw(st.sampled_from([0, 0, -1, 1]))
    budget = max(1, draw(st.one_of(st.integers(1, 3 * bs + 2), st.integers(1, 96), st.just(exact))))
    max_num_seqs = draw(st.integers(3, 5) if crowded else st.integers(1, 5))
    requests = []
    for r in drafts:
        # The engine refuses what cannot fit (RequestLimits, tested on its own): ask for less, or drop it.
        while r.max_tokens > 1 and _blocks_needed(len(r.prompt), r.max_tokens, bs, max_model_len) > num_blocks:
            r.max_tokens -= 1
        if _blocks_needed(len(r.prompt), r.max_tokens, bs, max_model_len) <= num_blocks:
            requests.append(r)
    return Workload(policy, budget, max_num_seqs, bs, num_blocks, max_model_len, requests)


def _engine_step(events: list[dict]) -> dict:
    """One step's states from its events (SPEC section 6)."""
    by = {}
    for e in events:
        by.setdefault(e["event"], []).append(e)
    before = by["before_schedule"][0]
    scheduled = by["scheduled"][0]
    after = by["after_postprocess"][0]
    return {
        "before": (before["waiting"], before["running"], before["free_blocks"]),
        "phase": scheduled["phase"],
        "preempted": [e["seq_id"] for e in by.get("preempted", [])],
        "scheduled": [(s["seq_id"], s["num_tokens"], s["num_cached_tokens"], s["num_scheduled_tokens"],
                       s["block_table"]) for s in scheduled["seqs"]],
        "after": [(s["seq_id"], s["num_tokens"], s["num_cached_tokens"], s["num_completion_tokens"], s["status"],
                   s["block_table"], s["accepted"]) for s in after["seqs"]],
        "free": after["free_blocks"],
    }


def _model_schedule(m: SchedulerModel):
    """The model's states for the next step up to scheduling, and its plan."""
    before = ([s.seq_id for s in m.waiting], [s.seq_id for s in m.running], m.free_blocks)
    plan = m.schedule()
    return {"before": before, "phase": plan.phase, "preempted": plan.preempted,
            "scheduled": [(s.seq_id, s.num_tokens, s.cached, s.scheduled, list(s.table)) for s in plan.rows]}, plan


def _model_postprocess(m: SchedulerModel, plan, sampled: dict[int, int]) -> dict:
    """The model's states after postprocess; `sampled` supplies the tokens it cannot know (the engine's)."""
    accepted = m.postprocess(plan, sampled)
    return {"after": [(s.seq_id, s.num_tokens, s.cached, s.completion, s.status, list(s.table), a)
                      for s, a in zip(plan.rows, accepted)],
            "free": m.free_blocks}


def _bait(m: SchedulerModel, seq) -> bool:
    """Would a hash that forgets the previous block's hash give `seq` a false prefix hit? True when one of its
    blocks (not its last) equals the last block of an indexed prefix that is not its own, and every block before
    it hits."""
    bs, pool = m.pool.bs, m.pool
    ends = {key[-bs:]: key for key in pool.index}
    for i in range(-(-seq.num_tokens // bs) - 1):
        key = pool.key(seq, i)
        other = ends.get(key[-bs:])
        if other is not None and other != key:
            return True
        if key not in pool.index:
            return False
    return False


def _features(bs: int, want: dict, fresh: set[int], free_before: set[int]) -> set[str]:
    """What a step exercised, for the coverage check (`fresh`: the sequences that held no blocks before it)."""
    seen = {want["phase"]} | ({"preemption"} if want["preempted"] else set())
    for seq_id, num_tokens, cached, scheduled, table in want["scheduled"]:
        if seq_id in fresh and cached:
            seen.add("prefix hit")
            if set(table[: cached // bs]) & free_before:
                seen.add("freed block revived")
        if seq_id not in fresh and scheduled == 1 and cached == num_tokens - 1 and cached % bs == 0:
            seen.add("decode takes a new block")
    for *_, accepted in want["after"]:
        if not accepted:
            seen.add("chunk")
    return seen


def _same(step: int, got: dict, want: dict) -> None:
    for key in want:
        assert got[key] == want[key], (f"step {step} {key}: engine {got[key]} != model {want[key]}\n"
                                       f"engine step: {got}\nmodel step:  {want}")


def check_against_model(model_dir: str, w: Workload, async_scheduling: bool) -> set[str]:
    """Run `w` on the engine and on the model side by side; fail at the first state that differs. Returns what
    the run exercised (for the coverage check)."""
    from engine import LLM, SamplingParams
    from engine.trace import ListTracer

    tracer = ListTracer()
    llm = LLM(model_dir, device="cpu", enforce_eager=True, tracer=tracer, async_scheduling=async_scheduling,
              scheduling_policy=w.policy, max_num_batched_tokens=w.max_num_batched_tokens,
              max_num_seqs=w.max_num_seqs, kvcache_block_size=w.block_size, num_kvcache_blocks=w.num_blocks,
              max_model_len=w.max_model_len)
    m = w.model()
    seen: set[str] = set()
    seq_of: dict[int, int] = {}  # request index -> seq_id
    pending = sorted(range(len(w.requests)), key=lambda i: w.requests[i].after)
    # Generous: every token of every request computed one at a time, ten times over.
    limit = 10 * sum(len(r.prompt) + r.max_tokens for r in w.requests) + 10
    step = 0
    ahead = False              # the engine's last step() launched the next step already (async scheduling)
    late_adds: list = []       # arrivals the model takes after its next step
    late_aborts: list = []     # aborts the model applies inside its next step
    try:
        while True:
            for i, r in enumerate(w.requests):
                if r.abort_after == step and i in seq_of:
                    mark = len(tracer.events)
                    held = bool(m.seqs[seq_of[i]].table)
                    done = llm.abort(seq_of[i])
                    if ahead:
                        # The engine's next step is already on the device: the abort happens while it runs (the
                        # model aborts once it has scheduled that step, and drops the row it has there).
                        if done:
                            late_aborts.append(seq_of[i])
                            seen.add("abort while a step ran")
                        continue
                    assert done == m.abort(seq_of[i]), f"after step {step}: abort({seq_of[i]}) returned {done}"
                    if done:
                        (event,) = tracer.events[mark:]
                        assert event["free_blocks"] == m.free_blocks, f"after step {step}: abort({seq_of[i]})"
                        seen.add("abort of a sequence holding blocks" if held else "abort")
            assert llm.is_finished() == (m.is_finished() and not late_adds), f"after step {step}: is_finished differs"
            due = [i for i in pending if w.requests[i].after <= step]
            if not due and pending and llm.is_finished():
                due = [i for i in pending if w.requests[i].after == w.requests[pending[0]].after]
            for i in due:
                r = w.requests[i]
                seq_of[i] = llm.add_request(r.prompt, SamplingParams(max_tokens=r.max_tokens, ignore_eos=True,
                                                                     temperature=r.temperature))
                # An arrival while the engine's next step is already launched joins the step after it.
                (late_adds.append if ahead else lambda x: m.add(*x))((seq_of[i], r.prompt, r.max_tokens))
                pending.remove(i)
                if step:
                    seen.add("arrival while a step ran" if ahead else "arrival between steps")
            assert llm.is_finished() == (m.is_finished() and not late_adds), f"after step {step}: is_finished differs"
            if llm.is_finished() and not pending:
                stats = llm.async_stats
                return seen | ({"step launched ahead"} if stats["launched_ahead"] else set()) \
                    | ({"row wasted by an abort"} if stats["wasted_rows"] else set())
            step += 1
            assert step <= limit, f"no end after {limit} steps"
            fresh = {s.seq_id for s in m.waiting if not s.table}
            if any(_bait(m, s) for s in m.waiting if not s.table):
                seen.add("equal block after another prefix")
            free_before = set(m.pool.free)
            mark = len(tracer.events)
            launched = llm.async_stats["launched_ahead"]
            try:
                llm.step()
            except Exception as exc:
                try:
                    m.schedule()
                except NothingCanRun:
                    return seen | {"nothing can run"}
                raise AssertionError(f"step {step}: the engine raised {exc!r}; the model schedules a step") from exc
            got = _engine_step(tracer.events[mark:])
            want, plan = _model_schedule(m)
            _same(step, got, want)
            for seq_id in late_aborts:
                assert m.abort_while_running(seq_id), f"step {step}: abort({seq_id}) while the step ran"
            late_aborts = []
            (sampled,) = [e for e in tracer.events[mark:] if e["event"] == "sampled"]
            want.update(_model_postprocess(m, plan, {t["seq_id"]: t["token_id"] for t in sampled["tokens"]}))
            _same(step, got, want)
            seen |= _features(w.block_size, want, fresh, free_before)
            for add in late_adds:
                m.add(*add)
            late_adds = []
            ahead = llm.async_stats["launched_ahead"] > launched
            for s in plan.rows:
                if s.status == "FINISHED" and s.completion < s.max_tokens:
                    seen.add("stopped at max_model_len")
    finally:
        llm.exit()


def _examples(policy: str, n: int, **kw):
    def decorate(fn):
        return settings(max_examples=n, deadline=None, database=None, print_blob=True,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                               HealthCheck.filter_too_much], **kw)(
            given(w=workloads(policy))(fn))
    return decorate


def _skip_unless_engine_has(policy: str):
    from engine.config import SCHEDULING_POLICIES

    if policy not in SCHEDULING_POLICIES:
        pytest.skip(f"the engine has no {policy!r} policy yet (engine.config.SCHEDULING_POLICIES = "
                    f"{SCHEDULING_POLICIES}); its model is checked by the hand-worked examples above")


def _property(policy: str, n: int, **kw):
    @_examples(policy, n, **kw)
    def prop(tiny_model, w, seen):
        for async_scheduling in (True, False):
            seen |= check_against_model(tiny_model, w, async_scheduling)
    return prop


_default = {p: _property(p, DEFAULT_EXAMPLES, derandomize=True) for p in ("prefill_first", "balanced", "mixed")}
_slow = {p: _property(p, SLOW_EXAMPLES) for p in ("prefill_first", "balanced", "mixed")}

# What the default examples must have exercised for their agreement with the model to mean something.
EXERCISED = {"prefill", "decode", "chunk", "preemption", "prefix hit", "freed block revived",
             "equal block after another prefix", "decode takes a new block", "abort of a sequence holding blocks",
             "arrival between steps", "stopped at max_model_len", "step launched ahead", "arrival while a step ran",
             "abort while a step ran", "row wasted by an abort"}


@pytest.mark.parametrize("policy", ["prefill_first", "balanced", "mixed"])
def test_engine_steps_equal_the_model(tiny_model, policy, monkeypatch):
    from tests.conftest import replay_graphs

    _skip_unless_engine_has(policy)
    replay_graphs(monkeypatch, "decodes")  # as on a GPU: decode steps replay graphs, so async plans ahead
    seen: set[str] = set()
    _default[policy](tiny_model, seen=seen)
    assert EXERCISED | ({"mixed"} if policy == "mixed" else set()) <= seen, sorted(seen)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["prefill_first", "balanced", "mixed"])
def test_engine_steps_equal_the_model_on_many_more_mixes(tiny_model, policy, monkeypatch):
    from tests.conftest import replay_graphs

    _skip_unless_engine_has(policy)
    replay_graphs(monkeypatch, "decodes")
    _slow[policy](tiny_model, seen=set())
