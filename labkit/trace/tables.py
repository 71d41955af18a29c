"""Readable views of an event log: one row per step in EXPECTED.md's notation (the rich table), and a TSV
with one row per step and sequence."""
from __future__ import annotations

import csv
from pathlib import Path

from labkit.trace.cases import format_positions
from labkit.trace.events import EventLog, is_int, seq_entries


def _fmt_sched(log: EventLog, s: dict) -> str:
    return (f"{log.rid(s)} {s.get('num_tokens')}/{s.get('num_cached_tokens')}/"
            f"{s.get('num_scheduled_tokens')}/{len(s.get('block_table') or [])}")


def _fmt_after(log: EventLog, a: dict) -> str:
    acc = "acc" if a.get("accepted") else "discarded"
    return (f"{log.rid(a)} {a.get('num_tokens')}/{a.get('num_cached_tokens')}/"
            f"{a.get('num_completion_tokens')} {a.get('status')} "
            f"{len(a.get('block_table') or [])} {acc}")


def _fmt_inputs(phase: str, sseqs: list[dict], gi: dict | None) -> str:
    if gi is None:
        return "-"
    T = gi.get("num_input_ids")
    if phase == "prefill":
        parts = [s.get("num_scheduled_tokens") or 0 for s in sseqs]
        return (f"T={T} pos {format_positions(gi.get('positions'), parts)} "
                f"cu_q {gi.get('cu_seqlens_q')} cu_k {gi.get('cu_seqlens_k')}")
    return f"T={T} pos {gi.get('positions')} ctx {gi.get('context_lens')}"


def steps_table(events: list[dict]) -> list[dict]:
    """One row per step, in EXPECTED.md's notation.

    Keys: step, phase, waiting, running (request ids before scheduling), before_free,
    scheduled ("ID total/cached/scheduled/blocks; ..."), inputs ("T=.. pos .. cu_q .. cu_k .."
    or "T=.. pos [..] ctx [..]"), preempted ("C" or "-"), after ("ID total/cached/outputs STATUS
    blocks acc|discarded; ..."), free, execution, graph_batch, tokens ({request: token_id} of
    accepted tokens).
    """
    log = EventLog(list(events or []))
    rows = []
    for st in sorted(log.steps):
        sched = log.one(st, "scheduled") or {}
        sseqs = seq_entries(sched)
        phase = sched.get("phase")
        gi = log.one(st, "gpu_inputs")
        ap = log.one(st, "after_postprocess") or {}
        aseqs = seq_entries(ap)
        b = log.one(st, "before_schedule")
        pre = [log.rid(p) for p in log.all(st, "preempted")]
        rows.append({
            "step": st,
            "phase": phase,
            "waiting": log.rids(b.get("waiting")) if b else None,
            "running": log.rids(b.get("running")) if b else None,
            "before_free": b.get("free_blocks") if b else None,
            "scheduled": "; ".join(_fmt_sched(log, s) for s in sseqs) or "-",
            "inputs": _fmt_inputs(phase, sseqs, gi),
            "preempted": ", ".join(pre) or "-",
            "after": "; ".join(_fmt_after(log, a) for a in aseqs) or "-",
            "free": ap.get("free_blocks"),
            "execution": gi.get("execution") if gi else None,
            "graph_batch": gi.get("graph_batch") if gi else None,
            "tokens": {log.rid(a): a.get("token_id") for a in aseqs if a.get("accepted")},
        })
    return rows


def row_kind(s: dict, phase: str | None, prompt_len: int | None) -> str:
    """What one scheduled row computes: "prefill", "prefill chunk" (the prompt is not done after it) or
    "decode". A step's phase covers all its rows only for "prefill" and "decode"; in a step that mixes
    decode rows with prefill chunks each row is told apart by its own counts: a decode row computes the one
    token past a prompt it has already produced from."""
    kind = s.get("phase") if s.get("phase") in ("prefill", "decode") else phase
    total, cached, new = s.get("num_tokens"), s.get("num_cached_tokens"), s.get("num_scheduled_tokens")
    if kind not in ("prefill", "decode"):
        decode = (new == 1 and is_int(total) and is_int(cached) and total - cached == 1
                  and is_int(prompt_len) and total > prompt_len)
        kind = "decode" if decode else "prefill"
    if kind == "prefill" and is_int(total) and is_int(cached) and is_int(new) and cached + new < total:
        return "prefill chunk"
    return kind


def compact_steps(events: list[dict]) -> list[dict]:
    """The terminal view of a log: per step its phase, token budget use, execution and free blocks, and
    one row per request it touched.

    Step keys: step, phase, tokens (computed this step), budget (max_num_batched_tokens), execution
    ("eager", "graph", None), graph_batch, free_before, free_after, waiting (ids before scheduling), rows.
    Row keys: id, kind (row_kind, or "preempted" / "not scheduled"), new (tokens computed), cached_before,
    cached_after (cached + new: what the KV holds after the forward), total (tokens before the step),
    outputs (after the step), token (the id sampled for it), accepted, status, blocks (after the step).
    """
    log = EventLog(list(events or []))
    prompt_len = {e.get("seq_id"): e.get("prompt_len") for _, e in log.added}
    budget = log.config.get("max_num_batched_tokens")
    steps = []
    for st in sorted(log.steps):
        sched = log.one(st, "scheduled") or {}
        phase = sched.get("phase")
        gi = log.one(st, "gpu_inputs") or {}
        ap = log.one(st, "after_postprocess") or {}
        b = log.one(st, "before_schedule") or {}
        after = {a.get("seq_id"): a for a in seq_entries(ap)}
        rows, seen = [], set()
        for s in seq_entries(sched):
            seen.add(s.get("seq_id"))
            a = after.get(s.get("seq_id"), {})
            cached, new = s.get("num_cached_tokens"), s.get("num_scheduled_tokens")
            rows.append({"id": log.rid(s), "kind": row_kind(s, phase, prompt_len.get(s.get("seq_id"))),
                         "new": new, "cached_before": cached,
                         "cached_after": cached + new if is_int(cached) and is_int(new) else None,
                         "total": s.get("num_tokens"), **_after_fields(a)})
        for a in after.values():
            if a.get("seq_id") not in seen:
                rows.append({"id": log.rid(a), "kind": "not scheduled", "new": 0, "cached_before": None,
                             "cached_after": None, "total": a.get("num_tokens"), **_after_fields(a)})
        for p in log.all(st, "preempted"):
            rows.append({"id": log.rid(p), "kind": "preempted", "new": 0, "cached_before": None, "cached_after": None,
                         "total": None, "outputs": None, "token": None, "accepted": None, "status": "WAITING",
                         "blocks": 0})
        steps.append({"step": st, "phase": phase, "budget": budget, "rows": rows,
                      "tokens": sum(s.get("num_scheduled_tokens") or 0 for s in seq_entries(sched)),
                      "execution": gi.get("execution"), "graph_batch": gi.get("graph_batch"),
                      "free_before": b.get("free_blocks"), "free_after": ap.get("free_blocks"),
                      "waiting": log.rids(b.get("waiting"))})
    return steps


def _after_fields(a: dict) -> dict:
    return {"outputs": a.get("num_completion_tokens"), "token": a.get("token_id"), "accepted": a.get("accepted"),
            "status": a.get("status"), "blocks": len(a.get("block_table") or []) if a else None}


TSV_COLUMNS = ("step", "phase", "request_id", "seq_id", "total", "cached", "scheduled", "outputs",
               "status", "blocks", "accepted", "token_id", "free_blocks", "note")


def tsv_rows(events: list[dict]) -> list[dict]:
    """Rows of write_tsv: one per step and scheduled (or preempted) sequence, after-step values."""
    log = EventLog(list(events or []))
    rows = []
    for st in sorted(log.steps):
        sched = log.one(st, "scheduled") or {}
        phase = sched.get("phase")
        ap = log.one(st, "after_postprocess") or {}
        free = ap.get("free_blocks")
        after = {a.get("seq_id"): a for a in seq_entries(ap)}
        seen = set()
        for s in seq_entries(sched):
            sid = s.get("seq_id")
            seen.add(sid)
            a = after.get(sid, {})
            acc = a.get("accepted")
            rows.append({
                "step": st, "phase": phase, "request_id": log.rid(s), "seq_id": sid,
                "total": a.get("num_tokens"), "cached": a.get("num_cached_tokens"),
                "scheduled": s.get("num_scheduled_tokens"), "outputs": a.get("num_completion_tokens"),
                "status": a.get("status"), "blocks": len(a.get("block_table") or []) if a else None,
                "accepted": None if acc is None else int(bool(acc)), "token_id": a.get("token_id"),
                "free_blocks": free, "note": "discarded" if acc is False else "",
            })
        for a in after.values():     # reported but not scheduled (if the engine lists more)
            if a.get("seq_id") in seen:
                continue
            rows.append({
                "step": st, "phase": phase, "request_id": log.rid(a), "seq_id": a.get("seq_id"),
                "total": a.get("num_tokens"), "cached": a.get("num_cached_tokens"), "scheduled": 0,
                "outputs": a.get("num_completion_tokens"), "status": a.get("status"),
                "blocks": len(a.get("block_table") or []), "accepted": None, "token_id": None,
                "free_blocks": free, "note": "not scheduled",
            })
        for p in log.all(st, "preempted"):
            rows.append({
                "step": st, "phase": phase, "request_id": log.rid(p), "seq_id": p.get("seq_id"),
                "total": None, "cached": 0, "scheduled": 0, "outputs": None, "status": "WAITING",
                "blocks": 0, "accepted": None, "token_id": None, "free_blocks": free,
                "note": "preempted",
            })
    return rows


def write_tsv(events: list[dict], path) -> Path:
    """Write tsv_rows(events) as a tab-separated file with a header (TSV_COLUMNS)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(TSV_COLUMNS)
        for r in tsv_rows(events):
            w.writerow(["" if r[c] is None else r[c] for c in TSV_COLUMNS])
    return p


# ----------------------------------------------------------------------------- two runs side by side

DIFF_FIELDS = ("phase", "scheduled", "preempted", "outputs", "free")


def diff_view(events: list[dict]) -> dict[int, dict]:
    """Per step, what `labkit trace diff` compares: phase, scheduled ("R1:64 R2:96", tokens computed),
    preempted, outputs after the step ("R1:1=345": outputs so far = the accepted token; "R1:0" for a
    discarded chunk candidate) and free blocks after the step."""
    log = EventLog(list(events or []))
    view = {}
    for st in sorted(log.steps):
        sched = log.one(st, "scheduled") or {}
        ap = log.one(st, "after_postprocess") or {}
        outs = []
        for a in seq_entries(ap):
            tok = f"={a.get('token_id')}" if a.get("accepted") else ""
            outs.append(f"{log.rid(a)}:{a.get('num_completion_tokens')}{tok}"
                        + (" done" if a.get("status") == "FINISHED" else ""))
        view[st] = {
            "phase": sched.get("phase"),
            "scheduled": " ".join(f"{log.rid(s)}:{s.get('num_scheduled_tokens')}"
                                  for s in seq_entries(sched)) or "-",
            "preempted": " ".join(log.rid(p) for p in log.all(st, "preempted")),
            "outputs": " ".join(outs) or "-",
            "free": ap.get("free_blocks"),
        }
    return view


def diff_rows(a_events: list[dict], b_events: list[dict]) -> tuple[list[dict], int | None]:
    """Rows {step, a, b, differs: [field, ...]} over the union of both runs' steps, and the first step
    where they differ (None when they go through the same states)."""
    a, b = diff_view(a_events), diff_view(b_events)
    rows, first = [], None
    for st in sorted(set(a) | set(b)):
        ra, rb = a.get(st), b.get(st)
        if ra is None or rb is None:
            differs = ["only in " + ("B" if ra is None else "A")]
        else:
            differs = [f for f in DIFF_FIELDS if ra[f] != rb[f]]
        if differs and first is None:
            first = st
        rows.append({"step": st, "a": ra, "b": rb, "differs": differs})
    return rows, first


def config_differences(a_events: list[dict], b_events: list[dict]) -> list[str]:
    """Engine settings that differ between two runs' run_start events ("max_num_batched_tokens: 512 -> 100")."""
    def config(events):
        start = next((e for e in events if isinstance(e, dict) and e.get("event") == "run_start"), {})
        cfg = start.get("config") if isinstance(start.get("config"), dict) else {}
        return {**cfg, **{k: start.get(k) for k in ("num_kvcache_blocks", "block_size", "attention_backend")
                          if k in start}}
    ca, cb = config(a_events), config(b_events)
    return [f"{k}: {ca.get(k)} -> {cb.get(k)}" for k in sorted(set(ca) | set(cb))
            if ca.get(k) != cb.get(k) and k not in ("shm_name", "dist_init_addr")]


def _requests_of(events: list[dict]) -> list[tuple]:
    return [(str(e.get("request_id")), e.get("prompt_len"), e.get("max_tokens"))
            for e in events if isinstance(e, dict) and e.get("event") == "request_added"]


def case_mismatch(a_events: list[dict], b_events: list[dict]) -> str | None:
    """Why two logs are not two runs of one case (None when they may be): the case names their runs recorded
    (trace_context), else the requests they added (id, prompt length, max_tokens). A step diff of two
    different cases lines up states that have nothing to do with each other."""
    def case_name(events):
        return next((e.get("case") for e in events if isinstance(e, dict) and e.get("event") == "trace_context"
                     and e.get("case")), None)
    ca, cb = case_name(a_events), case_name(b_events)
    if ca and cb and ca != cb:
        return f"A is a run of case {ca} and B of case {cb}"
    ra, rb = _requests_of(a_events), _requests_of(b_events)
    if ra != rb:
        def show(reqs):
            return ", ".join(f"{r} ({n} prompt tokens, {m} out)" for r, n, m in reqs[:4]) + \
                (f" and {len(reqs) - 4} more" if len(reqs) > 4 else "") if reqs else "none"
        return f"the two runs added different requests: A {show(ra)}; B {show(rb)}"
    return None
