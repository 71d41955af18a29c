"""`labkit bench compare A.json B.json --variable NAME`: B/A ratios of two bench runs.

Two runs are comparable when their recorded `config` (workload name and parameters, model config
sha256, device type and name, dtype, backend, engine kwargs or HF settings) is identical except
for the fields the named variable covers. Anything else differing is refused (LabkitError, exit
2, one line naming the fields): a ratio across two changes measures neither. The comparison
reports, it does not judge: exit 0 whatever the ratio.

Variables: a short name (eager, tp, backend, attention, policy, block_size, budget, ...; see
VARIABLES) or any flattened config key itself (e.g. engine.max_model_len, workload.seed).
`code` covers no config field: use it to compare two commits on identical settings.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from labkit.errors import LabkitError
from labkit.output import EVIDENCE_KINDS

# Short names -> flattened config keys (a trailing ".*" covers a whole section).
VARIABLES: dict[str, tuple[str, ...]] = {
    "eager": ("engine.enforce_eager",),
    "graph": ("engine.enforce_eager",),
    "enforce_eager": ("engine.enforce_eager",),
    "tp": ("engine.tensor_parallel_size",),
    "tensor_parallel_size": ("engine.tensor_parallel_size",),
    "backend": ("backend", "engine.*", "hf.*"),
    "attention": ("engine.attention_backend",),
    "attention_backend": ("engine.attention_backend",),
    "policy": ("engine.scheduling_policy",),
    "scheduling_policy": ("engine.scheduling_policy",),
    "block_size": ("engine.kvcache_block_size",),
    "kvcache_block_size": ("engine.kvcache_block_size",),
    "max_num_seqs": ("engine.max_num_seqs",),
    "budget": ("engine.max_num_batched_tokens",),
    "max_num_batched_tokens": ("engine.max_num_batched_tokens",),
    "max_model_len": ("engine.max_model_len",),
    "gpu_memory_utilization": ("engine.gpu_memory_utilization",),
    "num_blocks": ("engine.num_kvcache_blocks", "engine.kvcache_memory_bytes"),
    "num_kvcache_blocks": ("engine.num_kvcache_blocks", "engine.kvcache_memory_bytes"),
    "kvcache_memory_bytes": ("engine.num_kvcache_blocks", "engine.kvcache_memory_bytes"),
    "engine_seed": ("engine.seed",),
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
    "code": (),
}

# How a run is measured, not what one timed run does: these may differ without being the variable (e.g. a
# slow baseline timed once against three engine repeats); the comparison lists them.
MEASUREMENT_FIELDS: tuple[str, ...] = ("workload.repeats", "workload.warmup.*")

# (name, path in the bench JSON) of the metrics whose B/A ratio is reported.
METRICS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("output_throughput", ("median", "output_throughput")),
    ("total_token_throughput", ("median", "total_token_throughput")),
    ("request_throughput", ("median", "request_throughput")),
    ("wall_s", ("median", "wall_s")),
    ("init_s", ("init_s",)),
    ("warmup_s", ("warmup_s",)),
    ("graph_capture_s", ("graph_capture_s",)),
    ("kv_blocks", ("kv_blocks",)),
    ("peak_memory_bytes", ("peak_memory", "max_bytes")),
)


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


def variable_fields(variable: str, keys: set[str]) -> tuple[str, ...]:
    """The config keys a variable covers; unknown names are refused."""
    if variable in VARIABLES:
        return VARIABLES[variable]
    if variable in keys:
        return (variable,)
    known = sorted(VARIABLES) + ["or a config key such as engine.max_model_len"]
    raise LabkitError(f"bench compare: unknown --variable {variable!r} (known: {', '.join(known)})")


def load_bench(path: str | Path) -> dict:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise LabkitError(f"bench compare: cannot read {p}: {e.strerror or e}") from None
    except ValueError as e:
        raise LabkitError(f"bench compare: {p} is not JSON: {e}") from None
    if not isinstance(data, dict) or not str(data.get("command", "")).startswith("bench") \
            or not isinstance(data.get("config"), dict) or not isinstance(data.get("median"), dict):
        raise LabkitError(f"bench compare: {p} is not a `labkit bench` result (no command/config/median)")
    return data


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


def compare(a: dict, b: dict, variable: str, a_name: str = "A", b_name: str = "B") -> dict:
    """The comparison record; raises LabkitError when the configs differ beyond the variable."""
    fa, fb = flatten(a["config"]), flatten(b["config"])
    keys = set(fa) | set(fb)
    patterns = variable_fields(variable, keys)
    differing = sorted(k for k in keys if fa.get(k) != fb.get(k))
    measurement = [k for k in differing if not _covers(patterns, k) and _covers(MEASUREMENT_FIELDS, k)]
    outside = [k for k in differing if not _covers(patterns, k) and k not in measurement]
    if outside:
        shown = "; ".join(f"{k} ({_fmt(fa.get(k))} vs {_fmt(fb.get(k))})" for k in outside[:8])
        more = f"; and {len(outside) - 8} more" if len(outside) > 8 else ""
        raise LabkitError(f"bench compare: {a_name} and {b_name} differ in more than --variable {variable}: "
                          f"{shown}{more}")
    inside = [k for k in differing if _covers(patterns, k)]
    metrics = {}
    for name, path in METRICS:
        va, vb = _get(a, path), _get(b, path)
        metrics[name] = {"a": va, "b": vb, "ratio": ratio(va, vb)}
    # Show what differs; when nothing does (a repeat, or --variable code), every covered key.
    covered = inside or sorted(k for k in keys if _covers(patterns, k))
    return {
        "variable": variable,
        "fields": list(patterns),
        "differing": inside,
        "same_value": not inside,
        "values": {"a": {k: fa.get(k) for k in covered}, "b": {k: fb.get(k) for k in covered}},
        "measurement_differs": {k: {"a": fa.get(k), "b": fb.get(k)} for k in measurement},
        "ratio": metrics["output_throughput"]["ratio"],
        "ratio_of": "B/A of median output_throughput (output tok/s)",
        "metrics": metrics,
    }


def weakest_evidence(*runs: dict) -> str:
    """gpu-measured only when both are; otherwise the weaker kind of the two."""
    ranks = [EVIDENCE_KINDS.index(r["evidence"]) if r.get("evidence") in EVIDENCE_KINDS else len(EVIDENCE_KINDS) - 1
             for r in runs]
    return EVIDENCE_KINDS[max(ranks)]


def side(data: dict, path: str | Path) -> dict:
    """What the comparison JSON keeps of each input."""
    return {
        "file": str(Path(path).resolve()),
        "config": data["config"],
        "evidence": data.get("evidence"),
        "device": data.get("device"),
        "model": data.get("model"),
        "git_head": data.get("git_head"),
        "git_dirty": data.get("git_dirty"),
        "versions": data.get("versions"),
        "execution": data.get("execution"),
        "started_at": data.get("started_at"),
        "median": data.get("median"),
        "runs": [{k: r.get(k) for k in ("repeat", "output_tokens", "wall_s", "output_throughput",
                                        "total_token_throughput")} for r in data.get("runs") or []],
    }


def markdown(result: dict) -> str:
    a, b = result["a"], result["b"]
    r = result["ratio"]
    lines = [
        f"# labkit bench compare: --variable {result['variable']}",
        "",
        f"- A: `{a['file']}`",
        f"- B: `{b['file']}`",
        f"- evidence: {result['evidence']}",
        f"- **B/A median output throughput: {r:.3f}x**" if r is not None else "- B/A ratio: n/a",
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
    lines += ["", "| metric | A | B | B/A |", "| --- | --- | --- | --- |"]
    for name, m in result["metrics"].items():
        rr = "-" if m["ratio"] is None else f"{m['ratio']:.3f}"
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
