"""The report's lab views (labkit/report/views.py), on results of the right shape written into a runs folder:
fp8-kv shows the tok/s ratio with its interval beside the logits verdict and FP8's cost, and draws tok/s against
the distance to the truth; batch1-kernels shows ms a token, kernels a token and the idle share before and after,
and draws one layer's kernels in time. The words follow the results (a FAIL, a ratio within noise, a missing
result, CPU evidence); the plan refuses a view its slots cannot feed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.bench import compare as cmp
from labkit.errors import LabkitError
from labkit.report.plan import parse

from .helpers import run_cli
from .test_bench_compare import _synthetic

ENVELOPE = {"argv": ["labkit"], "status": "ok", "git_head": "0123456789abcdef", "git_dirty": False,
            "started_at": "2026-12-03T10:00:00.000Z", "ended_at": "2026-12-03T10:01:00.000Z"}


def _write(runs: Path, name: str, data: dict) -> Path:
    path = runs / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**ENVELOPE, **data}))
    return path


def _bench(tok_s: list[float], evidence: str = "gpu-measured", **engine) -> dict:
    d = _synthetic(tok_s, **{"enforce_eager": False, "kv_cache_dtype": "auto", **engine})
    d["evidence"], d["backend"] = evidence, "engine"
    return d


def _compare(a: dict, b: dict, variable: str) -> dict:
    res = cmp.compare(a, b, variable)
    return {"command": "bench compare", "evidence": cmp.weakest_evidence(a, b), "device": a["device"],
            **res, "a": cmp.side(a, "a.json"), "b": cmp.side(b, "b.json")}


def _logits(verdict: str = "PASS", ratio: float = 4.24, reference_ratio: float = 3.5) -> dict:
    rows = [{"index": i, "request_id": "long", "output_index": i, "status": "PASS", "max_abs": 1.0, "rel_l2": 0.1,
             "to_truth": {"lhs": {"ratio": 1.0 + i / 10, "status": "PASS"}}} for i in range(4)]
    return {"command": "logits-check compare", "evidence": "gpu-measured", "device": {"type": "cuda"},
            "suite": "fp8-kv", "verdict": verdict, "what_this_shows": f"(the check's words for {verdict})",
            "gate": {"rule": "anchored", "row_factor": 2.5, "row_fail_factor": 5.0, "judged": ["lhs"]},
            "summary": {"rows": 4, "review": 0, "failed": 0 if verdict == "PASS" else 2, "top1_agree": 4,
                        "worst_max_abs": {"value": 1.0}, "worst_rel_l2": {"value": 0.1}},
            "rows": rows,
            "kv_cost": {"ratio": ratio, "reference_ratio": reference_ratio,
                        "rel_l2": {"fp8": 0.181, "baseline": 0.181 / ratio, "reference_fp8": 0.183,
                                   "reference_plain": 0.0522},
                        "text": f"FP8 KV puts the engine {ratio:.2f}x as far from the float32 truth as its "
                                f"model-dtype pool (pooled rel-L2; Transformers: {reference_ratio:.2f}x)",
                        "baseline": {"verdict": "PASS"}, "quantised": {"status": "PASS"}}}


def _fp8_runs(runs: Path, *, a=(26000.0, 26100.0, 26200.0), b=(36000.0, 36200.0, 36400.0), logits=None,
              evidence="gpu-measured", compare=True) -> None:
    da, db = _bench(list(a), evidence), _bench(list(b), evidence, kv_cache_dtype="fp8")
    db["kv_blocks"] = 2000
    _write(runs, "bench-nano-kv-auto.json", da)
    _write(runs, "bench-nano-kv-fp8.json", db)
    if compare:
        _write(runs, "bench-compare-kv_cache_dtype.json", _compare(da, db, "kv_cache_dtype"))
    _write(runs, "logits-fp8-kv/check.json", logits if logits is not None else _logits())


def _report(runs: Path, out: Path, capsys) -> tuple[dict, str, str]:
    code, stdout, err = run_cli(["report", "--runs", str(runs), "--out", str(out)], capsys)
    assert code == 0, err
    labs = {x["lab"]: x for x in json.loads((out / "manifest.json").read_text())["labs"]}
    return labs, (out / "report.md").read_text(), (out / "report.html").read_text()


def _section(md: str, lab: str) -> str:
    start = md.index(f"## {lab}: ")
    end = md.find("\n## ", start + 3)
    return md[start:end if end > 0 else None]


def test_fp8_kv_section_shows_the_speed_ratio_beside_the_logits_verdict(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    runs = tmp_path / "runs"
    _fp8_runs(runs)
    labs, md, page = _report(runs, tmp_path / "report", capsys)
    lab = labs["fp8-kv"]
    assert lab["verdict"] == "RECORDED" and [r["file"] for r in lab["results"]] == [
        "bench-nano-kv-auto.json", "bench-nano-kv-fp8.json", "bench-compare-kv_cache_dtype.json",
        "logits-fp8-kv/check.json"]
    head = lab["headline"]
    assert head.startswith("tok/s B/A 1.387x (95% interval") and "logits PASS: 4.24x the model-dtype distance" in head
    assert "(Transformers 3.50x)" in head
    sec = _section(md, "fp8-kv")
    assert f"**{head}**" in sec
    assert "| output tok/s, median (min - max) | 26,100 (26,000 - 26,200, n 3) | 36,200 (36,000 - 36,400, n 3) |" in sec
    assert "| kv_cache_dtype | auto | fp8 |" in sec and "| KV blocks | 1,000 | 2,000 |" in sec
    assert "| pooled rel-L2 to the float32 truth | 0.0427 | 0.181 |" in sec
    assert "Not run yet" not in sec and "CPU executions" not in sec
    assert 'alt="tok/s against the distance to the float32 truth, A and B"' in page
    assert "<h2>fp8-kv: An FP8 KV cache - tok/s bought against logits distance paid</h2>" in page


def test_fp8_kv_words_follow_a_failing_check_noise_and_missing_results(tmp_path, capsys):
    runs = tmp_path / "runs"
    _fp8_runs(runs, b=(25900.0, 26150.0, 26300.0), logits=_logits("FAIL", ratio=9.0), compare=True)
    labs, md, _ = _report(runs, tmp_path / "report", capsys)
    lab = labs["fp8-kv"]
    assert lab["verdict"] == "FAIL"
    assert "tok/s B/A within noise" in lab["headline"] and "logits FAIL: 9.00x" in lab["headline"]
    assert "What the check says: (the check's words for FAIL)" in _section(md, "fp8-kv")
    # Without the comparison: said, not guessed.
    runs2 = tmp_path / "runs2"
    _fp8_runs(runs2, compare=False, evidence="cpu-executed")
    labs, md, page = _report(runs2, tmp_path / "report2", capsys)
    assert labs["fp8-kv"]["verdict"] == "MISSING" and "tok/s B/A: not compared" in labs["fp8-kv"]["headline"]
    sec = _section(md, "fp8-kv")
    assert "Not run yet: compare" in sec and "The tok/s are CPU executions" in sec


def _profiled(ms: float, kernels: float, idle: float, layer: list[tuple[str, str, float, float]], **engine) -> dict:
    d = _synthetic([700.0, 701.0, 702.0], enforce_eager=False, **engine)
    d["backend"] = "engine"
    d["config"]["workload"] = {"name": "batch1", "requests": 1, "seed": 0, "timing": "steps"}
    for i, r in enumerate(d["runs"]):
        r["decode_ms_per_token"] = ms * (1 + (i - 1) / 100)
    d["median"]["decode_ms_per_token"] = ms
    span = max(s + t for _, _, s, t in layer)
    busy = sum(t for *_, t in layer)
    d["profile"] = {"kernels_per_decode_token": kernels, "decode_gpu_idle_pct": idle, "gpu_idle_pct": idle,
                    "layer_timeline": {"found": True, "step": 17, "period": len(layer), "repeats": 27,
                                       "span_us": span, "busy_us": busy, "gap_us": span - busy,
                                       "kernels": [{"name": n, "family": f, "start_us": s, "dur_us": t}
                                                   for n, f, s, t in layer]}}
    return d


UNFUSED = [("_rms_norm_kernel", "norm_rope_act", 0.0, 2.0), ("_small_gemm_kernel", "gemm", 3.0, 8.0),
           ("_qk_norm_rope_kernel", "norm_rope_act", 12.0, 2.0), ("_store_kv_kernel", "kv_write", 15.0, 1.5),
           ("_decode_split_kernel", "attention_decode", 17.5, 5.0), ("_small_gemm_kernel", "gemm", 24.0, 6.0)]
FUSED = [("_norm_qkv_kernel", "gemm", 0.0, 9.0), ("_rope_store_kernel", "norm_rope_act", 9.2, 2.0),
         ("_decode_split_kernel", "attention_decode", 11.4, 5.0), ("_oproj_add_norm_kernel", "gemm", 16.6, 6.0)]


def test_batch1_kernels_section_and_its_layer_timeline(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    runs = tmp_path / "runs"
    before = _profiled(1.0, 353.0, 13.0, UNFUSED, fused_decode=False)
    after = _profiled(0.5, 160.0, 4.0, FUSED, fused_decode=True)
    for d in (before, after):  # decode ms/token is the comparison's headline at batch 1
        for r in d["runs"]:
            r["output_throughput"] = 1000 / r["decode_ms_per_token"]
    _write(runs, "bench-batch1-unfused.json", before)
    _write(runs, "bench-batch1-fused.json", after)
    _write(runs, "bench-compare-fused_decode.json", _compare(before, after, "fused_decode"))
    labs, md, page = _report(runs, tmp_path / "report", capsys)
    lab = labs["batch1-kernels"]
    assert lab["verdict"] == "RECORDED"
    assert lab["headline"].startswith("decode ms/token 1.000 -> 0.500 (B/A 0.500x (95% interval")
    assert "kernels a token 353 -> 160; GPU idle 13.0% -> 4.0%" in lab["headline"]
    sec = _section(md, "batch1-kernels")
    assert "| fused_decode | False | True |" in sec
    assert "| kernels per decode token (profiled) | 353.0 | 160.0 |" in sec
    assert "| one decoder layer | 6 kernels, 30.0 us, gaps 5.5 us | 4 kernels, 22.6 us, gaps 0.6 us |" in sec
    assert 'alt="one decoder layer&#x27;s kernels in time, before and after"' in page
    from labkit.report import figures

    fig = figures.layer_timelines_figure([("before", before["profile"]["layer_timeline"]),
                                          ("after", after["profile"]["layer_timeline"])], "t")
    axes = fig.axes[:2]
    assert [len(ax.collections) for ax in axes] == [len(UNFUSED), len(FUSED)]   # a bar a kernel
    assert axes[0].get_xlim() == axes[1].get_xlim()                               # one time axis
    bars = [c.get_paths()[0].get_extents() for c in axes[0].collections]
    assert [round(b.x0, 2) for b in bars] == [s for *_, s, _ in UNFUSED]          # at their starts


def test_batch1_without_a_gpu_profile_says_why_there_is_no_picture(tmp_path, capsys):
    runs = tmp_path / "runs"
    before = _synthetic([700.0, 701.0, 702.0], fused_decode=False)
    before["backend"] = "engine"
    before["config"]["workload"] = {"name": "batch1"}
    before["evidence"] = "cpu-executed"
    before["profile"] = {"kernels_per_decode_token": None, "layer_timeline": None,
                         "gpu_note": "CPU run: no CUDA activity was recorded; the GPU parts are n/a."}
    _write(runs, "bench-batch1-unfused.json", before)
    labs, md, page = _report(runs, tmp_path / "report", capsys)
    sec = _section(md, "batch1-kernels")
    assert labs["batch1-kernels"]["verdict"] == "MISSING"
    assert "Not run yet: after, compare" in sec and "before: CPU run: no CUDA activity" in sec
    assert labs["batch1-kernels"]["headline"].endswith("kernels a token and GPU idle: no GPU profile")
    assert "no picture (needs a GPU profile" in page or "no picture (pictures" in page


def test_the_plan_refuses_a_view_its_results_cannot_feed():
    lab = {"id": "x", "title": "t", "evidence": "cpu-executed", "command": "labkit bench",
           "results": [{"label": "A", "match": {"command": "bench"}}]}
    with pytest.raises(LabkitError, match="view must be one of"):
        parse({"labs": [{**lab, "view": "nope"}]}, "plan")
    with pytest.raises(LabkitError, match="none is labelled B, compare, logits"):
        parse({"labs": [{**lab, "view": "speed-and-numbers"}]}, "plan")
