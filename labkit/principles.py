"""`labkit principles`: the CPU labs that need no engine, each computed here from first principles (numpy, the
model's config.json, its tokenizer) and compared, check by check, with the value the principle gives; every
check states that value and how it follows (`how`: 2 x 28 layers x 8 KV heads x 128 x 2 bytes = 112 KiB).

    labkit principles tokenizer    # encode/decode, softmax([2,1,0]), greedy vs sampling, the chat template
    labkit principles attention    # causal attention on X = [[1,0],[0,1],[1,1]], the mask's effect, V != Q/K
    labkit principles timeline     # known tokens against computed KV over three rounds
    labkit principles cache        # full recompute against the KV cache: 540 against 71 positions, same output
    labkit principles memory       # KV bytes per token / request / block from config.json; TTFT, ITL, TPOT
    labkit principles slots        # block_table[pos // B] * B + pos % B; blocks for 255/256/257 tokens
    labkit principles operators    # softmax, temperature, L2/LayerNorm/RMSNorm, SiLU/SwiGLU, GQA, RoPE
    labkit principles shapes       # one step's tensor shapes at TP=1 and TP=2 from config.json
    labkit principles all          # every one of them

Each writes runs/principles/NAME.json (verdict PASS / FAIL, every check with computed and expected values)
and a .md twin; `labkit report` picks them up. memory, operators and shapes read Qwen3-0.6B's geometry
(the qwen3-0.6b preset) unless --model names another folder: the expected values of the geometry-bound
checks are Qwen3-0.6B's, so with another geometry they are skipped and the verdict is RECORDED.
Exit 0 PASS/RECORDED, 1 FAIL.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from labkit.errors import LabkitError
from labkit.narrow import fit, hanging
from labkit.options import JsonOption, Out
from labkit.output import EXIT_FAIL, EXIT_PASS, envelope, finish, print_json, runs_dir, write_json

app = typer.Typer(help="CPU principle labs (no engine): each value computed from first principles and checked "
                       "against the value the principle gives, with how it follows.\n\n"
                       "Example: labkit principles all", no_args_is_help=True)

KIB, MIB, GIB = 1024, 1024**2, 1024**3
_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
# The geometry the expected values of the geometry-bound checks follow from (Qwen3-0.6B, bf16).
QWEN3_06B_GEOMETRY = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                 "hidden_size": 1024, "intermediate_size": 3072, "vocab_size": 151936, "dtype": "bfloat16"}


# --- checks ---------------------------------------------------------------------------------------------------


def _close(a: Any, b: Any, tol: float) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isfinite(a) and abs(a - b) <= tol
    return a == b


def _plain(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.floating, np.integer, np.bool_)):
        return v.item()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


class Checks:
    """Computed values against expected ones, each with how the expected value follows; a check is skipped
    where its expected value does not apply (another model's geometry)."""

    def __init__(self) -> None:
        self.items: list[dict] = []

    def eq(self, name: str, computed: Any, expected: Any, tol: float = 0.0, how: str = "", applies: bool = True):
        computed, expected = _plain(computed), _plain(expected)
        item = {"name": name, "computed": computed, "expected": expected, "tolerance": tol, "how": how}
        if applies:
            item["passed"] = _close(computed, expected, tol)
        else:
            item["passed"] = None
            item["skipped"] = "the expected value follows from Qwen3-0.6B's geometry; this model's differs"
        self.items.append(item)

    def verdict(self) -> str:
        if any(i["passed"] is False for i in self.items):
            return "FAIL"
        return "RECORDED" if any(i["passed"] is None for i in self.items) else "PASS"


@dataclass
class Ctx:
    model: Optional[str]

    def config(self) -> tuple[dict, str, dict, bool]:
        """config.json of --model, else the qwen3-0.6b preset: the config, where it came from, its geometry, and
        whether that is Qwen3-0.6B's (the geometry the expected values follow from)."""
        if self.model is None:
            from labkit.fake_model import preset_config

            cfg, source = preset_config("qwen3-0.6b"), "preset qwen3-0.6b (Qwen3-0.6B's geometry)"
        else:
            import json

            path = Path(self.model).expanduser()
            try:
                cfg, source = json.loads((path / "config.json").read_text(encoding="utf-8")), str(path.resolve())
            except (OSError, ValueError) as exc:
                raise LabkitError(f"--model {path}: cannot read config.json: {exc}") from None
        try:
            g = _geometry(cfg)
        except (KeyError, TypeError, ZeroDivisionError) as exc:
            raise LabkitError(f"{source}: config.json lacks what a Qwen3 config holds ({exc})") from None
        return cfg, source, g, g == QWEN3_06B_GEOMETRY


def _geometry(cfg: dict) -> dict:
    g = {k: cfg.get(k) for k in QWEN3_06B_GEOMETRY}
    g["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    g["dtype"] = str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32").replace("torch.", "")
    return g


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# --- the labs ---------------------------------------------------------------------------------------------------


def lab_tokenizer(ctx: Ctx, c: Checks) -> tuple[dict, str]:
    from transformers import AutoTokenizer

    from labkit.model import resolve_model

    model_dir = resolve_model(ctx.model)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    text = "大语言模型推理 needs a KV cache: 你好，世界!"
    ids = tok.encode(text, add_special_tokens=False)
    pieces = tok.convert_ids_to_tokens(ids)
    decoded = tok.decode(ids)
    han = [ch for ch in text if "\u4e00" <= ch <= "\u9fff"]
    one_char = [tok.decode([i]) for i in ids if len(tok.decode([i])) == 1 and "\u4e00" <= tok.decode([i]) <= "\u9fff"]
    c.eq("decode(encode(text)) == text", decoded == text, True,
         how="a byte-level BPE is lossless: decoding the ids gives the text back")
    scores = np.array([2.0, 1.0, 0.0])
    probs = softmax(scores)
    c.eq("softmax([2, 1, 0])", probs.round(6), [0.66524, 0.24473, 0.09003], 5e-6,
         how="e^2, e^1, e^0 = 7.389, 2.718, 1 over their sum 11.107")
    c.eq("greedy index", int(np.argmax(probs)), 0, how="greedy takes the argmax: score 2 (index 0) is the largest")
    draws = np.random.default_rng(0).choice(3, size=20000, p=probs)
    freq = np.bincount(draws, minlength=3) / draws.size
    c.eq("sampled frequencies near the probabilities (20000 draws, |diff| <= 0.01)",
         bool(np.abs(freq - probs).max() <= 0.01), True,
              how="a frequency over 20000 draws has a standard error of at most sqrt(0.25 / 20000) = 0.0035: 0.01 is "
                  "about three of them")
    chat = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True,
                                   enable_thinking=False)
    user_turn = f"<|im_start|>user\n{text}<|im_end|>"
    c.eq("chat template wraps the user turn in <|im_start|>user ... <|im_end|>", user_turn in chat, True,
         how="Qwen3's chat template writes each turn as <|im_start|>ROLE, a newline, the content, <|im_end|>")
    tail = chat.split("<|im_end|>")[-1].lstrip("\n")
    c.eq("generation prompt opens the assistant turn", tail.startswith("<|im_start|>assistant\n"), True,
         how="add_generation_prompt appends <|im_start|>assistant and a newline after the last turn")
    special = [len(tok.encode(t, add_special_tokens=False)) for t in ("<|im_start|>", "<|im_end|>")]
    c.eq("role markers are single special tokens", special, [1, 1],
         how="<|im_start|> and <|im_end|> are added special tokens: one id each")
    values = {"model": str(model_dir), "text": text, "ids": ids, "token_pieces": pieces, "decoded": decoded,
              "chinese_chars": len(han), "tokens": len(ids), "tokens_decoding_to_one_chinese_char": len(one_char),
              "scores": scores.tolist(), "probabilities": probs.tolist(), "greedy_index": int(np.argmax(probs)),
              "sampled_frequencies": freq.tolist(), "chat_template_text": chat}
    return values, (f"{len(han)} Chinese characters -> {len(ids)} tokens for the whole text, "
                    f"{len(one_char)} tokens are one Chinese character; softmax([2,1,0]) = "
                    f"{', '.join(f'{p:.5f}' for p in probs)}")


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    scores = q @ k.T / math.sqrt(q.shape[1])
    if causal:
        scores = np.where(np.triu(np.ones(scores.shape, dtype=bool), k=1), -np.inf, scores)
    w = softmax(scores)
    return w, w @ v


def lab_attention(ctx: Ctx, c: Checks) -> tuple[dict, str]:
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    w, out = _attention(x, x, x, causal=True)
    scores_last = (x @ x.T / math.sqrt(2))[-1]
    c.eq("last row scores", scores_last, [0.7071, 0.7071, 1.4142], 5e-5,
         how="x3 = [1, 1] dotted with x1, x2, x3 gives 1, 1, 2; times 1/sqrt(d = 2)")
    c.eq("row 2 weights", w[1, :2], [0.3302, 0.6698], 5e-5,
         how="row 2 reads x1 and x2 only (the mask): scores 0 and 0.7071; softmax = 1 / (1 + e^0.7071), e^0.7071 / (1 "
             "+ e^0.7071)")
    c.eq("last row weights", w[2], [0.2483, 0.2483, 0.5035], 5e-5,
         how="softmax(0.7071, 0.7071, 1.4142): e^1.4142 / (2 e^0.7071 + e^1.4142) = 0.5035, the rest split evenly")
    c.eq("last output", out[2], [0.7517, 0.7517], 5e-5, how="0.2483 [1, 0] + 0.2483 [0, 1] + 0.5035 [1, 1]")
    c.eq("every row's weights sum to 1", w.sum(axis=1), [1.0, 1.0, 1.0], 1e-12, how="softmax normalises each row")
    changed = x.copy()
    changed[2] = [9.0, -5.0]
    deltas = {}
    for causal in (True, False):
        _, a = _attention(x, x, x, causal)
        _, b = _attention(changed, changed, changed, causal)
        deltas[causal] = float(np.abs(a[:2] - b[:2]).max())
    c.eq("masked: earlier outputs unchanged when the last position changes", deltas[True], 0.0, 0.0,
         how="with the causal mask rows 1 and 2 never read position 3")
    c.eq("unmasked: earlier outputs move", deltas[False], 8.15455, 5e-6,
         how="without the mask rows 1 and 2 read position 3, now [9, -5], so their outputs move (8.15455 at most, the "
             "value this computation gives)")
    v2 = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 2.0]])
    w2, out2 = _attention(x, x, v2, causal=True)
    c.eq("V != Q/K: last row weights", w2[2], [0.248255, 0.248255, 0.503490], 5e-7,
         how="the weights come from Q and K only: the same as with V = X (0.2483, 0.2483, 0.5035 to more digits)")
    c.eq("V != Q/K: last output", out2[2], [0.751745, 1.503490], 5e-7,
         how="0.248255 [1, 0] + 0.248255 [0, 2] + 0.503490 [1, 2]")
    values = {"x": x.tolist(), "weights": w.tolist(), "outputs": out.tolist(), "masked_earlier_delta": deltas[True],
              "unmasked_earlier_delta": deltas[False], "v_distinct": v2.tolist(), "weights_v_distinct": w2.tolist(),
              "outputs_v_distinct": out2.tolist()}
    return values, (f"last row weights {np.round(w[2], 4).tolist()}, output {np.round(out[2], 4).tolist()}; "
                    f"changing the last position moves earlier outputs by {deltas[True]:g} with the mask, "
                    f"{deltas[False]:.5f} without")


def lab_timeline(ctx: Ctx, c: Checks) -> tuple[dict, str]:
    known = ["t1", "t2", "t3"]
    kv = 0
    rounds = []
    for n in range(3):
        inputs = known[kv:]            # a forward takes every known token without KV yet
        kv += len(inputs)              # ... and leaves their K/V behind
        new = f"t{len(known) + 1}"     # sampling adds a token whose K/V the next forward computes
        known.append(new)
        rounds.append({"round": n + 1, "phase": "prefill" if n == 0 else "decode", "forward_input": inputs,
                       "kv_covers": known[:kv], "output": new, "known_token_count": len(known), "kv_count": kv})
    c.eq("forward input widths", [len(r["forward_input"]) for r in rounds], [3, 1, 1],
         how="the first forward takes the 3 prompt tokens; each later one only the token sampled last")
    c.eq("KV covers t1-t3, t1-t4, t1-t5", [r["kv_covers"][-1] for r in rounds], ["t3", "t4", "t5"],
         how="after a forward the KV holds every token that has been an input so far")
    c.eq("outputs", [r["output"] for r in rounds], ["t4", "t5", "t6"],
         how="each forward samples the next token: t4, then t5, then t6")
    c.eq("known tokens = KV + 1 after every round",
         [r["known_token_count"] - r["kv_count"] for r in rounds], [1, 1, 1],
              how="the token just sampled has no K/V until the next forward takes it as input")
    return {"rounds": rounds}, (f"{len(rounds)} forwards of widths {[len(r['forward_input']) for r in rounds]}; "
                                "each output has no KV until the next forward")


def lab_cache(ctx: Ctx, c: Checks) -> tuple[dict, str]:
    prompt_len, new_tokens, d = 64, 8, 16
    rng = np.random.default_rng(0)
    embed = rng.standard_normal((512, d))
    wq, wk, wv = (rng.standard_normal((d, d)) / math.sqrt(d) for _ in range(3))
    # A fixed token path (teacher forcing): both loops see the same ids, so any difference is the cache's.
    path = rng.integers(0, 512, prompt_len + new_tokens - 1).tolist()

    full_positions, full_last = [], []
    for step in range(new_tokens):
        h = embed[path[:prompt_len + step]]                 # every known position, recomputed
        _, out = _attention(h @ wq, h @ wk, h @ wv, causal=True)
        full_positions.append(len(h))
        full_last.append(out[-1])

    cached_positions, cached_last = [], []
    k_cache = np.zeros((0, d))
    v_cache = np.zeros((0, d))
    pending = path[:prompt_len]
    for step in range(new_tokens):
        h = embed[pending]                                  # only positions without K/V yet
        k_cache = np.vstack([k_cache, h @ wk])
        v_cache = np.vstack([v_cache, h @ wv])
        q = h[-1:] @ wq                                     # the last query is all the next token needs
        _, out = _attention(q, k_cache, v_cache, causal=False)   # the last query may read every cached key
        cached_positions.append(len(h))
        cached_last.append(out[-1])
        pending = [path[prompt_len + step]] if step + 1 < new_tokens else []
    err = float(np.abs(np.array(full_last) - np.array(cached_last)).max())
    c.eq("uncached inputs per round", full_positions, list(range(64, 72)),
         how="without a cache round n recomputes all 64 + n known positions: 64, 65, ..., 71")
    c.eq("uncached positions in total", sum(full_positions), 540, how="64 + 65 + ... + 71 = 8 x 67.5 = 540")
    c.eq("cached inputs per round", cached_positions, [64] + [1] * 7,
         how="with a cache only positions without K/V: the 64 prompt positions, then the 1 new token per round")
    c.eq("cached positions in total", sum(cached_positions), 71, how="64 + 7 x 1 = 71")
    c.eq("same last output on both paths (max |diff|, float64)", err, 0.0, 1e-12,
         how="the cache holds the K/V the recompute makes again: the same numbers, so the same output")
    values = {"prompt_len": prompt_len, "new_tokens": new_tokens, "uncached_inputs": full_positions,
              "cached_inputs": cached_positions, "uncached_total": sum(full_positions),
              "cached_total": sum(cached_positions), "max_error": err}
    return values, (f"{sum(full_positions)} positions without the cache against {sum(cached_positions)} with it, "
                    f"last outputs equal to {err:.1e}")


def lab_memory(ctx: Ctx, c: Checks) -> tuple[dict, str]:
    cfg, source, g, qwen3_06b = ctx.config()
    itemsize = _ITEMSIZE.get(g["dtype"], 4)
    per_token = 2 * g["num_hidden_layers"] * g["num_key_value_heads"] * g["head_dim"] * itemsize   # K and V
    wrong_heads = 2 * g["num_hidden_layers"] * g["num_attention_heads"] * g["head_dim"] * itemsize
    request = per_token * 4096
    block = per_token * 256
    eight = request * 8
    c.eq("KV bytes per token (KiB)", per_token / KIB, 112,
         how="2 (K and V) x 28 layers x 8 KV heads x head_dim 128 x 2 bytes (bf16) = 114688 B = 112 "
             "KiB", applies=qwen3_06b)
    c.eq("one request, 4096 cached positions (MiB)", request / MIB, 448,
         how="112 KiB x 4096 positions = 458752 KiB = 448 MiB", applies=qwen3_06b)
    c.eq("a 256-token block over all layers (MiB)", block / MIB, 28,
         how="112 KiB x 256 positions = 28672 KiB = 28 MiB", applies=qwen3_06b)
    c.eq("eight such requests (GiB)", eight / GIB, 3.5, how="448 MiB x 8 = 3584 MiB = 3.5 GiB", applies=qwen3_06b)
    arrivals = [0.12, 0.16, 0.21, 0.25]     # a teaching timeline: a token at each of these seconds
    ttft = arrivals[0] * 1000
    itl = [round((b - a) * 1000, 6) for a, b in zip(arrivals, arrivals[1:])]
    tpot = (arrivals[-1] - arrivals[0]) * 1000 / (len(arrivals) - 1)
    c.eq("TTFT (ms)", ttft, 120, 1e-9, how="the first token arrives 0.12 s after the request")
    c.eq("ITL (ms)", itl, [40, 50, 40], 1e-6, how="the gaps between tokens at 0.12, 0.16, 0.21 and 0.25 s")
    c.eq("TPOT (ms)", round(tpot, 2), 43.33, 1e-9, how="(0.25 - 0.12) s over the 3 tokens after the first = 43.33 ms")
    values = {"config": source, "geometry": g, "kv_bytes_per_token": per_token, "kv_kib_per_token": per_token / KIB,
              "kv_mib_per_request_4096": request / MIB, "kv_mib_per_block_256": block / MIB,
              "kv_gib_eight_requests": eight / GIB, "kv_kib_per_token_if_q_heads_used": wrong_heads / KIB,
              "token_times_s": arrivals, "ttft_ms": ttft, "itl_ms": itl, "tpot_ms": tpot}
    return values, (f"{per_token} B ({per_token / KIB:g} KiB) of KV per token, {request / MIB:g} MiB per 4096-token "
                    f"request, {block / MIB:g} MiB per block, {eight / GIB:g} GiB for eight; TTFT {ttft:g} ms, "
                    f"TPOT {tpot:.2f} ms")


def lab_slots(ctx: Ctx, c: Checks) -> tuple[dict, str]:
    block_size, table, positions = 4, [17, 5, 23], [0, 6, 8]
    rows = [{"position": p, "logical_block": p // block_size, "physical_block": table[p // block_size],
             "offset": p % block_size, "slot": table[p // block_size] * block_size + p % block_size}
            for p in positions]
    c.eq("slots of positions 0, 6, 8 (B=4, block table [17, 5, 23])", [r["slot"] for r in rows], [68, 22, 92],
         how="block_table[pos // 4] * 4 + pos % 4: 17 x 4 + 0, 5 x 4 + 2, 23 x 4 + 0")
    lengths = [255, 256, 257]
    blocks = [-(-n // 256) for n in lengths]
    c.eq("blocks for 255 / 256 / 257 tokens (B=256)", blocks, [1, 1, 2], how="ceil(tokens / 256)")
    return {"block_size": block_size, "block_table": table, "positions": rows, "lengths": lengths,
            "blocks_b256": blocks}, (f"slots {[r['slot'] for r in rows]} for positions {positions}; "
                                     f"{blocks} blocks for {lengths} tokens")


def _rope(vec: np.ndarray, pos: float, theta: float) -> np.ndarray:
    """Rotate pairs (i, i + d/2) by pos * theta^(-2i/d), the half-split layout the engine uses."""
    half = vec.shape[-1] // 2
    freqs = theta ** (-np.arange(half) * 2.0 / vec.shape[-1])
    cos, sin = np.cos(pos * freqs), np.sin(pos * freqs)
    a, b = vec[..., :half], vec[..., half:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def lab_operators(ctx: Ctx, c: Checks) -> tuple[dict, str]:
    cfg, source, g, qwen3_06b = ctx.config()
    x = np.array([1.0, 2.0, 3.0])
    sm = softmax(x)
    c.eq("softmax([1,2,3])", sm, [0.09003, 0.24473, 0.66524], 5e-6,
         how="e^1, e^2, e^3 = 2.718, 7.389, 20.086 over their sum 30.193")
    c.eq("exp([1,2,3] - max)", np.exp(x - x.max()), [0.13534, 0.36788, 1.0], 5e-6,
         how="e^-2, e^-1, e^0: subtracting the max keeps every exp at most 1 and leaves the softmax as it is")
    c.eq("softmax at temperature 0.5", softmax(x / 0.5), [0.01588, 0.11731, 0.86681], 5e-6,
         how="softmax([2, 4, 6]): dividing by 0.5 doubles the gaps, so the top token gains")
    c.eq("softmax at temperature 2", softmax(x / 2), [0.18632, 0.30720, 0.50648], 5e-6,
         how="softmax([0.5, 1, 1.5]): halving the gaps flattens the distribution")
    l2 = x / np.linalg.norm(x)
    ln = (x - x.mean()) / np.sqrt(x.var())
    rms = math.sqrt(float(np.mean(x**2)))
    rn = x / rms
    c.eq("L2 normalisation", l2, [0.26726, 0.53452, 0.80178], 5e-6, how="x / sqrt(1 + 4 + 9) = x / 3.74166")
    c.eq("LayerNorm (gamma 1, beta 0, no eps)", ln, [-1.22474, 0.0, 1.22474], 5e-6,
         how="(x - mean 2) / standard deviation sqrt(2/3) = 0.81650")
    c.eq("RMS([1,2,3])", rms, 2.16025, 5e-6, how="sqrt((1 + 4 + 9) / 3) = sqrt(14/3)")
    c.eq("RMSNorm (gamma 1, no eps)", rn, [0.46291, 0.92582, 1.38873], 5e-6, how="x / RMS 2.16025")
    c.eq("RMSNorm ignores the scale of its input", (10 * x) / math.sqrt(float(np.mean((10 * x) ** 2))), rn, 1e-12,
         how="RMS(10 x) = 10 RMS(x): the factor cancels")
    gate, up = np.array([-1.0, 0.0, 1.0]), np.array([2.0, 3.0, 4.0])
    silu = gate / (1 + np.exp(-gate))
    c.eq("SiLU([-1,0,1])", silu, [-0.26894, 0.0, 0.73106], 5e-6, how="g x sigmoid(g): -1 / (1 + e), 0, 1 / (1 + e^-1)")
    c.eq("SwiGLU: SiLU(gate) * up", silu * up, [-0.53788, 0.0, 2.92423], 5e-6,
         how="SiLU(gate) times up = [2, 3, 4], element by element")
    group = g["num_attention_heads"] // g["num_key_value_heads"]
    kv_of_q = [h // group for h in range(g["num_attention_heads"])]
    c.eq("GQA: the KV head each Q head reads", kv_of_q[:4], [0, 0, 1, 1],
         how="16 Q heads share 8 KV heads: Q head h reads KV head h // 2", applies=qwen3_06b)
    h, nq, nkv, d = g["hidden_size"], g["num_attention_heads"], g["num_key_value_heads"], g["head_dim"]
    shapes = {"W_Q": [h, nq * d], "W_K": [h, nkv * d], "W_V": [h, nkv * d], "heads concatenated": [1, nq * d],
              "W_O": [nq * d, h]}
    c.eq("projection shapes W_Q, W_K, W_V, W_O", [shapes["W_Q"], shapes["W_K"], shapes["W_V"], shapes["W_O"]],
         [[1024, 2048], [1024, 1024], [1024, 1024], [2048, 1024]],
              how="hidden 1024; Q is 16 heads x 128 = 2048 wide, K and V 8 x 128 = 1024; W_O maps 2048 back to "
                  "1024", applies=qwen3_06b)
    theta = float(cfg.get("rope_theta") or 1e6)
    quarter = _rope(np.array([1.0, 0.0]), math.pi / 2, theta)   # one pair, frequency theta^0 = 1: angle = pi/2
    c.eq("rotating [1, 0] by 90 degrees", quarter, [0.0, 1.0], 1e-12,
         how="one pair at frequency theta^0 = 1 and angle pi/2: (cos, sin) = (0, 1)")
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal(d), rng.standard_normal(d)
    s1 = float(_rope(q, 3, theta) @ _rope(k, 10, theta))
    s2 = float(_rope(q, 103, theta) @ _rope(k, 110, theta))
    c.eq("RoPE score depends on the distance only (positions 3/10 against 103/110)", s1, s2, 1e-9,
         how="rotating q by m and k by n leaves the angle m - n in their dot product: 3 - 10 = 103 - 110")
    norm_kept = float(np.linalg.norm(_rope(q, 57, theta)) - np.linalg.norm(q))
    c.eq("RoPE keeps the length", norm_kept, 0.0, 1e-9, how="a rotation keeps the norm")
    moved = np.nonzero(np.abs(_rope(np.eye(d)[0], 5, theta)) > 1e-12)[0].tolist()
    c.eq("RoPE rotates component 0 with component d/2", moved, [0, d // 2],
         how="the half-split layout pairs component i with i + d/2")
    values = {"config": source, "softmax": sm.tolist(), "l2": l2.tolist(), "layernorm": ln.tolist(), "rms": rms,
              "rmsnorm": rn.tolist(), "silu": silu.tolist(), "swiglu": (silu * up).tolist(), "gqa_kv_of_q": kv_of_q,
              "projection_shapes": shapes, "rope_theta": theta, "rope_relative_scores": [s1, s2],
              "rope_pair_of_component_0": moved}
    return values, (f"softmax {np.round(sm, 5).tolist()}, RMSNorm {np.round(rn, 5).tolist()}, "
                    f"SwiGLU {np.round(silu * up, 5).tolist()}; {nq} Q heads over {nkv} KV heads")


def lab_shapes(ctx: Ctx, c: Checks) -> tuple[dict, str]:
    from labkit.shapes import per_rank_shapes

    cfg, source, g, qwen3_06b = ctx.config()
    h, nq, nkv, d = g["hidden_size"], g["num_attention_heads"], g["num_key_value_heads"], g["head_dim"]
    inter, vocab = g["intermediate_size"], g["vocab_size"]

    def step(lens: list[int]) -> dict:
        t = sum(lens)
        return {"T": t, "N": len(lens), "qkv_proj": [t, (nq + 2 * nkv) * d], "q": [t, nq, d], "k": [t, nkv, d],
                "v": [t, nkv, d], "o_proj": [t, h], "gate_up_proj": [t, 2 * inter], "gate": [t, inter],
                "down_proj": [t, h], "logits": [len(lens), vocab]}

    def last_rows(lens: list[int]) -> tuple[list[int], list[int]]:
        cu = np.concatenate([[0], np.cumsum(lens)]).tolist()
        return cu, [x - 1 for x in cu[1:]]

    prefill = step([64, 96])                 # lifecycle: prompts of 64 and 96 tokens in one prefill
    decode = step([1, 1])
    # chunk case, budget 512: step 1 computes A's first 512 of 700 positions (the budget ends there); step 2
    # the rest of A, and B's 32 in the budget left.
    budget, a_len, b_len = 512, 700, 32
    a_first = min(a_len, budget)
    a_rest = a_len - a_first
    chunk_lens = [a_rest] + ([b_len] if budget - a_rest >= b_len else [])
    chunk = step(chunk_lens)
    a_scores = [a_rest, a_first + a_rest]    # A's new queries against every position A can read
    cu_life, rows_life = last_rows([64, 96])
    cu_chunk, rows_chunk = last_rows(chunk_lens)
    qkv_rows = {"q": [0, nq * d], "k": [nq * d, (nq + nkv) * d], "v": [(nq + nkv) * d, (nq + 2 * nkv) * d]}
    c.eq("lifecycle prefill qkv_proj output", prefill["qkv_proj"], [160, 4096], applies=qwen3_06b,
         how="T = 64 + 96 = 160 rows; (16 + 2 x 8) heads x 128 = 4096 columns")
    c.eq("lifecycle prefill Q, K, V", [prefill["q"], prefill["k"], prefill["v"]],
         [[160, 16, 128], [160, 8, 128], [160, 8, 128]], applies=qwen3_06b,
              how="[T, heads, head_dim 128]: 16 Q heads, 8 K heads, 8 V heads")
    c.eq("lifecycle prefill o_proj, gate_up, down_proj", [prefill["o_proj"], prefill["gate_up_proj"],
                                                          prefill["down_proj"]],
         [[160, 1024], [160, 6144], [160, 1024]],
         applies=qwen3_06b, how="o_proj back to hidden 1024; gate_up 2 x 3072 = 6144; down_proj back to 1024")
    c.eq("lifecycle prefill logits (one row per sequence)", prefill["logits"], [2, 151936], applies=qwen3_06b,
         how="only each sequence's last position reaches the LM head: 2 rows x vocab 151936")
    c.eq("first decode qkv_proj output", decode["qkv_proj"], [2, 4096], applies=qwen3_06b,
         how="one token per sequence: T = 2")
    c.eq("rows the LM head keeps: lifecycle prefill", rows_life, [63, 159],
         how="each sequence's last position: cu_seqlens_q [0, 64, 160] minus 1 at the ends")
    c.eq("rows the LM head keeps: chunk step 2", rows_chunk, [187, 219],
         how="cu_seqlens_q [0, 188, 220] minus 1 at the ends")
    c.eq("qkv weight rows of Q, K, V (TP=1)", [qkv_rows["q"], qkv_rows["k"], qkv_rows["v"]],
         [[0, 2048], [2048, 3072], [3072, 4096]], applies=qwen3_06b,
              how="Q first (16 x 128 = 2048 rows), then K and V (8 x 128 = 1024 each)")
    c.eq("chunk step 2: residual stream, gate/up halves", [[chunk["T"], h], chunk["gate"]], [[220, 1024], [220, 3072]],
         how="T = 188 + 32 = 220 rows of hidden 1024; gate and up are halves of 2 x 3072", applies=qwen3_06b)
    c.eq("chunk step 2: one head's scores for A", a_scores, [188, 700],
         how="A's 188 new queries against all 700 positions A can read")
    tp2 = per_rank_shapes(cfg, 2) if nq % 2 == 0 and nkv % 2 == 0 and vocab % 2 == 0 and inter % 2 == 0 else None
    if tp2 is not None:
        p = tp2["params"]
        got = {"q_heads": tp2["heads"]["q"]["rank"], "kv_heads": tp2["heads"]["kv"]["rank"],
               "qkv_width": p["model.layers.N.self_attn.qkv_proj.weight"]["rank"][0],
               "o_proj_input": p["model.layers.N.self_attn.o_proj.weight"]["rank"][1],
               "gate_up_width": p["model.layers.N.mlp.gate_up_proj.weight"]["rank"][0],
               "down_input": p["model.layers.N.mlp.down_proj.weight"]["rank"][1],
               "vocab_shard": p["lm_head.weight"]["rank"][0],
               "kv_kib_per_token_per_rank": tp2["kv_bytes_per_token"]["rank"] / KIB,
               "kv_kib_per_token_two_ranks": 2 * tp2["kv_bytes_per_token"]["rank"] / KIB}
        c.eq("TP=2 per rank: q heads, kv heads, qkv, o_proj in, gate_up, down in, vocab shard",
             [got[k] for k in ("q_heads", "kv_heads", "qkv_width", "o_proj_input", "gate_up_width", "down_input",
                               "vocab_shard")], [8, 4, 2048, 1024, 3072, 1536, 75968],
                                    how="each rank holds half: 16/2 Q heads, 8/2 KV heads, qkv 4096/2, o_proj input "
                                        "2048/2, gate_up 6144/2, down input 3072/2, vocab 151936/2",
             applies=qwen3_06b)
        c.eq("TP=2 KV per token: per rank, both ranks (KiB)", [got["kv_kib_per_token_per_rank"],
                                                               got["kv_kib_per_token_two_ranks"]], [56, 112],
             how="each rank stores its 4 of the 8 KV heads: 112 KiB / 2 per rank, 112 KiB on both", applies=qwen3_06b)
    else:
        got = None
    values = {"config": source, "geometry": g, "lifecycle_prefill": prefill, "first_decode": decode,
              "chunk_step2": chunk, "chunk_step2_scores_of_A": a_scores, "cu_seqlens_q_lifecycle": cu_life,
              "last_rows_lifecycle": rows_life,
              "cu_seqlens_q_chunk": cu_chunk, "last_rows_chunk": rows_chunk, "qkv_weight_rows": qkv_rows,
              "tp2_per_rank": got}
    return values, (f"lifecycle prefill T={prefill['T']}: qkv {prefill['qkv_proj']}, logits {prefill['logits']} "
                    f"(rows {rows_life}); TP=2 rank: qkv width {got['qkv_width'] if got else '-'}, vocab shard "
                    f"{got['vocab_shard'] if got else '-'}")


_CONFIG_HELP = "Model folder whose config.json to use (default: the qwen3-0.6b preset, Qwen3-0.6B's geometry)."


@dataclass
class PrincipleLab:
    name: str
    title: str
    evidence: str
    run: Callable[[Ctx, Checks], tuple[dict, str]]
    uses_model: str = ""     # what --model means for this lab ("" = it takes none)


LABS = {lab.name: lab for lab in [
    PrincipleLab("tokenizer", "Text, tokens, sampling probabilities and the chat template", "cpu-executed",
                 lab_tokenizer, "Model folder whose tokenizer to use (default: $MODEL_DIR or the tiny model)."),
    PrincipleLab("attention", "Causal attention computed by hand", "cpu-executed", lab_attention),
    PrincipleLab("timeline", "Known tokens against computed KV, round by round", "static-estimate", lab_timeline),
    PrincipleLab("cache", "What the KV cache saves: 540 against 71 positions", "cpu-executed", lab_cache),
    PrincipleLab("memory", "KV memory budget and latency metrics", "static-estimate", lab_memory, _CONFIG_HELP),
    PrincipleLab("slots", "From a logical position to a cache slot", "static-estimate", lab_slots),
    PrincipleLab("operators", "Softmax, norms, SiLU/SwiGLU, GQA and RoPE on small numbers", "cpu-executed",
                 lab_operators, _CONFIG_HELP),
    PrincipleLab("shapes", "Shapes of one step from config.json, TP=1 and TP=2", "static-estimate", lab_shapes,
                 _CONFIG_HELP),
]}


def run_lab(name: str, model: Optional[str], out: Optional[Path]) -> tuple[dict, Path]:
    lab = LABS[name]
    checks = Checks()
    values, headline = lab.run(Ctx(model if lab.uses_model else None), checks)
    model_dir = values.get("model") if name == "tokenizer" else (model if lab.uses_model else None)
    env = envelope(f"principles {name}", device="cpu", model_dir=model_dir, evidence=lab.evidence)
    result = finish(env, lab=name, title=lab.title, verdict=checks.verdict(), headline=headline,
                    checks=checks.items, values=values)
    path = out or runs_dir() / "principles" / f"{name}.json"
    write_json(path, result)
    path.with_suffix(".md").write_text(markdown(result), encoding="utf-8")
    return result, path


def _short(v: Any) -> Any:
    if isinstance(v, float):
        return float(f"{v:.6g}")
    if isinstance(v, list):
        return [_short(x) for x in v]
    return v


def _show(v: Any) -> str:
    text = str(_short(_plain(v)))
    return text if len(text) <= 70 else text[:67] + "..."


def markdown(result: dict) -> str:
    lines = [f"# principles {result['lab']}: **{result['verdict']}**", "", f"{result['title']} (evidence: "
             f"{result['evidence']})", "", result["headline"], "",
             "| check | computed | expected | how it follows | tolerance | result |", "| --- " * 6 + "|"]
    for c in result["checks"]:
        state = "skipped" if c["passed"] is None else ("PASS" if c["passed"] else "FAIL")
        lines.append(f"| {c['name']} | {_show(c['computed'])} | {_show(c['expected'])} | {c.get('how', '')} | "
                     f"{c['tolerance']:g} | {state} |")
    return "\n".join(lines) + "\n"


_STYLE = {"PASS": "bold green", "FAIL": "bold red", "RECORDED": "bold"}


def _print(result: dict, path: Path, console: Console) -> None:
    table = Table(title=f"principles {result['lab']}: {result['title']}", title_justify="left")
    # How each value follows is a sentence: a column of its own where the terminal has room for it, else a
    # dim line under the check's name.
    wide = console.width >= 160
    for col in ("check", "computed", "expected") + (("how it follows",) if wide else ()) + ("result",):
        table.add_column(col)
    states = []
    for c in result["checks"]:
        state = "skipped" if c["passed"] is None else ("PASS" if c["passed"] else "FAIL")
        states.append(state)
        how = c.get("how", "")
        name = Text(c["name"]) if wide or not how else Text.assemble(c["name"], "\n", (how, "dim"))
        table.add_row(name, Text(_show(c["computed"])), Text(_show(c["expected"])), *((Text(how),) if wide else ()),
                      Text(state, style=_STYLE.get(state, "yellow")))
    if fit(table, console):
        console.print(table)
    else:  # a value with a word too long for its column: a block per check, every word whole
        console.print(Text(table.title or "", style="italic"))
        for c, state in zip(result["checks"], states):
            console.print(hanging(f"{state:8} ", f"{c['name']}: {_show(c['computed'])} (expected "
                                  f"{_show(c['expected'])})", label_style=_STYLE.get(state, "yellow")))
            if c.get("how"):
                console.print(hanging(" " * 9, Text(c["how"], style="dim")))
    console.print(hanging(f"{result['verdict']} ", result["headline"], label_style=_STYLE[result["verdict"]]))
    console.print(f"wrote {path} and {path.with_suffix('.md')}")


def _exit(verdicts: list[str]) -> None:
    raise typer.Exit(EXIT_FAIL if "FAIL" in verdicts else EXIT_PASS)


def _run_and_show(name: str, model: Optional[str], out: Optional[Path], as_json: bool) -> None:
    result, path = run_lab(name, model, out)
    if as_json:
        print_json(result)
    else:
        _print(result, path, Console())
    _exit([result["verdict"]])


LabOut = Out("JSON path (default: runs/principles/LAB.json).")


def _command(name: str) -> Callable:
    """The Typer command of one lab; Typer reads its signature, so a lab that takes no model shows no --model."""
    lab = LABS[name]
    if lab.uses_model:
        def fn(model: Optional[str] = typer.Option(None, "--model", metavar="DIR", help=lab.uses_model),
               out: LabOut = None, as_json: JsonOption = False) -> None:
            _run_and_show(name, model, out, as_json)
    else:
        def fn(out: LabOut = None, as_json: JsonOption = False) -> None:
            _run_and_show(name, None, out, as_json)
    fn.__doc__ = (f"{lab.title}; writes runs/principles/{name}.json (each check with how its value follows).\n\n"
                  f"Example: labkit principles {name}")
    return fn


for _name in LABS:
    app.command(_name)(_command(_name))


@app.command("all")
def all_cmd(
    model: Optional[str] = typer.Option(None, "--model", metavar="DIR",
                                        help="Model folder for the tokenizer and config (default: the tiny model's "
                                             "tokenizer, the qwen3-0.6b preset's config)."),
    as_json: JsonOption = False,
) -> None:
    """Run every principles lab; exit 1 if any FAILs.

    Example: labkit principles all --json
    """
    console = Console(quiet=as_json)
    results = []
    for name in LABS:
        result, path = run_lab(name, model, None)
        results.append(result)
        # The headline's continuation lines stay right of the verdict column.
        console.print(hanging(f"{result['verdict']:8} ", f"{name}: {result['headline']}",
                              label_style=_STYLE[result["verdict"]]))
    if as_json:
        print_json(results)
    else:
        console.print(f"wrote {len(results)} results under {runs_dir() / 'principles'}")
    _exit([r["verdict"] for r in results])
