"""The Transformers baseline: the same workload through `model.generate`, batched the simple way.

Requests are sorted by descending output length (stable) and cut into batches of `--hf-batch`
prompts; each batch is left-padded and generated with `max_new_tokens` = the batch's longest
max_tokens. With ignore_eos, `min_new_tokens` is set to the same value so EOS cannot end a row
early. A row generates as many tokens as its batch's longest request, but only the request's
own max_tokens count as its output tokens (what the engine would produce); the extra tokens are
the baseline's waste, and its throughput pays for them. Sampling: do_sample=True, the workload's
temperature, top_k=0, top_p=1.0 (temperature 0: greedy). The model loads with --dtype (auto: the
checkpoint's) and attn_implementation="sdpa". Timing: the wall seconds of all batches of one
repeat (including padding the inputs), bracketed by torch.cuda.synchronize() on a GPU.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from labkit.bench.offline import Stepper, peak_memory_record, peak_now, reset_peak, run_record, summarize
from labkit.bench.timing import timed
from labkit.bench.workloads import Draw, Workload, draw_repeat, draw_warmup, fold_to_vocab
from labkit.errors import LabkitError

ATTN_IMPLEMENTATION = "sdpa"
DEFAULT_BATCH = 64


def _dtype_kwarg() -> str:
    """transformers >= 4.56 takes `dtype=`; older releases only `torch_dtype=`."""
    import transformers

    try:
        major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    except ValueError:
        return "dtype"
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def _eos_ids(model: Any) -> set[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def _pad_id(model: Any) -> int:
    for src in (model.generation_config, model.config):
        pad = getattr(src, "pad_token_id", None)
        if pad is not None:
            return int(pad)
    eos = sorted(_eos_ids(model))
    return eos[0] if eos else 0


def batches(max_tokens: list[int], size: int) -> list[list[int]]:
    """Request indices sorted by descending output length (stable), in chunks of `size`."""
    order = sorted(range(len(max_tokens)), key=lambda i: -max_tokens[i])
    return [order[i:i + size] for i in range(0, len(order), size)]


def load_hf_model(model_dir: str | Path, device: str, dtype: str):
    import torch

    try:
        from transformers import AutoModelForCausalLM
    except ImportError as exc:  # pragma: no cover - a dependency of labkit
        raise LabkitError(f"--backend hf needs transformers ({exc})") from exc
    torch_dtype: Any = "auto" if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), attn_implementation=ATTN_IMPLEMENTATION,
                                                 **{_dtype_kwarg(): torch_dtype})
    return model.to(device).eval()


def generate_draw(model: Any, d: Draw, w: Workload, batch_size: int, device: str, seed: int,
                  stepper: Stepper | None = None) -> int:
    """Generate every request of `d`; returns the output tokens that count (see module doc)."""
    import torch

    prompts, _ = fold_to_vocab(d.prompts, int(model.config.vocab_size))
    pad, eos = _pad_id(model), _eos_ids(model)
    torch.manual_seed(seed)
    counted = 0
    for chunk in batches(d.max_tokens, batch_size):
        width = max(len(prompts[i]) for i in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):
            p = prompts[i]
            ids[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[row, width - len(p):] = 1
        max_new = max(d.max_tokens[i] for i in chunk)
        gen_kwargs: dict[str, Any] = {"max_new_tokens": max_new, "pad_token_id": pad}
        if w.temperature > 0:
            gen_kwargs.update(do_sample=True, temperature=w.temperature, top_k=0, top_p=1.0)
        else:
            gen_kwargs.update(do_sample=False)
        if w.ignore_eos:
            gen_kwargs["min_new_tokens"] = max_new
        with torch.inference_mode():
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **gen_kwargs)
        if w.ignore_eos:
            counted += sum(d.max_tokens[i] for i in chunk)
        else:
            new = out[:, width:].tolist()
            for row, i in enumerate(chunk):
                own = new[row][:d.max_tokens[i]]
                stop = next((k + 1 for k, t in enumerate(own) if t in eos), len(own))
                counted += stop
        if stepper is not None:
            stepper.advance()
    return counted


def measure_hf(w: Workload, model_dir: str | Path, device: str, dtype: str, batch_size: int = DEFAULT_BATCH,
               stepper: Stepper | None = None) -> dict:
    """Run the workload through transformers' generate; returns the measurement part of the JSON."""
    import torch
    import transformers

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise LabkitError(f"--hf-batch: must be a positive integer, got {batch_size!r}")
    stepper = stepper or Stepper()
    verbosity = transformers.logging.get_verbosity()
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()  # generation-flag chatter would bury the progress bars
    transformers.utils.logging.disable_progress_bar()
    try:
        stepper.start("init (loading the HF model)", 1)
        start = time.perf_counter()
        model = load_hf_model(model_dir, device, dtype)
        sync_device = device
        init_s = time.perf_counter() - start
        stepper.advance()
        vocab = int(model.config.vocab_size)

        warmup_rounds = []
        for r in range(w.warmup.rounds):
            d = draw_warmup(w, r)
            stepper.start(f"warm-up {r + 1}/{w.warmup.rounds}", len(batches(d.max_tokens, batch_size)))
            wall, out_tokens = timed(lambda d=d: generate_draw(model, d, w, batch_size, device, 0, stepper),
                                     sync_device)
            warmup_rounds.append({"round": r, "requests": len(d), "prompt_tokens": d.prompt_tokens,
                                  "output_tokens": out_tokens, "wall_s": wall})
        overall_before = peak_now(sync_device)
        reset_peak(sync_device)

        runs = []
        for i in range(w.repeats):
            d = draw_repeat(w, i)
            stepper.start(f"timed repeat {i + 1}/{w.repeats}", len(batches(d.max_tokens, batch_size)))
            wall, out_tokens = timed(
                lambda d=d, i=i: generate_draw(model, d, w, batch_size, device, w.repeat_seed(i), stepper),
                sync_device)
            runs.append(run_record(i, d, wall, out_tokens, batches=len(batches(d.max_tokens, batch_size)),
                                   generated_tokens=sum(max(d.max_tokens[j] for j in b) * len(b)
                                                        for b in batches(d.max_tokens, batch_size))))
        timed_peak = peak_now(sync_device)
        overall = {k: (max(v, timed_peak[k]) if v is not None else None) for k, v in overall_before.items()}
        folded = any(t >= vocab for p in draw_repeat(w, 0).prompts for t in p)
        return {
            "dtype": str(model.dtype).replace("torch.", ""),
            "run_device": str(model.device),
            "hf": {"batch": batch_size, "attn_implementation": ATTN_IMPLEMENTATION,
                   "sort": "descending output length", "padding": "left",
                   "sampling": ({"do_sample": True, "temperature": w.temperature, "top_k": 0, "top_p": 1.0}
                                if w.temperature > 0 else {"do_sample": False}),
                   "min_new_tokens": "batch max_new_tokens" if w.ignore_eos else None,
                   "transformers": transformers.__version__},
            "execution": "hf-generate",
            "init_s": init_s,
            "init_wall_s": init_s,
            "graph_capture_s": None,
            "warmup_s": sum(r["wall_s"] for r in warmup_rounds),
            "warmup_rounds": warmup_rounds,
            "runs": runs,
            "median": summarize(runs),
            "kv_blocks": None,
            "peak_memory": peak_memory_record(sync_device, overall, timed_peak, 1),
            "vocab_size": vocab,
            "prompt_ids_folded": folded,
        }
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:
            transformers.utils.logging.enable_progress_bar()
        if str(device).startswith("cuda"):
            torch.cuda.empty_cache()
