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
from labkit.errors import LabkitError

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
    """Let a click command read OLD_NAMES as the new flags, if it or a subcommand of it takes one of those: its
    command line is rewritten before click parses it (`--budget 5` -> `--max-num-batched-tokens 5`), option names
    only, so a choice or a subcommand that happens to share an old name (the `graph` logits suite, a subcommand
    called `attention`) stays itself. An old name and its new one given with different values are refused
    (LabkitError): which one wins would be an accident of their order. Returns whether it did."""
    new = {"--" + name for name in OLD_NAMES.values()}
    takes_value: set[str] = set()    # the options of the command tree that read the next word as their value

    def takes(cmd) -> bool:
        takes_value.update(o for p in cmd.params if getattr(p, "param_type_name", "") == "option"
                           and not getattr(p, "is_flag", False) for o in p.opts)
        own = any((set(p.opts) | set(getattr(p, "secondary_opts", ()))) & new for p in cmd.params)
        return any([takes(sub) for sub in getattr(cmd, "commands", {}).values()]) or own

    if not takes(command):
        return False
    parse_args = command.parse_args

    def parse_with_old_names(ctx, args):
        return parse_args(ctx, rename_old_flags(list(args), takes_value))

    command.parse_args = parse_with_old_names
    return True


def rename_old_flags(args: list[str], takes_value=frozenset()) -> list[str]:
    """`args` with each old flag name (OLD_NAMES) as its new one, up to a `--`; a word that is the value of an
    option in `takes_value` (`--prompt --budget`) stays as it is. LabkitError when an old name and another
    spelling of the same setting are given different values (`--budget 100 --max-num-batched-tokens 200`,
    `--eager --no-enforce-eager`): which one won would be an accident of their order."""
    out: list[str] = []
    given: dict[str, list[tuple[str, str, bool]]] = {}     # setting -> [(as typed, its value, an old name)]
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            out += args[i:]
            break
        if not word.startswith("--"):
            out.append(word)
            if word in takes_value and i + 1 < len(args):
                out.append(args[i + 1])    # a short option's value (-w --budget: a workload of that name)
                i += 1
            i += 1
            continue
        typed, eq, inline = word.partition("=")
        name = "--" + _new_name(typed[2:])
        out.append(name + eq + inline)
        if name in ("--enforce-eager", "--no-enforce-eager"):
            given.setdefault("--enforce-eager", []).append((typed, str(name == "--enforce-eager"), name != typed))
        elif name[2:] in OLD_NAMES.values():
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            given.setdefault(name, []).append((f"{typed} {value}", value, name != typed))
        if not eq and name in takes_value and i + 1 < len(args):
            out.append(args[i + 1])    # the option's value, whatever it looks like
            i += 1
        i += 1
    for setting, spellings in given.items():
        old = [typed.split()[0] for typed, _, is_old in spellings if is_old]
        if old and len({value for _, value, _ in spellings}) > 1:
            raise LabkitError(f"{', '.join(typed for typed, _, _ in spellings)}: {old[0]} is the old name of "
                              f"{setting if old[0] != '--graph' else '--no-enforce-eager'}; the same setting given "
                              "different values: give it once", 2)
    return out


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
