"""A plan's capacity per deployment is what the allocation program counts: after the utilisation target
and the queueing headroom, with each prefill instance's KV limit and the NIC levels that pair prefill with
decode instances. So a deployment left short shows exactly its demand less its unmet demand."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from coral.plan import Plan
from solvers.planning import request_at
from tests.plan.columns import column_planners


def short_plans(small_env: tuple[Path, Path]) -> list[Plan]:
    """Plans of every study column at 20x the demand on one region's availability: demand left unmet."""
    sc, cat, planners = column_planners(small_env, 10.0)
    base = request_at(sc, cat, 0.0)
    req = attrs.evolve(
        base,
        demand={k: 20 * v for k, v in base.demand.items()},
        availability={k: (v if k[0] == "aws-us-east-1" else 0) for k, v in base.availability.items()},
    )
    return [planner(req) for planner in planners.values()]


def test_a_short_deployments_capacity_is_its_demand_less_its_unmet_demand(small_env: tuple[Path, Path]) -> None:
    plans = short_plans(small_env)
    pd = [p for p in plans if {i.mode for i in p.instances} >= {"prefill", "decode"}]
    assert pd, "no plan with prefill and decode instances"
    checked = 0
    for plan in plans:
        for s in plan.serving:
            if s.unmet_rps > 1e-6:
                checked += 1
                assert s.capacity_rps == pytest.approx(s.demand_rps - s.unmet_rps, rel=1e-9, abs=1e-9), (
                    plan.policy,
                    s,
                    [(i.template_id[:8], i.mode, i.count) for i in plan.instances],
                )
            else:
                assert s.capacity_rps >= s.demand_rps * (1 - 1e-9)
    assert checked
