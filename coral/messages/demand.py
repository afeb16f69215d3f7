"""Demand protocol: the demand monitor's per-deployment estimate, published when it moves.

``demand`` is what the allocator plans for (the estimate, or the operator's override where one is set);
``estimate`` is the monitor's own estimate from the router's arrival counts; ``overrides`` lists the
deployments whose demand an operator fixed.
"""

from __future__ import annotations

import attrs

from coral.kernel import message


@message("dem.update")
@attrs.frozen
class DemandUpdate:
    """Demand in requests/s per deployment at ``at``."""

    seq: int
    at: float
    demand: dict[str, float]
    estimate: dict[str, float]
    overrides: tuple[str, ...] = ()
    reason: str = "estimate"
