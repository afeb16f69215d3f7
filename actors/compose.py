"""Composition: the actors of one run wired from a ``MeshSetup``, and the driver that runs them.

``CoralMesh`` spawns the price watcher, the demand monitor, the allocator, the router and the supervisor
(which spawns a stage worker per node as the cloud delivers nodes). ``drive`` moves the mesh's virtual
clock from tick to tick and delivers each external input at its time after every actor went idle; with
``pace`` it keeps the virtual clock at most ``pace`` times faster than the wall clock (``coral up``), and
forwards commands that reached the ``operator`` gateway at those quiet points; a ``SetSpeed`` there
changes the pace from the clock's time then (the request is journaled; a replay, unpaced, skips it).
Paced, it also stops at every deadline between ticks (a prompt actor's wake, ``actors.base``) at its own
wall time (behind the pace, it takes those up to the paced time in one step, as unpaced), and an input
that arrives in wall time (the mesh's doorbell: an HTTP request at the gateway) makes it step at once to
the paced time of that arrival, where ``on_step`` delivers it: nothing waits for the next tick. Unpaced,
the clock still stops at each of those deadlines inside ``VirtualClock.advance_to``: the same decisions.
A live run's plan answers (``actors.allocator.Answers``) are such inputs too: the driver delivers each
when it came (paced) or holds the clock at the plan's start until it comes (unpaced).
Because every decision depends only on the inputs and their kernel times (see ``actors.base``), a run
recorded to a journal replays exactly (``actors.replay``); a live run is the same computation, paced.

``run_mesh`` is the whole run: the kernel (``Mesh`` with a ``VirtualClock``), the actors, an optional
journal, a watcher that keeps the latest plan, fleet and traffic reports (``actors.watch.RunState``),
the operator desk (``actors.operator.OperatorDesk``), and the end of the run (``mesh.end``; a run stopped
early first ends its traffic, ``finish_traffic``). The run's
set-up (options, templates, ``MeshSetup``) is ``actors.setup``; its names are re-exported here for the
callers that import them from this module.
"""

from __future__ import annotations

import gc
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

import anyio
import anyio.abc
import attrs

from actors.allocator import Allocator, Answers
from actors.cloud import CloudProvider, SimCloud, StaticHosts
from actors.demand import DemandMonitor
from actors.feed import MARKET_SOURCE, TRAFFIC_SOURCE, Feed, Input, ListFeed, ScenarioFeed
from actors.hosts import HostRegistry, RegisteredHosts
from actors.inspect import answer as answer_inspection
from actors.inspect import clock_info
from actors.operator import OperatorDesk
from actors.price import HostsMarket, MarketSource, PriceWatcher, ScenarioMarket
from actors.recovery import Recovery
from actors.router import Router
from actors.setup import RunOptions, catalog_digest, library_for, make_setup, world_of
from actors.supervisor import Supervisor
from actors.watch import WATCH_TOPICS, RunState
from actors.worker import StageWorker, worker_name
from coral.catalog.types import Catalog
from coral.engines import Engine
from coral.engines.sim import SimEngine
from coral.errors import CoralError
from coral.kernel import (
    ActorState,
    Endpoints,
    Fsync,
    Mesh,
    RestartPolicy,
    ServerKeys,
    VirtualClock,
)
from coral.kernel.codec import DEFAULT_CODEC
from coral.messages.control import (
    ALLOCATOR,
    OPERATOR,
    ROUTER,
)
from coral.messages.hosts import HOSTS
from coral.messages.mesh import MeshEnd, MeshResumed, MeshSetup
from coral.messages.plan import SOLVER
from coral.messages.requests import ArrivalBatch, FinishTraffic
from coral.perf import PerfModel
from coral.scenario import Scenario
from coral.sim.engine import SimConfig
from coral.templates import Template
from coral.vllm.hosted import HostTable
from solvers.allocation import SolverEffort

_GONE = ("stopped", "lost")
"""Instance states whose servers no longer run."""

__all__ = [
    "MESH_SOURCE",
    "WATCH_TOPICS",
    "CoralMesh",
    "OperatorDesk",
    "ResumeFeed",
    "RunOptions",
    "RunResult",
    "RunState",
    "catalog_digest",
    "deliver",
    "drive",
    "library_for",
    "make_setup",
    "run_mesh",
    "world_of",
]

MESH_SOURCE = "mesh"
WORKER_POLICY = RestartPolicy(max_restarts=3, window=60.0)


class CoralMesh:
    """The actors of one run (see the module docstring)."""

    def __init__(
        self,
        setup: MeshSetup,
        scenario: Scenario,
        catalog: Catalog,
        perf: PerfModel,
        *,
        efforts: Mapping[int, SolverEffort] | None = None,
        engine_factory: Callable[[str], Engine] | None = None,
        provider_state: str | os.PathLike[str] | None = None,
        resume: Recovery | None = None,
        unknown_nodes: str = "release",
        host_table: HostTable | None = None,
        landing: str | None = None,
        solver_nice: int = 0,
    ) -> None:
        self.setup = setup
        self.solver_nice = solver_nice
        """How much the allocator's solver process lowers its CPU priority (``SolverProcess``)."""
        self.answers = Answers() if landing is None and not setup.deterministic else None
        """A live run's plan answers (``actors.allocator``); None in a replay and a deterministic run."""
        self.landing = landing if landing is not None else "answer" if self.answers is not None else "deadline"
        self.host_table = host_table
        self.resume = resume
        self.unknown_nodes = unknown_nodes
        self.resumed: MeshResumed | None = None
        self.scenario = scenario
        self.catalog = catalog
        self.perf = perf
        self.timing = setup.timing
        self.efforts = dict(efforts or {})
        self.templates = {t.id: t for t in setup.templates}
        self.deployments = {d.name: d for d in scenario.deployments}
        self.library: dict[str, list[Template]] = {
            d.name: [t for t in setup.templates if t.model == d.model and t.shape == d.shape]
            for d in scenario.deployments
        }
        cfg = SimConfig(startup_s=setup.cloud.startup_s)
        self.engine_factory = engine_factory or (lambda _node: SimEngine(perf, config=cfg))
        self.cloud: CloudProvider
        self.market: MarketSource
        cloud: StaticHosts | SimCloud
        if setup.cloud.kind == "hosts" and host_table is not None:  # hosts whose `coral worker` registered
            cloud = RegisteredHosts(setup.cloud.hosts, host_table, seed=setup.seed, state_file=provider_state)
            self.market = HostsMarket(scenario, catalog, setup.cloud.hosts)
        elif setup.cloud.kind == "hosts":
            cloud = StaticHosts(setup.cloud.hosts, seed=setup.seed, state_file=provider_state)
            self.market = HostsMarket(scenario, catalog, setup.cloud.hosts)
        else:
            cloud = SimCloud(provision_s=setup.cloud.provision_s, seed=setup.seed, state_file=provider_state)
            self.market = ScenarioMarket(scenario, catalog)
        if resume is not None:
            if provider_state is None:
                raise CoralError("resume: needs the provider's state file (JOURNAL.cloud.json)")
            cloud.load_state(provider_state)
        self.cloud = cloud
        self.start_time = -setup.timing.warmup_s if resume is None else resume.resume_at(setup.timing.tick_s)
        self.end_time = setup.duration_s + setup.timing.drain_s + 3 * setup.timing.tick_s
        self.mesh: Mesh | None = None
        self.exiting: list[str] = []
        self.workers: dict[str, str] = {}  # node id -> the name of its current stage worker
        self.allocator: Allocator | None = None
        self.router: Router | None = None
        self.supervisor: Supervisor | None = None

    def clock(self) -> VirtualClock:
        """A fresh virtual clock at the run's start (the warm-up before the scenario's time 0)."""
        return VirtualClock(start=self.start_time)

    def feed(self) -> Feed:
        """The scenario's external inputs (on resume: from the resume instant, less what was delivered)."""
        inner = ScenarioFeed(
            self.scenario,
            self.catalog,
            seed=self.setup.seed,
            timing=self.timing,
            start=-self.timing.warmup_s,
            end=self.setup.duration_s,
            market=self.market,
        )
        if self.resume is None:
            return inner
        return ResumeFeed(inner, self.resume, self.start_time)

    async def start(self, mesh: Mesh) -> None:
        """Publish the setup record (on resume: ``mesh.resumed``) and spawn the actors."""
        self.mesh = mesh
        if self.resume is None:
            mesh.publish(self.setup, source=MESH_SOURCE)
        t = self.timing
        sc = self.scenario
        prior = {d.name: d.demand.at(0.0) for d in sc.deployments}
        rs = self.resume
        if self.host_table is not None and isinstance(self.cloud, RegisteredHosts):
            self.host_table.send = lambda dest, msg: mesh.send(dest, msg, source=HOSTS)
            self.host_table.locate = self.cloud.locate
            await mesh.spawn(HostRegistry(self.host_table, self.catalog, self.cloud.hosts))
        if rs is not None and rs.fleet.demand is not None:
            prior = {**prior, **rs.fleet.demand.demand}
        await mesh.spawn(PriceWatcher(tick_s=t.tick_s))
        await mesh.spawn(
            DemandMonitor(
                tick_s=t.tick_s,
                deployments=[d.name for d in sc.deployments],
                prior=prior,
                tuning=self.setup.demand,
                start=self.start_time,
            )
        )
        self.allocator = Allocator(
            tick_s=t.tick_s,
            scenario=sc,
            catalog=self.catalog,
            perf=self.perf,
            library=self.library,
            policy=self.setup.policy,
            deadline_s=self.setup.deadline_s,
            deterministic=self.setup.deterministic,
            efforts=self.efforts,
            prior_demand=prior,
            columns=self.setup.columns,
            inspector=answer_inspection,
            landing=self.landing,
            answers=self.answers,
            solver_nice=self.solver_nice,
        )
        if rs is not None and rs.fleet.plan is not None:
            self.allocator.seq = rs.fleet.plan.plan.seq
            self.allocator.last_plan = rs.fleet.plan.plan
            self.allocator.last_plan_at = rs.fleet.plan.plan.at
        await mesh.spawn(self.allocator)
        self.router = Router(
            timing=t,
            deployments=sc.deployments,
            seed=self.setup.seed,
            kv_need={k: v.kv_min_nic for k, v in self.templates.items() if v.mode == "decode"},
        )
        await mesh.spawn(self.router)
        self.supervisor = Supervisor(
            timing=t,
            cloud=self.cloud,
            templates=self.templates,
            deployments=self.deployments,
            catalog=self.catalog,
            spawn_worker=self.spawn_worker,
            warm_start=self.setup.warm_start,
            terminate=self.terminate,
        )
        if rs is not None:
            done = self.supervisor.restore(rs.fleet, self.start_time, unknown=self.unknown_nodes)
            self.resumed = MeshResumed(
                self.start_time,
                rs.fleet.last_seq,
                tuple(done.adopted),
                tuple(done.released),
                tuple(done.lost),
                len(rs.fleet.ledger.open),
                rs.torn.dropped_bytes if rs.torn is not None else 0,
            )
            mesh.publish(self.resumed, source=MESH_SOURCE)
        if self.host_table is not None:  # servers that registered workers still run for instances not kept stop
            sup = self.supervisor
            self.host_table.keep(lambda iid: iid in sup.instances and sup.instances[iid].state not in _GONE)
        await mesh.spawn(self.supervisor)

    async def spawn_worker(self, node_id: str, region: str, node_type: str) -> str:
        """Start a node's stage worker; return its name (``worker-NODE``, or ``worker-NODE.K`` for the
        K-th rental of a node id a provider reuses, as static hosts do)."""
        assert self.mesh is not None
        base = name = worker_name(node_id)
        k = 1
        while name in self.mesh.actors:
            k += 1
            name = f"{base}.{k}"
        self.workers[node_id] = name
        worker = StageWorker(
            node_id,
            region=region,
            node_type=node_type,
            timing=self.timing,
            engine=self.engine_factory(node_id),
            templates=self.templates,
            deployments=self.deployments,
            on_exit=self.exiting.append,
            name=name,
        )
        await self.mesh.spawn(worker, policy=WORKER_POLICY)
        return name

    def terminate(self, node_id: str) -> None:
        """The provider ended a node's machine: its worker, if it still runs (wedged), ends at the next
        quiet point (``reap``)."""
        name = self.workers.get(node_id)
        if self.mesh is None or name is None or name in self.exiting:
            return
        handle = self.mesh.actors.get(name)
        if handle is not None and handle.state is ActorState.RUNNING:
            self.exiting.append(name)

    async def reap(self, _now: float = 0.0) -> None:
        """End the workers that exited (released or dead nodes); call only while the mesh is quiet."""
        if self.mesh is None:
            return
        names, self.exiting = self.exiting, []
        for name in names:
            handle = self.mesh.actors[name]
            if handle.state is ActorState.RUNNING:
                handle.actor.ctx.bus.stop_receiving()
            await handle.wait()


class ResumeFeed:
    """A scenario feed resumed at ``at`` after a crash: the inputs due by then that the journal does not
    hold (lost in the crash) go out at ``at``, with the latest market quote and the requests open at the
    crash (resubmitted to the router) and the operator's lasting commands again (``Recovery.commands``);
    later inputs follow as usual, less any the journal already holds."""

    def __init__(self, inner: ScenarioFeed, rec: Recovery, at: float) -> None:
        self.inner = inner
        self.at = at
        self.delivered = rec.delivered
        skipped = inner.take(at)
        first: list[Input] = []
        market = [i for i in skipped if i.source == MARKET_SOURCE]
        if market:
            first.append(attrs.evolve(market[-1], at=at))
        first += [attrs.evolve(i, at=at) for i in skipped if i.source != MARKET_SOURCE and self._new(i)]
        first += [Input(at, OPERATOR, owner, cmd) for owner, cmd in rec.commands]
        reopen = rec.fleet.ledger.open
        if reopen:
            batch = ArrivalBatch(min(r.t for r in reopen), max(r.t for r in reopen), reopen, resubmitted=True)
            first.append(Input(at, TRAFFIC_SOURCE, ROUTER, batch))
        self.first = first

    def _new(self, i: Input) -> bool:
        tag, body = DEFAULT_CODEC.encode(i.msg)
        return (tag.decode(), bytes(body)) not in self.delivered

    def next_at(self) -> float | None:
        if self.first:
            return self.at
        return self.inner.next_at()

    def take(self, t: float) -> list[Input]:
        out: list[Input] = []
        if self.first and t >= self.at:
            out, self.first = self.first, []
        return out + [i for i in self.inner.take(t) if self._new(i)]


def deliver(mesh: Mesh, inputs: Sequence[Input]) -> None:
    """Send (or publish) inputs from their senders, in order."""
    for inp in inputs:
        if inp.dest is None:
            mesh.publish(inp.msg, source=inp.source)
        elif not mesh.send(inp.dest, inp.msg, source=inp.source):
            raise CoralError(f"input {type(inp.msg).__name__} at t={inp.at} could not be delivered to {inp.dest!r}")


async def drive(
    mesh: Mesh,
    feed: Feed,
    *,
    tick_s: float,
    until: float,
    pace: float | None = None,
    stop: anyio.Event | None = None,
    gateway: OperatorDesk | None = None,
    on_step: Callable[[float], Awaitable[None] | None] | None = None,
    after_step: Callable[[float], Awaitable[None]] | None = None,
    answers: Answers | None = None,
) -> tuple[float, str]:
    """Run the mesh's virtual clock to ``until`` (see the module docstring); return (end time, reason).
    The operator desk, if any, relays results and answers inquiries meanwhile (``OperatorDesk.relay``).
    ``answers``: the plan answers of a live run, delivered to the allocator at the first quiet point after
    they came (paced: the doorbell makes it step there); unpaced, the clock stands at the instant a plan
    started until its answer came (``actors.allocator``)."""
    if gateway is None and pace is None:  # it never waits for input: nothing can pace it
        return await _drive(mesh, feed, tick_s, until, pace, stop, gateway, on_step, after_step, answers, None)
    inputs = PaceWaiter(mesh, gateway, stop)
    async with anyio.create_task_group() as tg:
        if gateway is not None:
            tg.start_soon(gateway.relay, mesh)
        inputs.watch(tg)
        out = await _drive(mesh, feed, tick_s, until, pace, stop, gateway, on_step, after_step, answers, inputs)
        tg.cancel_scope.cancel()
    return out


async def _drive(
    mesh: Mesh,
    feed: Feed,
    tick_s: float,
    until: float,
    pace: float | None,
    stop: anyio.Event | None,
    gateway: OperatorDesk | None,
    on_step: Callable[[float], Awaitable[None] | None] | None,
    after_step: Callable[[float], Awaitable[None]] | None,
    answers: Answers | None,
    inputs: PaceWaiter | None,
) -> tuple[float, str]:
    clock = mesh.clock
    if not isinstance(clock, VirtualClock):
        raise CoralError(f"drive: needs a mesh on a VirtualClock, got {type(clock).__name__}")
    wall0, v0 = time.monotonic(), clock.now()

    async def land() -> None:
        """Deliver the plan answers that came (unpaced: first wait for those still in flight)."""
        assert answers is not None
        if pace is None:
            await answers.wait(stop)
        got = answers.take()
        if got:
            deliver(mesh, [Input(clock.now(), SOLVER, ALLOCATOR, a) for a in got])
            await mesh.quiesce()

    lander = land if answers is not None else None
    if gateway is not None:
        gateway.pace = (pace, wall0, v0)
    await mesh.quiesce()
    while True:
        now = clock.now()
        if stop is not None and stop.is_set():
            return now, "stopped"
        if now >= until:
            return now, "end of scenario"
        nxt = min(until, math.floor(now / tick_s) * tick_s + tick_s)
        fa = feed.next_at()
        if fa is not None and now < fa < nxt:
            nxt = fa
        if pace is not None:
            wake = clock.next_deadline()  # an actor's wake between ticks: step there at its wall time
            if wake is not None and now < wake < nxt:
                # behind the pace, the wakes up to the paced time go in one step (``advance_to`` stops at each)
                nxt = max(wake, min(nxt, v0 + (time.monotonic() - wall0) * pace))
        while pace is not None and not (stop is not None and stop.is_set()):
            left = wall0 + (nxt - v0) / pace - time.monotonic()
            if left <= 0:
                break
            assert inputs is not None
            held, rang = await inputs.wait(left)
            if gateway is not None and held:
                await gateway.pump(mesh)
                if gateway.speeds:  # the operator changed the pace: it counts from here
                    pace, wall0, v0 = _repace(gateway, clock.now())
            if rang and pace is not None:  # an input arrived in wall time: it enters now, at the paced time
                nxt = min(nxt, max(now, v0 + (time.monotonic() - wall0) * pace))
                break
        if stop is not None and stop.is_set():
            continue
        if gateway is not None:
            await gateway.pump(mesh)
            if gateway.speeds:
                pace, wall0, v0 = _repace(gateway, clock.now())
        if gateway is not None and gateway.forwarded:
            gateway.forwarded = 0
            await mesh.quiesce()
        await _step(mesh, clock, feed, nxt, lander)
        if after_step is not None:
            await after_step(nxt)
        if on_step is not None:  # it may send: settle before the clock moves on
            res = on_step(nxt)
            if res is not None:
                await res
            await mesh.quiesce()


def _repace(desk: OperatorDesk, now: float) -> tuple[float | None, float, float]:
    """Apply the latest speed the operator asked for (``SetSpeed``) from kernel time ``now`` on: the new
    (pace, wall time, kernel time) origin, also given to the desk for ``ClockRequest``. The lag behind the
    old pace is forgotten: the new speed counts from where the clock is."""
    pace = desk.speeds[-1]
    desk.speeds.clear()
    desk.pace = (pace, time.monotonic(), now)
    return desk.pace


class PaceWaiter:
    """What a paced driver waits for between its steps: a command held by the operator desk, the mesh's
    doorbell, ``stop``. A watcher task per source runs for the whole drive (``watch``) and sets one wake
    event, so that a wait is a single event wait (a task group per wait cost some 370 us, 3-4 s a run)."""

    def __init__(self, mesh: Mesh, desk: OperatorDesk | None, stop: anyio.Event | None) -> None:
        self.mesh = mesh
        self.desk = desk
        self.stop = stop
        self.held = False
        """A command reached the desk since the last ``wait`` returned."""
        self.rang = False
        """The doorbell rang since the last ``wait`` returned."""
        self.wake = anyio.Event()

    def watch(self, tg: anyio.abc.TaskGroup) -> None:
        """Start the watchers in ``tg`` (they run until it is cancelled)."""
        if self.desk is not None:
            tg.start_soon(self._desk, self.desk)
        if self.stop is not None:
            tg.start_soon(self._stop, self.stop)
        tg.start_soon(self._bell)

    async def _desk(self, desk: OperatorDesk) -> None:
        while True:
            await desk.waiting.wait()
            desk.waiting = anyio.Event()
            self.held = True
            self.wake.set()

    async def _bell(self) -> None:
        while True:
            await self.mesh.rung()
            self.rang = True
            self.wake.set()

    async def _stop(self, stop: anyio.Event) -> None:
        await stop.wait()
        self.wake.set()

    async def wait(self, timeout: float) -> tuple[bool, bool]:
        """Wait at most ``timeout`` wall seconds for the first of: a command held by the operator desk
        (first True), the doorbell (second True), ``stop``; what came before the call counts at once."""
        held = self.desk is not None and bool(self.desk.held)
        if not (held or self.held or self.rang or (self.stop is not None and self.stop.is_set())):
            with anyio.move_on_after(timeout):
                await self.wake.wait()
        held, rang = held or self.held, self.rang
        self.held = self.rang = False
        if self.wake.is_set():
            self.wake = anyio.Event()
        return held, rang


async def _step(
    mesh: Mesh, clock: VirtualClock, feed: Feed, t: float, land: Callable[[], Awaitable[None]] | None = None
) -> None:
    """Move the clock to ``t`` and deliver the inputs due then, with one quiesce per instant; ``land``
    (the driver's plan answers) runs after each of them.

    The inputs go out right after the actors' ticks at ``t`` woke, within the same settle: a message
    received while the clock reads ``t`` takes effect at the next tick whenever it arrives in that step,
    so this is the same as delivering after the ticks, at half the synchronisation cost.
    """
    delivered = False

    async def settle() -> None:
        nonlocal delivered
        if not delivered and clock.now() >= t:
            delivered = True
            deliver(mesh, feed.take(t))
        await mesh.quiesce()
        if land is not None:
            await land()

    await clock.advance_to(t, settle=settle)
    if not delivered:
        inputs = feed.take(t)
        if inputs:
            deliver(mesh, inputs)
            await mesh.quiesce()
    if land is not None:
        await land()


async def finish_traffic(mesh: Mesh, at: float, tick_s: float) -> float:
    """End the traffic of a run stopped at ``at`` (``--for``, a signal, the UI): ``req.finish`` goes to the
    router at the next tick, as at the scenario's end, and the router fails what is still open as
    ``unfinished`` at the tick after, so that every request ends completed or failed with a reason (a replay
    reads the input from the journal and does the same). Returns the time the run ends at."""
    clock = mesh.clock
    assert isinstance(clock, VirtualClock)
    nxt = math.floor(at / tick_s) * tick_s + tick_s
    await _step(mesh, clock, ListFeed([Input(nxt, TRAFFIC_SOURCE, ROUTER, FinishTraffic(nxt))]), nxt)
    await _step(mesh, clock, ListFeed([]), nxt + tick_s)
    return nxt + tick_s


@attrs.frozen
class RunResult:
    """How a run ended and what the watcher saw last."""

    end: float
    reason: str
    state: RunState
    wall_s: float
    endpoints: Endpoints | None = None
    resumed: MeshResumed | None = None


async def run_mesh(
    setup: MeshSetup,
    scenario: Scenario,
    catalog: Catalog,
    perf: PerfModel,
    *,
    journal: str | os.PathLike[str] | None = None,
    endpoints: Endpoints | None = None,
    feed: Feed | None = None,
    until: float | None = None,
    pace: float | None = None,
    stop: anyio.Event | None = None,
    gateway: bool = False,
    efforts: Mapping[int, SolverEffort] | None = None,
    state: RunState | None = None,
    on_start: Callable[[Mesh, CoralMesh], Awaitable[None]] | None = None,
    on_step: Callable[[float], Awaitable[None] | None] | None = None,
    fsync: Fsync = Fsync.BATCH,
    shutdown_timeout: float = 5.0,
    curve: ServerKeys | None = None,
    provider_state: str | os.PathLike[str] | None = None,
    resume: Recovery | None = None,
    unknown_nodes: str = "release",
    engine_factory: Callable[[str], Engine] | None = None,
    host_table: HostTable | None = None,
    landing: str | None = None,
    freeze_heap: bool = False,
    solver_nice: int = 0,
) -> RunResult:
    """Run one mesh from a setup (see the module docstring); return when the run ends or ``stop`` is set.

    ``provider_state``: the file where the cloud keeps its durable state; with ``resume`` (a crashed
    run's journal, which ``journal`` must name to append to it) the run restores it and goes on.
    ``engine_factory`` makes the stage workers' engines (default: the simulated engine); with
    ``host_table`` (and a ``hosts`` cloud) the nodes are the hosts whose ``coral worker`` registered with
    the host registry (``actors.hosts``), which the run spawns. ``landing``: None for a live run (its plans
    land on their answers, collected here, unless it is deterministic); a replay gives the journal's mode,
    whose answers come in its feed (``actors.allocator``). ``freeze_heap`` (a process that runs one mesh:
    ``coral up``): once the actors have started, the objects alive then (catalog, templates, programs,
    modules) leave the cyclic garbage collector's view (``gc.freeze``) until the run ends, so that a full
    collection scans only what the run made since, not the start-up heap (one such collection held a paced
    step for 50-90 ms). ``solver_nice``: how much the allocator's solver process lowers its CPU priority
    (``SolverProcess``; 0: the mesh's own).
    """
    frozen = False
    try:
        cm = CoralMesh(
            setup,
            scenario,
            catalog,
            perf,
            efforts=efforts,
            provider_state=provider_state,
            resume=resume,
            unknown_nodes=unknown_nodes,
            engine_factory=engine_factory,
            host_table=host_table,
            landing=landing,
            solver_nice=solver_nice,
        )
        st = state if state is not None else RunState()
        t0 = time.perf_counter()
        st.now = cm.start_time
        async with Mesh(
            clock=cm.clock(),
            journal=journal,
            endpoints=endpoints,
            fsync=fsync,
            shutdown_timeout=shutdown_timeout,
            curve=curve,
        ) as mesh:
            watch = await mesh.client("watch", subscribe=WATCH_TOPICS, inbox_size=1 << 16)
            gw = OperatorDesk(await mesh.client(OPERATOR, subscribe=OperatorDesk.TOPICS)) if gateway else None
            async with anyio.create_task_group() as tg:

                async def watcher() -> None:
                    async for env in watch:
                        st.update(env)

                tg.start_soon(watcher)
                if cm.answers is not None:
                    cm.answers.ring = mesh.ring
                    tg.start_soon(cm.answers.run)
                st.clock = mesh.clock.now
                if gw is not None:
                    desk = gw
                    st.pace = lambda: clock_info(mesh.clock.now(), desk.pace)
                await cm.start(mesh)
                if freeze_heap:
                    gc.collect()
                    gc.freeze()
                    frozen = True
                if on_start is not None:
                    await on_start(mesh, cm)

                async def stepped(t: float) -> None:
                    st.now = t
                    await cm.reap(t)

                end, reason = await drive(
                    mesh,
                    feed if feed is not None else cm.feed(),
                    tick_s=setup.timing.tick_s,
                    until=cm.end_time if until is None else until,
                    pace=pace,
                    stop=stop,
                    gateway=gw,
                    on_step=on_step,
                    after_step=stepped,
                    answers=cm.answers,
                )
                if reason == "stopped":
                    end = await finish_traffic(mesh, end, setup.timing.tick_s)
                await mesh.quiesce()
                if host_table is not None:  # stop the hosts' servers while the bus still reaches their workers
                    close = getattr(cm.engine_factory, "close", None)
                    if callable(close):
                        close()
                    await anyio.sleep(0.5)
                mesh.publish(MeshEnd(end, reason), source=MESH_SOURCE)
                await watch.sync()
                st.now = end
                tg.cancel_scope.cancel()
            eps = mesh.endpoints
        return RunResult(end, reason, st, time.perf_counter() - t0, eps, cm.resumed)
    finally:
        if frozen:
            gc.unfreeze()
