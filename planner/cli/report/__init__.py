"""Rendering: results on stdout (rich tables for people, JSON / CSV for machines); progress on stderr.

One sub-module per command family (`report.fit`, `report.sweep`, ...); the shared helpers are here
so every command formats bytes, times and JSON the same way.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from planner.core.spec import GIB

if TYPE_CHECKING:  # rich is imported by the functions that draw: `zplan check` prints one line
    from rich.console import Console
    from rich.table import Table

JSON_SCHEMA_VERSION = 1
"""Bumped when a `--json` field is renamed or removed (adding fields keeps the version)."""

PIPE_WIDTH = 100
"""Columns used when stdout is not a terminal (CI logs, pipes, files): tables fit 100 columns;
a wider terminal (or COLUMNS) gets wider tables. A table whose numbers cannot fit 100 columns
(extreme values) is printed as wide as they need, never cut (`print_table`)."""


def human_console() -> Console:
    """The console for results people read: stdout (`zplan fit > plan.txt`, `| less`)."""
    console = planner_console()
    if _off_terminal(console):
        console.width = PIPE_WIDTH
    return console


def _off_terminal(console: Console) -> bool:
    return not console.is_terminal and "COLUMNS" not in os.environ


def print_table(console: Console, table: Table) -> None:
    """Print a report table. Off a terminal, a table too wide for the console even with its text
    columns wrapped to their longest word is printed at the width it needs: rich's last resort
    would otherwise shorten every column, numbers too ('2,283,933' -> '2,283…'), and a log
    reader cannot widen a file. On a terminal rich fits the window (widen it, or set COLUMNS)."""
    if not _off_terminal(console) or _plain_width(table) <= console.width:
        console.print(table)  # the common case, decided without rich's measuring (~10 ms)
        return
    need = needed_width(console, table)
    if need <= console.width:
        console.print(table)
        return
    width = console.width
    console.width = need
    try:
        console.print(table)
    finally:
        console.width = width


def _plain_width(table: Table) -> float:
    """The widest a `table()` of plain-text cells can be: each column's longest line plus the
    two columns between neighbours (padding and rule); infinite when a cell is not a string."""
    from rich.cells import cell_len

    total = 2 * (len(table.columns) - 1)
    for column in table.columns:
        cells = (column.header, *column.cells)
        if not all(isinstance(cell, str) for cell in cells):
            return float("inf")
        total += max(cell_len(line) for cell in cells for line in cell.split("\n"))
    return total


def needed_width(console: Console, table: Table) -> int:
    """Columns `table` needs with nothing cut: each no-wrap column at its widest cell, each
    other column at its longest word, plus the padding and rules rich adds (its whole natural
    width less the columns' widest cells)."""
    unbounded = console.options.update_width(1_000_000)  # measured without the console's cap
    columns = [[console.measure(cell, options=unbounded) for cell in (column.header, *column.cells)]
               for column in table.columns]
    widest = [max(m.maximum for m in cells) for cells in columns]
    needed = [w if column.no_wrap else max(m.minimum for m in cells)
              for w, column, cells in zip(widest, table.columns, columns)]
    return console.measure(table, options=unbounded).maximum - sum(widest) + sum(needed)


def progress_console(**settings: Any) -> Console:
    """The console for progress bars and diagnostics: stderr, so stdout holds only results."""
    return planner_console(stderr=True, **settings)


def planner_console(**settings: Any) -> Console:
    """A rich Console (no highlighting, wrapping or `:name:` emoji codes; no report prints one)
    whose reader going away is a `BrokenPipeError` for `main` to report: exit 4, one line.
    rich's own `Console.on_broken_pipe` ends the process with `SystemExit(1)` and no message,
    and 1 means "does not fit" to a CI gate (`zplan fit ... | head` exited 1 before this;
    rich/console.py, `on_broken_pipe`: "implement this method in a subclass to change the
    behavior")."""
    return _console_class()(highlight=False, soft_wrap=False, emoji=False, **settings)


@functools.cache
def _console_class() -> type[Console]:
    from rich.console import Console

    class PlannerConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True  # nothing more is written to the closed pipe
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    return PlannerConsole


def fmt_bytes(n_bytes: float) -> str:
    """Bytes as GiB with two decimals (binary units, as nvidia-smi and torch report memory)."""
    return f"{n_bytes / GIB:,.2f} GiB"


def gib(n_bytes: float) -> str:
    """Bytes as a bare GiB number with two decimals (for table cells under a `GiB` header)."""
    return f"{n_bytes / GIB:,.2f}"


_SUFFIXES = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))
"""Short forms of large counts (`fmt_count`, `fmt_short`)."""


def fmt_count(n: float) -> str:
    """A large count with thousands separators and a short form: 175,181,291,520 (175.2B)."""
    for div, suffix in _SUFFIXES:
        if abs(n) >= div:
            return f"{n:,.0f} ({n / div:.1f}{suffix})"
    return f"{n:,.0f}"


def fmt_short(n: float) -> str:
    """A large count in three significant digits with a suffix: 3e11 -> 300B, 1.5e12 -> 1.5T."""
    for div, suffix in _SUFFIXES:
        if abs(n) >= div:
            value = n / div
            return (f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}") + suffix
    return f"{n:.3g}"


def fmt_seconds(seconds: float) -> str:
    """A duration: ms below one second, s below an hour, then hours or days."""
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 3600:
        return f"{seconds:.2f} s"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def table(title: str, **kwargs: Any) -> Table:
    """A table with a header rule and two spaces between columns (no side borders), so the
    widest report fits 100 columns."""
    from rich import box
    from rich.table import Table

    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                 pad_edge=False, padding=(0, 1, 0, 0), collapse_padding=True, **kwargs)


def emit_json(kind: str, payload: Any) -> None:
    """Write one JSON document to stdout: {"schema_version", "kind", ...payload}."""
    body = payload if isinstance(payload, dict) else payload.model_dump(mode="json")
    doc = {"schema_version": JSON_SCHEMA_VERSION, "kind": kind, **body}
    json.dump(doc, sys.stdout, indent=2, allow_nan=False)  # strict JSON: no Infinity / NaN
    sys.stdout.write("\n")
