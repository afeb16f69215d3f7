"""The Events view: the bus event log (crashes, restarts, faults, errors, commands, plans), filterable."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Input, Select

from tui.state import EVENT_KINDS, EventView, State
from tui.widgets.bars import clock
from tui.widgets.tables import set_columns, sync_rows

SHOWN = 500
SEVERITY_STYLE = {"info": "", "warn": "yellow", "error": "bold red"}
PROBLEMS = "problems"


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


class EventsView(Vertical):
    """Newest first; filter by kind and by words."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("slash", "filter", "Filter", key_display="/")]

    def compose(self) -> ComposeResult:
        with Horizontal(id="events-bar"):
            yield Input(placeholder="filter: words to match", id="events-filter")
            options = [("warnings + errors", PROBLEMS), *((k, k) for k in EVENT_KINDS)]
            yield Select(options, prompt="all kinds", id="events-kind", allow_blank=True)
        yield DataTable(id="events-table", cursor_type="row", zebra_stripes=True)

    def show(self, state: State) -> None:
        self._state = state
        kind_sel = self.query_one("#events-kind", Select).value
        kind = kind_sel if isinstance(kind_sel, str) else ""
        text = self.query_one("#events-filter", Input).value
        table: DataTable[Any] = self.query_one("#events-table", DataTable)
        set_columns(table, [("n", "#"), ("t", "Time"), ("kind", "Kind"), ("source", "Source"), ("text", "Event")])
        rows = []
        for e in reversed(state.events):
            if not matches(e, kind, text):
                continue
            style = SEVERITY_STYLE.get(e.severity, "")
            cells = [str(e.n), clock(e.t), Text(e.kind, style=style), e.source, Text(e.text, style=style)]
            rows.append((str(e.n), cells))
            if len(rows) >= SHOWN:
                break
        sync_rows(table, rows)
        table.border_subtitle = f"{len(rows)} shown of {len(state.events)}" + (
            f", {state.dropped} dropped in floods" if state.dropped else ""
        )

    def _refilter(self) -> None:
        state = getattr(self, "_state", None)
        if state is not None:
            self.show(state)

    def on_input_changed(self, event: Input.Changed) -> None:
        self._refilter()

    def on_select_changed(self, event: Select.Changed) -> None:
        self._refilter()

    def action_filter(self) -> None:
        self.query_one("#events-filter", Input).focus()
