"""Keeping a DataTable in step with a list of rows without losing the cursor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textual.widgets import DataTable

Row = tuple[str, Sequence[Any]]


def set_columns(table: DataTable[Any], columns: Sequence[tuple[str, str]]) -> None:
    """Give ``table`` these (key, label) columns, rebuilding it only when they differ."""
    have = [(str(c.key.value), str(c.label)) for c in table.ordered_columns]
    if have == [(k, str(label)) for k, label in columns]:
        return
    table.clear(columns=True)
    for key, label in columns:
        table.add_column(label, key=key)


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
                table.update_cell(key, cols[i], b, update_width=True)
