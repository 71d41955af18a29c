"""`labkit smoke`: load the engine, generate a couple of tokens, check the counts.

This proves the main chain runs (load, tokenizer chat template, prefill, decode, KV cache),
nothing about correctness or speed: the tokens are sampled with ignore_eos so the count is
fixed, and whether they read well is not judged.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from labkit.errors import LabkitError
from labkit.model import resolve_model
from labkit.options import Device, DeviceOption, EnforceEagerOption, ModelOption, TensorParallelSizeOption
from labkit.output import (
    EXIT_FAIL,
    EXIT_PASS,
    configuration_suffix,
    device_info,
    envelope,
    evidence_for,
    finish,
    resolve_device,
    runs_dir,
    write_json,
)

DEFAULT_PROMPT = "Introduce yourself in one sentence."
# The smoke's settings: one GPU, max_model_len 1024, a 512-token budget, half the memory.
ENGINE_KWARGS = {"max_model_len": 1024, "max_num_batched_tokens": 512, "gpu_memory_utilization": 0.5}
TEMPERATURE = 0.6


def load_engine(model_dir: Path, device: str, eager: bool, tp: int = 1) -> Any:
    try:
        from engine import LLM
    except ImportError as exc:
        raise LabkitError(f"cannot import the engine: {exc}") from exc
    return LLM(str(model_dir), enforce_eager=eager, device=device, tensor_parallel_size=tp, **ENGINE_KWARGS)


def vocab_size(llm: Any) -> int:
    size = getattr(getattr(llm.config, "hf_config", None), "vocab_size", None)
    return int(size) if size else len(llm.tokenizer)


def check(name: str, passed: bool, detail: str) -> dict:
    return {"name": name, "passed": bool(passed), "detail": detail}


def judge(outs: list, token_ids: list[int], max_tokens: int, vocab: int, kv_blocks: int) -> list[dict]:
    bad = [t for t in token_ids if not (isinstance(t, int) and 0 <= t < vocab)]
    return [
        check("one result", len(outs) == 1, f"{len(outs)} result(s) for 1 prompt"),
        check("token count", len(token_ids) == max_tokens,
              f"{len(token_ids)} token id(s), asked for {max_tokens} with ignore_eos"),
        check("ids in vocab", bool(token_ids) and not bad,
              f"all in [0, {vocab})" if not bad else f"out of [0, {vocab}): {bad[:8]}"),
        check("kv blocks", kv_blocks > 0, f"num_kvcache_blocks = {kv_blocks}"),
    ]


def generate_once(llm: Any, prompt: str, max_tokens: int) -> dict:
    """Format, generate and time one request; the raw facts the checks and the JSON use."""
    from engine import SamplingParams

    text = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    prompt_tokens = len(llm.tokenizer.encode(text))
    params = SamplingParams(temperature=TEMPERATURE, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate([text], params, use_tqdm=False)
    generate_s = time.perf_counter() - start
    first = outs[0] if outs else {}
    return {
        "outs": outs,
        "formatted_prompt": text,
        "prompt_tokens": prompt_tokens,
        "token_ids": [int(t) for t in first.get("token_ids", [])],
        "text": first.get("text", ""),
        "generate_s": generate_s,
    }


def _execution(engine: dict) -> str:
    asked = "eager" if engine["enforce_eager"] else "graph"
    ran = engine.get("execution")
    return asked if ran in (None, asked) else f"{ran} (asked for {asked})"


def print_summary(result: dict, console: Console) -> None:
    table = Table(title="labkit smoke", show_header=False)
    table.add_column("what", no_wrap=True)
    table.add_column("value")
    dev = result["device"]
    rows = [
        ("model", result["model"]["path"]),
        ("device", f"{dev['type']} ({dev.get('name') or '?'})"),
        ("execution", _execution(result["engine"])),
        ("tensor parallel", str(result["engine"].get("tensor_parallel_size", 1))),
        ("prompt tokens", str(result["prompt_tokens"])),
        ("token ids", " ".join(map(str, result["token_ids"]))),
        ("text", repr(result["text"])),
        ("kv blocks", str(result["engine"]["num_kvcache_blocks"])),
        ("init s", f"{result['init_s']:.2f}"),
        ("generate s", f"{result['generate_s']:.3f}"),
    ]
    for what, value in rows:
        table.add_row(what, Text(str(value)))  # Text: model output must not be read as markup
    console.print(table)
    for c in result["checks"]:
        mark = Text("PASS", style="bold green") if c["passed"] else Text("FAIL", style="bold red")
        console.print(Text.assemble("  ", mark, f" {c['name']}: {c['detail']}"))


def markdown(result: dict) -> str:
    """smoke.json's twin: the verdict, what ran and each check."""
    e = result["engine"]
    lines = [f"# labkit smoke: {result['status']}", "",
             f"- command: `{' '.join(result.get('argv') or [])}`",
             f"- model: {result['model']['path']}",
             f"- device: {e['device']} ({result['device'].get('name') or '-'}), execution {e['execution']}, "
             f"tensor parallel {e['tensor_parallel_size']}",
             f"- prompt tokens: {result['prompt_tokens']}; token ids: {result['token_ids']}; text: {result['text']!r}",
             f"- init {result['init_s']} s, generate {result['generate_s']} s", "",
             "| check | result | detail |", "| --- | --- | --- |"]
    lines += [f"| {c.get('name')} | {'PASS' if c.get('passed') else 'FAIL'} | "
              f"{str(c.get('detail', '')).replace('|', '/')} |"
              for c in result["checks"]]
    return "\n".join(lines) + "\n"


def run(
    model: ModelOption = None,
    device: DeviceOption = Device.auto,
    enforce_eager: EnforceEagerOption = True,
    max_tokens: int = typer.Option(2, "--max-tokens", min=1, help="Tokens to generate (EOS ignored)."),
    prompt: str = typer.Option(DEFAULT_PROMPT, "--prompt", help="User message, wrapped in the chat template."),
    tensor_parallel_size: TensorParallelSizeOption = 1,
) -> None:
    """Load the engine on the model and generate a couple of tokens; exit 0 when the counts check out.

    Example: labkit smoke --device cpu --max-tokens 4
    """
    model_dir = Path(resolve_model(model))
    dev = resolve_device(device)
    env = envelope("smoke", device=dev, model_dir=model_dir, evidence=evidence_for(dev))

    start = time.perf_counter()
    tp = tensor_parallel_size
    llm = load_engine(model_dir, dev, enforce_eager, **({"tp": tp} if tp != 1 else {}))
    try:
        init_s = time.perf_counter() - start
        got = generate_once(llm, prompt, max_tokens)
        kv_blocks = int(getattr(llm.config, "num_kvcache_blocks", None) or 0)
        checks = judge(got["outs"], got["token_ids"], max_tokens, vocab_size(llm), kv_blocks)
        ran_on = str(getattr(llm.config, "device", dev))
        # --no-enforce-eager is a request; the engine may fall back to eager (on the CPU it must).
        execution = llm.execution
    finally:
        if callable(getattr(llm, "exit", None)):
            llm.exit()

    passed = all(c["passed"] for c in checks)
    env["device"] = device_info(ran_on)  # what the engine actually used, e.g. cuda:0
    result = finish(
        env,
        status="PASS" if passed else "FAIL",
        prompt=prompt,
        formatted_prompt=got["formatted_prompt"],
        prompt_tokens=got["prompt_tokens"],
        sampling={"temperature": TEMPERATURE, "max_tokens": max_tokens, "ignore_eos": True},
        engine={"enforce_eager": enforce_eager, "execution": execution, "device": ran_on, "tensor_parallel_size": tp,
                "num_kvcache_blocks": kv_blocks, **ENGINE_KWARGS},
        token_ids=got["token_ids"],
        text=got["text"],
        init_s=round(init_s, 4),
        generate_s=round(got["generate_s"], 4),
        checks=checks,
    )
    path = write_json(runs_dir() / f"smoke{configuration_suffix()}.json", result)
    path.with_suffix(".md").write_text(markdown(result), encoding="utf-8")

    console = Console()
    print_summary(result, console)
    verdict = Text("PASS" if passed else "FAIL", style="bold green" if passed else "bold red")
    console.print(Text.assemble("smoke: ", verdict, f"; wrote {path} and {path.with_suffix('.md').name}"))
    raise typer.Exit(EXIT_PASS if passed else EXIT_FAIL)
