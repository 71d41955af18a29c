"""Hostile and edge inputs outside the server (issue 35, items 14, 16 and 17): each refused with a one-line
error naming the file, key or field, in time and memory bounded by the input's declared limits, nothing
written outside the folder given; or, where the value is valid, taken at its edge."""
from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from engine import LLM, SamplingParams
from engine.sampler import row_seeds
from labkit import yamlfile
from labkit.bench.workloads import MAX_REQUESTS, MAX_TOKENS, parse_workload
from labkit.errors import LabkitError
from labkit.trace.cases import expand_positions, load_case

from .helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
SEED_END = 1 << 63  # the end of the seed's range, [0, 2**63)


# --- 17: the seed's range, as documented and as enforced ---------------------------------------------------
def test_the_documented_seed_range_is_the_enforced_one():
    doc = (REPO / "docs" / "serving.md").read_text()
    m = re.search(r"`seed` not an integer in \[0, 2\*\*(\d+)\)", doc)
    assert m, "docs/serving.md no longer states the seed's range"
    end = 1 << int(m.group(1))
    assert end == SEED_END
    SamplingParams(seed=end - 1)
    with pytest.raises(ValueError, match=r"^seed: must be an integer in \[0, 2\*\*%s\)" % m.group(1)):
        SamplingParams(seed=end)


@pytest.mark.parametrize("seed", [0, 1, SEED_END - 1])
def test_seeds_at_the_edges_are_taken(seed):
    assert SamplingParams(seed=seed).seed == seed


@pytest.mark.parametrize("seed", [-1, SEED_END, 1 << 64, True, 1.0, "3"])
def test_seeds_beyond_the_edges_are_refused_naming_the_seed(seed):
    with pytest.raises(ValueError, match=r"^seed: "):
        SamplingParams(seed=seed)


def test_every_seed_in_the_range_has_a_stream_of_its_own():
    """The row seed of a request's seed is a bijection of [0, 2**63) (an odd multiplier modulo 2**63), so
    seeds at the edges and their neighbours never share noise; each fits the int64 the sampler takes."""
    seeds = [0, 1, 2, SEED_END // 2 - 1, SEED_END // 2, SEED_END - 2, SEED_END - 1]
    rows = row_seeds(0, [0] * len(seeds), [5] * len(seeds), [SamplingParams(seed=s) for s in seeds])
    assert len(set(rows)) == len(seeds) and all(0 <= r < SEED_END for r in rows)


def test_the_engine_samples_with_the_largest_seed(tiny_model):
    llm = LLM(tiny_model, device="cpu", enforce_eager=True, max_model_len=256, max_num_batched_tokens=256)
    try:
        sp = [SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, seed=s) for s in (SEED_END - 1, 0)]
        outs = llm.generate([[5, 6, 7, 8]] * 2, sp, use_tqdm=False)
        again = llm.generate([[5, 6, 7, 8]], sp[:1], use_tqdm=False)
        assert outs[0]["token_ids"] == again[0]["token_ids"]
        assert outs[0]["token_ids"] != outs[1]["token_ids"]
    finally:
        llm.exit()


# --- 16: a note's title is text, never a pattern ------------------------------------------------------------
@pytest.mark.parametrize("title", [r"why \1 and \n here", r"\g<0> and \\", "a\nsecond line"])
def test_a_note_title_with_backslashes_is_written_as_given(title, tmp_path, capsys):
    out = tmp_path / "note.md"
    code, _, err = run_cli(["notes", "new", "trace", "--title", title, "--out", str(out)], capsys)
    assert code == 0, err
    first = out.read_text(encoding="utf-8").splitlines()[0]
    assert first == "# Trace note: " + " ".join(title.split()), first


# --- running a command in a process of its own, under an address-space limit -----------------------------------
AS_LIMIT = 3 << 30  # torch maps ~0.7 GB at import; a list of 10**12 ids or positions would need terabytes


def labkit_limited(args: list[str], env: dict | None = None, limit: int = AS_LIMIT,
                   timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m labkit ARGS` with RLIMIT_AS set: a regression that builds what the input only declares
    fails (MemoryError, or killed) instead of taking the machine."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run([sys.executable, "-m", "labkit", *args], cwd=REPO, env={**os.environ, **(env or {})},
                          preexec_fn=cap, capture_output=True, text=True, timeout=timeout)


def _one_line_naming(proc: subprocess.CompletedProcess, *words: str, code: int = 2) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], err[-2000:])
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)
    assert "\x1b" not in proc.stderr and "\x1b" not in proc.stdout
    return err


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


CASE = """name: {name}
about: {about}
engine: {{max_num_batched_tokens: 256, max_num_seqs: 4, kvcache_block_size: 256, enforce_eager: true{engine}}}
requests:
  - id: {rid}
    prompt: {prompt}
    max_tokens: 2
{expect}"""


def write_case(path: Path, name="tiny", about="a case", engine="", rid="A", prompt="{range: [100, 140]}",
               expect="") -> Path:
    path.write_text(CASE.format(name=name, about=about, engine=engine, rid=rid, prompt=prompt, expect=expect),
                    encoding="utf-8")
    return path


@pytest.fixture
def sandbox(tmp_path, tiny_model):
    """A folder whose runs/ is where outputs go, deep enough that `../../..` from it stays inside tmp_path."""
    root = tmp_path / "a" / "b" / "c"
    (root / "runs").mkdir(parents=True)
    return SimpleNamespace(tmp=tmp_path, root=root, env={"RUNS_DIR": str(root / "runs"), "MODEL_DIR": tiny_model})


# --- 14: case files ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../../x", "/tmp/x", "a/b", "..", ".hidden", "x" * 101, "x\x1b[31mred",
                                  "sp ace"])
def test_a_case_name_that_is_not_one_plain_folder_name_is_refused_and_nothing_is_written(sandbox, name):
    case = write_case(sandbox.root / "evil.yaml", name=json.dumps(name))
    before = _tree(sandbox.tmp)
    proc = labkit_limited(["trace", "--case", str(case), "-q"], env=sandbox.env)
    _one_line_naming(proc, "evil.yaml", "name:")
    assert _tree(sandbox.tmp) == before


def test_a_case_without_a_name_takes_its_files_and_still_writes_under_the_runs_folder(sandbox):
    case = sandbox.root / "plain.yaml"
    case.write_text(write_case(sandbox.root / "t.yaml").read_text().replace("name: tiny\n", ""))
    proc = labkit_limited(["trace", "--case", str(case), "-q", "--device", "cpu"], env=sandbox.env)
    assert proc.returncode == 0, proc.stderr
    assert (sandbox.root / "runs" / "trace-plain" / "check.json").is_file()


@pytest.mark.parametrize("positions", ['"0..1000000000000"', '"0..3 + 5..1000000000005"', '"0..260"'])
def test_positions_beyond_what_a_step_holds_are_refused_before_they_are_expanded(sandbox, positions):
    expect = f"expect:\n  - step: 1\n    inputs: {{positions: {positions}}}\n"
    case = write_case(sandbox.root / "pos.yaml", expect=expect)
    proc = labkit_limited(["trace", "--case", str(case), "-q"], env=sandbox.env)
    _one_line_naming(proc, "pos.yaml", "expect step 1.inputs.positions", "more than a step can hold (260)")


def test_positions_a_step_can_hold_are_taken():
    assert expand_positions("0..259", 260) == list(range(260))
    assert expand_positions("0..3 + 10", 5) == [0, 1, 2, 3, 10]


@pytest.mark.parametrize("prompt, limit", [
    ("{range: [0, 1000000000000]}", "max_model_len (the engine's default"),
    ("{random: 1000000000000, seed: 1}", "max_model_len (the engine's default"),
])
def test_a_prompt_longer_than_max_model_len_is_refused_before_it_is_built(sandbox, prompt, limit):
    case = write_case(sandbox.root / "long.yaml", prompt=prompt)
    proc = labkit_limited(["trace", "--case", str(case), "-q"], env=sandbox.env)
    _one_line_naming(proc, "long.yaml", "requests[0] (A).prompt", limit, "4096")
    case = write_case(sandbox.root / "long.yaml", prompt=prompt, engine=", max_model_len: 512")
    _one_line_naming(labkit_limited(["trace", "--case", str(case), "-q"], env=sandbox.env),
                     "requests[0] (A).prompt", "engine.max_model_len 512")


@pytest.mark.parametrize("text, key, line", [
    ("name: a\nname: b\nrequests: []\n", "'name'", "on lines 1 and 2"),
    ("name: a\nrequests:\n  - {id: A, id: B, prompt: {range: [1, 5]}}\n", "'id'", "on line 3"),
    ("name: a\nrequests:\n  - id: A\n    prompt: {range: [1, 5]}\n    max_tokens: 2\n    max_tokens: 3\n",
     "'max_tokens'", "on lines 5 and 6"),
])
def test_a_key_given_twice_is_refused_naming_it(tmp_path, text, key, line):
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    with pytest.raises(LabkitError) as err:
        load_case(path)
    msg = str(err.value)
    assert str(path) in msg and f"key {key} given twice {line}" in msg, msg


def test_yaml_merges_may_still_be_overridden_by_the_mappings_own_keys():
    assert yamlfile.load("base: &b {x: 1, y: 2}\nd: {<<: *b, x: 3}\n")["d"] == {"x": 3, "y": 2}


def test_case_and_workload_files_are_read_with_libyaml_where_pyyaml_has_it():
    if not yaml.__with_libyaml__:
        pytest.skip("pyyaml without libyaml here")
    assert issubclass(yamlfile.StrictLoader, yaml.CSafeLoader)


def test_a_big_case_file_is_parsed_by_libyaml_with_the_duplicate_key_check(tmp_path, monkeypatch):
    """A 300 KB case (1,500 requests) is read by libyaml's parser, never pyyaml's pure-Python scanner (4-5x slower
    here; before, a 6.5 MB case took 129 s), and the duplicate-key check still runs on it. Checked by behaviour,
    not by a stopwatch: the pure-Python scanner is made to fail, and the case must still load."""
    if not yaml.__with_libyaml__:
        pytest.skip("pyyaml without libyaml here")

    def pure_python_scanner(*_a, **_k):
        raise AssertionError("the case went through pyyaml's pure-Python scanner")

    monkeypatch.setattr(yaml.scanner.Scanner, "check_token", pure_python_scanner)
    reqs = "".join(f"  - {{id: R{i}, prompt: {{tokens: [{', '.join(str(100 + j) for j in range(40))}]}}, "
                   f"max_tokens: 2}}\n" for i in range(1500))
    text = "name: big\nengine: {max_model_len: 1024}\nrequests:\n" + reqs
    path = tmp_path / "big.yaml"
    path.write_text(text)
    assert len(load_case(path).requests) == 1500
    path.write_text(text + "  - {id: R1500, prompt: {tokens: [5]}, max_tokens: 2, max_tokens: 3}\n")
    with pytest.raises(LabkitError) as err:
        load_case(path)
    assert "key 'max_tokens' given twice on line 1504" in str(err.value), str(err.value)


@pytest.mark.parametrize("field", ["about", "rid"])
def test_terminal_escapes_in_a_case_are_refused_and_never_printed_raw(sandbox, field):
    evil = '"\\e]0;owned\\a\\e[2J"'
    case = write_case(sandbox.root / "esc.yaml", **{field: evil})
    proc = labkit_limited(["trace", "--case", str(case), "-q"], env=sandbox.env)
    _one_line_naming(proc, "esc.yaml", "\\x1b")


def test_an_error_naming_a_control_character_shows_it_escaped(capsys, tmp_path):
    """Whatever a message quotes (here a path as typed), the one line on stderr sends no control character."""
    code, out, err = run_cli(["trace", "--case", str(tmp_path / "no\x1b[31msuch.yaml")], capsys)
    assert code == 2 and "\x1b" not in err and "no\\x1b[31msuch.yaml" in err, err


def test_a_file_that_is_not_utf8_is_refused_naming_it(sandbox):
    path = sandbox.root / "latin1.yaml"
    path.write_bytes(write_case(sandbox.root / "t.yaml", about="caf\u00e9").read_text().encode("latin-1"))
    proc = labkit_limited(["trace", "--case", str(path), "-q"], env=sandbox.env)
    _one_line_naming(proc, str(path), "not UTF-8", "0xe9")
    wpath = sandbox.root / "w.yaml"
    wpath.write_bytes(b"name: w\nabout: caf\xe9\nrequests: 1\nprompt_len: 4\noutput_len: 2\n")
    proc = labkit_limited(["bench", "--workload", str(wpath)], env=sandbox.env)
    _one_line_naming(proc, str(wpath), "not UTF-8")


def test_a_cases_device_is_honoured_and_the_flag_overrides_it(sandbox):
    """engine.device is a Config field a case may set: a case written for the CPU runs there; one that asks
    for cuda on a machine without a GPU cannot run (exit 2 naming the key), unless --device says otherwise.
    Before: the case's device was silently replaced by --device's default."""
    case = write_case(sandbox.root / "dev.yaml", engine=", device: cpu")
    proc = labkit_limited(["trace", "--case", str(case), "-q", "--json"], env=sandbox.env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((sandbox.root / "runs" / "trace-tiny" / "check.json").read_text())["device"]["type"] == "cpu"
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: a cuda case would run")
    case = write_case(sandbox.root / "dev.yaml", engine=", device: cuda")
    _one_line_naming(labkit_limited(["trace", "--case", str(case), "-q"], env=sandbox.env),
                     "dev.yaml", "engine.device: 'cuda'", "--device cpu")
    proc = labkit_limited(["trace", "--case", str(case), "-q", "--device", "cpu"], env=sandbox.env)
    assert proc.returncode == 0, proc.stderr


# --- 14: bench workloads ----------------------------------------------------------------------------------------
WORKLOAD = {"name": "w", "requests": 4, "prompt_len": 16, "output_len": 4}


@pytest.mark.parametrize("change, key, words", [
    ({"requests": 10**9}, "requests", f"more than a workload may hold ({MAX_REQUESTS})"),
    ({"requests": 100_000, "prompt_len": 1000}, "requests", f"more than a workload may ({MAX_TOKENS})"),
    ({"prompt_len": 10**12}, "prompt_len", f"more than a workload may draw ({MAX_TOKENS})"),
    ({"prompt_len": {"uniform": [1, 10**12]}}, "prompt_len", "more than a workload may draw"),
    ({"output_len": 10**12}, "output_len", "more than a workload may draw"),
    ({"repeats": 10**9}, "repeats", "more than a workload may run"),
    ({"warmup": 10**9}, "warmup", "more than a workload may run"),
    ({"name": "w\x1b[2J"}, "name", "printable"),
])
def test_a_workload_beyond_its_limits_is_refused_before_anything_is_drawn(change, key, words):
    with pytest.raises(LabkitError) as err:
        parse_workload({**WORKLOAD, **change}, "w.yaml")
    assert str(err.value).startswith(f"w.yaml: {key}: ") and words in str(err.value), str(err.value)


def test_a_workload_at_its_limits_is_taken():
    w = parse_workload({**WORKLOAD, "requests": MAX_TOKENS // 1024, "prompt_len": 1024}, "w.yaml")
    assert w.requests * w.prompt_len.hi == MAX_TOKENS


def test_bench_refuses_a_huge_workload_in_one_line_at_bounded_memory(sandbox):
    path = sandbox.root / "huge.yaml"
    path.write_text("name: huge\nrequests: 1000000000\nprompt_len: 1000000000000\noutput_len: 4\n")
    _one_line_naming(labkit_limited(["bench", "--workload", str(path), "--device", "cpu"], env=sandbox.env),
                     str(path), "prompt_len:", str(MAX_TOKENS))


def test_an_arrivals_file_drawing_past_the_workload_limit_is_refused_before_drawing(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"t": 0, "prompt_len": 4, "max_tokens": 2}\n{"t": 1, "prompt_len": 1000000000000, '
                    '"max_tokens": 2}\n')
    code = ("import sys\nfrom labkit.bench.load import load_arrivals\nfrom labkit.errors import LabkitError\n"
            "try:\n    load_arrivals(sys.argv[1])\nexcept LabkitError as e:\n    print(e)\n")

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))

    proc = subprocess.run([sys.executable, "-c", code, str(path)], cwd=REPO, preexec_fn=cap, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith(f"{path}:2: prompt_len: "), (proc.stdout, proc.stderr)
    assert f"more than a workload may ({MAX_TOKENS})" in proc.stdout
    from labkit.bench.load import load_arrivals

    path.write_text('{"t": 0, "prompt_len": 4, "max_tokens": 2}\n')
    assert len(load_arrivals(path)[0].prompt) == 4


@pytest.mark.parametrize("field, value, message", [
    ("top_p", True, "top_p: must be in (0, 1], got True"),       # a bool is not a probability, though True == 1
    ("top_p", "0.5", "top_p: must be in (0, 1], got '0.5'"),
    ("top_p", 0.0, "top_p: must be in (0, 1], got 0.0"),
    ("top_p", 1.05, "top_p: must be in (0, 1], got 1.05"),
    ("top_k", True, "top_k: must be an integer >= 1, or -1/0 for off, got True"),
    ("top_k", -2, "top_k: must be an integer >= 1, or -1/0 for off, got -2"),
    ("seed", -1, "seed: must be an integer in [0, 2**63) or None, got -1"),
    ("max_tokens", True, "max_tokens: must be an integer >= 1, got True"),
    ("temperature", False, "temperature: must be a finite number >= 0 (0 = greedy), got False"),
    ("temperature", float("nan"), "temperature: must be a finite number >= 0 (0 = greedy), got nan"),
    ("temperature", float("inf"), "temperature: must be a finite number >= 0 (0 = greedy), got inf"),
])
def test_a_bad_sampling_field_is_refused_with_its_whole_message(field, value, message):
    with pytest.raises(ValueError) as err:
        SamplingParams(**{field: value})
    assert str(err.value) == message


def test_sampling_defaults_are_nano_vllms_with_the_filters_off():
    """nano-vLLM's SamplingParams(): temperature 1.0, max_tokens 64, ignore_eos False; top-k, top-p and the
    request's own seed (vLLM's) off."""
    p = SamplingParams()
    assert (p.temperature, p.max_tokens, p.ignore_eos, p.top_k, p.top_p, p.seed) == (1.0, 64, False, -1, 1.0, None)
