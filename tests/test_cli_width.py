"""The terminal output of `patch prove`, `bench`, `bench load` and `report` at 80 columns: no line longer, and
no word cut or folded across lines (a folded cell shows "ms/to" and "ken", a cut one "ms/to…")."""
from __future__ import annotations

import copy
import io
import json
import shutil

from rich.console import Console

from labkit.output import project_root

from .fake_sse_server import start_in_thread
from .helpers import run_cli

HEALTH = {"status": "ok", "model_name": "qwen3-fake", "model": {"path": "/models/qwen3", "config_sha256": "a" * 64},
          "device": "cuda:0", "device_name": "NVIDIA H200", "vocab_size": 151936, "max_model_len": 4096, "tp": 1,
          "git_head": "0123abcd", "labkit_version": "0.1.0", "running": 0}


def assert_fits(out: str, texts, width: int = 80) -> None:
    """Every line at most `width` wide, and every word of `texts` shown whole."""
    lines = out.splitlines()
    too_long = [line for line in lines if len(line) > width]
    assert not too_long, "\n".join(too_long)
    shown = set(out.split())
    for text in texts:
        for word in str(text).split():
            assert word in shown, f"{word!r} is not whole in:\n{out}"


def render(fn, *args, width: int = 80) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    fn(*args, console)
    return console.file.getvalue()


# ----------------------------------------------------------------------------------- patch prove

def proofs():
    from labkit.patch import index
    from labkit.patch_prove import CheckRun, Proof

    faults = [e for e in index() if e.kind == "fault"]
    out = []
    for i, e in enumerate(faults):
        p = Proof(e.name[:-6], e.caught_by, CheckRun(0, 41.2, detail="VERDICT: PASS"),
                  CheckRun(1, 38.7, failed=["slots"], detail=e.how), "CAUGHT", e.how)
        if i == 1:
            p.result, p.why = "NOT CAUGHT", "the index names invariant slots, but the run failed inputs.positions"
        out.append(p)
    out.append(Proof("fault-not-applying", "trace A slots", result="DOES NOT APPLY",
                     why="error: patch failed: engine/engine/model_runner.py:212"))
    return out


def test_patch_prove_at_80_columns_is_a_block_per_patch_with_every_word_whole():
    from labkit.patch import _run_cell, print_proofs

    ps = proofs()
    facts = {"engine_source": "git HEAD", "commit": "0123456789abcdef0123"}
    out = render(print_proofs, ps, facts)
    texts = ["fault patches against git HEAD 0123456789ab"]
    for p in ps:
        texts += [p.patch, p.check, p.result, p.why, _run_cell(p.clean), _run_cell(p.patched)]
    assert_fits(out, texts)
    # From WIDE_LIST columns on, still the table.
    wide = render(print_proofs, ps, facts, width=200)
    assert any([c.strip() for c in line.split("┃")[1:-1]] == ["patch", "caught by", "clean", "patched", "result", "why"]
               for line in wide.splitlines()), wide


# ----------------------------------------------------------------------------------- bench

STEPS_WORKLOAD = """name: steps
about: batch1 made small (one request, decode ms per token)
requests: 1
prompt_len: 16
output_len: 9
seed: 0
token_range: [0, 1000]
ignore_eos: true
warmup: {rounds: 0}
repeats: 2
timing: steps
engine: {max_num_seqs: 1}
"""


def bench_texts(r: dict) -> list[str]:
    from labkit.bench.command import _f, _summary_rows

    texts = [v for row in _summary_rows(r) for v in row]
    texts += ["repeat", "reqs", "prompt tok", "out tok", "wall s", "out tok/s", "total tok/s", "decode steps",
              "decode ms/token"]
    for x in r["runs"] + [r["median"]]:
        texts += [_f(x["wall_s"]), _f(x["output_throughput"], 1), _f(x["total_token_throughput"], 1),
                  _f(x["decode_ms_per_token"], 4)]
    return texts


def test_bench_with_decode_columns_at_80_columns_keeps_every_figure_whole(tiny_model, tmp_path, capsys, monkeypatch):
    """batch1's nine columns: rich narrowed them all alike and cut "ms/token" and the figures under it."""
    from labkit.bench.command import print_result

    monkeypatch.setenv("COLUMNS", "80")
    workload = tmp_path / "steps.yaml"
    workload.write_text(STEPS_WORKLOAD)
    out = tmp_path / "steps.json"
    code, stdout, err = run_cli(["bench", "--workload", str(workload), "--model", tiny_model, "--device", "cpu",
                                 "--out", str(out)], capsys)
    assert code == 0, err
    r = json.loads(out.read_text())
    assert_fits(stdout, bench_texts(r))
    # A GPU's figures on a bigger workload: too wide for nine columns, the decode ones get a table of their own.
    big = copy.deepcopy(r)
    for x in big["runs"] + [big["median"]]:
        x.update(requests=256, prompt_tokens=143_210, output_tokens=143_210, decode_steps=1_023,
                 wall_s=21.345, output_throughput=12_345.6, total_token_throughput=24_691.2)
    text = render(print_result, big)
    assert_fits(text, bench_texts(big) + ["143,210", "1,023"])
    assert "decode per timed run" in text


def test_bench_load_latencies_at_80_columns_keep_every_figure_whole(tmp_path, capsys, monkeypatch):
    """Nine statistics (--percentiles) do not fit a column each: a column per latency instead."""
    from labkit.bench import load_metrics as M
    from labkit.bench.load_command import _ms

    monkeypatch.setenv("COLUMNS", "80")
    fake = start_in_thread(health=HEALTH, step_ms=20)
    out = tmp_path / "load.json"
    code, stdout, err = run_cli(["bench", "load", "--url", fake.url, "--num-requests", "3", "--no-warmup",
                                 "--percentiles", "50,75,90,95,99,99.9", "--out", str(out)], capsys)
    assert code == 0, err + stdout
    m = json.loads(out.read_text())["metrics"]
    names = ["mean", "median", "std"] + [M.percentile_key(p) for p in m["percentiles"]]
    assert_fits(stdout, names + [_ms(m[key][k]) for key in M.LATENCIES for k in names])


# ----------------------------------------------------------------------------------- report

def test_report_at_80_columns_shows_each_headline_whole(tmp_path, capsys, monkeypatch):
    """A load run's headline names its arrivals file: a word longer than the headline column of the table."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(tmp_path)
    arrivals = "arrivals-short-streams-and-long-prompts.jsonl"
    shutil.copy(project_root() / "workloads" / "arrivals" / "short-and-long.jsonl", arrivals)
    runs = tmp_path / "runs"
    fake = start_in_thread(health=HEALTH)
    code, stdout, err = run_cli(["bench", "load", "--arrivals", arrivals, "--url", fake.url, "--num-requests", "4",
                                 "--no-warmup", "--out", str(runs / "arrivals-prefill_first-1.json")], capsys)
    assert code == 0, err + stdout
    code, stdout, err = run_cli(["report", "--runs", str(runs), "--out", str(tmp_path / "report")], capsys)
    assert code == 0, err
    labs = json.loads((tmp_path / "report" / "manifest.json").read_text())["labs"]
    assert any(arrivals in lab["headline"] for lab in labs)
    assert_fits(stdout, [t for lab in labs for t in (lab["lab"], lab["verdict"], lab["headline"])])
