"""External inputs of a run: what the world sends into the mesh, from a scenario or from a journal.

An ``Input`` is one message with its kernel time, sender and destination. ``ScenarioFeed`` produces a
scenario's inputs: the market source's observations (``mkt.quote``, at the start and whenever the source
says to look again), seeded arrivals (``req.arrivals``: one batch per tick, sent ``lookahead_ticks``
ahead of its window), the scenario's fault events (``fleet.fault``) and the end of traffic
(``req.finish``, ``drain_s`` after the scenario's end). ``JournalFeed`` replays the inputs a journal
recorded. The mesh driver delivers each input at its time, after every actor went idle.

Arrivals (``Traffic``) follow the simulator's models: per deployment, Poisson arrivals over its demand
series with log-normal lengths around its shape, or its trace; one seeded generator per deployment.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import attrs

from actors.price import MarketSource, ScenarioMarket
from coral.catalog.types import Catalog
from coral.messages.control import PRICE_WATCHER, ROUTER, SUPERVISOR
from coral.messages.fleet import FaultInjected
from coral.messages.mesh import MeshTiming
from coral.messages.requests import ArrivalBatch, FinishTraffic, RequestSpec
from coral.scenario import Scenario
from coral.sim.arrivals import deployment_arrivals
from coral.sim.engine import SimConfig

MARKET_SOURCE = "feed.market"
TRAFFIC_SOURCE = "feed.traffic"
FAULT_SOURCE = "feed.faults"


@attrs.frozen
class Input:
    """One external input: ``msg`` from ``source`` to ``dest`` (None: published) at kernel time ``at``."""

    at: float
    source: str
    dest: str | None
    msg: object


class Traffic:
    """Seeded arrivals for a scenario's deployments (see the module docstring)."""

    def __init__(self, scenario: Scenario, *, seed: int, end_s: float, config: SimConfig | None = None) -> None:
        cfg = config or SimConfig()
        sources = deployment_arrivals(
            scenario, seed=seed, end_s=end_s, length_dist=cfg.length_dist, cv_in=cfg.cv_in, cv_out=cfg.cv_out
        )
        its = [_tagged(src, i) for i, src in enumerate(sources.values())]
        self.names = [d.name for d in scenario.deployments]
        self._merged = heapq.merge(*its)
        self._next: tuple[float, int, int, int] | None = next(self._merged, None)
        self._id = 0

    def take(self, start: float, end: float) -> tuple[RequestSpec, ...]:
        """The arrivals in ``[start, end)``; call with increasing, adjacent windows."""
        out = []
        while self._next is not None and self._next[0] < end:
            t, i, p, o = self._next
            if t >= start:
                self._id += 1
                out.append(RequestSpec(self._id, self.names[i], t, int(p), max(int(o), 1)))
            self._next = next(self._merged, None)
        return tuple(out)


def _tagged(src: Iterable[tuple[float, int, int]], i: int) -> Iterator[tuple[float, int, int, int]]:
    for t, p, o in src:
        yield t, i, p, o


class Feed(Protocol):
    """Inputs in time order: ``next_at()`` and ``take(t)`` (everything due at or before ``t``)."""

    def next_at(self) -> float | None: ...

    def take(self, t: float) -> list[Input]: ...


class ScenarioFeed:
    """A scenario's inputs from ``start`` (negative: a warm-up before traffic) to ``end`` + drain."""

    def __init__(
        self,
        scenario: Scenario,
        catalog: Catalog,
        *,
        seed: int,
        timing: MeshTiming,
        start: float,
        end: float,
        market: MarketSource | None = None,
        faults: bool = True,
    ) -> None:
        self.timing = timing
        self.end = end
        self.market = market or ScenarioMarket(scenario, catalog)
        self.traffic = Traffic(scenario, seed=seed, end_s=end)
        self.market_at: float | None = start
        self.faults = sorted((e for e in scenario.events if e.at < end), key=lambda e: e.at) if faults else []
        self.tick_at = start
        self.finish_at = end + timing.drain_s
        self.finished = False

    def _arrival_window(self, k_at: float) -> tuple[float, float]:
        lead = self.timing.lookahead_ticks * self.timing.tick_s
        return (max(k_at + lead, 0.0), min(k_at + lead + self.timing.tick_s, self.end))

    def next_at(self) -> float | None:
        cands = [self.finish_at] if not self.finished else []
        if self.market_at is not None:
            cands.append(self.market_at)
        if self.faults:
            cands.append(self.faults[0].at)
        if self.tick_at + self.timing.lookahead_ticks * self.timing.tick_s < self.end:
            cands.append(self.tick_at)
        return min(cands) if cands else None

    def take(self, t: float) -> list[Input]:
        out: list[Input] = []
        while self.market_at is not None and self.market_at <= t:
            at = self.market_at
            out.append(Input(at, MARKET_SOURCE, PRICE_WATCHER, self.market.quotes(at)))
            self.market_at = self.market.next_poll(at)
            if self.market_at is not None and self.market_at >= self.end:
                self.market_at = None
        while self.faults and self.faults[0].at <= t:
            e = self.faults.pop(0)
            out.append(Input(e.at, FAULT_SOURCE, SUPERVISOR, FaultInjected(e.at, e.kind, e.region, e.node, e.count)))
        tick = self.timing.tick_s
        while self.tick_at <= t and self.tick_at + self.timing.lookahead_ticks * tick < self.end:
            lo, hi = self._arrival_window(self.tick_at)
            if hi > lo:
                reqs = self.traffic.take(lo, hi)
                if reqs:
                    out.append(Input(self.tick_at, TRAFFIC_SOURCE, ROUTER, ArrivalBatch(lo, hi, reqs)))
            self.tick_at += tick
        if not self.finished and self.finish_at <= t:
            self.finished = True
            out.append(Input(self.finish_at, TRAFFIC_SOURCE, ROUTER, FinishTraffic(self.finish_at)))
        out.sort(key=lambda i: i.at)  # stable: same-time inputs keep market, faults, traffic order
        return out


class ListFeed:
    """Inputs given as a list (a journal's, or a test's), delivered in list order."""

    def __init__(self, inputs: Sequence[Input]) -> None:
        self.inputs = list(inputs)
        for a, b in zip(self.inputs, self.inputs[1:], strict=False):
            if b.at < a.at:
                raise ValueError(f"inputs: out of time order ({b.at} after {a.at})")
        self.i = 0

    def next_at(self) -> float | None:
        return self.inputs[self.i].at if self.i < len(self.inputs) else None

    def take(self, t: float) -> list[Input]:
        j = self.i
        while j < len(self.inputs) and self.inputs[j].at <= t:
            j += 1
        out, self.i = self.inputs[self.i : j], j
        return out


class MergedFeed:
    """Several feeds as one (ties: in the order the feeds are given)."""

    def __init__(self, *feeds: Feed) -> None:
        self.feeds = feeds

    def next_at(self) -> float | None:
        ts = [t for f in self.feeds if (t := f.next_at()) is not None]
        return min(ts) if ts else None

    def take(self, t: float) -> list[Input]:
        out = [i for f in self.feeds for i in f.take(t)]
        out.sort(key=lambda i: i.at)
        return out
