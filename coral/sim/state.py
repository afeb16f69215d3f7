"""The simulator's runtime state: requests, stages, micro-batches, paths, instances and deployment groups,
and the state of one run (``SimState``: clock, event heap, fleet, market and accounts) that the batching
and fleet layers share. See ``coral.sim.engine`` for the model."""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np

from coral.demand import DemandEstimator
from coral.errors import CoralError
from coral.messages.mesh import CloudSetup, DemandTuning, MeshTiming
from coral.perf import PerfModel
from coral.plan import Plan, PlanRequest
from coral.scenario import Deployment, Scenario
from coral.sim.arrivals import (
    BLOCK,
)
from coral.sim.report import DepStats
from coral.sim.tables import StageTable
from coral.templates import SINK, SOURCE, Template

LOADING, SERVING, DRAINING, DEAD = 0, 1, 2, 3
K_STAGE, K_ARRIVAL, K_HANDOFF, K_READY, K_TICK, K_REPLAN, K_MARKET, K_FAULT, K_MONITOR, K_PLAN = range(10)

PlanFn = Callable[[PlanRequest], Plan]
_EMPTY: deque[Req] = deque()


class SimError(CoralError):
    """The simulation cannot run: bad arguments, or the planner returned an unusable plan."""


_CLOUD = CloudSetup()


@attrs.frozen
class SimConfig:
    """Simulator knobs. Lengths for deployments without a trace: ``length_dist`` around the deployment's
    shape means with CVs ``cv_in``/``cv_out``.

    A new instance's nodes are ready ``provision_s`` after the start, and its engine ``startup_s`` plus
    the slowest stage's weight load after that: the delays of the mesh's simulated cloud and engines,
    whose defaults (``coral.messages.mesh.CloudSetup``) these share; ``for_cloud`` copies a run's.

    ``monitor``: plan for the demand that the mesh's demand monitor would estimate from the simulated
    arrivals (``coral.demand``), re-planning when it moves, instead of the scenario's demand at the moment
    (the default). The monitor observes the arrivals of each ``monitor_tick_s``, as the mesh's observes
    each of the router's arrival counts (``MeshTiming.report_s``): its noise test reads those windows; its
    backlog is the router's queue. ``instance_queue_s``: the router gives an instance at most
    ``weight × (service + instance_queue_s)`` requests at once (``actors.router``, ``MeshTiming``).

    ``plan_delay_s``: a plan made at t (from the state at t) is applied at t + ``plan_delay_s``, as the
    mesh's allocator publishes it at its trigger plus the planner's deadline (``actors.allocator``; 0 when
    it solves without one); the triggers that come while a plan is in flight make one plan, made when it
    is applied. The first plan (t = 0, the fleet warm) is applied at once.
    """

    token_budget: int = 2048
    queue_limit: int = 100_000
    queue_timeout_s: float = 60.0
    provision_s: float = _CLOUD.provision_s
    startup_s: float = _CLOUD.startup_s
    monitor: DemandTuning | None = None
    monitor_tick_s: float = MeshTiming().report_s
    instance_queue_s: float = MeshTiming().instance_queue_s
    plan_delay_s: float = 0.0
    warm_start: bool = True
    drain_limit_s: float = 600.0
    length_dist: str = "lognormal"
    cv_in: float = 0.6
    cv_out: float = 1.2

    def __attrs_post_init__(self) -> None:
        if self.token_budget < 1:
            raise SimError(f"token_budget must be at least 1, got {self.token_budget}")
        if self.queue_limit < 0:
            raise SimError(f"queue_limit must not be negative, got {self.queue_limit}")
        if not self.monitor_tick_s > 0:
            raise SimError(f"monitor_tick_s must be positive, got {self.monitor_tick_s}")
        if self.monitor is not None:
            try:
                self.monitor.check()
            except CoralError as exc:
                raise SimError(f"monitor: {exc}") from exc
        for name in (
            "queue_timeout_s",
            "provision_s",
            "startup_s",
            "drain_limit_s",
            "instance_queue_s",
            "plan_delay_s",
        ):
            if not getattr(self, name) >= 0:
                raise SimError(f"{name} must not be negative, got {getattr(self, name)}")

    @classmethod
    def for_cloud(cls, cloud: CloudSetup, **knobs: Any) -> SimConfig:
        """The knobs (``knobs`` as given) with the provisioning and start-up delays of a mesh's cloud."""
        return cls(provision_s=cloud.provision_s, startup_s=cloud.startup_s, **knobs)


class Req:
    """One request in flight."""

    __slots__ = (
        "chunk",
        "deadline",
        "dep",
        "first_t",
        "g_join",
        "gen",
        "hint",
        "kv",
        "kv_ready",
        "need_pre",
        "out",
        "pre_done",
        "prompt",
        "retries",
        "s_join",
        "t_arr",
    )

    def __init__(self, dep: DepRT, t: float, prompt: int, out: int) -> None:
        self.dep = dep
        self.t_arr = t
        self.prompt = prompt
        self.out = out
        self.gen = 0
        self.first_t = -1.0
        self.kv = 0
        self.need_pre = 0
        self.pre_done = 0
        self.chunk = 0
        self.s_join = 0
        self.g_join = 0
        self.kv_ready = False
        self.hint: Inst | None = None
        self.deadline = math.inf
        self.retries = 0


class PullQ:
    """A FIFO of requests waiting for any instance of a group, plus the paths able to take work now."""

    __slots__ = ("idle", "q")

    def __init__(self) -> None:
        self.q: deque[Req] = deque()
        self.idle: dict[PathRT, None] = {}


class StageRT:
    """One running stage: its timing table, KV use and the micro-batches queued for it."""

    __slots__ = ("busy", "busy_s", "cap", "peak", "queue", "table", "used")

    def __init__(self, table: StageTable, cap: int) -> None:
        self.table = table
        self.cap = cap
        self.used = 0
        self.busy = False
        self.busy_s = 0.0
        self.peak = 0
        self.queue: deque[MB] = deque()


class MB:
    """A micro-batch of one path: its decoding and prefilling sequences and the current composition."""

    __slots__ = (
        "c_ctx",
        "c_ndec",
        "c_np",
        "c_ptok",
        "ctx_sum",
        "dead",
        "dec",
        "finish",
        "hop",
        "idle",
        "n_dec",
        "path",
        "pref",
        "ready",
        "step",
    )

    def __init__(self, path: PathRT) -> None:
        self.path = path
        self.step = 0
        self.dec: dict[Req, None] = {}
        self.n_dec = 0
        self.ctx_sum = 0
        self.finish: dict[int, list[Req]] = {}
        self.pref: deque[Req] = deque()
        self.hop = 0
        self.ready = 0.0
        self.idle = True
        self.dead = False
        self.c_ndec = self.c_np = self.c_ptok = 0
        self.c_ctx = 0.0


class PathRT:
    """A route through an instance's stages, with its micro-batches and local waiting line."""

    __slots__ = (
        "assigned",
        "back",
        "batch",
        "hops",
        "idle",
        "inst",
        "kvcap",
        "last",
        "mbs",
        "pullq",
        "stages",
        "waiting",
        "weight",
    )

    def __init__(
        self, inst: Inst, stages: list[StageRT], batch: int, weight: float, hops: list[float], back: float
    ) -> None:
        self.inst = inst
        self.stages = stages
        self.last = len(stages) - 1
        self.batch = batch
        self.weight = weight
        self.assigned = 0
        self.hops = hops
        self.back = back
        self.kvcap = min(s.cap for s in stages)
        self.waiting: deque[Req] = deque()
        self.mbs = [MB(self) for _ in stages]
        self.idle: list[MB] = list(reversed(self.mbs))
        self.pullq: PullQ = PullQ()


class Inst:
    """An instance of a template in a region, serving one deployment."""

    __slots__ = (
        "bound",
        "bridge",
        "dep",
        "id",
        "incoming",
        "key",
        "min_nic",
        "mode",
        "n_active",
        "nodes",
        "paths",
        "pq",
        "rate",
        "region",
        "retiring",
        "stages",
        "state",
        "t_ready",
        "t_up",
        "tpl",
        "weight",
    )

    def __init__(self, iid: int, dep: DepRT, tpl: Template, region: str, key: tuple[str, str, str]) -> None:
        self.id = iid
        self.dep = dep
        self.tpl = tpl
        self.region = region
        self.key = key
        self.mode = tpl.mode
        self.state = LOADING
        self.retiring = False
        self.bridge = False  # surplus to the plan, kept loading while its deployment serves too little
        self.t_ready = -1.0
        self.t_up = 0.0  # when its nodes are up (provisioned) and its engine starts loading
        self.n_active = 0
        self.incoming = 0  # KV handoffs on their way to it (a decode instance)
        self.bound = 1  # the most requests the router gives it at once (``Batching._bound``)
        self.rate = 0.0
        self.weight = 1.0
        self.min_nic = 0.0
        self.nodes: tuple[str, ...] = tpl.nodes
        self.stages: list[StageRT] = []
        self.paths: list[PathRT] = []
        self.pq = PullQ()  # its own queue (the engine's), behind the router's (``SimState.router_queues``)


class Group:
    """The serving instances of one deployment that take one kind of work, with cumulative weights."""

    __slots__ = ("cum", "insts", "pullq", "total")

    def __init__(self) -> None:
        self.insts: list[Inst] = []
        self.cum: list[float] = []
        self.total = 0.0
        self.pullq = PullQ()

    def rebuild(self) -> None:
        acc = 0.0
        self.cum = []
        for i in self.insts:
            acc += i.weight
            self.cum.append(acc)
        self.total = acc


class DepRT:
    """A deployment at run time: its entry group (aggregated or prefill instances) and decode groups."""

    __slots__ = ("d", "decode", "entry", "idx", "model", "name", "shape_in", "shape_out", "stats", "tpot", "ttft")

    def __init__(self, idx: int, d: Deployment) -> None:
        self.idx = idx
        self.d = d
        self.name = d.name
        self.model = d.model
        self.ttft = d.slo.ttft_s
        self.tpot = d.slo.tpot_s
        self.shape_in = d.shape.mean_in
        self.shape_out = d.shape.mean_out
        self.entry = Group()
        self.decode: dict[str, Group] = {}
        self.stats = DepStats(d.name, d.model)


class Uniforms:
    """Uniform draws from a numpy Generator, a block at a time."""

    __slots__ = ("buf", "i", "rng")

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.buf: list[float] = rng.random(BLOCK).tolist()
        self.i = 0

    def next(self) -> float:
        if self.i >= BLOCK:
            self.buf = self.rng.random(BLOCK).tolist()
            self.i = 0
        x = self.buf[self.i]
        self.i += 1
        return x


def template_paths(tpl: Template) -> list[tuple[list[int], float]]:
    """Decompose a template's route flows into SOURCE-to-SINK stage paths with their flows.

    A template without routes is read as one pipeline of its stages in index order.
    """
    if not tpl.routes:
        return [(list(range(len(tpl.stages))), 1.0)]
    flow: dict[int, dict[int, float]] = {}
    for r in tpl.routes:
        if r.flow > 0:
            flow.setdefault(r.src, {})[r.dst] = flow.setdefault(r.src, {}).get(r.dst, 0.0) + r.flow
    paths: list[tuple[list[int], float]] = []
    eps = 1e-9
    for _ in range(4 * len(tpl.routes) + 4):
        node, seen = SOURCE, set()
        walk: list[int] = []
        while node != SINK:
            outs = [(d, f) for d, f in sorted(flow.get(node, {}).items()) if f > eps]
            if not outs or node in seen:
                walk = []
                break
            seen.add(node)
            node = max(outs, key=lambda x: x[1])[0]
            walk.append(node)
        if not walk:
            break
        edges = list(zip([SOURCE, *walk[:-1]], walk, strict=True))
        f = min(flow[a][b] for a, b in edges)
        for a, b in edges:
            flow[a][b] -= f
        paths.append(([s for s in walk if s != SINK], f))
    if not paths:
        raise SimError(f"template {tpl.id}: routes carry no flow from source to sink")
    return paths


class SimState:
    """The state of one run that the batching and fleet layers share: clock, event heap, deployments,
    instances, nodes held, prices and the accounts."""

    router_queues = False
    """Whether requests wait as the mesh's router places them: each instance's own queue takes what the
    router gives it (up to ``Batching._bound``), the rest waits in the deployment's queue (the router's) until
    an instance has room. The fleet simulator does; the mesh's engine (one instance) does not: the real
    router is in front of it."""

    def __init__(
        self,
        scenario: Scenario,
        templates: Mapping[str, Template],
        perf: PerfModel,
        plan_fn: PlanFn,
        cfg: SimConfig,
        seed: int,
        duration_s: float,
        interval_s: float,
    ) -> None:
        self.sc = scenario
        self.templates = templates
        self.perf = perf
        self.catalog = perf.catalog
        self.plan_fn = plan_fn
        self.cfg = cfg
        self.duration = duration_s
        self.interval = interval_s
        self.budget = cfg.token_budget
        self.qlimit = cfg.queue_limit
        self.qtimeout = cfg.queue_timeout_s
        ss = np.random.SeedSequence(seed)
        kids = ss.spawn(4)
        self.route_u = Uniforms(np.random.default_rng(kids[0]))
        self.fault_rng = np.random.default_rng(kids[1])
        self.arrival_seed = kids[2]
        self.deps = [DepRT(i, d) for i, d in enumerate(scenario.deployments)]
        self.dep_by_name = {d.name: d for d in self.deps}
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.now = 0.0
        self.active = 0
        self.open_sources = 0
        self.insts: dict[int, Inst] = {}
        self.next_id = 0
        self.held: dict[tuple[str, str], int] = {}
        self.price, self.avail = scenario.market_at(self.catalog, 0.0)
        self.cost_last = 0.0
        self.dep_rate = [0.0] * len(self.deps)
        self.tick_cost = [0.0] * len(self.deps)
        self.pending: dict[tuple[str, str, str], int] = {}
        self.floor: dict[str, float] = {}
        """Per deployment: the capacity (req/s) a plan's transition keeps serving (``Fleet._retire``)."""
        self.planned_demand: dict[str, float] = {}
        """Per deployment: the demand (req/s) of the plan last applied."""
        self.retiring_now = False
        self.flight: tuple[Plan, dict[tuple[str, str, str], int]] | None = None
        """The target of a plan made and not yet applied (``SimConfig.plan_delay_s``)."""
        self.held_triggers: set[str] = set()
        """Re-plan triggers that came while a plan was in flight."""
        self.tables: dict[tuple[str, str, int, int], StageTable] = {}
        self.replans = 0
        self.solve_s: list[float] = []
        self.plan_changes: list[float] = []
        self.fault_times: list[float] = []
        self.retries = 0
        self.preemptions = 0
        self.events = 0
        self.plan_seq = 0
        self.monitor: DemandEstimator | None = None
        """The mesh's demand estimator over the simulated arrivals (``SimConfig.monitor``), if used."""
        self.mon_counts: list[int] = []
        self.mon_demand: dict[str, float] | None = None
        """The demand last published by the monitor: what every plan is made for, when it is used."""
        self.series: list[tuple[Any, ...]] = []
        self.skipped = 0
        self.rate_fns: list[Callable[[float], float]] = []
        self.series_deps: list[DepRT] = []
        self.progress: Callable[[float, float], None] | None = None
        self.in_transit: dict[int, Req] = {}
        self.last_tick = 0.0
        self.busy_s: dict[str, float] = {}
        self.serve_s: dict[str, float] = {}
        self.kv_peak: dict[str, float] = {}

    def _push(self, t: float, kind: int, obj: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj))

    def _table(self, model: str, node: str, tp: int, layers: int, batch: int) -> StageTable:
        key = (model, node, tp, layers)
        tab = self.tables.get(key)
        if tab is None or tab.max_batch < batch:
            tab = StageTable(self.perf, model, node, tp, layers, max(batch, 1))
            self.tables[key] = tab
        return tab
