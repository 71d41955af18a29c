"""A lab's command lines against the command line a result recorded (its `argv`): which result is the lab's
own command, and, for one that is not, what differs ("--max-num-batched-tokens 100", "--workload fixed instead of
nano").

The plan's `match` conditions decide which results may answer a lab (the same workload, policy, variable);
among those, the report prefers the one whose options are the lab's. Options that name where a result goes
or which files it reads (--out, --model, ...) and --device (the evidence kind already ranks what ran where)
do not count.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field

# Options that do not change what a command measures or checks.
NEUTRAL = frozenset({"--out", "--json", "--model", "--device", "-q", "--quiet", "--title", "--runs",
                     "--with-logs", "--allow-single"})


@dataclass
class CommandLine:
    words: tuple[str, ...]                 # the command and its subcommands or arguments: ("bench", "compare", ...)
    options: dict[str, str | None] = field(default_factory=dict)   # --flag -> value (None for a bare flag)
    comment: str = ""

    def text(self) -> str:
        return " ".join(["labkit", *self.words] + [k if v is None else f"{k} {shlex.quote(v)}"
                                                   for k, v in self.options.items()])


def parse(tokens: list[str], comment: str = "") -> CommandLine:
    """Words, then options: `--flag VALUE`, `--flag=VALUE`, or a bare `--flag` (followed by another option or
    nothing). A word after the options (bench compare's files) counts as a word."""
    words, options, i = [], {}, 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("-") and len(tok) > 1:
            if "=" in tok:
                key, value = tok.split("=", 1)
                options[key] = value
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
                options[tok] = tokens[i + 1]
                i += 1
            else:
                options[tok] = None
        else:
            words.append(tok)
        i += 1
    return CommandLine(tuple(words), options, comment)


def plan_lines(command: str) -> list[CommandLine]:
    """The command lines of a lab (`command` in workloads/labs.yaml): one per line, `labkit` dropped, the
    comment after `#` kept apart."""
    out = []
    for line in command.strip().splitlines():
        text, _, comment = line.partition("#")
        tokens = shlex.split(text)
        if tokens and tokens[0] == "labkit":
            out.append(parse(tokens[1:], comment.strip()))
    return out


def recorded(argv: object) -> CommandLine | None:
    """A result's `argv` as a command line; None when it is not a list of strings (a result from a script)."""
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return None
    return parse(list(argv[1:]))


def differences(lab: CommandLine, run: CommandLine) -> list[str]:
    """What the run's options change against the lab's line, neutral options aside: "--max-num-batched-tokens 100",
    "--workload fixed instead of nano", "without --no-enforce-eager"."""
    out = []
    for key, value in run.options.items():
        if key in NEUTRAL:
            continue
        if key not in lab.options:
            out.append(key if value is None else f"{key} {value}")
        elif lab.options[key] != value:
            out.append(f"{key} {value} instead of {lab.options[key]}")
    out += [f"without {key}" + ("" if value is None else f" {value}") for key, value in lab.options.items()
            if key not in NEUTRAL and key not in run.options]
    return out


def closest(lines: list[CommandLine], argv: object) -> tuple[int, list[str]]:
    """(how many options differ, what differs) from the nearest of the lab's lines that shares the run's
    command words; (0, []) when the result recorded no command line to compare."""
    run = recorded(argv)
    if run is None or not lines:
        return 0, []
    def shared(line: CommandLine) -> int:  # leading words in common: "bench compare" is nearer "bench compare"
        n = 0
        while n < min(len(line.words), len(run.words)) and line.words[n] == run.words[n]:
            n += 1
        return n

    most = max(shared(line) for line in lines)
    best = min((differences(line, run) for line in lines if shared(line) == most), key=len)
    return len(best), best
