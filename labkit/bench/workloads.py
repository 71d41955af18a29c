"""Bench workloads: `workloads/bench/NAME.yaml`, checked strictly, drawn deterministically.

Workload file
-------------
    name: fixed                         # optional, defaults to the file's stem
    about: one line                     # optional
    requests: 16                        # number of requests (>= 1)
    prompt_len: 128                     # a fixed number, or {uniform: [lo, hi]} (inclusive, randint)
    output_len: 32                      # max_tokens per request, same forms
    seed: 0                             # Python `random` seed of the draws
    vary_seed: true                     # timed repeat i draws with seed + i (fresh prompts, so a
                                        # repeat cannot hit the prefix cache); false: every repeat
                                        # runs the identical requests (repeats > 1 may then hit
                                        # the prefix cache on full blocks)
    token_range: [0, 10000]             # prompt ids drawn with randint(lo, hi) (inclusive)
    temperature: 0.6
    ignore_eos: true
    warmup: 2                           # rounds of the full workload before timing, or
                                        # {rounds: 1, requests: 8, output_len: 16}: a short round
                                        # (that many requests, max_tokens capped at output_len)
    repeats: 3                          # timed repeats; the report gives their median
    engine: {max_model_len: 4096}       # engine Config overrides (CLI flags override these)
    timing: generate                    # generate (default): time one `llm.generate` call per repeat;
                                        # steps: drive the engine step by step (add_request / step) and
                                        # also time every step: decode ms per token (batch1.yaml)

Limits, checked before anything is drawn: prompt_len and output_len at most 2**24 tokens, requests at
most 2**20, requests x the longest prompt at most 2**24 tokens (MAX_TOKENS: the draw is held in memory),
repeats and warm-up rounds at most 1000.

Draw order (upstream nano-vLLM bench.py): one `random.Random(seed)`; for each request the prompt
length (when uniform) then its ids; then, for each request, the output length (when uniform).
With seed 0, 256 requests, uniform [100, 1024] for both and token_range [0, 10000] this gives
upstream's 142,827 prompt tokens and 133,966 output tokens. `--num-requests N` draws the full
workload and keeps the first N requests, so a scaled-down run is a prefix of the full one.

Warm-up rounds draw from their own stream (`random.Random("labkit-bench-warmup:SEED:ROUND")`),
so warm-up prompts never seed the prefix cache with a timed repeat's blocks.

Models whose vocabulary is smaller than the id range get the ids folded (`id % vocab_size`):
lengths, and so every token total, are unchanged.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit import yamlfile
from labkit.engine_args import FIELDS, check_settings
from labkit.errors import LabkitError

TOP_KEYS = ("name", "about", "requests", "prompt_len", "output_len", "seed", "vary_seed", "token_range",
            "temperature", "ignore_eos", "warmup", "repeats", "engine", "timing")
TIMINGS = ("generate", "steps")
WARMUP_KEYS = ("rounds", "requests", "output_len")

# Engine Config fields a workload may set: those any file may (labkit/engine_args.py), but the device, which the
# run's --device gives (and never the tracer: tracing is off while timing).
ENGINE_KEYS = tuple(f for f in FIELDS if f != "device")

# What one workload may draw, checked before anything is drawn: its prompts are held in memory as Python lists
# (about 36 bytes a token), so requests x the longest prompt is bounded (2**24 tokens: 64 times nano's
# 256 x 1024; about 600 MB drawn), and so are the request count and the rounds.
MAX_REQUESTS = 1 << 20
MAX_TOKENS = 1 << 24
MAX_ROUNDS = 1000


@dataclass
class LengthSpec:
    """A fixed length (lo == hi, nothing drawn) or randint(lo, hi)."""
    lo: int
    hi: int
    uniform: bool

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.lo, self.hi) if self.uniform else self.lo

    def to_yaml(self) -> Any:
        return {"uniform": [self.lo, self.hi]} if self.uniform else self.lo

    def __str__(self) -> str:
        return f"U[{self.lo}, {self.hi}]" if self.uniform else str(self.lo)


@dataclass
class Warmup:
    rounds: int = 1
    requests: int | None = None      # None: the workload's own count
    output_len: int | None = None    # None: the workload's own output lengths

    @property
    def full(self) -> bool:
        return self.requests is None and self.output_len is None

    def to_yaml(self) -> Any:
        if self.full:
            return self.rounds
        d: dict[str, int] = {"rounds": self.rounds}
        if self.requests is not None:
            d["requests"] = self.requests
        if self.output_len is not None:
            d["output_len"] = self.output_len
        return d


@dataclass
class Workload:
    name: str
    requests: int
    prompt_len: LengthSpec
    output_len: LengthSpec
    about: str = ""
    seed: int = 0
    vary_seed: bool = False
    token_range: tuple[int, int] = (0, 10000)
    temperature: float = 0.6
    ignore_eos: bool = True
    warmup: Warmup = field(default_factory=Warmup)
    repeats: int = 1
    engine: dict = field(default_factory=dict)
    timing: str = "generate"
    path: str | None = None
    scaled_from: int | None = None   # the file's request count when --num-requests scaled it

    def params(self) -> dict:
        """The parameters that define the measurement (recorded in the JSON and compared)."""
        return {
            "name": self.name,
            "requests": self.requests,
            "prompt_len": self.prompt_len.to_yaml(),
            "output_len": self.output_len.to_yaml(),
            "seed": self.seed,
            "vary_seed": self.vary_seed,
            "token_range": list(self.token_range),
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos,
            "warmup": self.warmup.to_yaml(),
            "repeats": self.repeats,
            # Only when not the default, so runs recorded before the key existed stay comparable.
            **({"timing": self.timing} if self.timing != "generate" else {}),
        }

    def to_dict(self) -> dict:
        return {**self.params(), "about": self.about, "engine": dict(self.engine), "path": self.path,
                "scaled_from": self.scaled_from}

    def repeat_seed(self, i: int) -> int:
        return self.seed + i if self.vary_seed else self.seed

    def scaled(self, num_requests: int | None) -> "Workload":
        """The first `num_requests` requests of this workload (None: unchanged)."""
        if num_requests is None or num_requests == self.requests:
            return self
        if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
            raise LabkitError(f"--num-requests: must be a positive integer, got {num_requests!r}")
        if num_requests > self.requests:
            raise LabkitError(f"--num-requests: {num_requests} is more than the {self.requests} requests of "
                              f"workload {self.name!r} (it scales a workload down)")
        w = Workload(**{k: getattr(self, k) for k in self.__dataclass_fields__})
        w.scaled_from = self.scaled_from or self.requests
        w.requests = num_requests
        return w


@dataclass
class Draw:
    """One round's requests: prompt ids and max_tokens, in submission order."""
    seed: Any
    prompts: list[list[int]]
    max_tokens: list[int]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(self.max_tokens)

    def __len__(self) -> int:
        return len(self.prompts)


def _draw(w: Workload, rng: random.Random, n: int, seed: Any) -> Draw:
    lo, hi = w.token_range
    prompts = []
    for _ in range(n):
        length = w.prompt_len.draw(rng)
        prompts.append([rng.randint(lo, hi) for _ in range(length)])
    max_tokens = [w.output_len.draw(rng) for _ in range(n)]
    return Draw(seed, prompts, max_tokens)


def draw(w: Workload, seed: int | None = None) -> Draw:
    """The workload's requests for `seed` (default: its own seed), upstream's draw order.

    A scaled workload draws its full file count and keeps the first `w.requests`."""
    s = w.seed if seed is None else seed
    full = _draw(w, random.Random(s), max(w.requests, w.scaled_from or 0), s)
    return Draw(s, full.prompts[:w.requests], full.max_tokens[:w.requests])


def draw_repeat(w: Workload, i: int) -> Draw:
    return draw(w, w.repeat_seed(i))


def draw_warmup(w: Workload, round_index: int) -> Draw:
    """A warm-up round: its own random stream, `warmup.requests` requests, capped output lengths."""
    seed = f"labkit-bench-warmup:{w.seed}:{round_index}"
    n = w.requests if w.warmup.requests is None else min(w.warmup.requests, w.requests)
    d = _draw(w, random.Random(seed), n, seed)
    if w.warmup.output_len is not None:
        d.max_tokens = [min(t, w.warmup.output_len) for t in d.max_tokens]
    return d


def fold_to_vocab(prompts: list[list[int]], vocab_size: int) -> tuple[list[list[int]], bool]:
    """Ids >= vocab_size become id % vocab_size (only for models smaller than the draw range)."""
    if all(t < vocab_size for p in prompts for t in p):
        return prompts, False
    return [[t % vocab_size for t in p] for p in prompts], True


# ----------------------------------------------------------------------------- locating

def bench_dirs() -> list[Path]:
    """Where built-in workloads live: $LAB_ROOT/workloads/bench, then the source tree's."""
    out = []
    root = os.environ.get("LAB_ROOT")
    if root:
        out.append(Path(root) / "workloads" / "bench")
    src = Path(__file__).resolve().parents[2] / "workloads" / "bench"
    if src not in out:
        out.append(src)
    return out


def list_workloads() -> list[str]:
    return yamlfile.names_in(bench_dirs())


def resolve_workload_path(name_or_path: str | os.PathLike) -> Path:
    return yamlfile.resolve(name_or_path, bench_dirs(), "workload")


def load_workload(name_or_path: str | os.PathLike) -> Workload:
    """Load and check a workload by name (workloads/bench/NAME.yaml) or path; errors exit 2."""
    path = resolve_workload_path(name_or_path)
    return parse_workload(yamlfile.read(path, "workload"), path)


# ----------------------------------------------------------------------------- checking

def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class _Ctx:
    def __init__(self, path: Path | None):
        self.label = "<workload>" if path is None else str(path)

    def fail(self, where: str, msg: str):
        raise LabkitError(f"{self.label}: {where}: {msg}")

    def int(self, where: str, v, minimum: int = 0) -> int:
        if not _is_int(v) or v < minimum:
            self.fail(where, f"must be an integer >= {minimum}, got {v!r}")
        return v

    def bool(self, where: str, v) -> bool:
        if not isinstance(v, bool):
            self.fail(where, f"must be true or false, got {v!r}")
        return v


def _length(ctx: _Ctx, where: str, v) -> LengthSpec:
    if _is_int(v):
        spec = LengthSpec(ctx.int(where, v, 1), v, False)
    elif isinstance(v, dict) and set(v) == {"uniform"}:
        pair = v["uniform"]
        if not (isinstance(pair, list) and len(pair) == 2 and all(_is_int(x) for x in pair)
                and 1 <= pair[0] <= pair[1]):
            ctx.fail(where, f"uniform must be [lo, hi] with 1 <= lo <= hi, got {pair!r}")
        spec = LengthSpec(pair[0], pair[1], True)
    else:
        ctx.fail(where, f"must be a positive integer or {{uniform: [lo, hi]}}, got {v!r}")
    if spec.hi > MAX_TOKENS:
        ctx.fail(where, f"{spec.hi} tokens is more than a workload may draw ({MAX_TOKENS})")
    return spec


def _check_size(ctx: _Ctx, w: "Workload") -> None:
    """requests x the longest prompt within MAX_TOKENS, before a single request is drawn."""
    if w.requests > MAX_REQUESTS:
        ctx.fail("requests", f"{w.requests} is more than a workload may hold ({MAX_REQUESTS})")
    total = w.requests * w.prompt_len.hi
    if total > MAX_TOKENS:
        ctx.fail("requests", f"{w.requests} requests of up to {w.prompt_len.hi} prompt tokens draw up to {total} "
                             f"tokens, more than a workload may ({MAX_TOKENS}): fewer requests or shorter prompts")
    for where, n in (("repeats", w.repeats), ("warmup", w.warmup.rounds)):
        if n > MAX_ROUNDS:
            ctx.fail(where, f"{n} rounds is more than a workload may run ({MAX_ROUNDS})")


def _warmup(ctx: _Ctx, v) -> Warmup:
    if v is None:
        return Warmup(rounds=0)
    if _is_int(v):
        return Warmup(rounds=ctx.int("warmup", v, 0))
    if not isinstance(v, dict):
        ctx.fail("warmup", f"must be a number of rounds or {{rounds, requests, output_len}}, got {v!r}")
    unknown = sorted(set(v) - set(WARMUP_KEYS))
    if unknown:
        ctx.fail("warmup", f"unknown key {unknown[0]!r} (allowed: {', '.join(WARMUP_KEYS)})")
    w = Warmup(rounds=ctx.int("warmup.rounds", v.get("rounds", 1), 0))
    if v.get("requests") is not None:
        w.requests = ctx.int("warmup.requests", v["requests"], 1)
    if v.get("output_len") is not None:
        w.output_len = ctx.int("warmup.output_len", v["output_len"], 1)
    return w


def _engine(ctx: _Ctx, v) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        ctx.fail("engine", f"must be a mapping of engine Config fields, got {v!r}")
    return check_settings(v, ctx.fail, allowed=ENGINE_KEYS)


def parse_workload(data, path: str | os.PathLike | None = None) -> Workload:
    ctx = _Ctx(Path(path) if path is not None else None)
    if not isinstance(data, dict):
        raise LabkitError(f"{ctx.label}: a workload file must be a YAML mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        ctx.fail(unknown[0], f"unknown key (allowed: {', '.join(TOP_KEYS)})")
    for key in ("requests", "prompt_len", "output_len"):
        if key not in data:
            ctx.fail(key, "missing (required)")
    name = data.get("name", Path(path).stem if path is not None else "workload")
    if not isinstance(name, str) or not name.strip() or any(c in name for c in "/\\ \t\n") \
            or not name.isprintable() or len(name) > 100:
        ctx.fail("name", f"must be a non-empty word of at most 100 printable characters (no spaces or slashes), "
                         f"got {name!r:.120}")
    about = data.get("about", "")
    if not isinstance(about, str) or not " ".join(about.split()).isprintable():
        ctx.fail("about", f"must be printable text, got {about!r:.120}")
    token_range = data.get("token_range", [0, 10000])
    if (not isinstance(token_range, list) or len(token_range) != 2 or not all(_is_int(x) for x in token_range)
            or not 0 <= token_range[0] <= token_range[1]):
        ctx.fail("token_range", f"must be [lo, hi] with 0 <= lo <= hi, got {token_range!r}")
    timing = data.get("timing", "generate")
    if timing not in TIMINGS:
        ctx.fail("timing", f"must be one of {', '.join(TIMINGS)}, got {timing!r}")
    temperature = data.get("temperature", 0.6)
    if not _is_num(temperature) or temperature < 0:
        ctx.fail("temperature", f"must be a number >= 0, got {temperature!r}")
    w = Workload(
        name=name,
        about=" ".join(about.split()),
        requests=ctx.int("requests", data["requests"], 1),
        prompt_len=_length(ctx, "prompt_len", data["prompt_len"]),
        output_len=_length(ctx, "output_len", data["output_len"]),
        seed=ctx.int("seed", data.get("seed", 0), 0),
        vary_seed=ctx.bool("vary_seed", data.get("vary_seed", False)),
        token_range=(token_range[0], token_range[1]),
        temperature=float(temperature),
        ignore_eos=ctx.bool("ignore_eos", data.get("ignore_eos", True)),
        warmup=_warmup(ctx, data.get("warmup", 1)),
        repeats=ctx.int("repeats", data.get("repeats", 1), 1),
        engine=_engine(ctx, data.get("engine")),
        timing=timing,
        path=str(Path(path).resolve()) if path is not None else None,
    )
    _check_size(ctx, w)
    return w

