"""The price watcher, and the market sources it is fed from.

A ``MarketSource`` says what the market looks like at a time and when to look again: ``ScenarioMarket``
reads the scenario's prices, availability and ``[[market]]`` changes; ``HostsMarket`` offers exactly the
machines of a static-hosts cloud; a cloud-API adapter would poll its API in ``quotes`` and return its poll
interval from ``next_poll``. The mesh's input feed polls the source and sends each observation to the
price watcher as ``mkt.quote``, so observations are journaled and a replay needs no cloud.

The price watcher merges the latest quotes with the operator's price and availability overrides and
publishes the effective market (``MarketUpdate``) whenever it changed. Delivery is prompt
(``actors.base``): a quote or an override is applied, and the market published, within ``HOP_S`` of its
arrival, not at the next tick.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from actors.base import TickActor
from coral.catalog.types import Catalog
from coral.kernel import Envelope
from coral.messages.control import PRICE_WATCHER, SetAvailability, SetPrice
from coral.messages.market import MarketQuotes, MarketUpdate, Quote
from coral.messages.mesh import Host
from coral.scenario import Scenario

Key = tuple[str, str]


class MarketSource(Protocol):
    """Where market observations come from."""

    name: str

    def quotes(self, t: float) -> MarketQuotes:
        """The market observed at time ``t``."""
        ...

    def next_poll(self, after: float) -> float | None:
        """The next time after ``after`` worth observing (None: nothing changes any more)."""
        ...


class ScenarioMarket:
    """The scenario's market: catalog prices and availability, with its ``[[market]]`` changes."""

    name = "scenario"

    def __init__(self, scenario: Scenario, catalog: Catalog) -> None:
        self.scenario = scenario
        self.catalog = catalog
        self._changes = sorted({c.at for c in scenario.market})

    def quotes(self, t: float) -> MarketQuotes:
        price, avail = self.scenario.market_at(self.catalog, max(t, 0.0))
        qs = tuple(Quote(r, n, price[(r, n)], avail[(r, n)]) for r, n in sorted(price))
        return MarketQuotes(t, self.name, qs)

    def next_poll(self, after: float) -> float | None:
        return next((c for c in self._changes if c > after), None)


class HostsMarket:
    """A static-hosts cloud's market: the scenario's prices, availability = the hosts of each type."""

    name = "hosts"

    def __init__(self, scenario: Scenario, catalog: Catalog, hosts: Sequence[Host]) -> None:
        self.base = ScenarioMarket(scenario, catalog)
        self.count: dict[Key, int] = {}
        for h in hosts:
            self.count[(h.region, h.node)] = self.count.get((h.region, h.node), 0) + 1

    def quotes(self, t: float) -> MarketQuotes:
        qs = tuple(Quote(q.region, q.node, q.price, self.count.get(q.key, 0)) for q in self.base.quotes(t).quotes)
        return MarketQuotes(t, self.name, qs)

    def next_poll(self, after: float) -> float | None:
        return self.base.next_poll(after)


class PriceWatcher(TickActor):
    """Publishes the effective market (quotes plus operator overrides) when it changes."""

    prompt = True

    def __init__(self, name: str = PRICE_WATCHER, *, tick_s: float) -> None:
        super().__init__(name, tick_s=tick_s)
        self.raw: dict[Key, Quote] = {}
        self.price_override: dict[Key, float] = {}
        self.avail_override: dict[Key, int] = {}
        self.published: dict[Key, Quote] = {}
        self.seq = 0
        self.reasons: set[str] = set()

    async def on_message(self, env: Envelope) -> None:
        msg = env.msg
        if isinstance(msg, MarketQuotes):
            if msg.full:
                self.raw = {q.key: q for q in msg.quotes}
            else:
                self.raw.update((q.key, q) for q in msg.quotes)
            self.reasons.add("source")

    async def command(self, msg: object) -> tuple[str, str] | None:
        if not isinstance(msg, SetPrice | SetAvailability):
            return await super().command(msg)
        key = (msg.region, msg.node)
        if key not in self.raw:
            if not any(r == msg.region for r, _ in self.raw):
                return ("region", f"unknown region {msg.region!r}")
            return ("node", f"no quotes for node type {msg.node!r} in {msg.region} (not among the run's node types)")
        if isinstance(msg, SetPrice):
            if msg.price is None:
                self.price_override.pop(key, None)
            else:
                self.price_override[key] = float(msg.price)
        elif msg.count is None:
            self.avail_override.pop(key, None)
        else:
            self.avail_override[key] = int(msg.count)
        self.reasons.add("operator")
        return None

    def effective(self) -> dict[Key, Quote]:
        """The market the mesh plans with: the latest quotes with the overrides applied."""
        out = {}
        for key, q in sorted(self.raw.items()):
            out[key] = Quote(
                q.region, q.node, self.price_override.get(key, q.price), self.avail_override.get(key, q.availability)
            )
        return out

    async def on_tick(self, now: float) -> None:
        await self.on_wake(now)

    async def on_wake(self, now: float) -> None:
        if not self.reasons:
            return
        eff = self.effective()
        reason = "+".join(sorted(self.reasons))
        self.reasons.clear()
        if eff == self.published:
            return
        changed = tuple(q for k, q in eff.items() if self.published.get(k) != q)
        overridden = tuple(f"{r}/{n}" for r, n in sorted(set(self.price_override) | set(self.avail_override)))
        self.published = eff
        self.seq += 1
        await self.ctx.publish(MarketUpdate(self.seq, now, tuple(eff.values()), changed, overridden, reason))
