"""`labkit bench load`: the online load bench against `labkit serve` (labkit/bench/load.py does the work).

    labkit bench load --workload fixed --rate 4               # starts a server on the default model
    labkit bench load --workload nano --rate inf --device cuda --slo ttft:500,tpot:50
    labkit bench load --arrivals workloads/arrivals/burst.jsonl --url http://127.0.0.1:8000

Writes runs/bench-load-NAME.json (metrics, config, envelope), a .md twin and NAME.requests.jsonl (one line
per request: ttft, tpot, e2el, every itl). Exit 0 when every request completed, 1 when some failed (their
errors are counted in the JSON), 2 when it could not run.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from labkit.bench import load as L
from labkit.bench.workloads import fold_to_vocab, load_workload
from labkit.errors import LabkitError
from labkit.options import Policy
from labkit.output import (JSON_OPTION, Device, envelope, evidence_for, finish, print_json, resolve_device, runs_dir,
                           write_json)

# Flags that configure the server this command starts (refused with --url).
SERVER_FLAGS = ("--model", "--device", "--eager/--graph", "--tp", "--max-num-seqs", "--budget", "--max-model-len",
                "--policy", "--max-queue")


def load(
    workload: str = typer.Option("fixed", "--workload", "-w",
                                 help="Requests (and temperature / ignore_eos) from a bench workload: nano, fixed "
                                      "or a YAML path."),
    rate: float = typer.Option(math.inf, "--rate",
                               help="Poisson arrivals, requests per second (inf: all at once)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the arrival times (and of prompt_len prompts)."),
    arrivals: Optional[Path] = typer.Option(None, "--arrivals",
                                            help="Arrivals JSONL (t, prompt | prompt_ids | prompt_len, max_tokens) "
                                                 "instead of the workload's requests at --rate."),
    num_requests: Optional[int] = typer.Option(None, "--num-requests", min=1, help="Keep the first N requests."),
    url: Optional[str] = typer.Option(None, "--url", help="A running `labkit serve` (default: start one)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model folder for the started server."),
    device: Device = typer.Option(Device.auto, "--device", help="Device of the started server."),
    eager: Optional[bool] = typer.Option(None, "--eager/--graph", help="Started server: eager or CUDA graphs."),
    tp: Optional[int] = typer.Option(None, "--tp", min=1, max=8, help="Started server: tensor parallel size."),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", min=1, help="Started server: max_num_seqs."),
    budget: Optional[int] = typer.Option(None, "--budget", min=1, help="Started server: max_num_batched_tokens."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=1, help="Started server: max_model_len."),
    policy: Optional[Policy] = typer.Option(None, "--policy", help="Started server: scheduling policy."),
    max_queue: Optional[int] = typer.Option(None, "--max-queue", min=1,
                                            help="Started server: waiting requests before 503 (default: enough "
                                                 "for every request)."),
    max_concurrency: Optional[int] = typer.Option(None, "--max-concurrency", min=1,
                                                  help="At most N requests in flight (default: no limit)."),
    slo: Optional[str] = typer.Option(None, "--slo", help="Goodput bounds in ms, e.g. ttft:500,tpot:50 "
                                                          "(ttft, tpot, e2el)."),
    startup_timeout: float = typer.Option(600.0, "--startup-timeout", min=1.0,
                                          help="Seconds to wait for the started server."),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="Seconds a request may take."),
    out: Optional[Path] = typer.Option(None, "--out", help="JSON path (default: runs/bench-load-NAME.json)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Send requests on a schedule to `labkit serve` and report ttft / tpot / itl / e2el and throughput."""
    slo_ms = L.parse_slo(slo)
    w = load_workload(workload).scaled(num_requests if arrivals is None else None)
    server_args = {"--model": model, "--device": None if device == Device.auto else device.value,
                   "--eager/--graph": eager, "--tp": tp, "--max-num-seqs": max_num_seqs, "--budget": budget,
                   "--max-model-len": max_model_len, "--policy": policy.value if policy else None,
                   "--max-queue": max_queue}
    if url is not None:
        given = [f for f, v in server_args.items() if v is not None]
        if given:
            raise LabkitError(f"{', '.join(given)}: settings of a server this command starts; with --url the "
                              "server is already running")
    if arrivals is not None:
        reqs = L.load_arrivals(arrivals, vocab_range=_id_range(w), seed=seed)
        if num_requests is not None:
            reqs = reqs[:num_requests]
        source = {"arrivals": str(arrivals), "arrivals_sha256": hashlib.sha256(arrivals.read_bytes()).hexdigest()}
        name = arrivals.stem
    else:
        reqs = L.poisson_arrivals(w, rate, seed)
        source = {"workload": w.params(), "rate": rate if math.isfinite(rate) else "inf", "seed": seed}
        name = f"{w.name}-{'inf' if not math.isfinite(rate) else f'{rate:g}'}"

    console = Console(quiet=as_json)
    server = None
    model_dir = None
    json_path = out if out is not None else runs_dir() / f"bench-load-{name}.json"
    try:
        if url is None:
            from labkit.model import resolve_model

            model_dir = Path(resolve_model(model))
            dev = resolve_device(device)
            args = ["--model", str(model_dir), "--device", dev,
                    "--max-queue", str(max_queue if max_queue is not None else max(256, len(reqs)))]
            for flag, value in (("--tp", tp), ("--max-num-seqs", max_num_seqs), ("--budget", budget),
                                ("--max-model-len", max_model_len)):
                if value is not None:
                    args += [flag, str(value)]
            if eager is not None:
                args.append("--eager" if eager else "--graph")
            if policy is not None:
                args += ["--policy", policy.value]
            log_path = json_path.with_suffix(".server.log")
            console.print(f"starting labkit serve ({dev}) ... log: {log_path}", style="dim")
            server = L.SpawnedServer(args, log_path, startup_timeout)
            base = server.url
        else:
            base = url
        info = L.server_info(base)
        folded = False
        vocab = info.get("vocab_size")
        if isinstance(vocab, int) and vocab > 0:
            ids = [a.prompt for a in reqs if isinstance(a.prompt, list)]
            ids, folded = fold_to_vocab(ids, vocab)
            it = iter(ids)
            for a in reqs:
                if isinstance(a.prompt, list):
                    a.prompt = next(it)
        server_dev = str(info.get("device") or "unknown")
        evidence = evidence_for("cuda" if server_dev.startswith("cuda") else "cpu")
        env = envelope("bench load", device="cpu", model_dir=model_dir, evidence=evidence)
        env["device"] = {"type": server_dev.split(":")[0], "name": info.get("device_name"), "server": server_dev}
        with Progress(SpinnerColumn(), TextColumn("requests"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=Console(stderr=True), transient=True,
                      disable=not Console(stderr=True).is_terminal) as progress:
            task = progress.add_task("requests", total=len(reqs))
            outcomes = L.run_load(base, reqs, temperature=w.temperature, ignore_eos=w.ignore_eos,
                                  max_concurrency=max_concurrency, timeout_s=timeout,
                                  progress=lambda: progress.advance(task))
    finally:
        if server is not None:
            server.close()

    summary = L.summarize(outcomes, slo_ms)
    config = {"source": source, "requests": len(reqs), "prompt_ids_folded": folded, "temperature": w.temperature, "ignore_eos": w.ignore_eos,
              "max_concurrency": max_concurrency,
              "server": {"url": url} if url is not None else {"started": True, **{k: v for k, v in server_args.items()
                                                                                  if v is not None}}}
    requests_path = json_path.with_suffix(".requests.jsonl")
    result = finish(env, status="ok" if summary["failed"] == 0 else "failed_requests", config=config,
                    metrics=summary, files={"json": str(json_path), "md": str(json_path.with_suffix(".md")),
                                            "requests": str(requests_path)})
    write_json(json_path, result)
    requests_path.write_text("".join(_jsonl(L.outcome_record(o)) for o in outcomes), encoding="utf-8")
    json_path.with_suffix(".md").write_text(markdown(result), encoding="utf-8")
    print_summary(result, console)
    if as_json:
        print_json(result)
    console.print(f"wrote {json_path}, {json_path.with_suffix('.md')} and {requests_path}")
    if summary["failed"]:
        console.print(Text(f"{summary['failed']} of {summary['requests']} requests failed: "
                           + "; ".join(f"{n} x {e}" for e, n in summary["errors"].items()), style="red"))
        raise typer.Exit(1)
    raise typer.Exit(0)


def _id_range(w) -> tuple[int, int]:
    lo, hi = w.token_range
    return max(lo, 100), max(max(lo, 100) + 1, hi)


def _jsonl(rec: dict) -> str:
    return json.dumps(rec) + "\n"


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:,.2f}"


def _rows(r: dict) -> list[tuple[str, str]]:
    m = r["metrics"]
    rows = [("requests", f"{m['completed']} completed, {m['failed']} failed of {m['requests']}"),
            ("duration s", _ms(m["duration_s"])),
            ("input / output tokens", f"{m['input_tokens']:,} / {m['output_tokens']:,}"),
            ("request throughput (req/s)", _ms(m["request_throughput"])),
            ("output throughput (tok/s)", _ms(m["output_throughput"])),
            ("total token throughput (tok/s)", _ms(m["total_token_throughput"]))]
    if "goodput" in m:
        bounds = ", ".join(f"{k} <= {v:g} ms" for k, v in m["slo"].items())
        rows.append((f"goodput (req/s, {bounds})", f"{_ms(m['goodput'])} ({m['good_requests']} requests)"))
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        s = m[key]
        rows.append((f"{key[:-3]} ms: mean / median / p90 / p99",
                     " / ".join(_ms(s[k]) for k in ("mean", "median", "p90", "p99"))))
    return rows


def print_summary(r: dict, console: Console) -> None:
    src = r["config"]["source"]
    what = src.get("arrivals") or f"{src['workload']['name']} at rate {src['rate']}"
    table = Table(title=f"labkit bench load: {what} ({r['evidence']}, server on {r['device'].get('server')})",
                  show_header=False, title_justify="left")
    table.add_column(style="cyan")
    table.add_column(justify="right")
    for k, v in _rows(r):
        table.add_row(k, v)
    console.print(table)


def markdown(r: dict) -> str:
    src = r["config"]["source"]
    lines = ["# labkit bench load", "",
             f"- source: {src.get('arrivals') or src['workload']['name']} "
             f"(rate {src.get('rate', 'from the file')}, seed {src.get('seed', '-')})",
             f"- server: {r['device'].get('server')} ({r['device'].get('name') or '-'}), evidence {r['evidence']}",
             f"- git head: {r.get('git_head')}", "", "| metric | value |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in _rows(r)]
    if r["metrics"]["errors"]:
        lines += ["", "Errors:", ""] + [f"- {n} x {e}" for e, n in r["metrics"]["errors"].items()]
    return "\n".join(lines) + "\n"
