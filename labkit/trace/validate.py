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

from engine.policies import POLICIES, PrefillFirst
from labkit.trace.cases import Case, format_positions
from labkit.trace.events import MAX_KEPT, PHASES, STATUSES, EventLog, event_problems, is_int, seq_entries

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
    # A live window of a running server (labkit trace --url): its invariants are what it is judged by.
    live: bool = False

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
        """Whether case expectations were compared (a case without `expect` is only recorded), or the log is a live
        window that holds steps, which its invariants judge (PASS or FAIL). A window with no step checked nothing:
        RECORDED, never PASS."""
        return (self.live and self.steps > 0) or any(c.kind == "expect" for c in self.checks)

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
            if changed_means(self.why_changes):
                s += f"; {changed_means(self.why_changes)}"
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


# How labkit.trace.run.engine_changes starts its reason when the engine's files differ from git HEAD.
ENGINE_DIFFERS = "engine/ differs from HEAD"


def changed_means(why_changes: str) -> str:
    """The sentence beside CHANGED when an engine edit (not an override) made the run an experiment.

    Any uncommitted edit under engine/ turns expected states into a diff, so a refactor that breaks the
    schedule would pass as CHANGED (exit 0); a user must be told how to judge the edit strictly."""
    if ENGINE_DIFFERS not in why_changes:
        return ""
    return "a change meant to keep behaviour is judged with --no-expect-changes (a FAIL there)"


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
    # Without spaces: a list stays one word where a narrow terminal wraps the diff.
    if isinstance(v, list) and len(v) > 12 and all(is_int(x) for x in v):
        return format_positions(v).replace(" + ", "+")
    if isinstance(v, (list, dict)):
        return json.dumps(v, separators=(",", ":"))
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


def _counts(e: dict) -> tuple:
    """num_tokens, num_cached_tokens, num_scheduled_tokens of a scheduled entry."""
    return e.get("num_tokens"), e.get("num_cached_tokens"), e.get("num_scheduled_tokens")


def _completes(e: dict) -> bool:
    """Whether a prefill of the scheduled entry `e` computes its last prompt token (its token is an output)."""
    nt, nc, ns = _counts(e)
    return is_int(nc) and is_int(ns) and _start(nc, nt) + ns == nt


# ----------------------------------------------------------------------------- the registry

@dataclass
class _Failure:
    message: str
    fields: dict      # step, request, field, expected, actual of its Check


def need(cond, message: str, **fields) -> _Failure | None:
    """One result of an invariant: None when `cond` holds, else the failure `message` describes."""
    return None if cond else _Failure(message, fields)


def invariant(name: str, about: str):
    """Add a check to INVARIANTS: its name and, in one line, what it asserts. The decorated method of _Replay
    yields one result per thing it checked (None when it held, `need`'s failure when not), counted under `name`."""
    def register(fn):
        INVARIANTS[name] = about
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
    """One engine step's events (the first of each kind), and what the checks of one need of another."""

    def __init__(self, log: EventLog, n: int):
        self.n, self.log, self.events = n, log, log.steps[n]
        self.scheduled, self.before, self.inputs, self.sampled, self.after = (log.one(n, ev) for ev in (
            "scheduled", "before_schedule", "gpu_inputs", "sampled", "after_postprocess"))
        self.ids: set = set()               # the seq_ids it scheduled
        self.sampled_tok: dict = {}         # seq_id -> the sampled token id

    @cached_property
    def phase(self):
        return self.scheduled.get("phase")

    @cached_property
    def seqs(self) -> list[dict]:
        return seq_entries(self.scheduled)

    @cached_property
    def kinds(self) -> list[str]:
        """Each scheduled row's kind: "decode" or "prefill" (a mixed step names them; older logs have one phase)."""
        return [e.get("kind") or ("decode" if self.phase == "decode" else "prefill") for e in self.seqs]

    @cached_property
    def prefill_rows(self) -> list[dict]:
        return [e for e, k in zip(self.seqs, self.kinds) if k == "prefill"]

    @cached_property
    def decode_rows(self) -> list[dict]:
        return [e for e, k in zip(self.seqs, self.kinds) if k == "decode"]

    @cached_property
    def counts(self) -> list:
        return [e.get("num_scheduled_tokens") or 0 for e in self.seqs]

    @cached_property
    def positions(self) -> list[list[int]]:
        """The positions each scheduled row feeds: from num_cached_tokens (prefill), num_tokens - 1 (decode)."""
        out = []
        for e, kind in zip(self.seqs, self.kinds):
            nt, nc, ns = (e.get(k) or 0 for k in ("num_tokens", "num_cached_tokens", "num_scheduled_tokens"))
            start = _start(nc, nt)
            out.append(list(range(start, start + ns)) if kind == "prefill" else [nt - 1])
        return out

    def k_lens(self) -> list:
        """Keys each prefill row attends to: cached (or the last token's start) + scheduled."""
        return [_start(e.get("num_cached_tokens"), e.get("num_tokens")) + (e.get("num_scheduled_tokens") or 0)
                for e in self.prefill_rows]

    def need(self, cond, what: str, entry: dict | None = None, **fields) -> _Failure | None:
        """need() for this step, or for the sequence `entry` names: "step N[, request R]: what"."""
        if entry is None:
            return need(cond, f"step {self.n}: {what}", step=self.n, **fields)
        rid = self.log.rid(entry)
        return need(cond, f"step {self.n}, request {rid}: {what}", step=self.n, request=rid, **fields)


class _Replay:
    """The engine as the log tells it: every sequence's state and block table, the token ids whose KV each
    block holds, the free blocks. One handler per event type runs the invariants (methods registered with
    @invariant) that compare the event with the model, then updates the model."""

    def __init__(self, log: EventLog, case: Case | None, block_size: int | None, num_blocks: int | None):
        self.log, self.case, self.bs, self.nb = log, case, block_size, num_blocks
        self.max_batched = _cfg_int(log.config, "max_num_batched_tokens")
        self.max_seqs = _cfg_int(log.config, "max_num_seqs")
        self.max_model_len = _cfg_int(log.config, "max_model_len")
        self.enforce_eager = log.config.get("enforce_eager")
        # What the run's policy allows (engine/policies.py): mixed steps, which prefill row may be a chunk.
        name = log.config.get("scheduling_policy")
        self.policy = POLICIES[name] if isinstance(name, str) and name in POLICIES else PrefillFirst
        self.eos = log.config.get("eos")
        self.async_scheduling = bool((log.run_start or {}).get("async_scheduling", log.config.get("async_scheduling")))
        self.ignore_eos = {r.id: r.ignore_eos for r in case.requests} if case is not None else {}
        self.seqs: dict[Any, _Seq] = {}
        self.written: dict = {}      # physical block -> {offset: token id} whose KV the log's steps computed
        self.free = num_blocks       # free blocks as the last step left them
        self.last_free = None        # ... as the last after_postprocess (or abort) reported them
        self.checks: list[Check] = []
        self.counts: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.skips: dict[str, str] = {}
        self.expected: dict[int, list[Check]] = {}      # index of the case's expect entry -> its checks
        self.last_after: dict[str, tuple[int, dict]] = {}  # request -> (step, its entry) of its last after_postprocess

    # --- what the checks found
    def run(self, check, *args) -> bool:
        """Run one invariant method; whether everything it checked held."""
        ok = True
        for res in check(*args):
            ok = self.record(check.invariant, res) and ok
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

    def finish(self) -> list[Check]:
        """Failures as they came, the case's checks, then one passing Check per invariant that never failed."""
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

    # --- the log as a whole
    def replay(self):
        for check in (self.single_run, self.one_run_start, self.monotonic, self.contiguous):
            self.run(check)
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
        agenda += [(i, self.aborted, e) for i, e in log.aborted]
        agenda += [(i, self.live_state, e) for i, e in log.live_states]
        for _, handler, item in sorted(agenda, key=lambda x: x[0]):
            handler(item)
        self.run_end()

    @invariant("log.single_run", "every event carries the same run id")
    def single_run(self):
        runs = self.log.runs
        more = "" if len(runs) < MAX_KEPT else ", ..."
        yield need(len(runs) <= 1, f"the log mixes {len(runs)}{'+' if more else ''} runs: "
                                   f"{', '.join(sorted(map(str, runs)))}{more}")

    @invariant("log.run_start", "the log has exactly one run_start event")
    def one_run_start(self):
        n = self.log.num_run_starts
        yield need(n == 1, f"run: expected one run_start event, found {n}")

    @invariant("time.monotonic", "t_ns never goes backwards")
    def monotonic(self):
        log = self.log
        for ev, step, last, t in log.time_reversals:
            yield need(False, f"run: t_ns goes backwards at {ev} (step {step}): {last} -> {t}", step=step)
        for _ in range(log.num_time_reversals - len(log.time_reversals)):   # past those listed: counted
            yield need(False, "run: t_ns goes backwards (more times)")
        for _ in range(log.timed - log.num_time_reversals):
            yield None

    @invariant("steps.contiguous", "steps are numbered 1..N (in a live window, on from the step it opened after)")
    def contiguous(self):
        steps = sorted(self.log.steps)
        first = 1
        if self.log.window_open is not None and is_int(self.log.window_open.get("last_step")):
            first = self.log.window_open["last_step"] + 1
        if steps:
            yield need(steps == list(range(first, first + len(steps))),
                       f"run: steps are not numbered {first}..{first + len(steps) - 1} (found {steps[:5]}...)")

    # --- a live window (labkit trace --url): its edges
    def live_state(self, e: dict):
        if e.get("kind") == "open":
            self.open_window(e)
        elif e.get("kind") == "close":
            self.run(self.window_end, e)

    def open_window(self, e: dict):
        """The state the log before the window would have left: every live sequence, its KV (the tokens of its
        cached positions, for later prefix hits) and the free blocks. Blocks written before the window and
        freed are unknown: a prefix hit on one is not checked (prefix.content)."""
        bs = self.bs
        for x in seq_entries(e):
            q = self.seqs.get(x.get("seq_id"))
            if q is None:
                continue
            q.status, q.num_tokens, q.num_cached = x.get("status"), x.get("num_tokens"), x.get("num_cached_tokens") or 0
            q.completion, q.table = x.get("num_completion_tokens") or 0, list(x.get("block_table") or [])
            toks = x.get("token_ids")
            q.tokens = list(toks) if isinstance(toks, list) else None
            if bs is not None and q.tokens is not None:
                for p in range(min(q.num_cached, len(q.tokens))):
                    if p // bs < len(q.table):
                        self.written.setdefault(q.table[p // bs], {})[p % bs] = q.tokens[p]
        if is_int(e.get("free_blocks")):
            self.free = self.last_free = e["free_blocks"]

    @invariant("window.end", "at a live window's end the live sequences, their states and blocks, and the free "
                             "blocks are what the window's steps left (no request lost or duplicated)")
    def window_end(self, e: dict):
        want = {x.get("seq_id"): x for x in seq_entries(e)}
        live = {sid: q for sid, q in self.seqs.items() if q.status != "FINISHED"}
        names = {sid: q.request_id for sid, q in self.seqs.items()}
        lost, extra = sorted(set(want) - set(live), key=str), sorted(set(live) - set(want), key=str)
        yield need(not lost and not extra, f"window end: the server has {[names.get(s, s) for s in lost]} live that "
                                           f"the window never showed, and the window has "
                                           f"{[names.get(s, s) for s in extra]} live that the server does not")
        for sid in set(want) & set(live):
            x, q = want[sid], live[sid]
            got = (q.status, q.num_tokens, q.num_cached, q.completion, q.table)
            exp = (x.get("status"), x.get("num_tokens"), x.get("num_cached_tokens"), x.get("num_completion_tokens"),
                   list(x.get("block_table") or []))
            yield need(got == exp, f"window end, request {q.request_id}: the window leaves it at {got}, the server "
                                   f"says {exp} (status, tokens, cached, outputs, blocks)", request=q.request_id,
                       expected=list(exp), actual=list(got))
        fb = e.get("free_blocks")
        yield need(fb == self.last_free, f"window end: free_blocks {fb}, the window's last step left {self.last_free}",
                   field="free_blocks", expected=self.last_free, actual=fb)

    def request_added(self, e: dict):
        rid, pl, toks, ie = self.log.rid(e), e.get("prompt_len"), e.get("prompt_token_ids"), e.get("ignore_eos")
        toks = list(toks) if isinstance(toks, list) and (not is_int(pl) or len(toks) == pl) else None
        mt = e.get("max_tokens")
        self.seqs[e.get("seq_id")] = _Seq(e.get("seq_id"), rid, mt if is_int(mt) else None,
                                          self.ignore_eos.get(rid) if ie is None else ie, pl if is_int(pl) else None,
                                          tokens=toks)

    def aborted(self, e: dict):
        """Cancelled between steps: the sequence leaves and gives its blocks back."""
        q = self.seqs.get(e.get("seq_id"))
        if q is not None:
            q.status, q.table, q.num_cached, q.finish_reason = "FINISHED", [], 0, "abort"
        if is_int(e.get("free_blocks")):
            self.free = self.last_free = e["free_blocks"]

    # --- a step: its events in the order the engine emits them
    def step(self, n: int):
        """A step too malformed to check fails step.events; the model keeps what its events before that set. The
        case's expectations for the step are compared with its events whatever the invariants found."""
        s = _Step(self.log, n)
        for a in seq_entries(s.after):
            rid = self.log.rid(a)
            if rid not in self.last_after or self.last_after[rid][0] <= n:
                self.last_after[rid] = (n, a)
        try:
            self.run(self.step_events, s)
            if s.scheduled is not None:
                self.run(self.phase, s)
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

    @invariant("step.events", "a step has one scheduled, gpu_inputs, after_postprocess and sampled event, at most "
                              "one before_schedule, and can be read")
    def step_events(self, s: _Step):
        for name, least in (("scheduled", 1), ("gpu_inputs", 1), ("after_postprocess", 1), ("sampled", 1),
                            ("before_schedule", 0)):
            n = len(s.events.get(name, []))
            yield s.need(least <= n <= 1, f"{n} {name} events (expected {'exactly one' if least else 'at most one'})",
                         field=name)

    @invariant("seq.known", "every sequence a step names was added by a request_added event")
    def known(self, s: _Step, e: dict, how: str):
        if how != "reported" or e.get("seq_id") not in self.seqs:   # a reported one counts only when unknown
            what = {"preempted": "preempted an unknown sequence {}",
                    "scheduled": "seq {} scheduled without a request_added event",
                    "reported": "after_postprocess reports unknown seq {}"}[how]
            yield s.need(e.get("seq_id") in self.seqs, what.format(e.get("seq_id")), e)

    @invariant("phase", "a step is prefill, decode or mixed (decode rows first, then prefill rows) and schedules "
                        "something; a status is WAITING, RUNNING or FINISHED")
    def phase(self, s: _Step, a: dict | None = None):
        if a is not None:
            yield s.need(a.get("status") in STATUSES, f"unknown status {a.get('status')!r}", a, field="status",
                         actual=a.get("status"))
            return
        yield s.need(s.phase in PHASES, f"phase {s.phase!r} is not prefill, decode or mixed", field="phase",
                     actual=s.phase)
        if s.phase in PHASES:
            yield s.need(bool(s.seqs), "nothing scheduled")
            kinds = set(s.kinds)
            want = "mixed" if len(kinds) > 1 else next(iter(kinds), s.phase)
            yield s.need(want == s.phase and s.kinds == sorted(s.kinds), f"a {s.phase} step with rows {s.kinds} "
                         "(decode rows come first; a step with both kinds is mixed)", field="phase", actual=s.phase)
            yield s.need(s.phase != "mixed" or self.policy.mixes_phases, f"a mixed step under scheduling_policy "
                         f"{self.policy.name} (it never puts prefill and decode rows in one step)", field="phase")

    # --- before_schedule and preempted
    def before_schedule(self, s: _Step):
        if s.before is not None:
            self.run(self.free_continuity, s)
            self.run(self.queues, s)
        self.run(self.right_queue, s)

    @invariant("phase.mixed", "a prefill row is a waiting sequence's, a decode row a running one's")
    def right_queue(self, s: _Step):
        for e, kind in zip(s.seqs, s.kinds):
            want = "waiting" if kind == "prefill" else "running"
            if s.before is not None:
                queue = {str(x) for x in s.before.get(want) or []}
                yield s.need(str(e.get("seq_id")) in queue, f"scheduled as a {kind} row but it was not {want} "
                                                            f"before scheduling", e)
                continue
            q = self.seqs.get(e.get("seq_id"))
            if q is not None:
                yield need(q.status == want.upper(), f"step {s.n}, request {q.request_id}: scheduled as a {kind} "
                                                     f"row while {q.status}", step=s.n, request=q.request_id)

    @invariant("queues", "before_schedule's waiting and running queues hold the sequences the replay has there")
    def queues(self, s: _Step):
        live = [q for q in self.seqs.values() if q.status != "FINISHED"]
        want_w, want_r = (sorted(str(q.seq_id) for q in live if q.status == st) for st in ("WAITING", "RUNNING"))
        got_w, got_r = (sorted(str(x) for x in s.before.get(k) or []) for k in ("waiting", "running"))
        names = {str(q.seq_id): q.request_id for q in self.seqs.values()}

        def n(ids):
            return [names.get(i, f"seq{i}") for i in ids]
        yield s.need(got_w == want_w and got_r == want_r, f"before_schedule has waiting {n(got_w)} running "
                                                          f"{n(got_r)}, but the states so far give waiting "
                                                          f"{n(want_w)} running {n(want_r)}")

    @invariant("free.continuity", "a step starts with the free blocks the previous one left")
    def free_continuity(self, s: _Step):
        fb = s.before.get("free_blocks")
        if self.free is not None:
            yield s.need(fb == self.free, f"before_schedule.free_blocks {fb}, but the previous step left {self.free}",
                         field="free_blocks", expected=self.free, actual=fb)

    def preempted(self, s: _Step, p: dict):
        self.run(self.known, s, p, "preempted")
        self.run(self.preemptable, s, p)
        q = self.seqs.get(p.get("seq_id"))
        if q is not None:
            q.status, q.num_cached, q.table = "WAITING", 0, []

    @invariant("preempted", "only a running sequence is preempted, and not scheduled in the same step")
    def preemptable(self, s: _Step, p: dict):
        yield s.need(p.get("seq_id") not in s.ids, "preempted and scheduled in the same step", p)
        q = self.seqs.get(p.get("seq_id"))
        if q is not None:
            yield s.need(q.status == "RUNNING", f"preempted while {q.status}", p)

    # --- scheduled
    def scheduled(self, s: _Step):
        self.run(self.budget, s, "seqs")
        first_prefill = len(s.decode_rows)
        for j, (e, kind) in enumerate(zip(s.seqs, s.kinds)):
            table = list(e.get("block_table") or [])
            q = self.seqs.get(e.get("seq_id"))
            self.run(self.known, s, e, "scheduled")
            if q is not None:
                self.run(self.continuity, s, e, q)
            for check in (self.table_size, self.table_ids) + ((self.decode_shape,) if kind == "decode" else
                                                              (self.chunk_fits,)):
                self.run(check, s, e)
            if kind == "prefill":
                self.run(self.chunk_policy, s, e, j - first_prefill)
            if q is not None:
                self.run(self.prefix_content, s, e, q, kind)
                nt, nc, ns = _counts(e)
                if self.bs is not None:      # the KV this step writes, for later prefix hits
                    for p in self.written_positions(kind, nt, nc, ns):
                        if 0 <= p // self.bs < len(table):
                            tok = q.tokens[p] if q.tokens is not None and p < len(q.tokens) else None
                            self.written.setdefault(table[p // self.bs], {})[p % self.bs] = tok
                q.num_tokens, q.num_cached, q.table = nt, nc, table
        self.run(self.budget, s, "tokens")

    @staticmethod
    def written_positions(kind: str, nt, nc, ns) -> range:
        """Positions whose KV a scheduled row writes this step."""
        if kind == "decode":
            return range(nt - 1, nt) if is_int(nt) else range(0)
        if not (is_int(nt) and is_int(ns)):
            return range(0)
        return range(_start(nc, nt), _start(nc, nt) + ns)

    @invariant("state.continuity", "a sequence is scheduled with the tokens, cached count and blocks it was left with")
    def continuity(self, s: _Step, e: dict, q: _Seq):
        nt, nc, _ = _counts(e)
        table = list(e.get("block_table") or [])
        yield s.need(nt == q.num_tokens or q.num_tokens is None, f"scheduled with num_tokens {nt}, but the previous "
                                                                 f"state had {q.num_tokens}", e, field="num_tokens",
                     expected=q.num_tokens, actual=nt)
        if q.table:
            yield s.need(nc == q.num_cached and table[:len(q.table)] == q.table,
                         f"holds blocks {q.table} with cached {q.num_cached}, scheduled with blocks {table} cached "
                         f"{nc}", e, field="block_table")

    @invariant("block_table.size", "a scheduled sequence holds ceil(num_tokens / block_size) blocks")
    def table_size(self, s: _Step, e: dict):
        nt, n = e.get("num_tokens"), len(list(e.get("block_table") or []))
        if self.bs is not None and is_int(nt):
            want = -(-nt // self.bs)
            yield s.need(n == want, f"{n} blocks for {nt} tokens (block size {self.bs} needs {want})", e,
                         field="blocks", expected=want, actual=n)

    @invariant("block_table.ids", "a block table holds distinct block ids of the pool")
    def table_ids(self, s: _Step, e: dict):
        table = list(e.get("block_table") or [])
        bad = [b for b in table if not is_int(b) or b < 0 or (self.nb is not None and b >= self.nb)]
        yield s.need(not bad and len(set(table)) == len(table), f"block table {table} has invalid or repeated ids", e,
                     field="block_table", actual=table)

    @invariant("decode.shape", "a decode step schedules one token of a sequence whose other tokens are cached")
    def decode_shape(self, s: _Step, e: dict):
        nt, nc, ns = _counts(e)
        yield s.need(ns == 1 and is_int(nt) and is_int(nc) and nt == nc + 1, f"decode needs scheduled 1 and total = "
                                                                             f"cached + 1, got total {nt} cached {nc} "
                                                                             f"scheduled {ns}", e)

    @staticmethod
    def _fits(e: dict) -> bool:
        nt, nc, ns = _counts(e)
        return is_int(ns) and is_int(nc) and is_int(nt) and ns >= 1 and _start(nc, nt) + ns <= nt

    @invariant("chunk.fits", "a prefill computes at least one token and no more than the sequence has")
    def chunk_fits(self, s: _Step, e: dict):
        nt, nc, ns = _counts(e)
        yield s.need(self._fits(e), f"prefill of {ns} tokens from cached {nc} does not fit total {nt}", e)

    @invariant("policy.chunk_first_only", "only the first prefill row is chunked (nano's policy); under mixed, "
                                          "only the last")
    def chunk_policy(self, s: _Step, e: dict, j: int):
        """`j`: the row's index among the step's prefill rows."""
        nt, nc, ns = _counts(e)
        if not self._fits(e) or _start(nc, nt) + ns == nt:
            return
        if self.policy.chunked_row == "last":
            yield s.need(j == len(s.prefill_rows) - 1, f"{self.log.rid(e)} is chunked ({ns} of {nt - nc} tokens) but "
                                                      f"is not the last prefill row ({self.policy.name} chunks only "
                                                      "the last)", e)
        else:
            yield s.need(j == 0, f"{self.log.rid(e)} is chunked ({ns} of {nt - nc} tokens) but is not first in the "
                                 "prefill batch (nano chunks only the first)", e)

    @invariant("budget", "a step schedules at most max_num_seqs sequences and max_num_batched_tokens tokens")
    def budget(self, s: _Step, what: str):
        if what == "seqs" and self.max_seqs is not None:
            yield s.need(len(s.seqs) <= self.max_seqs, f"{len(s.seqs)} sequences scheduled, max_num_seqs is "
                                                       f"{self.max_seqs}", field="max_num_seqs",
                         expected=self.max_seqs, actual=len(s.seqs))
        elif what == "tokens" and self.max_batched is not None:
            total = sum(ns for ns in (e.get("num_scheduled_tokens") for e in s.seqs) if is_int(ns))
            yield s.need(total <= self.max_batched, f"{total} tokens scheduled, max_num_batched_tokens is "
                                                    f"{self.max_batched}", field="max_num_batched_tokens",
                         expected=self.max_batched, actual=total)

    # --- gpu_inputs
    def gpu_inputs(self, s: _Step):
        for check in (self.num_input_ids, self.positions, self.slots, self.cu_seqlens_q, self.cu_seqlens_k,
                      self.max_seqlen, self.context_lens, self.block_tables, self.execution):
            self.run(check, s, s.inputs)

    @staticmethod
    def _rows(gi: dict, got: list, n: int) -> list:
        """The step's rows of an input: a CUDA-graph batch is padded past them."""
        return got[:n] if len(got) > n and gi.get("execution") == "graph" else got

    @invariant("inputs.num_input_ids", "the model gets as many input ids as the step scheduled tokens")
    def num_input_ids(self, s: _Step, gi: dict):
        want, got = sum(s.counts), gi.get("num_input_ids")
        yield s.need(got == want, f"num_input_ids {got}, the scheduled counts sum to {want}", field="num_input_ids",
                     expected=want, actual=got)

    @invariant("inputs.positions", "positions run from num_cached_tokens in prefill, are num_tokens - 1 in decode")
    def positions(self, s: _Step, gi: dict):
        want = [p for ps in s.positions for p in ps]
        got = self._rows(gi, list(gi.get("positions") or []), len(want))
        yield s.need(got == want, f"positions {format_positions(got)}, expected "
                                  f"{format_positions(want, [len(p) for p in s.positions])} "
                                  "(from num_cached_tokens in a prefill row, num_tokens - 1 in a decode row)",
                     field="positions", expected=want, actual=got)

    @invariant("slots", "position p writes its KV to slot block_table[p // block_size] * block_size + p % block_size")
    def slots(self, s: _Step, gi: dict):
        n, bs = sum(len(ps) for ps in s.positions), self.bs
        slots = list(gi.get("slot_mapping") or [])
        if len(slots) > n and all(x == -1 for x in slots[n:]):
            slots = slots[:n]
        if bs is None:
            return
        if len(slots) != n:
            yield s.need(False, f"slot_mapping has {len(slots)} entries for {n} positions", field="slot_mapping",
                         expected=n, actual=len(slots))
            return
        off = 0
        for e, ps in zip(s.seqs, s.positions):
            table = list(e.get("block_table") or [])
            bad = []
            for k, p in enumerate(ps):
                want = table[p // bs] * bs + p % bs if 0 <= p // bs < len(table) else None
                if slots[off + k] != want:
                    bad.append((off + k, p, want, slots[off + k]))
            idx, p, want, got = bad[0] if bad else (None,) * 4
            yield s.need(not bad, f"slot_mapping[{idx}] (position {p}) expected {want}, got {got} ({len(bad)} of "
                                  f"{len(ps)} slots differ; block_table {table})", e, field="slot_mapping",
                         expected=want, actual=got)
            off += len(ps)

    @invariant("inputs.cu_seqlens_q", "cu_seqlens_q is the running sum of the prefill rows' scheduled counts")
    def cu_seqlens_q(self, s: _Step, gi: dict):
        got = gi.get("cu_seqlens_q")
        want = _cumsum([e.get("num_scheduled_tokens") or 0 for e in s.prefill_rows]) if s.prefill_rows else None
        if s.prefill_rows or got is not None:
            yield s.need(got == want, f"cu_seqlens_q {got}, the scheduled counts give {want}", field="cu_seqlens_q",
                         expected=want, actual=got)

    @invariant("inputs.cu_seqlens_k", "cu_seqlens_k is the running sum of the prefill rows' cached + scheduled (or "
                                      "of the context lengths, in a decode step that reports it)")
    def cu_seqlens_k(self, s: _Step, gi: dict):
        got = gi.get("cu_seqlens_k")
        if s.prefill_rows:
            want, why = _cumsum(s.k_lens()), "cached + scheduled gives"
        elif got is not None:
            want, why = _cumsum([e.get("num_tokens") for e in s.seqs]), "the context lengths give"
        else:
            return
        yield s.need(got == want, f"cu_seqlens_k {got}, {why} {want}", field="cu_seqlens_k", expected=want,
                     actual=got)

    @invariant("inputs.max_seqlen", "max_seqlen_q / max_seqlen_k are the longest query and key lengths of the "
                                    "prefill rows")
    def max_seqlen(self, s: _Step, gi: dict):
        if s.prefill_rows:
            mq, mk = gi.get("max_seqlen_q"), gi.get("max_seqlen_k")
            wq = max((e.get("num_scheduled_tokens") or 0 for e in s.prefill_rows), default=0)
            wk = max(s.k_lens(), default=0)
            yield s.need(mq == wq and mk == wk, f"max_seqlen_q/k {mq}/{mk}, expected {wq}/{wk}", field="max_seqlen")

    @invariant("inputs.context_lens", "context_lens are the decode rows' scheduled totals, null without decode rows")
    def context_lens(self, s: _Step, gi: dict):
        if not s.decode_rows:
            cl = gi.get("context_lens")
            yield s.need(not cl, f"context_lens should be null in prefill, got {_show(cl)}", field="context_lens",
                         expected=None, actual=cl)
            return
        want = [e.get("num_tokens") for e in s.decode_rows]
        got = self._rows(gi, list(gi.get("context_lens") or []), len(want))
        yield s.need(got == want, f"context_lens {got}, the scheduled totals are {want}", field="context_lens",
                     expected=want, actual=got)

    @invariant("inputs.block_tables", "block_tables rows are the scheduled block tables (decode, and prefill over "
                                      "cached tokens), null otherwise")
    def block_tables(self, s: _Step, gi: dict):
        bt = gi.get("block_tables")
        if s.phase == "prefill" and not any((e.get("num_cached_tokens") or 0) > 0 for e in s.seqs):
            yield s.need(bt is None, "block_tables should be null in a prefill without cached tokens",
                         field="block_tables", expected=None, actual=bt)
            return
        why = "prefill over cached tokens" if s.phase == "prefill" else f"a {s.phase} step"
        yield s.need(bt is not None, f"{why} needs block_tables, got null", field="block_tables")
        rows = None if bt is None else list(bt or [])
        if rows is not None and len(rows) < len(s.seqs):
            yield s.need(False, f"block_tables has {len(rows)} rows for {len(s.seqs)} sequences", field="block_tables")
            return
        for e, row in zip(s.seqs, rows or []):
            want, got = list(e.get("block_table") or []), _strip_pad(row)
            yield s.need(got == want, f"block_tables row {got}, the scheduled block_table is {want}", e,
                         field="block_tables", expected=want, actual=got)

    @invariant("inputs.execution", "a step runs eagerly, or as a CUDA graph that holds it (a decode batch; under "
                                   "mixed, also decode rows and prefill tokens) when graphs are allowed")
    def execution(self, s: _Step, gi: dict):
        ex, gb, gp = gi.get("execution"), gi.get("graph_batch"), gi.get("graph_prefill_tokens")
        ok = ex in ("eager", "graph")
        if ex == "graph":
            ok = ok and is_int(gb) and gb >= len(s.decode_rows) and self.enforce_eager is not True
            if s.prefill_rows:
                tokens = sum(e.get("num_scheduled_tokens") or 0 for e in s.prefill_rows)
                ok = ok and self.policy.mixes_phases and is_int(gp) and gp >= tokens
            else:
                ok = ok and gp is None
        elif ex == "eager":
            ok = ok and gb is None
        yield s.need(ok, f"execution {ex!r} with graph_batch {gb!r}, graph_prefill_tokens {gp!r} in a {s.phase} step "
                         f"of {len(s.seqs)} sequences "
                         f"(enforce_eager {self.enforce_eager})", field="execution", actual=ex)

    # --- sampled
    def sampled(self, s: _Step):
        if s.sampled is not None:
            for t in s.sampled.get("tokens") or []:
                if isinstance(t, dict):
                    s.sampled_tok[t.get("seq_id")] = t.get("token_id")
            self.run(self.sampled_ok, s)

    @invariant("sampled", "tokens are sampled for scheduled sequences only, and an accepted token is the sampled one")
    def sampled_ok(self, s: _Step, a: dict | None = None):
        if a is None:
            extra = [k for k in s.sampled_tok if k not in s.ids]
            yield s.need(not extra, f"sampled tokens for sequences not scheduled this step: {extra}")
        elif s.sampled is not None and a.get("seq_id") in s.sampled_tok:
            want = s.sampled_tok[a.get("seq_id")]
            yield s.need(a.get("token_id") == want, f"token_id {a.get('token_id')} differs from the sampled {want}", a,
                         field="token_id", expected=want, actual=a.get("token_id"))

    # --- after_postprocess
    def after_postprocess(self, s: _Step):
        reported = seq_entries(s.after)
        sched = {e.get("seq_id"): e for e in s.seqs}
        self.run(self.after_complete, s, {a.get("seq_id") for a in reported})
        for a in reported:
            q, sc = self.seqs.get(a.get("seq_id")), sched.get(a.get("seq_id"))
            if not self.run(self.known, s, a, "reported"):
                continue
            table = list(a.get("block_table") or [])
            if sc is not None:
                self.run(self.async_discarded, s, a, sc, q)
                if a.get("discarded") is not True:
                    self.run(self.accepted_rule, s, a, sc)
                if a.get("accepted") is False:
                    self.run(self.discarded, s, a, sc, q)
                elif a.get("accepted") is True:
                    if q.tokens is not None:
                        q.tokens.append(a.get("token_id"))
                    self.run(self.accepted_counts, s, a, sc, q)
                    self.run(self.sampled_ok, s, a)
                self.run(self.after_cached, s, a, sc)
            self.run(self.finished_released, s, a)
            self.run(self.phase, s, a)
            self.run(self.max_tokens, s, a, q)
            nt, nc, comp, status = (a.get(k) for k in ("num_tokens", "num_cached_tokens", "num_completion_tokens",
                                                      "status"))
            q.num_tokens = nt if is_int(nt) else q.num_tokens
            q.num_cached = nc if is_int(nc) else 0
            q.completion = comp if is_int(comp) else q.completion
            q.status = status if status in STATUSES else q.status
            q.table, q.finish_reason = table, a.get("finish_reason", q.finish_reason)
        holders: dict = {}          # block -> how many live sequences hold it
        for q in self.seqs.values():
            if q.status != "FINISHED":
                for b in q.table:
                    holders[b] = holders.get(b, 0) + 1
        fb = s.after.get("free_blocks")
        self.run(self.accounting, s, fb, holders)
        for a in reported:
            self.run(self.refs, s, a, holders)
        if is_int(fb):
            self.free = self.last_free = fb

    @invariant("after.complete", "every scheduled sequence is in after_postprocess")
    def after_complete(self, s: _Step, reported: set):
        for e in s.seqs:
            yield s.need(e.get("seq_id") in reported, "scheduled but missing from after_postprocess", e)

    @invariant("accepted.rule", "a token is accepted exactly when the row completes the prompt (or decodes)")
    def accepted_rule(self, s: _Step, a: dict, sc: dict):
        kind = sc.get("kind") or ("decode" if s.phase == "decode" else "prefill")
        completes, acc = kind == "decode" or _completes(sc), a.get("accepted")
        nt, nc, ns = _counts(sc)
        yield s.need(acc is completes, f"accepted is {acc}, but the step "
                                       f"{'completes' if completes else 'does not complete'} the prompt (cached {nc} "
                                       f"+ scheduled {ns} of {nt})", a, field="accepted", expected=completes,
                     actual=acc)

    @invariant("async.discarded", "a row is discarded only under async scheduling, for a sequence aborted while the "
                                  "step ran or whose last accepted token was EOS, and it leaves the sequence FINISHED")
    def async_discarded(self, s: _Step, a: dict, sc: dict, q: _Seq):
        if a.get("discarded") is not True:
            yield None
            return
        aborted = any(p.get("seq_id") == a.get("seq_id") for p in self.log.all(s.n, "aborted"))
        eos = (q.tokens[-1] if q.tokens else None) == self.eos and self.eos is not None and not q.ignore_eos
        yield s.need(self.async_scheduling and (aborted or eos) and a.get("accepted") is False
                     and a.get("status") == "FINISHED",
                     f"row discarded (accepted {a.get('accepted')}, status {a.get('status')}) but "
                     + ("async scheduling is off" if not self.async_scheduling else
                        "the sequence was neither aborted in this step nor stopped by an EOS in the step before"),
                     a, field="discarded")

    @invariant("accepted.counts", "an accepted token adds one output and one token")
    def accepted_counts(self, s: _Step, a: dict, sc: dict, q: _Seq):
        comp, nt, snt = a.get("num_completion_tokens"), a.get("num_tokens"), sc.get("num_tokens")
        yield s.need(comp == q.completion + 1 and nt == (snt or 0) + 1, f"an accepted token must add one output and "
                                                                        f"one token (outputs {q.completion} -> {comp}, "
                                                                        f"total {snt} -> {nt})", a, field="outputs",
                     expected=q.completion + 1, actual=comp)

    @invariant("discarded", "a chunk (or a discarded row) never adds an output")
    def discarded(self, s: _Step, a: dict, sc: dict, q: _Seq):
        comp, nt, snt = a.get("num_completion_tokens"), a.get("num_tokens"), sc.get("num_tokens")
        yield s.need(comp == q.completion and nt == snt, f"a chunk or discarded row became an output (outputs "
                                                         f"{q.completion} -> {comp}, total {snt} -> {nt})", a,
                     field="outputs", expected=q.completion, actual=comp)

    @invariant("after.cached", "after a step every computed token is cached: the chunk, or all but the new token")
    def after_cached(self, s: _Step, a: dict, sc: dict):
        nt, nc, acc = a.get("num_tokens"), a.get("num_cached_tokens"), a.get("accepted")
        snt, snc, sns = _counts(sc)
        if a.get("status") == "FINISHED":
            return
        if acc is False and is_int(snc) and is_int(sns):
            want = _start(snc, snt) + sns
            yield s.need(nc == want, f"after a discarded chunk cached should be {want}, got {nc}", a, field="cached",
                         expected=want, actual=nc)
        elif acc is True and is_int(nt):
            yield s.need(nc == nt - 1, f"after an accepted token cached should be {nt - 1}, got {nc}", a,
                         field="cached", expected=nt - 1, actual=nc)

    @invariant("finished.released", "a finished sequence holds no blocks and no cached tokens")
    def finished_released(self, s: _Step, a: dict):
        if a.get("status") == "FINISHED":
            table, nc = list(a.get("block_table") or []), a.get("num_cached_tokens")
            yield s.need(table == [] and nc == 0, f"FINISHED but still holds blocks {table} / cached {nc}", a,
                         field="block_table", expected=[], actual=table)

    @invariant("max_tokens", "a request makes at most max_tokens outputs and finishes when it reaches them")
    def max_tokens(self, s: _Step, a: dict, q: _Seq):
        comp, status = a.get("num_completion_tokens"), a.get("status")
        if q.max_tokens is not None and is_int(comp):
            yield s.need(comp <= q.max_tokens and (comp < q.max_tokens or status == "FINISHED"),
                         f"{comp} outputs with max_tokens {q.max_tokens}, status {status}", a, field="outputs",
                         expected=q.max_tokens, actual=comp)

    # --- blocks: who holds them, and what their KV was computed from
    @invariant("refs", "a block's ref count is the number of live sequences holding it")
    def refs(self, s: _Step, a: dict, holders: dict):
        rc = a.get("ref_counts")
        if rc is None:
            return
        table = list(a.get("block_table") or [])
        ok = isinstance(rc, list) and len(rc) == len(table)
        yield s.need(ok, f"{len(rc) if isinstance(rc, list) else rc!r} ref counts for {len(table)} blocks", a)
        if ok:
            want = [holders.get(b, 0) for b in table]
            yield s.need(list(rc) == want, f"ref_counts {list(rc)}, but {want} live sequences hold blocks {table}", a,
                         field="ref_counts", expected=want, actual=list(rc))

    @invariant("prefix.content", "a prefix-cache hit lands on blocks whose KV this run computed from the same tokens")
    def prefix_content(self, s: _Step, e: dict, q: _Seq, kind: str):
        nc, table, bs = e.get("num_cached_tokens"), list(e.get("block_table") or []), self.bs
        # a fresh allocation (nothing held before this step) with cached tokens is a prefix hit
        if not (kind == "prefill" and not q.table and is_int(nc) and nc > 0 and bs is not None):
            return
        if q.tokens is None:
            self.skip("prefix.content", "request_added carries no prompt_token_ids")
            return
        window = self.log.window_open is not None
        for i in range(min(nc // bs, len(table))):       # block_table.size reports a short table
            want, have = q.tokens[i * bs:(i + 1) * bs], self.written.get(table[i], {})
            if window and not have:   # written before the window opened: this log cannot say what it holds
                self.skip("prefix.content", "a live window's hit on a block written before it opened")
                continue
            got = [have.get(k) for k in range(len(want))]
            if got != want:
                k = next(j for j in range(len(want)) if got[j] != want[j])
                what = ("was never computed in this run" if not have else
                        f"holds token {got[k]} at position {i * bs + k} where this prompt has {want[k]}")
                yield need(False, f"step {s.n}, request {q.request_id}: prefix-cache hit on block {table[i]} (logical "
                                  f"block {i}), but that block {what}", step=s.n, request=q.request_id,
                           field="block_table", expected=want, actual=got)
                return
        yield None

    @invariant("blocks.accounting", "every block of the pool is free or held by a live sequence, never both")
    def accounting(self, s: _Step, fb, holders: dict):
        if self.nb is not None and is_int(fb):
            held, nb = len(holders), self.nb
            yield s.need(0 <= fb <= nb and fb + held == nb, f"free_blocks {fb} + {held} blocks held by live sequences "
                                                            f"= {fb + held}, but the pool has {nb}"
                         + (f": {nb - fb - held} block(s) neither free nor held (leaked)" if fb + held < nb else ""),
                         field="free_blocks", expected=nb - held, actual=fb)

    # --- the end of the run
    def run_end(self):
        self.run(self.engine_raised)
        window = self.log.window_open is not None
        if window:   # a live window ends at its closing live_state (window.end), not at run_end
            for name in ("run.end", "blocks.returned"):
                self.skip(name, "a live window of a running server (window.end checks its end)")
            if self.log.window_close is None:
                self.record("window.end", need(False, "run: the live window has no closing live_state (the "
                                                      "recording was cut short)"))
        else:
            self.run(self.run_ended)
            self.skip("window.end", "not a live window")
        still = {x.get("seq_id") for x in seq_entries(self.log.window_close)}
        for sid, q in self.seqs.items():
            if window and sid in still:
                continue      # live at the window's end: window.end accounts for it
            self.run(self.finished, q)
            self.run(self.outputs, q)
        if not any(q.ignore_eos for q in self.seqs.values()):
            self.skip("requests.outputs", "no request is known to ignore EOS")
        if not window:
            self.run(self.returned)
        if self.case is not None:
            self.case_requests()
            for i, x in enumerate(self.case.expect or []):
                if "final" in x:
                    self.expect_final(i, x["final"])
                elif x["step"] not in self.log.steps:
                    self.missing(i, x["step"], None, "step",
                                 f"not in the log (the run has {len(self.log.steps)} steps)")

    @invariant("engine.raised", "the engine did not raise (no engine_error event)")
    def engine_raised(self):
        errors = self.log.errors
        for e in errors:
            yield need(False, f"{_where(e.get('step'))}: the engine raised {e.get('error')}: {e.get('message')}",
                       step=e.get("step") if is_int(e.get("step")) else None)
        for _ in range(self.log.num_errors - len(errors)):   # past those listed: counted
            yield need(False, "run: the engine raised (more times)")
        if not self.log.num_errors:
            yield None

    @invariant("run.end", "the log ends with one run_end event counting its steps")
    def run_ended(self):
        ends, n = self.log.run_ends, len(self.log.steps)
        yield need(self.log.num_run_ends == 1, f"run: expected one run_end event, found {self.log.num_run_ends} "
                                               "(the run did not finish?)")
        if self.log.num_run_ends == 1:
            got = ends[0].get("steps")
            yield need(got == n, f"run: run_end.steps is {got} but the log has {n} steps", field="steps", expected=n,
                       actual=got)

    @invariant("requests.finished", "every request finishes")
    def finished(self, q: _Seq):
        yield need(q.status == "FINISHED", f"run, request {q.request_id}: ended {q.status}, not FINISHED",
                   request=q.request_id, field="status", expected="FINISHED", actual=q.status)

    @invariant("requests.outputs", "a request that ignores EOS ends with max_tokens outputs, or at max_model_len")
    def outputs(self, q: _Seq):
        # one ended another way (cancelled, aborted: a finish_reason other than length/stop) has fewer
        if (q.status == "FINISHED" and q.ignore_eos and q.max_tokens is not None
                and q.finish_reason in (None, "length", "stop")):
            # the engine stops a sequence at the context limit, as vLLM does, whatever max_tokens asked for
            at_limit = self.max_model_len is not None and is_int(q.num_tokens) and q.num_tokens >= self.max_model_len
            yield need(q.completion == q.max_tokens or at_limit,
                       f"run, request {q.request_id}: finished with {q.completion} outputs and {q.num_tokens} tokens, "
                       f"expected max_tokens={q.max_tokens} (ignore_eos) or max_model_len={self.max_model_len}",
                       request=q.request_id, field="outputs", expected=q.max_tokens, actual=q.completion)

    @invariant("blocks.returned", "every block is free again at the end")
    def returned(self):
        if self.nb is not None and self.last_free is not None:
            yield need(self.last_free == self.nb, f"run: {self.nb - self.last_free} of {self.nb} KV blocks were not "
                                                  f"returned at the end (free_blocks {self.last_free})",
                       field="free_blocks", expected=self.nb, actual=self.last_free)

    # --- the case: its requests, and the states it expects
    def case_requests(self):
        """The log ran the case's requests, with their max_tokens, and `after` was respected."""
        log, case = self.log, self.case
        added = {log.rid(e): (i, e) for i, e in log.added}
        for r in case.requests:
            if r.id not in added:
                self.checks.append(Check("case.requests", False, None, r.id, "request_added",
                                         message=f"run, request {r.id}: never added to the engine", kind="case"))
                continue
            i, e = added[r.id]
            for fld, want in (("max_tokens", r.max_tokens), ("prompt_len", r.prompt_len)):
                if want is not None:    # a text prompt's length is known only after tokenizing
                    ok = e.get(fld) == want
                    self.checks.append(Check("case.requests", ok, None, r.id, fld, want, e.get(fld),
                                             f"request {r.id} added with {fld} {want}" if ok else
                                             f"run, request {r.id}, {fld}: expected {want}, got {e.get(fld)}", "case"))
            if r.after is not None:
                done = log.finished_at.get(r.after)
                ok = done is not None and i > done
                self.checks.append(Check("case.after", ok, None, r.id, "after", r.after, None,
                                         f"request {r.id} added after {r.after} finished" if ok else
                                         f"run, request {r.id}: added before {r.after} finished", "case"))
        extra = sorted(set(added) - set(case.request_ids))
        if extra:
            self.checks.append(Check("case.requests", False, None, None, "request_added", None, extra,
                                     f"run: requests not in the case were added: {', '.join(extra)}", "case"))

    def compare(self, i: int, step, request, fld, expected, actual):
        """One field of the case's expect entry `i`."""
        where, ok = _where(step, request), expected == actual
        self.expected.setdefault(i, []).append(Check("expect", ok, step, request, fld, expected, actual,
                                                     f"{where}, {fld}: {_show(expected)}" if ok else
                                                     f"{where}, {fld}: expected {_show(expected)}, got {_show(actual)}",
                                                     "expect"))

    def missing(self, i: int, step, request, fld, what):
        self.expected.setdefault(i, []).append(Check("expect", False, step, request, fld, None, None,
                                                     f"{_where(step, request)}, {fld}: {what}", "expect"))

    def expect_step(self, st: int):
        """The step against the case's entry for it, field by field, as its events report them."""
        entries = [(i, x) for i, x in enumerate(self.case.expect or []) if x.get("step") == st] if self.case else []
        if not entries:
            return
        i, x = entries[0]
        log = self.log
        sched = log.one(st, "scheduled") or {}
        sseqs = seq_entries(sched)
        if "phase" in x:
            self.compare(i, st, None, "phase", x["phase"], sched.get("phase"))
        if "scheduled" in x:
            self.compare(i, st, None, "scheduled", list(x["scheduled"]), [log.rid(e) for e in sseqs])
            by_rid = {log.rid(e): e for e in sseqs}
            for rid, fields in x["scheduled"].items():
                for f, v in fields.items() if rid in by_rid else ():     # else the id list already differs
                    self.compare(i, st, rid, "scheduled" if f == "scheduled" else f"scheduled.{f}", v,
                                 _field_value(by_rid[rid], f, _SCHED_MAP))
        if "preempted" in x:
            self.compare(i, st, None, "preempted", x["preempted"], [log.rid(p) for p in log.all(st, "preempted")])
        b, gi, ap = log.one(st, "before_schedule"), log.one(st, "gpu_inputs"), log.one(st, "after_postprocess")
        if "before" in x and b is None:
            self.missing(i, st, None, "before", "no before_schedule event")
        for f, v in (x.get("before") or {}).items() if b is not None else ():
            self.compare(i, st, None, f"before.{f}", v, b.get("free_blocks") if f == "free" else log.rids(b.get(f)))
        if "inputs" in x and gi is None:
            self.missing(i, st, None, "inputs", "no gpu_inputs event")
        for f, v in (x.get("inputs") or {}).items() if gi is not None else ():
            self.compare(i, st, None, f, v, gi.get(f))
        a_by_rid = {log.rid(a): a for a in seq_entries(ap)}
        for rid, fields in (x.get("after") or {}).items():
            if rid not in a_by_rid:
                self.missing(i, st, rid, "after", "missing from after_postprocess")
            for f, v in fields.items() if rid in a_by_rid else ():
                self.compare(i, st, rid, f, v, _field_value(a_by_rid[rid], f, _AFTER_MAP))
        for key, fld in (("refs", "ref_counts"), ("released", "released_ref_counts")):
            for rid, v in (x.get(key) or {}).items():
                a = a_by_rid.get(rid)
                if a is None or a.get(fld) is None:
                    self.missing(i, st, rid, key, "missing from after_postprocess" if a is None else
                                 f"after_postprocess carries no {fld}")
                else:
                    self.compare(i, st, rid, key, v, a.get(fld))
        if "free" in x:
            if ap is None:
                self.missing(i, st, None, "free", "no after_postprocess event")
            else:
                self.compare(i, st, None, "free", x["free"], ap.get("free_blocks"))

    def expect_final(self, i: int, final: dict):
        """Each request's last state in the log against the case's `final` entry."""
        for rid, fields in final.items():
            last = self.last_after.get(rid, (None, None))[1]
            if last is None:
                self.missing(i, None, rid, "final", "the request never appears in after_postprocess")
            for f, v in fields.items() if last is not None else ():
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
    if bad > _MAX_FAILURES_PER_NAME:
        schema.append(Check("schema", False, message=f"schema: {bad - _MAX_FAILURES_PER_NAME} more events fail the "
                            f"schema, not listed ({bad} of {len(events)} in all)", kind="schema"))
    if not bad:
        schema.append(Check("schema", True, message=f"schema: {len(events)} events are v1", kind="schema"))
    log = EventLog(events)
    return validate_log(log, case, schema, block_size=block_size, num_kvcache_blocks=num_kvcache_blocks,
                        expect_changes=expect_changes, why_changes=why_changes)


def validate_log(log: EventLog, case: Case | None = None, schema: list[Check] | None = None, *,
                 block_size: int | None = None, num_kvcache_blocks: int | None = None, expect_changes: bool = False,
                 why_changes: str = "") -> Report:
    """validate() of an indexed log: EventLog(events), or EventLog.from_file(path) for a saved log streamed in
    bounded memory (its lines passed the schema as it was read)."""
    if schema is None:
        schema = [Check("schema", True, message=f"schema: {log.num_events} events are v1", kind="schema")]
    rs, cfg = log.run_start, log.config
    policy = cfg.get("scheduling_policy")
    if policy is not None and not (isinstance(policy, str) and policy in POLICIES):
        schema.append(Check("schema", False, message=f"run_start: config.scheduling_policy {policy!r} is not a "
                            f"policy of this engine ({', '.join(POLICIES)}); its steps are judged by "
                            f"{PrefillFirst.name}'s rules", kind="schema"))
    eng = case.engine if case is not None else {}
    bs = block_size or (rs.get("block_size") if is_int(rs.get("block_size")) else None) \
        or _cfg_int(cfg, "kvcache_block_size") or _cfg_int(eng, "kvcache_block_size")
    nb = num_kvcache_blocks or (rs.get("num_kvcache_blocks") if is_int(rs.get("num_kvcache_blocks")) else None)
    if nb is None:
        nb = next((v for v in (_cfg_int(cfg, "num_kvcache_blocks"), _cfg_int(eng, "num_kvcache_blocks"))
                   if v is not None and v > 0), None)
    replay = _Replay(log, case, bs, nb)
    replay.replay()
    run = log.first_run
    return Report(checks=schema + replay.finish(), run=run, steps=len(log.steps),
                  case=case.name if case is not None else None, expect_changes=expect_changes,
                  why_changes=why_changes, live=log.window_open is not None)
