"""The Fleet view: nodes in use per region and node type, and every instance with its stage bar.

The node grid puts regions in rows when every node type fits across the screen, and node types in rows
otherwise; node types and regions are abbreviated (``g6e.12xl``, ``gcp-us-c1``), never cut. The
instance table keeps the columns that fit; Enter shows an instance in full.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable

from tui.model import State, recent_keys
from tui.widgets.bars import (
    abbrev_mode,
    abbrev_node,
    abbrev_region,
    gpu_colour,
    gpu_label,
    legend,
    rate,
    stage_bar,
    stage_summary,
)
from tui.widgets.base import Line, StateView
from tui.widgets.tables import PAD, SCROLLBAR, Col, selected_key, show_table

STATE_STYLE = {
    "serving": "bold green",
    "loading": "yellow",
    "provisioning": "dim yellow",
    "draining": "magenta",
    "stopped": "dim",
    "lost": "bold red",
}
BAR_WIDTH = 20
COLUMNS = (
    Col("id", "Instance", 0),
    Col("dep", "Deployment", 1),
    Col("state", "State", 0),
    Col("mode", "Mode", 3),
    Col("bar", "Stages", 2),
    Col("rps", "req/s", 1),
    Col("region", "Region", 4),
    Col("tpl", "Template", 5),
    Col("nodes", "Layers per GPU type", 6, flex=True, min_width=14),
    Col("model", "Model", 7),
)


class FleetView(StateView):
    """Regions x node types (nodes in use / obtainable), then the instances."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("x", "drain", "Drain instance"),
        Binding("enter", "open", "Show instance"),
    ]

    class DrainRequested(Message):
        """The operator asked to drain the selected instance."""

        def __init__(self, instance: str) -> None:
            super().__init__()
            self.instance = instance

    def compose(self) -> ComposeResult:
        yield Line(id="fleet-legend")
        yield DataTable(id="fleet-matrix", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="fleet-instances", cursor_type="row", zebra_stripes=True)

    def inputs(self, state: State) -> Sequence[object]:
        # of the deployments only their models (each demand or capacity sample makes new deployment views)
        models = tuple((name, d.model) for name, d in state.deployments.items())
        return (state.instances, state.templates, state.market, models, state.gpu_of, recent_keys(state))

    _legend: tuple[tuple[object, ...], Text] | None = None

    def _gpu_legend(self, state: State) -> Text:
        """The legend of the GPU types of the node types and templates (kept while those stay the same)."""
        nodes = state.node_types
        key = (state.templates, state.gpu_of, nodes)
        if self._legend is None or not all(a is b or a == b for a, b in zip(self._legend[0], key, strict=True)):
            gpus = {state.gpu(n) for n in nodes}
            for t in state.templates.values():
                gpus.update(s.gpu for s in t.stages)
            self._legend = (key, legend(sorted(gpus)))
        return self._legend[1]

    def show(self, state: State) -> None:
        head = Text(no_wrap=True, overflow="ellipsis")
        lg = self._gpu_legend(state)
        text = (
            "nodes in use/obtainable" + (" (- : no market yet)" if not state.market else "") + "; bars: layers by GPU "
        )
        if lg.cell_len + len(text) + 2 <= self.room:
            head.append(text, style="dim")
        head.append_text(lg)
        self.query_one("#fleet-legend", Line).set(head)
        self._matrix(state)
        self._instances(state)

    def _cell(self, state: State, used: dict[tuple[str, str], int], r: str, n: str) -> Text:
        u = used.get((r, n), 0)
        q = state.market.get((r, n))
        if q is None:
            return Text(f"{u}/-" if u else "·", style="dim" if not u else "")
        cell = Text(f"{u}/{q.availability}", style="bold red" if q.stockout else ("bold" if u else "dim"))
        if state.recent(q):
            cell.stylize("underline")
        return cell

    def _matrix(self, state: State) -> None:
        table: DataTable[Any] = self.query_one("#fleet-matrix", DataTable)
        nodes, regions = state.node_types, state.regions
        used = state.nodes_in_use()
        labels = {n: abbrev_node(n) for n in nodes}
        region_w = max([len(abbrev_region(r)) for r in regions] + [6]) + PAD
        across = region_w + sum(max(len(labels[n]), 5) + PAD for n in nodes)
        rows: list[tuple[str, list[Any]]] = []
        if across <= self.room - SCROLLBAR:
            cols = [Col("region", "Region", 0), *(Col(n, labels[n], 1) for n in nodes)]
            for r in regions:
                rows.append((r, [abbrev_region(r), *(self._cell(state, used, r, n) for n in nodes)]))
        else:
            cols = [Col("node", "Node type", 0), Col("gpu", "GPU", 2), *(Col(r, abbrev_region(r), 1) for r in regions)]
            # node types in use first, then stocked-out ones, then the rest: what matters shows first
            order = sorted(nodes, key=lambda n: (-sum(used.get((r, n), 0) for r in regions), _stocked(state, n), n))
            for n in order:
                g = state.gpu(n)
                gpu = Text(gpu_label(g), style=gpu_colour(g)) if g != "?" else Text("-", style="dim")
                rows.append((n, [labels[n], gpu, *(self._cell(state, used, r, n) for r in regions)]))
        show_table(table, cols, rows, self.room)

    def _instances(self, state: State) -> None:
        table: DataTable[Any] = self.query_one("#fleet-instances", DataTable)
        rows = []
        order = sorted(state.instances.values(), key=lambda i: (i.region, i.deployment, _num(i.id), i.id))
        for i in order:
            tpl = state.templates.get(i.template_id)
            dep = state.deployments.get(i.deployment)
            model = tpl.model if tpl else (dep.model if dep else "")
            cells = [
                i.id,
                i.deployment,
                Text(i.state, style=STATE_STYLE.get(i.state, "")),
                abbrev_mode(i.mode),
                stage_bar(tpl, i.node_types, state.gpu_of, BAR_WIDTH),
                rate(i.weight),
                abbrev_region(i.region),
                i.template_id[:8],
                stage_summary(tpl, i.node_types, state.gpu_of),
                model,
            ]
            rows.append((i.id, cells))
        show_table(table, COLUMNS, rows, self.room)

    def selected_instance(self) -> str | None:
        return selected_key(self.query_one("#fleet-instances", DataTable))

    def action_drain(self) -> None:
        self.post_message(self.DrainRequested(self.selected_instance() or ""))

    def action_open(self) -> None:
        self.detail("instance", self.selected_instance())

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.data_table.id == "fleet-instances":
            self.detail("instance", event.row_key.value)


def _stocked(state: State, node: str) -> bool:
    """False (sorts first) when ``node`` is out of stock in a region that offers it."""
    return not any(q.stockout for (r, n), q in state.market.items() if n == node)


def _num(instance_id: str) -> int:
    digits = "".join(c for c in instance_id if c.isdigit())
    return int(digits) if digits else 0
