"""The Events view: the bus event log (crashes, restarts, faults, errors, commands, plans), filterable.

Newest first; the cursor follows the newest event unless the operator moved it down. Enter shows the
event in full. ``/`` goes to the filter box, Esc (or Enter) leaves it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import DataTable, Input, Select

from tui.model import EVENT_KINDS, EventView, State
from tui.widgets.bars import clock
from tui.widgets.base import StateView
from tui.widgets.tables import Col, selected_key, show_table

SHOWN = 500
SEVERITY_STYLE = {"info": "", "warn": "yellow", "error": "bold red"}
PROBLEMS = "problems"
COLUMNS = (
    Col("n", "#", 3),
    Col("t", "Time", 1),
    Col("kind", "Kind", 2),
    Col("source", "Source", 4),
    Col("text", "Event", 0, flex=True, min_width=24),
)


def matches(e: EventView, kind: str, text: str) -> bool:
    """Whether an event passes the kind filter (a kind, ``problems`` for warnings and errors, or all)
    and contains every word of ``text`` (case-insensitive)."""
    if kind == PROBLEMS:
        if e.severity == "info":
            return False
    elif kind and e.kind != kind:
        return False
    hay = f"{e.kind} {e.source} {e.text}".lower()
    return all(w in hay for w in text.lower().split())


class FilterInput(Input):
    """The filter box: Esc leaves it for the table."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "leave", "Leave filter", show=True)]

    def action_leave(self) -> None:
        self.screen.set_focus(self.screen.query_one("#events-table"))


class EventsView(StateView):
    """Newest first; filter by kind and by words."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("enter", "open", "Show event"),
    ]

    def compose(self) -> ComposeResult:
        with Horizontal(id="events-bar"):
            yield FilterInput(placeholder="/ filter: words to match (Esc leaves)", id="events-filter", compact=True)
            options = [("warnings + errors", PROBLEMS), *((k, k) for k in EVENT_KINDS)]
            yield Select(options, prompt="all kinds", id="events-kind", allow_blank=True, compact=True)
        yield DataTable(id="events-table", cursor_type="row", zebra_stripes=True)

    def inputs(self, state: State) -> Sequence[object]:
        return (state.events, state.dropped)

    def show(self, state: State) -> None:
        kind_sel = self.query_one("#events-kind", Select).value
        kind = kind_sel if isinstance(kind_sel, str) else ""
        text = self.query_one("#events-filter", Input).value
        table: DataTable[Any] = self.query_one("#events-table", DataTable)
        rows = []
        for e in reversed(state.events):
            if not matches(e, kind, text):
                continue
            style = SEVERITY_STYLE.get(e.severity, "")
            cells = [str(e.n), clock(e.t), Text(e.kind, style=style), e.source, Text(e.text, style=style)]
            rows.append((str(e.n), cells))
            if len(rows) >= SHOWN:
                break
        show_table(table, COLUMNS, rows, self.room, follow=True)
        table.border_subtitle = f"{len(rows)} shown of {len(state.events)}" + (
            f", {state.dropped} dropped in floods" if state.dropped else ""
        )

    def _refilter(self) -> None:
        if self.state is not None:
            self.show(self.state)

    def on_input_changed(self, event: Input.Changed) -> None:
        self._refilter()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.screen.set_focus(self.query_one("#events-table"))

    def on_select_changed(self, event: Select.Changed) -> None:
        self._refilter()

    def action_filter(self) -> None:
        # set_focus now, not focus() (which waits for the next idle): keys typed right after the ``/``
        # must reach the box, not fire the app's hotkeys
        self.screen.set_focus(self.query_one("#events-filter", Input))

    def action_open(self) -> None:
        self.detail("event", selected_key(self.query_one("#events-table", DataTable)))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.detail("event", event.row_key.value)
