"""Market protocol: raw quotes from a market source, and the effective market the price watcher publishes.

``mkt.quote`` (``MarketQuotes``) is an external input: what a ``MarketSource`` (the scenario's market
series, or a cloud API adapter) observed at ``at``. The mesh's input feed sends it to the price watcher,
so every observation is journaled and a replay needs no cloud access. ``mkt.update`` (``MarketUpdate``)
is the price watcher's decision: the full effective market (quotes with operator overrides applied) and
the entries that changed, published whenever anything changed.
"""

from __future__ import annotations

import attrs

from coral.kernel import message


@attrs.frozen
class Quote:
    """Price (USD per node-hour) and availability (nodes obtainable) of one node type in one region."""

    region: str
    node: str
    price: float
    availability: int

    @property
    def key(self) -> tuple[str, str]:
        return (self.region, self.node)


@message("mkt.quote")
@attrs.frozen
class MarketQuotes:
    """Observed quotes (an external input); ``full`` means every offered (region, node type) is listed."""

    at: float
    source: str
    quotes: tuple[Quote, ...]
    full: bool = True


@message("mkt.update")
@attrs.frozen
class MarketUpdate:
    """The effective market (every offered entry, sorted) and what changed since the previous update."""

    seq: int
    at: float
    quotes: tuple[Quote, ...]
    changed: tuple[Quote, ...]
    overridden: tuple[str, ...] = ()
    reason: str = "source"

    def prices(self) -> dict[tuple[str, str], float]:
        return {q.key: q.price for q in self.quotes}

    def availability(self) -> dict[tuple[str, str], int]:
        return {q.key: q.availability for q in self.quotes}
