"""Plans applied at their trigger plus a delay (``SimConfig.plan_delay_s``), as the mesh's allocator
publishes them at trigger + the planner's deadline: made from the state at the trigger, applied later, and
the triggers that come meanwhile coalesced into one plan made when the first is applied."""

from __future__ import annotations

import pytest

from coral.perf import PerfModel
from coral.scenario import MarketChange
from coral.sim import SimConfig, SimError, simulate
from coral.sim.handmade import GreedyPlanner, single
from tests.sim import helpers as h

M = "llama-3.1-8b"


def test_a_plan_is_made_at_its_trigger_and_applied_after_the_delay(perf: PerfModel) -> None:
    tpl = single(perf, M, "g6e.xlarge", 64)
    market = (MarketChange(at=150.5, region=h.REGION, node="g6e.xlarge", price=3.0, availability=16),)
    sc = h.scenario(
        [h.deployment(rps=[(0.0, 2.0), (150.0, 12.0), (150.25, 30.0)])],
        duration_s=400,
        replan_interval_s=1000,
        market=market,
    )
    planner = GreedyPlanner({tpl.id: tpl}, {"chat": [(tpl.id, h.REGION)]})
    res = simulate(sc, {tpl.id: tpl}, perf, planner, config=SimConfig(plan_delay_s=1.0))
    # the first plan (the warm fleet at t=0) at once; the step at 150 made then, applied at 151; the step
    # at 150.25 and the market change at 150.5 came while it was in flight: one plan, made at 151
    assert [(r.at, r.trigger) for r in planner.requests] == [(0.0, "initial"), (150.0, "demand"),
                                                             (151.0, "demand+market")]  # fmt: skip
    assert planner.requests[1].demand["chat"] == 12.0 and planner.requests[2].demand["chat"] == 30.0
    assert res.plan_changes == [0.0, 151.0, 152.0]
    at_once = GreedyPlanner({tpl.id: tpl}, {"chat": [(tpl.id, h.REGION)]})
    res0 = simulate(sc, {tpl.id: tpl}, perf, at_once)
    assert [r.at for r in at_once.requests] == [0.0, 150.0, 150.25, 150.5]
    assert res0.plan_changes[:2] == [0.0, 150.0]


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(SimError, match="plan_delay_s must not be negative"):
        SimConfig(plan_delay_s=-1.0)
