"""The fixed-path suites of `labkit logits-check`: which requests run, in which engine setting, and
the exact token path (prompt + forced continuation) every request follows.

A *row* is one accepted step of one request: the logits of its last position, computed on the
request's prompt plus the first k forced continuation tokens (k = 0 .. max_tokens-1). A request
with max_tokens N gives N rows; a chunked prefill's intermediate candidates are not rows.

Every case runs in a fresh engine (its own scheduler, block pool and prefix cache), so cases
cannot leak state into each other. All cases use 256-token KV blocks.

baseline (15 rows) - full and chunked prefill, decode, a page crossing, uneven batches:
    A      1 request: prompt [100, 101, 102], 3 outputs: prefill then 2 decodes          3 rows
    B      2 requests prefilled together: prompts [100..102] / [200..203],
           2 / 5 outputs: uneven batch, R1 leaves after step 2, R2 decodes alone        7 rows
    C      1 request: prompt range(100, 356) = exactly one block, 3 outputs: the
           first decode writes position 256, the first slot of a second block          3 rows
    chunk  A = 700 random ids, B = 32, budget 512: step 1 computes 512 of A (its
           candidate is discarded, not a row), step 2 A's last 188 with B's 32:
           1 output each                                                              2 rows
graph (126 rows) - batches of 1, 9, 16, 17 and 20 requests of uneven prompt lengths
    (4..123 ids), max_num_seqs 20: every request prefills, then all decode once in one
    batch (17 and 20 have no graph bucket when max_num_seqs is 20): 2 rows a request, 63 requests.
prefix (6 rows) - budget 1024 so each prefill is one step:
    cold   620 random ids, 2 outputs (nothing cached)                                  2 rows
    hot    the same request (same prompt, same continuation), submitted after cold
           finished: its prefill hits 512 cached tokens and computes 108              2 rows
    share  first 512 ids of cold + 108 others, submitted after hot finished: hits 512   2 rows
    (cold and hot rows have identical inputs, so hot-vs-cold is also visible directly.)
tp (15 rows) - baseline's cases; compared TP=2 (lhs) against TP=1 (rhs).
mixed (27 rows) - scheduling_policy mixed, budget 256 / 128: decode rows and prefill chunks in one step.
    mixA   a 40-id request decodes 6 tokens while a 700-id and a 300-id prompt are chunked beside it
           (any prefill row may be chunked; a chunk that completes its prompt samples)            11 rows
    mixB   a 50-id request decodes 12 tokens while a 600-id prompt is chunked by 128; once that one
           finishes, a request sharing its first 512 ids hits them and prefills the rest beside
           the decodes                                                                            16 rows
kv (49 rows) - baseline's cases plus `decode17` (17 requests, 2 outputs each, max_num_seqs 20:
    a decode batch with no graph bucket) = 15 + 34 rows, and for every step the K and V each
    layer just wrote (read from the KV pool at that step's slot_mapping); compared engine vs
    engine (eager vs graph, or one attention backend against another).
fp8-kv (277 rows) - the engine with kv_cache_dtype fp8 (engine/kv_quant.py), and the same engine with the
    model-dtype pool on the same paths (what FP8 costs: the ratio of their distances to the truth):
    baseline's cases                                                                          15 rows
    long   a 64-id prompt, 256 outputs: 256 decode steps over 64..319 keys, all of them stored in
           e4m3 (the error of every stored K/V stays in every later step); crosses into block 2   256 rows
    prefix cold / hot / share as in the prefix suite: a hit reads e4m3 blocks another request wrote 6 rows
    Transformers computes each request's rows in one causal forward over its whole path (the same
    function as a recompute per row, which at 256 rows of ~300 ids would cost minutes on a CPU).

Random prompt ids follow the trace cases' convention (numpy default_rng(seed), ids in
[100, min(vocab, 10000))); continuation ids are drawn the same way from (suite seed, request key),
so a different --seed gives a different, equally valid token path.
"""
from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass, field
from typing import Any

from engine.config import KV_CACHE_DTYPES  # noqa: F401 - the choices, shared with the engine's Config
from labkit.errors import LabkitError

RANDOM_LOW = 100
RANDOM_HIGH = 10000

# Every case starts from these engine settings (the labs' settings: max_model_len 1024, budget 512, block 256), then
# applies its own.
ENGINE_DEFAULTS: dict[str, Any] = {
    "max_model_len": 1024,
    "max_num_batched_tokens": 512,
    "max_num_seqs": 8,
    "kvcache_block_size": 256,
    "num_kvcache_blocks": 64,
    "gpu_memory_utilization": 0.5,
}


def is_fp8(kv_cache_dtype: str | None) -> bool:
    """An FP8 KV cache (engine/kv_quant.py: "fp8" and its explicit name "fp8_e4m3")."""
    return kv_cache_dtype in ("fp8", "fp8_e4m3")


@dataclass(frozen=True)
class Request:
    id: str                       # unique within the suite (rows are keyed by it)
    prompt: dict                  # {"tokens": [...]} | {"range": [a, b]} | {"random": n, "seed": s}
    max_tokens: int               # = the number of rows this request gives
    after: str | None = None      # submit only once this request has finished
    cont_key: str | None = None   # continuation drawn for this key (default: the id)
    share_prefix: tuple[str, int] | None = None  # (request id, k): the first k ids are that request's

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"id": self.id, "prompt": self.prompt, "max_tokens": self.max_tokens}
        if self.after:
            d["after"] = self.after
        if self.cont_key:
            d["cont_key"] = self.cont_key
        if self.share_prefix:
            d["share_prefix"] = {"with": self.share_prefix[0], "tokens": self.share_prefix[1]}
        return d


@dataclass(frozen=True)
class Case:
    name: str
    about: str
    requests: tuple[Request, ...]
    engine: dict = field(default_factory=dict)

    def engine_kwargs(self) -> dict:
        return {**ENGINE_DEFAULTS, **self.engine}

    @property
    def rows(self) -> int:
        return sum(r.max_tokens for r in self.requests)


@dataclass(frozen=True)
class Suite:
    name: str
    about: str
    cases: tuple[Case, ...]
    reference: str            # what `run` compares the engine against: "hf", "tp" or "engine"
    record_kv: bool = False
    # The engine side's KV cache dtype ("fp8": judged against Transformers with its K/V round-tripped through
    # e4m3, and set beside the same engine with the model-dtype pool: labkit/logits/cost.py).
    kv_cache_dtype: str = "auto"
    # Transformers computes a request's rows in one causal forward over its whole path (logits at every row's
    # position) instead of one forward per row: the same function, linear instead of quadratic in the rows.
    hf_one_forward: bool = False

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.cases)

    @property
    def requests(self) -> list[Request]:
        return [r for c in self.cases for r in c.requests]

    def describe(self) -> dict:
        return {"name": self.name, "about": self.about, "reference": self.reference, "record_kv": self.record_kv,
                "kv_cache_dtype": self.kv_cache_dtype, "hf_one_forward": self.hf_one_forward,
                "expected_rows": self.rows,
                "cases": [{"name": c.name, "about": c.about, "rows": c.rows, "engine": c.engine_kwargs(),
                           "requests": [r.to_dict() for r in c.requests]} for c in self.cases]}


def _baseline_cases(prefix: str = "") -> tuple[Case, ...]:
    p = prefix
    return (
        Case(f"{p}A", "3-token prompt, 3 outputs: prefill then two decodes",
             (Request("A.R1", {"tokens": [100, 101, 102]}, 3),)),
        Case(f"{p}B", "prompts of 3 and 4 tokens prefilled together, 2 and 5 outputs: uneven batch",
             (Request("B.R1", {"tokens": [100, 101, 102]}, 2),
              Request("B.R2", {"tokens": [200, 201, 202, 203]}, 5))),
        Case(f"{p}C", "range(100, 356): one full block; the first decode writes the first slot of block 2",
             (Request("C.R1", {"range": [100, 356]}, 3),)),
        Case(f"{p}chunk", "A=700 under budget 512 with B=32: A chunked 512 + 188, B joins the second step",
             (Request("chunk.A", {"random": 700, "seed": 1}, 1),
              Request("chunk.B", {"random": 32, "seed": 2}, 1))),
    )


def _graph_lengths(batch: int) -> list[int]:
    # Uneven and deterministic: 4..123 ids, no two neighbours equal.
    return [4 + (37 * i + 11 * batch) % 120 for i in range(batch)]


def _graph_case(batch: int, name: str | None = None) -> Case:
    name = name or f"batch{batch}"
    reqs = tuple(Request(f"{name}.R{i}", {"random": n, "seed": 1000 * batch + i}, 2)
                 for i, n in enumerate(_graph_lengths(batch)))
    return Case(name, f"{batch} requests of uneven length prefill, then decode once together (max_num_seqs 20)",
                reqs, {"max_num_seqs": 20})


_PREFIX = Case(
    "prefix",
    "cold 620-id request, then the same request after it finished (prefill hits 512 cached ids), "
    "then a request sharing its first 512 ids",
    (Request("cold", {"random": 620, "seed": 5}, 2),
     Request("hot", {"random": 620, "seed": 5}, 2, after="cold", cont_key="cold"),
     Request("share", {"random": 620, "seed": 6}, 2, after="hot", share_prefix=("cold", 512))),
    {"max_num_batched_tokens": 1024},
)

_MIXED = (
    Case("mixA", "a 40-id request decodes while a 700-id and a 300-id prompt are chunked beside it (budget 256)",
         (Request("mixA.short", {"random": 40, "seed": 21}, 6),
          Request("mixA.long", {"random": 700, "seed": 22}, 3),
          Request("mixA.mid", {"random": 300, "seed": 23}, 2)),
         {"scheduling_policy": "mixed", "max_num_batched_tokens": 256}),
    Case("mixB", "a decode beside 128-token chunks of a 600-id prompt, then a 512-id prefix hit beside it",
         (Request("mixB.decode", {"random": 50, "seed": 32}, 12),
          Request("mixB.P", {"random": 600, "seed": 31}, 2),
          Request("mixB.Q", {"random": 620, "seed": 33}, 2, after="mixB.P", share_prefix=("mixB.P", 512))),
         {"scheduling_policy": "mixed", "max_num_batched_tokens": 128}),
)

_LONG_DECODE = Case(
    "long", "64-id prompt, 256 outputs: 256 decode steps over 64..319 stored keys, crossing into a second block",
    (Request("long", {"random": 64, "seed": 41}, 256),),
)

SUITES: dict[str, Suite] = {
    "baseline": Suite("baseline", "full and chunked prefill, decode, a page crossing, uneven batches",
                      _baseline_cases(), "hf"),
    "graph": Suite("graph", "batches of 1, 9, 16, 17, 20 requests (max_num_seqs 20): prefill, then one decode each",
                   tuple(_graph_case(b) for b in (1, 9, 16, 17, 20)), "hf"),
    "prefix": Suite("prefix", "cold and hot prefix cache on the same request, plus a shared 512-id prefix",
                    (_PREFIX,), "hf"),
    "tp": Suite("tp", "baseline's inputs, TP=2 against TP=1", _baseline_cases(), "tp"),
    "mixed": Suite("mixed", "decode rows and prefill chunks in one step (scheduling_policy mixed)", _MIXED, "hf"),
    "kv": Suite("kv", "baseline's inputs plus a 17-request decode; new K/V per layer per step, engine vs engine",
                _baseline_cases() + (_graph_case(17, "decode17"),), "engine", record_kv=True),
    "fp8-kv": Suite("fp8-kv", "kv_cache_dtype fp8 against Transformers with e4m3 K/V, beside the model-dtype pool: "
                    "baseline's cases, 256 decode steps, a prefix hit",
                    _baseline_cases() + (_LONG_DECODE, _PREFIX), "hf", kv_cache_dtype="fp8", hf_one_forward=True),
}

EXPECTED_ROWS = {"baseline": 15, "graph": 126, "prefix": 6, "tp": 15, "mixed": 27, "kv": 49, "fp8-kv": 277}


def get_suite(name: str) -> Suite:
    try:
        return SUITES[name]
    except KeyError:
        raise LabkitError(f"--suite {name!r}: unknown (known: {', '.join(SUITES)})", code=2) from None


# ------------------------------------------------------------------------------------------------
# The token path


def _id_range(vocab_size: int) -> tuple[int, int]:
    hi = min(int(vocab_size), RANDOM_HIGH)
    if hi <= RANDOM_LOW:
        raise LabkitError(f"model: vocab_size {vocab_size} is too small for random ids in [{RANDOM_LOW}, {hi})")
    return RANDOM_LOW, hi


def _prompt_ids(prompt: dict, vocab_size: int) -> list[int]:
    import numpy as np

    if "tokens" in prompt:
        ids = [int(t) for t in prompt["tokens"]]
    elif "range" in prompt:
        ids = list(range(*prompt["range"]))
    else:
        lo, hi = _id_range(vocab_size)
        ids = [int(x) for x in np.random.default_rng(prompt.get("seed", 0)).integers(lo, hi, size=prompt["random"])]
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise LabkitError(f"model: vocab_size {vocab_size} cannot hold the suite's prompt ids (e.g. {bad[0]})")
    return ids


def continuation(seed: int, key: str, n: int, vocab_size: int) -> list[int]:
    """The forced continuation of one request: n ids from (seed, key), the same on every machine."""
    import numpy as np

    lo, hi = _id_range(vocab_size)
    rng = np.random.default_rng([int(seed), zlib.crc32(key.encode("utf-8"))])
    return [int(x) for x in rng.integers(lo, hi, size=n)]


def token_path(suite: Suite, vocab_size: int, seed: int) -> dict[str, dict]:
    """{request id: {"case", "prompt", "continuation", "after"}} for every request of the suite.

    Row k of a request is computed on prompt + continuation[:k] and then continuation[k] is fed."""
    out: dict[str, dict] = {}
    for case in suite.cases:
        for r in case.requests:
            ids = _prompt_ids(r.prompt, vocab_size)
            if r.share_prefix:
                src, k = r.share_prefix
                ids = out[src]["prompt"][:k] + ids[k:]
            out[r.id] = {"case": case.name, "prompt": ids,
                         "continuation": continuation(seed, r.cont_key or r.id, r.max_tokens, vocab_size),
                         "after": r.after}
    return out


def path_sha256(path: dict[str, dict]) -> str:
    canon = {rid: [p["prompt"], p["continuation"]] for rid, p in sorted(path.items())}
    return hashlib.sha256(json.dumps(canon, separators=(",", ":")).encode()).hexdigest()


def row_keys(suite: Suite) -> list[tuple[str, int]]:
    """Every (request id, output index) row the suite must produce, in suite order."""
    return [(r.id, k) for r in suite.requests for k in range(r.max_tokens)]


def _self_check() -> None:
    for name, n in EXPECTED_ROWS.items():
        assert SUITES[name].rows == n, (name, SUITES[name].rows, n)


_self_check()
