"""`labkit shapes`: what each tensor-parallel rank holds, computed from config.json alone.

    labkit shapes --tensor-parallel-size 2 --preset qwen3-0.6b   # static table, no model files needed
    labkit shapes --tensor-parallel-size 2 --model DIR   # any Qwen3 folder with a config.json
    labkit shapes --tensor-parallel-size 2 --check     # also build the engine (tiny model, CPU, gloo) and
                                                       # compare the table with what every rank allocated

Per rank: the vocabulary shard of the embedding / LM head, the q/kv heads, the qkv / o / gate_up / down
weight shapes (column-parallel layers split their output rows, row-parallel ones their input columns and
all-reduce), the KV bytes per token, the logits shard before the gather to rank 0. Every rank holds the
same shapes (the shards are even); only the slices differ (`vocab_ranges`).

Writes runs/shapes-tpN.json (or --out). Exit 0 = pass, 1 = --check found a mismatch, 2 = cannot run
(e.g. a dimension not divisible by --tensor-parallel-size).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from labkit.errors import LabkitError
from labkit.narrow import fit
from labkit.options import Device, DeviceOption, JsonOption, ModelOption, Out, TensorParallelSizeOption
from labkit.output import (
    EXIT_FAIL,
    EXIT_PASS,
    configuration_suffix,
    envelope,
    evidence_for,
    finish,
    print_json,
    resolve_device,
    runs_dir,
    write_json,
)

_ITEMSIZE = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
_DIVISIBLE = ("num_attention_heads", "num_key_value_heads", "vocab_size", "intermediate_size")


def _dtype(cfg: dict) -> str:
    dtype = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    return str(dtype).replace("torch.", "")


def per_rank_shapes(cfg: dict[str, Any], tp: int) -> dict[str, Any]:
    """Every rank's shapes for a Qwen3 config.json (a dict) split `tp` ways; raises LabkitError when a
    dimension the engine shards is not divisible by tp."""
    if not 1 <= tp <= 8:
        raise LabkitError(f"--tensor-parallel-size must be between 1 and 8, got {tp}")
    for name in _DIVISIBLE:
        if name not in cfg:
            raise LabkitError(f"config.json has no {name}")
        if cfg[name] % tp:
            raise LabkitError(f"tensor_parallel_size: {name} ({cfg[name]}) is not divisible by {tp}")
    h, vocab, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    nq, nkv, layers = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]
    d = cfg.get("head_dim") or h // nq
    dtype = _dtype(cfg)
    itemsize = _ITEMSIZE.get(dtype, 4)
    bias = bool(cfg.get("attention_bias", False))
    tied = bool(cfg.get("tie_word_embeddings", False))
    qkv = (nq + 2 * nkv) * d

    def p(full, rank, split, comm=None):
        return {"full": list(full), "rank": list(rank), "split": split, "comm": comm}

    params = {
        "model.embed_tokens.weight": p((vocab, h), (vocab // tp, h), "vocab rows",
                                       "all-reduce (output)" if tp > 1 else None),
        "lm_head.weight": p((vocab, h), (vocab // tp, h), "vocab rows" + (" (tied)" if tied else ""),
                            "gather to rank 0" if tp > 1 else None),
        "model.norm.weight": p((h,), (h,), "replicated"),
        "model.layers.N.input_layernorm.weight": p((h,), (h,), "replicated"),
        "model.layers.N.self_attn.qkv_proj.weight": p((qkv, h), (qkv // tp, h), "column: q, k, v heads"),
        "model.layers.N.self_attn.q_norm.weight": p((d,), (d,), "replicated"),
        "model.layers.N.self_attn.k_norm.weight": p((d,), (d,), "replicated"),
        "model.layers.N.self_attn.o_proj.weight": p((h, nq * d), (h, nq * d // tp), "row",
                                                    "all-reduce" if tp > 1 else None),
        "model.layers.N.post_attention_layernorm.weight": p((h,), (h,), "replicated"),
        "model.layers.N.mlp.gate_up_proj.weight": p((2 * inter, h), (2 * inter // tp, h), "column: gate, up"),
        "model.layers.N.mlp.down_proj.weight": p((h, inter), (h, inter // tp), "row", "all-reduce" if tp > 1 else None),
    }
    if bias:
        params["model.layers.N.self_attn.qkv_proj.bias"] = p((qkv,), (qkv // tp,), "column")
        params["model.layers.N.self_attn.o_proj.bias"] = p((h,), (h,), "rank 0 adds it, others hold zeros")

    def numel(shape):
        n = 1
        for s in shape:
            n *= s
        return n

    per_rank_params = 0
    for name, spec in params.items():
        if name == "lm_head.weight" and tied:
            continue
        per_rank_params += numel(spec["rank"]) * (layers if ".layers.N." in name else 1)
    shard = vocab // tp
    return {
        "tensor_parallel_size": tp,
        "dtype": dtype,
        "itemsize": itemsize,
        "num_hidden_layers": layers,
        "heads": {"q": {"full": nq, "rank": nq // tp}, "kv": {"full": nkv, "rank": nkv // tp}, "head_dim": d},
        "params": params,
        "param_bytes_per_rank": per_rank_params * itemsize,
        "kv_bytes_per_token": {"full": 2 * layers * nkv * d * itemsize,
                               "rank": 2 * layers * (nkv // tp) * d * itemsize},
        "kv_pool_rank": ["2", layers, "num_kvcache_blocks", "kvcache_block_size", nkv // tp, d],
        "activations": {  # per layer, for T tokens in the step (N sequences for the logits)
            "qkv_proj": ["T", qkv // tp], "q": ["T", nq // tp, d], "k": ["T", nkv // tp, d],
            "v": ["T", nkv // tp, d], "attn_out": ["T", nq // tp, d],
            "o_proj (after all-reduce)": ["T", h], "gate_up_proj": ["T", 2 * inter // tp],
            "down_proj (after all-reduce)": ["T", h], "logits_shard": ["N", shard],
            "logits (rank 0, gathered)": ["N", vocab],
        },
        "vocab_ranges": [[r * shard, (r + 1) * shard] for r in range(tp)],
        "collectives_per_step": {"all_reduce": 1 + 2 * layers if tp > 1 else 0, "gather": 1 if tp > 1 else 0},
    }


def _load_config(model: Optional[str], preset: Optional[str]) -> tuple[dict, Optional[Path], str]:
    if model and preset:
        raise LabkitError("give --model or --preset, not both")
    if preset:
        from labkit.fake_model import preset_config

        try:
            return preset_config(preset), None, f"preset {preset}"
        except ValueError as exc:
            raise LabkitError(f"--preset: {exc}") from None
    if model:
        path = Path(model).expanduser()
    else:
        from labkit.model import resolve_model

        path = resolve_model(None)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise LabkitError(f"model folder {path}: no config.json")
    try:
        return json.loads(cfg_path.read_text()), path.resolve(), str(path.resolve())
    except (OSError, ValueError) as exc:
        raise LabkitError(f"{cfg_path}: cannot read: {exc}") from None


def _check_model_dir(model_dir: Optional[Path], preset: Optional[str]) -> Path:
    """The folder --check builds the engine from: --model, else the preset's fake model (made once)."""
    if model_dir is not None:
        from labkit.model import resolve_model

        return resolve_model(str(model_dir))
    from labkit.model import cache_root, default_model_dir, resolve_model

    if preset in (None, "tiny"):
        return resolve_model(str(default_model_dir()))
    from labkit.fake_model import make_fake_model

    target = cache_root() / "models" / f"{preset}-seed0"
    if not (target / "config.json").is_file() or not list(target.glob("*.safetensors")):
        make_fake_model(preset, target, 0)
    return target


def compare(expected: dict, ranks: list[dict], num_blocks: int, block_size: int) -> list[dict]:
    """One check per (rank, item): the table against what the engine allocated."""
    from engine.kv_layout import pool_shape

    checks = []

    def check(rank, what, want, got):
        checks.append({"rank": rank, "what": what, "expected": want, "actual": got, "passed": want == got})

    tp = expected["tensor_parallel_size"]
    check(None, "ranks", tp, len(ranks))
    for r in ranks:
        rank = r["rank"]
        check(rank, "tp_size", tp, r.get("tp_size"))
        check(rank, "layers share shapes", True, r.get("layers_uniform"))
        for name, spec in expected["params"].items():
            check(rank, name, spec["rank"], r["params"].get(name))
        for name in sorted(set(r["params"]) - set(expected["params"])):
            check(rank, name, None, r["params"][name])
        check(rank, "q heads", expected["heads"]["q"]["rank"], r["num_heads"])
        check(rank, "kv heads", expected["heads"]["kv"]["rank"], r["num_kv_heads"])
        check(rank, "head_dim", expected["heads"]["head_dim"], r["head_dim"])
        check(rank, "kv bytes per token", expected["kv_bytes_per_token"]["rank"], r["kv_bytes_per_token"])
        pool = list(pool_shape(expected["num_hidden_layers"], num_blocks, block_size, expected["heads"]["kv"]["rank"],
                               expected["heads"]["head_dim"]))
        check(rank, "kv pool", pool, r["kv_cache"])
    return checks


def run_check(model_dir: Path, tp: int, device: str) -> tuple[list[dict], dict]:
    """Build the engine with tensor_parallel_size=tp and ask every rank what it allocated."""
    from engine import LLM

    llm = LLM(str(model_dir), tensor_parallel_size=tp, device=device, enforce_eager=True, max_model_len=64,
              max_num_batched_tokens=64, max_num_seqs=2, kvcache_block_size=16, num_kvcache_blocks=4,
              gpu_memory_utilization=0.5)
    try:
        ranks = llm.shapes_per_rank()
        cfg = llm.config
        engine = {"num_kvcache_blocks": cfg.num_kvcache_blocks, "kvcache_block_size": cfg.kvcache_block_size,
                  "device": str(llm.device), "dist_init_addr": cfg.dist_init_addr, "shm_name": cfg.shm_name}
    finally:
        llm.exit()
    return ranks, engine


def markdown(result: dict) -> str:
    """The person-readable twin of the JSON: the table, and the check's verdict when there was one."""
    table = result["table"]
    tp = table["tensor_parallel_size"]
    lines = [f"# labkit shapes: {result['source']}, tensor_parallel_size={tp}", "",
             f"evidence: {result['evidence']}; dtype {table['dtype']}", "",
             f"| tensor | full | per rank (x{tp}) | split | communication |", "| --- | --- | --- | --- | --- |"]
    for name, spec in table["params"].items():
        lines.append(f"| {name} | {_shape(spec['full'])} | {_shape(spec['rank'])} | {spec['split']} "
                     f"| {spec['comm'] or ''} |")
    heads, kv = table["heads"], table["kv_bytes_per_token"]
    lines += [f"| q heads | {heads['q']['full']} | {heads['q']['rank']} | head_dim {heads['head_dim']} | |",
              f"| kv heads | {heads['kv']['full']} | {heads['kv']['rank']} | | |",
              f"| KV bytes / token | {kv['full']} | {kv['rank']} | | |",
              f"| logits | {_shape(table['activations']['logits (rank 0, gathered)'])} | "
              f"{_shape(table['activations']['logits_shard'])} | vocab shard | gather to rank 0 |", ""]
    if "checks" in result:
        bad = [c for c in result["checks"] if not c["passed"]]
        lines.append(f"check against the engine ({len(result['ranks'])} ranks): "
                     + ("PASS" if not bad else f"FAIL, {len(bad)} mismatch(es)"))
        lines += [f"- rank {c['rank']} {c['what']}: table {c['expected']}, engine {c['actual']}" for c in bad]
    return "\n".join(lines) + "\n"


def _shape(s) -> str:
    return "[" + ", ".join(str(x) for x in s) + "]" if s is not None else "-"


def print_table(table_data: dict, title: str, console: Console) -> None:
    tp = table_data["tensor_parallel_size"]
    t = Table(title=title, header_style="bold")
    for col in ("tensor", "full", f"per rank (x{tp})", "split", "comm"):
        t.add_column(col)
    for name, spec in table_data["params"].items():
        short = name.replace("model.layers.N.", "").replace("self_attn.", "").replace("mlp.", "")
        short = short.replace("model.", "").replace(".weight", "")
        t.add_row(short, _shape(spec["full"]), _shape(spec["rank"]),
                  spec["split"], spec["comm"] or "")
    heads = table_data["heads"]
    t.add_row("q heads", str(heads["q"]["full"]), str(heads["q"]["rank"]), f"head_dim {heads['head_dim']}", "")
    t.add_row("kv heads", str(heads["kv"]["full"]), str(heads["kv"]["rank"]), "KV pool: rank's heads", "")
    kv = table_data["kv_bytes_per_token"]
    t.add_row("KV bytes / token", f"{kv['full']} ({kv['full'] / 1024:g} KiB)",
              f"{kv['rank']} ({kv['rank'] / 1024:g} KiB)", table_data["dtype"], "")
    act = table_data["activations"]
    t.add_row("logits", _shape(act["logits (rank 0, gathered)"]), _shape(act["logits_shard"]), "vocab shard",
              "sampled on rank 0" if tp > 1 else "")
    t.add_row("params / rank", "", f"{table_data['param_bytes_per_rank'] / 2**20:.1f} MiB", "", "")
    fit(t, console)  # no column below its longest word (post_attention_layernorm): other columns wrap instead
    console.print(t)
    ranges = ", ".join(f"rank {r}: [{a}, {b})" for r, (a, b) in enumerate(table_data["vocab_ranges"]))
    console.print(f"vocab slices: {ranges}")
    c = table_data["collectives_per_step"]
    console.print(f"collectives per forward: {c['all_reduce']} all-reduce (embedding + o_proj and down_proj in "
                  f"each of {table_data['num_hidden_layers']} layers), {c['gather']} gather")


def run(
    tensor_parallel_size: TensorParallelSizeOption = 2,
    model: ModelOption = None,
    preset: Optional[str] = typer.Option(None, "--preset", help="tiny or qwen3-0.6b: a fake preset's config."),
    check: bool = typer.Option(False, "--check", help="Build the engine (--device, default cpu with gloo) and compare "
                                                      "every rank's parameters and KV pool with the table."),
    device: DeviceOption = Device.cpu,
    out: Out("JSON path (default: runs/shapes-tpN[-OPTION-VALUE...].json, one -OPTION-VALUE per other option "
             "given).") = None,
    as_json: JsonOption = False,
) -> None:
    """Per-rank tensor-parallel shapes from config.json (static); --check compares with the engine.

    Without --check only the model's config.json is read (or a --preset's), no weights.

    Example: labkit shapes --tensor-parallel-size 2 --preset qwen3-0.6b
    """
    tp = tensor_parallel_size
    cfg, model_dir, source = _load_config(model, preset)
    expected = per_rank_shapes(cfg, tp)
    console = Console(quiet=as_json)
    dev = resolve_device(device) if check else "cpu"
    build_dir = _check_model_dir(model_dir, preset) if check else None
    env = envelope("shapes", device=dev, model_dir=build_dir or model_dir,
                   evidence=evidence_for(dev) if check else "static-estimate")
    print_table(expected, f"tensor parallel shapes, {source}, tp={tp}", console)
    results: dict[str, Any] = {"source": source, "preset": preset, "tensor_parallel_size": tp, "table": expected}
    passed = True
    if check:
        ranks, engine = run_check(build_dir, tp, dev)
        checks = compare(expected, ranks, engine["num_kvcache_blocks"], engine["kvcache_block_size"])
        passed = all(c["passed"] for c in checks)
        results.update(engine=engine, ranks=ranks, checks=checks)
        for c in checks:
            if not c["passed"]:
                console.print(f"[red]MISMATCH[/red] rank {c['rank']} {c['what']}: table {c['expected']}, "
                              f"engine {c['actual']}")
        style = "green" if passed else "red"
        console.print(f"[{style}]check: {sum(c['passed'] for c in checks)}/{len(checks)} agree "
                      f"({len(ranks)} ranks on {engine['device']})[/{style}]")
    # Without --check nothing is compared: the table is recorded, not judged.
    verdict = ("PASS" if passed else "FAIL") if check else "RECORDED"
    result = finish(env, verdict=verdict, passed=passed, **results)
    path = write_json(out or runs_dir() / f"shapes-tp{tp}{configuration_suffix(skip=('tensor_parallel_size',))}.json",
                      result)
    md = path.with_suffix(".md")
    md.write_text(markdown(result), encoding="utf-8")
    console.print(f"wrote {path} and {md}")
    if as_json:
        print_json(result)
    raise typer.Exit(EXIT_PASS if passed else EXIT_FAIL)
