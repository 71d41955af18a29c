"""A lab's command lines against the command line a result recorded (its `argv`): which result is the lab's
own command, and, for one that is not, what differs ("--max-num-batched-tokens 100", "--workload fixed instead of
nano").

The plan's `match` conditions decide which results may answer a lab (the same workload, policy, variable);
among those, the report prefers the one whose options are the lab's. Options that name where a result goes
or which files it reads (--out, --model, ...) and --device (the evidence kind already ranks what ran where)
do not count, nor does the value of an option the lab leaves to fill in (`--url URL_SERVER`: any URL).
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

# Options that do not change what a command measures or checks.
NEUTRAL = frozenset({"--out", "--json", "--model", "--device", "-q", "--quiet", "--title", "--runs",
                     "--with-logs", "--allow-single"})
# A value the plan leaves to fill in (URL_SERVER, URL_GPU0,URL_GPU1): whatever the run gave is the lab's.
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b")


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
        elif lab.options[key] != value and not PLACEHOLDER.search(lab.options[key] or ""):
            out.append(f"{key} {value} instead of {lab.options[key]}")
    out += [f"without {key}" + ("" if value is None else f" {value}") for key, value in lab.options.items()
            if key not in NEUTRAL and key not in run.options]
    return out


def _place(line: CommandLine) -> str | None:
    """Where a line writes its result: the last part of its --out (runs/x.json and /abs/runs/x.json alike), or
    None for the command's own default place."""
    out = line.options.get("--out")
    return out.rstrip("/").rsplit("/", 1)[-1] if out else None


def closest(lines: list[CommandLine], argv: object) -> tuple[int, int, list[str]]:
    """(how many options differ, whether it wrote elsewhere than that line does, what differs) from the nearest
    of the lab's lines that shares the run's command words; (0, 0, []) when the result recorded no command line
    to compare. The place breaks ties: `--out` is neutral as an option, but of two runs with the lab's options,
    the one written where the lab's line writes is its own (bench-offline's `bench --workload nano --repeats 3`
    against fp8-kv's same bench with `--out runs/bench-nano-kv-auto.json`, which the H200 plan showed under
    bench-offline as the newer)."""
    run = recorded(argv)
    if run is None or not lines:
        return 0, 0, []
    def shared(line: CommandLine) -> int:  # leading words in common: "bench compare" is nearer "bench compare"
        n = 0
        while n < min(len(line.words), len(run.words)) and line.words[n] == run.words[n]:
            n += 1
        return n

    most = max(shared(line) for line in lines)
    ranked = [(len(d), int(_place(line) != _place(run)), d)
              for line in lines if shared(line) == most for d in [differences(line, run)]]
    n, elsewhere, best = min(ranked, key=lambda x: (x[0], x[1]))
    return n, elsewhere, best
