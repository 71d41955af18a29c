"""Traced cases: `workloads/cases/NAME.yaml` (SPEC section 5).

A case names engine settings, a list of requests and, optionally, the states the engine must
go through. `load_case` reads and checks one strictly (every error names the file and the key,
raised as LabkitError, exit code 2); `build_prompt_ids` turns the prompt specs into token ids.
Engine settings are the engine's Config fields and a request's sampling settings its SamplingParams
fields: the names and types come from those dataclasses, and their own checks judge the values.

Case file
---------
    name: chunk                        # optional, defaults to the file's stem; letters, digits and
                                       # . _ + - (it names the output folder runs/trace-NAME)
    about: one line                    # optional; printable text
    engine: {max_num_batched_tokens: 512, kvcache_block_size: 256, ...}   # Config fields: ENGINE_KEYS
    requests:
      - id: A                          # label; the engine's events carry it as request_id
        prompt: {random: 700, seed: 1} # exactly one of:
                                       #   {random: N, seed: S}  N ids from [100, min(vocab, 10000))
                                       #   {tokens: [ids...]}    verbatim
                                       #   {range: [a, b]}       list(range(a, b))
                                       #   {text: "..."}         needs a tokenizer
                                       # random/range may add share_prefix: {with: ID, tokens: K}:
                                       # the first K ids are replaced by the first K ids of an
                                       # earlier request's prompt (the length stays as stated)
        max_tokens: 3                  # default 64     max_tokens, ignore_eos, temperature,
        ignore_eos: true               # default true   top_k, top_p: SamplingParams fields
        temperature: 0.6               # default 0.0 (greedy); top_k, top_p optional
        after: B                       # optional: submit once an earlier request has finished
    expect: [...]                      # optional; without it a case is recorded, not judged

Expectation entries (`expect` list)
-----------------------------------
Each entry is either a step entry or the final entry. Steps count engine steps from 1.

    - step: 2                          # required in a step entry
      phase: prefill                   # prefill | decode
      scheduled: {A: 188, B: 32}       # ID -> num_scheduled_tokens, or the full form
                                       # ID -> {total, cached, scheduled, blocks}: the state after
                                       # scheduling/allocation, before the model runs. The IDs
                                       # must be exactly the scheduled requests, in this order.
      preempted: [C]                   # the requests preempted in this step ([] = none)
      before: {waiting: [C], running: [A, B], free: 0}   # before_schedule (any subset)
      inputs:                          # gpu_inputs (any subset)
        num_input_ids: 220
        positions: "512..699 + 0..31"  # a list, or a compact string: "a..b" is inclusive,
                                       # parts joined by "+" (single numbers allowed)
        cu_seqlens_q: [0, 188, 220]
        cu_seqlens_k: [0, 700, 732]
        context_lens: [701, 33]        # also max_seqlen_q, max_seqlen_k, execution, graph_batch
      after:                           # after_postprocess, per listed request (any subset):
        A: {total: 701, cached: 700, outputs: 1, status: RUNNING, blocks: 3, accepted: true}
                                       # blocks = len(block_table); status WAITING|RUNNING|FINISHED
                                       # a listed ID missing from after_postprocess fails
      free: 60                         # free_blocks after postprocess
      released: {A: [0, 0, 1]}         # for a request that finished (or was preempted) this step:
                                       # the ref counts of the blocks it held, after its release
                                       # (after_postprocess released_ref_counts)
      refs: {B: [1, 1, 1]}             # ref counts of the request's block_table entries, in
                                       # order, after postprocess (after_postprocess ref_counts)
      note: free text, ignored
    - final: {A: {outputs: 3, status: FINISHED}}   # the request's last state (also total)

Limits, checked before anything is built from them: a prompt's length against max_model_len (the case's,
else the engine's default, 4096); a step's positions against the most input ids a step of the case's
engine can hold (max_num_batched_tokens + max_num_seqs), counted before the list is expanded. The file is
UTF-8 YAML, read with libyaml where pyyaml has it; a key given twice is an error (labkit/yamlfile.py).
Request ids and `about` are printable text (no terminal escapes).

After loading, `Case.expect` holds normalised entries: positions expanded to lists and
`scheduled: {ID: N}` turned into `{ID: {scheduled: N}}`.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Callable

from labkit import yamlfile
from labkit.engine_args import FIELDS, check_fields, check_settings, declared_config
from labkit.errors import LabkitError
from labkit.trace.events import PHASES  # prefill, decode, mixed

# A case may set any engine Config field (SPEC 5) but those no file sets (labkit/engine_args.py: the model folder,
# the tracer, the model's config and EOS id, the tensor-parallel channel).
ENGINE_KEYS = tuple(FIELDS)

TOP_KEYS = ("name", "about", "engine", "requests", "expect")
# A request is an id, a prompt, an optional `after`, and SamplingParams fields (_sampling_fields()).
REQUEST_KEYS = ("id", "prompt", "after")
PROMPT_KINDS = ("random", "tokens", "range", "text")
_PROMPT_EXTRA = {"random": ("seed", "share_prefix"), "range": ("share_prefix",),
                 "tokens": (), "text": ()}
SHARE_KEYS = ("with", "tokens")

SCHEDULED_FIELDS = ("total", "cached", "scheduled", "blocks")
AFTER_FIELDS = ("total", "cached", "outputs", "status", "blocks", "accepted")
FINAL_FIELDS = ("total", "outputs", "status")
BEFORE_FIELDS = ("waiting", "running", "free")
INPUT_FIELDS = ("num_input_ids", "positions", "cu_seqlens_q", "cu_seqlens_k", "context_lens",
                "max_seqlen_q", "max_seqlen_k", "execution", "graph_batch")
STATUSES = ("WAITING", "RUNNING", "FINISHED")

RANDOM_LOW = 100      # random prompt ids are drawn from [RANDOM_LOW, min(vocab_size, RANDOM_HIGH))
RANDOM_HIGH = 10000

DEFAULT_MAX_TOKENS = 64
DEFAULT_TEMPERATURE = 0.0

# A case's name names its output folder (runs/trace-NAME) and is printed: one plain path component.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")


@dataclass
class RequestSpec:
    id: str
    prompt: dict
    max_tokens: int = DEFAULT_MAX_TOKENS
    ignore_eos: bool = True
    temperature: float = DEFAULT_TEMPERATURE
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    after: str | None = None

    @property
    def prompt_len(self) -> int | None:
        """The prompt's length where it is known without a tokenizer (None for text)."""
        return _static_len(self.prompt)

    def sampling_kwargs(self) -> dict:
        """Keyword arguments for engine.SamplingParams (unset top_k/top_p left out; seed always: None is the
        engine's own stream)."""
        kw: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens,
                              "ignore_eos": self.ignore_eos}
        if self.top_k is not None:
            kw["top_k"] = self.top_k
        if self.top_p is not None:
            kw["top_p"] = self.top_p
        kw["seed"] = self.seed  # None is SamplingParams' own default
        return kw


@dataclass
class Case:
    name: str
    about: str
    engine: dict
    requests: list[RequestSpec]
    expect: list[dict] | None = None
    path: Path | None = None

    def request(self, rid: str) -> RequestSpec:
        for r in self.requests:
            if r.id == rid:
                return r
        raise KeyError(rid)

    @property
    def request_ids(self) -> list[str]:
        return [r.id for r in self.requests]

    @property
    def judged(self) -> bool:
        return bool(self.expect)


# ----------------------------------------------------------------------------- locating

def repo_root() -> Path:
    env = os.environ.get("LAB_ROOT")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2]


def cases_dir() -> Path:
    return repo_root() / "workloads" / "cases"


def list_cases() -> list[str]:
    return yamlfile.names_in([cases_dir()])


def resolve_case_path(name_or_path: str | os.PathLike) -> Path:
    return yamlfile.resolve(name_or_path, [cases_dir()], "case")


def load_case(name_or_path: str | os.PathLike) -> Case:
    """Load and check a case by name (workloads/cases/NAME.yaml) or by path."""
    path = resolve_case_path(name_or_path)
    return parse_case(yamlfile.read(path, "case"), path)


# ----------------------------------------------------------------------------- checking

class _Ctx:
    def __init__(self, path: Path | None):
        self.path = path
        self.max_step_tokens: int | None = None  # the most input ids a step of this case's engine can hold
        if path is None:
            self.label = "<case>"
        else:
            try:
                self.label = str(Path(path).resolve().relative_to(repo_root().resolve()))
            except ValueError:
                self.label = str(path)

    def fail(self, where: str, msg: str):
        raise LabkitError(f"{self.label}: {where}: {msg}" if where else f"{self.label}: {msg}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(ctx: _Ctx, where: str, v, *, minimum: int | None = 0) -> int:
    if not _is_int(v):
        ctx.fail(where, f"must be an integer, got {v!r}")
    if minimum is not None and v < minimum:
        if v < 0:
            ctx.fail(where, f"must not be negative, got {v}")
        ctx.fail(where, f"must be >= {minimum}, got {v}")
    return v


def _int_list(ctx: _Ctx, where: str, v, *, allow_none: bool = False) -> list[int] | None:
    if v is None and allow_none:
        return None
    if not isinstance(v, list) or not all(_is_int(x) for x in v):
        ctx.fail(where, f"must be a list of integers, got {v!r}")
    return list(v)


def _mapping(ctx: _Ctx, where: str, v) -> dict:
    if not isinstance(v, dict):
        ctx.fail(where, f"must be a mapping, got {type(v).__name__}")
    return v


def _unknown(ctx: _Ctx, where: str, d: dict, allowed) -> None:
    for k in d:
        if k not in allowed:
            ctx.fail(where, f"unknown key {k!r} (allowed: {', '.join(allowed)})")


def _prompt_kind(prompt: dict) -> str:
    kinds = [k for k in PROMPT_KINDS if k in prompt]
    return kinds[0] if len(kinds) == 1 else ""


def _static_len(prompt: dict) -> int | None:
    kind = _prompt_kind(prompt)
    if kind == "random":
        return prompt["random"]
    if kind == "tokens":
        return len(prompt["tokens"])
    if kind == "range":
        a, b = prompt["range"]
        return b - a
    return None


def _rid(ctx: _Ctx, where: str, v) -> str:
    if _is_int(v):
        return str(v)
    if not isinstance(v, str) or not v:
        ctx.fail(where, f"must be a non-empty string, got {v!r}")
    if not v.isprintable() or len(v) > 100:
        # It is printed in tables and messages: no terminal escapes or other control characters.
        ctx.fail(where, f"must be at most 100 printable characters, got {v[:100]!r}")
    return v


def _check_engine(ctx: _Ctx, engine) -> dict:
    if engine is None:
        return {}
    return check_settings(_mapping(ctx, "engine", engine), ctx.fail)


@cache
def _sampling_fields() -> tuple:
    """The engine's SamplingParams and its fields (imported on first use: the module loads torch)."""
    from engine.sampling_params import SamplingParams

    return SamplingParams, {f.name: f for f in dataclasses.fields(SamplingParams) if f.init}


def _check_prompt(ctx: _Ctx, where: str, prompt, earlier: dict[str, RequestSpec]) -> dict:
    prompt = _mapping(ctx, where, prompt)
    kinds = [k for k in PROMPT_KINDS if k in prompt]
    if len(kinds) != 1:
        ctx.fail(where, f"must have exactly one of {', '.join(PROMPT_KINDS)} "
                        f"(got {', '.join(kinds) or 'none'})")
    kind = kinds[0]
    allowed = (kind,) + _PROMPT_EXTRA[kind]
    for k in prompt:
        if k not in allowed:
            if k == "share_prefix":
                ctx.fail(f"{where}.share_prefix", f"only random and range prompts can share a "
                                                  f"prefix, not {kind}")
            ctx.fail(where, f"unknown key {k!r} for a {kind} prompt (allowed: {', '.join(allowed)})")
    out = dict(prompt)
    if kind == "random":
        _int(ctx, f"{where}.random", prompt["random"], minimum=1)
        out["seed"] = _int(ctx, f"{where}.seed", prompt.get("seed", 0), minimum=0)
    elif kind == "tokens":
        toks = prompt["tokens"]
        if not isinstance(toks, list) or not toks:
            ctx.fail(f"{where}.tokens", "must be a non-empty list of token ids")
        for i, t in enumerate(toks):
            _int(ctx, f"{where}.tokens[{i}]", t, minimum=0)
        out["tokens"] = list(toks)
    elif kind == "range":
        rng = prompt["range"]
        if not isinstance(rng, list) or len(rng) != 2 or not all(_is_int(x) for x in rng):
            ctx.fail(f"{where}.range", f"must be [start, stop] integers, got {rng!r}")
        a, b = rng
        if a < 0 or b < 0:
            ctx.fail(f"{where}.range", f"must not be negative, got {rng!r}")
        if b <= a:
            ctx.fail(f"{where}.range", f"stop must be greater than start, got {rng!r}")
        out["range"] = [a, b]
    else:
        if not isinstance(prompt["text"], str) or not prompt["text"]:
            ctx.fail(f"{where}.text", "must be a non-empty string")
    if "share_prefix" in prompt:
        sw = f"{where}.share_prefix"
        sp = _mapping(ctx, sw, prompt["share_prefix"])
        _unknown(ctx, sw, sp, SHARE_KEYS)
        for k in SHARE_KEYS:
            if k not in sp:
                ctx.fail(sw, f"missing key {k!r}")
        other = _rid(ctx, f"{sw}.with", sp["with"])
        if other not in earlier:
            ctx.fail(f"{sw}.with", f"{other!r} is not an earlier request of this case")
        k = _int(ctx, f"{sw}.tokens", sp["tokens"], minimum=1)
        other_len = earlier[other].prompt_len
        if other_len is not None and k > other_len:
            ctx.fail(f"{sw}.tokens", f"asks {k} tokens but request {other}'s prompt has "
                                     f"only {other_len}")
        own = _static_len(out)
        if own is not None and k > own:
            ctx.fail(f"{sw}.tokens", f"asks {k} tokens but this prompt has only {own}")
        out["share_prefix"] = {"with": other, "tokens": k}
    return out


def _check_request(ctx: _Ctx, i: int, raw, earlier: dict[str, RequestSpec],
                   engine: dict) -> RequestSpec:
    where = f"requests[{i}]"
    raw = _mapping(ctx, where, raw)
    if "id" not in raw:
        ctx.fail(where, "missing key 'id'")
    rid = _rid(ctx, f"{where}.id", raw["id"])
    where = f"requests[{i}] ({rid})"
    _unknown(ctx, where, raw, REQUEST_KEYS + tuple(_sampling_fields()[1]))
    if rid in earlier:
        ctx.fail(f"{where}.id", f"duplicate request id {rid!r}")
    if "prompt" not in raw:
        ctx.fail(where, "missing key 'prompt'")
    prompt = _check_prompt(ctx, f"{where}.prompt", raw["prompt"], earlier)
    sampling_params, fields = _sampling_fields()
    # the case's defaults (greedy, ignore_eos) differ from SamplingParams' (temperature 1, stop at EOS)
    sampling = {"max_tokens": DEFAULT_MAX_TOKENS, "ignore_eos": True, "temperature": DEFAULT_TEMPERATURE}
    sampling.update((k, v) for k, v in raw.items() if k in fields)
    check_fields(sampling_params, sampling, fields, ctx.fail, where)
    after = raw.get("after")
    if after is not None:
        after = _rid(ctx, f"{where}.after", after)
        if after == rid:
            ctx.fail(f"{where}.after", "a request cannot wait for itself")
        if after not in earlier:
            ctx.fail(f"{where}.after", f"{after!r} is not an earlier request of this case "
                                       f"(after must name a request listed before this one)")
    plen = _static_len(prompt)
    mml = declared_config(engine).max_model_len
    if plen is not None and plen > mml:
        whose = "engine.max_model_len" if "max_model_len" in engine else "max_model_len (the engine's default; " \
                                                                          "set engine.max_model_len for more)"
        ctx.fail(f"{where}.prompt", f"prompt has {plen} tokens, more than {whose} {mml}")
    top_p = sampling.get("top_p")
    return RequestSpec(id=rid, prompt=prompt, max_tokens=sampling["max_tokens"], ignore_eos=sampling["ignore_eos"],
                       temperature=float(sampling["temperature"]), top_k=sampling.get("top_k"),
                       top_p=None if top_p is None else float(top_p), seed=sampling.get("seed"), after=after)


_POS_PART = re.compile(r"^\s*(-?\d+)\s*(?:\.\.\s*(-?\d+)\s*)?$")


def expand_positions(spec, limit: int | None = None) -> list[int]:
    """Expand "512..699 + 0..31" (inclusive ranges joined by +) or a list into a list of ints. limit: refuse
    (ValueError) more positions than that, counted before the list is built."""
    if isinstance(spec, list):
        if not all(_is_int(x) for x in spec):
            raise ValueError(f"positions must be integers, got {spec!r}")
        return list(spec)
    if _is_int(spec):
        return [spec]
    if not isinstance(spec, str):
        raise ValueError(f"positions must be a list or a string like '0..2 + 5', got {spec!r}")
    text = spec.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    out: list[int] = []
    if not text.strip():
        return out
    ranges = []
    for part in re.split(r"[+,]", text):
        m = _POS_PART.match(part)
        if not m:
            raise ValueError(f"cannot read positions part {part.strip()!r} in {spec!r}")
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) is not None else a
        if b < a:
            raise ValueError(f"range {part.strip()!r} runs backwards in {spec!r}")
        ranges.append((a, b))
    count = sum(b - a + 1 for a, b in ranges)
    if limit is not None and count > limit:
        raise ValueError(f"{count} positions, more than a step can hold ({limit})")
    for a, b in ranges:
        out.extend(range(a, b + 1))
    return out


def format_positions(pos: list[int] | None, parts: list[int] | None = None) -> str:
    """The compact form of a positions list: runs of consecutive ints as "a..b", joined by " + ".

    With `parts` (lengths per sequence) the list is cut at those boundaries first.
    """
    if pos is None:
        return "-"
    chunks: list[list[int]] = []
    if parts:
        i = 0
        for n in parts:
            chunks.append(list(pos[i:i + n]))
            i += n
        if i < len(pos):
            chunks.append(list(pos[i:]))
    else:
        chunks = [list(pos)]
    runs: list[str] = []
    for ch in chunks:
        j = 0
        while j < len(ch):
            k = j
            while k + 1 < len(ch) and ch[k + 1] == ch[k] + 1:
                k += 1
            runs.append(f"{ch[j]}..{ch[k]}" if k > j else f"{ch[j]}")
            j = k + 1
    return " + ".join(runs) if runs else "[]"


def _check_ids(ctx: _Ctx, where: str, ids, known: set[str]) -> list[str]:
    if not isinstance(ids, list):
        ctx.fail(where, f"must be a list of request ids, got {ids!r}")
    out = []
    for x in ids:
        rid = _rid(ctx, where, x)
        if rid not in known:
            ctx.fail(where, f"unknown request id {rid!r}")
        out.append(rid)
    return out


def _check_status(ctx: _Ctx, where: str, v) -> str:
    if v not in STATUSES:
        ctx.fail(where, f"must be one of {', '.join(STATUSES)}, got {v!r}")
    return v


def _check_per_request(ctx: _Ctx, where: str, d, known: set[str], fields) -> dict[str, dict]:
    d = _mapping(ctx, where, d)
    out: dict[str, dict] = {}
    for rid_raw, vals in d.items():
        rid = _rid(ctx, where, rid_raw)
        w = f"{where}.{rid}"
        if rid not in known:
            ctx.fail(where, f"unknown request id {rid!r}")
        vals = _mapping(ctx, w, vals)
        _unknown(ctx, w, vals, fields)
        v2: dict[str, Any] = {}
        for f, v in vals.items():
            if f == "status":
                v2[f] = _check_status(ctx, f"{w}.status", v)
            elif f == "accepted":
                if not isinstance(v, bool):
                    ctx.fail(f"{w}.accepted", f"must be true or false, got {v!r}")
                v2[f] = v
            else:
                v2[f] = _int(ctx, f"{w}.{f}", v, minimum=0)
        out[rid] = v2
    return out


def _expect_phase(ctx: _Ctx, where: str, v, known: set[str]) -> str:
    if v not in PHASES:
        ctx.fail(where, f"must be one of {', '.join(PHASES)}, got {v!r}")
    return v


def _expect_scheduled(ctx: _Ctx, where: str, v, known: set[str]) -> dict[str, dict]:
    """ID -> N (num_scheduled_tokens) or ID -> {total, cached, scheduled, blocks}; always the full form."""
    out: dict[str, dict] = {}
    for rid_raw, x in _mapping(ctx, where, v).items():
        rid = _rid(ctx, where, rid_raw)
        w = f"{where}.{rid}"
        if rid not in known:
            ctx.fail(where, f"unknown request id {rid!r}")
        if _is_int(x):
            out[rid] = {"scheduled": _int(ctx, w, x, minimum=0)}
        else:
            x = _mapping(ctx, w, x)
            _unknown(ctx, w, x, SCHEDULED_FIELDS)
            out[rid] = {f: _int(ctx, f"{w}.{f}", n, minimum=0) for f, n in x.items()}
    return out


def _expect_preempted(ctx: _Ctx, where: str, v, known: set[str]) -> list[str]:
    return _check_ids(ctx, where, v or [], known)


def _expect_before(ctx: _Ctx, where: str, v, known: set[str]) -> dict:
    b = _mapping(ctx, where, v)
    _unknown(ctx, where, b, BEFORE_FIELDS)
    return {f: _int(ctx, f"{where}.free", x, minimum=0) if f == "free" else
            _check_ids(ctx, f"{where}.{f}", x or [], known) for f, x in b.items()}


def _expect_inputs(ctx: _Ctx, where: str, v, known: set[str]) -> dict:
    inp = _mapping(ctx, where, v)
    _unknown(ctx, where, inp, INPUT_FIELDS)
    out: dict[str, Any] = {}
    for f, x in inp.items():
        w = f"{where}.{f}"
        if f == "positions":
            try:
                out[f] = expand_positions(x, ctx.max_step_tokens)
            except ValueError as ex:
                ctx.fail(w, str(ex))
        elif f in ("cu_seqlens_q", "cu_seqlens_k", "context_lens"):
            out[f] = _int_list(ctx, w, x, allow_none=True)
        elif f == "execution":
            if x not in ("eager", "graph"):
                ctx.fail(w, f"must be eager or graph, got {x!r}")
            out[f] = x
        else:   # num_input_ids, max_seqlen_q, max_seqlen_k, graph_batch
            out[f] = None if x is None else _int(ctx, w, x, minimum=0)
    return out


def _expect_after(ctx: _Ctx, where: str, v, known: set[str]) -> dict[str, dict]:
    return _check_per_request(ctx, where, v, known, AFTER_FIELDS)


def _expect_free(ctx: _Ctx, where: str, v, known: set[str]) -> int:
    return _int(ctx, where, v, minimum=0)


def _expect_ref_counts(ctx: _Ctx, where: str, v, known: set[str]) -> dict[str, list[int]]:
    """refs / released: ID -> the ref counts of its blocks."""
    out = {}
    for rid_raw, x in _mapping(ctx, where, v).items():
        rid = _rid(ctx, where, rid_raw)
        if rid not in known:
            ctx.fail(where, f"unknown request id {rid!r}")
        out[rid] = [_int(ctx, f"{where}.{rid}", n, minimum=0) for n in _int_list(ctx, f"{where}.{rid}", x)]
    return out


def _expect_note(ctx: _Ctx, where: str, v, known: set[str]) -> str:
    return str(v)


# A step entry's keys (STEP_KEYS but `step`) -> what checks and normalises its value.
_STEP_ENTRY_KEYS = {"phase": _expect_phase, "scheduled": _expect_scheduled, "preempted": _expect_preempted,
                    "before": _expect_before, "inputs": _expect_inputs, "after": _expect_after, "free": _expect_free,
                    "refs": _expect_ref_counts, "released": _expect_ref_counts, "note": _expect_note}
STEP_KEYS = ("step", *_STEP_ENTRY_KEYS)


def _check_step_entry(ctx: _Ctx, where: str, e: dict, known: set[str]) -> dict:
    _unknown(ctx, where, e, STEP_KEYS)
    out: dict[str, Any] = {"step": _int(ctx, f"{where}.step", e["step"], minimum=1)}
    where = f"expect step {out['step']}"
    for key, check in _STEP_ENTRY_KEYS.items():
        if key in e:
            out[key] = check(ctx, f"{where}.{key}", e[key], known)
    return out


def _check_expect(ctx: _Ctx, expect, known: set[str]) -> list[dict] | None:
    if expect is None:
        return None
    if not isinstance(expect, list):
        ctx.fail("expect", f"must be a list of entries, got {type(expect).__name__}")
    out: list[dict] = []
    seen_steps: set[int] = set()
    have_final = False
    for i, e in enumerate(expect):
        where = f"expect[{i}]"
        e = _mapping(ctx, where, e)
        if "final" in e and "step" in e:
            ctx.fail(where, "an entry has either 'step' or 'final', not both")
        if "final" in e:
            _unknown(ctx, where, e, ("final", "note"))
            if have_final:
                ctx.fail(where, "a second 'final' entry")
            have_final = True
            out.append({"final": _check_per_request(ctx, f"{where}.final", e["final"], known,
                                                    FINAL_FIELDS)})
            continue
        if "step" not in e:
            bad = [k for k in e if k not in STEP_KEYS]
            if bad:
                ctx.fail(where, f"unknown key {bad[0]!r} (allowed: {', '.join(STEP_KEYS)}, final)")
            ctx.fail(where, "missing key 'step' (or 'final')")
        entry = _check_step_entry(ctx, where, e, known)
        if entry["step"] in seen_steps:
            ctx.fail(where, f"duplicate entry for step {entry['step']}")
        seen_steps.add(entry["step"])
        out.append(entry)
    return out


def parse_case(data, path: str | os.PathLike | None = None) -> Case:
    """Check a case already read from YAML (a dict) and build the Case."""
    ctx = _Ctx(Path(path) if path is not None else None)
    if not isinstance(data, dict):
        ctx.fail("", f"a case file must be a mapping at the top level, got {type(data).__name__}")
    _unknown(ctx, "top level", data, TOP_KEYS)
    name = data.get("name")
    if name is None:
        name = Path(path).stem if path is not None else "case"
        if not NAME_PATTERN.fullmatch(name):
            ctx.fail("name", f"the file's name {name!r} cannot name the case's output folder: give a name "
                             "(letters, digits, '.', '_', '+', '-'; at most 100)")
    elif not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        # It names the output folder (runs/trace-NAME): never a path that climbs out, never a terminal escape.
        ctx.fail("name", "must be letters, digits, '.', '_', '+' or '-' (starting with a letter or digit; at "
                         f"most 100), got {name!r:.120}")
    about = data.get("about", "")
    if about is None:
        about = ""
    if not isinstance(about, str):
        ctx.fail("about", f"must be a string, got {about!r}")
    about = " ".join(about.split())
    if not about.isprintable():
        ctx.fail("about", f"must be printable text (no terminal escapes or control characters), got {about!r:.120}")
    engine = _check_engine(ctx, data.get("engine"))
    declared = declared_config(engine)
    # Decode rows (one per sequence) and prefill tokens (the budget): no step of this engine holds more.
    ctx.max_step_tokens = declared.max_num_batched_tokens + declared.max_num_seqs
    reqs_raw = data.get("requests")
    if reqs_raw is None:
        ctx.fail("", "missing key 'requests'")
    if not isinstance(reqs_raw, list) or not reqs_raw:
        ctx.fail("requests", "must be a non-empty list")
    earlier: dict[str, RequestSpec] = {}
    for i, r in enumerate(reqs_raw):
        spec = _check_request(ctx, i, r, earlier, engine)
        earlier[spec.id] = spec
    expect = _check_expect(ctx, data.get("expect"), set(earlier))
    return Case(name=name, about=about, engine=engine, requests=list(earlier.values()),
                expect=expect, path=Path(path) if path is not None else None)


# ----------------------------------------------------------------------------- prompts

def build_prompt_ids(case: Case, vocab_size: int,
                     tokenize: Callable[[str], list[int]] | None = None) -> dict[str, list[int]]:
    """Token ids of every request's prompt, keyed by request id (deterministic).

    random: N ids drawn uniformly from [100, min(vocab_size, 10000)) by numpy's default_rng(seed);
    tokens: verbatim; range [a, b]: list(range(a, b)); text: `tokenize(text)` (required then).
    share_prefix {with: A, tokens: K} overwrites the first K ids with A's first K ids.
    """
    import numpy as np

    label = str(case.path) if case.path is not None else case.name
    if not _is_int(vocab_size) or vocab_size <= 0:
        raise LabkitError(f"{label}: vocab_size must be a positive integer, got {vocab_size!r}")
    out: dict[str, list[int]] = {}
    for r in case.requests:
        p = r.prompt
        kind = _prompt_kind(p)
        where = f"{label}: requests {r.id} prompt"
        if kind == "random":
            hi = min(vocab_size, RANDOM_HIGH)
            if hi <= RANDOM_LOW:
                raise LabkitError(f"{where}: random ids need a vocabulary larger than "
                                  f"{RANDOM_LOW}, the model has {vocab_size}")
            rng = np.random.default_rng(p.get("seed", 0))
            ids = [int(x) for x in rng.integers(RANDOM_LOW, hi, size=p["random"])]
        elif kind == "tokens":
            ids = [int(x) for x in p["tokens"]]
        elif kind == "range":
            ids = list(range(p["range"][0], p["range"][1]))
        elif kind == "text":
            if tokenize is None:
                raise LabkitError(f"{where}: a text prompt needs a tokenizer "
                                  f"(build_prompt_ids got no tokenize)")
            ids = [int(x) for x in tokenize(p["text"])]
            if not ids:
                raise LabkitError(f"{where}: the text tokenizes to no ids")
        else:  # parse_case guarantees one kind
            raise LabkitError(f"{where}: no prompt kind")
        sp = p.get("share_prefix")
        if sp:
            src = out.get(sp["with"])
            if src is None:
                raise LabkitError(f"{where}.share_prefix.with: {sp['with']!r} is not an earlier request")
            k = sp["tokens"]
            if k > len(src) or k > len(ids):
                raise LabkitError(f"{where}.share_prefix.tokens: asks {k} tokens, the prompts have "
                                  f"{len(src)} ({sp['with']}) and {len(ids)} ({r.id})")
            ids = list(src[:k]) + ids[k:]
        bad = [t for t in ids if t < 0 or t >= vocab_size]
        if bad:
            raise LabkitError(f"{where}: token id {bad[0]} is outside the model's vocabulary "
                              f"[0, {vocab_size})")
        out[r.id] = ids
    return out

