"""Every lab of the plan with its status: the result(s) that answer it, the verdict, the evidence against the
evidence it needs; and the caveats a reviewer must read first."""
from __future__ import annotations

from dataclasses import dataclass, field

from labkit.output import EVIDENCE_KINDS
from labkit.report.command_line import closest, plan_lines
from labkit.report.plan import Lab, evidence_satisfies
from labkit.report.results import Gathered, Result, worst


@dataclass
class SlotStatus:
    label: str
    result: Result | None
    # Further results that match the same slot (weaker evidence, further from the lab's command, or older),
    # best first: each try of another configuration is a record of its own, none erased by the next.
    passed_over: list[Result] = field(default_factory=list)
    differs: list[str] = field(default_factory=list)   # how the shown result's command differs from the lab's
    chosen_for: str = ""     # why it was preferred to the next: stronger evidence, nearer the lab's command, newer

    @property
    def verdict(self) -> str:
        return self.result.verdict if self.result else "MISSING"

    @property
    def others(self) -> int:
        return len(self.passed_over)

    def which(self) -> str:
        """Which result the lab shows and why, where there was a choice or it is not the lab's own command
        ("" otherwise)."""
        if self.result is None or not (self.differs or self.passed_over):
            return ""
        text = f"shows {self.result.rel}"
        if self.differs:
            text += f", not the lab's command ({', '.join(self.differs)})"
        if self.passed_over:
            shown = ", ".join(f"{r.rel} {r.verdict}" for r in self.passed_over[:3])
            more = f" and {len(self.passed_over) - 3} more" if len(self.passed_over) > 3 else ""
            text += f" ({self.chosen_for}); also {shown}{more}"
        return text


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
        if self.lab.view is not None and self.results:  # read across the lab's results (labkit/report/views.py)
            from labkit.report.views import headline

            return headline(self)
        parts = []
        for s in self.slots:
            if s.result is None:
                why = f": {self.lab.producer}" if self.lab.producer else ""
                parts.append(f"{s.label}: not run{why}" if len(self.slots) > 1 else f"not run{why}")
            else:
                text = s.result.headline or s.result.verdict
                parts.append(f"{s.label}: {text}" if len(self.slots) > 1 else text)
        return "; ".join(parts)

    def which(self) -> str:
        """For each slot where the report chose among results, or took another command's: which and why."""
        parts = [(s.label, s.which()) for s in self.slots]
        return "; ".join(f"{label}: {w}" if len(self.slots) > 1 else w for label, w in parts if w)

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
                "shown": self.which(),
                "results": [{"slot": s.label, "file": s.result.rel if s.result else None, "verdict": s.verdict,
                             "differs_from_lab_command": s.differs, "other_matches": s.others,
                             "other_files": [r.rel for r in s.passed_over]} for s in self.slots]}


def assign(labs: list[Lab], results: list[Result], notes: dict[str, str] | None = None) -> list[LabStatus]:
    """Each slot of each lab gets, among the results its conditions accept, the one of the strongest evidence,
    then the nearest to the lab's own command line (options a result's argv adds, changes or lacks), then the
    one written where that line writes (its --out), then the newest; the others stay listed beside it."""
    out = []
    for lab in labs:
        lines = plan_lines(lab.command)
        slots = []
        for slot in lab.slots:
            ranked = []
            for r in results:
                if slot.accepts(r.data, r.rel):
                    n, elsewhere, differs = closest(lines, r.data.get("argv"))
                    ranked.append(((EVIDENCE_KINDS.index(r.evidence), n, elsewhere), r, differs))
            ranked.sort(key=lambda x: (x[1].started_at, x[1].rel), reverse=True)   # newest first, then ...
            ranked.sort(key=lambda x: x[0])                                       # ... stably by evidence, nearness
            if ranked:
                slots.append(SlotStatus(slot.label, ranked[0][1], [r for _, r, _ in ranked[1:]], ranked[0][2],
                                        _chosen_for(ranked)))
            else:
                slots.append(SlotStatus(slot.label, None))
        out.append(LabStatus(lab, slots, (notes or {}).get(lab.id, "none")))
    return out



def _chosen_for(ranked: list) -> str:
    """Why the first of the ranked results was preferred to the second."""
    if len(ranked) < 2:
        return ""
    (evidence, near, place), (evidence2, near2, place2) = ranked[0][0], ranked[1][0]
    if evidence != evidence2:
        return "the strongest evidence"
    if near != near2:
        return "the nearest to the lab's command"
    if place != place2:
        return "written where the lab's command writes"
    return "the newest"


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
