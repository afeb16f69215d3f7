"""Serving capacity of a deployment in requests/s: the one definition that metrics, ``coral up``'s status,
the TUI and the supervisor's make-before-break share.

An aggregated instance serves its weight (requests/s at the deployment's shape) on its own. A
disaggregated request needs a prefill instance and then a decode instance of the same region (the
router pairs them only there, and the KV transfer stays in the region), so in each region the prefill
and decode instances together serve min(prefill, decode) requests/s: the slower side bounds the flow,
as the allocator's prefill and decode rows bound y[m, r]. A deployment's capacity is the sum over its
aggregated instances plus, per region, that minimum. Only routable instances (serving, retiring) count.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from coral.messages.fleet import ROUTABLE_STATES


class Sized(Protocol):
    """What capacity needs of an instance (``InstanceInfo`` and the TUI's view have it)."""

    @property
    def deployment(self) -> str: ...
    @property
    def region(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def weight(self) -> float: ...


def capacity_rps(rows: Iterable[tuple[str, str, str, float]]) -> dict[str, float]:
    """Capacity per deployment of instances given as (deployment, region, mode, weight), all counted."""
    agg: dict[str, float] = {}
    side: dict[tuple[str, str, str], float] = {}
    for dep, region, mode, weight in rows:
        if mode in ("prefill", "decode"):
            k = (dep, region, mode)
            side[k] = side.get(k, 0.0) + weight
        else:
            agg[dep] = agg.get(dep, 0.0) + weight
    for dep, region, mode in side:
        agg.setdefault(dep, 0.0)
        if mode == "prefill":
            agg[dep] += min(side[(dep, region, "prefill")], side.get((dep, region, "decode"), 0.0))
    return agg


def serving_capacity(instances: Iterable[Sized]) -> dict[str, float]:
    """Capacity per deployment of the routable (serving or retiring) instances among ``instances``;
    a deployment with instances but none routable has 0."""
    rows = []
    out: dict[str, float] = {}
    for i in instances:
        out.setdefault(i.deployment, 0.0)
        if i.state in ROUTABLE_STATES:
            rows.append((i.deployment, i.region, i.mode, i.weight))
    out.update(capacity_rps(rows))
    return out
