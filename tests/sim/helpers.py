"""Scenario builders for the simulator tests (templates and planners: ``coral.sim.handmade``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from coral.scenario import Demand, Deployment, FaultEvent, MarketChange, Planner, Scenario
from coral.sim.handmade import DEFAULT_SHAPE as SHAPE
from coral.sim.handmade import DEFAULT_SLO as SLO
from coral.workload import Slo, WorkloadShape

REGION = "aws-us-east-1"


def deployment(
    name: str = "chat",
    model: str = "llama-3.1-8b",
    rps: float | Sequence[tuple[float, float]] = 1.0,
    slo: Slo = SLO,
    shape: WorkloadShape = SHAPE,
) -> Deployment:
    series = ((0.0, float(rps)),) if isinstance(rps, int | float) else tuple(rps)
    return Deployment(name, model, slo, shape, Demand(series))


def scenario(
    deployments: Sequence[Deployment],
    *,
    duration_s: float = 600.0,
    replan_interval_s: float = 300.0,
    node_types: Sequence[str] = ("g6e.xlarge", "g6e.12xlarge", "p5.4xlarge", "g6.xlarge"),
    market: Sequence[MarketChange] = (),
    events: Sequence[FaultEvent] = (),
    regions: Sequence[str] = (REGION,),
) -> Scenario:
    return Scenario(
        name="test",
        path=Path("test.toml"),
        regions=tuple(regions),
        node_types=tuple(node_types),
        deployments=tuple(deployments),
        duration_s=duration_s,
        planner=Planner(replan_interval_s=replan_interval_s),
        market=tuple(market),
        events=tuple(events),
    )
