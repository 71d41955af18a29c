"""README: its GPU figures are docs/perf.md's current ones, and every command of "The first hour" exists with the
options it is shown with."""
from __future__ import annotations

import re
from pathlib import Path

from .helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    nxt = re.search(r"^## ", text[start + len(heading):], re.M)
    return text[start:start + len(heading) + nxt.start()] if nxt else text[start:]


def test_readme_gpu_figures_are_perf_md_current_ones():
    readme = (ROOT / "README.md").read_text()
    now = _section((ROOT / "docs" / "perf.md").read_text(), "## What limits us now")
    m = re.search(r"bf16: ([\d.]+-[\d.]+k) output tok/s on nano-vLLM's benchmark and ([\d.]+-[\d.]+) ms per token "
                  r"at batch 1", " ".join(readme.split()))
    assert m, "README's one-H200 sentence is gone"
    assert f"Nano ({m.group(1)} of" in now and f"Batch-1 ({m.group(2)} ms)" in now


def test_first_hour_commands_exist_with_their_options(capsys):
    hour = _section((ROOT / "README.md").read_text(), "## The first hour")
    commands = re.findall(r"^\s*\d+\. `(labkit [^`]+)`", hour, re.M)
    assert len(commands) >= 9
    for command in commands:
        words = command.split()[1:]
        options = [w for w in words if w.startswith("--")]
        sub = words[:next((i for i, w in enumerate(words) if w.startswith("-")), len(words))]
        code, out, err = run_cli([*sub, "--help"], capsys)
        assert code == 0, (command, err)
        for opt in options:
            assert opt in out, (command, opt)
