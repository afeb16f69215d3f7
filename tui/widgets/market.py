"""The Market view: price and availability per region and node type; changes and stockouts stand out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable

from tui.model import RECENT_S, QuoteView, State, recent_keys
from tui.widgets.bars import abbrev_node, abbrev_region, gpu_colour, gpu_label
from tui.widgets.base import Line, StateView
from tui.widgets.tables import Col, selected_key, show_table

COLUMNS = (
    Col("region", "Region", 0),
    Col("node", "Node type", 0),
    Col("gpu", "GPU", 2),
    Col("price", "$/node-h", 0),
    Col("avail", "Avail", 0),
    Col("used", "In use", 1),
    Col("note", "Change / note", 3, flex=True, min_width=10),
)


class MarketView(StateView):
    """Every offered (region, node type) with its price, availability and the nodes the fleet holds."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "steer('availability')", "Availability"),
        Binding("dollar_sign", "steer('price')", "Price", key_display="$"),
    ]

    class SteerEntry(Message):
        """The operator asked for a steering ``action`` on the (region, node type) entry."""

        def __init__(self, action: str, region: str, node: str) -> None:
            super().__init__()
            self.action = action
            self.region = region
            self.node = node

    def compose(self) -> ComposeResult:
        yield Line(id="market-summary")
        yield DataTable(id="market-table", cursor_type="row", zebra_stripes=True)

    def inputs(self, state: State) -> Sequence[object]:
        return (state.market, state.market_seq, state.instances, recent_keys(state))

    def show(self, state: State) -> None:
        self._keys: dict[str, tuple[str, str]] = {}
        table: DataTable[Any] = self.query_one("#market-table", DataTable)
        used = state.nodes_in_use()
        rows = []
        stockouts = recent = overridden = 0
        for key in sorted(state.market):
            q = state.market[key]
            k = f"{q.region}/{q.node}"
            self._keys[k] = key
            is_recent = state.recent(q)
            stockouts += q.stockout
            recent += is_recent
            overridden += q.overridden
            rows.append((k, _row(q, used.get(key, 0), is_recent)))
        show_table(table, COLUMNS, rows, self.room)
        self.query_one("#market-summary", Line).set(market_summary(state, stockouts, recent, overridden, self.room))

    def selected(self) -> tuple[str, str]:
        k = selected_key(self.query_one("#market-table", DataTable))
        return getattr(self, "_keys", {}).get(k or "", ("", ""))

    def action_steer(self, action: str) -> None:
        region, node = self.selected()
        self.post_message(self.SteerEntry(action, region, node))


def market_summary(state: State, stockouts: int, recent: int, overridden: int, width: int) -> Text:
    """The line above the table, in its long form when it fits ``width`` cells (less the padding), else
    the short one; a short form still too long wraps onto a second line, so nothing is cut."""
    if not state.market:
        note = "no market update seen yet: the price watcher publishes when a price or availability changes"
        return Text(note, style="yellow")
    plural = "" if stockouts == 1 else "s"
    parts = [
        (f"{len(state.market)} offers", f"{len(state.market)} offers", ""),
        (f"{stockouts} stockout{plural}", f"{stockouts} stockout{plural}", "bold red" if stockouts else "dim"),
        (f"{recent} changed in the last {RECENT_S:g}s", f"{recent} changed <{RECENT_S:g}s",
         "bold yellow" if recent else "dim"),
        (f"{overridden} set by an operator (⚑)", f"{overridden} ⚑ operator", "cyan" if overridden else "dim"),
    ]  # fmt: skip
    if state.market_seq:
        parts.append((f"update #{state.market_seq}", f"upd #{state.market_seq}", "dim"))
    long = sum(len(p[0]) for p in parts) + 2 * (len(parts) - 1)
    form = 0 if long <= width - 2 else 1
    out = Text()
    for i, p in enumerate(parts):
        out.append(("  " if i else "") + p[form], style=p[2])
    return out


def _row(q: QuoteView, used: int, recent: bool) -> list[Any]:
    hl = "bold yellow" if recent else ""
    price = Text(f"{q.price:,.3f}", style=hl if q.prev_price is not None and q.prev_price != q.price and recent else "")
    avail = Text(str(q.availability))
    if q.stockout:
        avail = Text("0 STOCKOUT", style="bold white on red")
    elif recent and q.prev_availability is not None and q.prev_availability != q.availability:
        avail.stylize(hl)
    note = Text()
    if recent:
        if q.prev_price is not None and q.prev_price != q.price:
            note.append(f"{'▲' if q.price > q.prev_price else '▼'} ${q.prev_price:,.3f}→{q.price:,.3f} ", style=hl)
        if q.prev_availability is not None and q.prev_availability != q.availability:
            arrow = "▲" if q.availability > q.prev_availability else "▼"
            note.append(f"{arrow} {q.prev_availability}→{q.availability} ", style=hl)
        if not note:
            note.append("new ", style=hl)
    if q.overridden:
        note.append("⚑ operator", style="cyan")
    gpu = Text(gpu_label(q.gpu), style=gpu_colour(q.gpu))
    in_use = Text(str(used), style="bold" if used else "dim")
    if used > q.availability:
        in_use.stylize("red")
    return [abbrev_region(q.region), abbrev_node(q.node), gpu, price, avail, in_use, note]
