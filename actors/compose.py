"""Composition: the actors of one run wired from a ``MeshSetup``, and the driver that runs them.

``CoralMesh`` spawns the price watcher, the demand monitor, the allocator, the router and the supervisor
(which spawns a stage worker per node as the cloud delivers nodes). ``drive`` moves the mesh's virtual
clock from tick to tick and delivers each external input at its time after every actor went idle; with
``pace`` it keeps the virtual clock at most ``pace`` times faster than the wall clock (``coral up``), and
forwards commands that reached the ``operator`` gateway at those quiet points. Because every decision
depends only on the inputs and their kernel times (see ``actors.base``), a run recorded to a journal
replays exactly (``actors.replay``); a live run is the same computation, paced.

``run_mesh`` is the whole run: the kernel (``Mesh`` with a ``VirtualClock``), the actors, an optional
journal, a watcher that keeps the latest plan, fleet and traffic reports (``RunState``), the gateway,
and the end of the run (``mesh.end``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import attrs

from actors.allocator import Allocator, servable
from actors.cloud import CloudProvider, SimCloud, StaticHosts
from actors.demand import DemandMonitor
from actors.feed import MARKET_SOURCE, TRAFFIC_SOURCE, Feed, Input, ScenarioFeed
from actors.price import HostsMarket, MarketSource, PriceWatcher, ScenarioMarket
from actors.recovery import Recovery
from actors.router import Router
from actors.supervisor import Supervisor
from actors.worker import StageWorker, worker_name
from coral.catalog import load_catalog
from coral.catalog.loader import catalog_to_dict
from coral.catalog.types import Catalog
from coral.engines import Engine
from coral.engines.sim import SimEngine
from coral.errors import CoralError
from coral.kernel import (
    ActorState,
    BusClient,
    Endpoints,
    Envelope,
    Fsync,
    Mesh,
    RestartPolicy,
    ServerKeys,
    VirtualClock,
)
from coral.kernel.codec import DEFAULT_CODEC, encode
from coral.kernel.events import AuthRefused
from coral.messages.control import (
    OPERATOR,
    ROUTER,
    CommandResult,
    Snapshot,
    SnapshotRecord,
    SnapshotRequest,
    is_command,
    owner_of,
)
from coral.messages.demand import DemandUpdate
from coral.messages.fleet import FleetUpdate
from coral.messages.market import MarketUpdate
from coral.messages.mesh import CloudSetup, DemandTuning, MeshEnd, MeshResumed, MeshSetup, MeshTiming
from coral.messages.plan import NewPlan
from coral.messages.requests import ArrivalBatch, RoutingStats
from coral.perf import PerfModel, load_profiles
from coral.scenario import Scenario, load_scenario
from coral.sim.engine import SimConfig
from coral.store import TemplateStore
from coral.templates import Template
from solvers.allocation import SolverEffort
from solvers.library import distinct, is_current
from solvers.planning import POLICIES, policy_admits

MESH_SOURCE = "mesh"
WORKER_POLICY = RestartPolicy(max_restarts=3, window=60.0)


@attrs.frozen
class RunOptions:
    """How to run a scenario (everything but the scenario, templates, catalog and perf model)."""

    seed: int = 0
    policy: str = "coral"
    timing: MeshTiming = attrs.field(factory=MeshTiming)
    cloud: CloudSetup = attrs.field(factory=CloudSetup)
    demand: DemandTuning = attrs.field(factory=DemandTuning)
    warm_start: bool = True
    deterministic: bool = False
    duration_s: float | None = None
    deadline_s: float | None = None
    columns: str = "all"


def library_for(
    store: TemplateStore, scenario: Scenario, perf_version: str | None = None, *, vllm_only: bool = False
) -> dict[str, list[Template]]:
    """Per deployment, every current stored template of its model and shape on the scenario's node types
    (any SLO; stale ones of an older formulation or, when given, another perf model are left out; one per
    multiset and SLO, ``solvers.library.distinct``);
    ``vllm_only``: only those vLLM can run as they are."""
    allowed = set(scenario.node_types)
    out: dict[str, list[Template]] = {}
    for d in scenario.deployments:
        out[d.name] = distinct(
            sorted(
                (
                    t
                    for t in store.query(model=d.model)
                    if t.shape == d.shape
                    and set(t.nodes) <= allowed
                    and is_current(t, perf_version)
                    and (t.vllm_ok or not vllm_only)
                ),
                key=lambda t: t.id,
            )
        )
    return out


def catalog_digest(cat: Catalog) -> str:
    """A content hash of a catalog (a replay checks that it runs on the recording's catalog)."""
    blob = json.dumps(catalog_to_dict(cat), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def make_setup(
    scenario: Scenario,
    catalog: Catalog,
    perf: PerfModel,
    library: Mapping[str, Sequence[Template]],
    options: RunOptions = RunOptions(),
    *,
    catalog_files: Sequence[str | os.PathLike[str]] = (),
    profile_files: Sequence[str | os.PathLike[str]] = (),
) -> MeshSetup:
    """The setup record of a run; checks the options and that every deployment has templates to use."""
    if options.policy not in POLICIES:
        raise CoralError(f"policy: unknown {options.policy!r}; choose from {', '.join(POLICIES)}")
    if not isinstance(options.seed, int) or options.seed < 0:
        raise CoralError(f"seed: must be an integer >= 0, got {options.seed!r}")
    timing = options.timing.check()
    cloud = options.cloud.check()
    demand = options.demand.check()
    duration = scenario.duration_s if options.duration_s is None else options.duration_s
    if not (duration > 0 and math.isfinite(duration)):
        raise CoralError(f"duration_s: must be a positive number of seconds, got {duration!r}")
    if options.columns not in ("all", "generated"):
        raise CoralError(f"columns: must be 'all' or 'generated', got {options.columns!r}")
    deadline = scenario.planner.deadline_s if options.deadline_s is None else options.deadline_s
    if not deadline > 0:
        raise CoralError(f"deadline_s: must be positive, got {deadline!r}")
    for d in scenario.deployments:
        tpls = [t for t in library.get(d.name, ()) if t.slo == d.slo and policy_admits(options.policy, t)]
        if not servable(tpls):
            raise CoralError(
                f"deployment {d.name!r} (model {d.model}) has no templates that can serve it under policy "
                f"{options.policy!r}; run `coral templates build --scenario {scenario.path}`"
            )
    seen: dict[str, Template] = {}
    for ts in library.values():
        for t in ts:
            seen.setdefault(t.id, t)
    return MeshSetup(
        scenario_name=scenario.name,
        scenario_path=str(scenario.path),
        scenario_toml=Path(scenario.path).read_text() if Path(scenario.path).exists() else "",
        seed=options.seed,
        policy=options.policy,
        duration_s=float(duration),
        deadline_s=float(deadline),
        timing=timing,
        cloud=cloud,
        demand=demand,
        warm_start=options.warm_start,
        deterministic=options.deterministic,
        catalog_files=tuple(str(p) for p in catalog_files),
        profile_files=tuple(str(p) for p in profile_files),
        catalog_digest=catalog_digest(catalog),
        perf_version=perf.version,
        templates=tuple(seen[k] for k in sorted(seen)),
        columns=options.columns,
    )


def world_of(setup: MeshSetup) -> tuple[Scenario, Catalog, PerfModel]:
    """The scenario, catalog and perf model a setup was recorded with (checked by digest and version)."""
    cat = load_catalog(list(setup.catalog_files))
    digest = catalog_digest(cat)
    if digest != setup.catalog_digest:
        raise CoralError(
            f"the catalog differs from the recording's (digest {digest}, recorded {setup.catalog_digest}); "
            "a replay on another catalog would not reproduce the decisions"
        )
    perf = PerfModel(cat, [t for p in setup.profile_files for t in load_profiles(Path(p))])
    if perf.version != setup.perf_version:
        raise CoralError(f"the perf model is {perf.version}, the recording used {setup.perf_version}")
    path = Path(setup.scenario_path)
    if path.exists() and path.read_text() == setup.scenario_toml:
        return load_scenario(str(path), cat), cat, perf
    if not setup.scenario_toml:
        raise CoralError(f"the recording has no scenario text and {path} is not available")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / (path.name if path.suffix == ".toml" else "scenario.toml")
        p.write_text(setup.scenario_toml)
        sc = load_scenario(str(p), cat)
    return attrs.evolve(sc, path=path), cat, perf


@attrs.define
class RunState:
    """What a watcher saw: the latest plan, fleet, demand, market and traffic reports."""

    plan: NewPlan | None = None
    plans: int = 0
    fleet: FleetUpdate | None = None
    demand: DemandUpdate | None = None
    market: MarketUpdate | None = None
    stats: RoutingStats | None = None
    results: list[CommandResult] = attrs.field(factory=list)
    crashes: int = 0
    errors: int = 0
    now: float = 0.0
    refused: list[AuthRefused] = attrs.field(factory=list)
    """Every refused connection report, in order (repeats of one peer come merged, with a count)."""

    def refusals(self) -> list[dict[str, Any]]:
        """Refused connections per peer: address, mechanism, key, the latest reason and the total count."""
        per: dict[tuple[str, str, str], dict[str, Any]] = {}
        for r in self.refused:
            row = per.setdefault((r.address, r.mechanism, r.key), {"address": r.address, "mechanism": r.mechanism,
                                                                   "key": r.key, "count": 0})  # fmt: skip
            row["reason"] = r.reason
            row["count"] += r.count
        return list(per.values())

    def update(self, env: Envelope) -> None:
        msg = env.msg
        if isinstance(msg, NewPlan):
            self.plan = msg
            self.plans += 1
        elif isinstance(msg, FleetUpdate):
            self.fleet = msg
        elif isinstance(msg, DemandUpdate):
            self.demand = msg
        elif isinstance(msg, MarketUpdate):
            self.market = msg
        elif isinstance(msg, RoutingStats):
            self.stats = msg
        elif isinstance(msg, CommandResult):
            self.results.append(msg)
        elif isinstance(msg, AuthRefused):
            self.refused.append(msg)
        elif env.tag == "kernel.actor.crashed":
            self.crashes += 1
        elif env.tag == "kernel.error":
            self.errors += 1


WATCH_TOPICS = (
    "plan.new",
    "fleet.update",
    "dem.update",
    "mkt.update",
    "req.stats",
    "ctl.result",
    "kernel.actor.",
    "kernel.error",
    "kernel.auth.",
)


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
    ) -> None:
        self.setup = setup
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
        if setup.cloud.kind == "hosts":
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
        )
        if rs is not None and rs.fleet.plan is not None:
            self.allocator.seq = rs.fleet.plan.plan.seq
            self.allocator.last_plan = rs.fleet.plan.plan
            self.allocator.last_plan_at = rs.fleet.plan.plan.at
        await mesh.spawn(self.allocator)
        self.router = Router(timing=t, deployments=sc.deployments, seed=self.setup.seed)
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


SNAPSHOT_TOPICS = ("mesh.setup", "ctl.alloc_state", "mkt.update", "dem.update", "fleet.update", "req.stats")
"""Tags whose latest message is the run's current state, in the order a ``Snapshot`` gives them."""
SNAPSHOT_PLANS = 20
"""How many of the latest plans a ``Snapshot`` carries."""


class Gateway:
    """The ``operator`` client: forwards commands to their owners at quiet points, relays the results, and
    answers ``SnapshotRequest`` with the latest state it has seen published (for clients attaching late)."""

    TOPICS = ("ctl.result", "plan.new", *SNAPSHOT_TOPICS)
    """What the gateway subscribes to."""

    def __init__(self, bus: BusClient) -> None:
        self.bus = bus
        self.pending: dict[int, Envelope] = {}
        self.next_ref = 0
        self.forwarded = 0
        self.latest: dict[str, Envelope] = {}
        self.plans: deque[Envelope] = deque(maxlen=SNAPSHOT_PLANS)

    async def pump(self, mesh: Mesh) -> None:
        """Handle everything queued now."""
        while self.bus.backlog:
            await self.handle(mesh, self.bus.receive_nowait())

    def snapshot(self, at: float) -> Snapshot:
        """The latest state seen: one record per ``SNAPSHOT_TOPICS`` tag, then the recent plans."""
        envs = [*(self.latest[t] for t in SNAPSHOT_TOPICS if t in self.latest), *self.plans]
        return Snapshot(at, tuple(SnapshotRecord(e.source, e.tag, encode(e.msg)[1]) for e in envs))

    async def handle(self, mesh: Mesh, env: Envelope) -> None:
        """Forward a command (the mesh must be quiet), relay a result to the command's sender, keep a
        published state message, or answer a snapshot request."""
        msg = env.msg
        if isinstance(msg, CommandResult):
            orig = self.pending.pop(msg.ref, None)
            if orig is not None:
                await self.bus.reply(orig, msg)
            return
        if env.kind == "publish":
            if env.tag == "plan.new":
                self.plans.append(env)
            elif env.tag in SNAPSHOT_TOPICS:
                self.latest[env.tag] = env  # encoded only when a snapshot is asked for
            return
        if env.kind not in ("send", "request"):
            return
        if isinstance(msg, SnapshotRequest):
            if env.kind == "request":
                await self.bus.reply(env, self.snapshot(mesh.clock.now()))
            return
        if not is_command(msg):
            if env.kind == "request":
                reason = f"{env.tag} is not a control command"
                await self.bus.reply(env, CommandResult(env.tag, False, OPERATOR, mesh.clock.now(), "command", reason))
            return
        self.next_ref -= 1  # negative refs: never one a direct sender picks
        if env.kind == "request":
            self.pending[self.next_ref] = env
        mesh.send(owner_of(msg), attrs.evolve(msg, ref=self.next_ref), source=OPERATOR)
        self.forwarded += 1


async def drive(
    mesh: Mesh,
    feed: Feed,
    *,
    tick_s: float,
    until: float,
    pace: float | None = None,
    stop: anyio.Event | None = None,
    gateway: Gateway | None = None,
    on_step: Callable[[float], Awaitable[None] | None] | None = None,
    after_step: Callable[[float], Awaitable[None]] | None = None,
) -> tuple[float, str]:
    """Run the mesh's virtual clock to ``until`` (see the module docstring); return (end time, reason)."""
    clock = mesh.clock
    if not isinstance(clock, VirtualClock):
        raise CoralError(f"drive: needs a mesh on a VirtualClock, got {type(clock).__name__}")
    wall0, v0 = time.monotonic(), clock.now()
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
            due = wall0 + (nxt - v0) / pace
            while (left := due - time.monotonic()) > 0 and not (stop is not None and stop.is_set()):
                env = None
                with anyio.move_on_after(left):
                    if gateway is not None:
                        env = await gateway.bus.receive()
                    elif stop is not None:
                        await stop.wait()
                    else:
                        await anyio.sleep(left)
                if gateway is not None and env is not None:
                    await gateway.handle(mesh, env)
            if stop is not None and stop.is_set():
                continue
        if gateway is not None:
            await gateway.pump(mesh)
        if gateway is not None and gateway.forwarded:
            gateway.forwarded = 0
            await mesh.quiesce()
        await _step(mesh, clock, feed, nxt)
        if after_step is not None:
            await after_step(nxt)
        if on_step is not None:  # it may send: settle before the clock moves on
            res = on_step(nxt)
            if res is not None:
                await res
            await mesh.quiesce()


async def _step(mesh: Mesh, clock: VirtualClock, feed: Feed, t: float) -> None:
    """Move the clock to ``t`` and deliver the inputs due then, with one quiesce per instant.

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

    await clock.advance_to(t, settle=settle)
    if not delivered:
        inputs = feed.take(t)
        if inputs:
            deliver(mesh, inputs)
            await mesh.quiesce()


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
) -> RunResult:
    """Run one mesh from a setup (see the module docstring); return when the run ends or ``stop`` is set.

    ``provider_state``: the file where the cloud keeps its durable state; with ``resume`` (a crashed
    run's journal, which ``journal`` must name to append to it) the run restores it and goes on.
    ``engine_factory`` makes the stage workers' engines (default: the simulated engine).
    """
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
        gw = Gateway(await mesh.client(OPERATOR, subscribe=Gateway.TOPICS)) if gateway else None
        async with anyio.create_task_group() as tg:

            async def watcher() -> None:
                async for env in watch:
                    st.update(env)

            tg.start_soon(watcher)
            await cm.start(mesh)
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
            )
            await mesh.quiesce()
            mesh.publish(MeshEnd(end, reason), source=MESH_SOURCE)
            await watch.sync()
            st.now = end
            tg.cancel_scope.cancel()
        eps = mesh.endpoints
    return RunResult(end, reason, st, time.perf_counter() - t0, eps, cm.resumed)
