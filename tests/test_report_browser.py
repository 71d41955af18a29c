"""report.html in a real browser: headless Chromium from Debian's packages, driven by Playwright (never
`playwright install`: no browser download), loads the page from file:// and every picture decodes.

Skips only where chromium is absent and this is not CI; .ci/run installs chromium, so on CI it always runs."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from .helpers import run_cli

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
IMAGES = "Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth}))"


def _chromium() -> str:
    on_ci = bool(os.environ.get("CI"))
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if on_ci:
            pytest.fail("chromium is not installed on CI; .ci/run installs it with apt-get install chromium")
        pytest.skip("chromium is not installed here (apt-get install -y chromium chromium-driver); CI installs it")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        if on_ci:
            pytest.fail("playwright is not installed on CI (it is in the test extra)")
        pytest.skip("the playwright package is not installed (pip install playwright; no `playwright install`)")
    return path


def _env(command: str, **fields) -> dict:
    return {"command": command, "argv": [], "versions": {}, "device": {"type": "cpu", "name": "X"}, "model": {},
            "git_head": "a" * 40, "git_dirty": False, "started_at": "2026-01-01T00:00:00Z",
            "evidence": "cpu-executed", **fields}


def _runs(root: Path, tiny_model: str, capsys) -> Path:
    """One real trace, and a logits check, a bench comparison and a load run with the fields their commands write."""
    runs = root / "runs"
    code, _, err = run_cli(["trace", "--case", "A", "--model", tiny_model, "--device", "cpu", "-q",
                            "--out", runs / "trace-A"], capsys)
    assert code == 0, err
    rows = [{"max_abs": 10.0 ** -(i % 5 + 3), "rel_l2": 10.0 ** -(i % 4 + 4), "status": "PASS"} for i in range(12)]
    (runs / "lc").mkdir()
    (runs / "lc" / "check.json").write_text(json.dumps(_env(
        "logits-check compare", verdict="PASS", suite="baseline", rows=rows,
        thresholds={"max_abs": 1e-2, "rel_l2": 1e-3},
        summary={"rows": 12, "top1_agree": 12, "worst_max_abs": {"value": 1e-3}, "worst_rel_l2": {"value": 1e-4}})))
    side = lambda xs: {"runs": [{"output_throughput": x} for x in xs]}  # noqa: E731
    (runs / "cmp.json").write_text(json.dumps(_env("bench compare", variable="eager", ratio=1.9,
                                                   a=side([100.0, 104.0, 98.0]), b=side([190.0, 195.0, 188.0]))))
    (runs / "bench-load-x.json").write_text(json.dumps(_env(
        "bench load", status="ok", config={"source": {"workload": {"name": "fixed"}, "rate": 4}},
        metrics={"requests": 20, "completed": 20, "output_throughput": 50.0, "ttft_ms": {"median": 40.0},
                 "tpot_ms": {"median": 9.0}})))
    (runs / "bench-load-x.requests.jsonl").write_text("".join(
        json.dumps({"id": i, "ttft_ms": 30.0 + i, "itl_ms": [8.0 + (i + j) % 5 for j in range(6)]}) + "\n"
        for i in range(20)))
    return runs


def test_report_html_opens_in_headless_chromium_with_every_image_loaded(tmp_path, tiny_model, capsys):
    executable = _chromium()
    runs = _runs(tmp_path, tiny_model, capsys)
    out = tmp_path / "report"
    code, _, err = run_cli(["report", "--runs", runs, "--out", out], capsys)
    assert code == 0, err
    from playwright.sync_api import sync_playwright

    broken = tmp_path / "broken.html"
    broken.write_text('<html><body><img alt="broken" src="data:image/png;base64,AAAA"></body></html>')
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=executable,
                                                       headless=True, args=FLAGS)
        try:
            page = context.new_page()
            page.goto((out / "report.html").as_uri(), wait_until="load")
            images = page.evaluate(IMAGES)
            title = page.title()
            # The same check on a page whose picture cannot decode must see it.
            page.goto(broken.as_uri(), wait_until="load")
            bad = page.evaluate(IMAGES)
        finally:
            context.close()
    assert title == "labkit evidence report"
    assert len(images) == 4, images    # trace, logits check, bench comparison, load run
    assert all(i["complete"] and i["width"] > 0 for i in images), images
    assert {i["alt"].split(" (")[0] for i in images} == {"trace A", "logits-check baseline",
                                                         "bench compare --variable eager", "bench load"}
    assert bad == [{"alt": "broken", "complete": True, "width": 0}]
