#!/usr/bin/env python
"""Mutation testing of labkit's own checks: do the trace cases and the fast tests notice a one-line bug?

    python scripts/mutate.py                      # every mutation; a table and runs/mutate/mutate.json
    python scripts/mutate.py --only S1 B4         # some of them
    python scripts/mutate.py --list               # the mutations, nothing run
    nohup python scripts/mutate.py > runs/mutate.log 2>&1 &    # all of them take a while on 2 cores

Each mutation replaces one exact piece of one line of the engine (scheduler, block manager, runner,
sampler; one in the engine loop). The script builds a temporary tree like `labkit patch prove` does
(labkit/, tests/, workloads/ from the working copy, engine/ from git HEAD, or as found without git),
checks that everything passes there, then for each mutation, in a fresh copy of that tree:
  1. runs `labkit trace --case NAME --no-expect-changes` for every case in workloads/cases (in one
     Python process, through the CLI entry point; --no-expect-changes because the mutated engine
     differs from nothing git can see, and a moved schedule must count);
  2. runs the fast tests (FAST_TESTS) with pytest;
and prints which cases (with the invariants or expectations that failed) and which tests caught it.
A mutation nothing catches is a SURVIVOR: it needs a new case, expectation or test, unless it changes
no behaviour (EQUIVALENT lists those, with the reason); docs/evidence.md records the list and the score.
Exit 0 when every non-equivalent mutation is caught, 1 otherwise, 2 when the unmutated tree fails.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAST_TESTS = [
    "tests/test_block_manager.py", "tests/test_sampler.py", "tests/test_scheduler_policy.py",
    "tests/test_graph_fallback.py", "tests/test_graph_inputs.py", "tests/test_engine_numbers.py",
    "tests/test_api.py",
]
CASES_TIMEOUT_S = 900
TESTS_TIMEOUT_S = 1500


@dataclass(frozen=True)
class Mutation:
    id: str
    file: str        # under engine/
    old: str         # an exact piece of exactly one line of the file
    new: str
    what: str


MUTATIONS = [
    # --- scheduler -------------------------------------------------------------------------------
    Mutation("S1", "scheduler.py", "while self.waiting and len(scheduled) < self.max_num_seqs:",
             "while self.waiting and len(scheduled) <= self.max_num_seqs:",
             "prefill takes max_num_seqs + 1 sequences"),
    Mutation("S2", "scheduler.py", "if remaining < num_tokens and scheduled:",
             "if remaining <= num_tokens and scheduled:",
             "a later prompt that exactly fills the budget waits"),
    Mutation("S3", "scheduler.py", "seq.num_scheduled_tokens = min(num_tokens, remaining)",
             "seq.num_scheduled_tokens = max(num_tokens, remaining)",
             "a chunk ignores the token budget"),
    Mutation("S4", "scheduler.py", "                    self.preempt(self.running.pop())",
             "                    self.preempt(self.running.popleft())",
             "preemption takes the head of running instead of the tail (pop end)"),
    Mutation("S5", "scheduler.py", "self.running.extendleft(reversed(scheduled))",
             "self.running.extend(scheduled)",
             "prefill_first decode rotates served sequences to the tail"),
    Mutation("S6", "scheduler.py", "            self.waiting.appendleft(seq)",
             "            self.waiting.append(seq)",
             "a preempted sequence goes to the back of waiting"),
    Mutation("S7", "scheduler.py", "            if seq.num_cached_tokens < seq.num_tokens:",
             "            if seq.num_cached_tokens <= seq.num_tokens:",
             "postprocess discards every token (comparison)"),
    Mutation("S8", "scheduler.py", "elif seq.num_completion_tokens == seq.max_tokens:",
             "elif seq.num_completion_tokens > seq.max_tokens:",
             "a request stops one token after max_tokens"),
    Mutation("S9", "scheduler.py", "            self.block_manager.hash_blocks(seq)",
             "            pass",
             "hashes are never registered (prefix cache off)"),
    Mutation("S10", "scheduler.py", "            seq.num_scheduled_tokens = 0\n            if seq.num_cached",
             "            if seq.num_cached",
             "postprocess skips resetting num_scheduled_tokens"),
    Mutation("S11", "scheduler.py", 'if self.policy == "balanced" and self.last_phase_prefill and self.running:',
             'if self.policy == "balanced" and not self.last_phase_prefill and self.running:',
             "balanced alternates the wrong way"),
    # --- block manager ---------------------------------------------------------------------------
    Mutation("B1", "block_manager.py", "for i in range(seq.num_blocks - 1):",
             "for i in range(seq.num_blocks):",
             "the prefix lookup does not skip the last block"),
    Mutation("B2", "block_manager.py", "return num_cached if len(self.free_block_ids) >= num_new else -1",
             "return num_cached if len(self.free_block_ids) > num_new else -1",
             "a prompt that needs exactly the free blocks waits"),
    Mutation("B3", "block_manager.py", "        self.free_block_ids.append(block_id)",
             "        self.free_block_ids.appendleft(block_id)",
             "a freed block is reused first (LIFO), so cached blocks are overwritten early"),
    Mutation("B4", "block_manager.py", "        for block_id in reversed(seq.block_table):",
             "        for block_id in seq.block_table:",
             "blocks are freed first-to-last"),
    Mutation("B5", "block_manager.py", "                block.ref_count += 1",
             "                block.ref_count = 1",
             "a shared prefix hit sets the ref count instead of adding to it"),
    Mutation("B6", "block_manager.py", "            self.hash_to_block_id[h] = block.block_id",
             "            pass",
             "a computed block's hash is not registered"),
    Mutation("B7", "block_manager.py", "        start = seq.num_cached_tokens // self.block_size",
             "        start = 0",
             "hash_blocks rehashes every block from the first"),
    Mutation("B8", "block_manager.py", "        return max(0, seq.num_blocks - len(seq.block_table))",
             "        return max(0, seq.num_blocks - len(seq.block_table) - 1)",
             "decode never appends the block a new token needs"),
    Mutation("B9", "block_manager.py", "        seq.num_cached_tokens = 0\n        seq.block_table.clear()",
             "        seq.block_table.clear()",
             "deallocate skips resetting num_cached_tokens"),
    Mutation("B10", "block_manager.py", "            if block_id == -1 or self.blocks[block_id].token_ids != token_ids:",
             "            if block_id == -1:",
             "the prefix lookup trusts the hash without comparing tokens"),
    Mutation("B11", "block_manager.py", "            del self.hash_to_block_id[block.hash]",
             "            pass",
             "a block handed out for new content keeps its old hash mapping"),
    # --- runner ----------------------------------------------------------------------------------
    Mutation("R1", "runner.py", "            seqlen_k = end  # keys",
             "            seqlen_k = end - start  # keys",
             "cu_seqlens_k counts only this step's keys"),
    Mutation("R2", "runner.py", "        if cu_k[-1] > cu_q[-1]:",
             "        if cu_k[-1] >= cu_q[-1]:",
             "prefill block_tables sent without a cached prefix"),
    Mutation("R3", "runner.py", "        context_lens = [len(seq) for seq in seqs]",
             "        context_lens = [len(seq) - 1 for seq in seqs]",
             "decode context excludes the token being decoded"),
    Mutation("R4", "runner.py", "        return [table[p // bs] * bs + p % bs for p in range(start, end)]",
             "        return [table[p // bs] * bs + p % bs + 1 for p in range(start, end)]",
             "prefill slots one past"),
    Mutation("R5", "runner.py", "            start = min(seq.num_cached_tokens, len(seq) - 1)",
             "            start = seq.num_cached_tokens",
             "prefill starts at num_cached_tokens even for a fully cached sequence"),
    Mutation("R6", "runner.py", "next(b for b in self.graph_bs if b >= len(seqs))",
             "next(b for b in self.graph_bs if b > len(seqs))",
             "a decode batch takes the next bucket up"),
    Mutation("R7", "runner.py", "        return [seq.block_table + [-1] * (width - len(seq.block_table)) for seq in seqs]",
             "        return [seq.block_table + [0] * (width - len(seq.block_table)) for seq in seqs]",
             "block tables padded with block 0 instead of -1"),
    Mutation("R8", "runner.py", "        temps = [s.temperature for s in seqs]",
             "        temps = [1.0 for s in seqs]",
             "the runner drops each request's temperature"),
    # --- sampler ---------------------------------------------------------------------------------
    Mutation("P1", "sampler.py", "        scaled = logits / torch.where(is_greedy, 1.0, temperatures).unsqueeze(1)",
             "        scaled = logits",
             "the sampler drops the temperature"),
    Mutation("P2", "sampler.py", "        is_greedy = temperatures <= 0",
             "        is_greedy = temperatures < 0",
             "temperature 0 is not greedy"),
    Mutation("P3", "sampler.py", 'return logits.masked_fill(logits < kth, float("-inf"))',
             'return logits.masked_fill(logits <= kth, float("-inf"))',
             "top-k keeps k - 1"),
    Mutation("P4", "sampler.py", "    drop_sorted = mass_before >= top_ps.unsqueeze(1)",
             "    drop_sorted = mass_before > top_ps.unsqueeze(1)",
             "top-p keeps a token whose preceding mass already reaches top_p"),
    Mutation("P5", "sampler.py", "        return torch.where(is_greedy, logits.argmax(dim=-1), sampled)",
             "        return torch.where(is_greedy, sampled, logits.argmax(dim=-1))",
             "greedy and sampled rows swapped"),
    # --- engine loop -----------------------------------------------------------------------------
    Mutation("L1", "llm.py", '            tracer.emit("sampled",',
             '            (lambda *a, **k: None)("sampled",',
             "the sampled event is not emitted"),
]

# Mutations that change no behaviour a check could see, and why (they are not counted as survivors).
EQUIVALENT = {
    "S10": "num_scheduled_tokens is set again by the scheduler before any use: the next schedule() assigns "
           "it for every scheduled sequence, and nothing reads it between steps",
    "B7": "rehashing already-hashed blocks recomputes the same chain (the first block's prefix is -1) and "
          "registers the same hash -> block mappings: only slower",
    "B10": "defence in depth: a block handed out for new content drops its old hash (B11's line), so a hash "
           "hit always has the same tokens; only B10 + B11 together break it "
           "(patches/fault-prefix-hit-stale-block.patch)",
    "B11": "defence in depth: the lookup compares a hit's tokens (B10's line), so a stale hash -> block "
           "mapping is never used; only B10 + B11 together break it",
    "R5": "the prefix lookup skips a sequence's last block, so num_cached_tokens < len(seq) whenever a "
          "prefill starts: min(cached, len - 1) is always cached",
}


# ----------------------------------------------------------------------------- trees

def build_tree(dest: Path) -> str:
    from labkit.patch_prove import engine_source, make_clean_tree

    source, head = engine_source(ROOT)
    make_clean_tree(ROOT, dest, source)
    return f"git HEAD {head[:12]}" if head else "engine/ copied as found (no git)"


def mutate(tree: Path, m: Mutation) -> None:
    path = tree / "engine" / m.file
    text = path.read_text(encoding="utf-8")
    n = text.count(m.old)
    if n != 1:
        raise ValueError(f"{m.id}: {m.old!r} occurs {n} times in engine/{m.file} (the engine changed?)")
    path.write_text(text.replace(m.old, m.new), encoding="utf-8")


def _env(tree: Path, runs: Path, model: str) -> dict:
    from labkit.patch_prove import tree_env

    return tree_env(tree, runs, model)


# ----------------------------------------------------------------------------- checks

def run_cases(tree: Path, work: Path, model: str) -> dict:
    """{case: [what failed, ...]} for the cases that did not PASS (RECORDED counts as passing)."""
    out = work / "cases.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--cases-worker", str(out), model]
    try:
        res = subprocess.run(cmd, cwd=tree, env=_env(tree, work / "runs", model), capture_output=True, text=True,
                             timeout=CASES_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"(all cases)": [f"timed out after {CASES_TIMEOUT_S} s"]}
    if not out.is_file():
        return {"(all cases)": [f"worker exited {res.returncode}: {(res.stderr or res.stdout).strip()[-300:]}"]}
    return json.loads(out.read_text())


def cases_worker(out: Path, model: str) -> None:
    """Inside the tree: `labkit trace --case NAME` for every shipped case, through the CLI entry point."""
    import contextlib
    import io

    from labkit import cli
    from labkit.trace.cases import list_cases

    caught = {}
    for name in list_cases():
        dest = Path(os.environ["RUNS_DIR"]) / f"trace-{name}"
        args = ["trace", "--case", name, "--model", model, "--device", "cpu", "-q", "--out", str(dest),
                "--no-expect-changes"]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            try:
                cli.main(args)
                code = 0
            except SystemExit as e:
                code = e.code or 0
        if code == 0:
            continue
        try:
            report = json.loads((dest / "check.json").read_text())["report"]
            failed = [c for c in report["checks"] if not c["ok"]]
            names = sorted({c["name"] for c in failed if c["kind"] != "expect"})
            n_exp = sum(c["kind"] == "expect" for c in failed)
            caught[name] = names + ([f"{n_exp} expectation(s)"] if n_exp else [])
        except (OSError, ValueError, KeyError):
            lines = [x for x in buf.getvalue().splitlines() if x.strip()]
            caught[name] = [f"exit {code}: {lines[-1].strip()[:200] if lines else ''}"]
    out.write_text(json.dumps(caught))


def run_tests(tree: Path, work: Path, model: str) -> list[str]:
    """The fast tests that failed (node ids), or one line saying why none could run."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "--timeout", "300",
           *FAST_TESTS]
    try:
        res = subprocess.run(cmd, cwd=tree, env=_env(tree, work / "runs", model), capture_output=True, text=True,
                             timeout=TESTS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [f"(tests timed out after {TESTS_TIMEOUT_S} s)"]
    failed = sorted({line.split()[1] for line in res.stdout.splitlines()
                     if line.startswith(("FAILED ", "ERROR ")) and len(line.split()) > 1})
    if res.returncode not in (0, 1) and not failed:
        return [f"(pytest exited {res.returncode}: {res.stdout.strip()[-200:]})"]
    return failed


def short_test(node: str) -> str:
    return node.removeprefix("tests/").replace(".py::", "::")


def caught_by_summary(r: dict) -> str:
    """A short "caught by" for the docs table: the cases (with their failed invariants) and the tests."""
    parts = []
    for case, what in r["cases"].items():
        inv = [w for w in what if not w.endswith("expectation(s)")]
        parts.append(f"{case} ({', '.join(inv) or 'expectations'})" if inv else f"{case} (expectations)")
    if len(parts) > 3:
        parts = parts[:3] + [f"{len(r['cases']) - 3} more cases"]
    tests = [short_test(t).split("[")[0] for t in r["tests"]]
    tests = list(dict.fromkeys(tests))
    if tests:
        parts.append(", ".join(tests[:2]) + (f" +{len(tests) - 2} tests" if len(tests) > 2 else ""))
    return "; ".join(parts) or "-"


def markdown(data: dict) -> str:
    """The docs/evidence.md table of a result file."""
    lines = ["| id | file | mutation | result | caught by (cases: failed invariants; tests) |",
             "| --- | --- | --- | --- | --- |"]
    for r in data["results"]:
        old, new = (" ".join(r.get(k, "").split()) for k in ("old", "new"))   # two-line pieces on one row
        change = f"`{old}` -> `{new}`".replace("|", "\\|")
        by = r["why"] if r["status"] in ("EQUIVALENT", "NOT APPLICABLE") else caught_by_summary(r)
        lines.append(f"| {r['id']} | {r['file']} | {r['what']}: {change} | {r['status']} | {by} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="mutation ids (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--out", type=Path, default=None, help="result JSON (default: runs/mutate/mutate.json)")
    ap.add_argument("--skip-baseline", action="store_true", help="do not check the unmutated tree first")
    ap.add_argument("--markdown", type=Path, metavar="JSON", help="print a result file as a Markdown table")
    ap.add_argument("--cases-worker", nargs=2, metavar=("OUT", "MODEL"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.cases_worker:
        cases_worker(Path(args.cases_worker[0]), args.cases_worker[1])
        return 0
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    chosen = [m for m in MUTATIONS if not args.only or m.id in args.only]
    if args.list or not chosen:
        for m in MUTATIONS:
            print(f"{m.id:4} engine/{m.file}: {m.what}\n     - {m.old.strip()}\n     + {m.new.strip()}")
        return 0 if chosen else 2
    sys.path.insert(0, str(ROOT))
    from labkit.model import default_model_dir, resolve_model

    model = str(resolve_model(default_model_dir()))
    out = args.out or Path(os.environ.get("RUNS_DIR") or ROOT / "runs") / "mutate" / "mutate.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="labkit-mutate-") as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        source = build_tree(base)
        print(f"tree: checks from {ROOT}, engine from {source}; {len(chosen)} mutation(s)", flush=True)
        if not args.skip_baseline:
            t0 = time.perf_counter()
            cases, tests = run_cases(base, Path(tmp) / "w-base", model), run_tests(base, Path(tmp) / "w-base", model)
            print(f"baseline ({time.perf_counter() - t0:.0f} s): cases failing {cases or 'none'}, "
                  f"tests failing {tests or 'none'}", flush=True)
            if cases or tests:
                print("the unmutated tree does not pass: fix that first", file=sys.stderr)
                return 2
        for m in chosen:
            t0 = time.perf_counter()
            tree = Path(tmp) / f"m-{m.id}"
            shutil.copytree(base, tree)
            try:
                mutate(tree, m)
            except ValueError as e:
                results.append({"id": m.id, "file": m.file, "what": m.what, "status": "NOT APPLICABLE",
                                "why": str(e), "cases": {}, "tests": []})
                print(f"{m.id:4} NOT APPLICABLE: {e}", flush=True)
                continue
            work = Path(tmp) / f"w-{m.id}"
            cases = run_cases(tree, work, model)
            tests = run_tests(tree, work, model)
            caught = bool(cases or tests)
            status = "CAUGHT" if caught else ("EQUIVALENT" if m.id in EQUIVALENT else "SURVIVED")
            results.append({"id": m.id, "file": m.file, "old": m.old, "new": m.new, "what": m.what,
                            "status": status, "cases": cases, "tests": tests,
                            "why": EQUIVALENT.get(m.id, ""), "seconds": round(time.perf_counter() - t0)})
            by = "; ".join([f"{c} ({', '.join(v)})" for c, v in cases.items()] + [short_test(t) for t in tests])
            print(f"{m.id:4} {status:10} engine/{m.file}: {m.what}  <- {by or '-'} "
                  f"[{time.perf_counter() - t0:.0f} s]", flush=True)
            shutil.rmtree(tree, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)
    counted = [r for r in results if r["status"] in ("CAUGHT", "SURVIVED")]
    caught = sum(r["status"] == "CAUGHT" for r in counted)
    summary = {"mutations": len(results), "caught": caught,
               "survived": [r["id"] for r in results if r["status"] == "SURVIVED"],
               "equivalent": [r["id"] for r in results if r["status"] == "EQUIVALENT"],
               "equivalent_but_caught": [r["id"] for r in results if r["id"] in EQUIVALENT and r["status"] == "CAUGHT"],
               "not_applicable": [r["id"] for r in results if r["status"] == "NOT APPLICABLE"],
               "score": f"{caught}/{len(counted)}", "engine": source, "fast_tests": FAST_TESTS,
               "wall_s": round(time.perf_counter() - t_all)}
    out.write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    print(f"\nscore: {caught} of {len(counted)} behaviour-changing mutations caught; "
          f"survivors {summary['survived'] or 'none'}; equivalent {summary['equivalent'] or 'none'}; "
          f"not applicable {summary['not_applicable'] or 'none'} ({summary['wall_s']} s); {out}")
    return 0 if not summary["survived"] else 1


if __name__ == "__main__":
    sys.exit(main())
