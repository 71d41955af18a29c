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


def fit(table: Table, console: Console) -> bool:
    """Set the widths of `table`'s columns so that it fits the console with no word cut: as rich does, the
    widest columns give up room first, but none below its longest word. False (widths untouched) when the
    longest words alone do not fit: the caller prints another layout."""
    wide = console.options.update_width(10_000)
    lo, hi = [], []
    for col in table.columns:
        cells = [col.header, *col.cells] if table.show_header else list(col.cells)
        sizes = [Measurement.get(console, wide, cell) for cell in cells or [""]]
        hi.append(max(m.maximum for m in sizes))
        lo.append(hi[-1] if col.no_wrap else max(m.minimum for m in sizes))
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
