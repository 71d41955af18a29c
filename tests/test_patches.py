"""Every shipped patch applies to the current engine, and the lab catches every fault patch."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PATCHES = sorted((REPO / "patches").glob("*.patch"))


def test_the_index_lists_every_patch():
    index = (REPO / "patches" / "README.md").read_text()
    listed = set(re.findall(r"^\| ([\w.-]+\.patch) \|", index, flags=re.M))
    assert listed == {p.name for p in PATCHES}


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.stem)
def test_patch_applies(patch):
    res = subprocess.run(["git", "apply", "--check", str(patch)], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("patch", [p for p in PATCHES if p.stem.startswith("fault-")], ids=lambda p: p.stem)
def test_trace_catches_the_fault(patch, tiny_model, tmp_path):
    tree = tmp_path / "tree"
    for part in ("engine", "labkit", "workloads"):
        shutil.copytree(REPO / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    res = subprocess.run(["git", "apply", "--directory=", str(patch)], cwd=tree, capture_output=True, text=True)
    if res.returncode:  # git apply outside a repository wants plain `patch` semantics
        res = subprocess.run(["patch", "-p1", "-i", str(patch)], cwd=tree, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    env = {**os.environ, "PYTHONPATH": str(tree), "LAB_ROOT": str(tree), "RUNS_DIR": str(tmp_path / "runs")}
    res = subprocess.run([sys.executable, "-m", "labkit", "trace", "--case", "C", "--model", tiny_model,
                          "--device", "cpu", "-q"], cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "step 2" in " ".join(res.stdout.split())
