"""Every lab of the plan with its status: the result(s) that answer it, the verdict, the evidence against the
evidence it needs; and the caveats a reviewer must read first."""
from __future__ import annotations

from dataclasses import dataclass

from labkit.output import EVIDENCE_KINDS
from labkit.report.plan import Lab, evidence_satisfies
from labkit.report.results import Gathered, Result, worst


@dataclass
class SlotStatus:
    label: str
    result: Result | None
    others: int = 0          # further results that match the same slot (older or weaker evidence)

    @property
    def verdict(self) -> str:
        return self.result.verdict if self.result else "MISSING"


@dataclass
class LabStatus:
    lab: Lab
    slots: list[SlotStatus]
    note: str = "none"        # the lab's note in notes/: none / N TODO / written

    @property
    def results(self) -> list[Result]:
        return [s.result for s in self.slots if s.result is not None]

    @property
    def verdict(self) -> str:
        return worst([s.verdict for s in self.slots])

    @property
    def evidence(self) -> str | None:
        """The weakest evidence among the lab's results (None when it has none)."""
        kinds = [r.evidence for r in self.results]
        return max(kinds, key=EVIDENCE_KINDS.index) if kinds else None

    @property
    def evidence_short(self) -> bool:
        """Results exist, but weaker than the lab needs (e.g. CPU runs of a lab that needs the GPU)."""
        return bool(self.results) and not all(evidence_satisfies(r.evidence, self.lab.evidence) for r in self.results)

    def headline(self) -> str:
        parts = []
        for s in self.slots:
            if s.result is None:
                why = f": {self.lab.producer}" if self.lab.producer else ""
                parts.append(f"{s.label}: not run{why}" if len(self.slots) > 1 else f"not run{why}")
            else:
                text = s.result.headline or s.result.verdict
                parts.append(f"{s.label}: {text}" if len(self.slots) > 1 else text)
        return "; ".join(parts)

    def commits(self) -> str:
        heads = []
        for r in self.results:
            h = (r.git_head or "-")[:10] + (" (dirty)" if r.git_dirty else "")
            if h not in heads:
                heads.append(h)
        return ", ".join(heads) or "-"

    def devices(self) -> str:
        return ", ".join(dict.fromkeys(r.device or "-" for r in self.results)) or "-"

    def to_dict(self) -> dict:
        return {"lab": self.lab.id, "title": self.lab.title, "command": self.lab.command,
                "verdict": self.verdict, "evidence": self.evidence, "evidence_needed": self.lab.evidence,
                "evidence_short": self.evidence_short, "headline": self.headline(), "commit": self.commits(),
                "device": self.devices(), "note": self.note,
                "results": [{"slot": s.label, "file": s.result.rel if s.result else None, "verdict": s.verdict,
                             "other_matches": s.others} for s in self.slots]}


def _preference(r: Result) -> tuple:
    # The strongest evidence first, then the newest run.
    return (-EVIDENCE_KINDS.index(r.evidence), r.started_at)


def assign(labs: list[Lab], results: list[Result], notes: dict[str, str] | None = None) -> list[LabStatus]:
    out = []
    for lab in labs:
        slots = []
        for slot in lab.slots:
            found = [r for r in results if slot.accepts(r.data, r.rel)]
            best = max(found, key=_preference) if found else None
            slots.append(SlotStatus(slot.label, best, len(found) - 1 if found else 0))
        out.append(LabStatus(lab, slots, (notes or {}).get(lab.id, "none")))
    return out


def caveats(statuses: list[LabStatus], gathered: Gathered, todo_notes: list[str]) -> list[str]:
    results = gathered.results
    out = []
    if gathered.unreadable:
        out.append(f"{len(gathered.unreadable)} file(s) under runs/ could not be read (UNREADABLE below): "
                   "whatever they held is not in this report")
    short = [s for s in statuses if s.evidence_short]
    if short:
        by_need: dict[str, list[str]] = {}
        for s in short:
            by_need.setdefault(s.lab.evidence, []).append(s.lab.id)
        for need, ids in by_need.items():
            out.append(f"{len(ids)} lab(s) need {need} evidence but have only weaker results ({', '.join(ids)}): "
                       "their verdicts show the code path runs there, not what the lab asks of "
                       f"{'a GPU' if need == 'gpu-measured' else need + ' evidence'}")
    missing = [s.lab.id for s in statuses if any(x.result is None for x in s.slots)]
    if missing:
        out.append(f"{len(missing)} of {len(statuses)} labs are MISSING a result (not run): {', '.join(missing)}")
    if results and not any(r.evidence == "gpu-measured" for r in results):
        out.append("no result was measured on a GPU: every conclusion here stays within CPU execution and "
                   "static estimates")
    heads = sorted({r.git_head for r in results if r.git_head})
    if len(heads) > 1:
        out.append(f"results come from {len(heads)} commits ({', '.join(h[:10] for h in heads)}): "
                   "compare only results of one commit unless the commit is the variable")
    if any(r.git_head is None for r in results):
        out.append("some results have no commit (run outside a checkout or an archive without labkit/COMMIT)")
    dirty = [r for r in results if r.git_dirty]
    if dirty:
        out.append(f"{len(dirty)} result(s) ran on a tree with uncommitted changes: the commit alone does not "
                   "reproduce them (provenance/engine.diff holds the engine's diff at report time)")
    kinds = {r.evidence for r in results}
    if "gpu-measured" in kinds and len(kinds) > 1:
        out.append("GPU measurements sit next to CPU executions: CPU timings say nothing about the GPU")
    if todo_notes:
        out.append(f"{len(todo_notes)} note(s) in notes/ still hold TODO: {', '.join(todo_notes)}")
    return out
