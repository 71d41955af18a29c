"""`labkit report` over a runs/ folder made by real commands (trace, logits-check, bench on CPU, tiny model):
every lab of the plan accounted for, UNREADABLE files, pictures, and `report verify` on changed archives."""
from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import stat
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from .helpers import run_cli

# What the real commands below produce; every other lab of the plan must be MISSING. (bench-offline names the nano
# workload: the fixed workload's runs below are not its result.)
PRODUCED = {"trace-chunk": "PASS", "logits-prefix": "PASS", "graph-vs-eager": "RECORDED", "principles-slots": "PASS"}


@pytest.fixture(scope="module")
def lab_runs(tmp_path_factory, tiny_model):
    """runs/ made by the real commands, once for this module."""
    runs = tmp_path_factory.mktemp("lab") / "runs"

    def cli(args):
        from labkit import cli as labkit_cli

        with pytest.raises(SystemExit) as done:
            labkit_cli.main([str(a) for a in args])
        assert done.value.code in (0, None), args

    tiny = ["--model", tiny_model, "--device", "cpu"]
    cli(["trace", "--case", "chunk", *tiny, "-q", "--out", runs / "trace-chunk"])
    cli(["logits-check", "run", "--suite", "prefix", *tiny, "--out", runs / "logits-prefix"])
    bench = ["bench", "--workload", "fixed", "--num-requests", "2", "--warmup", "0", "--repeats", "2", *tiny]
    cli([*bench, "--enforce-eager", "--out", runs / "bench-eager.json"])
    cli([*bench, "--no-enforce-eager", "--out", runs / "bench-graph.json"])
    cli(["bench", "compare", runs / "bench-eager.json", runs / "bench-graph.json", "--variable", "eager",
         "--out", runs / "compare-eager.json"])
    cli(["principles", "slots", "--out", runs / "principles" / "slots.json"])
    return runs


def _report(runs: Path, out: Path, capsys, *extra):
    code, stdout, err = run_cli(["report", "--runs", runs, "--out", out, *extra], capsys)
    return code, stdout, err


def _labs(out: Path) -> dict:
    manifest = json.loads((out / "manifest.json").read_text())
    return {lab["lab"]: lab for lab in manifest["labs"]}


def test_report_accounts_for_every_lab_of_the_plan(lab_runs, tmp_path, capsys):
    out = tmp_path / "report"
    code, _, err = _report(lab_runs, out, capsys, "--title", "test report")
    assert code == 0, err
    labs = _labs(out)
    produced = {k: v["verdict"] for k, v in labs.items() if v["verdict"] != "MISSING"}
    assert produced == PRODUCED
    assert len(labs) >= 30 and all("not run" in v["headline"] for k, v in labs.items() if k not in PRODUCED)
    chunk = labs["trace-chunk"]
    assert chunk["evidence"] == "cpu-executed" and chunk["evidence_needed"] == "gpu-measured"
    assert chunk["evidence_short"]
    assert re.fullmatch(r"[0-9a-f]{10}( \(dirty\))?", chunk["commit"]) and chunk["device"] != "-"
    md = (out / "report.md").read_text()
    assert md.startswith("# test report")
    assert re.search(r"\| trace-chunk \| PASS \| cpu-executed \(needs gpu-measured\) \| case chunk, 4 steps", md)
    assert re.search(r"\| logits-prefix \| PASS \| .*suite prefix: 6 rows", md)
    assert re.search(r"\| trace-A \| MISSING \| - \(needs gpu-measured\) \| not run", md)
    assert "| graph-vs-eager | RECORDED |" in md and "B/A" in md
    # Only CPU evidence for labs that need a GPU: the caveats say so.
    assert "need gpu-measured evidence but have only weaker results" in md and "no result was measured on a GPU" in md
    assert "`labkit trace --case A`" in md  # how to produce what is missing
    # The archive holds what verify needs: event logs, logits arrays, provenance; files are 0644 like the Markdown.
    manifest = json.loads((out / "manifest.json").read_text())
    files = {f["file"]: f for f in manifest["files"]}
    assert {"runs/trace-chunk/events.jsonl", "runs/logits-prefix/engine.npz", "runs/logits-prefix/hf-float32.npz",
            "provenance/engine.diff", "provenance/packages.txt", "report.html", "report.md"} <= set(files)
    f = files["runs/logits-prefix/check.json"]
    assert f["sha256"] == hashlib.sha256((lab_runs / "logits-prefix" / "check.json").read_bytes()).hexdigest()
    assert any(line.startswith("numpy==") for line in (out / "provenance" / "packages.txt").read_text().splitlines())
    assert isinstance(manifest["provenance"]["patches"], list)
    for p in (lab_runs / "trace-chunk" / "check.json", lab_runs / "bench-eager.json", out / "manifest.json",
              lab_runs / "logits-prefix" / "engine.npz"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == 5  # trace, logits check, bench comparison, 2 bench runs
    assert "<script" not in html and "http://" not in html and "https://" not in html


def test_report_json_prints_the_manifest(lab_runs, tmp_path, capsys):
    code, stdout, err = _report(lab_runs, tmp_path / "r", capsys, "--json")
    assert code == 0, err
    data = json.loads(stdout)
    assert data["command"] == "report" and {lab["lab"] for lab in data["labs"]} >= set(PRODUCED)


def test_unreadable_results_are_listed_with_their_reason_and_exit_1(lab_runs, tmp_path, capsys):
    runs = tmp_path / "runs"
    shutil.copytree(lab_runs / "trace-chunk", runs / "trace-chunk")
    whole = (lab_runs / "bench-eager.json").read_text()
    (runs / "bench-x.json").write_text(whole[: len(whole) // 2])
    (runs / "random.json").write_bytes(bytes(range(256)) * 4)
    (runs / "empty.json").write_text("")
    (runs / "list.json").write_text("[1, 2, 3]")
    (runs / "deep.json").write_text("[" * 200000 + "]" * 200000)
    (runs / "no-evidence.json").write_text(json.dumps({"command": "bench", "status": "ok"}))
    (runs / "perfetto.json").write_text(json.dumps({"traceEvents": []}))  # another tool's file: not a result
    code, _, err = _report(runs, tmp_path / "report", capsys)
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "UNREADABLE" in err
    md = (tmp_path / "report" / "report.md").read_text()
    section = md.split("## UNREADABLE", 1)[1].split("##", 1)[0]
    reasons = {
        "bench-x.json": "looks truncated", "random.json": "not UTF-8", "empty.json": "empty file",
        "list.json": "a JSON list", "deep.json": "nested too deeply", "no-evidence.json": "evidence None",
    }
    for name, why in reasons.items():
        assert re.search(rf"\| `{re.escape(name)}` \| [^\n]*{re.escape(why)}", section), (name, section)
    assert "perfetto.json" not in section and "`perfetto.json`" in md
    assert "| trace-chunk | PASS |" in md  # the readable result is still reported
    assert "could not be read" in md


def test_report_on_a_folder_of_no_result_says_so_and_writes_nothing(tmp_path, capsys):
    """No 41 MISSING lines and an archive of nothing: the folder holds no result, exit 2 (could not run)."""
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "sub" / "perfetto.json").write_text(json.dumps({"traceEvents": []}))  # not a result
    code, out, err = _report(tmp_path / "empty", tmp_path / "report", capsys)
    assert code == 2 and "holds no labkit result" in err and str(tmp_path / "empty") in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "report").exists() and "MISSING" not in out
    code, _, err = run_cli(["report", "--runs", tmp_path / "missing"], capsys)
    assert code == 2 and "not a folder" in err
    code, _, err = run_cli(["report", "--runs", tmp_path / "empty", "--out", tmp_path], capsys)
    assert code == 2 and "would hold the results" in err


def _copy_result(src: Path, dest: Path, **changes) -> Path:
    data = json.loads(src.read_text())
    data.update(changes)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(data))
    return dest


def test_a_lab_takes_the_result_of_the_workload_its_command_names(lab_runs, tmp_path, capsys):
    """Two engine benches in one folder, fixed (the newer) and nano: bench-offline (`bench --workload nano`) shows
    nano's; with only fixed's it is MISSING, never fixed's figure under the nano lab. An arrivals run under
    prefill_first is not load-policies' result (`bench load --workload fixed --rate 4`)."""
    runs = tmp_path / "runs"
    fixed = json.loads((lab_runs / "bench-eager.json").read_text())
    _copy_result(lab_runs / "bench-eager.json", runs / "bench-fixed-engine-eager.json",
                 started_at="2026-12-02T10:00:00.000Z")
    arrivals = {"command": "bench load", "evidence": "cpu-executed", "status": "ok",
                "started_at": "2026-12-02T09:00:00.000Z",
                "argv": ["labkit", "bench", "load", "--arrivals", "workloads/arrivals/short-and-long.jsonl"],
                "config": {"source": {"arrivals": "short-and-long.jsonl"},
                           "server": {"--scheduling-policy": "prefill_first"}},
                "metrics": {"requests": 4, "completed": 4}}
    (runs / "bench-load-short-and-long.json").write_text(json.dumps(arrivals))
    code, _, err = _report(runs, tmp_path / "r1", capsys)
    assert code == 0, err
    labs = _labs(tmp_path / "r1")
    assert labs["bench-offline"]["verdict"] == "MISSING" and labs["load-policies"]["results"][0]["file"] is None
    nano = _copy_result(lab_runs / "bench-eager.json", runs / "bench-nano-engine-eager.json",
                        started_at="2026-12-02T09:00:00.000Z", workload={**fixed["workload"], "name": "nano"},
                        argv=["labkit", "bench", "--workload", "nano", "--device", "cuda", "--repeats", "3"])
    code, _, err = _report(runs, tmp_path / "r2", capsys)
    assert code == 0, err
    lab = _labs(tmp_path / "r2")["bench-offline"]
    assert lab["results"][0]["file"] == nano.name and lab["headline"].startswith("nano via engine")
    assert lab["results"][0]["other_files"] == [] and lab["shown"] == ""  # its own command: nothing to explain


def test_a_lab_prefers_its_own_command_and_says_which_result_it_shows(lab_runs, tmp_path, capsys):
    """A try with another option (--max-num-batched-tokens 100, newer) is a record beside the lab's own run: the lab
    shows its
    own command's result, and names the other; with the try alone, it says the result is not its command."""
    runs = tmp_path / "runs"
    check = lab_runs / "trace-chunk" / "check.json"
    own = _copy_result(check, runs / "trace-chunk" / "check.json", started_at="2026-12-02T09:00:00.000Z",
                       argv=["labkit", "trace", "--case", "chunk"])
    _copy_result(check, runs / "trace-chunk-budget-100" / "check.json", started_at="2026-12-02T10:00:00.000Z",
                 argv=["/venv/bin/labkit", "trace", "--case", "chunk", "--max-num-batched-tokens", "100",
                       "--device", "cpu"],
                 verdict="CHANGED")
    code, out, err = _report(runs, tmp_path / "r1", capsys)
    assert code == 0, err
    lab = _labs(tmp_path / "r1")["trace-chunk"]
    assert lab["verdict"] == "PASS" and lab["results"][0]["file"] == "trace-chunk/check.json"
    assert lab["results"][0]["other_files"] == ["trace-chunk-budget-100/check.json"]
    assert "trace-chunk-budget-100/check.json CHANGED" in lab["shown"]
    assert "nearest to the lab's command" in lab["shown"]
    assert "trace-chunk-budget-100/check.json" in (tmp_path / "r1" / "report.md").read_text()
    own.unlink()
    code, out, err = _report(runs, tmp_path / "r2", capsys)
    lab = _labs(tmp_path / "r2")["trace-chunk"]
    assert lab["verdict"] == "CHANGED" and "not the lab's command (--max-num-batched-tokens 100)" in lab["shown"]
    assert "not the lab's command (--max-num-batched-tokens 100)" in " ".join(out.split())


def test_report_without_matplotlib_still_writes_the_markdown(lab_runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    code, _, err = _report(lab_runs, tmp_path / "report", capsys)
    assert code == 0, err
    md = (tmp_path / "report" / "report.md").read_text()
    assert "No pictures: matplotlib is not available" in md and "| trace-chunk | PASS |" in md
    html = (tmp_path / "report" / "report.html").read_text()
    assert "matplotlib is not available" in html and "<img" not in html


# --- report verify -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def archive(lab_runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("archive")
    from labkit import cli as labkit_cli

    with pytest.raises(SystemExit) as done:
        labkit_cli.main(["report", "--runs", str(lab_runs), "--out", str(out)])
    assert done.value.code in (0, None)
    return out / "evidence.tar.gz"


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _rewrite(src: Path, dest: Path, changes: dict[str, bytes], update_manifest: bool) -> Path:
    """A copy of the archive with some members replaced (and the manifest's sha256 made to agree)."""
    members = _members(src)
    members.update({f"evidence/{k}": v for k, v in changes.items()})
    if update_manifest:
        manifest = json.loads(members["evidence/manifest.json"])
        for entry in manifest["files"]:
            if entry["file"] in changes:
                entry["sha256"] = hashlib.sha256(changes[entry["file"]]).hexdigest()
                entry["bytes"] = len(changes[entry["file"]])
        members["evidence/manifest.json"] = json.dumps(manifest).encode()
    with tarfile.open(dest, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return dest


def test_the_archive_is_packed_at_deflates_fastest_level(archive):
    """A whole plan's logits arrays are gigabytes: at gzip's default level (9) the H200's report was still packing
    them after 300 s (session 13). The gzip header's XFL byte says the level: 4 = fastest, 2 = best."""
    assert archive.read_bytes()[:2] == b"\x1f\x8b" and archive.read_bytes()[8] == 4


def test_verify_passes_on_the_archive_as_written(archive, capsys):
    code, out, err = run_cli(["report", "verify", str(archive)], capsys)
    assert code == 0, err
    flat = " ".join(out.split())
    assert "1 trace log(s) re-validated" in flat and "1 logits check(s) re-judged" in flat and "PASS" in flat


def test_verify_names_a_file_with_one_byte_changed(archive, tmp_path, capsys):
    name = "runs/logits-prefix/check.md"
    data = bytearray(_members(archive)[f"evidence/{name}"])
    data[10] ^= 0x01
    bad = _rewrite(archive, tmp_path / "bad.tar.gz", {name: bytes(data)}, update_manifest=False)
    code, _, err = run_cli(["report", "verify", str(bad)], capsys)
    assert code == 1 and f"{name} differs: sha256" in err and len(err.strip().splitlines()) == 1
    raw = bytearray(archive.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # a byte of the compressed archive itself
    (tmp_path / "raw.tar.gz").write_bytes(bytes(raw))
    code, _, err = run_cli(["report", "verify", str(tmp_path / "raw.tar.gz")], capsys)
    assert code == 1 and " differs: " in err  # the gzip stream, or the member the flipped byte landed in
    code, _, err = run_cli(["report", "verify", str(tmp_path / "none.tar.gz")], capsys)
    assert code == 2 and "no such archive" in err


def test_verify_revalidates_an_edited_event_log_against_its_case(archive, tmp_path, capsys):
    name = "runs/trace-chunk/events.jsonl"
    lines = _members(archive)[f"evidence/{name}"].decode().splitlines()
    edited = []
    for line in lines:
        e = json.loads(line)
        if e["event"] == "scheduled" and e["step"] == 1:
            e["seqs"][0]["num_scheduled_tokens"] = 511   # the case expects 512
        edited.append(json.dumps(e))
    # The manifest agrees with the edit, so only re-validating the log can notice it.
    bad = _rewrite(archive, tmp_path / "bad.tar.gz", {name: ("\n".join(edited) + "\n").encode()}, update_manifest=True)
    code, _, err = run_cli(["report", "verify", str(bad)], capsys)
    assert code == 1 and f"{name} differs: re-validated against case chunk: FAIL, its check.json says PASS" in err


def test_verify_rejudges_a_logits_check_from_its_arrays(archive, tmp_path, capsys):
    name = "runs/logits-prefix/engine.npz"
    with np.load(io.BytesIO(_members(archive)[f"evidence/{name}"])) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["logits"] = arrays["logits"].copy()
    arrays["logits"][2] += 1.0   # one row off by far more than the gate
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    bad = _rewrite(archive, tmp_path / "bad.tar.gz", {name: buf.getvalue()}, update_manifest=True)
    code, _, err = run_cli(["report", "verify", str(bad)], capsys)
    assert code == 1
    assert "runs/logits-prefix/check.json differs: re-judged from its arrays: FAIL, the file says PASS" in err



def _edited_json(archive: Path, name: str, edit) -> bytes:
    d = json.loads(_members(archive)[f"evidence/{name}"])
    edit(d)
    return json.dumps(d).encode()


def test_verify_notices_a_check_file_that_claims_worse_than_its_log(archive, tmp_path, capsys):
    """Re-validation compares both ways: a check.json that says FAIL over a log that passes differs too."""
    name = "runs/trace-chunk/check.json"
    data = _edited_json(archive, name, lambda d: d.update(verdict="FAIL"))
    bad = _rewrite(archive, tmp_path / "bad.tar.gz", {name: data}, update_manifest=True)
    code, _, err = run_cli(["report", "verify", str(bad)], capsys)
    assert code == 1 and "re-validated against case chunk: PASS, its check.json says FAIL" in err, err


def test_verify_rejudges_each_rows_status_and_the_figures_to_nine_digits(archive, tmp_path, capsys):
    """A logits check.json whose verdict stands but one row's status, or its worst rel-L2 in the fifth digit, was
    edited is not what its arrays give."""
    name = "runs/logits-prefix/check.json"

    def one_row(d):
        row = next(r for r in d["rows"] if (r.get("verdict") or r.get("status")) == "PASS")
        row["status" if "status" in row else "verdict"] = "REVIEW"

    bad = _rewrite(archive, tmp_path / "rows.tar.gz", {name: _edited_json(archive, name, one_row)},
                   update_manifest=True)
    code, _, err = run_cli(["report", "verify", str(bad)], capsys)
    assert code == 1 and "row statuses differ from the file's" in err, err

    def figure(d):
        d["summary"]["worst_rel_l2"]["value"] *= 1 + 1e-5

    bad = _rewrite(archive, tmp_path / "fig.tar.gz", {name: _edited_json(archive, name, figure)}, update_manifest=True)
    code, _, err = run_cli(["report", "verify", str(bad)], capsys)
    assert code == 1 and "worst_rel_l2" in err, err

# Every rule of `report verify`, each against an archive that breaks only that rule (issue 23: a verifier that
# accepted an archive missing a listed file used to pass every test).
def _tar(dest: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(dest, "w:gz") as tar:
        for info, data in members:
            if info.isfile():
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return dest


def _file(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def _as_written(archive: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    return [(_file(name), data) for name, data in _members(archive).items()]


def _with_manifest(members, edit) -> list[tuple[tarfile.TarInfo, bytes]]:
    """The members with the manifest edited by `edit(manifest)`."""
    out = []
    for info, data in members:
        if info.name == "evidence/manifest.json":
            manifest = json.loads(data)
            edit(manifest)
            data = json.dumps(manifest).encode()
        out.append((info, data))
    return out


def _verify(path: Path, capsys) -> tuple[int, str, str]:
    code, out, err = run_cli(["report", "verify", str(path)], capsys)
    return code, " ".join(out.split()), err


def test_verify_fails_an_archive_missing_a_file_its_manifest_lists(archive, tmp_path, capsys):
    name = "runs/bench-eager.json"
    members = [(i, d) for i, d in _as_written(archive) if i.name != f"evidence/{name}"]
    code, _, err = _verify(_tar(tmp_path / "bad.tar.gz", members), capsys)
    assert code == 1 and f"{name} differs: listed in the manifest but missing from the archive" in err


def test_verify_fails_an_archive_with_a_file_its_manifest_does_not_list(archive, tmp_path, capsys):
    members = _as_written(archive) + [(_file("evidence/runs/extra.json"), b"{}")]
    code, _, err = _verify(_tar(tmp_path / "bad.tar.gz", members), capsys)
    assert code == 1 and "runs/extra.json differs: in the archive but not in the manifest" in err


def test_verify_fails_a_size_the_manifest_misstates(archive, tmp_path, capsys):
    def edit(manifest):
        entry = next(e for e in manifest["files"] if e["file"] == "runs/bench-eager.json")
        entry["bytes"] += 1

    code, _, err = _verify(_tar(tmp_path / "bad.tar.gz", _with_manifest(_as_written(archive), edit)), capsys)
    assert code == 1 and "runs/bench-eager.json differs: " in err and "bytes, the manifest says" in err



def test_verify_fails_a_manifest_that_lists_a_file_twice(archive, tmp_path, capsys):
    def edit(manifest):
        manifest["files"].append(dict(next(e for e in manifest["files"] if e["file"] == "runs/bench-eager.json")))

    code, _, err = _verify(_tar(tmp_path / "bad.tar.gz", _with_manifest(_as_written(archive), edit)), capsys)
    assert code == 1 and "runs/bench-eager.json differs: listed in the manifest more than once" in err, err

@pytest.mark.parametrize("how", ["absolute", "dotdot"])
def test_verify_never_reads_a_manifest_name_from_its_own_disk(archive, tmp_path, capsys, how):
    """Issue 22: {"file": "/etc/hostname", "sha256": <its hash>} passed, and a wrong hash printed the local
    file's first 16 hex digits."""
    local = tmp_path / "local-secret.txt"
    local.write_bytes(b"only on the verifier's machine\n")
    digest = hashlib.sha256(local.read_bytes()).hexdigest()
    name = str(local) if how == "absolute" else "../" * 40 + str(local).lstrip("/")

    def edit(manifest):
        manifest["files"].append({"file": name, "bytes": local.stat().st_size, "sha256": digest})
        manifest["files"].append({"file": str(local), "bytes": 1, "sha256": "0" * 64})  # a wrong hash too

    code, out, err = _verify(_tar(tmp_path / "bad.tar.gz", _with_manifest(_as_written(archive), edit)), capsys)
    assert code == 1 and "manifest.json differs: names" in err and "not a relative path inside" in err
    assert digest[:16] not in out + err


@pytest.mark.parametrize("name", ["/abs/outside.txt", "other/outside.txt", "evidence/../outside.txt",
                                  "evidence/runs/../../outside.txt"])
def test_verify_fails_members_outside_the_evidence_folder(archive, tmp_path, capsys, name):
    members = _as_written(archive) + [(_file(name), b"not evidence")]
    code, out, _ = _verify(_tar(tmp_path / "bad.tar.gz", members), capsys)
    assert code == 1 and f"{name}: a member outside evidence/" in out
    assert not (tmp_path / "outside.txt").exists()


def test_verify_fails_links_and_names_given_twice(archive, tmp_path, capsys):
    link = _file("evidence/runs/link.json")
    link.type, link.linkname = tarfile.SYMTYPE, "bench-eager.json"
    twice = next((i, d) for i, d in _as_written(archive) if i.name == "evidence/runs/bench-eager.json")
    code, out, _ = _verify(_tar(tmp_path / "bad.tar.gz", _as_written(archive) + [(link, b""), twice]), capsys)
    assert code == 1 and "runs/link.json: a symbolic link: only regular files are evidence" in out
    assert "runs/bench-eager.json: in the archive more than once" in out


def test_verify_stops_at_a_member_larger_than_its_cap_before_reading_it(archive, tmp_path, capsys):
    """Issue 22: a 2 GiB member was extracted whole. This one only declares 5 GiB in its header (its data is
    a few bytes): the cap is judged from the header, so nothing past it is read."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in _as_written(archive):
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        members_end = tar.offset  # where the end-of-archive blocks begin
    big = _file("evidence/runs/big.bin")
    big.size = 5 << 30  # past the 4 GiB cap
    plain = tmp_path / "big.tar"
    plain.write_bytes(buf.getvalue()[:members_end] + big.tobuf(format=tarfile.GNU_FORMAT) + b"x" * 512)
    code, _, err = _verify(plain, capsys)
    assert code == 1 and "the verifier's cap; evidence/runs/big.bin alone declares 5368709120" in err


def test_verify_caps_the_number_of_members(archive, tmp_path):
    from labkit.report.verify import verify

    n = len(_members(archive))
    assert not verify(archive, max_members=n).problems
    problems = verify(archive, max_members=n - 1).problems
    assert problems == [(archive.name, f"more than {n - 1} members (the verifier's cap): not a `labkit report` "
                                       "archive")]


def test_verify_says_a_manifest_it_cannot_parse_differs(archive, tmp_path, capsys):
    """Issue 22: a 5000-digit integer (past Python's int-parsing limit) made verify exit 2, as if it could not
    run, instead of failing the archive."""
    members = [(i, d) if i.name != "evidence/manifest.json" else (i, d.replace(b'"files"', b'"n": 1' + b"0" * 5000
                                                                                + b', "files"', 1))
               for i, d in _as_written(archive)]
    code, _, err = _verify(_tar(tmp_path / "bad.tar.gz", members), capsys)
    assert code == 1 and "manifest.json differs: cannot read it" in err and "an integer of 5001 digits" in err


def test_verify_revalidates_only_against_the_projects_own_cases(archive, tmp_path, capsys):
    name = "runs/trace-chunk/check.json"
    check = json.loads(_members(archive)[f"evidence/{name}"])
    check["case"] = str(tmp_path / "case.yaml")  # a path: it would be read from the verifier's disk
    bad = _rewrite(archive, tmp_path / "bad.tar.gz", {name: json.dumps(check).encode()}, update_manifest=True)
    code, _, err = _verify(bad, capsys)
    assert code == 1 and "is not one of this project's cases (workloads/cases/): cannot re-validate" in err


def test_the_plan_names_every_lab_of_the_seeds_with_commands_that_exist():
    import typer.main

    from labkit import cli, principles
    from labkit.errors import LabkitError
    from labkit.report.plan import load_plan, parse
    from labkit.trace.cases import list_cases

    labs = load_plan()
    ids = {lab.id for lab in labs}
    assert {f"trace-{c}" for c in list_cases()} | {f"principles-{n}" for n in principles.LABS} <= ids
    assert {"environment", "runner-shapes", "logits-baseline", "logits-graph", "logits-prefix", "logits-kv",
            "logits-tp",
            "graph-vs-eager", "bench-offline", "bench-hf", "load-policies", "tp-shapes", "replicas-vs-tp",
            "service-lifecycle"} <= ids
    commands = set(typer.main.get_command(cli.app).commands)
    written = {"trace", "logits-check compare", "bench", "bench compare", "bench load", "shapes", "smoke", "doctor",
               "serve lifecycle"}
    written |= {f"principles {n}" for n in principles.LABS}
    for lab in labs:
        for line in lab.command.splitlines():
            words = line.split()
            assert words[0] == "labkit" and words[1] in commands, (lab.id, line)
        for slot in lab.slots:
            assert slot.match.get("command") in written or lab.producer, (lab.id, slot.match)
    with pytest.raises(LabkitError, match="lab x: `title` must be a non-empty string"):
        parse({"labs": [{"id": "x", "evidence": "cpu-executed", "command": "labkit trace",
                         "results": [{"file": "*"}]}]},
              "plan")
    with pytest.raises(LabkitError, match="evidence must be one of"):
        parse({"labs": [{"id": "x", "title": "t", "evidence": "vibes", "command": "c", "results": [{"file": "*"}]}]},
              "plan")


def test_json_flag_prints_the_result_of_every_command_that_prints_one(lab_runs, tiny_model, tmp_path, capsys):
    def as_json(args):
        code, out, err = run_cli([*args, "--json"], capsys)
        assert code == 0, (args, err)
        return json.loads(out)  # stdout holds the JSON alone

    tiny = ["--model", tiny_model, "--device", "cpu"]
    assert as_json(["trace", "--case", "A", *tiny, "--out", tmp_path / "trace-A"])["case"] == "A"
    replay = as_json(["trace", "check", str(lab_runs / "trace-chunk" / "events.jsonl"), "--case", "chunk",
                      "--out", tmp_path / "replay.json"])
    assert replay["command"] == "trace check" and replay["passed"] is True
    bench = as_json(["bench", "--workload", "fixed", "--num-requests", "1", "--warmup", "0", "--repeats", "1", *tiny,
                     "--out", tmp_path / "b.json"])
    assert bench["command"] == "bench" and len(bench["runs"]) == 1
    cmp = as_json(["bench", "compare", str(lab_runs / "bench-eager.json"), str(lab_runs / "bench-graph.json"),
                   "--variable", "eager", "--out", tmp_path / "c.json"])
    assert cmp["command"] == "bench compare" and cmp["variable"] == "eager"
    shapes = as_json(["shapes", "--tensor-parallel-size", "2", "--preset", "qwen3-0.6b", "--out", tmp_path / "s.json"])
    assert shapes["verdict"] == "RECORDED" and shapes["table"]["heads"]["q"]["rank"] == 8
    if shutil.which("git"):
        patches = as_json(["patch", "list"])
        assert patches and {"name", "kind", "state"} <= set(patches[0])


def test_the_terminal_report_gives_each_missing_labs_commands_to_paste(tmp_path, capsys, monkeypatch):
    """At 80 columns, under each lab MISSING a result, its commands one per line as a shell reads them (a long
    one continued with a backslash), `labkit serve` never joined to its client; the doctor's counts as words."""
    from labkit.report.plan import load_plan
    from labkit.report.render import command_lines

    runs = tmp_path / "runs"
    assert run_cli(["principles", "slots", "--out", runs / "principles" / "slots.json"], capsys)[0] == 0
    doctor = {"command": "doctor", "evidence": "cpu-executed", "status": "PASS",
              "counts": {"PASS": 9, "WARN": 2, "FAIL": 0}}
    (runs / "doctor.json").write_text(json.dumps(doctor))
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = _report(runs, tmp_path / "report", capsys)
    assert code == 0, err
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "doctor: PASS 9, WARN 2, FAIL 0" in out
    assert "{'PASS'" not in out + (tmp_path / "report" / "report.md").read_text()
    shown, current = [], None
    for line in out.splitlines():
        text = line[7:] if line.startswith(("  run: ", " " * 7)) and line.strip() else None
        if text is None or text.startswith("#"):
            current = None
            continue
        current = (current[:-1].rstrip() + " " + text.strip()) if current and current.endswith("\\") else text.strip()
        if not current.endswith("\\"):
            shown.append(current)
    wanted = [" ".join(line.partition("#")[0].split()) for lab in load_plan() if lab.id != "principles-slots"
              for line in command_lines(lab.command)]
    assert [" ".join(s.split()) for s in shown] == wanted
    # (live-invariants' server, since service-lifecycle's `labkit serve` + client became `labkit serve lifecycle`)
    serve = "labkit serve --policy mixed --live-trace --step-stream"
    assert serve in wanted and not any(f"{serve};" in s or "; labkit" in s for s in shown)
    assert "# a terminal of its own; URL_SERVER: where it listens" in " ".join(out.split())
    assert "labkit serve lifecycle --out runs/serve-lifecycle.json" in wanted


def test_a_placeholder_in_a_labs_line_stands_for_the_value_the_run_gave():
    """live-invariants' `trace --url URL_SERVER` run by scripts/run_lab_plan.py as `--url http://127.0.0.1:P` is
    the lab's own command (issue 35); its other options still count."""
    from labkit.report.command_line import differences, parse

    lab = parse(["trace", "--url", "URL_SERVER", "--seconds", "10", "--out", "runs/trace-live-mixed"])
    assert differences(lab, parse(["trace", "--url", "http://127.0.0.1:5", "--seconds", "10", "--out", "/r/t"])) == []
    other = parse(["trace", "--url", "http://127.0.0.1:5", "--seconds", "5"])
    assert differences(lab, other) == ["--seconds 5 instead of 10"]
    assert differences(lab, parse(["trace", "--seconds", "10"])) == ["without --url URL_SERVER"]


def test_a_large_folder_is_packed_under_a_progress_bar_that_counts_every_byte(lab_runs, tmp_path, capsys,
                                                                             monkeypatch):
    """Packing a plan's gigabytes takes a minute: the report shows a bar on stderr, advanced by every file's bytes
    (a small folder packs without one: the threshold is lowered here to take that path)."""
    from labkit.report import archive as arch, command as report_command

    advanced, real = [], arch.write_archive

    def spy(archive, pairs, advance=None):
        def count(n):
            advanced.append(n)
            advance(n)
        real(archive, pairs, advance=count if advance else None)
        return sum(p.stat().st_size for p, _ in pairs)

    monkeypatch.setattr(arch, "write_archive", spy)
    monkeypatch.setattr(report_command, "PROGRESS_BYTES", 1)
    code, _, err = _report(lab_runs, tmp_path / "r", capsys)
    assert code == 0, err
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    listed = sum(f["bytes"] for f in manifest["files"]) + (tmp_path / "r" / "manifest.json").stat().st_size
    assert advanced and sum(advanced) == listed
    assert tarfile.open(tmp_path / "r" / "evidence.tar.gz").getmembers()
