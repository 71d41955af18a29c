"""The `labkit` command line: one line per command, the work lives in the command's module.

Adding a command: write `labkit/NAME.py` with a function `run(...)` (or a Typer sub-app `app`)
that raises `typer.Exit(EXIT_PASS | EXIT_FAIL)` or `LabkitError` for inputs it cannot run with,
then register it below in one line, like `smoke` (plain command) or `model` (sub-app).
Error handling and exit codes are `main()`'s job, never the command's.
"""

from __future__ import annotations

import os
import sys
import traceback

import typer

from labkit import __version__
from labkit import doctor as doctor_cmd
from labkit import model as model_cmd
from labkit import shapes as shapes_cmd
from labkit import smoke as smoke_cmd
from labkit.trace import command as trace_cmd
from labkit.bench import command as bench_cmd
from labkit import notes as notes_cmd
from labkit import patch as patch_cmd
from labkit import principles as principles_cmd
from labkit.report import command as report_cmd
from labkit.logits import command as logits_cmd
from labkit.serve import command as serve_cmd
from labkit.errors import LabkitError
from labkit.output import EXIT_CANNOT_RUN

app = typer.Typer(
    name="labkit",
    help="A command-line lab for studying and improving an LLM inference engine.",
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
    """Exit codes: 0 pass, 1 a check failed, 2 could not run (bad input, missing model/GPU/package)."""


# Commands, one line each.
app.command("doctor", help="Check Python, torch, GPU, optional kernels, the model and disk.")(doctor_cmd.run)
app.command("smoke", help="Load the engine and generate a couple of tokens: the main job.")(smoke_cmd.run)
app.add_typer(model_cmd.app, name="model", help="Make, fetch and inspect model folders.")
app.command("shapes", help="Per-rank tensor-parallel shapes from config.json; --check compares with the engine.")(shapes_cmd.run)
app.add_typer(trace_cmd.app, name="trace", help="Run a traced case, show every step, check expected states.")
app.add_typer(bench_cmd.app, name="bench", help="Offline throughput (engine or HF baseline), online load against serve, and B/A comparisons.")
app.add_typer(logits_cmd.app, name="logits-check", help="Teacher-forced logits of the engine against Transformers.")
app.add_typer(serve_cmd.app, name="serve", help="Serve the engine over OpenAI-shaped HTTP; `serve client` sends a request.")
app.add_typer(report_cmd.app, name="report", help="Every lab of the plan with its verdict: report.md/.html, manifest, archive; `verify` re-checks one.")
app.add_typer(patch_cmd.app, name="patch", help="List, apply and revert the experiment and fault patches in patches/.")
app.add_typer(notes_cmd.app, name="notes", help="Lab notes in notes/: one per lab of the plan (init), or from a template (new).")
app.add_typer(principles_cmd.app, name="principles", help="The seeds' CPU principle labs (no engine), each checked against the seeds' values.")


def _one_line(text: object) -> str:
    return " ".join(str(text).split()) or "(no message)"


def _fail(message: str, code: int) -> None:
    print(f"labkit: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app and turn every failure into one line + exit code.

    Click's standalone mode already maps usage errors to exit 2 (with its own message),
    `typer.Exit(n)` to n and Ctrl-C to 130; everything that escapes it is mapped here.
    """
    command = typer.main.get_command(app)
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
    sys.exit(0)
