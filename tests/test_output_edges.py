"""labkit.output at its edges: evidence of a numbered GPU, the engine knobs recorded, write_json's mode and its
failure path, the model path an envelope records, and the record-name suffix of a command's options."""
from __future__ import annotations

import enum
import json
import os
import re
from pathlib import Path
from typing import Optional

import pytest
import typer
from typer.testing import CliRunner

from labkit import output


def test_evidence_of_any_cuda_device_is_gpu_measured():
    assert output.evidence_for("cuda") == output.evidence_for("cuda:1") == "gpu-measured"
    assert output.evidence_for("cpu") == "cpu-executed"


def test_engine_knobs_are_every_prefix_and_nothing_else(monkeypatch):
    for key in list(os.environ):
        if key.startswith("LABKIT_"):
            monkeypatch.delenv(key)
    knobs = {"LABKIT_DECODE_SPLITS": "4", "LABKIT_GUMBEL_NOISE": "philox", "LABKIT_GRAPH_POOL": "0",
             "LABKIT_FP8_V_TRANSPOSED": "1"}
    for k, v in {**knobs, "LABKIT_TEST_BOUNDS": "0", "DECODE_SPLITS": "2"}.items():
        monkeypatch.setenv(k, v)
    assert output.engine_knobs() == dict(sorted(knobs.items()))
    assert output.knobs_text(output.engine_knobs()) == ("LABKIT_DECODE_SPLITS=4, LABKIT_FP8_V_TRANSPOSED=1, "
                                                        "LABKIT_GRAPH_POOL=0, LABKIT_GUMBEL_NOISE=philox")


def test_write_json_gives_the_mode_the_umask_allows(tmp_path):
    old = os.umask(0o027)
    try:
        path = output.write_json(tmp_path / "r.json", {"n": 1})
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o640
    assert path.read_text().endswith("}\n")


def test_write_json_that_fails_leaves_the_old_file_and_no_temp_file(tmp_path):
    target = tmp_path / "r.json"
    output.write_json(target, {"n": 1})
    with pytest.raises(TypeError):
        output.write_json(target, {(1, 2): "a tuple key JSON cannot hold"})
    assert json.loads(target.read_text()) == {"n": 1}
    assert os.listdir(tmp_path) == ["r.json"]


def test_an_envelope_records_a_relative_model_folder_as_an_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    env = output.envelope("x", device="cpu", model_dir="m", evidence="static-estimate")
    assert env["model"]["path"] == str((tmp_path / "m").resolve()) and Path(env["model"]["path"]).is_absolute()
    assert env["model"]["config_sha256"]


class Mode(enum.Enum):
    fast = "fast"
    slow = "slow"


def _suffix(args: list[str]) -> str:
    """configuration_suffix() inside a small command with the kinds of options labkit's commands take."""
    app = typer.Typer()
    seen: list[str] = []

    @app.command()
    def cmd(mode: Mode = typer.Option(Mode.fast, "--mode"),
            eager: bool = typer.Option(True, "--eager/--no-eager"),
            quick: bool = typer.Option(False, "--quick"),
            size: int = typer.Option(16, "--size"),
            prompt: str = typer.Option("hi", "--prompt"),
            out: Optional[Path] = typer.Option(None, "--out")) -> None:
        seen.append(output.configuration_suffix())

    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    return seen[0]


def test_configuration_suffix_names_the_options_given():
    assert _suffix([]) == ""
    assert _suffix(["--size", "16", "--mode", "fast", "--eager", "--out", "/tmp/x.json"]) == ""  # defaults, --out
    assert _suffix(["--size", "100"]) == "-size-100"
    assert _suffix(["--mode", "slow"]) == "-mode-slow"
    assert _suffix(["--no-eager", "--quick"]) == "-no-eager-quick"
    assert _suffix(["--prompt", "a b:c"]) == "-prompt-a_b_c"


def test_configuration_suffix_of_many_options_is_cut_to_the_limit_with_a_digest():
    suffix = _suffix(["--prompt", "x" * 300])
    assert len(suffix) == output.RECORD_NAME_MAX
    assert re.fullmatch(r"-prompt-x+-[0-9a-f]{10}", suffix)
    assert suffix != _suffix(["--prompt", "x" * 301])


def test_write_json_writes_an_enum_as_its_value(tmp_path):
    path = output.write_json(tmp_path / "r.json", {"mode": Mode.slow, "path": Path("/m")})
    assert json.loads(path.read_text()) == {"mode": "slow", "path": "/m"}


def test_a_command_run_in_process_records_its_own_command_line(tmp_path, monkeypatch, capsys):
    from .helpers import run_cli

    monkeypatch.setenv("RUNS_DIR", str(tmp_path / "runs"))
    code, out, err = run_cli(["principles", "slots", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["argv"] == ["labkit", "principles", "slots", "--json"]
    assert output.envelope("x", device="cpu", model_dir=None, evidence="simulated")["argv"] != json.loads(out)["argv"]
