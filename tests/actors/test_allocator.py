"""The allocator on its own, with a fake context and the mesh tests' templates: when it plans, what the
plan covers, and which operator commands it refuses."""

from __future__ import annotations

import attrs
import pytest

from actors.allocator import Allocator
from actors.base import HOP_S, next_instant
from actors.compose import library_for
from coral.messages.control import AllocatorState, ForbidTemplate, PauseAllocator, Replan, SetChurn, SetSlo
from coral.messages.demand import DemandUpdate
from coral.messages.market import MarketUpdate, Quote
from coral.messages.plan import NewPlan
from coral.scenario import Scenario
from coral.store import TemplateStore
from coral.workload import Slo
from solvers.planning import Planner

from ..mesh.helpers import World
from .fake import FakeContext, attach, envelope


def _market(sc: Scenario, world: World, seq: int = 1) -> MarketUpdate:
    price, avail = sc.market_at(world.catalog, 0.0)
    quotes = tuple(Quote(r, n, p, avail[(r, n)]) for (r, n), p in sorted(price.items()))
    return MarketUpdate(seq, 0.0, quotes, quotes)


async def _allocator(
    world: World, *, deterministic: bool = True, landing: str = "deadline"
) -> tuple[Allocator, FakeContext, Scenario]:
    sc = world.scenario("mesh-steady")
    with TemplateStore(world.store, readonly=True) as store:
        lib = library_for(store, sc)
    a = Allocator(
        tick_s=1.0,
        scenario=sc,
        catalog=world.catalog,
        perf=world.perf,
        library=lib,
        deterministic=deterministic,
        landing=landing,
    )
    return a, await attach(a), sc


async def start_first_plan(a: Allocator, ctx: FakeContext, sc: Scenario, world: World) -> float:
    """Give the allocator a market and a demand at t = 1.3; return when its first plan started (in flight)."""
    await ctx.run_until(1.3)
    demand = {x.name: 2 * x.demand.at(0.0) for x in sc.deployments}
    await a.handle(envelope(_market(sc, world)))
    await a.handle(envelope(DemandUpdate(1, 1.3, demand, demand)))
    start = next_instant(1.3)
    await ctx.run_until(start)
    return start


def _plans(ctx: FakeContext) -> list[NewPlan]:
    return [m for m in ctx.published if isinstance(m, NewPlan)]


async def test_no_plan_before_the_market_is_known_then_one_per_tick_that_changed(world: World) -> None:
    a, ctx, sc = await _allocator(world)
    await ctx.run_until(3.0)
    assert _plans(ctx) == []
    assert [type(m) for m in ctx.published] == [AllocatorState]  # its settings, at its first tick
    await a.handle(envelope(_market(sc, world)))
    demand = {d.name: 2 * d.demand.at(0.0) for d in sc.deployments}
    await a.handle(envelope(DemandUpdate(1, 3.0, demand, demand)))
    await ctx.run_until(4.0)
    (first,) = _plans(ctx)
    assert first.plan.seq == 1 and first.plan.trigger == "demand+initial+market"
    assert {s.deployment: s.demand_rps for s in first.plan.serving} == demand
    assert first.plan.unmet_rps == pytest.approx(0.0, abs=1e-6)
    assert sum(c.delta for c in first.diff) == sum(i.count for i in first.plan.instances) > 0
    assert (first.inputs.market_seq, first.inputs.demand_seq) == (1, 1)
    await ctx.run_until(8.0)  # nothing changed, the re-plan interval has not passed
    assert len(_plans(ctx)) == 1


async def test_a_paused_allocator_does_not_plan_and_its_settings_are_published(world: World) -> None:
    a, ctx, sc = await _allocator(world)
    await a.handle(envelope(PauseAllocator(True), source="operator", kind="request"))
    await a.handle(envelope(_market(sc, world)))
    await ctx.run_until(2.0)
    assert _plans(ctx) == []
    states = [m for m in ctx.published if isinstance(m, AllocatorState)]
    assert [s.paused for s in states] == [True]
    assert len(ctx.replies) == 1 and ctx.replies[0][1].ok  # the command was confirmed to its sender
    await a.handle(envelope(PauseAllocator(False), source="operator"))
    await ctx.run_until(3.0)
    assert len(_plans(ctx)) == 1  # the pending triggers are planned once it resumes


async def test_commands_that_would_leave_a_deployment_unserved_are_refused(world: World) -> None:
    a, ctx, sc = await _allocator(world)
    dep = sc.deployments[0].name
    only = {t.id for t in a.usable(dep)}
    await a.handle(envelope(SetSlo("nope", 1.0, 0.1, 0.9), source="operator"))
    await a.handle(envelope(SetSlo(dep, 1e-6, 1e-6, 0.9), source="operator"))
    for tid in sorted(only):
        await a.handle(envelope(ForbidTemplate(tid, True), source="operator"))
    await a.handle(envelope(ForbidTemplate("t-unknown", True), source="operator"))
    await ctx.run_until(1.0)
    results = [m for m in ctx.published if type(m).__name__ == "CommandResult"]
    refused = [(r.field, r.reason.split(" ")[0]) for r in results if not r.ok]
    assert refused[0] == ("deployment", "unknown")
    assert refused[1][0] == "ttft_s"
    assert refused[-1] == ("template_id", "unknown")
    assert any(r.field == "template_id" and "without a template" in r.reason for r in results if not r.ok)
    assert {t.id for t in a.usable(dep)}  # the deployment can still be served


async def test_under_a_deadline_a_plan_is_published_at_its_start_plus_the_deadline(world: World) -> None:
    """A plan started at t is published at t + D (D = the scenario's deadline), not before, while the
    actor stays idle; changes that arrive meanwhile make one plan, started when the first is published."""
    a, ctx, sc = await _allocator(world, deterministic=False)
    try:
        d = sc.planner.deadline_s
        assert a.delay_s == d > 0
        due = await start_first_plan(a, ctx, sc, world)
        assert _plans(ctx) == [] and a.pending is not None and a.pending.due == due + d  # submitted, not published
        await a.handle(envelope(Replan(), source="operator"))  # while the first is in flight
        await ctx.run_until(due + 0.5)
        await a.handle(envelope(SetChurn(2.0), source="operator"))  # another change, same flight
        await ctx.run_until(due + d - HOP_S / 4)
        assert _plans(ctx) == []
        await ctx.run_until(due + d)
        (first,) = _plans(ctx)
        assert (first.plan.seq, first.plan.at, first.plan.trigger) == (1, due, "demand+initial+market")
        assert first.inputs.demand_seq == 1 and sum(c.delta for c in first.diff) > 0
        assert a.pending is not None and a.pending.due == due + 2 * d  # the operator's re-plan, started now
        await ctx.run_until(due + 2 * d)
        second = _plans(ctx)[-1]
        assert (second.plan.seq, second.plan.at, second.plan.trigger) == (2, due + d, "churn+operator")
        assert len(_plans(ctx)) == 2 and a.pending is None
    finally:
        await a.on_stop()


async def test_without_a_deadline_a_plan_is_published_at_its_start(world: World) -> None:
    a, ctx, sc = await _allocator(world)
    try:
        assert a.delay_s == 0.0
        await a.handle(envelope(_market(sc, world)))
        await ctx.run_until(1.3)
        (plan,) = _plans(ctx)
        assert plan.plan.at == next_instant(0.0) and a.pending is None
    finally:
        await a.on_stop()


async def test_the_next_plan_counts_queueing_headroom_for_the_operators_slo(world: World) -> None:
    """A ``SetSlo`` changes the deployment's SLO in the program the next plan solves: its columns' capacity
    (scaled by the queueing-safe utilisation at that SLO) and its index, not only the templates it may use."""
    a, ctx, sc = await _allocator(world)
    dep = sc.deployments[0]
    loose = Slo(4 * dep.slo.ttft_s, dep.slo.tpot_s, dep.slo.attainment)  # every template still meets it
    await a.handle(envelope(SetSlo(dep.name, loose.ttft_s, loose.tpot_s, loose.attainment), source="operator"))
    await start_first_plan(a, ctx, sc, world)
    assert len(_plans(ctx)) == 1 and a._columns is not None
    cols, index = a._columns[1]
    tpls = {d.name: a.usable(d.name) for d in sc.deployments}
    as_set = attrs.evolve(sc, deployments=(attrs.evolve(dep, slo=loose), *sc.deployments[1:]))
    want, _ = Planner(a.policy, as_set, world.catalog, world.perf, tpls, a.deadline_s).program_columns()
    before, _ = Planner(a.policy, sc, world.catalog, world.perf, tpls, a.deadline_s).program_columns()
    assert {d.slo for d, _ in index if d.name == dep.name} == {loose}
    assert [c.decode_tok_s for c in cols] == [c.decode_tok_s for c in want]
    assert [c.decode_tok_s for c in want] != [c.decode_tok_s for c in before]  # the SLO moves some column
