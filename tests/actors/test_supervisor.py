"""The instance supervisor on its own, with a fake context and the simulated cloud: it starts what a plan
wants, serves it once every stage loaded, loses a silent node, and retires, drains and releases what a
later plan drops."""

from __future__ import annotations

from actors.cloud import SimCloud
from actors.supervisor import Supervisor
from coral.messages.fleet import (
    DrainOrder,
    FleetAction,
    FleetUpdate,
    InstanceDrained,
    LoadStage,
    NodeLost,
    ReleaseNode,
    ServeInstance,
    StageLoaded,
    WorkerHeartbeat,
)
from coral.messages.market import MarketUpdate, Quote
from coral.messages.mesh import MeshTiming
from coral.messages.plan import NewPlan
from coral.plan import DeploymentServing, Plan, PlannedInstances
from coral.store import TemplateStore
from coral.templates import Template

from ..mesh.helpers import World
from .fake import FakeContext, attach, envelope

DEP = "chat-8b"
REGION = "aws-us-east-1"


def _templates(world: World) -> list[Template]:
    with TemplateStore(world.store, readonly=True) as store:
        tpls = [t for t in store.query(model="llama-3.1-8b") if t.mode == "aggregated" and t.shape.mean_in == 512]
    return sorted(tpls, key=lambda t: (len(t.nodes), t.id))


def _template(world: World) -> Template:
    return _templates(world)[0]


def _plan(seq: int, tpl: Template, count: int, demand: float = 0.0) -> NewPlan:
    inst = PlannedInstances(DEP, tpl.id, REGION, count, tpl.nodes, "aggregated", 1.0, 1.0)
    serving = (DeploymentServing(DEP, tpl.model, demand, 1.0, 0.0),) if demand else ()
    plan = Plan(seq, 0.0, "coral", "test", (inst,) if count else (), serving, 1.0, 0.0, "optimal", 0.0, 1.0, 0.0)
    return NewPlan(plan, ())


async def _supervisor(
    world: World, also: Template | None = None
) -> tuple[Supervisor, FakeContext, Template, list[str]]:
    tpl = _template(world)
    tpls = {tpl.id: tpl} if also is None else {tpl.id: tpl, also.id: also}
    sc = world.scenario("mesh-steady")
    spawned: list[str] = []

    async def spawn(node_id: str, region: str, node_type: str) -> str:
        spawned.append(node_id)
        return f"worker-{node_id}"

    cloud = SimCloud(provision_s=5.0)
    quotes = tuple(Quote(REGION, n, 1.0, 4) for n in sorted({n for t in tpls.values() for n in t.nodes}))
    cloud.set_market(MarketUpdate(1, 0.0, quotes, quotes))
    sup = Supervisor(timing=MeshTiming(), cloud=cloud, templates=tpls,
                     deployments={d.name: d for d in sc.deployments}, catalog=world.catalog, spawn_worker=spawn,
                     warm_start=False)  # fmt: skip
    return sup, await attach(sup), tpl, spawned


def _of(ctx: FakeContext, kind: type) -> list:  # type: ignore[type-arg]
    return [m for _, m in ctx.sent if isinstance(m, kind)] + [m for m in ctx.published if isinstance(m, kind)]


async def _serving(world: World) -> tuple[Supervisor, FakeContext, Template, list[str]]:
    """A supervisor with one instance of the template serving, at t = 8."""
    sup, ctx, tpl, spawned = await _supervisor(world)
    await sup.handle(envelope(_plan(1, tpl, 1), kind="publish"))
    await ctx.run_until(7.0)
    for nid in spawned:
        await sup.handle(envelope(StageLoaded(nid, "i1", 7.0), source=f"worker-{nid}"))
    await ctx.run_until(8.0)
    return sup, ctx, tpl, spawned


async def test_a_plan_s_instance_is_provisioned_loaded_and_served(world: World) -> None:
    sup, ctx, tpl, spawned = await _supervisor(world)
    await sup.handle(envelope(_plan(1, tpl, 1), kind="publish"))
    await ctx.run_until(1.0)
    assert [(a.action, a.instance) for a in _of(ctx, FleetAction)] == [("start", "i1")]
    (update,) = _of(ctx, FleetUpdate)
    assert [(i.id, i.state) for i in update.instances] == [("i1", "provisioning")]
    await ctx.run_until(5.0)
    assert spawned == []  # the cloud takes provision_s
    await ctx.run_until(6.0)
    assert len(spawned) == len(tpl.stages)
    loads = _of(ctx, LoadStage)
    assert [(m.instance, m.stage, m.head) for m in loads] == [("i1", k, k == 0) for k in range(len(tpl.stages))]
    for nid in spawned:
        await sup.handle(envelope(StageLoaded(nid, "i1", 6.0), source=f"worker-{nid}"))
    await ctx.run_until(7.0)
    assert [(d, m) for d, m in ctx.sent if isinstance(m, ServeInstance)] == [
        (f"worker-{spawned[0]}", ServeInstance("i1"))
    ]
    last = _of(ctx, FleetUpdate)[-1]
    assert [(i.id, i.state, i.head) for i in last.instances] == [("i1", "serving", f"worker-{spawned[0]}")]
    assert last.cost_per_hour == len(tpl.stages) * 1.0


async def test_a_silent_node_is_lost_with_its_instance(world: World) -> None:
    sup, ctx, _, spawned = await _serving(world)
    timeout = MeshTiming().heartbeat_timeout_s
    for t in range(9, 9 + int(timeout)):
        for nid in spawned:
            await sup.handle(envelope(WorkerHeartbeat(nid, float(t), "serving"), source=f"worker-{nid}"))
        await ctx.run_until(float(t))
    assert _of(ctx, NodeLost) == []
    await ctx.run_until(9.0 + 2 * timeout)  # no heartbeat since
    lost = _of(ctx, NodeLost)
    assert {n.node_id for n in lost} <= set(spawned) and {n.cause for n in lost} == {"heartbeat"}
    update = [u for u in _of(ctx, FleetUpdate) if u.lost][-1]
    assert update.lost == ("i1",) and update.instances == ()
    assert [a.action for a in _of(ctx, FleetAction)][-1] == "lost"


async def test_a_dropped_instance_retires_then_drains_then_is_released(world: World) -> None:
    sup, ctx, tpl, spawned = await _serving(world)
    ctx.take()
    await sup.handle(envelope(_plan(2, tpl, 0), kind="publish"))
    await ctx.run_until(9.0)
    sent, published = ctx.take()
    actions = [(a.action, a.instance) for a in published if isinstance(a, FleetAction)]
    assert actions == [("retire", "i1"), ("drain", "i1")]  # nothing else of its deployment must serve first
    assert [(d, m) for d, m in sent if isinstance(m, DrainOrder)] == [
        (f"worker-{spawned[0]}", DrainOrder("i1", "replacement serving"))
    ]
    await sup.handle(envelope(InstanceDrained("i1", spawned[0], 9.0), source=f"worker-{spawned[0]}"))
    await ctx.run_until(10.0)
    sent, published = ctx.take()
    assert sorted(m.node_id for _, m in sent if isinstance(m, ReleaseNode)) == sorted(spawned)
    assert [(a.action, a.reason) for a in published if isinstance(a, FleetAction)] == [("release", "drained")]
    update = [m for m in published if isinstance(m, FleetUpdate)][-1]
    assert update.stopped == ("i1",) and update.instances == () and update.cost_per_hour == 0.0


async def test_a_loading_instance_a_new_plan_drops_bridges_until_its_replacement_serves(world: World) -> None:
    tpl, other = _templates(world)[:2]
    sup, ctx, _, spawned = await _supervisor(world, also=other)
    await sup.handle(envelope(_plan(1, tpl, 1, demand=1.0), kind="publish"))
    await ctx.run_until(6.0)  # i1's nodes are up: it loads
    first = list(spawned)
    ctx.take()
    await sup.handle(envelope(_plan(2, other, 1, demand=1.0), kind="publish"))  # before i1 serves
    await ctx.run_until(7.0)
    _, published = ctx.take()
    actions = [(a.action, a.instance) for a in published if isinstance(a, FleetAction)]
    assert actions == [("keep", "i1"), ("start", "i2")]  # not stopped: nothing of its deployment serves
    for nid in first:
        await sup.handle(envelope(StageLoaded(nid, "i1", 7.0), source=f"worker-{nid}"))
    await ctx.run_until(8.0)
    _, published = ctx.take()
    actions = [(a.action, a.instance) for a in published if isinstance(a, FleetAction)]
    assert actions == [("serving", "i1"), ("retire", "i1")]  # it serves until i2 does
    await ctx.run_until(12.0)
    for nid in spawned[len(first) :]:
        await sup.handle(envelope(StageLoaded(nid, "i2", 12.0), source=f"worker-{nid}"))
    await ctx.run_until(13.0)
    _, published = ctx.take()
    why = [(a.action, a.instance, a.reason) for a in published if isinstance(a, FleetAction)]
    assert why == [("serving", "i2", "all stages loaded"), ("drain", "i1", "replacement serving")]


async def test_a_loading_instance_is_stopped_when_its_deployment_serves_enough(world: World) -> None:
    sup, ctx, tpl, _ = await _serving(world)
    await sup.handle(envelope(_plan(2, tpl, 2, demand=1.0), kind="publish"))
    await ctx.run_until(9.0)
    ctx.take()
    await sup.handle(envelope(_plan(3, tpl, 1, demand=1.0), kind="publish"))  # i1 serves the demand alone
    await ctx.run_until(10.0)
    _, published = ctx.take()
    assert [(a.action, a.instance) for a in published if isinstance(a, FleetAction)] == [("stop", "i2")]
