"""The demand monitor: per-deployment demand estimates from the router's arrival counts and queue.

It publishes a ``DemandUpdate`` when the estimate (``coral.demand.DemandEstimator``) moved enough
(``coral.demand.moved``), or when an operator override was set or cleared; and once at its first tick.
Delivery is prompt (``actors.base``): the estimate changes only when the router's counts or an override
arrive, and it is checked (and published) within ``HOP_S`` of that arrival, not at the next tick. The
estimator and the rule are ``coral.demand``'s, which the simulator uses too. The router's requests waiting
for an instance (``RoutingStats``, published with the counts) are the estimator's backlog.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from actors.base import TickActor
from coral.demand import DemandEstimator, moved
from coral.kernel import Envelope
from coral.messages.control import DEMAND_MONITOR, SetDemand
from coral.messages.demand import DemandUpdate
from coral.messages.mesh import DemandTuning
from coral.messages.requests import ArrivalCounts, RoutingStats


class DemandMonitor(TickActor):
    """Turns the router's arrival counts into published demand (see the module docstring)."""

    prompt = True

    def __init__(
        self,
        name: str = DEMAND_MONITOR,
        *,
        tick_s: float,
        deployments: Sequence[str],
        prior: Mapping[str, float],
        tuning: DemandTuning,
        start: float,
    ) -> None:
        super().__init__(name, tick_s=tick_s, subscribe=["req.counts", "req.stats"])
        self.tuning = tuning
        self.estimator = DemandEstimator(deployments, prior, tuning, start)
        self.overrides: dict[str, float] = {}
        self.published: dict[str, float] | None = None
        self.overrides_changed = False
        self.seq = 0

    async def on_message(self, env: Envelope) -> None:
        msg = env.msg
        if isinstance(msg, ArrivalCounts):
            self.estimator.observe(msg.since, msg.at, msg.counts)
        elif isinstance(msg, RoutingStats):
            self.estimator.backlog({t.deployment: t.queued for t in msg.deployments})

    async def command(self, msg: object) -> tuple[str, str] | None:
        if not isinstance(msg, SetDemand):
            return await super().command(msg)
        if msg.deployment not in self.estimator.deployments:
            known = ", ".join(self.estimator.deployments)
            return ("deployment", f"unknown deployment {msg.deployment!r} (known: {known})")
        if msg.rps is None:
            self.overrides.pop(msg.deployment, None)
        else:
            self.overrides[msg.deployment] = float(msg.rps)
        self.overrides_changed = True
        return None

    async def on_tick(self, now: float) -> None:
        await self.on_wake(now)

    async def on_wake(self, now: float) -> None:
        est = self.estimator.estimate()
        demand = {d: self.overrides.get(d, v) for d, v in est.items()}
        if self.published is not None and not self.overrides_changed:
            changed = {d: v for d, v in demand.items() if d not in self.overrides}
            if not moved(self.published, changed, self.estimator):
                return
            reason = "estimate"
        else:
            reason = "initial" if self.published is None else "operator"
        self.overrides_changed = False
        self.published = demand
        self.estimator.published(demand)
        self.seq += 1
        await self.ctx.publish(DemandUpdate(self.seq, now, demand, est, tuple(sorted(self.overrides)), reason))
