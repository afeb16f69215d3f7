"""Keeping a DataTable in step with a list of rows without losing the cursor, with the columns that fit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
from rich.text import Text
from textual.widgets import DataTable

Row = tuple[str, Sequence[Any]]


def set_columns(
    table: DataTable[Any], columns: Sequence[tuple[str, str]], widths: Sequence[int | None] | None = None
) -> None:
    """Give ``table`` these (key, label) columns (of fixed ``widths`` where not None; else their content's),
    rebuilding it only when they differ."""
    ws = list(widths) if widths is not None else [None] * len(columns)
    have = [(str(c.key.value), str(c.label), None if c.auto_width else c.width) for c in table.ordered_columns]
    if have == [(k, str(label), w) for (k, label), w in zip(columns, ws, strict=True)]:
        return
    table.clear(columns=True)
    for (key, label), w in zip(columns, ws, strict=True):
        table.add_column(label, key=key, width=w)


def selected_key(table: DataTable[Any]) -> str | None:
    """The key of the row under the cursor, if any."""
    if table.row_count == 0:
        return None
    try:
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
    except Exception:  # the cursor is past the last row while the table changes
        return None
    return None if key.value is None else str(key.value)


def sync_rows(table: DataTable[Any], rows: Sequence[Row]) -> None:
    """Make the table show ``rows`` (key, cells): update changed cells in place when the keys are the same
    and in the same order, otherwise rebuild, keeping the cursor on the same key where it still exists."""
    keys = [k for k, _ in rows]
    current = [str(r.key.value) for r in table.ordered_rows]
    if keys != current:
        sel = selected_key(table)
        row_at = table.cursor_row
        table.clear()
        for key, cells in rows:
            table.add_row(*cells, key=key)
        if sel is not None and sel in keys:
            table.move_cursor(row=keys.index(sel), animate=False)
        elif rows:
            table.move_cursor(row=min(row_at, len(rows) - 1), animate=False)
        return
    cols = [c.key for c in table.ordered_columns]
    for key, cells in rows:
        old = table.get_row(key)
        for i, (a, b) in enumerate(zip(old, cells, strict=False)):
            if a != b:
                table.update_cell(key, cols[i], b, update_width=table.ordered_columns[i].auto_width)


@attrs.frozen
class Col:
    """A column that may be left out when the table is narrow: lower ``priority`` is kept first. A ``flex``
    column takes the width left over (at least ``min_width``) and cuts its cells with an ellipsis."""

    key: str
    label: str
    priority: int
    flex: bool = False
    min_width: int = 8


PAD = 2
"""Columns take their content's width plus one cell of padding on each side."""
SCROLLBAR = 2


def _cell_len(cell: Any) -> int:
    return cell.cell_len if isinstance(cell, Text) else len(str(cell))


def fit_columns(cols: Sequence[Col], rows: Sequence[Row], width: int) -> tuple[list[int], dict[int, int]]:
    """Which columns fit in ``width`` cells (indices, in table order), kept by priority, and the width of
    each (index -> width: its content's, or what is left for a flex column)."""
    natural = [max([len(c.label)] + [_cell_len(r[1][i]) for r in rows]) for i, c in enumerate(cols)]
    room = width - SCROLLBAR
    order = sorted(range(len(cols)), key=lambda i: (cols[i].priority, i))
    chosen: list[int] = []
    used = 0
    for i in order:
        need = (cols[i].min_width if cols[i].flex else natural[i]) + PAD
        if used + need <= room or not chosen:
            chosen.append(i)
            used += need
    # a flex column cut short gets the room of the columns that matter less than it (unless it is of the
    # first rank, as an event's text: then the columns around it stay and it takes what is left)
    for f in [i for i in chosen if cols[i].flex and cols[i].priority > 0]:
        short = natural[f] - cols[f].min_width - (room - used)
        for i in sorted(chosen, key=lambda i: -cols[i].priority):
            if short <= 0 or cols[i].priority <= cols[f].priority:
                break
            chosen.remove(i)
            used -= natural[i] + PAD
            short -= natural[i] + PAD
    chosen.sort()
    widths: dict[int, int] = {}
    for i in chosen:
        if cols[i].flex:
            widths[i] = max(cols[i].min_width, min(natural[i], room - used + cols[i].min_width))
            used += widths[i] - cols[i].min_width
        else:
            widths[i] = natural[i]
    return chosen, widths


def cut(cell: Any, width: int) -> Text:
    """A cell no wider than ``width``, ending in an ellipsis when it was cut."""
    t = cell.copy() if isinstance(cell, Text) else Text(str(cell))
    if t.cell_len > width:
        t.truncate(width, overflow="ellipsis")
    return t


def show_table(
    table: DataTable[Any], cols: Sequence[Col], rows: Sequence[Row], width: int, *, follow: bool = False
) -> list[str]:
    """Show ``rows`` with the columns that fit ``width`` (see ``fit_columns``); returns the keys shown.

    ``follow``: when the cursor is on the first row (or the table is empty), it stays there as new rows
    arrive above it (a log that follows the newest entry); moved down, it stays on its row."""
    chosen, widths = fit_columns(cols, rows, width)
    at_top = table.row_count == 0 or table.cursor_row <= 0
    # fixed widths, measured here: a DataTable measures auto widths later, at idle, and may then show
    # rows drawn at the old widths until something else changes
    set_columns(table, [(cols[i].key, cols[i].label) for i in chosen], widths=[widths[i] for i in chosen])
    shown = [(k, [cut(c[i], widths[i]) if cols[i].flex else c[i] for i in chosen]) for k, c in rows]
    sync_rows(table, shown)
    if follow and at_top and table.row_count:
        table.move_cursor(row=0, animate=False)
    return [cols[i].key for i in chosen]
