"""Checking an engine event log (SPEC section 6) by replaying it.

    events = read_jsonl("runs/.../events.jsonl")       # labkit.trace.events; LabkitError on a bad line
    report = validate(events, load_case("chunk"))      # Report(checks=[Check, ...])
    report.ok, report.first_failure, report.failures
    (steps_table and write_tsv, the readable views, live in labkit.trace.tables)

`validate` replays the log through a model of the engine (`_Replay`: every sequence's state and block
table, the token ids whose KV each block holds, the free blocks). Each event type has a handler that
updates the model; before it does, the handler runs the invariants that event must keep (kind
"invariant"): functions registered with `@invariant(name, about)` in the INVARIANTS table, which compare
the event with the model as the events before it left it (slots follow the block tables, a discarded
chunk candidate never becomes an output, every block is free or held, ...). A failure is reported per
occurrence (capped per invariant); an invariant that never failed gets one passing Check saying how many
times it was checked. The same replay compares each step with the case's `expect` entry for it (kind
"expect", one Check per field) and the requests the log added with the case's (kind "case").

The verdict (`report.verdict`): FAIL when an invariant, the schema or the case's requests fail;
RECORDED for a case without expectations; PASS when every expectation holds; and when some do
not, CHANGED if the run was meant to change them (`expect_changes`: an override, a patched
engine; `report.changes` is then the diff, one `change_text` line per field) or FAIL if not.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from labkit.trace.cases import Case, format_positions
from labkit.trace.events import PHASES, STATUSES, EventLog, event_problems, is_int

# Every invariant validate() checks, name -> what it asserts, in the order the report lists them (filled
# by @invariant below). Each one that never fails gets one passing Check.
INVARIANTS: dict[str, str] = {}
# Rules of nano-vLLM's scheduling policy rather than of correctness: they gate like invariants, but an
# experiment may change the policy on purpose (patches/exp-chunk-any-sequence.patch), so under
# expect_changes they are part of the diff (kind "policy").
POLICY_RULES = ("policy.chunk_first_only",)
_MAX_FAILURES_PER_NAME = 50


@dataclass
class Check:
    name: str
    ok: bool
    step: int | None = None
    request: str | None = None
    field: str | None = None
    expected: Any = None
    actual: Any = None
    message: str = ""
    kind: str = "invariant"          # "expect" | "invariant" | "policy" | "schema" | "case" | "engine"
    skipped: bool = False            # ok=True but nothing could be checked (message says why)

    def to_dict(self) -> dict:
        return asdict(self)


_CHANGEABLE = ("expect", "policy")


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    run: str | None = None
    steps: int = 0
    case: str | None = None
    # Set when an override or an engine change was meant to change what the case expects: then its
    # expected states are a diff to show (verdict CHANGED), and only invariants, schema and the case's
    # requests gate. `why_changes` says what changed (shown beside the verdict).
    expect_changes: bool = False
    why_changes: str = ""

    @property
    def ok(self) -> bool:
        """Every check held, expectations included (strict)."""
        return all(c.ok for c in self.checks)

    @property
    def gating_failures(self) -> list[Check]:
        """Failures that make the run wrong whatever it was meant to do: invariants, schema, the case's requests."""
        return [c for c in self.checks if not c.ok and c.kind not in _CHANGEABLE]

    @property
    def changes(self) -> list[Check]:
        """Expected states of the case (and nano's policy rules) the run did not keep."""
        return [c for c in self.checks if not c.ok and c.kind in _CHANGEABLE]

    @property
    def verdict(self) -> str:
        """PASS, FAIL, CHANGED (only expectations differ, and changes were expected) or RECORDED (no
        expectations, every invariant held)."""
        if self.gating_failures:
            return "FAIL"
        if not self.judged:
            return "RECORDED"
        if not self.changes:
            return "PASS"
        return "CHANGED" if self.expect_changes else "FAIL"

    @property
    def passed(self) -> bool:
        """Whether the exit code is 0 (PASS, CHANGED, RECORDED)."""
        return self.verdict != "FAIL"

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def first_failure(self) -> Check | None:
        for c in self.checks:
            if not c.ok:
                return c
        return None

    def of_kind(self, kind: str) -> list[Check]:
        return [c for c in self.checks if c.kind == kind]

    @property
    def judged(self) -> bool:
        """Whether case expectations were compared (a case without `expect` is only recorded)."""
        return any(c.kind == "expect" for c in self.checks)

    def counts(self) -> dict:
        out: dict[str, dict[str, int]] = {}
        for c in self.checks:
            d = out.setdefault(c.kind, {"passed": 0, "failed": 0, "skipped": 0})
            if not c.ok:
                d["failed"] += 1
            elif c.skipped:
                d["skipped"] += 1
            else:
                d["passed"] += 1
        return out

    def summary(self) -> str:
        parts = []
        for kind, d in self.counts().items():
            parts.append(f"{kind}: {d['passed']} passed, {d['failed']} failed"
                         + (f", {d['skipped']} skipped" if d["skipped"] else ""))
        verdict = self.verdict
        s = f"{verdict} ({'; '.join(parts) or 'no checks'})"
        gating = self.gating_failures
        if verdict == "CHANGED":
            s += f"; every invariant held, {len(self.changes)} difference(s) from the case ({self.why_changes})"
        elif gating:
            s += f"; first failure: {gating[0].message}"
        elif self.changes:
            s += f"; first difference from the case: {self.changes[0].message}"
        return s

    def to_dict(self) -> dict:
        return {"ok": self.ok, "verdict": self.verdict, "run": self.run, "steps": self.steps,
                "case": self.case, "judged": self.judged, "counts": self.counts(),
                "expect_changes": self.expect_changes, "why_changes": self.why_changes or None,
                "changes": [{"step": c.step, "request": c.request, "field": c.field, "expected": c.expected,
                             "actual": c.actual, "text": change_text(c)} for c in self.changes],
                # the failure behind a FAIL (none under CHANGED: a diff is not a failure)
                "first_failure": (self.first_failure.to_dict()
                                  if self.verdict == "FAIL" and self.first_failure else None),
                "checks": [c.to_dict() for c in self.checks]}


def _ids(v) -> str:
    return "+".join(map(str, v)) if isinstance(v, list) and v else "nothing"


def change_text(c: Check) -> str:
    """One expected state the run did not reach, as a diff line: "step 3: scheduled B instead of A+B",
    "step 2: A cached 512 instead of 700", "final: R2 outputs 2 instead of 3"."""
    where = f"step {c.step}" if c.step is not None else "final" if (c.field or "").startswith("final") else "run"
    fld = (c.field or "").removeprefix("final.")
    if c.kind == "policy":
        return f"{where}: {c.message.split(': ', 1)[-1]}"
    if c.expected is None and c.actual is None:      # something missing: the message says what
        what = c.message.split(": ", 1)[-1]
        if fld == "step":
            return f"{where}: did not happen {what.removeprefix('not in the log ')}"
        return f"{where}: {c.request + ' ' if c.request else ''}{what}"
    if fld in ("scheduled", "preempted") and c.request is None:
        return f"{where}: {fld} {_ids(c.actual)} instead of {_ids(c.expected)}"
    who = f"{c.request} " if c.request else ""
    return f"{where}: {who}{fld} {_show(c.actual)} instead of {_show(c.expected)}"


def _show(v) -> str:
    if isinstance(v, list) and len(v) > 12 and all(is_int(x) for x in v):
        return format_positions(v)
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


def _where(step, request=None) -> str:
    s = f"step {step}" if step is not None else "run"
    return f"{s}, request {request}" if request is not None else s


def _cfg_int(cfg: dict, key: str):
    v = cfg.get(key)
    return v if is_int(v) else None


def _cumsum(xs) -> list[int]:
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out


def _start(nc, nt) -> int:
    """First position a prefill computes: num_cached_tokens, or the last token when the whole
    sequence is cached (its logits are still needed)."""
    nc = nc if is_int(nc) else 0
    return min(nc, nt - 1) if is_int(nt) and nt >= 1 else nc


def _strip_pad(row) -> list:
    row = list(row or [])
    while row and row[-1] == -1:
        row.pop()
    return row


# ----------------------------------------------------------------------------- the registry

@dataclass
class _Failure:
    message: str
    fields: dict      # step, request, field, expected, actual of the Check


def need(cond, message: str, **fields) -> _Failure | None:
    """One result of an invariant: None when `cond` holds, else the failure `message` names."""
    return None if cond else _Failure(message, fields)


def invariant(name: str, about: str | None = None):
    """Add a check of invariant `name` to INVARIANTS (`about`, one line, where the name first appears).

    The function takes the replay (and the event's parts) and yields one result per thing it checked: None
    when it held, `need(...)`'s failure when not; the replay counts them under `name`."""
    def register(fn):
        assert about or name in INVARIANTS, f"@invariant({name!r}) needs a description the first time"
        INVARIANTS.setdefault(name, about)
        fn.invariant = name
        return fn
    return register


@dataclass
class _Seq:
    """A sequence as the replay knows it."""
    seq_id: Any
    request_id: str
    max_tokens: int | None
    ignore_eos: bool | None
    num_tokens: int | None
    num_cached: int = 0
    completion: int = 0
    status: str = "WAITING"
    table: list = field(default_factory=list)
    finish_reason: str | None = None
    tokens: list | None = None       # prompt + accepted ids, when request_added lists the prompt


class _Step:
    """One engine step's events: the first of each kind, every preempted one."""

    def __init__(self, log: EventLog, n: int):
        self.n, self.log, self.events = n, log, log.steps[n]
        self.scheduled = log.one(n, "scheduled")
        self.before = log.one(n, "before_schedule")
        self.inputs = log.one(n, "gpu_inputs")
        self.sampled = log.one(n, "sampled")
        self.after = log.one(n, "after_postprocess")
        self.ids: set = set()               # the seq_ids it scheduled
        self.sampled_tok: dict = {}         # seq_id -> the sampled token id

    @cached_property
    def phase(self):
        return self.scheduled.get("phase")

    @cached_property
    def seqs(self) -> list[dict]:
        return [s for s in (self.scheduled.get("seqs") or []) if isinstance(s, dict)]

    @cached_property
    def counts(self) -> list:
        return [s.get("num_scheduled_tokens") or 0 for s in self.seqs]

    @cached_property
    def positions(self) -> list[list[int]]:
        """The positions each scheduled sequence feeds: from num_cached_tokens in prefill, num_tokens - 1 in decode."""
        out = []
        for s in self.seqs:
            nc, ns, nt = s.get("num_cached_tokens") or 0, s.get("num_scheduled_tokens") or 0, s.get("num_tokens") or 0
            start = _start(nc, nt)
            out.append(list(range(start, start + ns)) if self.phase == "prefill" else [nt - 1])
        return out

    def where(self, entry: dict | None = None) -> dict:
        return {"step": self.n} if entry is None else {"step": self.n, "request": self.log.rid(entry)}


# ----------------------------------------------------------------------------- invariants of the log

@invariant("log.single_run", "every event carries the same run id")
def _single_run(r):
    runs = {e.get("run") for e in r.log.events}
    yield need(len(runs) <= 1, f"the log mixes {len(runs)} runs: {', '.join(sorted(map(str, runs)))}")


@invariant("log.run_start", "the log has exactly one run_start event")
def _one_run_start(r):
    yield need(len(r.log.run_starts) == 1, f"run: expected one run_start event, found {len(r.log.run_starts)}")


@invariant("time.monotonic", "t_ns never goes backwards")
def _monotonic(r):
    last = None
    for e in r.log.events:
        t = e.get("t_ns")
        if is_int(t):
            yield need(last is None or t >= last, f"run: t_ns goes backwards at {e.get('event')} "
                                                  f"(step {e.get('step')}): {last} -> {t}", step=e.get("step"))
            last = t


@invariant("steps.contiguous", "steps are numbered 1..N")
def _contiguous(r):
    steps = sorted(r.log.steps)
    if steps:
        yield need(steps == list(range(1, len(steps) + 1)),
                   f"run: steps are not numbered 1..{len(steps)} (found {steps[:5]}...)")


@invariant("step.events", "a step has one scheduled, gpu_inputs, after_postprocess and sampled event, at most "
                          "one before_schedule, and its events can be read")
def _step_events(r, s: _Step):
    for name, least in (("scheduled", 1), ("gpu_inputs", 1), ("after_postprocess", 1), ("sampled", 1),
                        ("before_schedule", 0)):
        n = len(s.events.get(name, []))
        yield need(least <= n <= 1, f"step {s.n}: {n} {name} events (expected "
                                    f"{'exactly one' if least else 'at most one'})", step=s.n, field=name)


@invariant("seq.known", "every sequence a step names was added by a request_added event")
def _preempted_known(r, s: _Step, p: dict):
    yield need(p.get("seq_id") in r.seqs, f"step {s.n}, request {r.log.rid(p)}: preempted an unknown sequence "
                                          f"{p.get('seq_id')}", **s.where(p))


@invariant("seq.known")
def _scheduled_known(r, s: _Step, e: dict):
    yield need(e.get("seq_id") in r.seqs, f"step {s.n}, request {r.log.rid(e)}: seq {e.get('seq_id')} scheduled "
                                          f"without a request_added event", **s.where(e))


@invariant("seq.known")
def _reported_known(r, s: _Step, a: dict):
    # counted only when it fails: after_postprocess may report sequences the step did not schedule
    if a.get("seq_id") not in r.seqs:
        yield need(False, f"step {s.n}, request {r.log.rid(a)}: after_postprocess reports unknown seq "
                          f"{a.get('seq_id')}", **s.where(a))


@invariant("phase", "a step is prefill or decode and schedules something; statuses are WAITING, RUNNING "
                    "or FINISHED")
def _phase(r, s: _Step):
    yield need(s.phase in PHASES, f"step {s.n}: phase {s.phase!r} is not prefill or decode", step=s.n,
               field="phase", actual=s.phase)
    if s.phase in PHASES:
        yield need(bool(s.seqs), f"step {s.n}: nothing scheduled", step=s.n)


@invariant("phase")
def _known_status(r, s: _Step, a: dict):
    status = a.get("status")
    yield need(status in STATUSES, f"step {s.n}, request {r.log.rid(a)}: unknown status {status!r}",
               **s.where(a), field="status", actual=status)


# ----------------------------------------------------------------------------- before_schedule, preempted

@invariant("phase.mixed", "a prefill step schedules only waiting sequences, a decode step only running ones")
def _from_the_right_queue(r, s: _Step):
    prefill = s.phase == "prefill"
    if s.before is not None:
        queue = {str(x) for x in s.before.get("waiting" if prefill else "running") or []}
        for e in s.seqs:
            yield need(str(e.get("seq_id")) in queue, f"step {s.n}, request {r.log.rid(e)}: scheduled in a "
                                                      f"{s.phase} step but it was not "
                                                      f"{'waiting' if prefill else 'running'} before scheduling",
                       **s.where(e))
        return
    for e in s.seqs:
        q = r.seqs.get(e.get("seq_id"))
        if q is not None:
            yield need(q.status == ("WAITING" if prefill else "RUNNING"),
                       f"step {s.n}, request {q.request_id}: scheduled in a {s.phase} step while {q.status}",
                       step=s.n, request=q.request_id)


@invariant("queues", "before_schedule's waiting and running queues hold the sequences the replay has there")
def _queues(r, s: _Step):
    live = [q for q in r.seqs.values() if q.status != "FINISHED"]
    want_w, want_r = (sorted(str(q.seq_id) for q in live if q.status == st) for st in ("WAITING", "RUNNING"))
    got_w, got_r = (sorted(str(x) for x in s.before.get(k) or []) for k in ("waiting", "running"))
    names = {str(q.seq_id): q.request_id for q in r.seqs.values()}

    def n(ids):
        return [names.get(i, f"seq{i}") for i in ids]
    yield need(got_w == want_w and got_r == want_r, f"step {s.n}: before_schedule has waiting {n(got_w)} running "
                                                    f"{n(got_r)}, but the states so far give waiting {n(want_w)} "
                                                    f"running {n(want_r)}", step=s.n)


@invariant("free.continuity", "a step starts with the free blocks the previous one left")
def _free_continuity(r, s: _Step):
    fb = s.before.get("free_blocks")
    if r.free is not None:
        yield need(fb == r.free, f"step {s.n}: before_schedule.free_blocks {fb}, but the previous step left "
                                 f"{r.free}", step=s.n, field="free_blocks", expected=r.free, actual=fb)


@invariant("preempted", "only a running sequence is preempted, and not scheduled in the same step")
def _preemptable(r, s: _Step, p: dict):
    rid = r.log.rid(p)
    yield need(p.get("seq_id") not in s.ids, f"step {s.n}, request {rid}: preempted and scheduled in the same "
                                             f"step", step=s.n, request=rid)
    q = r.seqs.get(p.get("seq_id"))
    if q is not None:
        yield need(q.status == "RUNNING", f"step {s.n}, request {rid}: preempted while {q.status}", step=s.n,
                   request=rid)


# ----------------------------------------------------------------------------- scheduled

@invariant("state.continuity", "a sequence is scheduled with the tokens, cached count and blocks it was left with")
def _continuity(r, s: _Step, e: dict, q: _Seq):
    nt, nc, table = e.get("num_tokens"), e.get("num_cached_tokens"), list(e.get("block_table") or [])
    rid = r.log.rid(e)
    yield need(nt == q.num_tokens or q.num_tokens is None, f"step {s.n}, request {rid}: scheduled with num_tokens "
                                                           f"{nt}, but the previous state had {q.num_tokens}",
               **s.where(e), field="num_tokens", expected=q.num_tokens, actual=nt)
    if q.table:
        yield need(nc == q.num_cached and table[:len(q.table)] == q.table,
                   f"step {s.n}, request {rid}: holds blocks {q.table} with cached {q.num_cached}, scheduled "
                   f"with blocks {table} cached {nc}", **s.where(e), field="block_table")


@invariant("block_table.size", "a scheduled sequence holds ceil(num_tokens / block_size) blocks")
def _table_size(r, s: _Step, e: dict):
    nt, table = e.get("num_tokens"), list(e.get("block_table") or [])
    if r.bs is not None and is_int(nt):
        want = -(-nt // r.bs)
        yield need(len(table) == want, f"step {s.n}, request {r.log.rid(e)}: {len(table)} blocks for {nt} tokens "
                                       f"(block size {r.bs} needs {want})", **s.where(e), field="blocks",
                   expected=want, actual=len(table))


@invariant("block_table.ids", "a block table holds distinct block ids of the pool")
def _table_ids(r, s: _Step, e: dict):
    table = list(e.get("block_table") or [])
    bad = [b for b in table if not is_int(b) or b < 0 or (r.nb is not None and b >= r.nb)]
    yield need(not bad and len(set(table)) == len(table), f"step {s.n}, request {r.log.rid(e)}: block table "
                                                          f"{table} has invalid or repeated ids", **s.where(e),
               field="block_table", actual=table)


@invariant("decode.shape", "a decode step schedules one token of a sequence whose other tokens are cached")
def _decode_shape(r, s: _Step, e: dict):
    nt, nc, ns = e.get("num_tokens"), e.get("num_cached_tokens"), e.get("num_scheduled_tokens")
    yield need(ns == 1 and is_int(nt) and is_int(nc) and nt == nc + 1,
               f"step {s.n}, request {r.log.rid(e)}: decode needs scheduled 1 and total = cached + 1, got total "
               f"{nt} cached {nc} scheduled {ns}", **s.where(e))


def _chunk_ok(e: dict) -> bool:
    nt, nc, ns = e.get("num_tokens"), e.get("num_cached_tokens"), e.get("num_scheduled_tokens")
    return is_int(ns) and is_int(nc) and is_int(nt) and ns >= 1 and _start(nc, nt) + ns <= nt


@invariant("chunk.fits", "a prefill computes at least one token and no more than the sequence has")
def _chunk_fits(r, s: _Step, e: dict):
    nt, nc, ns = e.get("num_tokens"), e.get("num_cached_tokens"), e.get("num_scheduled_tokens")
    yield need(_chunk_ok(e), f"step {s.n}, request {r.log.rid(e)}: prefill of {ns} tokens from cached {nc} does "
                             f"not fit total {nt}", **s.where(e))


@invariant("policy.chunk_first_only", "only the first sequence of a prefill batch is chunked (nano's policy)")
def _chunk_first_only(r, s: _Step, e: dict, j: int):
    nt, nc, ns = e.get("num_tokens"), e.get("num_cached_tokens"), e.get("num_scheduled_tokens")
    if _chunk_ok(e) and j > 0:
        rid = r.log.rid(e)
        yield need(_start(nc, nt) + ns == nt, f"step {s.n}, request {rid}: {rid} is chunked ({ns} of {nt - nc} "
                                              f"tokens) but is not first in the prefill batch (nano chunks only "
                                              f"the first)", **s.where(e))


@invariant("budget", "a step schedules at most max_num_seqs sequences and max_num_batched_tokens tokens")
def _seq_budget(r, s: _Step):
    if r.max_seqs is not None:
        yield need(len(s.seqs) <= r.max_seqs, f"step {s.n}: {len(s.seqs)} sequences scheduled, max_num_seqs is "
                                              f"{r.max_seqs}", step=s.n, field="max_num_seqs", expected=r.max_seqs,
                   actual=len(s.seqs))


@invariant("budget")
def _token_budget(r, s: _Step):
    total = sum(ns for ns in (e.get("num_scheduled_tokens") for e in s.seqs) if is_int(ns))
    if r.max_batched is not None:
        yield need(total <= r.max_batched, f"step {s.n}: {total} tokens scheduled, max_num_batched_tokens is "
                                           f"{r.max_batched}", step=s.n, field="max_num_batched_tokens",
                   expected=r.max_batched, actual=total)


# ----------------------------------------------------------------------------- gpu_inputs

@invariant("inputs.num_input_ids", "the model gets as many input ids as the step scheduled tokens")
def _num_input_ids(r, s: _Step, gi: dict):
    want, got = sum(s.counts), gi.get("num_input_ids")
    yield need(got == want, f"step {s.n}: num_input_ids {got}, the scheduled counts sum to {want}", step=s.n,
               field="num_input_ids", expected=want, actual=got)


def _graph_trim(gi: dict, got: list, n: int) -> list:
    """A CUDA-graph batch is padded past the step's rows: compare the rows the step has."""
    return got[:n] if len(got) > n and gi.get("execution") == "graph" else got


@invariant("inputs.positions", "positions run from num_cached_tokens in prefill, are num_tokens - 1 in decode")
def _positions(r, s: _Step, gi: dict):
    want = [p for ps in s.positions for p in ps]
    got = _graph_trim(gi, list(gi.get("positions") or []), len(want))
    yield need(got == want, f"step {s.n}: positions {format_positions(got)}, expected "
                            f"{format_positions(want, [len(p) for p in s.positions])} "
                            f"({'from num_cached_tokens' if s.phase == 'prefill' else 'num_tokens - 1'})",
               step=s.n, field="positions", expected=want, actual=got)


@invariant("slots", "position p of a sequence writes its KV to slot block_table[p // block_size] * block_size "
                    "+ p % block_size")
def _slots(r, s: _Step, gi: dict):
    n = sum(len(ps) for ps in s.positions)
    slots = list(gi.get("slot_mapping") or [])
    if len(slots) > n and all(x == -1 for x in slots[n:]):
        slots = slots[:n]
    if r.bs is None:
        return
    if len(slots) != n:
        yield need(False, f"step {s.n}: slot_mapping has {len(slots)} entries for {n} positions", step=s.n,
                   field="slot_mapping", expected=n, actual=len(slots))
        return
    off = 0
    for e, ps in zip(s.seqs, s.positions):
        table = list(e.get("block_table") or [])
        bad = []
        for k, p in enumerate(ps):
            i = p // r.bs
            want = table[i] * r.bs + p % r.bs if 0 <= i < len(table) else None
            if slots[off + k] != want:
                bad.append((off + k, p, want, slots[off + k]))
        if bad:
            idx, p, want, got = bad[0]
            yield need(False, f"step {s.n}, request {r.log.rid(e)}: slot_mapping[{idx}] (position {p}) expected "
                              f"{want}, got {got} ({len(bad)} of {len(ps)} slots differ; block_table {table})",
                       **s.where(e), field="slot_mapping", expected=want, actual=got)
        else:
            yield None
        off += len(ps)


def _k_lens(s: _Step) -> list:
    """Keys each sequence attends to in prefill: cached (or the last token's start) + scheduled."""
    return [_start(e.get("num_cached_tokens"), e.get("num_tokens")) + (e.get("num_scheduled_tokens") or 0)
            for e in s.seqs]


@invariant("inputs.cu_seqlens_q", "cu_seqlens_q is the running sum of the scheduled counts")
def _cu_seqlens_q(r, s: _Step, gi: dict):
    got, want = gi.get("cu_seqlens_q"), _cumsum(s.counts)
    if s.phase == "prefill" or got is not None:
        yield need(got == want, f"step {s.n}: cu_seqlens_q {got}, the scheduled counts give {want}", step=s.n,
                   field="cu_seqlens_q", expected=want, actual=got)


@invariant("inputs.cu_seqlens_k", "cu_seqlens_k is the running sum of cached + scheduled (prefill) or of the "
                                  "context lengths (decode)")
def _cu_seqlens_k(r, s: _Step, gi: dict):
    got = gi.get("cu_seqlens_k")
    if s.phase == "prefill":
        want = _cumsum(_k_lens(s))
        yield need(got == want, f"step {s.n}: cu_seqlens_k {got}, cached + scheduled gives {want}", step=s.n,
                   field="cu_seqlens_k", expected=want, actual=got)
    elif got is not None:
        want = _cumsum([e.get("num_tokens") for e in s.seqs])
        yield need(got == want, f"step {s.n}: cu_seqlens_k {got}, the context lengths give {want}", step=s.n,
                   field="cu_seqlens_k", expected=want, actual=got)


@invariant("inputs.max_seqlen", "max_seqlen_q / max_seqlen_k are the longest query and key lengths (prefill)")
def _max_seqlen(r, s: _Step, gi: dict):
    if s.phase == "prefill":
        mq, mk, kl = gi.get("max_seqlen_q"), gi.get("max_seqlen_k"), _k_lens(s)
        yield need(mq == max(s.counts, default=0) and mk == max(kl, default=0),
                   f"step {s.n}: max_seqlen_q/k {mq}/{mk}, expected {max(s.counts, default=0)}/{max(kl, default=0)}",
                   step=s.n, field="max_seqlen")


@invariant("inputs.context_lens", "context_lens are the scheduled totals in decode, null in prefill")
def _context_lens(r, s: _Step, gi: dict):
    if s.phase == "prefill":
        cl = gi.get("context_lens")
        yield need(not cl, f"step {s.n}: context_lens should be null in prefill, got {_show(cl)}", step=s.n,
                   field="context_lens", expected=None, actual=cl)
        return
    want = [e.get("num_tokens") for e in s.seqs]
    got = _graph_trim(gi, list(gi.get("context_lens") or []), len(want))
    yield need(got == want, f"step {s.n}: context_lens {got}, the scheduled totals are {want}", step=s.n,
               field="context_lens", expected=want, actual=got)


@invariant("inputs.block_tables", "block_tables rows are the scheduled block tables (decode, and prefill over "
                                  "cached tokens), null otherwise")
def _block_tables(r, s: _Step, gi: dict):
    bt = gi.get("block_tables")
    if s.phase == "prefill" and not any((e.get("num_cached_tokens") or 0) > 0 for e in s.seqs):
        yield need(bt is None, f"step {s.n}: block_tables should be null in a prefill without cached tokens",
                   step=s.n, field="block_tables", expected=None, actual=bt)
        return
    why = "prefill over cached tokens" if s.phase == "prefill" else "decode"
    yield need(bt is not None, f"step {s.n}: {why} needs block_tables, got null", step=s.n, field="block_tables")
    if bt is None:
        return
    rows = list(bt or [])
    if len(rows) < len(s.seqs):
        yield need(False, f"step {s.n}: block_tables has {len(rows)} rows for {len(s.seqs)} sequences", step=s.n,
                   field="block_tables")
        return
    for e, row in zip(s.seqs, rows):
        want, got = list(e.get("block_table") or []), _strip_pad(row)
        yield need(got == want, f"step {s.n}, request {r.log.rid(e)}: block_tables row {got}, the scheduled "
                                f"block_table is {want}", **s.where(e), field="block_tables", expected=want,
                   actual=got)


@invariant("inputs.execution", "a step runs eagerly, or as a CUDA graph of a decode batch that fits when graphs "
                               "are allowed")
def _execution(r, s: _Step, gi: dict):
    ex, gb = gi.get("execution"), gi.get("graph_batch")
    ok = ex in ("eager", "graph")
    if ex == "graph":
        ok = ok and s.phase == "decode" and is_int(gb) and gb >= len(s.seqs) and r.enforce_eager is not True
    elif ex == "eager":
        ok = ok and gb is None
    yield need(ok, f"step {s.n}: execution {ex!r} with graph_batch {gb!r} in a {s.phase} step of {len(s.seqs)} "
                   f"sequences (enforce_eager {r.enforce_eager})", step=s.n, field="execution", actual=ex)


# ----------------------------------------------------------------------------- sampled, after_postprocess

@invariant("sampled", "tokens are sampled for scheduled sequences only, and an accepted token is the sampled one")
def _sampled_for_scheduled(r, s: _Step):
    extra = [k for k in s.sampled_tok if k not in s.ids]
    yield need(not extra, f"step {s.n}: sampled tokens for sequences not scheduled this step: {extra}", step=s.n)


@invariant("after.complete", "every scheduled sequence is in after_postprocess")
def _after_complete(r, s: _Step, by_sid: dict):
    for e in s.seqs:
        yield need(e.get("seq_id") in by_sid, f"step {s.n}, request {r.log.rid(e)}: scheduled but missing from "
                                              f"after_postprocess", **s.where(e))


def _completes(s: _Step, sc: dict) -> bool:
    """Whether the step computed the sequence's last prompt token (or decoded): its token is an output."""
    snt, snc, sns = sc.get("num_tokens"), sc.get("num_cached_tokens"), sc.get("num_scheduled_tokens")
    return s.phase == "decode" or (is_int(snc) and is_int(sns) and _start(snc, snt) + sns == snt)


@invariant("accepted.rule", "a token is accepted exactly when the step completes the prompt (or decodes)")
def _accepted_rule(r, s: _Step, a: dict, sc: dict):
    completes, acc = _completes(s, sc), a.get("accepted")
    yield need(acc is completes, f"step {s.n}, request {r.log.rid(a)}: accepted is {acc}, but the step "
                                 f"{'completes' if completes else 'does not complete'} the prompt (cached "
                                 f"{sc.get('num_cached_tokens')} + scheduled {sc.get('num_scheduled_tokens')} of "
                                 f"{sc.get('num_tokens')})", **s.where(a), field="accepted", expected=completes,
               actual=acc)


@invariant("accepted.counts", "an accepted token adds one output and one token")
def _accepted_counts(r, s: _Step, a: dict, sc: dict, q: _Seq):
    comp, nt, snt = a.get("num_completion_tokens"), a.get("num_tokens"), sc.get("num_tokens")
    yield need(comp == q.completion + 1 and nt == (snt or 0) + 1,
               f"step {s.n}, request {r.log.rid(a)}: an accepted token must add one output and one token (outputs "
               f"{q.completion} -> {comp}, total {snt} -> {nt})", **s.where(a), field="outputs",
               expected=q.completion + 1, actual=comp)


@invariant("discarded", "a discarded chunk candidate never becomes an output")
def _discarded(r, s: _Step, a: dict, sc: dict, q: _Seq):
    comp, nt, snt = a.get("num_completion_tokens"), a.get("num_tokens"), sc.get("num_tokens")
    yield need(comp == q.completion and nt == snt, f"step {s.n}, request {r.log.rid(a)}: a discarded chunk "
                                                   f"candidate became an output (outputs {q.completion} -> {comp}, "
                                                   f"total {snt} -> {nt})", **s.where(a), field="outputs",
               expected=q.completion, actual=comp)


@invariant("sampled")
def _accepted_is_sampled(r, s: _Step, a: dict):
    sid = a.get("seq_id")
    if s.sampled is not None and sid in s.sampled_tok:
        want = s.sampled_tok[sid]
        yield need(a.get("token_id") == want, f"step {s.n}, request {r.log.rid(a)}: token_id {a.get('token_id')} "
                                              f"differs from the sampled {want}", **s.where(a), field="token_id",
                   expected=want, actual=a.get("token_id"))


@invariant("after.cached", "after a step every computed token is cached: the chunk's end, or all but the new token")
def _after_cached(r, s: _Step, a: dict, sc: dict):
    nt, nc, acc = a.get("num_tokens"), a.get("num_cached_tokens"), a.get("accepted")
    if a.get("status") == "FINISHED":
        return
    snt, snc, sns = sc.get("num_tokens"), sc.get("num_cached_tokens"), sc.get("num_scheduled_tokens")
    if acc is False and is_int(snc) and is_int(sns):
        want = _start(snc, snt) + sns
        yield need(nc == want, f"step {s.n}, request {r.log.rid(a)}: after a discarded chunk cached should be "
                               f"{want}, got {nc}", **s.where(a), field="cached", expected=want, actual=nc)
    elif acc is True and is_int(nt):
        yield need(nc == nt - 1, f"step {s.n}, request {r.log.rid(a)}: after an accepted token cached should be "
                                 f"{nt - 1}, got {nc}", **s.where(a), field="cached", expected=nt - 1, actual=nc)


@invariant("finished.released", "a finished sequence holds no blocks and no cached tokens")
def _finished_released(r, s: _Step, a: dict):
    if a.get("status") == "FINISHED":
        table, nc = list(a.get("block_table") or []), a.get("num_cached_tokens")
        yield need(table == [] and nc == 0, f"step {s.n}, request {r.log.rid(a)}: FINISHED but still holds blocks "
                                            f"{table} / cached {nc}", **s.where(a), field="block_table", expected=[],
                   actual=table)


@invariant("max_tokens", "a request makes at most max_tokens outputs and finishes when it reaches them")
def _max_tokens(r, s: _Step, a: dict, q: _Seq):
    comp, status = a.get("num_completion_tokens"), a.get("status")
    if q.max_tokens is not None and is_int(comp):
        yield need(comp <= q.max_tokens and (comp < q.max_tokens or status == "FINISHED"),
                   f"step {s.n}, request {r.log.rid(a)}: {comp} outputs with max_tokens {q.max_tokens}, status "
                   f"{status}", **s.where(a), field="outputs", expected=q.max_tokens, actual=comp)


@invariant("refs", "a block's ref count is the number of live sequences holding it")
def _refs(r, s: _Step, a: dict, holders: dict):
    rc = a.get("ref_counts")
    if rc is None:
        return
    rid, table = r.log.rid(a), list(a.get("block_table") or [])
    ok = isinstance(rc, list) and len(rc) == len(table)
    yield need(ok, f"step {s.n}, request {rid}: {len(rc) if isinstance(rc, list) else rc!r} ref counts for "
                   f"{len(table)} blocks", step=s.n, request=rid)
    if ok:
        want = [holders.get(b, 0) for b in table]
        yield need(list(rc) == want, f"step {s.n}, request {rid}: ref_counts {list(rc)}, but {want} live sequences "
                                     f"hold blocks {table}", step=s.n, request=rid, field="ref_counts",
                   expected=want, actual=list(rc))


@invariant("prefix.content", "a prefix-cache hit lands on blocks whose KV this run computed from the same tokens")
def _prefix_content(r, s: _Step, e: dict, q: _Seq):
    nc, table = e.get("num_cached_tokens"), list(e.get("block_table") or [])
    # A fresh allocation (nothing held before this step) with cached tokens is a prefix hit.
    if not (s.phase == "prefill" and not q.table and is_int(nc) and nc > 0 and r.bs is not None):
        return
    if q.tokens is None:
        r.skip("prefix.content", "request_added carries no prompt_token_ids")
        return
    bs = r.bs
    for i in range(min(nc // bs, len(table))):       # block_table.size reports a short table
        b, want = table[i], q.tokens[i * bs:(i + 1) * bs]
        have = r.written.get(b, {})
        got = [have.get(k) for k in range(len(want))]
        if got != want:
            k = next(j for j in range(len(want)) if got[j] != want[j])
            what = ("was never computed in this run" if not have else
                    f"holds token {got[k]} at position {i * bs + k} where this prompt has {want[k]}")
            yield need(False, f"step {s.n}, request {q.request_id}: prefix-cache hit on block {b} (logical block "
                              f"{i}), but that block {what}", step=s.n, request=q.request_id, field="block_table",
                       expected=want, actual=got)
            return
    yield None


@invariant("blocks.accounting", "every block of the pool is free or held by a live sequence, never both")
def _accounting(r, s: _Step, fb, holders: dict):
    if r.nb is not None and is_int(fb):
        held, nb = len(holders), r.nb
        yield need(0 <= fb <= nb and fb + held == nb,
                   f"step {s.n}: free_blocks {fb} + {held} blocks held by live sequences = {fb + held}, but the pool "
                   f"has {nb}" + (f": {nb - fb - held} block(s) neither free nor held (leaked)"
                                  if fb + held < nb else ""),
                   step=s.n, field="free_blocks", expected=nb - held, actual=fb)


# ----------------------------------------------------------------------------- the end of the run

@invariant("engine.raised", "the engine did not raise (no engine_error event)")
def _engine_raised(r):
    errors = [e for e in r.log.events if e.get("event") == "engine_error"]
    for e in errors:
        yield need(False, f"{_where(e.get('step'))}: the engine raised {e.get('error')}: {e.get('message')}",
                   step=e.get("step") if is_int(e.get("step")) else None)
    if not errors:
        yield None


@invariant("run.end", "the log ends with one run_end event counting its steps")
def _run_end(r):
    ends, n = r.log.run_ends, len(r.log.steps)
    yield need(len(ends) == 1, f"run: expected one run_end event, found {len(ends)} (the run did not finish?)")
    if len(ends) == 1:
        got = ends[0].get("steps")
        yield need(got == n, f"run: run_end.steps is {got} but the log has {n} steps", field="steps", expected=n,
                   actual=got)


@invariant("requests.finished", "every request finishes")
def _finished(r, q: _Seq):
    yield need(q.status == "FINISHED", f"run, request {q.request_id}: ended {q.status}, not FINISHED",
               request=q.request_id, field="status", expected="FINISHED", actual=q.status)


@invariant("requests.outputs", "a request that ignores EOS ends with max_tokens outputs")
def _outputs(r, q: _Seq):
    # A request ended another way (cancelled, aborted: a finish_reason other than length/stop) legitimately
    # has fewer outputs.
    if (q.status == "FINISHED" and q.ignore_eos and q.max_tokens is not None
            and q.finish_reason in (None, "length", "stop")):
        yield need(q.completion == q.max_tokens, f"run, request {q.request_id}: finished with {q.completion} "
                                                 f"outputs, expected max_tokens={q.max_tokens} (ignore_eos)",
                   request=q.request_id, field="outputs", expected=q.max_tokens, actual=q.completion)


@invariant("blocks.returned", "every block is free again at the end")
def _returned(r):
    if r.nb is not None and r.last_free is not None:
        yield need(r.last_free == r.nb, f"run: {r.nb - r.last_free} of {r.nb} KV blocks were not returned at the "
                                        f"end (free_blocks {r.last_free})", field="free_blocks", expected=r.nb,
                   actual=r.last_free)


# ----------------------------------------------------------------------------- the replay

class _Replay:
    """The engine as the log tells it, and what the checks found."""

    def __init__(self, log: EventLog, case: Case | None, block_size: int | None, num_blocks: int | None):
        self.log, self.case, self.bs, self.nb = log, case, block_size, num_blocks
        self.max_batched = _cfg_int(log.config, "max_num_batched_tokens")
        self.max_seqs = _cfg_int(log.config, "max_num_seqs")
        self.enforce_eager = log.config.get("enforce_eager")
        self.ignore_eos = {q.id: q.ignore_eos for q in case.requests} if case is not None else {}
        self.seqs: dict[Any, _Seq] = {}
        self.written: dict = {}      # physical block -> {offset: token id} whose KV the log's steps computed
        self.free = num_blocks       # free blocks as the last step left them
        self.last_free = None        # ... as the last after_postprocess (or abort) reported them
        self.checks: list[Check] = []
        self.counts: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.skips: dict[str, str] = {}
        self.expected: dict[int, list[Check]] = {}      # index of the case's expect entry -> its checks

    # --- recording
    def run(self, fn, *args) -> bool:
        """Run one invariant function; whether everything it checked held."""
        ok = True
        for res in fn(self, *args):
            ok = self.record(fn.invariant, res) and ok
        return ok

    def record(self, name: str, res: _Failure | None) -> bool:
        self.counts[name] = self.counts.get(name, 0) + 1
        if res is None:
            return True
        kind = "policy" if name in POLICY_RULES else "invariant"
        k = self.failed[name] = self.failed.get(name, 0) + 1
        if k <= _MAX_FAILURES_PER_NAME:
            self.checks.append(Check(name, False, message=res.message, kind=kind, **res.fields))
        elif k == _MAX_FAILURES_PER_NAME + 1:
            f = res.fields
            self.checks.append(Check(name, False, f.get("step"), f.get("request"), f.get("field"),
                                     message=f"{name}: more failures not listed", kind=kind))
        return False

    def skip(self, name: str, why: str):
        self.skips.setdefault(name, why)

    # --- the log, event by event
    def replay(self):
        for fn in (_single_run, _one_run_start, _monotonic, _contiguous):
            self.run(fn)
        if self.bs is None:
            for n in ("slots", "block_table.size"):
                self.skip(n, "block size unknown: no run_start.block_size or config.kvcache_block_size")
        if self.nb is None:
            for n in ("blocks.accounting", "blocks.returned", "block_table.ids"):
                self.skip(n, "num_kvcache_blocks unknown")
        log = self.log
        # request_added and aborted events, and steps (at their first event), in log order
        agenda = [(i, self.request_added, e) for i, e in log.added]
        agenda += [(log.first_index[n], self.step, n) for n in log.steps]
        agenda += [(i, self.aborted, e) for i, e in enumerate(log.events) if e.get("event") == "aborted"]
        for _, handler, item in sorted(agenda, key=lambda x: x[0]):
            handler(item)
        self.run_end()

    def request_added(self, e: dict):
        rid, pl, toks = self.log.rid(e), e.get("prompt_len"), e.get("prompt_token_ids")
        ie = e.get("ignore_eos")
        toks = list(toks) if isinstance(toks, list) and (not is_int(pl) or len(toks) == pl) else None
        self.seqs[e.get("seq_id")] = _Seq(e.get("seq_id"), rid, e.get("max_tokens") if is_int(e.get("max_tokens"))
                                          else None, self.ignore_eos.get(rid) if ie is None else ie,
                                          pl if is_int(pl) else None, tokens=toks)

    def aborted(self, e: dict):
        """Cancelled between steps: the sequence leaves and gives its blocks back."""
        q = self.seqs.get(e.get("seq_id"))
        if q is not None:
            q.status, q.table, q.num_cached, q.finish_reason = "FINISHED", [], 0, "abort"
        if is_int(e.get("free_blocks")):
            self.free = self.last_free = e["free_blocks"]

    def step(self, n: int):
        """One engine step: its events in the order the engine emits them. A step too malformed to check
        fails step.events; the model keeps what the step's events before it set."""
        s = _Step(self.log, n)
        try:
            self.run(_step_events, s)
            if s.scheduled is not None:
                self.run(_phase, s)
                if s.phase in PHASES:
                    self.before_schedule(s)
                    s.ids = {e.get("seq_id") for e in s.seqs}
                    for p in self.log.all(n, "preempted"):
                        self.preempted(s, p)
                    self.scheduled(s)
                    if s.inputs is not None:
                        self.gpu_inputs(s)
                    self.sampled(s)
                    if s.after is not None:
                        self.after_postprocess(s)
        except Exception as ex:  # a malformed log must give a failure, not a crash
            self.record("step.events", need(False, f"step {n}: could not check this step ({type(ex).__name__}: "
                                                   f"{ex})", step=n))
        self.expect_step(n)

    def before_schedule(self, s: _Step):
        if s.before is not None:
            self.run(_free_continuity, s)
            self.run(_queues, s)
        self.run(_from_the_right_queue, s)

    def preempted(self, s: _Step, p: dict):
        self.run(_preempted_known, s, p)
        self.run(_preemptable, s, p)
        q = self.seqs.get(p.get("seq_id"))
        if q is not None:
            q.status, q.num_cached, q.table = "WAITING", 0, []

    def scheduled(self, s: _Step):
        self.run(_seq_budget, s)
        for j, e in enumerate(s.seqs):
            table = list(e.get("block_table") or [])
            q = self.seqs.get(e.get("seq_id"))
            self.run(_scheduled_known, s, e)
            if q is not None:
                self.run(_continuity, s, e, q)
            for fn in (_table_size, _table_ids) + ((_decode_shape,) if s.phase == "decode" else (_chunk_fits,)):
                self.run(fn, s, e)
            if s.phase == "prefill":
                self.run(_chunk_first_only, s, e, j)
            if q is not None:
                self.run(_prefix_content, s, e, q)
                nt, nc = e.get("num_tokens"), e.get("num_cached_tokens")
                if self.bs is not None:      # the KV this step writes, for later prefix hits
                    for p in self._written_positions(s.phase, nt, nc, e.get("num_scheduled_tokens")):
                        if 0 <= p // self.bs < len(table):
                            tok = q.tokens[p] if q.tokens is not None and p < len(q.tokens) else None
                            self.written.setdefault(table[p // self.bs], {})[p % self.bs] = tok
                q.num_tokens, q.num_cached, q.table = nt, nc, table
        self.run(_token_budget, s)

    @staticmethod
    def _written_positions(phase: str, nt, nc, ns) -> range:
        """Positions whose KV a scheduled sequence writes this step."""
        if phase == "decode":
            return range(nt - 1, nt) if is_int(nt) else range(0)
        if not (is_int(nt) and is_int(ns)):
            return range(0)
        start = _start(nc, nt)
        return range(start, start + ns)

    def gpu_inputs(self, s: _Step):
        for fn in (_num_input_ids, _positions, _slots, _cu_seqlens_q, _cu_seqlens_k, _max_seqlen, _context_lens,
                   _block_tables, _execution):
            self.run(fn, s, s.inputs)

    def sampled(self, s: _Step):
        if s.sampled is not None:
            for t in s.sampled.get("tokens") or []:
                if isinstance(t, dict):
                    s.sampled_tok[t.get("seq_id")] = t.get("token_id")
            self.run(_sampled_for_scheduled, s)

    def after_postprocess(self, s: _Step):
        reported = [a for a in (s.after.get("seqs") or []) if isinstance(a, dict)]
        by_sid = {a.get("seq_id"): a for a in reported}
        sched = {e.get("seq_id"): e for e in s.seqs}
        self.run(_after_complete, s, by_sid)
        for a in reported:
            q, sc = self.seqs.get(a.get("seq_id")), sched.get(a.get("seq_id"))
            if not self.run(_reported_known, s, a):
                continue
            table = list(a.get("block_table") or [])
            if sc is not None:
                self.run(_accepted_rule, s, a, sc)
                if a.get("accepted") is False:
                    self.run(_discarded, s, a, sc, q)
                elif a.get("accepted") is True:
                    if q.tokens is not None:
                        q.tokens.append(a.get("token_id"))
                    self.run(_accepted_counts, s, a, sc, q)
                    self.run(_accepted_is_sampled, s, a)
                self.run(_after_cached, s, a, sc)
            for fn in (_finished_released, _known_status):
                self.run(fn, s, a)
            self.run(_max_tokens, s, a, q)
            nt, nc, comp, status = (a.get(k) for k in ("num_tokens", "num_cached_tokens", "num_completion_tokens",
                                                      "status"))
            q.num_tokens = nt if is_int(nt) else q.num_tokens
            q.num_cached = nc if is_int(nc) else 0
            q.completion = comp if is_int(comp) else q.completion
            q.status = status if status in STATUSES else q.status
            q.table = table
            q.finish_reason = a.get("finish_reason", q.finish_reason)
        holders: dict = {}
        for q in self.seqs.values():
            if q.status != "FINISHED":
                for b in q.table:
                    holders[b] = holders.get(b, 0) + 1
        fb = s.after.get("free_blocks")
        self.run(_accounting, s, fb, holders)
        for a in reported:
            self.run(_refs, s, a, holders)
        if is_int(fb):
            self.free = self.last_free = fb

    def run_end(self):
        self.run(_engine_raised)
        self.run(_run_end)
        for q in self.seqs.values():
            self.run(_finished, q)
            self.run(_outputs, q)
        if not any(q.ignore_eos for q in self.seqs.values()):
            self.skip("requests.outputs", "no request is known to ignore EOS")
        self.run(_returned)
        if self.case is not None:
            self.case_requests()
            for i, x in enumerate(self.case.expect or []):
                if "final" in x:
                    self.expect_final(i, x["final"])
                elif x["step"] not in self.log.steps:
                    self.missing(i, x["step"], None, "step", f"not in the log (the run has {len(self.log.steps)} "
                                                             f"steps)")

    def finish(self) -> list[Check]:
        out = self.checks + [c for i in sorted(self.expected) for c in self.expected[i]]
        for name in INVARIANTS:
            if self.failed.get(name):
                continue
            n, kind = self.counts.get(name, 0), "policy" if name in POLICY_RULES else "invariant"
            if n:
                out.append(Check(name, True, message=f"{name}: held {n} time(s)", kind=kind))
            else:
                why = self.skips.get(name, "nothing to check in this log")
                out.append(Check(name, True, message=f"{name}: not checked ({why})", kind=kind, skipped=True))
        return out

    # --- the case: its requests and its expected states
    def case_requests(self):
        """The log ran the case's requests, with their max_tokens, and `after` was respected."""
        log, case = self.log, self.case
        added = {log.rid(e): (i, e) for i, e in log.added}
        for q in case.requests:
            if q.id not in added:
                self.checks.append(Check("case.requests", False, None, q.id, "request_added",
                                         message=f"run, request {q.id}: never added to the engine", kind="case"))
                continue
            i, e = added[q.id]
            for fld, want in (("max_tokens", q.max_tokens), ("prompt_len", q.prompt_len)):
                if want is None:  # a text prompt's length is known only after tokenizing
                    continue
                ok = e.get(fld) == want
                self.checks.append(Check("case.requests", ok, None, q.id, fld, want, e.get(fld),
                                         f"run, request {q.id}, {fld}: expected {want}, got {e.get(fld)}" if not ok
                                         else f"request {q.id} added with {fld} {want}", "case"))
            if q.after is not None:
                finished_at = next((j for j, ev in enumerate(log.events) if ev.get("event") == "after_postprocess"
                                    and any(isinstance(a, dict) and log.rid(a) == q.after
                                            and a.get("status") == "FINISHED" for a in ev.get("seqs") or [])), None)
                ok = finished_at is not None and i > finished_at
                self.checks.append(Check("case.after", ok, None, q.id, "after", q.after, None,
                                         f"run, request {q.id}: added before {q.after} finished" if not ok
                                         else f"request {q.id} added after {q.after} finished", "case"))
        extra = sorted(set(added) - set(case.request_ids))
        if extra:
            self.checks.append(Check("case.requests", False, None, None, "request_added", None, extra,
                                     f"run: requests not in the case were added: {', '.join(extra)}", "case"))

    def compare(self, i: int, step, request, fld, expected, actual):
        where = _where(step, request)
        ok = expected == actual
        self.expected.setdefault(i, []).append(Check(
            "expect", ok, step, request, fld, expected, actual,
            f"{where}, {fld}: {_show(expected)}" if ok else
            f"{where}, {fld}: expected {_show(expected)}, got {_show(actual)}", "expect"))

    def missing(self, i: int, step, request, fld, what):
        self.expected.setdefault(i, []).append(Check("expect", False, step, request, fld, None, None,
                                                     f"{_where(step, request)}, {fld}: {what}", "expect"))

    def expect_step(self, st: int):
        """Compare step `st` with the case's entry for it, field by field, as the log reports it."""
        found = [(i, x) for i, x in enumerate(self.case.expect or []) if x.get("step") == st] if self.case else []
        if not found:
            return
        i, x = found[0]
        log = self.log
        sched = log.one(st, "scheduled") or {}
        sseqs = [e for e in sched.get("seqs") or [] if isinstance(e, dict)]
        if "phase" in x:
            self.compare(i, st, None, "phase", x["phase"], sched.get("phase"))
        if "scheduled" in x:
            self.compare(i, st, None, "scheduled", list(x["scheduled"]), [log.rid(e) for e in sseqs])
            by_rid = {log.rid(e): e for e in sseqs}
            for rid, fields in x["scheduled"].items():
                if rid in by_rid:      # else the id list above already differs
                    for f, v in fields.items():
                        self.compare(i, st, rid, f"scheduled.{f}" if f != "scheduled" else "scheduled", v,
                                     _field_value(by_rid[rid], f, _SCHED_MAP))
        if "preempted" in x:
            self.compare(i, st, None, "preempted", x["preempted"], [log.rid(p) for p in log.all(st, "preempted")])
        for key, event, what in (("before", "before_schedule", "no before_schedule event"),
                                 ("inputs", "gpu_inputs", "no gpu_inputs event")):
            if key in x:
                e = log.one(st, event)
                if e is None:
                    self.missing(i, st, None, key, what)
                    continue
                for f, v in x[key].items():
                    if key == "inputs":
                        self.compare(i, st, None, f, v, e.get(f))
                    elif f == "free":
                        self.compare(i, st, None, "before.free", v, e.get("free_blocks"))
                    else:
                        self.compare(i, st, None, f"before.{f}", v, log.rids(e.get(f)))
        ap = log.one(st, "after_postprocess")
        a_by_rid = {log.rid(a): a for a in ((ap or {}).get("seqs") or []) if isinstance(a, dict)}
        for rid, fields in (x.get("after") or {}).items():
            if rid not in a_by_rid:
                self.missing(i, st, rid, "after", "missing from after_postprocess")
                continue
            for f, v in fields.items():
                self.compare(i, st, rid, f, v, _field_value(a_by_rid[rid], f, _AFTER_MAP))
        for key, fld in (("refs", "ref_counts"), ("released", "released_ref_counts")):
            for rid, v in (x.get(key) or {}).items():
                a = a_by_rid.get(rid)
                if a is None:
                    self.missing(i, st, rid, key, "missing from after_postprocess")
                elif a.get(fld) is None:
                    self.missing(i, st, rid, key, f"after_postprocess carries no {fld}")
                else:
                    self.compare(i, st, rid, key, v, a.get(fld))
        if "free" in x:
            if ap is None:
                self.missing(i, st, None, "free", "no after_postprocess event")
            else:
                self.compare(i, st, None, "free", x["free"], ap.get("free_blocks"))

    def expect_final(self, i: int, final: dict):
        """Each request's last state in the log against the case's `final` entry."""
        log = self.log
        for rid, fields in final.items():
            last = None
            for st in sorted(log.steps):
                for a in (log.one(st, "after_postprocess") or {}).get("seqs") or []:
                    if isinstance(a, dict) and log.rid(a) == rid:
                        last = a
            if last is None:
                self.missing(i, None, rid, "final", "the request never appears in after_postprocess")
                continue
            for f, v in fields.items():
                self.compare(i, None, rid, f"final.{f}", v, _field_value(last, f, _AFTER_MAP))


# The case's field names -> the event's (None: the number of blocks in block_table).
_SCHED_MAP = {"total": "num_tokens", "cached": "num_cached_tokens", "scheduled": "num_scheduled_tokens", "blocks": None}
_AFTER_MAP = {"total": "num_tokens", "cached": "num_cached_tokens", "outputs": "num_completion_tokens",
              "status": "status", "blocks": None, "accepted": "accepted"}


def _field_value(entry: dict, f: str, mapping: dict):
    key = mapping[f]
    return len(entry.get("block_table") or []) if key is None else entry.get(key)


# ----------------------------------------------------------------------------- entry point

def validate(events: list[dict], case: Case | None = None, *, block_size: int | None = None,
             num_kvcache_blocks: int | None = None, expect_changes: bool = False,
             why_changes: str = "") -> Report:
    """Check an event log: the case's expectations (if any) and the engine invariants.

    expect_changes: the run was meant to differ from the case (an override, a patched engine); the
    expectations it misses become the report's `changes` and the verdict CHANGED instead of FAIL.

    block_size / num_kvcache_blocks default to run_start's block_size / num_kvcache_blocks,
    then its config's kvcache_block_size / num_kvcache_blocks (when > 0), then the case's engine.
    """
    events = list(events or [])
    schema: list[Check] = []
    bad = 0
    for i, e in enumerate(events):
        probs = event_problems(e)
        if probs:
            bad += 1
            if bad <= _MAX_FAILURES_PER_NAME:
                st = e.get("step") if isinstance(e, dict) else None
                schema.append(Check("schema", False, st if is_int(st) else None, message=f"event #{i + 1} "
                                    f"({e.get('event') if isinstance(e, dict) else '?'}): {'; '.join(probs)}",
                                    kind="schema"))
    if not bad:
        schema.append(Check("schema", True, message=f"schema: {len(events)} events are v1", kind="schema"))
    log = EventLog(events)
    rs, cfg = log.run_start, log.config
    eng = case.engine if case is not None else {}
    bs = block_size or (rs.get("block_size") if is_int(rs.get("block_size")) else None) \
        or _cfg_int(cfg, "kvcache_block_size") or _cfg_int(eng, "kvcache_block_size")
    nb = num_kvcache_blocks or (rs.get("num_kvcache_blocks") if is_int(rs.get("num_kvcache_blocks")) else None)
    if nb is None:
        nb = next((v for v in (_cfg_int(cfg, "num_kvcache_blocks"), _cfg_int(eng, "num_kvcache_blocks"))
                   if v is not None and v > 0), None)
    replay = _Replay(log, case, bs, nb)
    replay.replay()
    run = next((e.get("run") for e in log.events if e.get("run") is not None), None)
    return Report(checks=schema + replay.finish(), run=run, steps=len(log.steps),
                  case=case.name if case is not None else None, expect_changes=expect_changes,
                  why_changes=why_changes)
