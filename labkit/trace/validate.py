"""Checking an engine event log (SPEC section 6) against a case's expectations and invariants.

    events = read_jsonl("runs/.../events.jsonl")       # labkit.trace.events; LabkitError on a bad line
    report = validate(events, load_case("chunk"))      # Report(checks=[Check, ...])
    report.ok, report.first_failure, report.failures
    (steps_table and write_tsv, the readable views, live in labkit.trace.tables)

`validate` does two things:
  (a) every field a case's `expect` lists is compared (kind "expect"), one Check per field;
  (b) invariants that hold for any log of a nano-vLLM-style engine (kind "invariant"): slots
      follow the block tables, cu_seqlens follow the scheduled counts, prefill positions start
      at the cached count, decode shapes, a discarded chunk candidate never becomes an output,
      block accounting, every request finishes and every block comes back, etc.
For (b) a failure is reported per occurrence (capped per invariant) and every invariant that
never failed gets one passing Check saying how many times it was checked.

The verdict (`report.verdict`): FAIL when an invariant, the schema or the case's requests fail;
RECORDED for a case without expectations; PASS when every expectation holds; and when some do
not, CHANGED if the run was meant to change them (`expect_changes`: an override, a patched
engine; `report.changes` is then the diff, one `change_text` line per field) or FAIL if not.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from labkit.trace.cases import Case, format_positions
from labkit.trace.events import PHASES, STATUSES, EventLog, event_problems, is_int

# Every invariant validate() checks; each one that never fails gets one passing Check.
INVARIANTS = (
    "log.single_run", "log.run_start", "time.monotonic", "steps.contiguous", "step.events",
    "seq.known", "phase", "phase.mixed", "queues", "free.continuity", "preempted",
    "state.continuity", "block_table.size", "block_table.ids", "decode.shape",
    "chunk.fits", "policy.chunk_first_only", "budget", "inputs.num_input_ids", "inputs.positions", "slots",
    "inputs.cu_seqlens_q", "inputs.cu_seqlens_k", "inputs.max_seqlen", "inputs.context_lens",
    "inputs.block_tables", "inputs.execution", "sampled", "after.complete", "accepted.rule",
    "accepted.counts", "discarded", "after.cached", "finished.released", "max_tokens",
    "refs", "prefix.content", "blocks.accounting", "engine.raised", "run.end", "requests.finished",
    "requests.outputs", "blocks.returned",
)
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


def _cfg_int(cfg: dict, key: str):
    v = cfg.get(key) if isinstance(cfg, dict) else None
    return v if is_int(v) else None


def _show(v) -> str:
    if isinstance(v, list) and len(v) > 12 and all(is_int(x) for x in v):
        return format_positions(v)
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


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


class _Collector:
    def __init__(self):
        self.checks: list[Check] = []
        self.counts: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.skips: dict[str, str] = {}

    def ran(self, name: str, n: int = 1):
        self.counts[name] = self.counts.get(name, 0) + n

    def fail(self, name: str, message: str, *, step=None, request=None, field=None,
             expected=None, actual=None, kind="invariant"):
        if name in POLICY_RULES:
            kind = "policy"
        self.ran(name)
        k = self.failed.get(name, 0)
        self.failed[name] = k + 1
        if k < _MAX_FAILURES_PER_NAME:
            self.checks.append(Check(name, False, step, request, field, expected, actual,
                                     message, kind))
        elif k == _MAX_FAILURES_PER_NAME:
            self.checks.append(Check(name, False, step, request, field, None, None,
                                     f"{name}: more failures not listed", kind))

    def check(self, cond: bool, name: str, message: str, **kw) -> bool:
        if cond:
            self.ran(name)
            return True
        self.fail(name, message, **kw)
        return False

    def skip(self, name: str, why: str):
        self.skips.setdefault(name, why)

    def finish(self) -> list[Check]:
        out = list(self.checks)
        for name in INVARIANTS:
            if self.failed.get(name):
                continue
            n = self.counts.get(name, 0)
            kind = "policy" if name in POLICY_RULES else "invariant"
            if n:
                out.append(Check(name, True, message=f"{name}: held {n} time(s)", kind=kind))
            else:
                why = self.skips.get(name, "nothing to check in this log")
                out.append(Check(name, True, message=f"{name}: not checked ({why})", kind=kind, skipped=True))
        return out


def _where(step, request=None) -> str:
    s = f"step {step}" if step is not None else "run"
    return f"{s}, request {request}" if request is not None else s


# ----------------------------------------------------------------------------- invariants

@dataclass
class _Seq:
    seq_id: Any
    request_id: str
    prompt_len: int | None
    max_tokens: int | None
    ignore_eos: bool | None
    num_tokens: int | None
    num_cached: int = 0
    completion: int = 0
    status: str = "WAITING"
    table: list = field(default_factory=list)
    finish_reason: str | None = None
    tokens: list | None = None       # prompt + accepted ids, when request_added lists the prompt


def _written_positions(phase: str, nt, nc, ns) -> range:
    """Positions whose KV a scheduled sequence writes this step."""
    if phase == "decode":
        return range(nt - 1, nt) if is_int(nt) else range(0)
    if not (is_int(nt) and is_int(ns)):
        return range(0)
    start = _start(nc, nt)
    return range(start, start + ns)


def _check_prefix_hit(col: "_Collector", st: int, s: "_Seq", table: list, nc: int, bs: int,
                      written: dict) -> None:
    """A prefix-cache hit must land on blocks whose KV was computed from this sequence's own tokens.
    `written` maps a physical block to {offset: token id} as this log's steps filled it."""
    if s.tokens is None:
        col.skip("prefix.content", "request_added carries no prompt_token_ids")
        return
    for i in range(nc // bs):
        if i >= len(table):
            break  # block_table.size reports a short table
        b = table[i]
        want = s.tokens[i * bs:(i + 1) * bs]
        have = written.get(b, {})
        got = [have.get(k) for k in range(len(want))]
        if got != want:
            k = next(j for j in range(len(want)) if got[j] != want[j])
            what = ("was never computed in this run" if not have else
                    f"holds token {got[k]} at position {i * bs + k} where this prompt has {want[k]}")
            col.fail("prefix.content",
                     f"step {st}, request {s.request_id}: prefix-cache hit on block {b} (logical block "
                     f"{i}), but that block {what}", step=st, request=s.request_id,
                     field="block_table", expected=want, actual=got)
            return
    col.ran("prefix.content")


def _check_invariants(log: EventLog, col: _Collector, block_size: int | None,
                      num_blocks: int | None, ignore_eos: dict[str, bool]) -> None:
    cfg = log.config
    max_batched = _cfg_int(cfg, "max_num_batched_tokens")
    max_seqs = _cfg_int(cfg, "max_num_seqs")
    enforce_eager = cfg.get("enforce_eager") if isinstance(cfg, dict) else None

    runs = {e.get("run") for e in log.events}
    col.check(len(runs) <= 1, "log.single_run",
              f"the log mixes {len(runs)} runs: {', '.join(sorted(map(str, runs)))}")
    col.check(len(log.run_starts) == 1, "log.run_start",
              f"run: expected one run_start event, found {len(log.run_starts)}")
    last_t = None
    for e in log.events:
        t = e.get("t_ns")
        if is_int(t):
            if last_t is not None and t < last_t:
                col.fail("time.monotonic", f"run: t_ns goes backwards at {e.get('event')} "
                                           f"(step {e.get('step')}): {last_t} -> {t}",
                         step=e.get("step"))
            else:
                col.ran("time.monotonic")
            last_t = t

    steps = sorted(log.steps)
    if steps:
        col.check(steps == list(range(1, len(steps) + 1)), "steps.contiguous",
                  f"run: steps are not numbered 1..{len(steps)} (found {steps[:5]}...)")
    if block_size is None:
        for n in ("slots", "block_table.size"):
            col.skip(n, "block size unknown: no run_start.block_size or config.kvcache_block_size")
    if num_blocks is None:
        for n in ("blocks.accounting", "blocks.returned", "block_table.ids"):
            col.skip(n, "num_kvcache_blocks unknown")

    seqs: dict[Any, _Seq] = {}
    written: dict = {}   # physical block -> {offset: token id} whose KV the log's steps computed
    # Work through request_added events and steps in log order.
    agenda = [(i, "add", e) for i, e in log.added] + [(log.first_index[s], "step", s) for s in steps]
    agenda += [(i, "abort", e) for i, e in enumerate(log.events) if e.get("event") == "aborted"]
    agenda.sort(key=lambda x: x[0])
    prev_free = num_blocks
    last_free = None
    for _, kind, item in agenda:
        if kind == "add":
            e = item
            sid = e.get("seq_id")
            rid = log.rid(e)
            ie = e.get("ignore_eos")
            if ie is None:
                ie = ignore_eos.get(rid)
            pl = e.get("prompt_len")
            toks = e.get("prompt_token_ids")
            toks = list(toks) if isinstance(toks, list) and (not is_int(pl) or len(toks) == pl) else None
            seqs[sid] = _Seq(sid, rid, pl if is_int(pl) else None,
                             e.get("max_tokens") if is_int(e.get("max_tokens")) else None,
                             ie, pl if is_int(pl) else None, tokens=toks)
            continue
        if kind == "abort":   # cancelled between steps: it leaves and gives its blocks back
            gone = seqs.get(item.get("seq_id"))
            if gone is not None:
                gone.status, gone.table, gone.num_cached, gone.finish_reason = "FINISHED", [], 0, "abort"
            if is_int(item.get("free_blocks")):
                prev_free = last_free = item["free_blocks"]
            continue
        st = item
        try:
            prev_free, lf = _check_step(log, col, st, seqs, block_size, num_blocks, max_batched,
                                        max_seqs, enforce_eager, prev_free, written)
            if lf is not None:
                last_free = lf
        except Exception as ex:  # a malformed log must give a failure, not a crash
            col.fail("step.events", f"step {st}: could not check this step "
                                    f"({type(ex).__name__}: {ex})", step=st)

    # end of run
    errors = [e for e in log.events if e.get("event") == "engine_error"]
    for e in errors:
        col.fail("engine.raised", f"{_where(e.get('step'))}: the engine raised {e.get('error')}: "
                                  f"{e.get('message')}", step=e.get("step") if is_int(e.get("step")) else None)
    if not errors:
        col.ran("engine.raised")
    n_steps = len(steps)
    if col.check(len(log.run_ends) == 1, "run.end",
                 f"run: expected one run_end event, found {len(log.run_ends)} "
                 f"(the run did not finish?)"):
        rs = log.run_ends[0].get("steps")
        col.check(rs == n_steps, "run.end",
                  f"run: run_end.steps is {rs} but the log has {n_steps} steps",
                  field="steps", expected=n_steps, actual=rs)
    for s in seqs.values():
        col.check(s.status == "FINISHED", "requests.finished",
                  f"run, request {s.request_id}: ended {s.status}, not FINISHED",
                  request=s.request_id, field="status", expected="FINISHED", actual=s.status)
        # A request ended another way (cancelled, aborted: a finish_reason other than
        # length/stop) legitimately has fewer outputs.
        if (s.status == "FINISHED" and s.ignore_eos and s.max_tokens is not None
                and s.finish_reason in (None, "length", "stop")):
            col.check(s.completion == s.max_tokens, "requests.outputs",
                      f"run, request {s.request_id}: finished with {s.completion} outputs, "
                      f"expected max_tokens={s.max_tokens} (ignore_eos)",
                      request=s.request_id, field="outputs", expected=s.max_tokens,
                      actual=s.completion)
    if not any(s.ignore_eos for s in seqs.values()):
        col.skip("requests.outputs", "no request is known to ignore EOS")
    if num_blocks is not None and last_free is not None:
        col.check(last_free == num_blocks, "blocks.returned",
                  f"run: {num_blocks - last_free} of {num_blocks} KV blocks were not returned "
                  f"at the end (free_blocks {last_free})",
                  field="free_blocks", expected=num_blocks, actual=last_free)


def _check_step(log: EventLog, col: _Collector, st: int, seqs: dict, bs, num_blocks, max_batched,
                max_seqs, enforce_eager, prev_free, written: dict):
    evs = log.steps[st]
    for name, lo, hi in (("scheduled", 1, 1), ("gpu_inputs", 1, 1), ("after_postprocess", 1, 1),
                         ("sampled", 1, 1), ("before_schedule", 0, 1)):
        n = len(evs.get(name, []))
        col.check(lo <= n <= hi, "step.events",
                  f"step {st}: {n} {name} events (expected {'exactly one' if lo == hi else 'at most one'})",
                  step=st, field=name)
    sched = log.one(st, "scheduled")
    if sched is None:
        return prev_free, None
    phase = sched.get("phase")
    if not col.check(phase in PHASES, "phase", f"step {st}: phase {phase!r} is not prefill or decode",
                     step=st, field="phase", actual=phase):
        return prev_free, None
    sseqs = [s for s in (sched.get("seqs") or []) if isinstance(s, dict)]
    col.check(bool(sseqs), "phase", f"step {st}: nothing scheduled", step=st)

    # before_schedule: queues and free blocks as the previous step left them
    before = log.one(st, "before_schedule")
    if before is not None:
        fb = before.get("free_blocks")
        if prev_free is not None:
            col.check(fb == prev_free, "free.continuity",
                      f"step {st}: before_schedule.free_blocks {fb}, but the previous step "
                      f"left {prev_free}", step=st, field="free_blocks", expected=prev_free, actual=fb)
        live = [s for s in seqs.values() if s.status != "FINISHED"]
        want_w = sorted(str(s.seq_id) for s in live if s.status == "WAITING")
        want_r = sorted(str(s.seq_id) for s in live if s.status == "RUNNING")
        got_w = sorted(str(x) for x in before.get("waiting") or [])
        got_r = sorted(str(x) for x in before.get("running") or [])
        if got_w == want_w and got_r == want_r:
            col.ran("queues")
        else:
            names = {str(s.seq_id): s.request_id for s in seqs.values()}

            def _n(ids):
                return [names.get(i, f"seq{i}") for i in ids]
            col.fail("queues", f"step {st}: before_schedule has waiting {_n(got_w)} running "
                               f"{_n(got_r)}, but the states so far give waiting {_n(want_w)} "
                               f"running {_n(want_r)}", step=st)
        waiting_set = {str(x) for x in before.get("waiting") or []}
        running_set = {str(x) for x in before.get("running") or []}
        for s in sseqs:
            src = waiting_set if phase == "prefill" else running_set
            col.check(str(s.get("seq_id")) in src, "phase.mixed",
                      f"step {st}, request {log.rid(s)}: scheduled in a {phase} step but it was "
                      f"not {'waiting' if phase == 'prefill' else 'running'} before scheduling",
                      step=st, request=log.rid(s))
    else:
        for s in sseqs:
            prev = seqs.get(s.get("seq_id"))
            if prev is not None:
                want = "WAITING" if phase == "prefill" else "RUNNING"
                col.check(prev.status == want, "phase.mixed",
                          f"step {st}, request {prev.request_id}: scheduled in a {phase} step "
                          f"while {prev.status}", step=st, request=prev.request_id)

    # preemptions
    sched_ids = {s.get("seq_id") for s in sseqs}
    for p in log.all(st, "preempted"):
        sid = p.get("seq_id")
        rid = log.rid(p)
        ok = col.check(sid in seqs, "seq.known", f"step {st}, request {rid}: preempted an unknown "
                                                 f"sequence {sid}", step=st, request=rid)
        col.check(sid not in sched_ids, "preempted",
                  f"step {st}, request {rid}: preempted and scheduled in the same step",
                  step=st, request=rid)
        if ok:
            s = seqs[sid]
            col.check(s.status == "RUNNING", "preempted",
                      f"step {st}, request {rid}: preempted while {s.status}", step=st, request=rid)
            s.status, s.num_cached, s.table = "WAITING", 0, []

    # scheduled states
    if max_seqs is not None:
        col.check(len(sseqs) <= max_seqs, "budget",
                  f"step {st}: {len(sseqs)} sequences scheduled, max_num_seqs is {max_seqs}",
                  step=st, field="max_num_seqs", expected=max_seqs, actual=len(sseqs))
    total_sched = 0
    for j, s in enumerate(sseqs):
        rid = log.rid(s)
        sid = s.get("seq_id")
        nt, nc, ns = s.get("num_tokens"), s.get("num_cached_tokens"), s.get("num_scheduled_tokens")
        table = list(s.get("block_table") or [])
        total_sched += ns if is_int(ns) else 0
        prev = seqs.get(sid)
        col.check(prev is not None, "seq.known",
                  f"step {st}, request {rid}: seq {sid} scheduled without a request_added event",
                  step=st, request=rid)
        if prev is not None:
            col.check(nt == prev.num_tokens or prev.num_tokens is None, "state.continuity",
                      f"step {st}, request {rid}: scheduled with num_tokens {nt}, but the "
                      f"previous state had {prev.num_tokens}", step=st, request=rid,
                      field="num_tokens", expected=prev.num_tokens, actual=nt)
            if prev.table:
                col.check(nc == prev.num_cached and table[:len(prev.table)] == prev.table,
                          "state.continuity",
                          f"step {st}, request {rid}: holds blocks {prev.table} with cached "
                          f"{prev.num_cached}, scheduled with blocks {table} cached {nc}",
                          step=st, request=rid, field="block_table")
        if bs is not None and is_int(nt):
            want = -(-nt // bs)
            col.check(len(table) == want, "block_table.size",
                      f"step {st}, request {rid}: {len(table)} blocks for {nt} tokens "
                      f"(block size {bs} needs {want})", step=st, request=rid, field="blocks",
                      expected=want, actual=len(table))
        bad = [b for b in table if not is_int(b) or b < 0 or (num_blocks is not None and b >= num_blocks)]
        col.check(not bad and len(set(table)) == len(table), "block_table.ids",
                  f"step {st}, request {rid}: block table {table} has invalid or repeated ids",
                  step=st, request=rid, field="block_table", actual=table)
        if phase == "decode":
            col.check(ns == 1 and is_int(nt) and is_int(nc) and nt == nc + 1, "decode.shape",
                      f"step {st}, request {rid}: decode needs scheduled 1 and total = cached + 1, "
                      f"got total {nt} cached {nc} scheduled {ns}", step=st, request=rid)
        else:
            okp = is_int(ns) and is_int(nc) and is_int(nt) and ns >= 1 and _start(nc, nt) + ns <= nt
            col.check(okp, "chunk.fits",
                      f"step {st}, request {rid}: prefill of {ns} tokens from cached {nc} does not "
                      f"fit total {nt}", step=st, request=rid)
            if okp and j > 0:
                col.check(_start(nc, nt) + ns == nt, "policy.chunk_first_only",
                          f"step {st}, request {rid}: {rid} is chunked ({ns} of {nt - nc} tokens) but is "
                          f"not first in the prefill batch (nano chunks only the first)", step=st, request=rid)
        if prev is not None:
            # A fresh allocation (nothing held before this step) with cached tokens is a prefix hit.
            if phase == "prefill" and not prev.table and is_int(nc) and nc > 0 and bs is not None:
                _check_prefix_hit(col, st, prev, table, nc, bs, written)
            if bs is not None:
                for p in _written_positions(phase, nt, nc, ns):
                    if 0 <= p // bs < len(table):
                        tok = prev.tokens[p] if prev.tokens is not None and p < len(prev.tokens) else None
                        written.setdefault(table[p // bs], {})[p % bs] = tok
            prev.num_tokens, prev.num_cached, prev.table = nt, nc, table
    if max_batched is not None:
        col.check(total_sched <= max_batched, "budget",
                  f"step {st}: {total_sched} tokens scheduled, max_num_batched_tokens is {max_batched}",
                  step=st, field="max_num_batched_tokens", expected=max_batched, actual=total_sched)

    gi = log.one(st, "gpu_inputs")
    if gi is not None:
        _check_inputs(log, col, st, phase, sseqs, gi, bs, enforce_eager)

    # sampled
    sampled = log.one(st, "sampled")
    sampled_tok: dict = {}
    if sampled is not None:
        for t in sampled.get("tokens") or []:
            if isinstance(t, dict):
                sampled_tok[t.get("seq_id")] = t.get("token_id")
        extra = [k for k in sampled_tok if k not in sched_ids]
        col.check(not extra, "sampled", f"step {st}: sampled tokens for sequences not scheduled "
                                        f"this step: {extra}", step=st)

    # after_postprocess
    ap = log.one(st, "after_postprocess")
    if ap is None:
        return prev_free, None
    aseqs = [a for a in (ap.get("seqs") or []) if isinstance(a, dict)]
    by_sid = {a.get("seq_id"): a for a in aseqs}
    sched_by_sid = {s.get("seq_id"): s for s in sseqs}
    for s in sseqs:
        col.check(s.get("seq_id") in by_sid, "after.complete",
                  f"step {st}, request {log.rid(s)}: scheduled but missing from after_postprocess",
                  step=st, request=log.rid(s))
    for a in aseqs:
        sid = a.get("seq_id")
        rid = log.rid(a)
        prev = seqs.get(sid)
        sc = sched_by_sid.get(sid)
        if prev is None:
            col.fail("seq.known", f"step {st}, request {rid}: after_postprocess reports unknown "
                                  f"seq {sid}", step=st, request=rid)
            continue
        nt, nc = a.get("num_tokens"), a.get("num_cached_tokens")
        comp, status = a.get("num_completion_tokens"), a.get("status")
        table = list(a.get("block_table") or [])
        acc = a.get("accepted")
        if sc is not None:
            snt, snc, sns = sc.get("num_tokens"), sc.get("num_cached_tokens"), sc.get("num_scheduled_tokens")
            completes = phase == "decode" or (is_int(snc) and is_int(sns) and _start(snc, snt) + sns == snt)
            col.check(acc is completes, "accepted.rule",
                      f"step {st}, request {rid}: accepted is {acc}, but the step "
                      f"{'completes' if completes else 'does not complete'} the prompt "
                      f"(cached {snc} + scheduled {sns} of {snt})", step=st, request=rid,
                      field="accepted", expected=completes, actual=acc)
            if acc is False:
                col.check(comp == prev.completion and nt == snt, "discarded",
                          f"step {st}, request {rid}: a discarded chunk candidate became an output "
                          f"(outputs {prev.completion} -> {comp}, total {snt} -> {nt})",
                          step=st, request=rid, field="outputs", expected=prev.completion, actual=comp)
                if status != "FINISHED" and is_int(snc) and is_int(sns):
                    want_c = _start(snc, snt) + sns
                    col.check(nc == want_c, "after.cached",
                              f"step {st}, request {rid}: after a discarded chunk cached should be "
                              f"{want_c}, got {nc}", step=st, request=rid, field="cached",
                              expected=want_c, actual=nc)
            elif acc is True:
                if prev.tokens is not None:
                    prev.tokens.append(a.get("token_id"))
                col.check(comp == prev.completion + 1 and nt == (snt or 0) + 1, "accepted.counts",
                          f"step {st}, request {rid}: an accepted token must add one output and one "
                          f"token (outputs {prev.completion} -> {comp}, total {snt} -> {nt})",
                          step=st, request=rid, field="outputs", expected=prev.completion + 1,
                          actual=comp)
                if sampled is not None and sid in sampled_tok:
                    col.check(a.get("token_id") == sampled_tok[sid], "sampled",
                              f"step {st}, request {rid}: token_id {a.get('token_id')} differs from "
                              f"the sampled {sampled_tok[sid]}", step=st, request=rid,
                              field="token_id", expected=sampled_tok[sid], actual=a.get("token_id"))
                if status != "FINISHED" and is_int(nt):
                    col.check(nc == nt - 1, "after.cached",
                              f"step {st}, request {rid}: after an accepted token cached should be "
                              f"{nt - 1}, got {nc}", step=st, request=rid, field="cached",
                              expected=nt - 1, actual=nc)
        if status == "FINISHED":
            col.check(table == [] and nc == 0, "finished.released",
                      f"step {st}, request {rid}: FINISHED but still holds blocks {table} / cached {nc}",
                      step=st, request=rid, field="block_table", expected=[], actual=table)
        col.check(status in STATUSES, "phase", f"step {st}, request {rid}: unknown status {status!r}",
                  step=st, request=rid, field="status", actual=status)
        if prev.max_tokens is not None and is_int(comp):
            col.check(comp <= prev.max_tokens and (comp < prev.max_tokens or status == "FINISHED"),
                      "max_tokens",
                      f"step {st}, request {rid}: {comp} outputs with max_tokens {prev.max_tokens}, "
                      f"status {status}", step=st, request=rid, field="outputs",
                      expected=prev.max_tokens, actual=comp)
        prev.num_tokens = nt if is_int(nt) else prev.num_tokens
        prev.num_cached = nc if is_int(nc) else 0
        prev.completion = comp if is_int(comp) else prev.completion
        prev.status = status if status in STATUSES else prev.status
        prev.table = table
        prev.finish_reason = a.get("finish_reason", prev.finish_reason)

    # block accounting over all live sequences
    fb = ap.get("free_blocks")
    holders: dict = {}
    for s in seqs.values():
        if s.status != "FINISHED":
            for b in s.table:
                holders[b] = holders.get(b, 0) + 1
    if num_blocks is not None and is_int(fb):
        # Every block is either free (a freed block keeps its hash, but it is back in the free list) or
        # held by a live sequence: more is double counting, less is a leak (e.g. a preemption that did
        # not give its blocks back).
        held = len(holders)
        col.check(0 <= fb <= num_blocks and fb + held == num_blocks, "blocks.accounting",
                  f"step {st}: free_blocks {fb} + {held} blocks held by live sequences = {fb + held}, "
                  f"but the pool has {num_blocks}"
                  + (f": {num_blocks - fb - held} block(s) neither free nor held (leaked)"
                     if fb + held < num_blocks else ""),
                  step=st, field="free_blocks", expected=num_blocks - held, actual=fb)
    for a in aseqs:
        rc = a.get("ref_counts")
        if rc is None:
            continue
        rid = log.rid(a)
        table = list(a.get("block_table") or [])
        if not col.check(isinstance(rc, list) and len(rc) == len(table), "refs",
                         f"step {st}, request {rid}: {len(rc) if isinstance(rc, list) else rc!r} "
                         f"ref counts for {len(table)} blocks", step=st, request=rid):
            continue
        want = [holders.get(b, 0) for b in table]
        col.check(list(rc) == want, "refs",
                  f"step {st}, request {rid}: ref_counts {list(rc)}, but {want} live sequences "
                  f"hold blocks {table}", step=st, request=rid, field="ref_counts",
                  expected=want, actual=list(rc))
    return (fb if is_int(fb) else prev_free), (fb if is_int(fb) else None)


def _check_inputs(log: EventLog, col: _Collector, st, phase, sseqs, gi, bs, enforce_eager):
    counts = [s.get("num_scheduled_tokens") or 0 for s in sseqs]
    T = sum(counts)
    n_in = gi.get("num_input_ids")
    col.check(n_in == T, "inputs.num_input_ids",
              f"step {st}: num_input_ids {n_in}, the scheduled counts sum to {T}",
              step=st, field="num_input_ids", expected=T, actual=n_in)
    # positions each scheduled sequence must feed
    per_seq_pos: list[list[int]] = []
    for s in sseqs:
        nc, ns, nt = s.get("num_cached_tokens") or 0, s.get("num_scheduled_tokens") or 0, s.get("num_tokens") or 0
        start = _start(nc, nt)
        per_seq_pos.append(list(range(start, start + ns)) if phase == "prefill" else [nt - 1])
    want_pos = [p for ps in per_seq_pos for p in ps]
    got_pos = list(gi.get("positions") or [])
    if len(got_pos) > len(want_pos) and gi.get("execution") == "graph":
        got_pos = got_pos[:len(want_pos)]
    col.check(got_pos == want_pos, "inputs.positions",
              f"step {st}: positions {format_positions(got_pos)}, expected "
              f"{format_positions(want_pos, [len(p) for p in per_seq_pos])} "
              f"({'from num_cached_tokens' if phase == 'prefill' else 'num_tokens - 1'})",
              step=st, field="positions", expected=want_pos, actual=got_pos)
    # slots
    slots = list(gi.get("slot_mapping") or [])
    if len(slots) > len(want_pos) and all(x == -1 for x in slots[len(want_pos):]):
        slots = slots[:len(want_pos)]
    if bs is not None:
        if len(slots) != len(want_pos):
            col.fail("slots", f"step {st}: slot_mapping has {len(slots)} entries for "
                              f"{len(want_pos)} positions", step=st, field="slot_mapping",
                     expected=len(want_pos), actual=len(slots))
        else:
            off = 0
            for s, ps in zip(sseqs, per_seq_pos):
                rid = log.rid(s)
                table = list(s.get("block_table") or [])
                bad = []
                for k, p in enumerate(ps):
                    i = p // bs
                    want = table[i] * bs + p % bs if 0 <= i < len(table) else None
                    if slots[off + k] != want:
                        bad.append((off + k, p, want, slots[off + k]))
                if bad:
                    idx, p, want, got = bad[0]
                    col.fail("slots", f"step {st}, request {rid}: slot_mapping[{idx}] (position {p}) "
                                      f"expected {want}, got {got} ({len(bad)} of {len(ps)} slots "
                                      f"differ; block_table {table})", step=st, request=rid,
                             field="slot_mapping", expected=want, actual=got)
                else:
                    col.ran("slots")
                off += len(ps)
    # cu_seqlens / max_seqlen / context_lens / block_tables
    cu_q, cu_k = gi.get("cu_seqlens_q"), gi.get("cu_seqlens_k")
    want_q = _cumsum(counts)
    if phase == "prefill":
        kl = [_start(s.get("num_cached_tokens"), s.get("num_tokens")) + (s.get("num_scheduled_tokens") or 0)
              for s in sseqs]
        want_k = _cumsum(kl)
        col.check(cu_q == want_q, "inputs.cu_seqlens_q",
                  f"step {st}: cu_seqlens_q {cu_q}, the scheduled counts give {want_q}",
                  step=st, field="cu_seqlens_q", expected=want_q, actual=cu_q)
        col.check(cu_k == want_k, "inputs.cu_seqlens_k",
                  f"step {st}: cu_seqlens_k {cu_k}, cached + scheduled gives {want_k}",
                  step=st, field="cu_seqlens_k", expected=want_k, actual=cu_k)
        mq, mk = gi.get("max_seqlen_q"), gi.get("max_seqlen_k")
        col.check(mq == max(counts, default=0) and mk == max(kl, default=0), "inputs.max_seqlen",
                  f"step {st}: max_seqlen_q/k {mq}/{mk}, expected {max(counts, default=0)}/"
                  f"{max(kl, default=0)}", step=st, field="max_seqlen")
        cl = gi.get("context_lens")
        col.check(not cl, "inputs.context_lens",
                  f"step {st}: context_lens should be null in prefill, got {_show(cl)}",
                  step=st, field="context_lens", expected=None, actual=cl)
        has_cache = any((s.get("num_cached_tokens") or 0) > 0 for s in sseqs)
        bt = gi.get("block_tables")
        if has_cache:
            if col.check(bt is not None, "inputs.block_tables",
                         f"step {st}: prefill over cached tokens needs block_tables, got null",
                         step=st, field="block_tables"):
                _check_tables(log, col, st, sseqs, bt)
        else:
            col.check(bt is None, "inputs.block_tables",
                      f"step {st}: block_tables should be null in a prefill without cached tokens",
                      step=st, field="block_tables", expected=None, actual=bt)
    else:
        if cu_q is not None:
            col.check(cu_q == want_q, "inputs.cu_seqlens_q",
                      f"step {st}: cu_seqlens_q {cu_q}, the scheduled counts give {want_q}",
                      step=st, field="cu_seqlens_q", expected=want_q, actual=cu_q)
        want_ctx = [s.get("num_tokens") for s in sseqs]
        if cu_k is not None:
            col.check(cu_k == _cumsum(want_ctx), "inputs.cu_seqlens_k",
                      f"step {st}: cu_seqlens_k {cu_k}, the context lengths give {_cumsum(want_ctx)}",
                      step=st, field="cu_seqlens_k", expected=_cumsum(want_ctx), actual=cu_k)
        cl = list(gi.get("context_lens") or [])
        if len(cl) > len(want_ctx) and gi.get("execution") == "graph":
            cl = cl[:len(want_ctx)]
        col.check(cl == want_ctx, "inputs.context_lens",
                  f"step {st}: context_lens {cl}, the scheduled totals are {want_ctx}",
                  step=st, field="context_lens", expected=want_ctx, actual=cl)
        bt = gi.get("block_tables")
        if col.check(bt is not None, "inputs.block_tables",
                     f"step {st}: decode needs block_tables, got null", step=st, field="block_tables"):
            _check_tables(log, col, st, sseqs, bt)
    ex, gb = gi.get("execution"), gi.get("graph_batch")
    okx = ex in ("eager", "graph")
    if ex == "graph":
        okx = okx and phase == "decode" and is_int(gb) and gb >= len(sseqs) and enforce_eager is not True
    elif ex == "eager":
        okx = okx and gb is None
    col.check(okx, "inputs.execution",
              f"step {st}: execution {ex!r} with graph_batch {gb!r} in a {phase} step of "
              f"{len(sseqs)} sequences (enforce_eager {enforce_eager})", step=st, field="execution",
              actual=ex)


def _check_tables(log: EventLog, col: _Collector, st, sseqs, bt):
    rows = list(bt or [])
    if len(rows) < len(sseqs):
        col.fail("inputs.block_tables", f"step {st}: block_tables has {len(rows)} rows for "
                                        f"{len(sseqs)} sequences", step=st, field="block_tables")
        return
    for s, row in zip(sseqs, rows):
        want = list(s.get("block_table") or [])
        got = _strip_pad(row)
        col.check(got == want, "inputs.block_tables",
                  f"step {st}, request {log.rid(s)}: block_tables row {got}, the scheduled "
                  f"block_table is {want}", step=st, request=log.rid(s), field="block_tables",
                  expected=want, actual=got)


# ----------------------------------------------------------------------------- expectations

_SCHED_MAP = {"total": "num_tokens", "cached": "num_cached_tokens",
              "scheduled": "num_scheduled_tokens", "blocks": None}
_AFTER_MAP = {"total": "num_tokens", "cached": "num_cached_tokens",
              "outputs": "num_completion_tokens", "status": "status", "blocks": None,
              "accepted": "accepted"}


def _field_value(entry: dict, f: str, mapping: dict):
    key = mapping[f]
    if key is None:
        return len(entry.get("block_table") or [])
    return entry.get(key)


class _Expect:
    def __init__(self, col: _Collector):
        self.col = col

    def cmp(self, step, request, fld, expected, actual):
        where = _where(step, request)
        if expected == actual:
            self.col.checks.append(Check("expect", True, step, request, fld, expected, actual,
                                         f"{where}, {fld}: {_show(expected)}", "expect"))
        else:
            self.col.checks.append(Check("expect", False, step, request, fld, expected, actual,
                                         f"{where}, {fld}: expected {_show(expected)}, "
                                         f"got {_show(actual)}", "expect"))

    def missing(self, step, request, fld, what):
        self.col.checks.append(Check("expect", False, step, request, fld, None, None,
                                     f"{_where(step, request)}, {fld}: {what}", "expect"))


def _check_expectations(log: EventLog, case: Case, col: _Collector) -> None:
    x = _Expect(col)
    n_steps = len(log.steps)
    for e in case.expect or []:
        if "final" in e:
            for rid, fields in e["final"].items():
                last = None
                for st in sorted(log.steps):
                    ap = log.one(st, "after_postprocess")
                    for a in (ap or {}).get("seqs") or []:
                        if isinstance(a, dict) and log.rid(a) == rid:
                            last = a
                if last is None:
                    x.missing(None, rid, "final", "the request never appears in after_postprocess")
                    continue
                for f, v in fields.items():
                    x.cmp(None, rid, f"final.{f}", v, _field_value(last, f, _AFTER_MAP))
            continue
        st = e["step"]
        if st not in log.steps:
            x.missing(st, None, "step", f"not in the log (the run has {n_steps} steps)")
            continue
        sched = log.one(st, "scheduled") or {}
        sseqs = [s for s in sched.get("seqs") or [] if isinstance(s, dict)]
        if "phase" in e:
            x.cmp(st, None, "phase", e["phase"], sched.get("phase"))
        if "scheduled" in e:
            got_ids = [log.rid(s) for s in sseqs]
            x.cmp(st, None, "scheduled", list(e["scheduled"]), got_ids)
            by_rid = {log.rid(s): s for s in sseqs}
            for rid, fields in e["scheduled"].items():
                s = by_rid.get(rid)
                if s is None:
                    continue  # the id list comparison above already failed
                for f, v in fields.items():
                    x.cmp(st, rid, f"scheduled.{f}" if f != "scheduled" else "scheduled", v,
                          _field_value(s, f, _SCHED_MAP))
        if "preempted" in e:
            got = [log.rid(p) for p in log.all(st, "preempted")]
            x.cmp(st, None, "preempted", e["preempted"], got)
        if "before" in e:
            b = log.one(st, "before_schedule")
            if b is None:
                x.missing(st, None, "before", "no before_schedule event")
            else:
                for f, v in e["before"].items():
                    if f == "free":
                        x.cmp(st, None, "before.free", v, b.get("free_blocks"))
                    else:
                        x.cmp(st, None, f"before.{f}", v, log.rids(b.get(f)))
        if "inputs" in e:
            gi = log.one(st, "gpu_inputs")
            if gi is None:
                x.missing(st, None, "inputs", "no gpu_inputs event")
            else:
                for f, v in e["inputs"].items():
                    x.cmp(st, None, f, v, gi.get(f))
        ap = log.one(st, "after_postprocess")
        a_by_rid = {log.rid(a): a for a in ((ap or {}).get("seqs") or []) if isinstance(a, dict)}
        if "after" in e:
            for rid, fields in e["after"].items():
                a = a_by_rid.get(rid)
                if a is None:
                    x.missing(st, rid, "after", "missing from after_postprocess")
                    continue
                for f, v in fields.items():
                    x.cmp(st, rid, f, v, _field_value(a, f, _AFTER_MAP))
        for key, field in (("refs", "ref_counts"), ("released", "released_ref_counts")):
            for rid, v in (e.get(key) or {}).items():
                a = a_by_rid.get(rid)
                if a is None:
                    x.missing(st, rid, key, "missing from after_postprocess")
                elif a.get(field) is None:
                    x.missing(st, rid, key, f"after_postprocess carries no {field}")
                else:
                    x.cmp(st, rid, key, v, a.get(field))
        if "free" in e:
            if ap is None:
                x.missing(st, None, "free", "no after_postprocess event")
            else:
                x.cmp(st, None, "free", e["free"], ap.get("free_blocks"))


def _check_case_requests(log: EventLog, case: Case, col: _Collector) -> None:
    """The log ran the case's requests, with their max_tokens, and `after` was respected."""
    added = {log.rid(e): (i, e) for i, e in log.added}
    for r in case.requests:
        got = added.get(r.id)
        if got is None:
            col.checks.append(Check("case.requests", False, None, r.id, "request_added", None, None,
                                    f"run, request {r.id}: never added to the engine", "case"))
            continue
        i, e = got
        for field, want in (("max_tokens", r.max_tokens), ("prompt_len", r.prompt_len)):
            if want is None:  # a text prompt's length is known only after tokenizing
                continue
            ok = e.get(field) == want
            col.checks.append(Check("case.requests", ok, None, r.id, field, want, e.get(field),
                                    f"run, request {r.id}, {field}: expected {want}, got {e.get(field)}"
                                    if not ok else f"request {r.id} added with {field} {want}", "case"))
        if r.after is not None:
            finished_at = None
            for j, ev in enumerate(log.events):
                if ev.get("event") == "after_postprocess":
                    if any(isinstance(a, dict) and log.rid(a) == r.after and a.get("status") == "FINISHED"
                           for a in ev.get("seqs") or []):
                        finished_at = j
                        break
            ok = finished_at is not None and i > finished_at
            col.checks.append(Check("case.after", ok, None, r.id, "after", r.after, None,
                                    f"run, request {r.id}: added before {r.after} finished"
                                    if not ok else f"request {r.id} added after {r.after} finished",
                                    "case"))
    extra = sorted(set(added) - set(case.request_ids))
    if extra:
        col.checks.append(Check("case.requests", False, None, None, "request_added", None, extra,
                                f"run: requests not in the case were added: {', '.join(extra)}", "case"))


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
    col = _Collector()
    events = list(events or [])
    schema_bad = 0
    for i, e in enumerate(events):
        probs = event_problems(e)
        if probs:
            schema_bad += 1
            if schema_bad <= _MAX_FAILURES_PER_NAME:
                st = e.get("step") if isinstance(e, dict) else None
                col.checks.append(Check("schema", False, st if is_int(st) else None, None, None,
                                        None, None, f"event #{i + 1} "
                                        f"({e.get('event') if isinstance(e, dict) else '?'}): "
                                        f"{'; '.join(probs)}", "schema"))
    if not schema_bad:
        col.checks.append(Check("schema", True, message=f"schema: {len(events)} events are v1",
                                kind="schema"))
    log = EventLog(events)
    rs, cfg = log.run_start, log.config
    eng = case.engine if case is not None else {}
    bs = block_size or (rs.get("block_size") if is_int(rs.get("block_size")) else None) \
        or _cfg_int(cfg, "kvcache_block_size") or _cfg_int(eng, "kvcache_block_size")
    nb = num_kvcache_blocks or (rs.get("num_kvcache_blocks") if is_int(rs.get("num_kvcache_blocks")) else None)
    if nb is None:
        for src in (cfg, eng):
            v = _cfg_int(src, "num_kvcache_blocks")
            if v is not None and v > 0:
                nb = v
                break
    ignore_eos = {r.id: r.ignore_eos for r in case.requests} if case is not None else {}

    _check_invariants(log, col, bs, nb, ignore_eos)
    if case is not None:
        _check_case_requests(log, case, col)
        if case.expect:
            _check_expectations(log, case, col)
    checks = col.finish()
    run = next((e.get("run") for e in log.events if e.get("run") is not None), None)
    return Report(checks=checks, run=run, steps=len(log.steps),
                  case=case.name if case is not None else None, expect_changes=expect_changes,
                  why_changes=why_changes)
