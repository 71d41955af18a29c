"""Collectors: walk a suite's fixed token path and keep each accepted step's last-position logits.

engine: the real Scheduler, BlockManager, ModelRunner and paged KV cache. The sampler is replaced by
    the teacher-forcing strategy (`llm.sampling = TeacherForcing(choose)`, engine/sampler.py): the
    engine hands us each sampling row's logits (a row whose tokens reach the end of its sequence; a
    chunk samples nothing) with the step's BatchPlan, and we return the request's next forced token,
    which the commit accepts. The code path of every step (eager call or graph replay, and the bucket)
    is read from the StepResult's inputs.
hf: transformers' Qwen3ForCausalLM recomputes the whole prefix for every row (use_cache=False,
    attn_implementation="eager"): no KV cache, no paging, no scheduler. A suite with hf_one_forward (fp8-kv)
    computes each request's rows in one causal forward over its whole path instead: the same function.
    kv_cache_dtype fp8: K and V go through the e4m3 round trip before attention (labkit/logits/hf_fp8.py).

A collection is PREFIX.json (inputs, token path, config, versions, model and weight hashes, rows
and steps with their code path) plus PREFIX.npz (`logits` [rows, vocab] float32; the kv suite adds
`kv_k`/`kv_v` [tokens, layers, kv_heads, head_dim] float32 with `kv_request`, `kv_position`,
`kv_step`, `kv_case` per token: the engine's as written at each step, Transformers' from one cached
forward over each request's whole path, step -1).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from labkit.errors import LabkitError
from labkit.logits.suites import KV_CACHE_DTYPES, Suite, is_fp8, path_sha256, row_keys, token_path
from labkit.output import envelope, evidence_for, file_mode, finish, write_json

SCHEMA = 1


@dataclass
class Collection:
    meta: dict
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def rows(self) -> list[dict]:
        return self.meta["rows"]


# ------------------------------------------------------------------------------------------------
# Provenance


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


@functools.lru_cache(maxsize=64)
def _cached_sha(path: str, size: int, mtime_ns: int) -> str:
    return _sha256_file(Path(path))


def model_hashes(model_dir: str | Path) -> dict[str, str]:
    """sha256 of config.json and of every *.safetensors (the weights actually loaded)."""
    model_dir = Path(model_dir)
    files = [model_dir / "config.json"] + sorted(model_dir.glob("*.safetensors"))
    out = {}
    for f in files:
        st = f.stat()
        out[f.name] = _cached_sha(str(f.resolve()), st.st_size, st.st_mtime_ns)
    return out


def engine_source() -> dict:
    """Where the imported engine lives and a hash of its sources (which code produced the rows)."""
    import engine

    root = Path(engine.__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return {"path": str(root), "sources_sha256": h.hexdigest()}


def _vocab_size(model_dir: Path) -> int:
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
        return int(cfg["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LabkitError(f"model {model_dir}: cannot read vocab_size from config.json: {exc}") from exc


def _config_dtype(model_dir: Path) -> str:
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return "float32"
    d = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    return d if d in ("float32", "bfloat16", "float16") else "float32"


def _base_meta(suite: Suite, backend: str, model_dir: Path, device: str, seed: int, path: dict) -> dict:
    env = envelope(f"logits-check collect --backend {backend}", device=device, model_dir=model_dir,
                   evidence=evidence_for(device))
    return {
        **env,
        "kind": "logits-collection",
        "schema": SCHEMA,
        "backend": backend,
        "suite": suite.describe(),
        "seed": int(seed),
        "model_files": model_hashes(model_dir),
        "inputs": path,
        "token_path_sha256": path_sha256(path),
    }


def _row_meta(index: int, rid: str, k: int, path: dict, **extra) -> dict:
    return {"index": index, "request_id": rid, "output_index": k, "case": path[rid]["case"],
            "context_len": len(path[rid]["prompt"]) + k, **extra}


# ------------------------------------------------------------------------------------------------
# Engine


def _engine_error(exc: Exception, tp: int) -> LabkitError:
    msg = " ".join(str(exc).split())
    if tp > 1 and "tensor_parallel_size" in msg:
        return LabkitError(f"--tensor-parallel-size {tp}: {msg}", code=2)
    return LabkitError(f"engine: {msg}", code=2)


def collect_engine(suite: Suite, model_dir: str | Path, *, device: str = "cpu", dtype: str = "auto",
                   execution: str = "eager", attention: str = "auto", tp: int = 1, seed: int = 0,
                   kv_cache_dtype: str = "auto", progress: Callable[[str], None] | None = None) -> Collection:
    """Run every case of `suite` through the engine with forced tokens; one row per accepted step."""
    from engine import LLM, SamplingParams
    from engine.sampler import TeacherForcing

    if execution not in ("eager", "graph"):
        raise LabkitError(f"--execution must be eager or graph, not {execution!r}")
    model_dir = Path(model_dir)
    path = token_path(suite, _vocab_size(model_dir), seed)
    meta = _base_meta(suite, "engine", model_dir, device, seed, path)
    meta["requested"] = {"execution": execution, "attention": attention, "tp": tp, "dtype": dtype, "device": device,
                         "kv_cache_dtype": kv_cache_dtype}
    meta["engine_source"] = engine_source()
    rows: list[dict] = []
    logits_rows: list[np.ndarray] = []
    steps: list[dict] = []
    kv = {"k": [], "v": [], "request": [], "position": [], "step": [], "case": []}
    request_index = {rid: i for i, rid in enumerate(path)}
    case_configs = []
    runner_facts: dict[str, Any] = {}
    t0 = time.perf_counter()

    for case_no, case in enumerate(suite.cases):
        kwargs = {**case.engine_kwargs(), "device": device, "dtype": dtype, "attention_backend": attention,
                  "enforce_eager": execution == "eager", "tensor_parallel_size": tp, "kv_cache_dtype": kv_cache_dtype}
        try:
            llm = LLM(str(model_dir), **kwargs)
        except ValueError as exc:
            raise _engine_error(exc, tp) from exc
        try:
            facts = {"execution": llm.execution, "attention_backend": llm.attention_backend,
                     "dtype": str(llm.dtype).replace("torch.", ""), "device": str(llm.device),
                     "kv_cache_dtype": llm.config.kv_cache_dtype}
            if runner_facts and facts != runner_facts:
                raise RuntimeError(f"engine setting changed between cases: {runner_facts} vs {facts}")
            runner_facts = facts
            cfg = {k: v for k, v in vars(llm.config).items() if k not in ("tracer", "hf_config", "model")}
            case_configs.append({"case": case.name, "config": cfg})

            seen: dict = {}

            def choose(plan, logits, seen=seen):
                seen["plan"], seen["logits"] = plan, logits.detach().float().cpu()
                chosen = []
                for i in plan.sample_rows:
                    rid = plan.request_ids[i]
                    chosen.append(path[rid]["continuation"][plan.num_tokens[i] - len(path[rid]["prompt"])])
                return chosen

            def record_step(result, _case=case, _case_no=case_no, seen=seen, llm=llm):
                plan, host = seen.pop("plan"), seen.pop("logits")
                step, phase, inputs = result.step, result.phase, result.inputs
                record = {"case": _case.name, "step": step, "phase": phase, "num_seqs": len(plan),
                          "num_input_ids": len(inputs.input_ids), "execution": inputs.execution,
                          "graph_batch": inputs.graph_batch, "seqs": []}
                at = 0
                sampled = iter(range(len(plan.sample_rows)))
                for rid, start, n, total, ok in zip(plan.request_ids, plan.starts, plan.num_new, plan.num_tokens,
                                                    plan.samples):
                    p = path[rid]
                    record["seqs"].append({"request_id": rid, "num_tokens": total, "num_cached_tokens": start,
                                           "num_scheduled_tokens": n, "row": ok})
                    if plan.input_ids[at:at + n] != (p["prompt"] + p["continuation"])[start:start + n]:
                        raise RuntimeError(f"{rid}: the engine's input ids left the forced path at step {step}")
                    at += n
                    if ok:
                        k = total - len(p["prompt"])
                        rows.append(_row_meta(len(rows), rid, k, path, step=step, phase=phase, cached_tokens=start,
                                              scheduled_tokens=n, batch=len(plan), execution=inputs.execution,
                                              graph_batch=inputs.graph_batch))
                        logits_rows.append(host[next(sampled)].numpy().copy())
                if suite.record_kv:
                    _read_kv(llm, inputs, plan, kv, request_index, step, _case_no)
                steps.append(record)

            llm.sampling = TeacherForcing(choose)
            _drive(llm, case, path, record_step, SamplingParams)
        finally:
            llm.exit()
        if progress:
            progress(f"{case.name}: {sum(r['case'] == case.name for r in rows)} rows")

    _check_rows(suite, rows)
    meta.update(
        dtype=runner_facts.get("dtype"),
        kv_cache_dtype=runner_facts.get("kv_cache_dtype"),
        device_used=runner_facts.get("device"),
        config={"execution": execution, "attention_backend": runner_facts.get("attention_backend"),
                "tensor_parallel_size": tp, "dtype": runner_facts.get("dtype"),
                "kv_cache_dtype": runner_facts.get("kv_cache_dtype"), "runner": runner_facts,
                "cases": case_configs},
        rows=rows,
        steps=steps,
        code_path=_code_path_summary(steps),
        wall_s=round(time.perf_counter() - t0, 3),
        status="COLLECTED",
    )
    arrays = {"logits": np.stack(logits_rows).astype(np.float32)}
    if suite.record_kv:
        arrays.update(
            kv_k=np.concatenate(kv["k"]).astype(np.float32), kv_v=np.concatenate(kv["v"]).astype(np.float32),
            kv_request=np.asarray(kv["request"], dtype=np.int32),
            kv_position=np.asarray(kv["position"], dtype=np.int32),
            kv_step=np.asarray(kv["step"], dtype=np.int32), kv_case=np.asarray(kv["case"], dtype=np.int32))
        meta["kv"] = {"tokens": int(arrays["kv_k"].shape[0]), "shape": list(arrays["kv_k"].shape[1:]),
                      "layout": "[token, layer, kv_head, head_dim]",
                      "requests": list(request_index), "cases": [c.name for c in suite.cases]}
    return Collection(meta, arrays)


def _drive(llm, case, path, on_step, SamplingParams) -> None:
    """Submit the case's requests (an `after` request once its predecessor finished) and step to the end,
    handing each StepResult to `on_step`."""
    pending = list(case.requests)
    finished: set[str] = set()  # request ids, from the steps' StepResults

    def submit_ready():
        for r in list(pending):
            if r.after is None or r.after in finished:
                p = path[r.id]
                sp = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
                try:
                    llm.add_request(list(p["prompt"]), sp, request_id=r.id)
                except ValueError as exc:
                    raise LabkitError(f"engine: request {r.id}: {' '.join(str(exc).split())}", code=2) from exc
                pending.remove(r)

    submit_ready()
    while not llm.is_finished() or pending:
        if llm.is_finished():
            before = len(pending)
            submit_ready()
            if len(pending) == before:
                raise RuntimeError(f"case {case.name}: requests {[r.id for r in pending]} can never be submitted")
            continue
        result = llm.step()
        on_step(result)
        finished.update(s.request_id for s in result.finished)
        submit_ready()


def _read_kv(llm, inputs, plan, kv: dict, request_index: dict, step: int, case_no: int) -> None:
    """The K and V every layer wrote this step: the pool read at the step's slot_mapping."""
    slots = inputs.slot_mapping
    positions = inputs.positions
    owners = [rid for rid, n in zip(plan.request_ids, plan.num_new) for _ in range(n)]
    if not (len(slots) == len(positions) == len(owners)):
        raise RuntimeError(f"step {step}: slot_mapping ({len(slots)}), positions ({len(positions)}) and "
                           f"sequences ({len(owners)}) do not line up")
    rows = llm.read_kv(slots)  # [2, layers, n, kv, d]
    for which, key in ((0, "k"), (1, "v")):
        kv[key].append(rows[which].transpose(0, 1).float().cpu().numpy())
    kv["request"] += [request_index[o] for o in owners]
    kv["position"] += list(positions)
    kv["step"] += [step] * len(slots)
    kv["case"] += [case_no] * len(slots)


def _check_rows(suite: Suite, rows: list[dict]) -> None:
    got = [(r["request_id"], r["output_index"]) for r in rows]
    want = row_keys(suite)
    if sorted(got) != sorted(want):
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        raise RuntimeError(f"suite {suite.name}: expected {len(want)} rows, got {len(got)} "
                           f"(missing {missing[:4]}, unexpected {extra[:4]})")


def _code_path_summary(steps: list[dict]) -> dict:
    out: dict[str, int] = {}
    for s in steps:
        key = s["execution"] if s["execution"] != "graph" else f"graph(bucket {s['graph_batch']})"
        key = f"{s['phase']} {key}"
        out[key] = out.get(key, 0) + 1
    return out


# ------------------------------------------------------------------------------------------------
# Transformers


_TORCH_DTYPES = ("float32", "bfloat16", "float16")


def load_hf(model_dir: str | Path, dtype: str, device: str, attn_implementation: str = "eager"):
    import torch
    import transformers
    from transformers import Qwen3ForCausalLM

    try:
        transformers.utils.logging.disable_progress_bar()
    except Exception:  # pragma: no cover - older transformers
        pass
    tdtype = getattr(torch, dtype)
    major_minor = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
    kw = {"dtype": tdtype} if major_minor >= (4, 56) else {"torch_dtype": tdtype}
    try:
        model = Qwen3ForCausalLM.from_pretrained(str(model_dir), attn_implementation=attn_implementation, **kw)
    except Exception as exc:
        raise LabkitError(f"hf: cannot load {model_dir} with transformers: {' '.join(str(exc).split())}") from exc
    return model.to(device).eval()


def collect_hf(suite: Suite, model_dir: str | Path, *, device: str = "cpu", dtype: str = "auto", seed: int = 0,
               kv_cache_dtype: str = "auto", model=None, progress: Callable[[str], None] | None = None) -> Collection:
    """Recompute every row from scratch with transformers (whole prefix, no cache, eager attention; one forward
    per request where the suite says hf_one_forward). kv_cache_dtype fp8: K/V round-tripped through e4m3 before
    attention (labkit/logits/hf_fp8.py); `model`, when given, must have been loaded to match."""
    import torch

    from labkit.logits import hf_fp8

    model_dir = Path(model_dir)
    dtype = _config_dtype(model_dir) if dtype == "auto" else dtype
    if dtype not in _TORCH_DTYPES:
        raise LabkitError(f"--dtype must be auto, {', '.join(_TORCH_DTYPES)}; not {dtype!r}")
    fp8 = is_fp8(kv_cache_dtype)
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise LabkitError(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, not {kv_cache_dtype!r}")
    path = token_path(suite, _vocab_size(model_dir), seed)
    meta = _base_meta(suite, "hf", model_dir, device, seed, path)
    meta["requested"] = {"dtype": dtype, "device": device, "kv_cache_dtype": kv_cache_dtype}
    t0 = time.perf_counter()
    attn = hf_fp8.register() if fp8 else "eager"
    if model is None:
        model = load_hf(model_dir, dtype, device, attn)
    import transformers

    rows, logits_rows = [], []
    kv = {"k": [], "v": [], "request": [], "position": [], "case": []}
    request_index = {rid: i for i, rid in enumerate(path)}
    with torch.inference_mode(), _strict_float32():
        for case_no, case in enumerate(suite.cases):
            for r in case.requests:
                p = path[r.id]
                if suite.hf_one_forward:  # row k = the logits at position len(prompt) - 1 + k of the whole path
                    ids = torch.tensor([p["prompt"] + p["continuation"][:r.max_tokens - 1]], device=device)
                    out = model(input_ids=ids, use_cache=False, logits_to_keep=r.max_tokens)
                    for k in range(r.max_tokens):
                        logits_rows.append(out.logits[0, k].float().cpu().numpy().copy())
                        rows.append(_row_meta(len(rows), r.id, k, path, execution="hf-one-forward"))
                    continue
                for k in range(r.max_tokens):
                    ids = torch.tensor([p["prompt"] + p["continuation"][:k]], device=device)
                    out = model(input_ids=ids, use_cache=False, logits_to_keep=1)
                    logits_rows.append(out.logits[0, -1].float().cpu().numpy().copy())
                    rows.append(_row_meta(len(rows), r.id, k, path, execution="hf-full-recompute"))
                if suite.record_kv:
                    _hf_kv(model, p["prompt"] + p["continuation"][:r.max_tokens - 1], device, kv)
                    n = len(p["prompt"]) + r.max_tokens - 1
                    kv["request"] += [request_index[r.id]] * n
                    kv["position"] += list(range(n))
                    kv["case"] += [case_no] * n
            if progress:
                progress(f"{case.name}: {case.rows} rows")
    _check_rows(suite, rows)
    meta.update(
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        device_used=str(device),
        config={"implementation": f"transformers {transformers.__version__} Qwen3ForCausalLM",
                "attn_implementation": attn, "use_cache": False, "dtype": dtype, "tensor_parallel_size": 1,
                "kv_cache_dtype": kv_cache_dtype, "kv_quantization": hf_fp8.describe() if fp8 else None,
                "rows": "one forward per request" if suite.hf_one_forward else "one forward per row",
                "float32_matmul": "highest (no TF32), whatever the process had set"},
        rows=rows,
        steps=[],
        code_path={"hf one forward per request" if suite.hf_one_forward else "hf full recompute": len(rows)},
        wall_s=round(time.perf_counter() - t0, 3),
        status="COLLECTED",
    )
    arrays = {"logits": np.stack(logits_rows).astype(np.float32)}
    if suite.record_kv:
        # The engine's layout; each position once, at step -1 (Transformers has no steps).
        arrays.update(kv_k=np.concatenate(kv["k"]), kv_v=np.concatenate(kv["v"]),
                      kv_request=np.asarray(kv["request"], dtype=np.int32),
                      kv_position=np.asarray(kv["position"], dtype=np.int32),
                      kv_step=np.full(len(kv["position"]), -1, dtype=np.int32),
                      kv_case=np.asarray(kv["case"], dtype=np.int32))
        meta["kv"] = {"tokens": int(arrays["kv_k"].shape[0]), "shape": list(arrays["kv_k"].shape[1:]),
                      "layout": "[token, layer, kv_head, head_dim]", "source": "transformers cache, one forward",
                      "requests": list(request_index), "cases": [c.name for c in suite.cases]}
    return Collection(meta, arrays)


@contextlib.contextmanager
def _strict_float32():
    """float32 matmuls and convolutions in full float32 (no TF32) while Transformers computes: a float32 truth
    must not inherit a reduced precision that something else in the process (a benchmark, the engine) chose."""
    import torch

    before = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
              torch.backends.cudnn.allow_tf32)
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        # The flags first, the precision last: under "medium", setting cuda.matmul.allow_tf32 after the precision
        # leaves torch in a mixed state whose get_float32_matmul_precision() raises (torch 2.13 here), and so the next
        # collection with it.
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[1], before[2]
        torch.set_float32_matmul_precision(before[0])


def _hf_kv(model, ids: list[int], device, kv: dict) -> None:
    """The K and V (after q/k norm and RoPE, as the engine stores them) of every position of `ids`, from one
    forward with Transformers' cache, appended to kv["k"] / kv["v"] as [tokens, layers, kv_heads, head_dim]."""
    import torch

    out = model(input_ids=torch.tensor([ids], device=device), use_cache=True, logits_to_keep=1)
    cache = out["cache"] if "cache" in out else out["past_key_values"]
    if hasattr(cache, "layers"):
        pairs = [(layer.keys, layer.values) for layer in cache.layers]
    elif hasattr(cache, "key_cache"):
        pairs = list(zip(cache.key_cache, cache.value_cache))
    else:
        pairs = [(k, v) for k, v in cache]
    for which, key in ((0, "k"), (1, "v")):
        stacked = torch.stack([pair[which][0] for pair in pairs])  # [layers, kv_heads, tokens, head_dim]
        kv[key].append(stacked.permute(2, 0, 1, 3).float().cpu().numpy())


# ------------------------------------------------------------------------------------------------
# Files


def prefix_of(path: str | Path) -> Path:
    """PREFIX from PREFIX, PREFIX.json or PREFIX.npz."""
    p = Path(path)
    return p.with_suffix("") if p.suffix in (".json", ".npz") else p


def write_collection(col: Collection, prefix: str | Path) -> tuple[Path, Path]:
    prefix = prefix_of(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    npz = Path(f"{prefix}.npz")
    fd, tmp = tempfile.mkstemp(prefix=f".{npz.name}.", suffix=".tmp", dir=npz.parent)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **col.arrays)
        os.replace(tmp, npz)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    meta = finish(col.meta, npz=npz.name, arrays={k: list(v.shape) for k, v in col.arrays.items()})
    col.meta = meta
    js = write_json(Path(f"{prefix}.json"), meta)
    return js, npz


def read_collection(path: str | Path) -> Collection:
    prefix = prefix_of(path)
    js, npz = Path(f"{prefix}.json"), Path(f"{prefix}.npz")
    for f in (js, npz):
        if not f.is_file():
            raise LabkitError(f"collection {prefix}: {f.name} is missing (make it with `labkit logits-check collect`)")
    try:
        meta = json.loads(js.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise LabkitError(f"collection {prefix}: {js.name} is not valid JSON: {exc}") from exc
    if meta.get("kind") != "logits-collection" or meta.get("status") != "COLLECTED":
        raise LabkitError(f"collection {prefix}: {js.name} is not a complete logits-check collection")
    try:
        with np.load(npz) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as exc:
        raise LabkitError(f"collection {prefix}: cannot read {npz.name}: {exc}") from exc
    if "logits" not in arrays or arrays["logits"].shape[0] != len(meta.get("rows", [])):
        raise LabkitError(f"collection {prefix}: {npz.name} does not hold one logits row per row of {js.name}")
    return Collection(meta, arrays)
