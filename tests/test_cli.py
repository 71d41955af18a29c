"""labkit's CLI plumbing: error -> exit code mapping, the JSON envelope, and `labkit doctor`."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from labkit import __version__, cli, doctor, options, output
from labkit.errors import LabkitError

from .helpers import run_cli

EVIDENCE = {"gpu-measured", "cpu-executed", "static-estimate", "simulated"}
ENVELOPE_KEYS = {"command", "argv", "versions", "device", "model", "git_head", "started_at",
                 "ended_at", "evidence"}
VERSION_KEYS = {"python", "torch", "cuda", "triton", "flash_attn", "transformers", "labkit"}
NO_GPU = not output.cuda_available()
ROOT = Path(__file__).resolve().parent.parent




@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    """One labkit cache for the session, so the default tiny model is made once."""
    return tmp_path_factory.mktemp("labkit-cache")


@pytest.fixture
def lab_env(tmp_path, monkeypatch, tiny_cache):
    """Outputs into a tmp RUNS_DIR; no MODEL_DIR so the default model comes from LABKIT_CACHE."""
    runs = tmp_path / "runs"
    monkeypatch.setenv("RUNS_DIR", str(runs))
    monkeypatch.setenv("LABKIT_CACHE", str(tiny_cache))
    monkeypatch.delenv("MODEL_DIR", raising=False)
    return runs


@pytest.fixture
def tiny_model(lab_env):
    from labkit.model import resolve_model

    path = Path(resolve_model(None))
    assert (path / "config.json").is_file()
    return path


@pytest.fixture
def probe_command():
    """Register a throwaway `probe` command that runs whatever the test hands it."""
    action = {}

    def probe() -> None:
        action["fn"]()

    cli.app.command("probe")(probe)
    yield action
    cli.app.registered_commands[:] = [c for c in cli.app.registered_commands if c.name != "probe"]


# ---- main(): exit codes and one-line errors -------------------------------------------------


def _raise(exc):
    def fn():
        raise exc
    return fn


@pytest.mark.parametrize(
    "exc, code, message",
    [
        (LabkitError("model folder /nope does not exist"), 2, "labkit: model folder /nope does not exist"),
        (LabkitError("custom code", code=3), 3, "labkit: custom code"),
        (LabkitError("two\nlines  here"), 2, "labkit: two lines here"),
        (ValueError("max_tokens must be >= 1"), 2, "labkit: max_tokens must be >= 1"),
    ],
)
def test_user_errors_are_one_line_with_their_code(probe_command, capsys, exc, code, message):
    probe_command["fn"] = _raise(exc)
    got, out, err = run_cli(["probe"], capsys)
    assert got == code
    assert err == message + "\n"
    assert "Traceback" not in out + err


def test_unexpected_error_is_one_line_exit_2_without_traceback(probe_command, capsys, monkeypatch):
    monkeypatch.delenv("LABKIT_DEBUG", raising=False)
    probe_command["fn"] = _raise(RuntimeError("kaboom"))
    code, out, err = run_cli(["probe"], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("labkit: RuntimeError: kaboom")
    assert "LABKIT_DEBUG" in err
    assert "Traceback" not in out + err


def test_debug_env_shows_the_traceback(probe_command, capsys, monkeypatch):
    monkeypatch.setenv("LABKIT_DEBUG", "1")
    probe_command["fn"] = _raise(RuntimeError("kaboom"))
    code, _, err = run_cli(["probe"], capsys)
    assert code == 2
    assert "Traceback" in err
    assert err.rstrip().endswith("labkit: RuntimeError: kaboom")


def test_keyboard_interrupt_exits_130(probe_command, capsys):
    probe_command["fn"] = _raise(KeyboardInterrupt())
    code, out, err = run_cli(["probe"], capsys)
    assert code == 130
    assert "Traceback" not in out + err


@pytest.mark.parametrize("code", [0, 1, 2])
def test_typer_exit_code_passes_through(probe_command, capsys, code):
    probe_command["fn"] = _raise(typer.Exit(code))
    assert run_cli(["probe"], capsys)[0] == code


@pytest.mark.parametrize("args", [["no-such-command"], ["doctor", "--device", "tpu"],
                                  ["doctor", "--no-such-flag"], ["smoke", "--max-tokens", "0"],
                                  ["smoke", "--max-tokens", "two"]])
def test_usage_errors_exit_2(capsys, args):
    code, out, err = run_cli(args, capsys)
    assert code == 2
    assert "Traceback" not in out + err


def test_no_arguments_shows_help_listing_commands(capsys):
    code, out, err = run_cli([], capsys)
    assert code in (0, 2)  # click >= 8.2 treats "no args" as a usage error that prints help
    text = out + err
    for name in ("doctor", "smoke", "model"):
        assert name in text


def test_version_flag(capsys):
    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0
    assert out.strip() == f"labkit {__version__}"


def test_python_dash_m_runs_the_same_entry_point():
    done = subprocess.run([sys.executable, "-m", "labkit", "--version"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"labkit {__version__}"


# ---- the command line itself: fast to start, options declared once, help with an example ----------------

# Modules a command may import only inside the function that needs them: `--help` must not pay for them.
HEAVY = ("torch", "transformers", "engine.llm", "fastapi", "matplotlib")


def _command_paths(command=None, path=()):
    """(path, click command) of `labkit` and every command and subcommand under it, loading each."""
    command = command or typer.main.get_command(cli.app)
    yield path, command
    if hasattr(command, "list_commands"):
        for name in command.list_commands(None):
            yield from _command_paths(command.get_command(None, name), (*path, name))


def _imported_after(*runs: list[str]) -> tuple[set[str], list]:
    """The modules loaded by a fresh interpreter that ran `labkit ARGS` once per ARGS (stdout discarded), and the
    exit code of each run."""
    code = ("import json, sys\nfrom labkit import cli\ncodes = []\n"
            f"for args in {[[str(a) for a in r] for r in runs]!r}:\n"
            "    try:\n        cli.main(args)\n    except SystemExit as exit:\n        codes.append(exit.code)\n"
            "sys.stderr.write('MODULES ' + json.dumps([sorted(sys.modules), codes]))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "MODULES " in done.stderr, done.stderr[-2000:]
    modules, codes = json.loads(done.stderr.rsplit("MODULES ", 1)[1])
    return set(modules), codes


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m in HEAVY or m.startswith(tuple(h + "." for h in HEAVY)))


def test_labkit_help_imports_no_command_module_and_nothing_heavy():
    modules, codes = _imported_after(["--help"])
    assert codes == [0]
    assert _heavy(modules) == []
    command_modules = {target.split(":")[0] for target, _ in cli.COMMANDS.values()}
    assert sorted(command_modules & modules) == []  # the listing comes from cli.COMMANDS alone


def test_every_help_and_the_engineless_commands_import_nothing_heavy(tiny_model, lab_env):
    paths = [list(path) for path, _ in _command_paths()]
    helps = [[*p, "--help"] for p in paths]
    # Commands that run no engine: they start without torch, transformers or the engine (lab_env: outputs in tmp).
    engineless = [["notes", "list"], ["patch", "list"], ["model", "info", tiny_model, "--json"],
                  ["shapes", "--tensor-parallel-size", "2", "--model", tiny_model], ["principles", "slots"],
                  ["principles", "cache"]]
    modules, codes = _imported_after(*helps, *engineless)
    assert len(paths) > 30 and codes == [0] * (len(helps) + len(engineless))
    assert _heavy(modules) == []


def test_every_command_help_reads_well_and_shows_an_example(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    for path, _ in _command_paths():
        code, out, err = run_cli([*path, "--help"], capsys)
        assert code == 0, (path, err)
        text = " ".join(out.split())
        assert "Example: " + " ".join(["labkit", *path]) in text, path
        # typer artefacts: a type after a flag, required arguments in braces, an optional one in double brackets
        for artefact in ("<bool>", "{", "[["):
            assert artefact not in out, (path, artefact)


def _shared_options() -> dict[str, list[tuple[tuple[str, ...], object]]]:
    """--flag -> [(command path, its click option)] over every command that has it."""
    found: dict[str, list] = {}
    for path, command in _command_paths():
        for param in getattr(command, "params", []):
            for flag in param.opts:
                found.setdefault(flag, []).append((path, param))
    return found


def test_engine_options_are_declared_once_with_the_engines_choices_and_limits():
    from engine import config
    from engine.policies import POLICIES

    found = _shared_options()
    tp = found["--tensor-parallel-size"]
    assert len(tp) >= 8
    assert {(p.min, p.max) for _, p in tp} == {(1, config.MAX_TENSOR_PARALLEL_SIZE)}, \
        [(" ".join(path), p.min, p.max) for path, p in tp]
    choices = {"--device": config.DEVICES, "--scheduling-policy": tuple(POLICIES),
               "--attention-backend": config.ATTENTION_BACKENDS, "--dtype": config.DTYPES}
    for flag, values in choices.items():
        for path, p in found[flag]:
            assert tuple(c.value for c in p.type_descriptor.choices) == values, (path, flag)
    # One declaration: every command shows the same help, limits and panel for an engine option.
    for flag in ("--model", "--device", "--tensor-parallel-size", "--enforce-eager", "--scheduling-policy", "--dtype",
                 "--attention-backend", "--max-num-batched-tokens", "--kvcache-block-size", "--num-kvcache-blocks",
                 "--max-num-seqs", "--max-model-len", "--async-scheduling", "--kv-cache-dtype", "--json"):
        seen = {(p.help, p.min, p.max, p.rich_help_panel, tuple(p.secondary_opts))
                for path, p in found[flag] if path[0] != "principles"}  # its --model: a tokenizer, no engine
        assert len(seen) == 1, (flag, seen)


def engine_flag_problems(commands) -> list[str]:
    """Every option in an Engine panel of `commands` ((path, click command) pairs) against the rule: a Config
    field's name with dashes (`--enforce-eager/--no-enforce-eager` for a switch), its parameter named as the
    field. The model folder is an option of its own (resolved by labkit, not a settable field)."""
    from labkit.engine_args import FIELDS
    from labkit.options import ENGINE, ENGINE_ON_GPU

    problems, seen = [], 0
    for path, command in commands:
        for p in getattr(command, "params", []):
            if getattr(p, "rich_help_panel", None) not in (ENGINE, ENGINE_ON_GPU) or p.name == "model":
                continue
            seen += 1
            want = "--" + p.name.replace("_", "-")
            where = f"labkit {' '.join(path)} {'/'.join(p.opts + p.secondary_opts)}"
            if p.name not in FIELDS:
                problems.append(f"{where}: its parameter {p.name!r} is not an engine Config field")
            elif p.opts != [want] or p.secondary_opts not in ([], ["--no-" + want[2:]]):
                problems.append(f"{where}: should be {want}")
    assert seen > 50, seen  # the scan sees the engine options of every command
    return problems


def test_every_engine_flag_of_every_command_is_its_config_fields_name_with_dashes():
    assert engine_flag_problems(_command_paths()) == []


def test_a_renamed_engine_flag_is_found(monkeypatch):
    commands = list(_command_paths())
    trace = next(c for path, c in commands if path == ("trace",))
    budget = next(p for p in trace.params if p.name == "max_num_batched_tokens")
    monkeypatch.setattr(budget, "opts", ["--budget"])
    assert engine_flag_problems(commands) == ["labkit trace --budget: should be --max-num-batched-tokens"]


def test_the_old_short_names_still_work_and_messages_use_the_new_ones(capsys):
    code, _, err = run_cli(["bench", "--backend", "hf", "--tp", "2", "--budget", "9", "--graph", "--policy", "mixed",
                            "--attention", "torch", "--block-size", "16", "--num-blocks", "4"], capsys)
    assert code == 2
    assert ("--max-num-batched-tokens, --tensor-parallel-size, --no-enforce-eager, --kvcache-block-size, "
            "--num-kvcache-blocks, --attention-backend, --scheduling-policy: engine settings") in err
    # Only commands with engine options read the old names: `principles attention` is still a command.
    code, out, _ = run_cli(["principles", "attention", "--help"], capsys)
    assert code == 0 and "labkit principles attention" in out


def test_the_first_source_env_sh_says_what_it_installs_and_for_how_long(tmp_path):
    shutil.copy(ROOT / "env.sh", tmp_path / "env.sh")
    python = tmp_path / "no-python"  # fails at once: the message must come before anything slow
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LABKIT_PYTHON": str(python)}
    done = subprocess.run(["bash", "-c", "source ./env.sh"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    first, *rest = done.stderr.splitlines()
    assert "first-time setup" in first and "torch" in first and "GB" in first and "minutes" in first, done.stderr
    assert "venv creation failed" in done.stderr


# ---- output: the JSON envelope ----------------------------------------------------------------


def test_versions_name_torch_and_its_cuda_without_importing_torch():
    import torch

    code = ("import json, sys\nfrom labkit import output\n"
            "print(json.dumps([output.versions(), 'torch' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    found, imported = json.loads(done.stdout)
    assert (found["torch"], found["cuda"], imported) == (str(torch.__version__), torch.version.cuda, False)
    assert output.versions()["torch"] == str(torch.__version__)  # this process has torch: read from it


def test_envelope_carries_provenance(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen3"}')
    env = output.envelope("unit", device="cpu", model_dir=model, evidence="cpu-executed",
                          argv=["labkit", "unit"])
    assert env["command"] == "unit"
    assert env["argv"] == ["labkit", "unit"]
    assert set(env["versions"]) >= VERSION_KEYS
    assert env["versions"]["labkit"] == __version__
    assert env["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert env["device"]["type"] == "cpu" and env["device"]["count"] >= 1 and env["device"]["name"]
    assert env["model"]["path"] == str(model.resolve())
    assert env["model"]["config_sha256"] == hashlib.sha256(b'{"model_type": "qwen3"}').hexdigest()
    assert env["evidence"] == "cpu-executed"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", env["started_at"])


def test_envelope_defaults_argv_and_tolerates_no_model(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["labkit", "x", "--flag"])
    env = output.envelope("x", device="cpu", model_dir=None, evidence="simulated")
    assert env["argv"] == ["labkit", "x", "--flag"]
    assert env["model"] == {"path": None, "config_sha256": None}


def test_envelope_rejects_unknown_evidence():
    with pytest.raises(ValueError, match="evidence"):
        output.envelope("x", device="cpu", model_dir=None, evidence="vibes")


def test_finish_adds_end_time_and_results_without_touching_the_envelope():
    env = output.envelope("x", device="cpu", model_dir=None, evidence="static-estimate")
    done = output.finish(env, status="PASS", rows=[1, 2])
    assert done["status"] == "PASS" and done["rows"] == [1, 2]
    assert done["ended_at"] >= done["started_at"]
    assert "ended_at" not in env and "status" not in env


def test_write_json_makes_folders_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "a" / "b" / "out.json"
    output.write_json(target, {"path": Path("/x"), "n": 1})
    output.write_json(target, {"path": Path("/y"), "n": 2})  # overwrite in place
    assert json.loads(target.read_text()) == {"path": "/y", "n": 2}
    assert target.read_text().startswith('{\n  "path"')  # indent 2
    assert os.listdir(target.parent) == ["out.json"]


def test_runs_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("RUNS_DIR", str(tmp_path / "r"))
    assert output.runs_dir() == tmp_path / "r"
    monkeypatch.delenv("RUNS_DIR")
    assert output.runs_dir() == Path("runs")


def test_git_head_none_outside_a_repo_and_sha_inside(monkeypatch, tmp_path):
    monkeypatch.setenv("LAB_ROOT", str(tmp_path))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert output.git_head() is None
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    (tmp_path / "f").write_text("x")
    subprocess.run(git + ["add", "f"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "x"], check=True)
    head = output.git_head()
    assert head and re.fullmatch(r"[0-9a-f]{40}", head)
    assert output.git_dirty() is False
    # Lab notes are the user's text about results (labkit notes init writes them): never dirty code.
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "principles-cache.md").write_text("TODO")
    assert output.git_dirty() is False
    (tmp_path / "g").write_text("y")
    assert output.git_dirty() is True


def test_git_head_of_an_exported_copy_inside_another_repo_is_the_archived_commit(monkeypatch, tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    outer = tmp_path / "outer"
    copy = outer / "copy"
    (copy / "labkit").mkdir(parents=True)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    git = ["git", "-C", str(outer), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    (outer / "f").write_text("x")
    subprocess.run(git + ["add", "f"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "x"], check=True)
    monkeypatch.setenv("LAB_ROOT", str(copy))
    (copy / "labkit" / "COMMIT").write_text("$Format:%H$\n")  # not expanded: no provenance
    assert output.git_head() is None and output.git_dirty() is None  # never the outer repo's commit
    sha = "0123456789abcdef0123456789abcdef01234567"
    (copy / "labkit" / "COMMIT").write_text(sha + "\n")
    assert output.git_head() == sha and output.git_dirty() is None


def test_git_archive_writes_the_commit_into_labkit_commit(tmp_path):
    root = Path(__file__).resolve().parent.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("needs git and this checkout")
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    archived = subprocess.run(["git", "-C", str(root), "archive", "HEAD", "labkit/COMMIT"], capture_output=True,
                              check=True).stdout
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(archived)) as tar:
        text = tar.extractfile("labkit/COMMIT").read().decode().strip()
    assert text == head


def test_resolve_device():
    assert output.resolve_device("cpu") == "cpu"
    assert output.resolve_device(options.Device.auto) == ("cpu" if NO_GPU else "cuda")
    with pytest.raises(LabkitError):
        output.resolve_device("tpu")


@pytest.mark.skipif(not NO_GPU, reason="needs a machine without a GPU")
def test_asking_for_cuda_without_a_gpu_cannot_run():
    with pytest.raises(LabkitError) as err:
        output.resolve_device("cuda")
    assert err.value.code == output.EXIT_CANNOT_RUN
    assert output.device_info("cuda")["count"] == 0


# ---- doctor ----------------------------------------------------------------------------------


def _rows(report):
    return {r["check"]: r for r in report["rows"]}


def test_doctor_on_cpu_passes_and_writes_json(tiny_model, lab_env, capsys):
    code, out, err = run_cli(["doctor", "--device", "cpu"], capsys)
    report = json.loads((lab_env / "doctor.json").read_text())
    rows = _rows(report)
    assert set(report) >= ENVELOPE_KEYS
    assert report["command"] == "doctor"
    assert report["evidence"] in EVIDENCE
    assert report["model"]["path"] == str(tiny_model.resolve())
    for name in ("python", "torch", "cuda", "triton", "flash_attn", "transformers", "engine",
                 "model files", "model config", "tensor op (cpu)", "disk"):
        assert name in rows, name
        assert rows[name]["status"] in {"PASS", "WARN", "FAIL"}
    failed = [r for r in report["rows"] if r["status"] == "FAIL"]
    assert failed == [], failed
    assert code == 0
    assert rows["model config"]["status"] == "PASS" and "qwen3" in rows["model config"]["detail"]
    assert rows["tensor op (cpu)"]["status"] == "PASS"
    if NO_GPU:
        assert rows["cuda"]["status"] == "WARN"
        assert rows["triton"]["status"] in {"PASS", "WARN"}
    assert "doctor" in out and "PASS" in out and "Traceback" not in err


def test_doctor_does_not_load_the_engine_or_transformers(tiny_model, lab_env):
    """doctor reports torch and the GPU without importing the engine's runner (its kernels cost seconds on a
    GPU box) or transformers (reported by its installed version). (The engine package itself is light: the CLI
    reads its config module for choices.)"""
    import subprocess
    import sys

    code = ("import sys; from labkit.cli import app\n"
            "try:\n    app(['doctor', '--device', 'cpu', '--model', sys.argv[1]])\n"
            "except SystemExit as e:\n    print('exit', e.code)\n"
            "print('loaded', sorted(m for m in ('engine.llm', 'engine.runner', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, str(tiny_model)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert "exit 0" in done.stdout and "loaded []" in done.stdout, (done.stdout[-800:], done.stderr[-800:])


@pytest.mark.skipif(not NO_GPU, reason="needs a machine without a GPU")
def test_doctor_device_cuda_without_gpu_fails_beside_the_passing_record(tiny_model, lab_env, capsys):
    """A failed try of another configuration adds a record: the passing doctor.json stays as it was."""
    assert run_cli(["doctor"], capsys)[0] == 0
    passing = (lab_env / "doctor.json").read_bytes()
    code, out, _ = run_cli(["doctor", "--device", "cuda"], capsys)
    rows = _rows(json.loads((lab_env / "doctor-device-cuda.json").read_text()))
    assert code == 1
    assert rows["cuda"]["status"] == "FAIL"
    assert "FAIL" in out and "doctor-device-cuda.json" in out.replace("\n", "")
    assert (lab_env / "doctor.json").read_bytes() == passing
    # The same configuration again replaces its own record, and the default device named is the default's.
    assert run_cli(["doctor", "--device", "cpu"], capsys)[0] == 0
    assert sorted(p.name for p in lab_env.glob("doctor*.json")) == ["doctor-device-cuda.json", "doctor.json"]


def test_doctor_missing_model_is_a_failed_check(lab_env, tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    code, out, err = run_cli(["doctor", "--device", "cpu", "--model", str(missing)], capsys)
    rows = _rows(json.loads((lab_env / "doctor-model-no-such-model.json").read_text()))
    assert code == 1
    assert rows["model files"]["status"] == "FAIL"
    assert "no-such-model" in rows["model files"]["detail"]
    assert "Traceback" not in out + err


def test_doctor_rejects_a_non_qwen3_model(tiny_model, lab_env, tmp_path, capsys):
    other = tmp_path / "llama"
    shutil.copytree(tiny_model, other)
    config = json.loads((other / "config.json").read_text())
    config["model_type"] = "llama"
    (other / "config.json").write_text(json.dumps(config))
    code, _, _ = run_cli(["doctor", "--device", "cpu", "--model", str(other)], capsys)
    rows = _rows(json.loads((lab_env / "doctor-model-llama.json").read_text()))
    assert code == 1
    assert rows["model config"]["status"] == "FAIL"
    assert "llama" in rows["model config"]["detail"]


def test_doctor_notices_missing_weights(tiny_model, lab_env, tmp_path, capsys):
    other = tmp_path / "noweights"
    shutil.copytree(tiny_model, other)
    for f in other.glob("*.safetensors"):
        f.unlink()
    code, _, _ = run_cli(["doctor", "--device", "cpu", "--model", str(other)], capsys)
    rows = _rows(json.loads((lab_env / "doctor-model-noweights.json").read_text()))
    assert code == 1
    assert rows["model files"]["status"] == "FAIL"
    assert "safetensors" in rows["model files"]["detail"]


def test_doctor_json_flag_prints_the_report(tiny_model, lab_env, capsys):
    code, out, _ = run_cli(["doctor", "--device", "cpu", "--json"], capsys)
    printed = json.loads(out)
    assert printed["command"] == "doctor"
    assert printed["rows"] == json.loads((lab_env / "doctor.json").read_text())["rows"]
    assert code == (1 if any(r["status"] == "FAIL" for r in printed["rows"]) else 0)


def test_disk_check_warns_when_space_is_low(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor, "MIN_FREE_DISK_GB", 0.0)
    assert doctor.check_disk(tmp_path / "not" / "yet")["status"] == "PASS"
    monkeypatch.setattr(doctor, "MIN_FREE_DISK_GB", 1e12)
    low = doctor.check_disk(tmp_path / "not" / "yet")
    assert low["status"] == "WARN" and "GB free" in low["detail"]


def test_tensor_check_catches_a_wrong_result(monkeypatch):
    assert doctor.check_tensor_op("cpu")["status"] == "PASS"
    import torch

    real = torch.Tensor.cpu
    # A device whose results come back wrong (here: doubled) must FAIL the check.
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self: real(self) * 2)
    assert doctor.check_tensor_op("cpu")["status"] == "FAIL"


def test_old_transformers_fails(monkeypatch):
    monkeypatch.setattr(doctor, "versions", lambda: {"transformers": "4.40.2"})
    assert doctor.check_transformers()["status"] == "FAIL"
    monkeypatch.setattr(doctor, "versions", lambda: {"transformers": "5.2.0"})
    assert doctor.check_transformers()["status"] == "PASS"


def test_every_first_hour_command_writes_its_json_with_a_markdown_twin(tiny_model, lab_env, capsys):
    """README: every command of the first hour writes its JSON and a Markdown twin under runs/ (doctor, smoke and
    trace wrote none)."""
    tiny = ["--model", str(tiny_model), "--device", "cpu"]
    runs = [(["doctor"], "doctor.json", "# labkit doctor: PASS"),
            (["smoke", "--device", "cpu"], "smoke.json", "# labkit smoke: PASS"),
            (["trace", "--case", "chunk", *tiny, "-q"], "trace-chunk/check.json", "# trace chunk: PASS"),
            (["principles", "slots"], "principles/slots.json", "# principles slots: **PASS**"),
            (["logits-check", "run", "--suite", "prefix", *tiny], "logits-prefix/check.json", "PASS"),
            (["bench", "--workload", "fixed", "--num-requests", "2", "--repeats", "1", "--warmup", "0", *tiny,
              "--enforce-eager",
              "--out", str(lab_env / "bench.json")], "bench.json", "fixed")]
    for args, json_name, head in runs:
        code, out, err = run_cli(args, capsys)
        assert code == 0, (args, err)
        result = lab_env / json_name
        twin = result.with_suffix(".md")
        assert json.loads(result.read_text())["command"] and twin.is_file(), (args, sorted(lab_env.rglob("*")))
        assert head in twin.read_text(), (args, twin.read_text()[:300])
