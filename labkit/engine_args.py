"""The engine settings a command was given, as one typed value: EngineArgs (vLLM's name for the same thing).

Every engine flag is its Config field's name with dashes (vLLM's convention): `--max-num-batched-tokens N` sets
`max_num_batched_tokens`, `--enforce-eager/--no-enforce-eager` sets `enforce_eager`. labkit/options.py declares
each flag once (`flag(field)` writes its name); a command takes it as a parameter named as its field, and
`EngineArgs.given(ctx.params)` gathers what was given, so no command maps a flag to a field by hand. The value
then travels as it is: into `LLM(model, **args.kwargs())`, over a case's or a workload's engine settings
(`args.over(...)`), into the serve core's process, back into a command line (`args.flags()`: `bench load`
starting a server).

The short names of earlier versions (--budget, --policy, --tp, --eager/--graph, --attention, --block-size,
--num-blocks) still work: a command with engine options reads them as the new ones (OLD_NAMES,
`accept_old_names`), and the help shows one name per option.
"""
from __future__ import annotations

import dataclasses
import enum
import os
from types import SimpleNamespace
from typing import Any, Callable, Mapping

from engine.config import Config

# Config fields no command or file sets: the model folder is an argument of its own, the tracer and the model's
# config and EOS id are the run's, and the tensor-parallel channel belongs to the process.
NOT_SETTABLE = ("model", "tracer", "hf_config", "eos", "dist_init_addr", "shm_name", "shm_size", "dist_timeout_s")
FIELDS = {f.name: f for f in dataclasses.fields(Config) if f.init and f.name not in NOT_SETTABLE}

# The help panels of the engine's options (labkit/options.py): what EngineArgs.given gathers.
ENGINE_PANELS = ("Engine", "Engine on a GPU")

# Old flag name (without its dashes) -> the new one: what these commands accepted before their flags took
# their fields' names.
OLD_NAMES = {"budget": "max-num-batched-tokens", "policy": "scheduling-policy", "tp": "tensor-parallel-size",
             "eager": "enforce-eager", "graph": "no-enforce-eager", "attention": "attention-backend",
             "block-size": "kvcache-block-size", "num-blocks": "num-kvcache-blocks"}


def flag(field: str) -> str:
    """The command-line flag of a Config field: its name with dashes."""
    return "--" + field.replace("_", "-")


def _new_name(token: str) -> str:
    return OLD_NAMES.get(token, token)


def new_flag(old: str) -> str:
    """A flag as recorded before the flags took their fields' names ("--budget", "--eager/--graph") as it is now
    ("--max-num-batched-tokens", "--enforce-eager"); any other flag as it is."""
    return "--" + _new_name(old.split("/")[0][2:])


def accept_old_names(command) -> bool:
    """Let a click command read OLD_NAMES as the new flags, if it or a subcommand of it takes one of those: click
    passes every option name it parses (and every subcommand name and choice) through the context's
    token_normalize_func, which subcommands inherit. Only such commands get it: a subcommand called `attention`
    elsewhere must stay one. Returns whether it did."""
    new = {"--" + name for name in OLD_NAMES.values()}

    def takes(cmd) -> bool:
        if any((set(p.opts) | set(getattr(p, "secondary_opts", ()))) & new for p in cmd.params):
            return True
        return any(takes(sub) for sub in getattr(cmd, "commands", {}).values())

    if not takes(command):
        return False
    command.context_settings = {**(command.context_settings or {}), "token_normalize_func": _new_name}
    return True


class _EngineArgs:
    """The methods of EngineArgs (its fields are Config's settable fields, each None unless given)."""

    @classmethod
    def given(cls, ctx, **values) -> "EngineArgs":
        """The engine settings a command was given: its options in an Engine panel (labkit/options.py; a `--seed`
        of its own is not the engine's) that are not None, a choice by its value. `values` replace what the
        command's parameters say (the device it resolved, None for one that is not the engine's to take)."""
        engine = {p.name for p in ctx.command.params
                  if getattr(p, "rich_help_panel", None) in ENGINE_PANELS and p.name in FIELDS}
        picked = {**{k: v for k, v in ctx.params.items() if k in engine}, **values}
        return cls(**{k: v.value if isinstance(v, enum.Enum) else v for k, v in picked.items() if v is not None})

    def kwargs(self) -> dict[str, Any]:
        """The settings given, as LLM(model, **kwargs) takes them."""
        return {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}

    def over(self, defaults: Mapping[str, Any] | None) -> dict[str, Any]:
        """`defaults` (a case's or a workload's engine settings) with the given settings over them."""
        return {**(defaults or {}), **self.kwargs()}

    def flags(self) -> list[str]:
        """The command line that gives these settings (`--field value`, `--field` / `--no-field` for a switch)."""
        return [word for name, value in self.kwargs().items() for word in _argv(name, value)]

    def given_flags(self) -> list[str]:
        """The flags of the settings given, for a message ("--max-num-batched-tokens, --no-enforce-eager: ...")."""
        return [_argv(name, value)[0] for name, value in self.kwargs().items()]

    def described(self, skip: tuple[str, ...] = ()) -> list[str]:
        """Each setting given as its flags say it ("--max-num-batched-tokens 100", "--no-enforce-eager")."""
        return [" ".join(_argv(name, value)) for name, value in self.kwargs().items() if name not in skip]


def _argv(name: str, value) -> list[str]:
    if isinstance(value, bool):
        return [flag(name) if value else "--no-" + flag(name)[2:]]
    return [flag(name), str(value)]


EngineArgs = dataclasses.make_dataclass(
    "EngineArgs", [(name, f"{f.type} | None", dataclasses.field(default=None)) for name, f in FIELDS.items()],
    bases=(_EngineArgs,), frozen=True)
EngineArgs.__module__ = __name__  # (where pickle finds it: the value travels to the serve core's process)
EngineArgs.__doc__ = ("The engine settings a command was given: Config's settable fields, None where not given "
                      "(the command's own default, else the engine's, applies).")


# ------------------------------------------------------------------ the engine settings of a case or workload file

# What a dataclass field's annotation asks of a YAML value (the engine's classes use these four).
_TYPES = {"int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
          "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
          "bool": (lambda v: isinstance(v, bool), "true or false"), "str": (lambda v: isinstance(v, str), "a string")}
# Config checks its settings before it reads the model: a folder and a model config that limit nothing let those
# checks judge a file's engine settings without a model (the run checks them again against the real one).
_NO_MODEL = {"model": os.path.dirname(__file__),
             "hf_config": SimpleNamespace(model_type="qwen3", max_position_embeddings=1 << 30)}


def check_fields(cls, values: Mapping, fields: Mapping, fail: Callable[[str, str], Any], where: str, **more) -> None:
    """`values` against the engine dataclass `cls`: each of the type its field declares, then cls's own checks
    (its ValueError, "field: why", becomes fail("where.field", why))."""
    for k, v in values.items():
        t = fields[k].type      # a string under `from __future__ import annotations`
        ok, what = _TYPES.get(getattr(t, "__name__", t), (lambda v: True, ""))
        if not ok(v):
            fail(f"{where}.{k}", f"must be {what}, got {v!r}")
    try:
        cls(**more, **values)
    except ValueError as e:
        key, sep, why = str(e).partition(": ")
        if sep and key in values:
            fail(f"{where}.{key}", why)
        fail(where, str(e))


def declared_config(values: Mapping) -> Config:
    """A file's engine settings (already checked) with the engine's defaults for the rest, without a model: the
    limits the file's other values are held to before anything is built from them (the run checks them again
    against the model, which can only lower max_model_len)."""
    return Config(**_NO_MODEL, **values)


def check_settings(values: Mapping, fail: Callable[[str, str], Any], where: str = "engine",
                   allowed: tuple[str, ...] = tuple(FIELDS)) -> dict:
    """A file's engine settings (a case's, a workload's): Config fields among `allowed`, each of its field's type
    and accepted by Config's own checks. `fail(where, why)` raises."""
    for k in values:
        if k not in allowed:
            fail(where, f"unknown key {k!r}: not an engine Config field (allowed: {', '.join(allowed)})")
    check_fields(Config, values, FIELDS, fail, where, **_NO_MODEL)
    return dict(values)
