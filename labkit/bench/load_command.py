"""`labkit bench load`: the online load bench against `labkit serve` (labkit/bench/load.py does the work).

    labkit bench load --workload fixed --rate 4               # starts a server on the default model
    labkit bench load --workload nano --rate inf --device cuda --slo ttft:500,tpot:50
    labkit bench load --arrivals workloads/arrivals/burst.jsonl --url http://127.0.0.1:8000
    labkit bench load --workload nano --endpoints http://127.0.0.1:8001,http://127.0.0.1:8002   # replicas

Writes runs/bench-load-NAME.json (metrics, config, envelope, each server's /health), a .md twin and
NAME.requests.jsonl (one line per request: endpoint, ttft, tpot, e2el, every itl, tokens per event). The
envelope's device, evidence kind and model come from the servers' /health, not from the client machine.
Exit 0 when every request completed, 1 when some failed (their errors are counted in the JSON), 2 when it
could not run.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from labkit.bench import load as L, load_metrics as M
from labkit.bench.workloads import draw_warmup, fold_to_vocab, load_workload
from labkit.engine_args import EngineArgs, flag
from labkit.errors import LabkitError
from labkit.model import resolve_model
from labkit.narrow import fit
from labkit.options import (
    AsyncSchedulingOption,
    Device,
    DeviceOption,
    EnforceEagerOption,
    JsonOption,
    KvCacheDtypeOption,
    MaxModelLenOption,
    MaxNumBatchedTokensOption,
    MaxNumSeqsOption,
    MaxQueueOption,
    ModelOption,
    NumRequestsOption,
    Out,
    SchedulingPolicyOption,
    TensorParallelSizeOption,
    WorkloadOption,
    check_url,
)
from labkit.output import (
    configuration_suffix,
    device_info,
    dist_version,
    envelope,
    finish,
    knobs_text,
    print_json,
    resolve_device,
    runs_dir,
    write_json,
)


def load(
    ctx: typer.Context,
    workload: WorkloadOption = "fixed",
    rate: float = typer.Option(math.inf, "--rate",
                               help="Poisson arrivals, requests per second (inf: all at once)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the arrival times (and of prompt_len prompts)."),
    arrivals: Optional[Path] = typer.Option(None, "--arrivals",
                                            help="Arrivals JSONL (t, prompt | prompt_ids | prompt_len, max_tokens) "
                                                 "instead of the workload's requests at --rate."),
    num_requests: NumRequestsOption = None,
    url: Optional[str] = typer.Option(None, "--url", help="A running `labkit serve` (default: start one)."),
    endpoints: Optional[str] = typer.Option(None, "--endpoints",
                                            help="Several running servers, URL,URL,...: arrivals go round-robin "
                                                 "in arrival order (replicas of one model)."),
    behind: Optional[str] = typer.Option(None, "--behind", help="With --url naming a router (vllm-router, "
                                         "sglang-router): the labkit servers behind it, URL,URL,...; their /health "
                                         "gives the run's device, model and vocabulary, which a router's does not."),
    allow_mixed: bool = typer.Option(False, "--allow-mixed",
                                     help="Accept --endpoints that serve different models (config_sha256)."),
    model: ModelOption = None,
    device: DeviceOption = Device.auto,
    enforce_eager: EnforceEagerOption = None,
    async_scheduling: AsyncSchedulingOption = None,
    kv_cache_dtype: KvCacheDtypeOption = None,
    tensor_parallel_size: TensorParallelSizeOption = None,
    max_num_seqs: MaxNumSeqsOption = None,
    max_num_batched_tokens: MaxNumBatchedTokensOption = None,
    max_model_len: MaxModelLenOption = None,
    scheduling_policy: SchedulingPolicyOption = None,
    max_queue: MaxQueueOption = None,
    max_concurrency: Optional[int] = typer.Option(None, "--max-concurrency", min=1,
                                                  help="At most N requests in flight (default: no limit)."),
    slo: Optional[str] = typer.Option(None, "--slo", help="Goodput bounds in ms, e.g. ttft:500,tpot:50 "
                                                          "(ttft, tpot, e2el)."),
    percentiles: str = typer.Option("50,90,99", "--percentiles",
                                    help="Latency percentiles to report, e.g. 50,90,99,99.9 (keys p50 ... p99.9)."),
    client: str = typer.Option("auto", "--client", help="HTTP client: auto (aiohttp when installed), aiohttp "
                                                        "or httpx."),
    startup_timeout: float = typer.Option(600.0, "--startup-timeout", min=1.0,
                                          help="Seconds to wait for the started server."),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="Seconds a request may take."),
    warmup: bool = typer.Option(True, "--warmup/--no-warmup", help="Before timing, send the workload's warm-up "
                                "requests (its own random prompts, short outputs) so compile caches are warm."),
    out: Out("JSON path (default: runs/bench-load-NAME[-OPTION-VALUE...].json, one -OPTION-VALUE per other option "
             "given).") = None,
    as_json: JsonOption = False,
) -> None:
    """Online load bench: requests on a schedule at `labkit serve`; ttft, tpot, itl, e2el, throughput, goodput.

    Without --url or --endpoints it starts a server, which the Engine options and --max-queue configure
    (--max-queue left out: room for every request). --url and --endpoints name running servers instead.

    Example: labkit bench load --workload nano --rate 4 --device cpu
    """
    slo_ms = M.parse_slo(slo)
    pcts = M.parse_percentiles(percentiles)
    client_lib = L.client_name(client)
    urls = _endpoint_list(url, endpoints)
    if behind is not None and url is None:   # (before a server is started for nothing)
        raise LabkitError("--behind: the servers behind a router given with --url; give --url ROUTER too")
    replicas = _endpoint_list(None, behind, "--behind") if behind is not None else None
    w = load_workload(workload).scaled(num_requests if arrivals is None else None)
    # The settings of the server this command starts: its engine's (as `labkit serve` takes them) and the queue.
    engine_args = EngineArgs.given(ctx, device=None if device == Device.auto else device.value)
    server_args = {"--model": model, **{flag(k): v for k, v in engine_args.kwargs().items()},
                   "--max-queue": max_queue}
    if urls:
        given = [f for f, v in server_args.items() if v is not None]
        if given:
            raise LabkitError(f"{', '.join(given)}: settings of a server this command starts; with --url or "
                              "--endpoints the servers are already running")
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
    json_path = out if out is not None else runs_dir() / (
        f"bench-load-{name}{configuration_suffix(skip=('workload', 'rate', 'arrivals'))}.json")
    try:
        if not urls:
            model_dir = Path(resolve_model(model))
            server = _start_server(model_dir, device, max_queue, len(reqs), engine_args,
                                   json_path.with_suffix(".server.log"), startup_timeout, console)
            urls = [server.url]
        replicas = replicas or urls
        prov = L.server_provenance([(u, L.server_info(u)) for u in replicas], allow_mixed)
        if behind is None and url is not None and not prov["servers"][0]["health"].get("vocab_size"):
            console.print(f"warning: {url}/health does not say its model (a router?): give --behind with the "
                          "servers behind it, or prompts may fall outside their vocabulary", style="yellow")
        for u in prov["unverified_model"]:
            console.print(f"warning: {u}/health names no config_sha256: its model could not be compared",
                          style="yellow")
        folded = _fold_prompts(reqs, [s["health"].get("vocab_size") for s in prov["servers"]])
        env = envelope("bench load", device="cpu", model_dir=model_dir, evidence=prov["evidence"])
        env["device"] = prov["device"]
        env["knobs"] = prov["knobs"]  # the servers' (a server this command started has the client's environment)
        # The server's word on its model; a server this command started and whose /health is older falls back
        # to what the client read from the same folder.
        env["model"] = {**env["model"], **{k: v for k, v in prov["model"].items() if v is not None or k == "mixed"}}
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=Console(stderr=True), transient=True,
                      disable=not Console(stderr=True).is_terminal) as progress:
            importlib.import_module(client_lib)   # its import is not the run's work: keep it off the clock
            warmed = _warm_up(w, urls, prov, client_lib, timeout, console, progress) if warmup else None
            task = progress.add_task("requests", total=len(reqs))
            cpu0, wall0 = time.process_time(), time.perf_counter()
            outcomes = L.run_load(urls, reqs, temperature=w.temperature, ignore_eos=w.ignore_eos,
                                  max_concurrency=max_concurrency, timeout_s=timeout,
                                  progress=lambda: progress.advance(task), client=client_lib)
            cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        if server is not None:
            server.close()

    summary = M.summarize(outcomes, slo_ms, pcts)
    config = {"source": source, "requests": len(reqs), "prompt_ids_folded": folded, "temperature": w.temperature,
              "ignore_eos": w.ignore_eos, "max_concurrency": max_concurrency,
              # what was asked: how long the warm-up took is a measurement (result["warmup"]), and a measured
              # figure here would make two runs' configs differ by chance
              "warmup": None if warmed is None else {"requests": warmed["requests"]},
              "server": ({"url": urls[0], **({"behind": replicas} if behind is not None else {})} if url is not None
                         else {"endpoints": urls} if endpoints is not None
                         else {"started": True, **{k: v for k, v in server_args.items() if v is not None}})}
    # The client's share of the run: CPU seconds near the wall time mean the client, not the server, set the pace.
    client_info = {"library": client_lib, "version": dist_version(client_lib), "cpu_s": cpu_s, "wall_s": wall_s,
                   "busy": cpu_s / wall_s if wall_s > 0 else None, "host": device_info("cpu")}
    requests_path = json_path.with_suffix(".requests.jsonl")
    result = finish(env, status="ok" if summary["failed"] == 0 else "failed_requests", config=config,
                    warmup=warmed, metrics=summary, servers=prov["servers"], client=client_info,
                    files={"json": str(json_path), "md": str(json_path.with_suffix(".md")),
                           "requests": str(requests_path)})
    write_json(json_path, result)
    requests_path.write_text("".join(_jsonl(M.outcome_record(o)) for o in outcomes), encoding="utf-8")
    json_path.with_suffix(".md").write_text(markdown(result), encoding="utf-8")
    print_summary(result, console)
    if as_json:
        print_json(result)
    console.print(f"wrote {json_path}, {json_path.with_suffix('.md')} and {requests_path}")
    if client_info["busy"] is not None and client_info["busy"] > 0.8:
        console.print(f"warning: the client was busy {client_info['busy']:.0%} of the run ({client_lib}): it may "
                      "have set the pace, not the server", style="yellow")
    if summary["failed"]:
        console.print(Text(f"{summary['failed']} of {summary['requests']} requests failed: "
                           + "; ".join(f"{n} x {e}" for e, n in summary["errors"].items()), style="red"))
        raise typer.Exit(1)
    raise typer.Exit(0)


def _endpoint_list(url: str | None, endpoints: str | None, option: str = "--endpoints") -> list[str]:
    """The servers to load: --url (one) or --endpoints (several; `option`: the flag that gave the list, e.g.
    --behind); none means start one."""
    if url is not None and endpoints is not None:
        raise LabkitError("--url and --endpoints: give one of them (--endpoints URL,URL,... for several servers)")
    if endpoints is None:
        return [] if url is None else [check_url("--url", url)]
    urls = [u.strip().rstrip("/") for u in endpoints.split(",")]
    if not all(urls):
        raise LabkitError(f"{option}: expected URL,URL,... without empty entries, got {endpoints!r}")
    return [check_url(option, u) for u in urls]


def _start_server(model_dir: Path, device: Device, max_queue, n_requests: int, engine_args: EngineArgs,
                  log_path: Path, startup_timeout: float, console) -> L.SpawnedServer:
    dev = resolve_device(device)
    args = ["--model", str(model_dir), "--device", dev,
            "--max-queue", str(max_queue if max_queue is not None else max(256, n_requests)),
            *dataclasses.replace(engine_args, device=None).flags()]
    console.print(f"starting labkit serve ({dev}) ... log: {log_path}", style="dim")
    return L.SpawnedServer(args, log_path, startup_timeout)


def _warm_up(w, urls: list[str], prov: dict, client_lib: str, timeout: float, console: Console,
             progress: Progress) -> dict:
    """The workload's warm-up draw, all at once (at least one request per endpoint), untimed. Its prompts come
    from their own random stream, so the timed requests never find them in the prefix cache."""
    d = draw_warmup(w, 0)
    n = max(len(d.prompts), len(urls))
    # A first request can take the server seconds (compiles, first allocations): say what the wait is.
    console.print(f"warm-up: {n} untimed request(s) to {len(urls)} server(s) ...", style="dim")
    task = progress.add_task("warm-up", total=None)
    reqs = [L.Arrival(t=0.0, prompt=list(d.prompts[i % len(d.prompts)]), max_tokens=d.max_tokens[i % len(d.prompts)],
                      id=f"warmup{i}") for i in range(n)]
    _fold_prompts(reqs, [s["health"].get("vocab_size") for s in prov["servers"]])
    t0 = time.perf_counter()
    outcomes = L.run_load(urls, reqs, temperature=w.temperature, ignore_eos=w.ignore_eos, timeout_s=timeout,
                          client=client_lib)
    progress.remove_task(task)
    failed = [o for o in outcomes if not o.ok]
    if len(failed) == len(outcomes):
        raise LabkitError(f"every warm-up request failed ({failed[0].error}): is the server healthy?", 2)
    return {"requests": n, "failed": len(failed), "wall_s": time.perf_counter() - t0}


def _fold_prompts(reqs: list, vocab_sizes: list) -> bool:
    """Fold token-id prompts into the smallest vocabulary any endpoint reports; True when some id changed."""
    sizes = [v for v in vocab_sizes if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    if not sizes:
        return False
    ids, folded = fold_to_vocab([a.prompt for a in reqs if isinstance(a.prompt, list)], min(sizes))
    it = iter(ids)
    for a in reqs:
        if isinstance(a.prompt, list):
            a.prompt = next(it)
    return folded


def _id_range(w) -> tuple[int, int]:
    lo, hi = w.token_range
    return max(lo, 100), max(max(lo, 100) + 1, hi)


def _jsonl(rec: dict) -> str:
    return json.dumps(rec) + "\n"


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:,.2f}"


def _rows(r: dict, latencies: bool = True) -> list[tuple[str, str]]:
    """The summary as (figure, value) rows; with `latencies` one row per latency holding all its statistics
    (the Markdown twin; a terminal gets them as a table of their own, latency_table)."""
    m = r["metrics"]
    rows = [("requests", f"{m['completed']} completed, {m['failed']} failed of {m['requests']}"),
            ("duration s", _ms(m["duration_s"])),
            ("input / output tokens", f"{m['input_tokens']:,} / {m['output_tokens']:,}"),
            ("request throughput (req/s)", _ms(m["request_throughput"])),
            ("output throughput (tok/s)", _ms(m["output_throughput"])),
            ("peak output tok/s (1 s buckets)", _ms(m.get("max_output_tokens_per_s"))),
            ("peak concurrent requests", str(m.get("max_concurrent_requests", "-"))),
            ("total token throughput (tok/s)", _ms(m["total_token_throughput"]))]
    if "goodput" in m:
        bounds = ", ".join(f"{k} <= {v:g} ms" for k, v in m["slo"].items())
        rows.append((f"goodput (req/s, {bounds})", f"{_ms(m['goodput'])} ({m['good_requests']} requests)"))
    if latencies:
        names, table = latency_table(r)
        rows += [(f"{row[0]} ({' / '.join(names)})", " / ".join(row[1:])) for row in table]
    for e in m.get("endpoints", []):
        rows.append((f"endpoint {e['url']}",
                     f"{e['completed']}/{e['requests']} requests, {e['output_tokens']:,} tokens, "
                     f"{_ms(e['output_throughput'])} tok/s, tpot median {_ms(e['tpot_ms']['median'])}"))
    if r.get("client"):
        c = r["client"]
        rows.append(("client", f"{c['library']} {c.get('version') or ''}, {_ms(c['cpu_s'])} CPU s in "
                               f"{_ms(c['wall_s'])} s"))
    return rows


def latency_table(r: dict) -> tuple[list[str], list[list[str]]]:
    """The statistics' names (mean, median, std, then the percentiles but the 50th) and one row per latency: its
    name and its values in ms."""
    m = r["metrics"]
    # p50 is the median: one column for it (the JSON keeps both keys, as vLLM's benchmark writes them).
    names = ["mean", "median", "std"] + [M.percentile_key(p) for p in m.get("percentiles", M.DEFAULT_PERCENTILES)
                                         if float(p) != 50]
    return names, [[f"{key[:-3]} ms"] + [_ms(m[key].get(k)) for k in names] for key in M.LATENCIES]


def print_summary(r: dict, console: Console) -> None:
    src = r["config"]["source"]
    what = src.get("arrivals") or f"{src['workload']['name']} at rate {src['rate']}"
    table = Table(title=f"labkit bench load: {what} ({r['evidence']}, server on {r['device'].get('server')})",
                  show_header=False, title_justify="left")
    table.add_column(style="cyan")
    table.add_column(justify="right")
    for k, v in _rows(r, latencies=False):
        table.add_row(k, v)
    fit(table, console)
    console.print(table)
    # Latencies as their own table, a column per statistic: as key/value rows their six figures wrap in a
    # terminal of 80 columns.
    names, rows = latency_table(r)
    lat = Table(title="latencies (ms, over the completed requests)", title_justify="left")
    lat.add_column("", style="cyan", no_wrap=True)
    for name in names:
        lat.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        lat.add_row(row[0].removesuffix(" ms"), *row[1:])
    if not fit(lat, console):
        # More statistics (--percentiles) or longer figures than the width holds: a column per latency
        # instead, as there are only four of them.
        lat = Table(title="latencies (ms, over the completed requests)", title_justify="left")
        lat.add_column("", style="cyan", no_wrap=True)
        for row in rows:
            lat.add_column(row[0].removesuffix(" ms"), justify="right", no_wrap=True)
        for i, name in enumerate(names, start=1):
            lat.add_row(name, *(row[i] for row in rows))
    console.print(lat)


def markdown(r: dict) -> str:
    src = r["config"]["source"]
    lines = ["# labkit bench load", "",
             f"- source: {src.get('arrivals') or src['workload']['name']} "
             f"(rate {src.get('rate', 'from the file')}, seed {src.get('seed', '-')})",
             f"- server: {r['device'].get('server')} ({r['device'].get('name') or '-'}), evidence {r['evidence']}, "
             f"model {r['model'].get('path')} (config sha256 {r['model'].get('config_sha256')})"]
    for srv in r.get("servers", []):
        h = srv["health"]
        lines.append(f"  - {srv['url']}: {h.get('device')}, tp {h.get('tp', '-')}, git head {h.get('git_head', '-')}, "
                     f"labkit {h.get('labkit_version', '-')}")
    lines += [f"- engine knobs: {knobs_text(r.get('knobs', {}))}",
              f"- client git head: {r.get('git_head')}", "", "| metric | value |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in _rows(r)]
    if r["metrics"]["errors"]:
        lines += ["", "Errors:", ""] + [f"- {n} x {e}" for e, n in r["metrics"]["errors"].items()]
    return "\n".join(lines) + "\n"
