"""Deterministic fake Qwen3 checkpoints: the embedded `tiny` model and a `qwen3-0.6b`-shaped one.

A fake model is a complete Hugging Face folder (config.json, model.safetensors, tokenizer files)
that `transformers` and the engine load like the real thing. Its weights are random but
reproducible: every tensor draws from its own `torch.Generator`, seeded from (seed, tensor name),
so the same preset and seed give byte-identical files on any machine (checked: Python 3.11 /
torch 2.13 CPU and Python 3.12 / torch 2.11 CUDA build give the same sha256 for every file), and
the file is written tensor by tensor (the 0.6b preset never holds more than one tensor in memory).

The init scales are chosen so that the model is a useful test subject rather than a realistic
one (see INIT): greedy continuations vary across prompts, depend on more than the last token,
and have clear top-1 margins, so an engine with broken attention, positions or KV cache
produces visibly different tokens from `transformers`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

# The tokenizer: a byte-level BPE trained on labkit/data/corpus.txt, with Qwen's special tokens
# appended after the merges (as Qwen does), so the ids of ordinary text come first.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOKENIZER_VOCAB = 2048  # BPE tokens + the special tokens
# ~330 KB of English composed for labkit (prose, dialogue, how-tos, Q&A, code, logs, tables, numbers,
# two lines of Chinese), generated once and shipped as a fixed file so training is reproducible.
CORPUS = Path(__file__).parent / "data" / "corpus.txt"

# A ChatML template in Qwen's style (written for labkit): system/user/assistant turns, each
# `<|im_start|>ROLE\nCONTENT<|im_end|>\n`, plus the assistant header on add_generation_prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set text = message['content'] %}"
    "{%- else %}{%- set text = message['content'] | map(attribute='text') | join('') %}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + text + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Pre-tokenization in Qwen2's style: letters, single digits, punctuation runs, newlines, spaces.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_COMMON: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "sliding_window": None,
    "use_sliding_window": False,
    "use_cache": True,
    "tie_word_embeddings": True,
}

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "vocab_size": 2048,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 4096,
        "dtype": "float32",
    },
    "qwen3-0.6b": {
        "vocab_size": 151936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "dtype": "bfloat16",
    },
}

# Init scales (std of a uniform distribution, so the draws need no transcendental functions and
# are bit-identical across CPUs). With tied embeddings the LM head is the embedding, so a model
# whose residual stream is dominated by the input embedding echoes its last token. Here the
# embedding is small (logits' spread ~ embed_logit_std) and each block writes ~out_gain times
# more than it reads, so the last position's state is mostly what attention and the MLPs made of
# the whole context; q/k norms above 1 make attention content-selective. Measured on `tiny`
# (transformers, float32, 52 prompts x 8 greedy tokens): all continuations distinct, ~5% of
# steps repeat the previous token, median top-1 margin ~0.8 logits; changing only the first
# token of a 21..233-token prompt changes 23 of 24 continuations.
INIT: dict[str, float] = {
    "embed_logit_std": 4.0,   # embedding std = embed_logit_std / sqrt(hidden): logits' std ~ this
    "proj_gain": 1.0,         # q, k, v, gate, up: std = proj_gain / sqrt(fan_in)
    "out_gain": 4.0,          # o, down (what a block adds to the residual): out_gain / sqrt(fan_in)
    "qk_norm_mean": 2.0,      # q_norm / k_norm weights: mean +- spread
    "qk_norm_spread": 0.5,
    "norm_mean": 1.0,         # input/post-attention/final norms: mean +- spread
    "norm_spread": 0.2,
}

# Deep presets need a calmer network: with 28 layers the tiny preset's scales make the model chaotic,
# so bf16 rounding alone (Transformers bf16 vs float32) moves logits by ~50% and no bf16 comparison
# could pass. Softer attention (q/k norms ~0.5) and unit output gains keep bf16-vs-float32 at ~1.6%
# relative L2 on qwen3-0.6b (measured on CPU, 120-token prompt), under the fixed gate's 2% rel-L2 threshold.
PRESET_INIT: dict[str, dict[str, float]] = {
    "qwen3-0.6b": {"out_gain": 1.0, "qk_norm_mean": 0.5, "qk_norm_spread": 0.125},
}

_TORCH_DTYPES = {"float32": ("F32", 4), "bfloat16": ("BF16", 2), "float16": ("F16", 2)}


def preset_config(preset: str, seed: int = 0, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The config.json a preset writes (overrides: config fields to change, for tests)."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}, not {preset!r}")
    cfg: dict[str, Any] = {**_COMMON, **PRESETS[preset], **(overrides or {})}
    if cfg["vocab_size"] < TOKENIZER_VOCAB or cfg["vocab_size"] % 2:
        raise ValueError(f"vocab_size must be even and >= {TOKENIZER_VOCAB} (the tokenizer's size)")
    if cfg["dtype"] not in _TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_TORCH_DTYPES)}")
    if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    endoftext, _, im_end = special_token_ids()
    cfg.update(
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
        max_window_layers=cfg["num_hidden_layers"],
        torch_dtype=cfg["dtype"],  # transformers < 4.56 reads torch_dtype, later ones dtype
        # transformers >= 5 reads rope_parameters, older ones rope_theta; both say the same.
        rope_parameters={"rope_theta": cfg["rope_theta"], "rope_type": "default"},
        labkit_fake={"preset": preset, "seed": int(seed), "init": {**INIT, **PRESET_INIT.get(preset, {})}},
    )
    return dict(sorted(cfg.items()))


def tensor_specs(cfg: dict[str, Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, init kind) of every tensor, in file order (sorted by name)."""
    h, ffn = cfg["hidden_size"], cfg["intermediate_size"]
    hd, nq, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    specs: list[tuple[str, tuple[int, ...], str]] = [
        ("model.embed_tokens.weight", (cfg["vocab_size"], h), "embed"),
        ("model.norm.weight", (h,), "norm"),
    ]
    if not cfg["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (cfg["vocab_size"], h), "embed"))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        specs += [
            (p + "input_layernorm.weight", (h,), "norm"),
            (p + "post_attention_layernorm.weight", (h,), "norm"),
            (p + "self_attn.q_proj.weight", (nq * hd, h), "proj"),
            (p + "self_attn.k_proj.weight", (nkv * hd, h), "proj"),
            (p + "self_attn.v_proj.weight", (nkv * hd, h), "proj"),
            (p + "self_attn.o_proj.weight", (h, nq * hd), "out"),
            (p + "self_attn.q_norm.weight", (hd,), "qk_norm"),
            (p + "self_attn.k_norm.weight", (hd,), "qk_norm"),
            (p + "mlp.gate_proj.weight", (ffn, h), "proj"),
            (p + "mlp.up_proj.weight", (ffn, h), "proj"),
            (p + "mlp.down_proj.weight", (h, ffn), "out"),
        ]
    return sorted(specs)


def num_parameters(cfg: dict[str, Any]) -> int:
    return sum(math.prod(shape) for _, shape, _ in tensor_specs(cfg))


def tensor_seed(seed: int, name: str) -> int:
    """A stable 63-bit generator seed for one tensor (independent of Python's hash salting)."""
    digest = hashlib.sha256(f"labkit-fake/{int(seed)}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def make_tensor(name: str, shape: tuple[int, ...], kind: str, cfg: dict[str, Any], seed: int):
    """One tensor, drawn uniformly (mean +- sqrt(3) std) from its own generator, in cfg's dtype."""
    import torch

    init = cfg.get("labkit_fake", {}).get("init", INIT)
    if kind == "embed":
        mean, std = 0.0, init["embed_logit_std"] / math.sqrt(cfg["hidden_size"])
    elif kind == "proj":
        mean, std = 0.0, init["proj_gain"] / math.sqrt(shape[1])
    elif kind == "out":
        mean, std = 0.0, init["out_gain"] / math.sqrt(shape[1])
    elif kind == "qk_norm":
        mean, std = init["qk_norm_mean"], init["qk_norm_spread"] / math.sqrt(3)
    elif kind == "norm":
        mean, std = init["norm_mean"], init["norm_spread"] / math.sqrt(3)
    else:
        raise ValueError(f"unknown init kind {kind!r}")
    gen = torch.Generator().manual_seed(tensor_seed(seed, name))
    half_width = std * math.sqrt(3.0)
    t = torch.rand(shape, generator=gen, dtype=torch.float32)
    t.mul_(2.0 * half_width).add_(mean - half_width)  # separate ops: no FMA, same bits everywhere
    return t.to(getattr(torch, cfg["dtype"]))


def write_safetensors(path: Path, cfg: dict[str, Any], seed: int) -> None:
    """Stream every tensor into one safetensors file: header first, then data in header order."""
    import torch

    st_dtype, itemsize = _TORCH_DTYPES[cfg["dtype"]]
    specs = tensor_specs(cfg)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, _ in specs:
        nbytes = math.prod(shape) * itemsize
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name, shape, kind in specs:
            t = make_tensor(name, shape, kind, cfg, seed).contiguous()
            f.write(t.view(-1).view(torch.uint8).numpy())  # buffer protocol: no copy
            del t


@lru_cache(maxsize=1)
def tokenizer_json() -> str:
    """The trained tokenizer, serialized (BPE training on the shipped corpus takes ~0.1 s)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB - len(SPECIAL_TOKENS), min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[],
    )
    text = CORPUS.read_text(encoding="utf-8")
    tok.train_from_iterator(_paragraphs(text), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    if tok.get_vocab_size() != TOKENIZER_VOCAB:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, expected {TOKENIZER_VOCAB}")
    return tok.to_str(pretty=True)


def _paragraphs(text: str) -> Iterator[str]:
    for para in text.split("\n\n"):
        if para.strip():
            yield para + "\n\n"


def special_token_ids() -> tuple[int, ...]:
    """Ids of <|endoftext|>, <|im_start|>, <|im_end|>: the last ids of the tokenizer."""
    first = TOKENIZER_VOCAB - len(SPECIAL_TOKENS)
    return tuple(range(first, TOKENIZER_VOCAB))


def tokenizer_files() -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json contents."""
    ids = special_token_ids()
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, t in zip(ids, SPECIAL_TOKENS)
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    special = {
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "eos_token": {"content": "<|im_end|>", "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False},
        "pad_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False},
    }
    return {
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": _dumps(config),
        "special_tokens_map.json": _dumps(special),
    }


def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def make_fake_model(preset: str, out: Path, seed: int = 0, *, overrides: dict[str, Any] | None = None) -> Path:
    """Write a fake checkpoint of `preset` into `out` (created; our files are overwritten).

    Same preset, seed and overrides give byte-identical files. Returns `out`.
    """
    cfg = preset_config(preset, seed, overrides)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    endoftext, _, im_end = special_token_ids()
    files = dict(tokenizer_files())
    files["config.json"] = _dumps(cfg)
    files["generation_config.json"] = _dumps(
        {"bos_token_id": endoftext, "eos_token_id": [im_end, endoftext], "pad_token_id": endoftext})
    # Weights first, config.json last: a folder left by an interrupted write has no config.json.
    tmp = out / ".model.safetensors.partial"
    write_safetensors(tmp, cfg, seed)
    os.replace(tmp, out / "model.safetensors")
    for name in sorted(files, key=lambda n: n == "config.json"):
        (out / name).write_text(files[name], encoding="utf-8", newline="\n")
    return out
