"""`labkit patch prove`: show that each fault patch is caught by the check its index entry names.

A fault is proven caught when its check PASSES on the clean engine and FAILS with the patch applied.
Both runs happen in temporary trees, never in the project: each tree is a copy of the project's checks
(labkit/, tests/, workloads/, pyproject.toml, as they are in the working copy) with engine/ as git HEAD
has it (`git archive`: the patches are written against HEAD, and a patch applied to the checkout with
`labkit patch apply` does not leak into the baseline). Without git (an installed copy, an archive),
engine/ is copied as found, and the output says the baseline could not be tied to a commit. A copy
rather than a `git worktree`: nothing is registered in the repository, so an interrupted run leaves
nothing behind to prune.

Checks (the index's "caught by" column), all on the CPU with the tiny model:

    trace CASE INVARIANT   labkit trace --case CASE; clean: PASS; patched (run with --expect-changes, so
                           the case's expected states are only a diff): FAIL with INVARIANT among the
                           failures. A fault must break an invariant, not merely move the schedule.
    test NODEID            python -m pytest NODEID; clean: passes; patched: fails.
    logits SUITE           labkit logits-check run --suite SUITE --dtype float32; clean: PASS; patched: FAIL.

Each distinct check runs once on the clean tree, however many patches name it.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labkit.errors import LabkitError

CHECK_KINDS = {"trace": 2, "test": 1, "logits": 1}   # kind -> number of arguments
TREE_PARTS = ("labkit", "tests", "workloads")
TREE_FILES = ("pyproject.toml",)
CHECK_TIMEOUT_S = 600


@dataclass(frozen=True)
class CheckSpec:
    kind: str
    args: tuple[str, ...]

    @property
    def text(self) -> str:
        return " ".join((self.kind,) + self.args)

    @property
    def run_key(self) -> str:
        """Checks that run the same command share one clean run (trace C slots / trace C inputs.positions)."""
        return f"trace {self.args[0]}" if self.kind == "trace" else self.text


def parse_check(text: str, patch: str) -> CheckSpec:
    """`trace C slots`, `test tests/test_x.py::name`, `logits baseline` (backticks allowed)."""
    words = text.replace("`", " ").split()
    if not words or words[0] not in CHECK_KINDS:
        raise LabkitError(f"patch prove: {patch}: the index names no check (\"caught by\" should start with "
                          f"{', '.join(CHECK_KINDS)}; got {text.strip() or 'nothing'!r})")
    if len(words) - 1 != CHECK_KINDS[words[0]]:
        raise LabkitError(f"patch prove: {patch}: check {text.strip()!r} needs {CHECK_KINDS[words[0]]} "
                          f"argument(s) after {words[0]!r}")
    return CheckSpec(words[0], tuple(words[1:]))


@dataclass
class CheckRun:
    """One run of a check in one tree."""
    rc: int | None            # None: timed out
    seconds: float
    failed: list[str] = field(default_factory=list)   # trace: the failed invariants (and other gating checks)
    detail: str = ""


@dataclass
class Proof:
    patch: str
    check: str
    clean: CheckRun | None = None
    patched: CheckRun | None = None
    result: str = "NOT CAUGHT"     # CAUGHT | NOT CAUGHT | BASELINE FAILS | DOES NOT APPLY | NO CHECK
    why: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- trees

def engine_source(root: Path) -> tuple[str, str | None]:
    """How the clean tree gets engine/: ("git", HEAD) when the project is its own git checkout, else
    ("copy", None)."""
    try:
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=30)
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "copy", None
    if top.returncode or head.returncode or Path(top.stdout.strip()).resolve() != root.resolve():
        return "copy", None
    return "git", head.stdout.strip()


def make_clean_tree(root: Path, dest: Path, source: str) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for part in TREE_PARTS:
        if (root / part).is_dir():
            shutil.copytree(root / part, dest / part, ignore=ignore)
    for name in TREE_FILES:
        if (root / name).is_file():
            shutil.copy2(root / name, dest / name)
    if source == "git":
        archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", "HEAD", "engine"],
                                 capture_output=True, timeout=120)
        if archive.returncode:
            raise LabkitError(f"patch prove: git archive HEAD engine failed: "
                              f"{archive.stderr.decode(errors='replace').strip()[:200]}")
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            # the "data" filter (no absolute paths, links out of the tree...) where this Python has it
            tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    else:
        shutil.copytree(root / "engine", dest / "engine", ignore=ignore)


def apply_patch(tree: Path, patch: Path) -> str | None:
    """Apply `patch` inside `tree`; None on success, else the first line of the error."""
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}
    res = subprocess.run(["git", "apply", str(patch)], cwd=tree, capture_output=True, text=True, timeout=60,
                         env=env)
    if res.returncode == 0:
        return None
    lines = [x for x in (res.stderr or res.stdout).splitlines() if x.strip()]
    return lines[0].strip() if lines else f"git apply exited {res.returncode}"


# ----------------------------------------------------------------------------- checks

def check_command(spec: CheckSpec, model: Path, out: Path, patched: bool) -> list[str]:
    py = sys.executable
    if spec.kind == "trace":
        cmd = [py, "-m", "labkit", "trace", "--case", spec.args[0], "--model", str(model), "--device", "cpu",
               "-q", "--out", str(out)]
        # Patched: the case's states become a diff, so only invariants can fail the run. Clean: they gate.
        return cmd + (["--expect-changes"] if patched else ["--no-expect-changes"])
    if spec.kind == "test":
        # One test, in this process: no xdist workers, and no addopts (their `-m 'not slow'` would deselect it).
        return [py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=",
                spec.args[0]]
    return [py, "-m", "labkit", "logits-check", "run", "--suite", spec.args[0], "--device", "cpu",
            "--dtype", "float32", "--model", str(model), "--out", str(out)]


def tree_env(tree: Path, runs: Path, model: Path | str) -> dict:
    """The environment of a check run in `tree`: its code first on the path, its own runs/, the tiny model,
    the CPU only, and no git checkout around it."""
    env = dict(os.environ)
    env.update({"PYTHONPATH": str(tree), "LAB_ROOT": str(tree), "RUNS_DIR": str(runs), "MODEL_DIR": str(model),
                "CUDA_VISIBLE_DEVICES": "", "GIT_CEILING_DIRECTORIES": str(tree.parent),
                "PYTHONDONTWRITEBYTECODE": "1"})
    env.pop("LABKIT_DEBUG", None)
    return env


def run_check(spec: CheckSpec, tree: Path, model: Path, out: Path, patched: bool) -> CheckRun:
    env = tree_env(tree, out / "runs", model)
    cmd = check_command(spec, model, out, patched)
    t0 = time.perf_counter()
    try:
        res = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return CheckRun(None, time.perf_counter() - t0, detail=f"timed out after {CHECK_TIMEOUT_S} s")
    run = CheckRun(res.returncode, time.perf_counter() - t0)
    text = (res.stdout + "\n" + res.stderr).strip().splitlines()
    if spec.kind == "trace":
        run.failed, run.detail = _trace_outcome(out / "check.json")
    if not run.detail:
        lines = [" ".join(x.split()) for x in text if x.strip()]
        run.detail = (next((x for x in reversed(lines) if "VERDICT" in x), None) or (lines[-1] if lines else ""))
    if res.returncode not in (0, 1):
        err = [x for x in text if x.startswith("labkit:")] or text[-1:]
        run.detail = f"could not run (exit {res.returncode}): {' '.join(err)[:200]}"
    return run


def _trace_outcome(check_json: Path) -> tuple[list[str], str]:
    try:
        report = json.loads(check_json.read_text(encoding="utf-8"))["report"]
    except (OSError, ValueError, KeyError):
        return [], ""
    # what gates under --expect-changes: not the case's states, not nano's policy rules
    failed = [c for c in report.get("checks", []) if not c.get("ok") and c.get("kind") not in ("expect", "policy")]
    names = sorted({c["name"] for c in failed})
    first = failed[0]["message"] if failed else f"verdict {report.get('verdict')}"
    return names, first


def judge(proof: Proof, spec: CheckSpec) -> None:
    clean, bad = proof.clean, proof.patched
    if clean.rc != 0:
        proof.result, proof.why = "BASELINE FAILS", f"the check does not pass on the clean engine: {clean.detail}"
        return
    if bad.rc != 1:
        proof.result = "NOT CAUGHT"
        proof.why = ("the check passes with the patch applied" if bad.rc == 0 else bad.detail)
        return
    if spec.kind == "trace" and spec.args[1] not in bad.failed:
        proof.result = "NOT CAUGHT"
        proof.why = (f"the index names invariant {spec.args[1]}, but the run failed "
                     f"{', '.join(bad.failed) or 'no invariant'}")
        return
    proof.result, proof.why = "CAUGHT", bad.detail


def prove(entries, root: Path, model: Path, work: Path, jobs: int, progress=None) -> tuple[list[Proof], dict]:
    """Prove every entry (PatchEntry with .name, .path, .caught_by); returns the proofs and facts about the
    baseline (engine source, commit)."""
    source, head = engine_source(root)
    clean_tree = work / "clean"
    clean_tree.mkdir(parents=True)
    make_clean_tree(root, clean_tree, source)
    proofs: list[Proof] = []
    specs: dict[str, CheckSpec] = {}
    trees: dict[str, Path] = {}
    for e in entries:
        proof = Proof(e.name[:-len(".patch")], e.caught_by)
        proofs.append(proof)
        try:
            spec = parse_check(e.caught_by, e.name)
        except LabkitError as err:
            proof.result, proof.why = "NO CHECK", str(err).removeprefix("patch prove: ")
            continue
        tree = work / f"tree-{proof.patch}"
        shutil.copytree(clean_tree, tree)
        err = apply_patch(tree, e.path)
        if err:
            proof.result, proof.why = "DOES NOT APPLY", err
            continue
        specs[proof.patch] = spec
        trees[proof.patch] = tree

    def say(msg):
        if progress:
            progress(msg)

    by_key = {s.run_key: s for s in specs.values()}

    def clean_run(i: int, key: str) -> CheckRun:
        r = run_check(by_key[key], clean_tree, model, work / f"out-clean-{i}", patched=False)
        say(f"clean   {key}: exit {r.rc} ({r.seconds:.0f} s)")
        return r

    def patched_run(name: str) -> CheckRun:
        r = run_check(specs[name], trees[name], model, work / f"out-{name}", patched=True)
        say(f"patched {name} ({specs[name].text}): exit {r.rc} ({r.seconds:.0f} s)")
        return r

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        clean = {key: pool.submit(clean_run, i, key) for i, key in enumerate(sorted(by_key))}
        patched = {name: pool.submit(patched_run, name) for name in specs}
        for proof in proofs:
            if proof.patch in specs:
                proof.clean = clean[specs[proof.patch].run_key].result()
                proof.patched = patched[proof.patch].result()
                judge(proof, specs[proof.patch])
    facts = {"engine_source": "git HEAD" if source == "git" else "copy of engine/ as found (no git checkout)",
             "commit": head, "checks_from": str(root), "note": None}
    if source == "git":
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "engine"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        if dirty:
            facts["note"] = ("engine/ in the checkout differs from HEAD (a patch applied?): the proof uses "
                             "HEAD's engine, as the patches are written against it")
    return proofs, facts


def work_dir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="labkit-prove-")
