"""Every command's terminal output at 80 columns, its --help and the tables it prints: no line longer, and no
word cut or folded across lines (a folded cell shows "ms/to" and "ken", a cut one "ms/to…"; a cut flag
`--async-scheduli…`). A word wrapped whole to the next line is fine."""
from __future__ import annotations

import copy
import io
import json
import shutil
from collections import Counter

import pytest
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
    names = ["mean", "median", "std"] + [M.percentile_key(p) for p in m["percentiles"] if p != 50]
    assert_fits(stdout, names + [_ms(m[key][k]) for key in M.LATENCIES for k in names])
    # p50 is the median: not a second column of the same figures.
    assert "p50" in m["ttft_ms"] and "p50" not in stdout.split()


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


# ----------------------------------------------------------------------------------- every help, every table

# Characters of borders and rules: not words.
_BOX = "│┃┏┓┗┛━─┌┐└┘├┤┬┴┼╭╮╰╯┡┩╇╈┳┻╋┣┫═╞╡╪┝┥┿"


def words(out: str) -> Counter:
    return Counter(t for t in out.split() if t.strip(_BOX))


def width_problems(narrow: str, wide: str, width: int = 80) -> list[str]:
    """What is wrong with `narrow` (the output at `width` columns) against `wide` (the same output with room):
    a line too long, a cut word ('…'), or a word that is not whole (folded or cut words differ from the wide
    output's words; a word wrapped whole to the next line does not)."""
    out = [f"line of {len(line)} columns: {line}" for line in narrow.splitlines() if len(line) > width]
    out += [f"cut: {line}" for line in narrow.splitlines() if "…" in line]
    n, w = words(narrow), words(wide)
    if n != w:
        out.append(f"words not whole at {width} columns: {sorted((n - w).elements())[:12]}; "
                   f"missing: {sorted((w - n).elements())[:12]}")
    return out


def at(columns: int, monkeypatch, capsys, args) -> tuple[int, str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, err = run_cli(args, capsys)
    return code, out + err


def _command_paths():
    import typer.main

    from labkit import cli

    def walk(command, path):
        yield path, command
        if hasattr(command, "list_commands"):
            for name in command.list_commands(None):
                yield from walk(command.get_command(None, name), (*path, name))

    yield from walk(typer.main.get_command(cli.app), ())


def help_problems(monkeypatch, capsys, path, command) -> list[str]:
    code, narrow = at(80, monkeypatch, capsys, [*path, "--help"])
    _, wide = at(200, monkeypatch, capsys, [*path, "--help"])
    problems = [] if code == 0 else [f"exit {code}"]
    problems += width_problems(narrow, wide)
    shown = {t.rstrip(",") for t in narrow.split()}  # "--quiet, -q"
    for param in getattr(command, "params", []):
        if getattr(param, "hidden", False):
            continue
        for flag in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]:
            if flag.startswith("-") and flag not in shown:
                problems.append(f"flag {flag} is not whole")
        choices = getattr(getattr(param, "type", None), "choices", None)
        if choices and not any(all(str(getattr(c, "value", c)) in t for c in choices) for t in shown):
            problems.append(f"the choices of {param.opts} are not one word")
    return [f"labkit {' '.join(path)} --help: {p}" for p in problems]


def test_every_help_at_80_columns_shows_every_flag_choice_and_word_whole(monkeypatch, capsys):
    """Every command's help at 80 columns: no line longer, no flag name cut, a list of choices one word, every
    word of the descriptions whole (the same words as with room to spare). Nothing here names a flag: a renamed
    or added one is held to the same."""
    problems = []
    for path, command in _command_paths():
        problems += help_problems(monkeypatch, capsys, path, command)
    assert not problems, "\n".join(problems)


def test_the_help_check_sees_typers_own_layout_cut_flags(monkeypatch, capsys):
    """The check above fails on what typer's six-column panel does at 80 columns (`--async-scheduli…`,
    `<prefill_first|b` / `alanced|mixed>`): an over-wide column is caught."""
    from typer import rich_utils

    from labkit import help_layout

    help_layout.install()  # (labkit.cli installs it on import; run alone, this test may come first)
    assert help_layout.typer_options_panel is not None
    serve = dict(_command_paths())[("serve",)]
    monkeypatch.setattr(rich_utils, "_print_options_panel", help_layout.typer_options_panel)
    problems = help_problems(monkeypatch, capsys, ("serve",), serve)
    assert any("…" in p for p in problems) and any("not whole" in p for p in problems), problems


def test_a_help_paragraph_wrapped_in_the_source_is_one_paragraph_on_screen():
    from labkit.help_layout import reflow

    assert reflow("exit 1 when the engine\ndies, or hangs") == "exit 1 when the engine dies, or hangs"
    assert reflow("Suites:\n- baseline (15 rows)\n- graph\n  (126 rows)") == \
        "Suites:\n- baseline (15 rows)\n- graph (126 rows)"
    assert reflow("\b\nkept\nas written") == "kept\nas written"


def test_the_stderr_reason_wraps_between_words_in_a_terminal_and_stays_one_line_in_a_pipe():
    from labkit.cli import reason_lines

    message = "unknown case 'chunck' (not a file, nor a name in /work/labkit/workloads/cases); did you mean 'chunk'?"
    assert reason_lines(message, None) == f"labkit: {message}"
    lines = reason_lines(message, 80).splitlines()
    assert len(lines) == 2 and all(len(line) <= 80 for line in lines) and lines[1].startswith("  ")
    assert " ".join(" ".join(lines).split()) == f"labkit: {message}"


def test_an_unknown_case_name_gets_a_did_you_mean(capsys):
    code, _, err = run_cli(["trace", "--case", "chunck"], capsys)
    assert code == 2 and "did you mean 'chunk'?" in err and len(err.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def traced(tiny_model, tmp_path_factory):
    """Two runs of the lifecycle case (as in the README: the case, then --max-num-batched-tokens 100) and one of
    chunk."""
    from labkit import cli

    root = tmp_path_factory.mktemp("traced")
    tiny = ["--model", str(tiny_model), "--device", "cpu", "-q"]
    for name, case, extra in (("chunk", "chunk", []), ("lifecycle", "lifecycle", []),
                              ("lifecycle-budget-100", "lifecycle", ["--max-num-batched-tokens", "100"])):
        out = root / name
        with pytest.raises(SystemExit) as done:
            cli.main(["trace", "--case", case, *tiny, *extra, "--out", str(out)])
        assert done.value.code in (0, None)
    return root


def test_the_commands_tables_at_80_columns_keep_every_word_whole(traced, tiny_model, monkeypatch, capsys):
    """The first hour's screens and the other tables, each at 80 columns against the same output with room:
    the step table, the CHANGED diff, `trace diff`, `trace --list`, `principles all` and each principles lab,
    `shapes`, `model info`, `patch list`."""
    from labkit.trace.cases import load_case
    from labkit.trace.command import _print_report, _print_steps
    from labkit.trace.events import read_jsonl
    from labkit.trace.validate import validate

    problems = []
    monkeypatch.chdir(traced)  # the logs by their short paths, as a user names them
    for args in (["trace", "diff", "lifecycle/events.jsonl", "lifecycle-budget-100/events.jsonl"],
                 ["trace", "--list"], ["principles", "all"], *[["principles", n] for n in
                 ("tokenizer", "attention", "cache", "memory", "slots", "operators", "shapes", "timeline")],
                 ["shapes", "--tensor-parallel-size", "2", "--preset", "qwen3-0.6b"],
                 ["model", "info", str(tiny_model)],
                 ["patch", "list"]):
        # 150 columns: room to spare, below the widths where patch list and principles change layout (160)
        (_, narrow), (_, wide) = at(80, monkeypatch, capsys, args), at(150, monkeypatch, capsys, args)
        problems += [f"labkit {' '.join(args)}: {p}" for p in width_problems(narrow, wide)]
    for name, why in (("chunk", ""), ("lifecycle", ""),
                      ("lifecycle-budget-100", "override --max-num-batched-tokens 100")):
        events = read_jsonl(traced / name / "events.jsonl")
        case = load_case(name.split("-")[0])
        report = validate(events, case, expect_changes=bool(why), why_changes=why)

        def show(console):
            _print_steps(events, console, f"case {case.name}: {case.about}")
            _print_report(report, console, case)

        problems += [f"trace {name}: {p}" for p in width_problems(render(show), render(show, width=200))]
        if why:
            assert "changed from the case" in render(show)
    assert not problems, "\n".join(problems)


def test_the_logits_worst_rows_at_80_columns_keep_every_figure_whole(tiny_model, tmp_path, monkeypatch, capsys):
    """The worst-rows table squeezed its request column to nothing and cut context 257 to `2…`."""
    from labkit.logits.command import _print_result

    code, out = at(80, monkeypatch, capsys, ["logits-check", "run", "--suite", "baseline", "--model", str(tiny_model),
                                             "--device", "cpu", "--out", str(tmp_path / "lc")])
    assert code == 0, out
    assert not [line for line in out.splitlines() if len(line) > 80 or "…" in line], out
    result = json.loads((tmp_path / "lc" / "check.json").read_text())
    narrow = render(lambda c: _print_result(result, c))
    assert not width_problems(narrow, render(lambda c: _print_result(result, c), width=200)), narrow
    for row in result["rows"]:  # each figure of the rows shown, whole
        if f"{row['request_id']}#{row['output_index']}" in narrow:
            assert str(row["context_len"]) in narrow.split()


def test_the_width_check_sees_an_over_wide_column():
    """A table with a column that cannot shrink (a planted over-wide column) fails the check."""
    from rich.table import Table

    def table(console):
        t = Table()
        t.add_column("check", no_wrap=True)
        t.add_column("detail", no_wrap=True)
        t.add_row("a check", "a detail " * 12)
        console.print(t)

    assert width_problems(render(table), render(table, width=200))
