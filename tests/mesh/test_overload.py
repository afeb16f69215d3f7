"""Overload at the router: with tight bounds and demand far above capacity, no instance holds more than
its share, at most ``max_queue`` requests wait, the excess fails at once as ``queue_full``, and every
arrival still ends completed or failed. (The memory and recovery figures are in ``bench/overload.py``.)"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from actors.replay import decisions_of
from actors.router import Router
from coral.messages import CloudSetup, FleetUpdate, RoutingStats
from coral.messages.mesh import MeshTiming

from .helpers import RECORD_OPTIONS, World
from .test_faults import all_accounted, final


@pytest.mark.slow
async def test_router_sheds_beyond_its_bounds(world: World, tmp_path: Path) -> None:
    timing = MeshTiming(max_queue=20, instance_queue_s=3.0)
    options = attrs.evolve(RECORD_OPTIONS, timing=timing, cloud=CloudSetup(provision_s=5.0, startup_s=5.0))
    sc = world.scenario("mesh-surge")
    (dep,) = sc.deployments
    surge = attrs.evolve(dep, demand=attrs.evolve(dep.demand, series=((0.0, 2.0), (30.0, 60.0), (60.0, 2.0))))
    sc = attrs.evolve(sc, deployments=(surge,))
    journal = tmp_path / "overload.journal"
    await world.run("mesh-surge", options=options, journal=journal, scenario=sc)
    decisions = decisions_of(journal)
    router = Router(timing=timing, deployments=sc.deployments, seed=0)  # its bounds, as the run's router
    recent = [0, 0]  # the shares of the instances in the last two fleet updates
    for d in decisions:
        if isinstance(d.msg, FleetUpdate):
            held = [i for i in d.msg.instances if i.state in ("serving", "retiring", "draining")]
            recent = [recent[1], sum(router.bound(i) for i in held)]
        if isinstance(d.msg, RoutingStats):
            caps = max(recent)
            (t,) = d.msg.deployments
            assert t.in_flight <= caps  # started by instances: at most their shares
            # waiting: at most max_queue in the router, and what the instances hold but have not started
            assert t.queued + t.in_flight <= timing.max_queue + caps
    stats = final(journal)
    (t,) = stats.deployments
    assert t.failed_by.get("queue_full", 0) > 0  # the excess was shed, not queued
    all_accounted(stats)
