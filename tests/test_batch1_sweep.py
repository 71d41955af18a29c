"""scripts/batch1_sweep.sh (issue 32's variant sweep for a device call) on the CPU with the tiny model: every
(batch, variant) runs, a variant whose knob the engine refuses shows as missing, and the summary gives each
variant's median and its ratio to base."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_sweep_runs_every_variant_and_summarises_against_base(tiny_model, tmp_path):
    env = {**os.environ, "DEVICE": "cpu", "FAKE_MODEL": tiny_model, "OUT": str(tmp_path / "sweep"), "ROUNDS": "1",
           "BATCHES": "2", "RUN_TIMEOUT": "600",
           "VARIANTS": "base: rows32:LABKIT_DECODE_GEMV=32,8 bad:LABKIT_DECODE_GEMV=24,8"}
    res = subprocess.run(["bash", "scripts/batch1_sweep.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in (tmp_path / "sweep" / "summary.md").read_text().splitlines()[2:]}
    assert rows["base"][0] == "2" and rows["base"][4] == "1.0000"
    assert float(rows["rows32"][3]) > 0 and rows["rows32"][4]
    assert rows["bad"][2] == "missing"  # the engine refused the knob: no figure, never base's
    assert "rc=0 round 1 batch 2 base" in res.stdout and "round 1 batch 2 bad" in res.stdout


@pytest.mark.slow
def test_the_lab_plan_call_runs_detached_and_finish_packs_the_plan_and_its_report(tiny_model, tmp_path):
    """scripts/lab_plan_call.sh start (the plan detached, waited for) then finish (packed in parts): one lab here."""
    import tarfile

    out, labs = tmp_path / "out", tmp_path / "labs"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "LABS_DIR": str(labs), "LABS_ONLY": "principles-tokenizer",
           "MODEL_DIR": tiny_model, "START_WAIT": "300"}
    for mode in ("start", "finish"):
        res = subprocess.run(["bash", "scripts/lab_plan_call.sh", mode], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-2000:]
    summary = (out / "summary.txt").read_text()
    assert "lab plan after" in summary and "rc=0" in summary and "still running" not in summary
    parts = sorted(out.glob("labs.tgz.part*"))
    assert parts
    whole = tmp_path / "labs.tgz"
    whole.write_bytes(b"".join(p.read_bytes() for p in parts))
    names = tarfile.open(whole).getnames()
    assert "report/report.md" in names and any(n.startswith("runs/principles") for n in names), names[:20]
    assert (labs / "report" / "evidence.tar.gz").exists() and "report/evidence.tar.gz" not in names


def test_the_issue32_sweeps_runs_the_sections_asked_and_says_what_it_could_not(tmp_path, tiny_model):
    """scripts/issue32_sweeps.sh on a machine without py-spy: its host section says so, an unknown section is
    named, the archive and the summary come back (the device sections are the same commands as the tested
    scripts: kernel_bench.py, labkit bench, logits-check, batch1_sweep.sh)."""
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "SECTIONS": "host bogus", "DEVICE": "cpu", "FAKE_MODEL": tiny_model,
           "PATH": "/usr/bin:/bin"}
    res = subprocess.run(["bash", "scripts/issue32_sweeps.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    summary = (out / "summary.txt").read_text()
    assert "host: no py-spy" in summary and "unknown section bogus" in summary and "done @" in summary
    assert (out / "issue32-sweeps.tgz").exists()


@pytest.mark.slow
def test_the_k_chunk_call_runs_its_sweep_and_the_lifecycle_lab(tiny_model, tmp_path):
    """scripts/k_chunk_call.sh (session 16's first device call) on the CPU: the sweep's variants and the
    lifecycle verdict reach its summary, and its archive holds them."""
    import tarfile

    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "DEVICE": "cpu", "FAKE_MODEL": tiny_model, "RUN_TIMEOUT": "600",
           "SECTIONS": "sweep lifecycle", "WORK": str(tmp_path / "work")}
    res = subprocess.run(["bash", "scripts/k_chunk_call.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = (out / "summary.txt").read_text()
    assert "| 16 | kc128 |" in summary and "| 4 | base |" in summary
    assert "rc=0" in summary and "scenarios hold" in summary and summary.rstrip().splitlines()[-1].startswith("done")
    with tarfile.open(out / "k-chunk.tgz") as tar:
        names = tar.getnames()
    assert "./serve-lifecycle.json" in names and "./sweep/summary.md" in names


@pytest.mark.slow
def test_the_final_evidence_call_reports_each_figure(tiny_model, tmp_path):
    """scripts/final_evidence_call.sh on the CPU (its evidence section needs CUDA): both nano runs, batch 1 and
    4, the Transformers reference and the serving loads (FP8 at rate inf against the offline figure, mixed at rates
    16 and 32) reach the summary with their exit codes, and the archive holds their JSON."""
    import re
    import tarfile

    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "DEVICE": "cpu", "FAKE_MODEL": tiny_model, "WORK": str(tmp_path / "w"),
           "SECTIONS": "nano batch hf serve", "NANO_BENCH": "--workload fixed --repeats 1", "BATCHES": "4",
           "LOAD_WORKLOAD": "fixed",
           "HF_ARGS": "--no-compile --new-tokens 9"}
    res = subprocess.run(["bash", "scripts/final_evidence_call.sh"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = (out / "summary.txt").read_text()
    for pattern in (r"rc=0 @\d+ nano kv auto: \d+\.?\d* tok/s", r"rc=0 @\d+ nano kv fp8: \d+",
                    r"rc=0 @\d+ batch1: \d+\.\d+ ms a token", r"\| 4 \| base \| \d+\.\d+ \|",
                    r"rc=0 @\d+ Transformers batch1: \d+\.\d+ ms a token, cache static eager",
                    r"rc=0 @\d+ serve fp8 at rate inf, load 1 on one server: \d+ tok/s, \d+\.\d% of offline \d+ "
                    r"\(median\), \d+\.\d% of offline repeat 0 \d+",
                    r"rc=0 @\d+ serve fp8 at rate inf, load 2 on one server: \d+ tok/s",
                    r"rc=0 @\d+ serve mixed at rate 16: ITL p99 \d+\.\d+ ms, tpot median \d+\.\d+ ms: \d+\.\d+x; "
                    r"0 failed",
                    r"rc=0 @\d+ serve mixed at rate 32: ITL p99 \d+\.\d+ ms"):
        assert re.search(pattern, summary), (pattern, summary)
    with tarfile.open(out / "call.tgz") as tar:
        names = tar.getnames()
    assert {"./nano-fp8.json", "./batch1.json", "./hf-batch1.json", "./load-fp8-inf-1.json", "./load-fp8-inf-2.json",
            "./load-mixed-r16.json", "./load-mixed-r32.json"} <= set(names)
    assert summary.count("nano kv fp8") == 1  # serve reuses the nano section's offline FP8 median


@pytest.mark.slow
def test_the_next_issue32_call_runs_each_section(tiny_model, tmp_path):
    """scripts/issue32_next_call.sh on the CPU: the sampler bench (dry run), nano at both sampler settings, and the
    noise section (the Gumbel tests, both noises benched, nano A B B A) reach the summary."""
    import re

    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "DEVICE": "cpu", "FAKE_MODEL": tiny_model, "WORK": str(tmp_path / "w"),
           "SECTIONS": "sampler nano noise", "RUN_TIMEOUT": "300",
           "SAMPLER_ARGS": "--rows 2", "NANO_BENCH": "--workload fixed --repeats 1"}
    res = subprocess.run(["bash", "scripts/issue32_next_call.sh"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = (out / "summary.txt").read_text()
    assert "rc=0" in summary.split("sampler bench")[0].splitlines()[-1] and " yes " in summary
    assert len(re.findall(r"rc=0 @\d+ nano, sampler at (2|8) programs an SM, round \d: \d+ tok/s", summary)) == 4
    assert re.search(r"rc=0 @\d+ gumbel tests: \d+ passed", summary)
    assert "rc=0" in summary.split("sampler bench, both noises")[0].splitlines()[-1] and "  hash " in summary
    rounds = re.findall(r"rc=0 @\d+ nano, (philox|hash) noise at (2|8) programs an SM, round (\d): \d+ tok/s", summary)
    assert rounds == [("philox", "2", "1"), ("hash", "8", "1"), ("hash", "8", "2"), ("philox", "2", "2")]
    assert summary.rstrip().splitlines()[-1].startswith("done")


@pytest.mark.slow
def test_the_next_issue32_call_runs_its_fp8_layout_sections(tiny_model, tmp_path):
    """scripts/issue32_next_call.sh's vt, vt-nano, order and ncu sections on the CPU: the layout's tests,
    kernel_bench --fp8-layouts (dry run), nano FP8 with the layout off and on (0 1 1 0), the fp8-kv suite with it
    on, nano with the decode order launch and longest-first, and the launch ncu would profile, each pool and
    layout."""
    import re
    import tarfile

    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "DEVICE": "cpu", "FAKE_MODEL": tiny_model, "WORK": str(tmp_path / "w"),
           "SECTIONS": "vt vt-nano order ncu", "NANO_BENCH": "--workload fixed --repeats 1"}
    res = subprocess.run(["bash", "scripts/issue32_next_call.sh"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=1500)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = (out / "summary.txt").read_text()
    assert re.search(r"rc=0 @\d+ kernel_sass \(this machine's Triton\)", summary) and "| fp8:vt=1 |" in summary
    assert re.search(r"rc=0 @\d+ V keys-contiguous tests: \d+ passed", summary), summary
    assert re.search(r"rc=0 @\d+ kernel_bench --fp8-layouts", summary) and "layout=v-keys-contiguous" in summary
    assert re.search(r"rc=0 @\d+ kernel_bench bf16, longest first \(the default\) against launch order", summary)
    assert "| order=launch splits=2 |" in summary
    rounds = re.findall(r"rc=0 @\d+ nano FP8, V keys-contiguous (\d), round (\d): \d+ tok/s", summary)
    assert rounds == [("0", "1"), ("1", "1"), ("1", "2"), ("0", "2")]
    assert re.search(r"rc=0 @\d+ logits-check fp8-kv, V keys-contiguous: VERDICT: PASS", summary), summary
    orders = re.findall(r"rc=0 @\d+ nano (\w+), decode order ([\w-]+), round (\d): \d+ tok/s", summary)
    assert orders == [("fp8", "launch", "1"), ("fp8", "longest-first", "1"), ("fp8", "longest-first", "2"),
                      ("fp8", "launch", "2"), ("bf16", "launch", "1"), ("bf16", "longest-first", "1")], summary
    for pool, layout in (("bf16", "rows"), ("fp8", "rows"), ("fp8", "v-keys-contiguous")):
        assert re.search(rf"rc=0 @\d+ ncu {pool} {layout}\n", summary), summary
        assert f"decode_ncu: {pool} pool, {layout}" in summary
    with tarfile.open(out / "call.tgz") as tar:
        names = set(tar.getnames())
    assert {"./nano-fp8-vt1-r2.json", "./kb-fp8-layouts.json"} <= names
    assert summary.rstrip().splitlines()[-1].startswith("done")


@pytest.mark.slow
def test_the_next_issue32_call_runs_its_gemv_section(tiny_model, tmp_path):
    """scripts/issue32_next_call.sh's gemv section on the CPU: gemv_bench (dry run, with its sweep, every launch
    checked) and the batch-1 bench reach the summary and the archive."""
    import re
    import tarfile

    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "DEVICE": "cpu", "FAKE_MODEL": tiny_model, "WORK": str(tmp_path / "w"),
           "SECTIONS": "gemv", "BATCH1_BENCH": "--workload batch1 --repeats 1 --warmup 0", "PDL_MODES": "early first"}
    res = subprocess.run(["bash", "scripts/issue32_next_call.sh"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = (out / "summary.txt").read_text()
    assert re.search(r"rc=0 @\d+ gemv_bench\n", summary), summary
    assert "| qkv + o_proj + gate_up + down |" in summary and "| NO |" not in summary
    for r, mode in enumerate(("early", "first"), 1):
        assert re.search(rf"rc=0 @\d+ batch1, PDL {mode}, round {r}: \d+\.\d+ ms a token", summary), summary
    with tarfile.open(out / "call.tgz") as tar:
        assert {"./gemv.json", "./batch1-early-r1.json", "./batch1-first-r2.json"} <= set(tar.getnames())
    assert summary.rstrip().splitlines()[-1].startswith("done")
