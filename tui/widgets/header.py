"""The header that every view shows: first what an operator acts on, then the run's other figures.

Line 1, in order of priority: unmet demand, cost (the latest plan's and the running fleet's, labelled),
the allocator's state (running, or paused with a plan pending), how far the mesh is behind the wall
clock, and the link. Line 2: the clock, the live mesh's speed (``[``/``]``), the run's end, what is down,
why the link is lost, commands awaiting an answer, SLO attainment, instances, goodput, crashes, errors,
spend and the scenario. A line too long for the terminal first shortens its parts, lowest priority first
(line 1's costs to whole dollars last), then closes up the gaps, then leaves out what may go; unmet,
cost, the allocator's state and the link (by name) are never cut, and fit 80 columns whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.reactive import var
from textual.widget import Widget

from tui.model import State
from tui.widgets.bars import clock, money, pct, rate

_LINK_STYLE = {
    "connected": ("● live", "● live", "bold green"),
    "connecting": ("○ connecting", "○ connecting", "yellow"),
    "lost": ("✖ mesh lost", "✖ lost", "bold white on red"),
    "replay": ("▶ replay", "▶ replay", "bold cyan"),
    "replay-ended": ("■ replay ended", "■ ended", "cyan"),
}
BEHIND_S = 5.0
"""The mesh counts as behind the wall clock from this many kernel seconds."""

Pieces = tuple[tuple[str, str], ...]
"""(text, style) pieces of one part of a line."""


Part = tuple[tuple[Pieces, ...], bool]
"""A part of a line: its forms, longest first, and whether it must never be left out."""


def part(*forms: Pieces, keep: bool = False) -> Part:
    """A part of a line from its forms, longest first (module docstring)."""
    return (forms, keep)


def _fit(parts: Sequence[Part], width: int, order: Sequence[int] | None = None) -> Text:
    """Join ``parts`` (highest priority first) to fit ``width`` cells: shorten the parts one form at a time,
    each in turn in ``order`` (default: lowest priority first), and again with their next forms; then close
    up the gaps between them; then leave out the last ones that may go. A part that must stay is never cut."""
    level = [0] * len(parts)
    shown = [True] * len(parts)
    sep = "  "
    turns = list(order) if order is not None else list(reversed(range(len(parts))))

    def size() -> int:
        forms = [parts[i][0][level[i]] for i in range(len(parts)) if shown[i]]
        return 1 + sum(len(t) for f in forms for t, _ in f) + len(sep) * max(0, len(forms) - 1)

    for step in range(1, max(len(p[0]) for p in parts) if parts else 1):
        for i in turns:
            if size() > width and step < len(parts[i][0]):
                level[i] = step
    if size() > width:
        sep = " "
    for i in reversed(range(len(parts))):
        if size() <= width:
            break
        if not parts[i][1]:
            shown[i] = False
    out = Text(" ", no_wrap=True, overflow="ellipsis")
    for n, i in enumerate(i for i in range(len(parts)) if shown[i]):
        if n:
            out.append(sep)
        for text, style in parts[i][0][level[i]]:
            out.append(text, style=style)
    return out


def _dollars(x: float) -> str:
    """Whole dollars from $100 on (the shortest cost form), cents below."""
    return f"${x:,.0f}" if x >= 100 else money(x)


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
    p_short = _dollars(plan) if plan is not None else "-"
    r_short = _dollars(run) if run is not None else "-"
    cost = part(
        (("cost/h ", "dim"), ("plan ", "dim"), (p_txt, "bold"), (" running ", "dim"), (r_txt, "bold")),
        (("$/h ", "dim"), ("plan ", "dim"), (p_txt, "bold"), (" run ", "dim"), (r_txt, "bold")),
        (("$/h ", "dim"), ("plan ", "dim"), (p_short, "bold"), (" run ", "dim"), (r_short, "bold")),
        keep=True,
    )
    if state.plan_pending:
        alloc = part(
            (("allocator ", "dim"), ("PAUSED, plan pending", PAUSED)),
            (("PAUSED, plan pending", PAUSED),),
            (("PAUSED+pending", PAUSED),),
            keep=True,
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
    parts.append(part(((label, style),), ((short, style),), keep=True))
    # the costs' short labels lose nothing, so they shorten first; the allocator's words last
    return _fit(parts, width, order=[1, *range(len(parts) - 1, 2, -1), 2])


def line_two(state: State, width: int) -> Text:
    """The clock, scenario, goodput, SLO, instances, spend and health (module docstring)."""
    parts = [part((("t=", "dim"), (clock(state.now), "")), keep=True)]
    if state.speed > 0 and state.link.state == "connected":  # ``[``/``]`` change it
        x = f"x{state.speed:g}"
        parts.append(part((("speed ", "dim"), (x, "bold")), ((x, "bold"),), keep=True))
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
    """Two lines (module docstring); repainted when setting ``state`` changes them."""

    state: var[State] = var(State, always_update=True)
    _shown: tuple[int, Text] | None = None

    def watch_state(self, state: State) -> None:
        width = self.size.width or 80
        text = render_header(state, width)
        if self._shown is None or self._shown != (width, text):
            self._shown = (width, text)
            self.refresh()

    def render(self) -> Text:
        width = self.size.width or 80
        if self._shown is None or self._shown[0] != width:
            self._shown = (width, render_header(self.state, width))
        return self._shown[1]
