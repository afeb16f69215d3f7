"""The Plans view: the history of plans (newest first); Enter opens the one under the cursor whole.

The cursor follows the newest plan unless the operator moved it down, so Enter right after a plan
arrives opens that plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable

from coral.display import gap_text
from tui.model import State
from tui.widgets.bars import clock, money, rate
from tui.widgets.base import Line, StateView
from tui.widgets.tables import Col, selected_key, show_table

COLUMNS = (
    Col("seq", "Plan", 0),
    Col("t", "Time", 1),
    Col("trigger", "Trigger", 5, flex=True, min_width=10),
    Col("solve", "Solve", 6),
    Col("status", "Status", 3),
    Col("gap", "Gap", 7),
    Col("cost", "$/h", 0),
    Col("diff", "Diff", 2),
    Col("unmet", "Unmet", 0),
)


class PlansView(StateView):
    """Time, trigger, solve time, status and gap, cost, and the diff of every plan."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "open", "Show plan")]

    def compose(self) -> ComposeResult:
        yield Line(id="plans-summary")
        yield DataTable(id="plans-table", cursor_type="row", zebra_stripes=True)

    def inputs(self, state: State) -> Sequence[object]:
        return (state.plans, state.plan_pending)

    def show(self, state: State) -> None:
        table: DataTable[Any] = self.query_one("#plans-table", DataTable)
        rows = []
        for p in reversed(state.plans):
            status = Text(p.status, style="green" if p.status == "optimal" else "yellow")
            diff = Text()
            diff.append(f"+{p.starts}", style="green" if p.starts else "dim")
            diff.append(" ")
            diff.append(f"-{p.stops}", style="red" if p.stops else "dim")
            unmet = Text(rate(p.unmet), style="bold red" if p.unmet > 1e-9 else "dim")
            cells = [f"#{p.seq}", clock(p.at), p.trigger, f"{p.solve_s * 1000:.0f} ms", status, gap_text(p.gap)]
            rows.append((str(p.n), [*cells, money(p.cost_per_hour), diff, unmet]))
        show_table(table, COLUMNS, rows, self.room, follow=True)
        s = Text(no_wrap=True, overflow="ellipsis")
        s.append(f"{len(state.plans)} plans", style="bold")
        if not state.plans:
            s.append("  none yet: the allocator publishes at its next re-plan (r: re-plan now)", style="yellow")
        else:
            last = state.plans[-1]
            s.append(f"  latest #{last.seq} {clock(last.at)} {money(last.cost_per_hour)}/h {last.trigger}")
        if state.plan_pending:
            s.append("  allocator paused: a plan is pending", style="bold yellow")
        self.query_one("#plans-summary", Line).set(s)

    def action_open(self) -> None:
        self.detail("plan", selected_key(self.query_one("#plans-table", DataTable)))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.detail("plan", event.row_key.value)
