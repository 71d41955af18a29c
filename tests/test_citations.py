"""No text a user of the repository reads cites a source they cannot open ("seed 000 §18.1", "the seeds'
values"): the principles labs state each expected value and how it follows, and the docs, the lab plan, the
notes and labkit's own strings say what they mean instead of where someone else wrote it."""
from __future__ import annotations

import json
import re
from pathlib import Path

from .helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
CITATION = re.compile(r"§|\bseeds? 0\d\d\b|\bseeds'|\bthe seeds\b")


def test_no_user_text_cites_the_seeds():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "notes").rglob("*.md")),
             ROOT / "patches" / "README.md", *sorted((ROOT / "workloads").rglob("*.yaml")),
             *sorted((ROOT / "labkit").rglob("*.py"))]
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in files
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if CITATION.search(line)]
    assert not found, "\n".join(found[:20])


def test_every_principles_check_states_how_its_value_follows(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli(["principles", "memory"], capsys)
    assert code == 0, err
    r = json.loads((tmp_path / "runs" / "principles" / "memory.json").read_text())
    assert all(c["how"] and "seed" not in c for c in r["checks"]) and "seed" not in r
    kv = next(c for c in r["checks"] if c["name"] == "KV bytes per token (KiB)")
    assert kv["how"].startswith("2 (K and V) x 28 layers x 8 KV heads x head_dim 128 x 2 bytes (bf16) = 114688 B")
    text = " ".join(out.split())
    assert "2 (K and V) x 28 layers" in text and "seed" not in text    # under the check's name at 80 columns
    md = (tmp_path / "runs" / "principles" / "memory.md").read_text()
    assert "| check | computed | expected | how it follows |" in md and "112 KiB x 4096 positions" in md
