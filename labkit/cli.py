"""The `labkit` command line: the table of commands, and main(), which turns every failure into one line + exit code.

Adding a command: write `labkit/NAME.py` with a function `run(...)` (or a Typer sub-app `app`) that takes the
shared options from labkit/options.py, ends its help with an `Example: labkit NAME ...` paragraph, and raises
`typer.Exit(EXIT_PASS | EXIT_FAIL)` or `LabkitError` for inputs it cannot run with; then add its line to COMMANDS.
Error handling and exit codes are `main()`'s job, never the command's.

A command's module is imported only when that command runs or shows its own help, so `labkit --help` starts in a
fraction of a second; and a command module imports torch, transformers, the engine or fastapi only inside the
functions that need them, so every `--help` stays fast too (tests/test_cli.py checks both).
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import textwrap
import traceback

import typer
import typer.core

from labkit import __version__, help_layout, output
from labkit.errors import LabkitError
from labkit.output import EXIT_CANNOT_RUN

# name: (where the command lives as "module:attribute", its line in `labkit --help`), in the order listed.
COMMANDS = {
    "doctor": ("labkit.doctor:run", "Check Python, torch, GPU, optional kernels, the model and disk."),
    "smoke": ("labkit.smoke:run", "Load the engine and generate a couple of tokens: the main job."),
    "shapes": ("labkit.shapes:run", "Per-rank tensor-parallel shapes from config.json; --check compares with the "
                                    "engine."),
    "model": ("labkit.model:app", "Make, fetch and inspect model folders."),
    "trace": ("labkit.trace.command:app", "Run a traced case, show every step, check expected states."),
    "bench": ("labkit.bench.command:app", "Offline throughput (engine or HF baseline), online load against serve, "
                                          "and B/A comparisons."),
    "logits-check": ("labkit.logits.command:app", "Teacher-forced logits of the engine against Transformers."),
    "serve": ("labkit.serve.command:app", "Serve the engine over OpenAI-shaped HTTP; `serve client` sends a request."),
    "watch": ("labkit.watch:run", "Watch a running server step by step (serve --step-stream): a live view in 80 "
                                  "columns."),
    "report": ("labkit.report.command:app", "Every lab of the plan with its verdict: report.md/.html, manifest, "
                                            "archive; `verify` re-checks one."),
    "patch": ("labkit.patch:app", "List, apply and revert the experiment and fault patches in patches/."),
    "notes": ("labkit.notes:app", "Lab notes in notes/: one per lab of the plan (init), or from a template (new)."),
    "principles": ("labkit.principles:app", "CPU principle labs (no engine): each value computed from first "
                                            "principles, checked, and stated with how it follows."),
}


class _Unloaded(typer.core.TyperCommand):
    """A command whose module is not imported yet: its name and line are enough for `labkit --help`."""

    def __init__(self, name: str, target: str, line: str):
        super().__init__(name=name, help=line, short_help=line)
        self.target = target

    def load(self) -> typer.core.TyperCommand | typer.core.TyperGroup:
        module, attribute = self.target.split(":")
        found = getattr(importlib.import_module(module), attribute)
        if isinstance(found, typer.Typer):
            command = typer.main.get_group(found)
        else:
            single = typer.Typer(add_completion=False)
            single.command(self.name)(found)
            command = typer.main.get_command(single)
        command.name, command.short_help = self.name, self.short_help
        command.help = command.help or self.help
        from labkit.engine_args import accept_old_names

        accept_old_names(command)  # --budget, --tp, ... (the engine flags' names before they took their fields')
        return command


class _Commands(typer.core.TyperGroup):
    """The root group: loads a command's module when the command is looked up, except to list it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._listing = False
        for name, (target, line) in COMMANDS.items():
            self.commands.setdefault(name, _Unloaded(name, target, line))

    def get_command(self, ctx, cmd_name):
        command = self.commands.get(cmd_name)
        if isinstance(command, _Unloaded) and not self._listing:
            command = self.commands[cmd_name] = command.load()
        return command

    def format_help(self, ctx, formatter):
        # The help lists every command by name and line: the placeholders do, without importing a module.
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


def _tidy_typer_help() -> None:
    """Typer 0.29's rich help shows `<bool>` after every flag (`--json <bool>`, `--help <bool>`) though a flag takes
    no value, and writes required arguments in braces (`{A.json}`). Show flags bare and required arguments by name,
    the way click's usage lines read. Skipped where typer lacks these methods (other versions)."""
    option, argument = typer.core.TyperOption, typer.core.TyperArgument
    if hasattr(option, "display_type_rich"):
        type_of = option.display_type_rich

        def display_type_rich(self, ctx):
            return None if self.is_flag and not self.count else type_of(self, ctx)

        option.display_type_rich = display_type_rich
    if hasattr(argument, "_usage_display_name"):
        def _usage_display_name(self) -> str:
            name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
            return name + ("..." if self.nargs != 1 else "")

        argument._usage_display_name = _usage_display_name


_tidy_typer_help()
help_layout.install()

app = typer.Typer(
    name="labkit",
    cls=_Commands,
    help="A command-line lab for studying and improving an LLM inference engine.\n\n"
         "Exit codes: 0 pass, 1 a check failed, 2 could not run (bad input, missing model/GPU/package).\n\n"
         "Example: labkit smoke --device cpu",
    no_args_is_help=True,
    add_completion=False,
    # main() prints one line for every error; Typer's own traceback printer would bypass it.
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"labkit {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the labkit version and exit."),
) -> None:
    pass


def _one_line(text: object) -> str:
    """One line, and nothing a terminal would act on: control characters (an escape sequence in a file's value,
    say) are shown as Python writes them (\\x1b), never sent raw."""
    line = " ".join(str(text).split()) or "(no message)"
    return line if line.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)


def reason_lines(message: str, width: int | None) -> str:
    """The reason as printed: one line; in a terminal (`width`) wrapped between words with its continuation
    indented, where the terminal itself would cut a word at its edge. Pipes and logs keep the one line."""
    line = f"labkit: {message}"
    if width is None:
        return line
    return "\n".join(textwrap.wrap(line, max(width, 20), subsequent_indent="  ", break_long_words=False,
                                   break_on_hyphens=False)) or line


def _fail(message: str, code: int) -> None:
    width = shutil.get_terminal_size().columns if sys.stderr.isatty() else None
    print(reason_lines(message, width), file=sys.stderr, flush=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app and turn every failure into one line + exit code.

    Click's standalone mode already maps usage errors to exit 2 (with its own message),
    `typer.Exit(n)` to n and Ctrl-C to 130; everything that escapes it is mapped here.
    """
    command = typer.main.get_command(app)
    # Results record the command line they ran: this one, where it is not sys.argv (labkit run in-process).
    output.set_command_line(None if argv is None else ["labkit", *argv])
    try:
        command.main(args=argv, prog_name="labkit", standalone_mode=True)
    except LabkitError as exc:
        _fail(_one_line(exc), exc.code)
    except ValueError as exc:
        # The engine signals bad arguments with ValueError naming the argument.
        _fail(_one_line(exc), EXIT_CANNOT_RUN)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence against tracebacks
        if os.environ.get("LABKIT_DEBUG") == "1":
            traceback.print_exc()
            hint = ""
        else:
            hint = " (set LABKIT_DEBUG=1 for the traceback)"
        _fail(f"{type(exc).__name__}: {_one_line(exc)}{hint}", EXIT_CANNOT_RUN)
    finally:
        output.set_command_line(None)
    sys.exit(0)
