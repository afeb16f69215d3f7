"""The header that every view shows: first what an operator acts on, then the run's other figures.

Line 1, in order of priority: unmet demand, cost (the latest plan's and the running fleet's, labelled),
the allocator's state (running, or paused with a plan pending), how far the mesh is behind the wall
clock, and the link. Line 2: the clock, the run's end, what is down, why the link is lost, commands
awaiting an answer, SLO attainment, instances, goodput, crashes, errors, spend and the scenario. A line
too long for the terminal first shortens its lowest-priority parts, then leaves them out (the link last of
line 1's, as a symbol); unmet, cost and the allocator's state are never cut.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from tui.model import State
from tui.widgets.bars import clock, money, pct, rate

_LINK_STYLE = {
    "connected": ("● live", "●", "bold green"),
    "connecting": ("○ connecting", "○", "yellow"),
    "lost": ("✖ mesh lost", "✖ lost", "bold white on red"),
    "replay": ("▶ replay", "▶", "bold cyan"),
    "replay-ended": ("■ replay ended", "■", "cyan"),
}
BEHIND_S = 5.0
"""The mesh counts as behind the wall clock from this many kernel seconds."""

Pieces = tuple[tuple[str, str], ...]
"""(text, style) pieces of one part of a line."""


def part(long: Pieces, short: Pieces | None = None, *, keep: bool = False) -> tuple[Pieces, Pieces, bool]:
    """A part of a line: its long form, a shorter one, and whether it must never be left out."""
    return (long, short if short is not None else long, keep)


def _fit(parts: Sequence[tuple[Pieces, Pieces, bool]], width: int, sep: str = "  ") -> Text:
    """Join ``parts`` (highest priority first), shortening from the last one, then leaving out the last
    ones that may go, until the line fits ``width``."""
    forms: list[Pieces | None] = [long for long, _, _ in parts]

    def size() -> int:
        shown = [f for f in forms if f is not None]
        return 1 + sum(len(t) for f in shown for t, _ in f) + len(sep) * max(0, len(shown) - 1)

    for i in reversed(range(len(parts))):
        if size() <= width:
            break
        forms[i] = parts[i][1]
    for i in reversed(range(len(parts))):
        if size() <= width:
            break
        if not parts[i][2]:
            forms[i] = None
    out = Text(" ", no_wrap=True, overflow="ellipsis")
    for n, f in enumerate(x for x in forms if x is not None):
        if n:
            out.append(sep)
        for text, style in f:
            out.append(text, style=style)
    return out


PAUSED = "bold black on yellow"


def line_one(state: State, width: int) -> Text:
    """Unmet demand, cost, allocator state, lag, link (module docstring)."""
    unmet = state.unmet
    if not state.plans:
        u = part((("unmet ", "dim"), ("-", "bold")), keep=True)
    elif unmet > 1e-9:
        u = part((("unmet ", "bold red"), (f"{rate(unmet)} req/s", "bold white on red")), keep=True)
    else:
        u = part((("unmet ", "dim"), ("0", "bold green")), keep=True)
    plan, run = state.planned_cost, state.fleet_cost
    p_txt = money(plan) if plan is not None else "-"
    r_txt = money(run) if run is not None else "-"
    cost = part(
        (("cost/h ", "dim"), ("plan ", "dim"), (p_txt, "bold"), (" running ", "dim"), (r_txt, "bold")),
        (("$/h ", "dim"), ("plan ", "dim"), (p_txt, "bold"), (" run ", "dim"), (r_txt, "bold")),
        keep=True,
    )
    if state.plan_pending:
        alloc = part(
            (("allocator ", "dim"), ("PAUSED, plan pending", PAUSED)), (("PAUSED+pending", PAUSED),), keep=True
        )
    elif state.paused:
        alloc = part((("allocator ", "dim"), ("PAUSED", PAUSED)), (("PAUSED", PAUSED),), keep=True)
    else:
        alloc = part((("allocator ", "dim"), ("on", "green")), (("alloc on", "green"),), keep=True)
    parts = [u, cost, alloc]
    if state.behind_s >= BEHIND_S and state.link.state == "connected":
        lag = state.behind_s
        parts.append(part(((f"{lag:,.0f} s behind", "bold yellow"),), ((f"lag {lag:,.0f}s", "bold yellow"),)))
    label, short, style = _LINK_STYLE.get(state.link.state, (state.link.state, state.link.state[:1], "bold"))
    parts.append(part(((label, style),), ((short, style),)))
    return _fit(parts, width)


def line_two(state: State, width: int) -> Text:
    """The clock, scenario, goodput, SLO, instances, spend and health (module docstring)."""
    parts = [part((("t=", "dim"), (clock(state.now), "")), keep=True)]
    if state.link.state.startswith("replay"):
        parts.append(part(((f"{state.link.detail} read-only", "cyan"),), (("read-only", "cyan"),), keep=True))
    if state.ended:
        parts.append(part(((f"ended: {state.ended}", "bold yellow"),), (("ended", "bold yellow"),), keep=True))
    if state.down:
        parts.append(part(((f"down: {', '.join(sorted(state.down))}", "bold red"),), (("down!", "bold red"),)))
    if state.link.state == "lost" and state.link.detail:
        parts.append(part(((state.link.detail, "red"),)))
    if state.waiting_commands:
        k = state.waiting_commands
        parts.append(part(((f"{k} sent, awaiting answer", "yellow"),), ((f"{k} cmd waiting", "yellow"),)))
    att_style = "bold" if state.attainment < 0 else ("bold green" if state.attainment >= 0.9 else "bold red")
    parts.append(part((("SLO ", "dim"), (pct(state.attainment), att_style))))
    inst = str(state.live_instances) + (f" (+{state.pending_starts} waiting)" if state.pending_starts else "")
    inst_s = str(state.live_instances) + (f"+{state.pending_starts}w" if state.pending_starts else "")
    parts.append(part((("instances ", "dim"), (inst, "bold")), (("inst ", "dim"), (inst_s, "bold"))))
    gp = rate(state.goodput)
    parts.append(part((("goodput ", "dim"), (f"{gp} req/s", "bold")), (("gp ", "dim"), (gp, "bold"))))
    if state.crashes:
        parts.append(part(((f"crashes {state.crashes}", "red"),)))
    if state.errors:
        parts.append(part(((f"errors {state.errors}", "yellow"),)))
    parts.append(part((("spent ", "dim"), (money(state.spent), ""))))
    if state.scenario:
        parts.append(part(((f"{state.scenario}/{state.policy}" if state.policy else state.scenario, "dim"),)))
    return _fit(parts, width)


def render_header(state: State, width: int = 200) -> Text:
    """Both lines for a terminal ``width`` cells wide."""
    return line_one(state, width) + Text("\n") + line_two(state, width)


class StatusHeader(Widget):
    """Two lines (module docstring); redrawn whenever ``state`` is set."""

    state: reactive[State] = reactive(State, always_update=True, layout=False)

    def render(self) -> Text:
        return render_header(self.state, self.size.width or 80)
