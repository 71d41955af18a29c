"""Readable views of an event log: one row per step in EXPECTED.md's notation (the rich table), and a TSV
with one row per step and sequence."""
from __future__ import annotations

import csv
from pathlib import Path

from labkit.trace.cases import format_positions
from labkit.trace.events import EventLog

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
        sseqs = [s for s in sched.get("seqs") or [] if isinstance(s, dict)]
        phase = sched.get("phase")
        gi = log.one(st, "gpu_inputs")
        ap = log.one(st, "after_postprocess") or {}
        aseqs = [a for a in ap.get("seqs") or [] if isinstance(a, dict)]
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
        after = {a.get("seq_id"): a for a in ap.get("seqs") or [] if isinstance(a, dict)}
        seen = set()
        for s in sched.get("seqs") or []:
            if not isinstance(s, dict):
                continue
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
        for a in ap.get("seqs") or []:
            if isinstance(a, dict):
                tok = f"={a.get('token_id')}" if a.get("accepted") else ""
                outs.append(f"{log.rid(a)}:{a.get('num_completion_tokens')}{tok}"
                            + (" done" if a.get("status") == "FINISHED" else ""))
        view[st] = {
            "phase": sched.get("phase"),
            "scheduled": " ".join(f"{log.rid(s)}:{s.get('num_scheduled_tokens')}"
                                  for s in sched.get("seqs") or [] if isinstance(s, dict)) or "-",
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
