"""`labkit bench compare A.json B.json --variable NAME`: B/A of two bench runs, with each side's spread.

Two runs are comparable when their recorded `config` (workload name and parameters, model config
sha256, device type and name, dtype, backend, engine kwargs or HF settings; for load runs the arrival
source, concurrency and server settings) and engine knobs (the LABKIT_DECODE_*, LABKIT_GUMBEL_* and
LABKIT_GRAPH_* variables set for the run, or for its server: `--variable knobs`) are identical except for the
fields the named variable covers.
Anything else differing is refused (LabkitError, exit 2, one line naming the fields): a ratio across
two changes measures neither. The comparison reports, it does not judge: exit 0 whatever the ratio.

Noise. Each side's samples give its spread (n, min / median / max) and the headline is the ratio of
medians B/A with a seeded percentile bootstrap interval (BOOTSTRAP_RESAMPLES resamples of each side with
replacement, independently; the 2.5th and 97.5th percentiles of the resampled medians' ratio). When the
interval holds 1.0 the result is "within noise" and no ratio is given as a result. With 2-3 repeats the
interval spans roughly the two sides' ranges: it says "within noise" unless the repeats do not overlap.
A side with a single sample has no spread: the comparison is refused (exit 2) unless --allow-single, and
then says it has no interval.
    offline (`labkit bench`): the samples are the timed repeats; headline median output tok/s; also
        total and request throughput and wall time (and decode ms per token for step-timed workloads). init,
        warm-up, graph capture, KV blocks and peak memory are measured once per run and are shown as single
        measurements.
    load (`labkit bench load`): the samples are the completed requests (from the run's .requests.jsonl);
        headline median e2el (ms, lower is better), also ttft and tpot. Both runs send the same requests
        on the same schedule (the config check), so each request's latency is a draw of the same process,
        but requests of one run share a queue and are not independent: the interval shows the spread
        across requests within the runs, not run-to-run variation; repeat the load run before claiming a
        difference it only just shows. Throughput and goodput are one figure per run (single measurements).

Variables: a short name (eager, tp, backend, attention, policy, block_size, budget, ...; see VARIABLES,
and LOAD_VARIABLES for load runs) or any flattened config key itself (e.g. engine.max_model_len,
workload.seed). `code` covers no config field: use it to compare two commits on identical settings.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from labkit.engine_args import FIELDS, OLD_NAMES, flag, new_flag
from labkit.errors import LabkitError
from labkit.output import EVIDENCE_KINDS

BOOTSTRAP_RESAMPLES = 10000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95


def _engine_variables(key) -> dict[str, tuple[str, ...]]:
    """Each engine setting as a variable, under its Config field's name and its flag's old short name (eager, graph,
    tp, budget, policy, attention, block_size, num_blocks): `key(field)` is where a run records it. (The engine's
    seed is `engine_seed`: `seed` is the workload's or the arrivals'.)"""
    out = {name: (key(name),) for name in FIELDS if name != "seed"}
    for old, new in OLD_NAMES.items():
        out[old.replace("-", "_")] = out[new.removeprefix("no-").replace("-", "_")]
    return out


# Short names -> flattened config keys (a trailing ".*" covers a whole section).
_POOL = ("engine.num_kvcache_blocks", "engine.kvcache_memory_bytes")  # the KV pool's size, given either way
VARIABLES: dict[str, tuple[str, ...]] = {
    **_engine_variables(lambda name: f"engine.{name}"),
    "num_blocks": _POOL, "num_kvcache_blocks": _POOL, "kvcache_memory_bytes": _POOL,
    "engine_seed": ("engine.seed",),
    "backend": ("backend", "engine.*", "hf.*"),
    "dtype": ("dtype",),
    "device": ("device.*",),
    "model": ("model_config_sha256",),
    "workload": ("workload.*",),
    "requests": ("workload.requests",),
    "num_requests": ("workload.requests",),
    "seed": ("workload.seed",),
    "warmup": ("workload.warmup",),
    "repeats": ("workload.repeats",),
    "temperature": ("workload.temperature",),
    "hf_batch": ("hf.batch",),
    "knobs": ("knobs.*",),
    "code": (),
}

# Load runs: the server's settings as `bench load` records them (the flags of the server it started; results
# written before the flags took their fields' names are read with the new names, load_bench).
LOAD_VARIABLES: dict[str, tuple[str, ...]] = {
    **_engine_variables(lambda name: f"server.{flag(name)}"),
    "max_queue": ("server.--max-queue",),
    "server": ("server.*",),
    "rate": ("source.rate",),
    "seed": ("source.seed",),
    "workload": ("source.workload.*",),
    "arrivals": ("source.arrivals", "source.arrivals_sha256"),
    "max_concurrency": ("max_concurrency",),
    "temperature": ("temperature",),
    "model": ("model_config_sha256", "server.--model"),
    "device": ("device.*", "server.--device"),
    "knobs": ("knobs.*",),
    "code": (),
}

# How a run is measured, not what one timed run does: these may differ without being the variable (e.g. a
# slow baseline timed once against three engine repeats); the comparison lists them.
MEASUREMENT_FIELDS: dict[str, tuple[str, ...]] = {
    "offline": ("workload.repeats", "workload.warmup.*"),
    # Load results written before the warm-up's outcome moved out of the config kept it there.
    "load": ("warmup.wall_s", "warmup.failed"),
}

# name -> (per-sample key, label, higher is better): the metrics that have a distribution on each side.
SAMPLED = {
    "offline": {"output_throughput": ("output_throughput", "output tok/s", True),
                "total_token_throughput": ("total_token_throughput", "total tok/s", True),
                "request_throughput": ("request_throughput", "requests/s", True),
                "wall_s": ("wall_s", "wall s", False),
                # Step-timed workloads only (timing: steps, e.g. batch1); absent elsewhere (n 0, no ratio).
                "decode_ms_per_token": ("decode_ms_per_token", "decode ms/token", False)},
    "load": {"e2el_ms": ("e2el_ms", "e2el ms", False),
             "ttft_ms": ("ttft_ms", "ttft ms", False),
             "tpot_ms": ("tpot_ms", "tpot ms", False)},
}
HEADLINE = {"offline": "output_throughput", "load": "e2el_ms"}
SAMPLES_ARE = {"offline": "repeats", "load": "completed requests"}

# (name, path in the result JSON) of what each run measures once: ratios without a spread.
SINGLE: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "offline": (("init_s", ("init_s",)), ("warmup_s", ("warmup_s",)), ("graph_capture_s", ("graph_capture_s",)),
                ("kv_blocks", ("kv_blocks",)), ("peak_memory_bytes", ("peak_memory", "max_bytes"))),
    "load": (("output_throughput", ("metrics", "output_throughput")),
             ("request_throughput", ("metrics", "request_throughput")),
             ("goodput", ("metrics", "goodput")), ("duration_s", ("metrics", "duration_s"))),
}


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """{"engine": {"tp": 1}} -> {"engine.tp": 1}; a null section stays one key."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _covers(patterns: tuple[str, ...], key: str) -> bool:
    for p in patterns:
        if p == key:
            return True
        if p.endswith(".*"):
            section = p[:-2]
            if key == section or key.startswith(section + "."):
                return True
    return False


def variable_fields(variable: str, keys: set[str], kind: str = "offline") -> tuple[str, ...]:
    """The config keys a variable covers; unknown names are refused."""
    names = LOAD_VARIABLES if kind == "load" else VARIABLES
    if variable in names:
        return names[variable]
    if variable in keys:
        return (variable,)
    known = sorted(names) + ["or a config key such as " + ("server.--max-num-seqs" if kind == "load"
                                                           else "engine.max_model_len")]
    raise LabkitError(f"bench compare: unknown --variable {variable!r} for {kind} runs (known: {', '.join(known)})")


def kind_of(data: dict) -> str:
    return "load" if data.get("command") == "bench load" else "offline"


def load_bench(path: str | Path) -> dict:
    """A `labkit bench` or `labkit bench load` result; a load result gets its per-request records as
    data["_records"] (from files.requests, or the .requests.jsonl next to the JSON)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise LabkitError(f"bench compare: cannot read {p}: {e.strerror or e}") from None
    except ValueError as e:
        raise LabkitError(f"bench compare: {p} is not JSON: {e}") from None
    command = str(data.get("command", "")) if isinstance(data, dict) else ""
    if command == "bench load" and isinstance(data.get("config"), dict) and isinstance(data.get("metrics"), dict):
        data["_records"] = _load_records(data, p)
        server = data["config"].get("server")
        if isinstance(server, dict):  # "--budget", "--eager/--graph": the flags' names before they took their fields'
            data["config"]["server"] = {new_flag(k) if k.startswith("--") else k: v for k, v in server.items()}
        return data
    if not command.startswith("bench") or command.startswith("bench compare") \
            or not isinstance(data.get("config"), dict) or not isinstance(data.get("median"), dict):
        raise LabkitError(f"bench compare: {p} is not a `labkit bench` or `labkit bench load` result "
                          "(no command/config/median or metrics)")
    return data


def _load_records(data: dict, path: Path) -> list[dict]:
    recorded = (data.get("files") or {}).get("requests")
    candidates = [Path(recorded)] if recorded else []
    candidates.append(path.with_suffix(".requests.jsonl"))
    for c in candidates:
        if c.is_file():
            try:
                return [json.loads(line) for line in c.read_text(encoding="utf-8").splitlines() if line.strip()]
            except ValueError as e:
                raise LabkitError(f"bench compare: {c} (the per-request records of {path}) is not JSONL: {e}") from None
    raise LabkitError(f"bench compare: {path}: its per-request records are missing (looked for "
                      f"{', '.join(str(c) for c in candidates)}); a load comparison needs them")


def samples(data: dict) -> dict[str, list[float]]:
    """Each sampled metric's values: per timed repeat (offline) or per completed request (load)."""
    kind = kind_of(data)
    rows = ([r for r in data["_records"] if not r.get("error")] if kind == "load" else data.get("runs") or [])
    return {name: [float(r[key]) for r in rows if _num(r.get(key)) is not None]
            for name, (key, _, _) in SAMPLED[kind].items()}


def comparable_config(data: dict) -> dict:
    """What must match between the two runs: the recorded config and the engine knobs set (LABKIT_DECODE_* ...;
    results from before they were recorded read as none set); a load run adds its model and device."""
    knobs = {"knobs": data["knobs"]} if data.get("knobs") else {}
    if kind_of(data) == "offline":
        return {**data["config"], **knobs}
    model, dev = data.get("model") or {}, data.get("device") or {}
    return {**data["config"], **knobs, "model_config_sha256": model.get("config_sha256"),
            "device": {"type": dev.get("type"), "name": dev.get("name")}}


def _get(d: dict, path: tuple[str, ...]) -> Any:
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def ratio(a: Any, b: Any) -> float | None:
    a, b = _num(a), _num(b)
    if a is None or b is None or a == 0:
        return None
    return b / a


def _fmt(v: Any) -> str:
    return json.dumps(v, default=str) if not isinstance(v, str) else v


# ------------------------------------------------------------------------------------------------
# Spread and the interval of the ratio


def spread(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "min": None, "median": None, "max": None}
    a = np.asarray(values, dtype=float)
    return {"n": int(a.size), "min": float(a.min()), "median": float(np.median(a)), "max": float(a.max())}


def ratio_interval(a: list[float], b: list[float], resamples: int = BOOTSTRAP_RESAMPLES,
                   seed: int = BOOTSTRAP_SEED, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Percentile bootstrap interval of median(b) / median(a); None when a side has fewer than 2 samples."""
    if len(a) < 2 or len(b) < 2:
        return None
    rng = np.random.default_rng(seed)
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ratios = []
    for start in range(0, resamples, 1000):  # bounded memory for load runs of many requests
        n = min(1000, resamples - start)
        ma = np.median(xa[rng.integers(0, xa.size, size=(n, xa.size))], axis=1)
        mb = np.median(xb[rng.integers(0, xb.size, size=(n, xb.size))], axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios.append(mb / ma)
    r = np.concatenate(ratios)
    r = r[np.isfinite(r)]
    if r.size == 0:
        return None
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(r, [tail, 100 - tail])
    return float(lo), float(hi)


def sampled_metric(a: list[float], b: list[float], label: str, higher_is_better: bool) -> dict:
    sa, sb = spread(a), spread(b)
    r = ratio(sa["median"], sb["median"])
    iv = ratio_interval(a, b)
    within = None if iv is None else bool(iv[0] <= 1.0 <= iv[1])
    return {"label": label, "higher_is_better": higher_is_better, "a": sa, "b": sb, "ratio": r,
            "interval": None if iv is None else list(iv), "within_noise": within,
            "text": ratio_text(r, iv, sa["n"], sb["n"], sa["median"], sb["median"])}


def ratio_text(r: float | None, iv: tuple[float, float] | None, na: int, nb: int, median_a: float | None = None,
               median_b: float | None = None) -> str:
    """The B/A ratio as it may be said: never a bare ratio inside the noise, and where there is none, why."""
    if r is None:
        if not na or not nb:
            return f"no ratio: {'A' if not na else 'B'} has no samples"
        if median_a == 0:
            return "no ratio: A's median is 0" + ("" if median_b is None else f" (B's {median_b:g})")
        return "n/a"
    if iv is None:
        return f"{r:.3f}x with no interval ({na} vs {nb} samples: a single sample shows no spread)"
    pct = f"{CONFIDENCE * 100:g}%"
    if iv[0] <= 1.0 <= iv[1]:
        return f"within noise ({pct} interval of the ratio {iv[0]:.3f}x to {iv[1]:.3f}x holds 1.0)"
    return f"{r:.3f}x ({pct} interval {iv[0]:.3f}x to {iv[1]:.3f}x)"


# ------------------------------------------------------------------------------------------------


def compare(a: dict, b: dict, variable: str, a_name: str = "A", b_name: str = "B",
            allow_single: bool = False) -> dict:
    """The comparison record; raises LabkitError when the runs are not comparable or a side has one sample
    (unless allow_single)."""
    kind = kind_of(a)
    if kind_of(b) != kind:
        what = {"offline": "an offline `labkit bench` result", "load": "a `labkit bench load` result"}
        raise LabkitError(f"bench compare: {a_name} is {what[kind]} and {b_name} is {what[kind_of(b)]}: compare "
                          "offline runs with offline runs, load runs with load runs")
    fa, fb = flatten(comparable_config(a)), flatten(comparable_config(b))
    keys = set(fa) | set(fb)
    patterns = variable_fields(variable, keys, kind)
    differing = sorted(k for k in keys if fa.get(k) != fb.get(k))
    measured_how = MEASUREMENT_FIELDS[kind]
    measurement = [k for k in differing if not _covers(patterns, k) and _covers(measured_how, k)]
    outside = [k for k in differing if not _covers(patterns, k) and k not in measurement]
    if outside:
        shown = "; ".join(f"{k} ({_fmt(fa.get(k))} vs {_fmt(fb.get(k))})" for k in outside[:8])
        more = f"; and {len(outside) - 8} more" if len(outside) > 8 else ""
        raise LabkitError(f"bench compare: {a_name} and {b_name} differ in more than --variable {variable}: "
                          f"{shown}{more}")
    sa, sb = samples(a), samples(b)
    head = HEADLINE[kind]
    unit = {"offline": ("repeat", "rerun with --repeats 3 or more"),
            "load": ("completed request", "send more requests")}
    for name, n in ((a_name, len(sa[head])), (b_name, len(sb[head]))):
        if n < 2 and not allow_single:
            raise LabkitError(f"bench compare: {name} has {n} {unit[kind][0]}{'' if n == 1 else 's'}: one sample shows "
                              f"no spread, so a ratio cannot be told from noise; {unit[kind][1]}, or pass "
                              "--allow-single")
    metrics = {name: sampled_metric(sa[name], sb[name], label, better)
               for name, (_, label, better) in SAMPLED[kind].items()}
    single = {}
    for name, path in SINGLE[kind]:
        va, vb = _get(a, path), _get(b, path)
        single[name] = {"a": va, "b": vb, "ratio": ratio(va, vb)}
    h = metrics[head]
    covered = [k for k in differing if _covers(patterns, k)] or sorted(k for k in keys if _covers(patterns, k))
    inside = [k for k in differing if _covers(patterns, k)]
    return {
        "kind": kind,
        "variable": variable,
        "fields": list(patterns),
        "differing": inside,
        "same_value": not inside,
        "values": {"a": {k: fa.get(k) for k in covered}, "b": {k: fb.get(k) for k in covered}},
        "measurement_differs": {k: {"a": fa.get(k), "b": fb.get(k)} for k in measurement},
        "samples_are": SAMPLES_ARE[kind],
        "headline_metric": head,
        "ratio": h["ratio"],
        "ratio_of": f"B/A of median {h['label']} over the {SAMPLES_ARE[kind]}",
        "interval": h["interval"],
        "within_noise": h["within_noise"],
        "single_sample": h["interval"] is None,
        "headline": f"B/A median {h['label']}: {h['text']}",
        "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED, "confidence": CONFIDENCE,
                      "method": "percentile bootstrap of the ratio of medians, each side resampled independently"},
        "metrics": metrics,
        "single_measurements": single,
    }


def weakest_evidence(*runs: dict) -> str:
    """gpu-measured only when both are; otherwise the weaker kind of the two."""
    ranks = [EVIDENCE_KINDS.index(r["evidence"]) if r.get("evidence") in EVIDENCE_KINDS else len(EVIDENCE_KINDS) - 1
             for r in runs]
    return EVIDENCE_KINDS[max(ranks)]


def side(data: dict, path: str | Path) -> dict:
    """What the comparison JSON keeps of each input."""
    out = {
        "file": str(Path(path).resolve()),
        "command": data.get("command"),
        "config": data["config"],
        "evidence": data.get("evidence"),
        "device": data.get("device"),
        "model": data.get("model"),
        "git_head": data.get("git_head"),
        "git_dirty": data.get("git_dirty"),
        "versions": data.get("versions"),
        "execution": data.get("execution"),
        "started_at": data.get("started_at"),
    }
    if kind_of(data) == "offline":
        out["median"] = data.get("median")
        out["runs"] = [{k: r.get(k) for k in ("repeat", "output_tokens", "wall_s", "output_throughput",
                                              "total_token_throughput")} for r in data.get("runs") or []]
    else:
        out["metrics"] = {k: v for k, v in (data.get("metrics") or {}).items() if k != "errors"}
        out["requests_file"] = (data.get("files") or {}).get("requests")
    return out


def _spread_text(s: dict) -> str:
    if not s["n"]:
        return "-"
    return f"{_short(s['min'])} / {_short(s['median'])} / {_short(s['max'])} (n {s['n']})"


def markdown(result: dict) -> str:
    a, b = result["a"], result["b"]
    lines = [
        f"# labkit bench compare: --variable {result['variable']} ({result['kind']} runs)",
        "",
        f"- A: `{a['file']}`",
        f"- B: `{b['file']}`",
        f"- evidence: {result['evidence']}",
        f"- **{result['headline']}**",
        f"- samples: the {result['samples_are']}; interval: {result['bootstrap']['method']}, "
        f"{result['bootstrap']['resamples']} resamples, seed {result['bootstrap']['seed']}",
        "",
        "| variable field | A | B |",
        "| --- | --- | --- |",
    ]
    for k in result["values"]["a"]:
        lines.append(f"| {k} | {_fmt(result['values']['a'][k])} | {_fmt(result['values']['b'][k])} |")
    for k, v in (result.get("measurement_differs") or {}).items():
        lines.append(f"| {k} (measurement, not the variable) | {_fmt(v['a'])} | {_fmt(v['b'])} |")
    if result["same_value"]:
        lines += ["", "The variable has the same value in both runs (a repeat, or a code change)."]
    lines += ["", "| metric | A min / median / max | B min / median / max | B/A of medians |",
              "| --- | --- | --- | --- |"]
    for m in result["metrics"].values():
        lines.append(f"| {m['label']} | {_spread_text(m['a'])} | {_spread_text(m['b'])} | {m['text']} |")
    lines += ["", "Measured once per run (no spread, so no interval):", "", "| figure | A | B | B/A |",
              "| --- | --- | --- | --- |"]
    for name, m in result["single_measurements"].items():
        rr = "-" if m["ratio"] is None else f"{m['ratio']:.3f} (one measurement each)"
        lines.append(f"| {name} | {_short(m['a'])} | {_short(m['b'])} | {rr} |")
    lines += ["", "| | A | B |", "| --- | --- | --- |",
              f"| git head | {a.get('git_head')} | {b.get('git_head')} |",
              f"| execution | {a.get('execution')} | {b.get('execution')} |",
              f"| device | {(a.get('device') or {}).get('name')} | {(b.get('device') or {}).get('name')} |"]
    lines += ["", "## Configs", "", "A:", "", "```json", json.dumps(a["config"], indent=2), "```", "",
              "B:", "", "```json", json.dumps(b["config"], indent=2), "```", ""]
    return "\n".join(lines)


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return "-" if v is None else str(v)
