"""The Models view: per deployment, demand against capacity, SLO attainment, cost and templates in use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import DataTable

from tui.model import HISTORY_S, DeploymentView, State
from tui.widgets.bars import abbrev_mode, money, pct, rate, resample, sparkline, stage_bar, stage_summary
from tui.widgets.base import StateView
from tui.widgets.tables import Col, selected_key, show_table


class DeploymentDetail(Widget):
    """The selected deployment: sparklines over the last ``HISTORY_S`` and the templates it runs."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._state: State | None = None
        self._name: str | None = None

    def show(self, state: State, name: str | None) -> None:
        self._state, self._name = state, name
        self.refresh(layout=True)

    def render(self) -> Text:
        st, name = self._state, self._name
        if st is None or name is None or name not in st.deployments:
            return Text("no deployment selected", style="dim")
        return render_detail(st, st.deployments[name], max(20, self.size.width))


def render_detail(st: State, d: DeploymentView, width: int) -> Text:
    out = Text(no_wrap=True, overflow="ellipsis")
    out.append(d.name, style="bold")
    if d.model:
        out.append(f" · {d.model}")
    if d.slo is not None:
        out.append(f" · SLO TTFT {d.slo.ttft_s:g}s TPOT {d.slo.tpot_s:g}s ≥{d.slo.attainment:.0%}")
    if d.override:
        out.append(f" · demand fixed at {d.demand:g} req/s", style="yellow")
    if d.pinned:
        out.append(f" · pinned {d.pinned[:8]}", style="yellow")
    label_w, value_w = 10, 32
    w = max(8, width - label_w - value_w - 1)
    first = d.history[0].t if d.history else st.now
    span = min(HISTORY_S, max(60.0, st.now - first))
    dem = resample(d.history, "demand", st.now, span, w)
    cap = resample(d.history, "capacity", st.now, span, w)
    att = resample(d.history, "attainment", st.now, span, w)
    top = max([v for v in dem + cap if v is not None] or [0.0])
    out.append(f"\n{'demand':<{label_w}}")
    out.append_text(sparkline(dem, top=top, style="cyan"))
    out.append(f" {rate(d.demand)} req/s (est {rate(d.estimate)})" if d.demand_seen else " not seen yet")
    out.append(f"\n{'capacity':<{label_w}}")
    short = d.capacity + 1e-9 < d.demand
    out.append_text(sparkline(cap, top=top, style="red" if short else "green"))
    out.append(f" {rate(d.capacity)} live, {rate(d.planned_capacity)} planned")
    out.append(f"\n{'SLO':<{label_w}}")
    out.append_text(sparkline(att, top=1.0, style="magenta"))
    out.append(f" {pct(d.window_attainment)} now, {pct(d.attainment)} run")
    out.append(f"\n{'':<{label_w}}", style="dim")
    out.append(f"last {span / 60:.3g} min; demand and capacity on one scale, top {rate(top)} req/s", style="dim")
    for tid, count in d.templates:
        tpl = st.templates.get(tid)
        nodes = tpl.nodes if tpl else ()
        out.append(f"\n{count:>3} × ")
        out.append_text(stage_bar(tpl, nodes, st.gpu_of, 20))
        mode = abbrev_mode(tpl.mode) if tpl else "?"
        out.append(f" {tid[:8]} {mode} {stage_summary(tpl, nodes, st.gpu_of)}")
        if tid in st.forbidden:
            out.append(" forbidden", style="red")
    if not d.templates:
        out.append("\nno instances planned", style="dim")
    return out


COLUMNS = (
    Col("dep", "Deployment", 0),
    Col("demand", "Demand", 0),
    Col("cap", "Capacity", 1),
    Col("unmet", "Unmet", 0),
    Col("att", "SLO now", 1),
    Col("run", "SLO run", 4),
    Col("cost", "$/h", 2),
    Col("share", "Share", 5),
    Col("tpl", "Templates", 3),
    Col("model", "Model", 6),
)


class ModelsView(StateView):
    """One row per deployment, and the selected one in detail."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("d", "steer('demand')", "Demand"),
        Binding("o", "steer('slo')", "SLO"),
        Binding("n", "steer('pin')", "Pin"),
    ]

    class SteerDeployment(Message):
        """The operator asked for a steering ``action`` on ``deployment``."""

        def __init__(self, action: str, deployment: str) -> None:
            super().__init__()
            self.action = action
            self.deployment = deployment

    def compose(self) -> ComposeResult:
        yield DataTable(id="models-table", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="model-detail-box"):
            yield DeploymentDetail(id="model-detail")

    def inputs(self, state: State) -> Sequence[object]:
        return (state.deployments, state.templates, state.forbidden, state.gpu_of, state.now)

    def show(self, state: State) -> None:
        table: DataTable[Any] = self.query_one("#models-table", DataTable)
        total = sum(d.cost_per_hour for d in state.deployments.values())
        rows = []
        for name in sorted(state.deployments):
            d = state.deployments[name]
            target = d.slo.attainment if d.slo is not None else 0.9
            demand = Text(rate(d.demand) + ("⚑" if d.override else ""), style="yellow" if d.override else "")
            if not d.demand_seen:
                demand = Text("-", style="dim")
            cap = Text(rate(d.capacity), style="red" if d.capacity + 1e-9 < d.demand else "")
            unmet = Text(rate(d.unmet), style="bold red" if d.unmet > 1e-9 else "dim")
            att = Text(pct(d.window_attainment), style=_att_style(d.window_attainment, target))
            run = Text(pct(d.attainment), style=_att_style(d.attainment, target))
            share = pct(d.cost_per_hour / total) if total > 0 else "-"
            n = sum(c for _, c in d.templates)
            tpl = f"{n} on {len(d.templates)}" + (" pin" if d.pinned else "")
            rows.append((name, [name, demand, cap, unmet, att, run, money(d.cost_per_hour), share, tpl, d.model]))
        show_table(table, COLUMNS, rows, self.room)
        self.query_one(DeploymentDetail).show(state, self.selected())

    def selected(self) -> str | None:
        return selected_key(self.query_one("#models-table", DataTable))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if self.state is not None:
            self.query_one(DeploymentDetail).show(self.state, self.selected())

    def action_steer(self, action: str) -> None:
        self.post_message(self.SteerDeployment(action, self.selected() or ""))


def _att_style(x: float, target: float) -> str:
    if x < 0:
        return "dim"
    return "green" if x >= target else "bold red"
