"""`labkit report`: results under runs/ gathered into a summary, a sha256 manifest and an archive."""
from __future__ import annotations

import hashlib
import json
import re
import tarfile

from .helpers import run_cli


def _env(command, evidence="cpu-executed", head="a" * 40, dirty=False, **fields):
    return {"command": command, "argv": [], "versions": {}, "device": {"type": "cpu", "name": "X"}, "model": {},
            "git_head": head, "git_dirty": dirty, "started_at": "t", "evidence": evidence, **fields}


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_report_summarises_each_kind_and_archives_with_a_manifest(tmp_path, capsys, tiny_model):
    runs = tmp_path / "runs"
    _write(runs / "bench-nano-engine-graph.json", _env("bench", "gpu-measured", status="ok", backend="engine",
                                                       execution="graph", workload={"name": "nano"},
                                                       median={"output_throughput": 21819.0}, runs=[{}, {}, {}]))
    (runs / "bench-nano-engine-graph.md").write_text("# twin")
    _write(runs / "lc" / "check.json", _env("logits-check compare", verdict="FAIL", suite="baseline",
                                            summary={"rows": 15, "top1_agree": 14, "worst_max_abs": {"value": 0.7},
                                                     "worst_rel_l2": {"value": 0.03}}))
    (runs / "lc" / "engine.npz").write_bytes(b"arrays")
    _write(runs / "lc" / "engine.json", _env("logits-check collect --backend engine"))  # an input, not a result
    _write(runs / "cmp.json", _env("bench compare", head="b" * 40, dirty=True, variable="eager", ratio=13.08))
    _write(runs / "not-ours.json", {"hello": 1})
    code, out, err = run_cli(["trace", "--case", "chunk", "--model", tiny_model, "--device", "cpu", "-q",
                              "--out", runs / "trace-chunk"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["report", "--runs", runs, "--title", "test report"], capsys)
    assert code == 0, err
    md = (runs / "report" / "report.md").read_text()
    assert md.startswith("# test report")
    assert "21,819.0 output tok/s" in md and "| FAIL | suite baseline: 15 rows, worst max-abs 0.7" in md
    assert "B/A 13.080x" in md and "| PASS | case chunk" in md and "not-ours" not in md
    assert "engine.json" not in md  # a logits collection is an input of its compare
    assert re.search(r"results come from [23] commits", md) and "uncommitted" in md and "GPU measurements sit next to CPU" in md
    manifest = json.loads((runs / "report" / "manifest.json").read_text())
    assert manifest["command"] == "report" and manifest["evidence"] == "cpu-executed"  # the weakest result's kind
    files = {f["file"]: f for f in manifest["files"]}
    assert "bench-nano-engine-graph.md" in files and "lc/check.json" in files and "trace-chunk/check.json" in files
    assert "lc/engine.npz" not in files and "trace-chunk/events.jsonl" not in files  # logs only with --with-logs
    f = files["lc/check.json"]
    assert f["sha256"] == hashlib.sha256((runs / "lc" / "check.json").read_bytes()).hexdigest()
    with tarfile.open(runs / "report" / "evidence.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"evidence/report.md", "evidence/manifest.json", "evidence/lc/check.json"} <= names
    code, _, err = run_cli(["report", "--runs", runs, "--with-logs", "--out", tmp_path / "full"], capsys)
    assert code == 0, err
    files = {f["file"] for f in json.loads((tmp_path / "full" / "manifest.json").read_text())["files"]}
    assert "lc/engine.npz" in files and "trace-chunk/events.jsonl" in files


def test_report_with_nothing_to_report_exits_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(["report", "--runs", tmp_path / "empty"], capsys)
    assert code == 2 and "no labkit results" in err
    code, _, err = run_cli(["report", "--runs", tmp_path / "missing"], capsys)
    assert code == 2 and "not a folder" in err
