"""scripts/graph_sampling_check.py (the device check of a drawing decode graph, LABKIT_GRAPH_SAMPLE_BS) on the CPU.
(Apart from tests/test_graph_sampling.py, which scripts/mutate.py runs in a tree without scripts/.)"""
from __future__ import annotations


def test_the_device_check_says_not_run_where_no_graph_drew(tmp_path, tiny_model):
    """scripts/graph_sampling_check.py on the CPU: both runs eager, the ids agree, and the verdict does not
    claim the drawing graph was checked."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    res = subprocess.run([sys.executable, "scripts/graph_sampling_check.py", "--model", str(tiny_model), "--device",
                          "cpu", "--sizes", "1,3", "--out", str(tmp_path / "c.json")], cwd=repo, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 3, res.stderr
    assert "VERDICT: NOT RUN" in res.stdout and "ids agree" in res.stdout
    assert json.loads((tmp_path / "c.json").read_text())["verdict"] == "NOT RUN"
