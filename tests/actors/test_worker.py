"""The stage worker on its own, with a fake context and the simulated engine: load, report, serve, drain,
release, die, wedge, and report an engine fault."""

from __future__ import annotations

from actors.worker import StageWorker, worker_name
from coral.engines.sim import SimEngine
from coral.messages.fleet import (
    DrainOrder,
    EngineFault,
    InstanceDrained,
    KillNode,
    LoadStage,
    ReleaseNode,
    ServeInstance,
    StageLoaded,
    WorkerHeartbeat,
)
from coral.messages.mesh import MeshTiming
from coral.messages.requests import Completions, Dispatch, WorkItem
from coral.perf import PerfModel
from coral.store import TemplateStore
from coral.templates import Template

from ..mesh.helpers import World
from .fake import FakeContext, attach, envelope

REGION = "aws-us-east-1"


def _template(world: World) -> Template:
    with TemplateStore(world.store, readonly=True) as store:
        tpls = [t for t in store.query(model="llama-3.1-8b") if t.mode == "aggregated" and t.shape.mean_in == 512]
    # one node, the quickest prompt pass: the tests' timings (work in flight by t=3) rest on it, not on an id
    return min(tpls, key=lambda t: (len(t.nodes), sum(s.prefill_s for s in t.stages), t.id))


class BreakingEngine(SimEngine):
    """The simulated engine whose server can die (as a real one's process may): ``reason`` set."""

    def __init__(self, perf: PerfModel) -> None:
        super().__init__(perf)
        self.reason = ""
        self.stopped = False

    @property
    def fault(self) -> str:
        return self.reason

    def stop(self, now: float) -> int:
        self.stopped = True
        return super().stop(now)


async def _worker(world: World, engine: SimEngine | None = None) -> tuple[StageWorker, FakeContext, list[str]]:
    tpl = _template(world)
    deps = {d.name: d for d in world.scenario("mesh-steady").deployments}
    exits: list[str] = []
    eng = engine or SimEngine(world.perf)
    w = StageWorker("n1", region=REGION, node_type=tpl.nodes[0], timing=MeshTiming(), engine=eng,
                    templates={tpl.id: tpl}, deployments=deps, on_exit=exits.append)  # fmt: skip
    ctx = await attach(w)
    await w.handle(envelope(LoadStage("i1", "chat-8b", tpl.id, 0, REGION, head=True, warm=True), source="supervisor"))
    return w, ctx, exits


def _items(ids: range, t: float, step: float = 0.0) -> tuple[WorkItem, ...]:
    """Requests that arrive, and may start, at t, t + step, t + 2 step, ..."""
    return tuple(WorkItem(i, "chat-8b", t + k * step, t + k * step, 400, 50) for k, i in enumerate(ids))


async def test_a_worker_loads_reports_serves_and_sends_completions_to_the_router(world: World) -> None:
    w, ctx, _ = await _worker(world)
    assert w.name == worker_name("n1")
    await ctx.run_until(1.0)
    sent, _ = ctx.take()
    assert [(d, type(m)) for d, m in sent] == [("supervisor", StageLoaded), ("supervisor", WorkerHeartbeat)]
    assert sent[0][1] == StageLoaded("n1", "i1", 1.0, "")
    await w.handle(envelope(ServeInstance("i1"), source="supervisor"))
    await w.handle(envelope(Dispatch("i1", _items(range(5), 1.5)), source="router"))
    await w.handle(envelope(Dispatch("other", _items(range(5, 9), 1.5)), source="router"))  # not its instance
    await ctx.run_until(120.0)
    done = [o for d, m in ctx.sent if d == "router" and isinstance(m, Completions) for o in m.outcomes]
    assert sorted(o.id for o in done) == list(range(5)) and {o.kind for o in done} == {"done"}
    beats = [m for d, m in ctx.sent if isinstance(m, WorkerHeartbeat)]
    assert [b.at for b in beats] == [float(t) for t in range(6, 121, 5)]  # every heartbeat_s
    assert {b.state for b in beats} == {"serving"}


async def test_a_drain_hands_back_unstarted_work_then_reports_drained_and_a_release_ends_it(world: World) -> None:
    w, ctx, exits = await _worker(world)
    await ctx.run_until(1.0)  # the stage loaded (a dispatch for an instance it does not hold yet is dropped)
    await w.handle(envelope(ServeInstance("i1")))
    await w.handle(
        envelope(Dispatch("i1", _items(range(10), 1.0) + _items(range(10, 100), 10.0, 0.5)), source="router")
    )
    await ctx.run_until(3.0)
    ctx.take()
    await w.handle(envelope(DrainOrder("i1", "plan 2"), source="supervisor"))
    await ctx.run_until(4.0)
    sent, _ = ctx.take()
    back = [o for d, m in sent if d == "router" and isinstance(m, Completions) for o in m.outcomes]
    assert sorted(o.id for o in back) == list(range(10, 100)) and {o.kind for o in back} == {"returned"}
    await ctx.run_until(600.0)
    done = [o for d, m in ctx.sent if d == "router" and isinstance(m, Completions) for o in m.outcomes]
    assert sorted(o.id for o in done) == list(range(10)) and {o.kind for o in done} == {"done"}
    drained = [m for d, m in ctx.sent if isinstance(m, InstanceDrained)]
    assert drained == [InstanceDrained("i1", "n1", drained[0].at)]
    assert exits == []
    await w.handle(envelope(ReleaseNode("n1", "drained"), source="supervisor"))
    ctx.take()
    await ctx.run_until(700.0)
    assert exits == [w.name] and ctx.take() == ([], [])  # ended between ticks, silent from then on


async def test_a_killed_node_falls_silent_and_a_wedged_one_stays_connected(world: World) -> None:
    w, ctx, exits = await _worker(world)
    await ctx.run_until(1.0)
    await w.handle(envelope(KillNode("n1", "node_loss"), source="cloud"))
    ctx.take()
    await ctx.run_until(30.0)
    assert ctx.take() == ([], []) and exits == [w.name]

    w, ctx, exits = await _worker(world)
    await ctx.run_until(1.0)
    await w.handle(envelope(KillNode("n1", "hang"), source="cloud"))
    await w.handle(envelope(ServeInstance("i1")))  # wedged: taken and ignored
    ctx.take()
    await ctx.run_until(30.0)
    assert ctx.take() == ([], []) and exits == [] and w.state == "hung"


async def test_an_engine_that_breaks_is_reported_to_the_supervisor_and_stopped(world: World) -> None:
    engine = BreakingEngine(world.perf)
    w, ctx, exits = await _worker(world, engine)
    await w.handle(envelope(ServeInstance("i1")))
    await ctx.run_until(3.5)
    assert not [m for _, m in ctx.sent if isinstance(m, EngineFault)]
    engine.reason = "server exited with code 1"
    await ctx.run_until(5.0)
    faults = [(d, m) for d, m in ctx.sent if isinstance(m, EngineFault)]
    assert faults == [("supervisor", EngineFault("n1", "i1", 4.0, "server exited with code 1"))]
    assert engine.stopped and w.state == "dead"
    await ctx.run_until(6.0)
    assert exits == [w.name]


async def test_the_router_hears_how_many_requests_the_engine_has_not_started(world: World) -> None:
    """More requests than the instance can start at once: its reports say how many wait in it, and a report
    goes out when only that number changed; when all are done, none waits."""
    w, ctx, _ = await _worker(world)
    await ctx.run_until(1.0)
    await w.handle(envelope(ServeInstance("i1"), source="supervisor"))
    await w.handle(envelope(Dispatch("i1", _items(range(600), 1.5)), source="router"))
    await ctx.run_until(2.0)
    reports = [m for d, m in ctx.sent if d == "router" and isinstance(m, Completions)]
    assert reports and reports[-1].waiting > 0
    assert reports[-1].waiting == w.engine.metrics().queued
    await ctx.run_until(1200.0)
    reports = [m for d, m in ctx.sent if d == "router" and isinstance(m, Completions)]
    assert reports[-1].waiting == 0
    assert any(not m.outcomes for m in reports)  # a change of the count alone was reported
