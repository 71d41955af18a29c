"""`labkit doctor` at its edges: a GPU asked for or not, the exact minimum versions and disk space, the verdict."""
from __future__ import annotations

import json
from collections import namedtuple

import pytest

from labkit import doctor

from .helpers import run_cli


def test_no_gpu_is_a_warning_unless_cuda_was_asked_for(monkeypatch):
    monkeypatch.setattr(doctor, "cuda_available", lambda: False)
    assert doctor.check_cuda("auto")["status"] == doctor.WARN
    assert doctor.check_cuda("cpu")["status"] == doctor.WARN
    assert doctor.check_cuda("cuda")["status"] == doctor.FAIL


@pytest.mark.parametrize("version, status", [("4.51.0", "PASS"), ("4.51", "PASS"), ("4.52.1", "PASS"),
                                             ("4.50.3", "FAIL"), ("3.99", "FAIL")])
def test_the_minimum_transformers_version_itself_passes(monkeypatch, version, status):
    monkeypatch.setattr(doctor, "versions", lambda: {"transformers": version})
    assert doctor.check_transformers()["status"] == status


def test_exactly_the_minimum_free_disk_passes(monkeypatch, tmp_path):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda p: usage(10e9, 5e9, doctor.MIN_FREE_DISK_GB * 1e9))
    assert doctor.check_disk(tmp_path)["status"] == doctor.PASS
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda p: usage(10e9, 5e9, doctor.MIN_FREE_DISK_GB * 1e9 - 1e6))
    assert doctor.check_disk(tmp_path)["status"] == doctor.WARN


def test_a_single_failing_row_fails_the_doctor(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("RUNS_DIR", str(tmp_path / "runs"))
    rows = [doctor.row("python", "PASS", "ok"), doctor.row("disk", "WARN", "low"), doctor.row("torch", "FAIL", "x")]
    monkeypatch.setattr(doctor, "collect", lambda model, device: (rows, None))
    code, out, _ = run_cli(["doctor", "--device", "cpu", "--json"], capsys)
    assert code == 1
    assert json.loads(out)["status"] == "FAIL"
    md = next((tmp_path / "runs").glob("doctor*.md")).read_text()
    assert md.startswith("# labkit doctor: FAIL")
    assert "1 PASS, 1 WARN, 1 FAIL" in md


def test_the_markdown_counts_each_status_under_its_own_name():
    result = {"status": "FAIL", "counts": {"PASS": 3, "WARN": 2, "FAIL": 1}, "device": {"type": "cpu"},
              "argv": ["doctor"], "rows": []}
    assert "3 PASS, 2 WARN, 1 FAIL on cpu" in doctor.markdown(result)


def test_a_model_folder_without_its_tokenizer_fails(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x")
    got = doctor.check_model_files(tmp_path)
    assert got["status"] == doctor.FAIL and "tokenizer.json" in got["detail"]
    (tmp_path / "tokenizer.json").write_text("{}")
    assert doctor.check_model_files(tmp_path)["status"] == doctor.PASS
