"""How every `--help` is laid out, at any terminal width: no flag name cut, no word split across lines.

Typer's rich help prints a panel of options as a six-column table (long flags, short flags, their negative
forms twice, the type, the help). At 80 columns the columns it cannot shrink enough are cut or folded: a flag
name becomes `--async-scheduli…`, a list of choices is split mid-word (`<prefill_first|b` / `alanced|mixed>`)
and the help is left a strip of 17 characters. Here a panel has two columns: what to type (the flags, their
negative form and the value they take, never wrapped) and what it does. Where that first column would leave
the help too little room, or less than its longest word, each option instead takes a line of its own with its
help indented below at the full width. The layout depends on the flags' width, not on their names, so a
renamed or added flag keeps it.

Typer also keeps the single line breaks of a docstring's later paragraphs, so a description wrapped in the
source broke mid-sentence on screen; here a paragraph is re-flowed, except lines that start a list item or a
paragraph marked verbatim with click's `\\b`.

`install()` replaces the two typer functions that do this (typer.rich_utils' `_print_options_panel` and
`_fix_linebreaks`); where a typer version lacks them, its own layout stays.
"""
from __future__ import annotations

import re
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

# The help column's least width beside the flags; below it, each option's help goes under its flags.
MIN_HELP_WIDTH = 32
# The help's indent under its flags in the stacked layout.
STACKED_INDENT = 4
# A line that starts a list item keeps its line break when a paragraph is re-flowed.
_LIST_ITEM = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s")


def reflow(paragraph: str) -> str:
    """One paragraph of help with its single line breaks made spaces (but before a list item); a paragraph
    starting with click's verbatim marker `\\b` is kept as written, without the marker."""
    if paragraph.startswith("\b"):
        return paragraph.lstrip("\b").strip("\n")
    lines = [line.strip() for line in paragraph.splitlines() if line.strip()]
    out: list[str] = []
    for line in lines:
        if out and not _LIST_ITEM.match(line):
            out[-1] += " " + line
        else:
            out.append(line)
    return "\n".join(out)


def fix_linebreaks(paragraphs: list[str], markup_mode: Any = None) -> str:
    return "\n\n".join(reflow(p) for p in paragraphs)


def names_of(param: Any, ctx: Any) -> Text:
    """What a user types: `--flag, -f/--no-flag TYPE [range]`, or an argument's name and type."""
    if getattr(param, "param_type_name", "") == "argument":
        names = [str(getattr(param, "display_name_raw", None) or param.name or "ARG")]
    else:
        longs = [o for o in param.opts if o.startswith("--")]
        names = [", ".join(longs + [o for o in param.opts if not o.startswith("--")])]
        if param.secondary_opts:
            names[0] += " / " + ", ".join(param.secondary_opts)
    text = Text(names[0], style="bold cyan")
    display = getattr(param, "display_type_rich", None)
    kind = display(ctx) if display is not None else None
    ranged = getattr(param, "_get_number_range_help_str", None)
    limits = ranged() if ranged is not None else None
    if kind:
        text.append(" " + str(kind), style="bold yellow")
    if limits:
        text.append(f" [{limits}]", style="dim")
    return text


def help_of(param: Any, ctx: Any, markup_mode: Any) -> RenderableType:
    """The option's help with its default and required marks, as one paragraph (typer's builder, whose parts
    typer would lay out as columns side by side)."""
    from typer import rich_utils

    parts = rich_utils._get_parameter_help(param=param, ctx=ctx, markup_mode=markup_mode)
    items = list(getattr(parts, "renderables", [parts]))
    if all(isinstance(item, Text) for item in items):
        return Text(" ").join(items) if items else Text("")
    return Group(*items)


def _widest_word(renderable: RenderableType) -> int:
    text = renderable.plain if isinstance(renderable, Text) else ""
    return max((len(word) for word in text.split()), default=0)


def options_panel(name: str, rows: list[tuple[Text, RenderableType]], console: Console) -> Panel:
    """A panel of (names, help) rows: two columns where the help keeps room enough, else stacked."""
    inner = console.width - 4  # the panel's border and padding
    wide = console.options.update_width(10_000)
    names_width = max((Measurement.get(console, wide, names).maximum for names, _ in rows), default=0)
    help_room = inner - names_width - 2
    longest_word = max((_widest_word(text) for _, text in rows), default=0)
    if help_room >= max(MIN_HELP_WIDTH, longest_word):
        table = Table.grid(padding=(0, 2), expand=True)
        table.add_column(no_wrap=True, width=names_width)
        table.add_column(ratio=1)
        for names, text in rows:
            table.add_row(names, text)
        body: RenderableType = table
    else:
        body = Group(*[part for names, text in rows
                       for part in (names, Padding(text, (0, 0, 0, STACKED_INDENT)))])
    return Panel(body, border_style="dim", title=name, title_align="left")


def print_options_panel(*, name: str, params: list, ctx: Any, markup_mode: Any, console: Console) -> None:
    """typer.rich_utils._print_options_panel's replacement (same arguments)."""
    if not params:
        return
    rows = [(names_of(p, ctx), help_of(p, ctx, markup_mode)) for p in params]
    console.print(options_panel(name, rows, console))


# typer's own panel printer, kept for the test that shows what it does at 80 columns.
typer_options_panel = None


def install() -> None:
    global typer_options_panel
    from typer import rich_utils

    if hasattr(rich_utils, "_print_options_panel") and hasattr(rich_utils, "_get_parameter_help"):
        if rich_utils._print_options_panel is not print_options_panel:
            typer_options_panel = rich_utils._print_options_panel
        rich_utils._print_options_panel = print_options_panel
    if hasattr(rich_utils, "_fix_linebreaks"):
        rich_utils._fix_linebreaks = fix_linebreaks
