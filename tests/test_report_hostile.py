"""`labkit report` and `labkit report verify` against hostile results and archives (issue 35, item 15): one
result holding an integer past what can be shown is UNREADABLE and the rest is reported; a manifest name no
file system takes, and GNU long-name or PAX headers that declare hundreds of MiB, are differences found at
once and in bounded memory (checked in a process under an address-space limit); the timeline picture's cost
is bounded whatever the log's length."""
from __future__ import annotations

import gzip
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from labkit.report import figures

from .helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
AS_LIMIT = 1 << 30  # the verifier (no torch) in 1 GiB of address space; a 256 MiB header read whole needs more


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model):
    runs = tmp_path_factory.mktemp("hostile-report") / "runs"
    from labkit import cli as labkit_cli

    with pytest.raises(SystemExit) as done:
        labkit_cli.main(["trace", "--case", "chunk", "--model", tiny_model, "--device", "cpu", "-q",
                         "--out", str(runs / "trace-chunk")])
    assert done.value.code in (0, None)
    return runs


@pytest.fixture(scope="module")
def archive(runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile-archive")
    from labkit import cli as labkit_cli

    with pytest.raises(SystemExit) as done:
        labkit_cli.main(["report", "--runs", str(runs), "--out", str(out)])
    assert done.value.code in (0, None)
    return out / "evidence.tar.gz"


def _envelope(runs: Path) -> dict:
    d = json.loads((runs / "trace-chunk" / "check.json").read_text())
    return {k: d[k] for k in ("argv", "versions", "device", "model", "git_head", "git_dirty", "started_at",
                              "ended_at", "evidence")}


@pytest.mark.parametrize("digits", [5000, 4000])
def test_one_result_with_a_huge_integer_is_unreadable_and_the_rest_is_reported(runs, tmp_path, capsys, digits):
    """5,000 digits is past Python's integer-parsing limit (the report exited 2); 4,000 digits parses but
    cannot be shown as a float (an OverflowError, exit 2)."""
    folder = tmp_path / "runs"
    folder.mkdir()
    shutil.copytree(runs / "trace-chunk", folder / "trace-chunk")
    bench = {**_envelope(runs), "command": "bench", "status": "ok", "backend": "engine", "execution": "eager",
             "workload": {"name": "fixed"}, "runs": [1, 2], "median": {"output_throughput": 1}}
    text = json.dumps(bench).replace('"output_throughput": 1', '"output_throughput": ' + "9" * digits)
    (folder / "bench-huge.json").write_text(text)
    code, out, err = run_cli(["report", "--runs", str(folder), "--out", str(tmp_path / "report")], capsys)
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "bench-huge.json is UNREADABLE" in err and f"an integer of {digits} digits" in err
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| trace-chunk | PASS |" in md
    section = md.split("## UNREADABLE", 1)[1].split("##", 1)[0]
    assert f"| `bench-huge.json` | an integer of {digits} digits" in section


def _members(path: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(path) as tar:
        return [(m, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]


def _with_manifest_entry(archive: Path, dest: Path, entry: dict) -> Path:
    with tarfile.open(dest, "w:gz") as tar:
        for info, data in _members(archive):
            if info.name == "evidence/manifest.json":
                manifest = json.loads(data)
                manifest["files"].append(entry)
                data = json.dumps(manifest).encode()
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return dest


def test_a_manifest_name_no_file_system_takes_is_a_difference_not_a_crash(archive, tmp_path, capsys):
    name = "runs/" + "n" * 300 + ".json"
    bad = _with_manifest_entry(archive, tmp_path / "long.tar.gz", {"file": name, "bytes": 2, "sha256": "0" * 64})
    code, out, err = run_cli(["report", "verify", str(bad)], capsys)
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{name} differs: cannot be looked up here" in err


def _verify_limited(path: Path, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))

    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "labkit", "report", "verify", str(path)], cwd=REPO,
                          env=os.environ.copy(), preexec_fn=cap, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - t0


def _header(name: str, type_: bytes, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size = type_, size
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def _bomb(archive: Path, dest: Path, type_: bytes, size: int) -> Path:
    """The archive's members, then one extended header (GNU long name `L`, or PAX `x`) declaring `size` bytes,
    whose data is that many bytes of a name (a few hundred KiB once compressed), then the member it names."""
    with gzip.open(dest, "wb", compresslevel=9) as out:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for info, data in _members(archive):
                tar.addfile(info, io.BytesIO(data))
            end = tar.offset
        out.write(buf.getvalue()[:end])
        out.write(_header("././@LongLink" if type_ == tarfile.GNUTYPE_LONGNAME else "PaxHeader", type_, size))
        record = b"a" * (1 << 20) if type_ == tarfile.GNUTYPE_LONGNAME else None
        left = size
        if record is None:  # one PAX record: "SIZE path=aaaa...\n" of exactly `size` bytes
            head = f"{size} path=".encode()
            out.write(head)
            left -= len(head) + 1
            record = b"a" * (1 << 20)
        while left > 0:
            chunk = record[:min(left, len(record))]
            out.write(chunk)
            left -= len(chunk)
        if type_ != tarfile.GNUTYPE_LONGNAME:
            out.write(b"\n")
        out.write(b"\0" * (-size % 512))
        out.write(_header("evidence/runs/x.json", tarfile.REGTYPE, 2) + b"{}" + b"\0" * 510 + b"\0" * 1024)
    return dest


@pytest.mark.parametrize("type_", [tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE], ids=["gnu-longname", "pax"])
def test_an_extended_header_declaring_hundreds_of_mib_is_refused_at_once_in_bounded_memory(archive, tmp_path,
                                                                                           type_):
    bomb = _bomb(archive, tmp_path / "bomb.tar.gz", type_, 256 << 20)
    assert bomb.stat().st_size < 2 << 20
    proc, seconds = _verify_limited(bomb)
    err = proc.stderr.strip()
    assert proc.returncode == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, (proc.returncode, err)
    assert "header declares 268435456 bytes (the verifier's cap" in err, err
    assert seconds < 30, f"{seconds:.0f} s"


def test_verify_writes_only_what_the_manifest_lists_at_the_size_it_records(archive, tmp_path, capsys):
    """A member the manifest does not list, or lists at another size, is judged from its header and never
    written out (a few hundred KiB of zeros would otherwise become hundreds of MiB on the verifier's disk)."""
    members = _members(archive)
    with tarfile.open(tmp_path / "extra.tar.gz", "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data))
        big = tarfile.TarInfo("evidence/runs/trace-chunk/steps.tsv.big")
        big.size = 64 << 20
        tar.addfile(big, io.BytesIO(bytes(big.size)))
    from labkit.report import verify as verify_mod

    written = []
    real = tarfile.TarFile.extract

    def spy(self, member, *a, **kw):
        written.append(member.name)
        return real(self, member, *a, **kw)

    tarfile.TarFile.extract = spy
    try:
        v = verify_mod.verify(tmp_path / "extra.tar.gz")
    finally:
        tarfile.TarFile.extract = real
    assert ("runs/trace-chunk/steps.tsv.big", "in the archive but not in the manifest") in v.problems
    assert "evidence/runs/trace-chunk/steps.tsv.big" not in written and "evidence/manifest.json" in written


# --- the timeline picture's cost ----------------------------------------------------------------------------------
def _log(requests: int, steps: int, per_step: int = 16) -> list[dict]:
    ev = [{"event": "run_start", "step": None, "num_kvcache_blocks": 512}]
    ev += [{"event": "request_added", "step": None, "request_id": f"r{i}", "seq_id": i} for i in range(requests)]
    for s in range(1, steps + 1):
        rows = [(s * per_step + j) % requests for j in range(per_step)]
        phase = "prefill" if s % 10 == 1 else "decode"
        ev.append({"event": "scheduled", "step": s, "phase": phase,
                   "seqs": [{"request_id": f"r{r}", "num_scheduled_tokens": 64 if phase == "prefill" else 1}
                            for r in rows]})
        if s % 50 == 0:
            ev.append({"event": "preempted", "step": s, "request_id": f"r{rows[0]}"})
        ev.append({"event": "after_postprocess", "step": s, "free_blocks": 512 - s % 100,
                   "seqs": [{"request_id": f"r{r}", "accepted": s % 3 != 0} for r in rows]})
    return ev


def _cpu_seconds(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def test_the_timeline_pictures_cost_is_bounded_whatever_the_logs_length():
    """Before: one artist per cell, a label per prefill, a value over every KV point and a row per request (a
    1,535-line log took 82 s of CPU; 800 lines 21 s here). Now rows, labels and annotations are bounded and
    cells are one collection per row and phase: ten times the log costs well under ten times the time."""
    figures.close_all()
    short, long_ = _log(200, 300), _log(2000, 3000)
    assert len(short) > 800 and len(long_) > 8000
    t_short = _cpu_seconds(lambda: figures.trace_timeline(short, "short"))
    t_long = _cpu_seconds(lambda: figures.trace_timeline(long_, "long"))
    assert t_short < 8, f"{t_short:.1f} s for {len(short)} lines"
    assert t_long < 4 * t_short + 2, f"{t_long:.1f} s for {len(long_)} lines, {t_short:.1f} s for {len(short)}"
    # The picture's size is bounded too (both have more requests than it has rows): IHDR's height.
    heights = [int.from_bytes(figures.trace_timeline(log, "x")[20:24], "big") for log in (short, long_)]
    assert heights[0] == heights[1] < 4000, heights


def test_a_timeline_with_more_requests_than_rows_says_so():
    fig = figures.trace_timeline_figure(_log(100, 20), "t")
    title = fig.axes[0].get_title()
    assert f"first {figures.MAX_ROWS} of 100 requests" in title
    figures.close_all()


# --- a long event log, streamed ------------------------------------------------------------------------------------
def long_log(src: Path, dest: Path, lines: int) -> Path:
    """A run's log made `lines` long: its decode step repeated (renumbered, later in time) before its run_end.
    (The repeats break the invariants: the verdict is FAIL, with the failures capped, as for any long bad log.)"""
    events = [json.loads(line) for line in src.read_text().splitlines()]
    last = max(e["step"] for e in events if isinstance(e.get("step"), int))
    template = [e for e in events if e.get("step") == last]
    end = next(e for e in events if e["event"] == "run_end")
    t, step, n = max(e["t_ns"] for e in events), last, 0
    with dest.open("w") as f:
        for e in events:
            if e["event"] != "run_end":
                f.write(json.dumps(e, separators=(",", ":")) + "\n")
                n += 1
        while n < lines - 1:
            step += 1
            for e in template:
                t += 1000
                f.write(json.dumps({**e, "step": step, "t_ns": t}, separators=(",", ":")) + "\n")
                n += 1
        f.write(json.dumps({**end, "t_ns": t + 1, "steps": step}) + "\n")
    return dest


def _labkit_limited(args: list[str], limit: int, timeout: float = 600) -> subprocess.CompletedProcess:
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run([sys.executable, "-m", "labkit", *args], cwd=REPO, env=os.environ.copy(),
                          preexec_fn=cap, capture_output=True, text=True, timeout=timeout)


def test_a_streamed_log_is_judged_as_the_same_log_in_memory(runs, tmp_path):
    from labkit.trace.cases import load_case
    from labkit.trace.events import EventLog, read_jsonl
    from labkit.trace.validate import validate, validate_log

    src = runs / "trace-chunk" / "events.jsonl"
    for path in (src, long_log(src, tmp_path / "long.jsonl", 3000)):
        for case in (load_case("chunk"), None):
            streamed = validate_log(EventLog.from_file(path), case).to_dict()
            assert streamed == validate(read_jsonl(path), case).to_dict()
    streamed = validate_log(EventLog.from_file(tmp_path / "long.jsonl"), load_case("chunk"))
    assert streamed.verdict == "FAIL" and streamed.steps > 500


def test_trace_check_of_a_100000_line_log_runs_in_bounded_memory(runs, tmp_path):
    """Before: the log was read whole into a list of events (285 MB resident for these 33 MB; 4.7 GB for a
    million lines) and failed here with MemoryError. Streamed, it needs a fraction of the limit."""
    log = long_log(runs / "trace-chunk" / "events.jsonl", tmp_path / "events.jsonl", 100_000)
    proc = _labkit_limited(["trace", "check", str(log), "--case", "chunk", "--out", str(tmp_path / "replay.json")],
                           200 << 20)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, \
        proc.stderr[-2000:]
    replay = json.loads((tmp_path / "replay.json").read_text())
    assert replay["verdict"] == "FAIL" and replay["report"]["steps"] > 19_000


@pytest.mark.slow
def test_a_million_line_log_is_reported_and_verified_in_bounded_memory(runs, tmp_path):
    """The whole path a long run takes: `labkit report` (its timeline picture streams the log) and `labkit report
    verify` (re-validating it, streamed), each in 1 GiB of address space."""
    folder = tmp_path / "runs"
    shutil.copytree(runs / "trace-chunk", folder / "trace-chunk")
    log = long_log(runs / "trace-chunk" / "events.jsonl", folder / "trace-chunk" / "events.jsonl", 1_000_000)
    proc = _labkit_limited(["trace", "check", str(log), "--case", "chunk", "--out",
                            str(folder / "trace-chunk" / "check.json")], 1 << 30, timeout=1200)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    check = json.loads((folder / "trace-chunk" / "check.json").read_text())
    check["command"] = "trace"  # the log's own result, as `labkit trace` would have written it
    (folder / "trace-chunk" / "check.json").write_text(json.dumps(check))
    proc = _labkit_limited(["report", "--runs", str(folder), "--out", str(tmp_path / "report")], 1 << 30,
                           timeout=1200)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr and "Error" not in proc.stderr, \
        proc.stderr[-2000:]
    assert "| trace-chunk | FAIL |" in (tmp_path / "report" / "report.md").read_text()
    proc = _labkit_limited(["report", "verify", str(tmp_path / "report" / "evidence.tar.gz")], 1 << 30,
                           timeout=1200)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, (proc.stdout[-2000:], proc.stderr[-2000:])
