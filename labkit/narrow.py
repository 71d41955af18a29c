"""Tables in a terminal narrower than they are: every word whole, or another layout.

Given a table wider than the console, rich narrows the widest columns first, down to the next widest, and
cuts or folds the words of a column that ends up narrower than its longest word, though a neighbour with
room to spare could have wrapped instead ("ms/to…" in a nine-column table at 80 columns). `fit` gives each
column a width of its own instead, or says that the table cannot fit.
"""
from __future__ import annotations

import os

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


def fit(table: Table, console: Console) -> bool:
    """Set the widths of `table`'s columns so that it fits the console with no word cut: as rich does, the
    widest columns give up room first, but none below its longest word. False (widths untouched) when the
    longest words alone do not fit: the caller prints another layout."""
    wide = console.options.update_width(10_000)
    lo, hi = [], []
    for col in table.columns:
        cells = [Measurement.get(console, wide, cell) for cell in list(col.cells) or [""]]
        head = Measurement.get(console, wide, col.header if table.show_header else "")
        hi.append(max(m.maximum for m in [head, *cells]))
        if col.no_wrap:
            # Cells kept on one line; a header given as Text(no_wrap=False) may still wrap at its spaces.
            head_wraps = isinstance(col.header, Text) and col.header.no_wrap is False
            lo.append(max([m.maximum for m in cells] + [head.minimum if head_wraps else head.maximum]))
        else:
            lo.append(max(m.minimum for m in [head, *cells]))
    # Borders and padding: what the whole table measures beyond its cells.
    room = console.width - (Measurement.get(console, wide, table).maximum - sum(hi))
    if sum(lo) > room:
        return False
    widths = list(hi)
    while sum(widths) > room:
        i = max((k for k in range(len(widths)) if widths[k] > lo[k]), key=widths.__getitem__)
        widths[i] -= 1
    for col, width in zip(table.columns, widths):
        col.width = width
    return True


def log_console(log_width: int, **kwargs) -> Console:
    """The console; in a pipe or a log that sets no COLUMNS, `log_width` wide (rich would take 80) so that a
    wide table stays one line per row there. COLUMNS, when set, is the width to fit."""
    console = Console(**kwargs)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=log_width, **kwargs)
    return console


def hanging(label: str, text: str | Text, indent: int | None = None, label_style: str = "") -> Table:
    """`label` then `text`, the text's continuation lines indented under its start (or `indent` columns in)
    rather than back at the margin, where they read as a new entry; words are wrapped whole."""
    grid = Table.grid()
    grid.add_column(no_wrap=True, width=len(label) if indent is None else indent)
    grid.add_column(ratio=1, overflow="fold")  # a word wider than the column (a long path) is kept whole, folded
    grid.add_row(Text(label, style=label_style), text if isinstance(text, Text) else Text(text))
    return grid
