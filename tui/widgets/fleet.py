"""The Fleet view: nodes in use per region and node type, and every instance with its stage bar."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from tui.state import State
from tui.widgets.bars import legend, rate, stage_bar, stage_summary
from tui.widgets.tables import selected_key, set_columns, sync_rows

STATE_STYLE = {
    "serving": "bold green",
    "loading": "yellow",
    "provisioning": "dim yellow",
    "draining": "magenta",
    "stopped": "dim",
    "lost": "bold red",
}
BAR_WIDTH = 24


class FleetView(Vertical):
    """Regions x node types (nodes in use / obtainable), then the instances."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("x", "drain", "Drain instance")]

    class DrainRequested(Message):
        """The operator asked to drain the selected instance."""

        def __init__(self, instance: str) -> None:
            super().__init__()
            self.instance = instance

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-legend")
        yield DataTable(id="fleet-matrix", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="fleet-instances", cursor_type="row", zebra_stripes=True)

    def show(self, state: State) -> None:
        gpus = [state.gpu(n) for n in state.node_types]
        for t in state.templates.values():
            gpus.extend(s.gpu for s in t.stages)
        head = Text(no_wrap=True, overflow="ellipsis")
        head.append("nodes in use / obtainable", style="dim")
        if not state.market:
            head.append(" (- : no market update seen yet)", style="yellow")
        head.append(" per region; stage bars: layers by GPU   ", style="dim")
        head.append_text(legend(gpus))
        self.query_one("#fleet-legend", Static).update(head)
        self._matrix(state)
        self._instances(state)

    def _matrix(self, state: State) -> None:
        table: DataTable[Any] = self.query_one("#fleet-matrix", DataTable)
        nodes = state.node_types
        set_columns(table, [("region", "Region"), *((n, n) for n in nodes)])
        used = state.nodes_in_use()
        rows = []
        for r in state.regions:
            cells: list[Any] = [r]
            for n in nodes:
                u = used.get((r, n), 0)
                q = state.market.get((r, n))
                if q is None:
                    cells.append(Text(f"{u}/-" if u else "·", style="dim" if not u else ""))
                    continue
                style = "bold red" if q.stockout else ("bold" if u else "dim")
                cell = Text(f"{u}/{q.availability}", style=style)
                if state.recent(q):
                    cell.stylize("underline")
                cells.append(cell)
            rows.append((r, cells))
        sync_rows(table, rows)

    def _instances(self, state: State) -> None:
        table: DataTable[Any] = self.query_one("#fleet-instances", DataTable)
        set_columns(
            table,
            [
                ("id", "Instance"),
                ("dep", "Deployment"),
                ("state", "State"),
                ("bar", "Stages (layers by GPU)"),
                ("region", "Region"),
                ("nodes", "Layers per GPU type"),
                ("rps", "req/s"),
                ("tpl", "Template"),
                ("model", "Model"),
            ],
        )
        rows = []
        order = sorted(state.instances.values(), key=lambda i: (i.region, i.deployment, _num(i.id), i.id))
        for i in order:
            tpl = state.templates.get(i.template_id)
            dep = state.deployments.get(i.deployment)
            model = tpl.model if tpl else (dep.model if dep else "")
            st = i.state + ("" if i.mode == "aggregated" else f"·{i.mode[0].upper()}")
            rows.append(
                (
                    i.id,
                    [
                        i.id,
                        i.deployment,
                        Text(st, style=STATE_STYLE.get(i.state, "")),
                        stage_bar(tpl, i.node_types, state.gpu_of, BAR_WIDTH),
                        i.region,
                        stage_summary(tpl, i.node_types, state.gpu_of),
                        rate(i.weight),
                        i.template_id[:8],
                        model,
                    ],
                )
            )
        sync_rows(table, rows)

    def selected_instance(self) -> str | None:
        return selected_key(self.query_one("#fleet-instances", DataTable))

    def action_drain(self) -> None:
        inst = self.selected_instance()
        self.post_message(self.DrainRequested(inst or ""))


def _num(instance_id: str) -> int:
    digits = "".join(c for c in instance_id if c.isdigit())
    return int(digits) if digits else 0
