"""`labkit smoke` end to end on the embedded tiny model (CPU), plus its checks and exit codes."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import cli, smoke
from labkit.output import EXIT_CANNOT_RUN, EXIT_FAIL, EXIT_PASS

ROOT = Path(__file__).resolve().parent.parent
ENVELOPE_KEYS = {"command", "argv", "versions", "device", "model", "git_head", "started_at",
                 "ended_at", "evidence"}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("labkit-cache")


@pytest.fixture
def env(tmp_path, cache_dir):
    """A child environment with its own RUNS_DIR and LABKIT_CACHE, and no MODEL_DIR."""
    child = dict(os.environ)
    child.pop("MODEL_DIR", None)
    child.pop("LABKIT_DEBUG", None)
    child.update(RUNS_DIR=str(tmp_path / "runs"), LABKIT_CACHE=str(cache_dir),
                 TOKENIZERS_PARALLELISM="false", COLUMNS="200")
    return child


def labkit(args, env, timeout=600):
    return subprocess.run([sys.executable, "-m", "labkit", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def smoke_json(env) -> dict:
    return json.loads((Path(env["RUNS_DIR"]) / "smoke.json").read_text())


def test_smoke_on_the_default_tiny_model(env, cache_dir):
    done = labkit(["smoke", "--device", "cpu"], env)
    assert done.returncode == EXIT_PASS, done.stdout + done.stderr
    report = smoke_json(env)

    assert set(report) >= ENVELOPE_KEYS
    assert report["command"] == "smoke"
    assert report["argv"][1:] == ["smoke", "--device", "cpu"]
    assert report["evidence"] == "cpu-executed"
    assert report["device"]["type"] == "cpu"
    assert report["versions"]["torch"] and report["versions"]["labkit"]
    model = Path(report["model"]["path"])
    assert cache_dir.resolve() in model.parents  # the default model was made in LABKIT_CACHE
    assert report["model"]["config_sha256"] == hashlib.sha256((model / "config.json").read_bytes()).hexdigest()

    assert report["status"] == "PASS"
    assert len(report["token_ids"]) == 2
    assert all(isinstance(t, int) and t >= 0 for t in report["token_ids"])
    assert report["engine"]["num_kvcache_blocks"] > 0
    assert report["prompt_tokens"] > 0
    assert report["formatted_prompt"].count(report["prompt"]) == 1  # the chat template was applied
    assert {c["name"] for c in report["checks"]} == {"one result", "token count", "ids in vocab", "kv blocks"}
    assert all(c["passed"] for c in report["checks"])

    assert " ".join(map(str, report["token_ids"])) in done.stdout
    assert "PASS" in done.stdout
    assert "Traceback" not in done.stderr


def test_smoke_max_tokens_and_prompt(env):
    done = labkit(["smoke", "--device", "cpu", "--max-tokens", "5", "--prompt", "Count to three."], env)
    assert done.returncode == EXIT_PASS, done.stdout + done.stderr
    # Another prompt and length: a record of its own beside smoke.json.
    (path,) = Path(env["RUNS_DIR"]).glob("smoke-max-tokens-5-prompt-Count*.json")
    report = json.loads(path.read_text())
    assert len(report["token_ids"]) == 5
    assert report["prompt"] == "Count to three."
    assert "Count to three." in report["formatted_prompt"]
    assert report["sampling"] == {"temperature": 0.6, "max_tokens": 5, "ignore_eos": True}


def test_smoke_missing_model_exits_2_with_one_line(env, tmp_path):
    missing = tmp_path / "no-such-model"
    done = labkit(["smoke", "--model", str(missing)], env)
    assert done.returncode == EXIT_CANNOT_RUN
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("labkit: ")
    assert "Traceback" not in done.stdout + done.stderr
    assert not (Path(env["RUNS_DIR"]) / "smoke.json").exists()


def test_smoke_engine_value_error_exits_2(env):
    # Far longer than max_model_len (1024): the engine refuses it with a ValueError.
    done = labkit(["smoke", "--device", "cpu", "--prompt", "hello world " * 1500], env)
    assert done.returncode == EXIT_CANNOT_RUN, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("labkit: "), done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_smoke_zero_tokens_is_a_usage_error(env):
    done = labkit(["smoke", "--max-tokens", "0"], env, timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stdout + done.stderr


# ---- the checks, with a stand-in engine -------------------------------------------------------


class FakeLLM:
    """Just enough of engine.LLM for smoke; its output can be bent to break one check."""

    def __init__(self, token_ids, kv_blocks=4, vocab=100, fail=None):
        from types import SimpleNamespace

        self.config = SimpleNamespace(num_kvcache_blocks=kv_blocks, device="cpu",
                                      hf_config=SimpleNamespace(vocab_size=vocab))
        self.tokenizer = SimpleNamespace(
            apply_chat_template=lambda msgs, tokenize, add_generation_prompt:
                f"<|im_start|>user\n{msgs[0]['content']}<|im_end|>\n<|im_start|>assistant\n",
            encode=lambda text: list(range(len(text.split()))),
        )
        self.token_ids, self.fail, self.exited = token_ids, fail, False
        self.execution = "eager"

    def generate(self, prompts, params, use_tqdm=False):
        if self.fail:
            raise self.fail
        return [{"text": "xy", "token_ids": list(self.token_ids)}]

    def exit(self):
        self.exited = True


def run_with(fake, monkeypatch, tmp_path, capsys, args=()):
    monkeypatch.setenv("RUNS_DIR", str(tmp_path / "runs"))
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    monkeypatch.setattr(smoke, "resolve_model", lambda name: Path(name))
    monkeypatch.setattr(smoke, "load_engine", lambda model_dir, device, eager: fake)
    with pytest.raises(SystemExit) as exited:
        cli.main(["smoke", "--device", "cpu", "--model", str(model), *args])
    out, err = capsys.readouterr()
    return exited.value.code, out, err


@pytest.mark.parametrize(
    "fake_args, broken",
    [
        (dict(token_ids=[1]), "token count"),
        (dict(token_ids=[1, 100]), "ids in vocab"),
        (dict(token_ids=[1, -3]), "ids in vocab"),
        (dict(token_ids=[1, 2], kv_blocks=0), "kv blocks"),
    ],
)
def test_a_failed_check_exits_1(monkeypatch, tmp_path, capsys, fake_args, broken):
    pytest.importorskip("engine")
    fake = FakeLLM(**fake_args)
    code, out, _ = run_with(fake, monkeypatch, tmp_path, capsys)
    report = json.loads((tmp_path / "runs" / "smoke-model-model.json").read_text())  # --model: another folder
    assert code == EXIT_FAIL
    assert report["status"] == "FAIL"
    assert [c["name"] for c in report["checks"] if not c["passed"]] == [broken]
    assert "FAIL" in out
    assert fake.exited  # the engine is shut down even when a check fails


def test_the_fake_passes_when_nothing_is_broken(monkeypatch, tmp_path, capsys):
    pytest.importorskip("engine")
    fake = FakeLLM(token_ids=[5, 7])
    code, out, _ = run_with(fake, monkeypatch, tmp_path, capsys)
    assert code == EXIT_PASS
    assert "5 7" in out and fake.exited


def test_engine_error_during_generate_exits_2_and_still_shuts_down(monkeypatch, tmp_path, capsys):
    pytest.importorskip("engine")
    fake = FakeLLM(token_ids=[5, 7], fail=ValueError("prompt: longer than max_model_len 1024"))
    code, out, err = run_with(fake, monkeypatch, tmp_path, capsys)
    assert code == EXIT_CANNOT_RUN
    assert err == "labkit: prompt: longer than max_model_len 1024\n"
    assert fake.exited
    assert not list((tmp_path / "runs").glob("smoke*.json"))
