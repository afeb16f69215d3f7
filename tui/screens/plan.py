"""One plan, whole: its instances with their stage bars, capacity against demand, and its diff."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Static

from coral.display import gap_text
from tui.model import PlanView, State
from tui.widgets.bars import abbrev_mode, abbrev_region, clock, money, rate, stage_bar, stage_summary
from tui.widgets.tables import Col, selected_key, show_table

INSTANCE_COLUMNS = (
    Col("dep", "Deployment", 0),
    Col("region", "Region", 1),
    Col("count", "Count", 0),
    Col("mode", "Mode", 0),
    Col("bar", "Stages", 3),
    Col("tpl", "Template", 1),
    Col("cost", "$/h each", 2),
    Col("rps", "req/s each", 2),
    Col("nodes", "Layers per GPU type", 4, flex=True, min_width=12),
)


SERVING_COLUMNS = (Col("dep", "Deployment", 0), Col("demand", "Demand", 0), Col("cap", "Cap", 0),
                   Col("unmet", "Unmet", 0))  # fmt: skip
DIFF_COLUMNS = (Col("delta", "Change", 0), Col("dep", "Deployment", 0), Col("tpl", "Template", 1),
                Col("region", "Region", 2))  # fmt: skip


class PlanScreen(ModalScreen[None]):
    """Shows a plan; on an instance row, ``f`` forbids its template and ``n`` pins it for its deployment."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "close", "Close"),
        Binding("f", "template('forbid')", "Forbid template"),
        Binding("n", "template('pin')", "Pin template"),
    ]

    class TemplateAction(Message):
        """The operator asked to forbid or pin a template of this plan."""

        def __init__(self, action: str, template_id: str, deployment: str) -> None:
            super().__init__()
            self.action = action
            self.template_id = template_id
            self.deployment = deployment

    def __init__(self, state: State, plan: PlanView) -> None:
        super().__init__()
        self.state = state
        self.plan = plan
        self._rows: dict[str, tuple[str, str]] = {}

    def compose(self) -> ComposeResult:
        p = self.plan
        yield Footer(compact=True, show_command_palette=False)
        with Vertical(id="plan-box", classes="dialog"):
            head = Text(no_wrap=True, overflow="ellipsis")
            head.append(f"Plan #{p.seq}", style="bold")
            head.append(f" at {clock(p.at)} · {p.policy} · trigger {p.trigger} · {p.status}")
            head.append(f" gap {gap_text(p.gap)}" if p.gap > 0 else "")
            head.append(f" · solved in {p.solve_s * 1000:.0f} ms")
            yield Static(head, classes="dialog-title plan-title")
            cost = Text(no_wrap=True, overflow="ellipsis")
            cost.append(f"{money(p.cost_per_hour)}/h", style="bold")
            cost.append(f" (churn {money(p.churn_cost)}) · demand {rate(p.demand)} req/s · ")
            cost.append(f"unmet {rate(p.unmet)} req/s", style="bold red" if p.unmet > 1e-9 else "")
            cost.append(f" · diff +{p.starts} -{p.stops}")
            yield Static(cost)
            yield DataTable(id="plan-instances", cursor_type="row", zebra_stripes=True)
            with Horizontal(id="plan-lower"):
                yield DataTable(id="plan-serving", cursor_type="row", zebra_stripes=True)
                yield DataTable(id="plan-diff", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        st, p = self.state, self.plan
        inst: DataTable[Any] = self.query_one("#plan-instances", DataTable)
        rows = []
        for i, r in enumerate(p.instances):
            tpl = st.templates.get(r.template_id)
            key = str(i)
            self._rows[key] = (r.template_id, r.deployment)
            rows.append((key, [
                r.deployment, abbrev_region(r.region), str(r.count), abbrev_mode(r.mode),
                stage_bar(tpl, r.nodes, st.gpu_of, 16), r.template_id[:8], money(r.cost_per_hour),
                rate(r.capacity_rps), stage_summary(tpl, r.nodes, st.gpu_of),
            ]))  # fmt: skip
        show_table(inst, INSTANCE_COLUMNS, rows, self.app.size.width - 4)
        inst.border_title = f"{sum(r.count for r in p.instances)} instances in {len(p.instances)} rows"
        half = max(30, (self.app.size.width - 4) // 2)
        serving: DataTable[Any] = self.query_one("#plan-serving", DataTable)
        srows = []
        for s in p.serving:
            unmet = Text(rate(s.unmet), style="bold red" if s.unmet > 1e-9 else "dim")
            srows.append((s.deployment, [s.deployment, rate(s.demand), rate(s.capacity), unmet]))
        show_table(serving, SERVING_COLUMNS, srows, half)
        serving.border_title = "req/s: demand, capacity"
        diff: DataTable[Any] = self.query_one("#plan-diff", DataTable)
        drows = []
        for n, c in enumerate(p.diff):
            ch = Text(f"{c.delta:+d}", style="green" if c.delta > 0 else "red")
            drows.append((str(n), [ch, c.deployment, c.template_id[:8], abbrev_region(c.region)]))
        show_table(diff, DIFF_COLUMNS, drows, half)
        diff.border_title = f"diff: {len(p.diff)} changes"
        self.set_focus(inst)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "template":
            return not getattr(getattr(self.app, "source", None), "read_only", True)
        return True

    def action_close(self) -> None:
        self.dismiss(None)

    def action_template(self, action: str) -> None:
        key = selected_key(self.query_one("#plan-instances", DataTable))
        tid, dep = self._rows.get(key or "", ("", ""))
        self.post_message(self.TemplateAction(action, tid, dep))
