"""What a run's watcher sees (``RunState``): the latest plan, fleet, demand, market and traffic reports,
command results, crashes, bus errors, deployments short of capacity and refused connections."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from coral.kernel import Envelope
from coral.kernel.events import AuthRefused
from coral.messages.control import CommandResult
from coral.messages.demand import DemandUpdate
from coral.messages.fleet import CapacityShort, FleetUpdate
from coral.messages.inspect import ClockInfo
from coral.messages.market import MarketUpdate
from coral.messages.plan import NewPlan
from coral.messages.requests import RoutingStats


@attrs.define
class RunState:
    """What a watcher saw: the latest plan, fleet, demand, market and traffic reports."""

    plan: NewPlan | None = None
    plans: int = 0
    landed: float | None = None
    """The kernel time at which the latest plan was published (its landing: ``actors.allocator``)."""
    clock: Callable[[], float] | None = None
    """The mesh's clock (``run_mesh`` sets it), read when a plan arrives: the watcher sees each message
    while the clock still reads the instant it was published (the mesh quiesces before it moves on)."""
    pace: Callable[[], ClockInfo] | None = None
    """Where the clock stands against the run's pace now, as the operator desk answers a ``ClockRequest``
    (``run_mesh`` sets it for a run with a desk): behind by how much, from the drive's own origin."""
    fleet: FleetUpdate | None = None
    demand: DemandUpdate | None = None
    market: MarketUpdate | None = None
    stats: RoutingStats | None = None
    results: list[CommandResult] = attrs.field(factory=list)
    crashes: int = 0
    errors: int = 0
    now: float = 0.0
    short: dict[str, CapacityShort] = attrs.field(factory=dict)
    """Deployments whose serving capacity is below their demand now (``fleet.unmet``)."""
    refused: list[AuthRefused] = attrs.field(factory=list)
    """Every refused connection report, in order (repeats of one peer come merged, with a count)."""

    def refusals(self) -> list[dict[str, Any]]:
        """Refused connections per peer: address, mechanism, key, the latest reason and the total count."""
        per: dict[tuple[str, str, str], dict[str, Any]] = {}
        for r in self.refused:
            row = per.setdefault((r.address, r.mechanism, r.key), {"address": r.address, "mechanism": r.mechanism,
                                                                   "key": r.key, "count": 0})  # fmt: skip
            row["reason"] = r.reason
            row["count"] += r.count
        return list(per.values())

    def update(self, env: Envelope) -> None:
        msg = env.msg
        if isinstance(msg, NewPlan):
            self.plan = msg
            self.plans += 1
            self.landed = self.clock() if self.clock is not None else None
        elif isinstance(msg, FleetUpdate):
            self.fleet = msg
        elif isinstance(msg, DemandUpdate):
            self.demand = msg
        elif isinstance(msg, MarketUpdate):
            self.market = msg
        elif isinstance(msg, RoutingStats):
            self.stats = msg
        elif isinstance(msg, CommandResult):
            self.results.append(msg)
        elif isinstance(msg, CapacityShort):
            if msg.short:
                self.short[msg.deployment] = msg
            else:
                self.short.pop(msg.deployment, None)
        elif isinstance(msg, AuthRefused):
            self.refused.append(msg)
        elif env.tag == "kernel.actor.crashed":
            self.crashes += 1
        elif env.tag == "kernel.error":
            self.errors += 1


WATCH_TOPICS = (
    "plan.new",
    "fleet.update",
    "dem.update",
    "mkt.update",
    "req.stats",
    "ctl.result",
    "kernel.actor.",
    "kernel.error",
    "kernel.auth.",
    "fleet.unmet",
)
