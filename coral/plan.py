"""Plans: the target set of instances per region, with cost, capacity vs demand, and solver status."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen
class PlannedInstances:
    """``count`` instances of one template in one region, serving one deployment."""

    deployment: str
    template_id: str
    region: str
    count: int
    nodes: tuple[str, ...]
    mode: str
    cost_per_hour: float
    capacity_rps: float


@attrs.frozen
class DeploymentServing:
    """Per deployment: demand, planned capacity and unmet demand, in requests/s."""

    deployment: str
    model: str
    demand_rps: float
    capacity_rps: float
    unmet_rps: float


@attrs.frozen
class Plan:
    """A solved allocation. ``gap`` is relative to the best bound; ``effort`` lets a replay re-solve it."""

    seq: int
    at: float
    policy: str
    trigger: str
    instances: tuple[PlannedInstances, ...]
    serving: tuple[DeploymentServing, ...]
    cost_per_hour: float
    churn_cost: float
    status: str
    gap: float
    bound: float
    solve_s: float
    effort: Mapping[str, int] = attrs.field(factory=dict)

    @property
    def unmet_rps(self) -> float:
        return sum(s.unmet_rps for s in self.serving)

    @property
    def demand_rps(self) -> float:
        return sum(s.demand_rps for s in self.serving)

    @property
    def served_fraction(self) -> float:
        d = self.demand_rps
        return 1.0 if d <= 0 else max(0.0, 1.0 - self.unmet_rps / d)

    def counts(self) -> dict[tuple[str, str, str], int]:
        """(deployment, template id, region) -> instance count."""
        return {(i.deployment, i.template_id, i.region): i.count for i in self.instances}

    def diff(self, previous: Plan | None) -> dict[tuple[str, str, str], int]:
        """Instances to start (positive) or stop (negative) to go from ``previous`` to this plan."""
        before = previous.counts() if previous else {}
        after = self.counts()
        out = {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}
        return {k: v for k, v in sorted(out.items()) if v != 0}

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self, recurse=True)


@attrs.frozen
class PlanRequest:
    """Everything a planner needs at one moment: demand, market and the current deployment."""

    at: float
    demand: Mapping[str, float]
    prices: Mapping[tuple[str, str], float]
    availability: Mapping[tuple[str, str], int]
    current: Mapping[tuple[str, str, str], int]
    trigger: str = "interval"
