"""The header that every view shows: cost, goodput, SLO attainment, instances and the mesh's health."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.state import State
from tui.widgets.bars import clock, money, pct, rate

_LINK_STYLE = {
    "connected": ("● live", "bold green"),
    "connecting": ("○ connecting", "yellow"),
    "lost": ("✖ mesh lost", "bold white on red"),
    "replay": ("▶ replay", "bold cyan"),
    "replay-ended": ("■ replay ended", "cyan"),
}


class StatusHeader(Static):
    """Two lines: the run and its health, then the fleet's numbers. Cut lines end in an ellipsis."""

    def show(self, state: State) -> None:
        self.update(render_header(state))


def render_header(state: State) -> Text:
    label, style = _LINK_STYLE.get(state.link.state, (state.link.state, "bold"))
    top = Text(no_wrap=True, overflow="ellipsis")
    top.append(" CORAL ", style="bold reverse")
    top.append(" ")
    top.append(label, style=style)
    if state.link.state.startswith("replay"):
        top.append(f" {state.link.detail} (read-only)", style="cyan")
    if state.ended:
        top.append(f"  run ended: {state.ended}", style="bold yellow")
    top.append(f"  t={clock(state.now)}")
    if state.scenario:
        top.append(f"  {state.scenario}/{state.policy}", style="dim")
    health = []
    if state.down:
        health.append((f"down: {', '.join(sorted(state.down))}", "bold red"))
    if state.crashes:
        health.append((f"crashes {state.crashes}", "red"))
    if state.errors:
        health.append((f"errors {state.errors}", "yellow"))
    if state.paused:
        health.append(("allocator PAUSED", "bold black on yellow"))
    for text, st in health:
        top.append("  ")
        top.append(text, style=st)
    if state.link.state == "lost":
        top.append(f"  {state.link.detail}", style="red")
    bottom = Text(no_wrap=True, overflow="ellipsis")
    bottom.append(" cost ", style="dim")
    bottom.append(f"{money(state.cost_per_hour)}/h", style="bold")
    bottom.append("  goodput ", style="dim")
    bottom.append(f"{rate(state.goodput)} req/s", style="bold")
    bottom.append("  SLO ", style="dim")
    att_style = "bold" if state.attainment < 0 else ("bold green" if state.attainment >= 0.9 else "bold red")
    bottom.append(pct(state.attainment), style=att_style)
    bottom.append("  instances ", style="dim")
    bottom.append(str(state.live_instances), style="bold")
    if state.pending_starts:
        bottom.append(f" (+{state.pending_starts} waiting)", style="yellow")
    unmet = sum(d.unmet for d in state.deployments.values())
    if unmet > 1e-9:
        bottom.append(f"  unmet {rate(unmet)} req/s", style="bold red")
    bottom.append("  spent ", style="dim")
    bottom.append(money(state.spent))
    top.append("\n")
    return top + bottom
