"""The Plans view: the history of plans (newest first); Enter opens one whole."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from tui.state import State
from tui.widgets.bars import clock, gap_text, money, rate
from tui.widgets.tables import selected_key, set_columns, sync_rows


class PlansView(Vertical):
    """Time, trigger, solve time, status and gap, cost, and the diff of every plan."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "open", "Show plan")]

    class PlanChosen(Message):
        """The operator asked to see plan ``n`` (``PlanView.n``) whole."""

        def __init__(self, n: int) -> None:
            super().__init__()
            self.n = n

    def compose(self) -> ComposeResult:
        yield Static(id="plans-summary")
        yield DataTable(id="plans-table", cursor_type="row", zebra_stripes=True)

    def show(self, state: State) -> None:
        table: DataTable[Any] = self.query_one("#plans-table", DataTable)
        set_columns(
            table,
            [
                ("seq", "Plan"),
                ("t", "Time"),
                ("trigger", "Trigger"),
                ("solve", "Solve"),
                ("status", "Status"),
                ("gap", "Gap"),
                ("cost", "$/h"),
                ("diff", "Diff"),
                ("unmet", "Unmet"),
            ],
        )
        rows = []
        for p in reversed(state.plans):
            status = Text(p.status, style="green" if p.status == "optimal" else "yellow")
            diff = Text()
            diff.append(f"+{p.starts}", style="green" if p.starts else "dim")
            diff.append(" ")
            diff.append(f"-{p.stops}", style="red" if p.stops else "dim")
            unmet = Text(rate(p.unmet), style="bold red" if p.unmet > 1e-9 else "dim")
            gap = gap_text(p.gap)
            cells = [f"#{p.seq}", clock(p.at), p.trigger, f"{p.solve_s * 1000:.0f} ms", status, gap]
            rows.append((str(p.n), [*cells, money(p.cost_per_hour), diff, unmet]))
        sync_rows(table, rows)
        s = Text(no_wrap=True, overflow="ellipsis")
        s.append(f"{len(state.plans)} plans", style="bold")
        if not state.plans:
            s.append("  none seen yet: the allocator publishes at its next re-plan (r: re-plan now)", style="yellow")
        if state.plans:
            last = state.plans[-1]
            s.append(f"  latest #{last.seq} at {clock(last.at)}: {money(last.cost_per_hour)}/h, {last.trigger}")
        s.append("   Enter: show plan", style="dim")
        self.query_one("#plans-summary", Static).update(s)

    def action_open(self) -> None:
        key = selected_key(self.query_one("#plans-table", DataTable))
        if key is not None:
            self.post_message(self.PlanChosen(int(key)))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.PlanChosen(int(event.row_key.value)))
