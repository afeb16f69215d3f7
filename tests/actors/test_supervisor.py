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
from coral.plan import Plan, PlannedInstances
from coral.store import TemplateStore
from coral.templates import Template

from ..mesh.helpers import World
from .fake import FakeContext, attach, envelope

DEP = "chat-8b"
REGION = "aws-us-east-1"


def _template(world: World) -> Template:
    with TemplateStore(world.store, readonly=True) as store:
        tpls = [t for t in store.query(model="llama-3.1-8b") if t.mode == "aggregated" and t.shape.mean_in == 512]
    return min(tpls, key=lambda t: (len(t.nodes), t.id))


def _plan(seq: int, tpl: Template, count: int) -> NewPlan:
    inst = PlannedInstances(DEP, tpl.id, REGION, count, tpl.nodes, "aggregated", 1.0, 1.0)
    plan = Plan(seq, 0.0, "coral", "test", (inst,) if count else (), (), 1.0, 0.0, "optimal", 0.0, 1.0, 0.0)
    return NewPlan(plan, ())


async def _supervisor(world: World) -> tuple[Supervisor, FakeContext, Template, list[str]]:
    tpl = _template(world)
    sc = world.scenario("mesh-steady")
    spawned: list[str] = []

    async def spawn(node_id: str, region: str, node_type: str) -> str:
        spawned.append(node_id)
        return f"worker-{node_id}"

    cloud = SimCloud(provision_s=5.0)
    quotes = tuple(Quote(REGION, n, 1.0, 4) for n in sorted(set(tpl.nodes)))
    cloud.set_market(MarketUpdate(1, 0.0, quotes, quotes))
    sup = Supervisor(timing=MeshTiming(), cloud=cloud, templates={tpl.id: tpl},
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
