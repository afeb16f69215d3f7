"""The control actors act on a message within a hop of its arrival, not at the next tick: the price
watcher, the demand monitor, the allocator and the supervisor (``actors.base``, prompt delivery). Each
message arrives between ticks (at t = k + 0.3); its effect must carry the time ``next_instant(t)``,
which is at most ``HOP_S`` after it, and nothing may happen before it."""

from __future__ import annotations

from actors.base import HOP_S, next_instant
from actors.demand import DemandMonitor
from actors.price import PriceWatcher
from coral.messages.control import CommandResult, Replan, SetDemand, SetPrice
from coral.messages.demand import DemandUpdate
from coral.messages.fleet import FleetAction, FleetUpdate, InstanceDrained, ReleaseNode, ServeInstance, StageLoaded
from coral.messages.market import MarketQuotes, MarketUpdate, Quote
from coral.messages.mesh import DemandTuning
from coral.messages.requests import ArrivalCounts

from ..mesh.helpers import World
from .fake import FakeContext, attach, envelope
from .test_allocator import _allocator, _market, _plans
from .test_demand import REPORT_S
from .test_supervisor import _of, _plan, _supervisor


async def _at(ctx: FakeContext, t: float) -> float:
    """Move to ``t`` (between ticks) and return when a message received now is due."""
    await ctx.run_until(t)
    due = next_instant(t)
    assert t < due <= t + HOP_S
    return due


async def _nothing_before(ctx: FakeContext, due: float) -> None:
    await ctx.run_until(due - HOP_S / 4)
    assert ctx.take() == ([], [])


async def test_the_price_watcher_publishes_a_quote_and_an_override_within_a_hop() -> None:
    pw = PriceWatcher(tick_s=1.0)
    ctx = await attach(pw)
    due = await _at(ctx, 2.3)
    quotes = (Quote("r", "n1", 1.0, 4), Quote("r", "n2", 2.0, 1))
    await pw.handle(envelope(MarketQuotes(2.3, "scenario", quotes)))
    await ctx.run_until(due)
    (update,) = [m for m in ctx.take()[1] if isinstance(m, MarketUpdate)]
    assert (update.seq, update.at, update.reason) == (1, due, "source")
    due = await _at(ctx, 4.3)
    await pw.handle(envelope(SetPrice("r", "n2", 5.0), kind="request"))
    await _nothing_before(ctx, due)
    await ctx.run_until(due)
    _, published = ctx.take()
    (update,) = [m for m in published if isinstance(m, MarketUpdate)]
    assert (update.at, update.reason, update.changed) == (due, "operator", (Quote("r", "n2", 5.0, 1),))
    assert [r.ok for r in published if isinstance(r, CommandResult)] == [True]


async def test_the_demand_monitor_publishes_a_step_and_an_override_within_a_hop() -> None:
    mon = DemandMonitor(tick_s=1.0, deployments=["d"], prior={"d": 2.0}, tuning=DemandTuning(), start=0.0)
    ctx = await attach(mon)
    await ctx.run_until(1.0)
    assert [m.reason for m in ctx.take()[1] if isinstance(m, DemandUpdate)] == ["initial"]
    at = 5.3
    due = await _at(ctx, at)
    await mon.handle(envelope(ArrivalCounts(at, at - REPORT_S, {"d": int(20 * REPORT_S)})))  # 2 -> 20 req/s
    await _nothing_before(ctx, due)
    await ctx.run_until(due)
    (update,) = [m for m in ctx.take()[1] if isinstance(m, DemandUpdate)]
    assert (update.at, update.reason) == (due, "estimate") and update.demand["d"] > 2.0
    due = await _at(ctx, 7.3)
    await mon.handle(envelope(SetDemand("d", 3.0)))
    await ctx.run_until(due)
    (update,) = [m for m in ctx.take()[1] if isinstance(m, DemandUpdate)]
    assert (update.at, update.reason, update.demand) == (due, "operator", {"d": 3.0})


async def test_the_allocator_plans_within_a_hop_of_a_change(world: World) -> None:
    a, ctx, sc = await _allocator(world)
    due = await _at(ctx, 1.3)
    demand = {d.name: 2 * d.demand.at(0.0) for d in sc.deployments}
    await a.handle(envelope(_market(sc, world)))
    await a.handle(envelope(DemandUpdate(1, 1.3, demand, demand)))
    await ctx.run_until(due)
    (first,) = _plans(ctx)  # both changes of one instant give one plan
    assert (first.plan.at, first.plan.trigger) == (due, "demand+initial+market")
    due = await _at(ctx, 2.3)
    await a.handle(envelope(Replan(), kind="request"))
    await ctx.run_until(due - HOP_S / 4)
    assert len(_plans(ctx)) == 1
    await ctx.run_until(due)
    second = _plans(ctx)[-1]
    assert (second.plan.seq, second.plan.at, second.plan.trigger) == (2, due, "operator")


async def test_the_supervisor_acts_on_a_plan_a_loaded_stage_and_a_drain_within_a_hop(world: World) -> None:
    sup, ctx, tpl, spawned = await _supervisor(world)
    await ctx.run_until(1.0)
    ctx.take()
    due = await _at(ctx, 1.3)
    await sup.handle(envelope(_plan(1, tpl, 1), kind="publish"))
    await _nothing_before(ctx, due)
    await ctx.run_until(due)
    assert [(a.action, a.at) for a in _of(ctx, FleetAction)] == [("start", due)]
    assert [u.at for u in _of(ctx, FleetUpdate)] == [due]
    await ctx.run_until(7.0)  # the nodes came up at a tick (the cloud's provisioning time)
    assert len(spawned) == len(tpl.stages)
    ctx.take()
    due = await _at(ctx, 7.3)
    for nid in spawned:
        await sup.handle(envelope(StageLoaded(nid, "i1", 7.3), source=f"worker-{nid}"))
    await _nothing_before(ctx, due)
    await ctx.run_until(due)
    assert [d for d, m in ctx.sent if isinstance(m, ServeInstance)] == [f"worker-{spawned[0]}"]
    assert [(a.action, a.at) for a in _of(ctx, FleetAction)] == [("serving", due)]
    ctx.take()
    due = await _at(ctx, 8.3)
    await sup.handle(envelope(_plan(2, tpl, 0), kind="publish"))
    await ctx.run_until(due)
    assert [(a.action, a.at) for a in _of(ctx, FleetAction)] == [("retire", due), ("drain", due)]
    ctx.take()
    due = await _at(ctx, 9.3)
    await sup.handle(envelope(InstanceDrained("i1", spawned[0], 9.3), source=f"worker-{spawned[0]}"))
    await _nothing_before(ctx, due)
    await ctx.run_until(due)
    assert sorted(m.node_id for _, m in ctx.sent if isinstance(m, ReleaseNode)) == sorted(spawned)
    (update,) = _of(ctx, FleetUpdate)
    assert (update.at, update.stopped) == (due, ("i1",))
