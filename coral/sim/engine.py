"""The discrete-event fleet simulator: requests through instances of templates, with re-planning.

Model (honest, simple, one event per micro-batch per stage rather than one per token):

- **Requests** arrive from per-deployment sources (see ``coral.sim.arrivals``). A deployment's router
  picks one of its serving instances by capacity weight (seeded), then the instance picks one of its
  routes (a SOURCE-to-SINK path of the template's flow decomposition) by flow weight. Each path keeps a
  short local waiting line (one micro-batch's worth); when every instance's line is full, or older
  requests already wait, the request joins the deployment's bounded FIFO queue, which instances drain
  as they admit work. A request still queued after ``queue_timeout_s`` fails (``queue_timeout``); a
  full queue fails it at once (``queue_full``).
- **Instances** run continuous batching. A path of ``p`` stages has ``p`` micro-batches (vLLM's virtual
  engines) of at most ``batch`` sequences (the smallest stage batch on the path). A micro-batch is
  formed at the first stage: decoding sequences first (one token each), then prefill chunks, FCFS,
  within ``token_budget`` tokens. It then passes through the stages in order, queueing at a busy stage
  and paying the activation transfer between stages, so a stage's idle time shows. An iteration's time
  on a stage is the perf model's decode step (batch, mean context) plus its prefill time for the chunk
  (time-shared, as the template capacities assume). The sequence whose prefill completes emits its
  first token at the end of that iteration; each later iteration emits one token per decoding sequence.
- **KV cache** per stage, in tokens (``PerfModel.kv_capacity_tokens`` of its layers). A sequence
  reserves its prompt (plus any tokens it regenerates) on admission and one token per decode step.
  Admission waits while a stage of the path is full. When the decode step cannot grow, the most recently
  admitted sequence of the micro-batch is preempted and recomputed later (vLLM's recompute policy). A
  request longer than a path's whole KV capacity fails (``too_long``).
- **Disaggregated** deployments (prefill-mode and decode-mode templates in one region): the prefill
  instance emits the first token, then sends the KV cache (prompt tokens x ``kv_bytes_per_token`` over
  the smaller NIC of the two instances, plus the network latency) to a decode instance of the same
  region; that time shows in TPOT and end-to-end latency.
- **Fleet**: ``plan_fn`` is called at t=0, every ``replan_interval_s``, at each step of a demand
  series, and at each market change and fault. The demand it sees per deployment is the series value at
  that moment (times ``rate_scale``), or for trace demand the trace's highest 60 s rate over the next
  replan interval (scaled, and split by share when one trace feeds several deployments): the plan must
  hold until the next re-plan, and the mesh's demand monitor likewise plans for the recent peak of its
  sliding means. (The interval's mean left the Azure conversation trace's minute-scale bursts, up to
  1.3-1.4x the 5-minute mean, to the planner's queueing headroom, which is sized for Poisson arrivals at
  the planned rate, not for a burst on top: single instances planned near their safe utilisation
  missed TTFT for 15-20% of the requests in those minutes.) New instances are
  ready after the slowest stage's ``load_s`` plus ``startup_s`` (the t=0 fleet is warm unless
  ``warm_start`` is off); starts beyond a node type's availability wait until nodes free.
  Removed instances are made before they are broken, as the mesh's supervisor does: a removed serving
  instance keeps serving (retiring) until every instance the plan wants for its deployment serves (at
  once if its deployment waits for nodes, which it may hold); then it drains: it takes no new work, its
  waiting requests move, and it releases its nodes when its last sequence ends. Faults kill instances
  holding the named node type; their requests are retried elsewhere (counted) and keep the tokens they
  already streamed.
- **Cost** integrates the price of every node held (loading, serving, draining) over time.
- Arrivals stop at ``duration_s``; the run continues until every request has completed or failed (at
  most ``drain_limit_s`` more; what is left then fails as ``unfinished``).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from coral.errors import CoralError
from coral.perf import PerfModel
from coral.perf.roofline import NET_LATENCY_S
from coral.plan import Plan, PlanRequest
from coral.scenario import Deployment, FaultEvent, MarketChange, Scenario
from coral.sim.arrivals import (
    BLOCK,
    ArrivalSource,
    LengthDist,
    PoissonArrivals,
    ShareSplitter,
    TraceArrivals,
)
from coral.sim.report import DepStats, SimResult
from coral.sim.tables import StageTable
from coral.templates import SINK, SOURCE, Template

LOADING, SERVING, DRAINING, DEAD = 0, 1, 2, 3
K_STAGE, K_ARRIVAL, K_HANDOFF, K_READY, K_TICK, K_REPLAN, K_MARKET, K_FAULT = range(8)

PlanFn = Callable[[PlanRequest], Plan]
_EMPTY: deque[Req] = deque()


class SimError(CoralError):
    """The simulation cannot run: bad arguments, or the planner returned an unusable plan."""


@attrs.frozen
class SimConfig:
    """Simulator knobs. Lengths for deployments without a trace: ``length_dist`` around the deployment's
    shape means with CVs ``cv_in``/``cv_out``."""

    token_budget: int = 2048
    queue_limit: int = 100_000
    queue_timeout_s: float = 60.0
    startup_s: float = 60.0
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
        for name in ("queue_timeout_s", "startup_s", "drain_limit_s"):
            if not getattr(self, name) >= 0:
                raise SimError(f"{name} must not be negative, got {getattr(self, name)}")


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
        "dep",
        "id",
        "key",
        "min_nic",
        "mode",
        "n_active",
        "nodes",
        "paths",
        "rate",
        "region",
        "retiring",
        "stages",
        "state",
        "t_ready",
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
        self.t_ready = -1.0
        self.n_active = 0
        self.rate = 0.0
        self.weight = 1.0
        self.min_nic = 0.0
        self.nodes: tuple[str, ...] = tpl.nodes
        self.stages: list[StageRT] = []
        self.paths: list[PathRT] = []


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


class _ShareRate:
    """Deployment ``j``'s nominal rate under a share split."""

    def __init__(self, split: ShareSplitter, j: int) -> None:
        self.split, self.j = split, j

    def __call__(self, t: float) -> float:
        return self.split.rate_at(self.j, t)


class _WindowPeak:
    """The highest value of a rate function over ``[t, t + span)``, sampled every ``step`` seconds (the
    middle of each of a trace's 60 s buckets)."""

    def __init__(self, fn: Callable[[float], float], span: float, step: float = 60.0) -> None:
        self.fn, self.n, self.step = fn, max(1, math.ceil(span / step)), min(step, span)

    def __call__(self, t: float) -> float:
        return max(self.fn(t + (k + 0.5) * self.step) for k in range(self.n))


def _zero(_t: float) -> float:
    return 0.0


class _Sim:
    def __init__(
        self,
        scenario: Scenario,
        templates: Mapping[str, Template],
        perf: PerfModel,
        plan_fn: PlanFn,
        cfg: SimConfig,
        seed: int,
        trace: Path | None,
        rate_scale: float,
        duration_s: float,
        interval_s: float,
        on_bad_row: str,
        arrivals: Mapping[str, ArrivalSource] | None,
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
        arr_seed = kids[2]
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
        self.tables: dict[tuple[str, str, int, int], StageTable] = {}
        self.replans = 0
        self.solve_s: list[float] = []
        self.plan_changes: list[float] = []
        self.fault_times: list[float] = []
        self.retries = 0
        self.preemptions = 0
        self.events = 0
        self.plan_seq = 0
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
        self._make_sources(trace, rate_scale, on_bad_row, arrivals, arr_seed)

    # ----------------------------------------------------------------- set-up
    def _make_sources(
        self,
        trace: Path | None,
        rate_scale: float,
        on_bad_row: str,
        arrivals: Mapping[str, ArrivalSource] | None,
        seed: np.random.SeedSequence,
    ) -> None:
        kids = seed.spawn(len(self.deps) + 1)
        end = self.duration
        span = self.sc.planner.replan_interval_s
        given = dict(arrivals or {})
        for name in given:
            if name not in self.dep_by_name:
                raise SimError(f"arrivals: unknown deployment {name!r}; known: {', '.join(self.dep_by_name)}")
        its: list[Iterator[tuple[float, int, int, int]]] = []
        self.rate_fns = [_zero] * len(self.deps)
        if trace is not None:
            rng = np.random.default_rng(kids[-1])
            src = TraceArrivals(Path(trace), rng, end_s=end, rate_scale=rate_scale, on_bad_row=on_bad_row)
            self.skipped += len(src.skipped)
            rest = [d for d in self.deps if d.name not in given]
            if rest:
                split = ShareSplitter(src, [d.d.demand.series for d in rest], rng)
                index = [d.idx for d in rest]
                its.append(((t, index[i], p, o) for t, i, p, o in split))
                for j, d in enumerate(rest):
                    self.rate_fns[d.idx] = _WindowPeak(_ShareRate(split, j), span)
        for d in self.deps:
            rng = np.random.default_rng(kids[d.idx])
            src_d: ArrivalSource | None = given.get(d.name)
            if src_d is None and trace is not None:
                continue
            if src_d is None and d.d.demand.trace is not None:
                tr = TraceArrivals(
                    d.d.demand.trace, rng, end_s=end, rate_scale=rate_scale * d.d.demand.scale, on_bad_row=on_bad_row
                )
                self.skipped += len(tr.skipped)
                src_d = tr
                self.rate_fns[d.idx] = _WindowPeak(tr.rate_at, span)
                its.append(self._tag(tr, d.idx))
                continue
            if src_d is None:
                lengths = LengthDist(d.shape_in, d.shape_out, self.cfg.length_dist, self.cfg.cv_in, self.cfg.cv_out)
                series = [(t, r * rate_scale) for t, r in d.d.demand.series]
                src_d = PoissonArrivals(series, lengths, rng, end_s=end)
                self.series_deps.append(d)
            self.rate_fns[d.idx] = src_d.rate_at
            its.append(self._tag(src_d, d.idx))
        for it in its:
            self.open_sources += 1
            self._next_arrival(it)

    @staticmethod
    def _tag(src: ArrivalSource, i: int) -> Iterator[tuple[float, int, int, int]]:
        for t, p, o in src:
            yield t, i, p, o

    def _push(self, t: float, kind: int, obj: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj))

    def _next_arrival(self, it: Iterator[tuple[float, int, int, int]]) -> None:
        nxt = next(it, None)
        if nxt is None or nxt[0] >= self.duration:
            self.open_sources -= 1
            return
        if nxt[0] < self.now:
            raise SimError(
                f"arrival at t={nxt[0]:.3f}s comes before the previous one (t={self.now:.3f}s): timestamps out of order"
            )
        if nxt[2] < 0 or nxt[3] < 0:
            raise SimError(f"arrival at t={nxt[0]:.3f}s has a negative token count ({nxt[2]}, {nxt[3]})")
        self.seq += 1
        heapq.heappush(self.heap, (nxt[0], self.seq, K_ARRIVAL, (it, nxt)))

    def _table(self, model: str, node: str, tp: int, layers: int, batch: int) -> StageTable:
        key = (model, node, tp, layers)
        tab = self.tables.get(key)
        if tab is None or tab.max_batch < batch:
            tab = StageTable(self.perf, model, node, tp, layers, max(batch, 1))
            self.tables[key] = tab
        return tab

    # ----------------------------------------------------------------- main loop
    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        self._replan(0.0, "initial", first=True)
        k = 1
        ri = self.sc.planner.replan_interval_s
        while k * ri < self.duration:
            self._push(k * ri, K_REPLAN, None)
            k += 1
        for ch in self.sc.market:
            if 0 < ch.at < self.duration:
                self._push(ch.at, K_MARKET, ch)
        if self.series_deps:
            steps = sorted({p[0] for d in self.series_deps for p in d.d.demand.series if 0 < p[0] < self.duration})
            for at in steps:
                self._push(at, K_REPLAN, "demand")
        for ev in self.sc.events:
            if ev.at < self.duration:
                self._push(ev.at, K_FAULT, ev)
        self._push(self.interval, K_TICK, 0.0)
        limit = self.duration + self.cfg.drain_limit_s
        heap = self.heap
        pop = heapq.heappop
        t = 0.0
        events = 0
        while heap:
            t, _, kind, obj = pop(heap)
            if t > limit:
                t = limit
                break
            events += 1
            self.now = t
            if kind == K_STAGE:
                self._stage_done(obj, t)
            elif kind == K_ARRIVAL:
                it, a = obj
                self._arrive(a, t)
                self._next_arrival(it)
            elif kind == K_HANDOFF:
                self._handoff_done(obj, t)
            elif kind == K_READY:
                self._ready(obj, t)
            elif kind == K_TICK:
                self._tick(obj, t)
                if self.open_sources == 0 and self.active == 0 and t >= self.duration:
                    break
            elif kind == K_REPLAN:
                self._replan(t, obj or "interval")
            elif kind == K_MARKET:
                self._market(obj, t)
            elif kind == K_FAULT:
                self._fault(obj, t)
            if self.open_sources == 0 and self.active == 0 and t >= self.duration:
                break
        end = max(t, self.duration)
        self._finish(end)
        self.events = events
        return SimResult(
            duration_s=self.duration,
            end_s=end,
            stats={d.name: d.stats for d in self.deps},
            series=self.series,
            replans=self.replans,
            replan_solve_s=self.solve_s,
            plan_changes=self.plan_changes,
            faults=self.fault_times,
            retries=self.retries,
            preemptions=self.preemptions,
            events=events,
            wall_s=time.perf_counter() - wall0,
            skipped_rows=self.skipped,
            stage_utilisation={k: self.busy_s[k] / v for k, v in sorted(self.serve_s.items()) if v > 0},
            kv_peak=dict(sorted(self.kv_peak.items())),
        )

    def _finish(self, end: float) -> None:
        """Fail whatever is left, record the last interval, stop every instance and close the cost."""
        left: list[Req] = []
        for inst in list(self.insts.values()):
            if inst.state != DEAD:
                left.extend(self._evict(inst))
        for d in self.deps:
            left.extend(d.entry.pullq.q)
            d.entry.pullq.q.clear()
            for g in d.decode.values():
                left.extend(g.pullq.q)
                g.pullq.q.clear()
        left.extend(self.in_transit.values())
        self.in_transit.clear()
        for r in left:
            self._fail(r, "unfinished")
        if end > self.last_tick:
            self._tick(self.last_tick, end)
        self._accrue(end)
        for inst in list(self.insts.values()):
            if inst.state != DEAD:
                self._release(inst, end)

    # ----------------------------------------------------------------- requests
    def _arrive(self, a: tuple[float, int, int, int], t: float) -> None:
        dep = self.deps[a[1]]
        req = Req(dep, t, a[2], a[3] if a[3] > 0 else 1)
        st = dep.stats
        st.requests += 1
        st.iv_arrivals += 1
        self.active += 1
        self._route(req, t, False)

    def _route(self, req: Req, t: float, front: bool) -> None:
        g = req.dep.entry
        self._route_group(g, req, t, front)

    def _route_group(self, g: Group, req: Req, t: float, front: bool) -> None:
        pq = g.pullq
        insts = g.insts
        if insts and not pq.q:
            n = len(insts)
            if n == 1:
                if self._take(insts[0], req, t):
                    return
            else:
                x = self.route_u.next() * g.total
                cum = g.cum
                lo, hi = 0, n - 1
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if cum[mid] <= x:
                        lo = mid + 1
                    else:
                        hi = mid
                if self._take(insts[lo], req, t):
                    return
                for j in range(1, n):
                    if self._take(insts[(lo + j) % n], req, t):
                        return
        if len(pq.q) >= self.qlimit:
            self._fail(req, "queue_full")
            return
        req.deadline = t + self.qtimeout
        if front:
            pq.q.appendleft(req)
        else:
            pq.q.append(req)
        if pq.idle:
            path = next(iter(pq.idle))
            self._wake(path, t)

    def _take(self, inst: Inst, req: Req, t: float) -> bool:
        paths = inst.paths
        if len(paths) == 1:
            p = paths[0]
            if len(p.waiting) >= p.batch:
                return False
        else:
            best = None
            score = math.inf
            for q in paths:
                if len(q.waiting) < q.batch:
                    s = q.assigned / q.weight
                    if s < score:
                        best, score = q, s
            if best is None:
                return False
            p = best
        p.waiting.append(req)
        p.assigned += 1
        if p.idle:
            self._wake(p, t)
        return True

    def _wake(self, p: PathRT, t: float) -> None:
        mb = p.idle.pop()
        if not p.idle:
            p.pullq.idle.pop(p, None)
        mb.idle = False
        mb.hop = 0
        mb.ready = t
        st = p.stages[0]
        st.queue.append(mb)
        if not st.busy:
            self._kick(st, t)

    def _kick(self, st: StageRT, t: float) -> None:
        q = st.queue
        while q and not st.busy:
            mb = q.popleft()
            if mb.dead:
                continue
            if mb.hop == 0 and not self._form(mb, t):
                mb.idle = True
                p = mb.path
                p.idle.append(mb)
                if p.inst.state == SERVING:
                    p.pullq.idle[p] = None
                continue
            dt = st.table.time(mb.c_ndec, mb.c_ctx, mb.c_np, mb.c_ptok)
            st.busy = True
            st.busy_s += dt
            start = mb.ready if mb.ready > t else t
            self.seq += 1
            heapq.heappush(self.heap, (start + dt, self.seq, K_STAGE, mb))

    def _form(self, mb: MB, t: float) -> bool:
        """Compose the next iteration of ``mb`` (vLLM-like scheduling); False when it has nothing to do."""
        path = mb.path
        stages = path.stages
        inst = path.inst
        n_dec = mb.n_dec
        if len(stages) == 1:
            s0 = stages[0]
            free = s0.cap - s0.used
        else:
            free = min(s.cap - s.used for s in stages)
        if free < n_dec:
            free, n_dec = self._preempt(mb, free, n_dec)
        if n_dec:
            for s in stages:
                s.used += n_dec
            mb.ctx_sum += n_dec
            free -= n_dec
        budget = self.budget - n_dec
        n_act = 0
        ptok = 0
        for req in mb.pref:
            if budget <= 0:
                break
            c = req.need_pre - req.pre_done
            if c > budget:
                c = budget
            req.chunk = c
            budget -= c
            ptok += c
            n_act += 1
        waiting = path.waiting
        if waiting or inst.state == SERVING:
            nseq = n_dec + len(mb.pref)
            pq = path.pullq.q if inst.state == SERVING else _EMPTY
            while budget > 0 and nseq < path.batch:
                if waiting:
                    q = waiting
                elif pq:
                    q = pq
                    if pq[0].deadline < t:
                        self._fail(pq.popleft(), "queue_timeout")
                        continue
                else:
                    break
                req = q[0]
                if req.prompt + req.out > path.kvcap:
                    q.popleft()
                    self._fail(req, "too_long")
                    continue
                need = req.prompt + req.gen
                if free < need + 1:
                    break
                q.popleft()
                inst.n_active += 1
                nseq += 1
                for s in stages:
                    s.used += need
                free -= need
                req.kv = need
                if req.kv_ready:
                    req.kv_ready = False
                    req.s_join = mb.step
                    req.g_join = req.gen
                    mb.dec[req] = None
                    fs = mb.step + req.out - req.gen
                    lst = mb.finish.get(fs)
                    if lst is None:
                        mb.finish[fs] = [req]
                    else:
                        lst.append(req)
                    for s in stages:
                        s.used += 1
                    free -= 1
                    mb.ctx_sum += need + 1
                    n_dec += 1
                    budget -= 1
                else:
                    req.need_pre = need
                    req.pre_done = 0
                    c = need if need < budget else budget
                    req.chunk = c
                    budget -= c
                    ptok += c
                    n_act += 1
                    mb.pref.append(req)
        for s in stages:
            if s.used > s.peak:
                s.peak = s.used
        mb.n_dec = n_dec
        mb.c_ndec = n_dec
        mb.c_ctx = mb.ctx_sum / n_dec if n_dec else 0.0
        mb.c_np = n_act
        mb.c_ptok = ptok
        return n_dec > 0 or n_act > 0

    def _preempt(self, mb: MB, free: int, n_dec: int) -> tuple[int, int]:
        """Recompute-preempt the latest admitted sequences of ``mb`` until the decode step fits."""
        path = mb.path
        inst = path.inst
        while free < n_dec and (mb.pref or mb.dec):
            if mb.pref:
                v = mb.pref.pop()
                held = v.kv
            else:
                v = next(reversed(mb.dec))
                del mb.dec[v]
                d = mb.step - v.s_join
                held = v.kv + d
                v.gen = v.g_join + d
                mb.finish[v.s_join + v.out - v.g_join].remove(v)
                mb.ctx_sum -= held
                n_dec -= 1
            for s in path.stages:
                s.used -= held
            free += held
            inst.n_active -= 1
            v.kv = 0
            v.pre_done = 0
            self.preemptions += 1
            v.dep.stats.preemptions += 1
            path.waiting.appendleft(v)
        return free, n_dec

    def _stage_done(self, mb: MB, t: float) -> None:
        if mb.dead:
            return
        path = mb.path
        st = path.stages[mb.hop]
        st.busy = False
        if mb.hop == path.last:
            self._iter_done(mb, t)
        else:
            mb.hop += 1
            mb.ready = t + path.hops[mb.hop] * (mb.c_ndec + mb.c_ptok) + NET_LATENCY_S
            nxt = path.stages[mb.hop]
            nxt.queue.append(mb)
            if not nxt.busy:
                self._kick(nxt, t)
        if not st.busy:
            self._kick(st, t)

    def _iter_done(self, mb: MB, t: float) -> None:
        path = mb.path
        inst = path.inst
        stages = path.stages
        step = mb.step + 1
        mb.step = step
        fin = mb.finish.pop(step, None)
        if fin is not None:
            dec = mb.dec
            for req in fin:
                del dec[req]
                held = req.kv + step - req.s_join
                mb.ctx_sum -= held
                for s in stages:
                    s.used -= held
                req.gen = req.out
                self._complete(req, t)
            mb.n_dec -= len(fin)
            inst.n_active -= len(fin)
        n_act = mb.c_np
        if n_act:
            pref = mb.pref
            for _ in range(n_act):
                req = pref[0]
                req.pre_done += req.chunk
                if req.pre_done < req.need_pre:
                    break
                pref.popleft()
                req.gen += 1
                if req.first_t < 0:
                    req.first_t = t
                if req.gen >= req.out or inst.mode == "prefill":
                    for s in stages:
                        s.used -= req.kv
                    inst.n_active -= 1
                    if req.gen >= req.out:
                        self._complete(req, t)
                    else:
                        self._handoff(req, inst, t)
                else:
                    req.s_join = step
                    req.g_join = req.gen
                    mb.dec[req] = None
                    mb.n_dec += 1
                    mb.ctx_sum += req.kv
                    fs = step + req.out - req.gen
                    lst = mb.finish.get(fs)
                    if lst is None:
                        mb.finish[fs] = [req]
                    else:
                        lst.append(req)
        if inst.state == DRAINING and inst.n_active == 0 and not any(p.waiting for p in inst.paths):
            self._release(inst, t)
            return
        mb.hop = 0
        mb.ready = t + path.back if path.last else t
        s0 = stages[0]
        s0.queue.append(mb)
        if not s0.busy:
            self._kick(s0, t)
        for p in inst.paths:
            if p.idle and (p.waiting or (p.pullq.q and inst.state == SERVING)):
                self._wake(p, t)

    def _complete(self, req: Req, t: float) -> None:
        dep = req.dep
        st = dep.stats
        st.completed += 1
        st.iv_completed += 1
        self.active -= 1
        ttft = req.first_t - req.t_arr
        e2e = t - req.t_arr
        st.ttft.add(ttft)
        st.e2e.add(e2e)
        ok_t = ttft <= dep.ttft
        if req.out > 1:
            tpot = (t - req.first_t) / (req.out - 1)
            st.tpot.add(tpot)
            ok_p = tpot <= dep.tpot
        else:
            ok_p = True
        if ok_t:
            st.met_ttft += 1
        if ok_p:
            st.met_tpot += 1
            if ok_t:
                st.met_both += 1
                st.iv_met += 1
        st.tokens_in += req.prompt
        st.tokens_out += req.out

    def _fail(self, req: Req, reason: str) -> None:
        st = req.dep.stats
        st.failed += 1
        st.iv_failed += 1
        st.reasons[reason] = st.reasons.get(reason, 0) + 1
        self.active -= 1

    # ----------------------------------------------------------------- disaggregation
    def _handoff(self, req: Req, src: Inst, t: float) -> None:
        g = req.dep.decode.get(src.region)
        dst: Inst | None = None
        if g is not None and g.insts:
            x = self.route_u.next() * g.total
            dst = g.insts[-1]
            for i, c in zip(g.insts, g.cum, strict=True):
                if x < c:
                    dst = i
                    break
        bw = min(src.min_nic, dst.min_nic) if dst is not None else src.min_nic
        m = self.catalog.models[req.dep.model]
        dt = NET_LATENCY_S + (req.prompt + req.gen - 1) * m.kv_bytes_per_token / bw
        req.hint = dst
        req.kv_ready = True
        self.in_transit[id(req)] = req
        self._push(t + dt, K_HANDOFF, (req, src.region))

    def _handoff_done(self, obj: tuple[Req, str], t: float) -> None:
        req, region = obj
        if self.in_transit.pop(id(req), None) is None:
            return
        dst = req.hint
        req.hint = None
        if dst is not None and dst.state == SERVING and self._take(dst, req, t):
            return
        g = req.dep.decode.get(region)
        if g is None:
            g = req.dep.decode[region] = Group()
        self._route_group(g, req, t, False)

    # ----------------------------------------------------------------- fleet
    def _accrue(self, t: float) -> None:
        dt = t - self.cost_last
        if dt > 0:
            for d in self.deps:
                d.stats.cost += self.dep_rate[d.idx] * dt / 3600.0
        self.cost_last = t

    def _inst_rate(self, inst: Inst) -> float:
        return sum(self.price[(inst.region, n)] for n in inst.nodes)

    def _start(self, key: tuple[str, str, str], t: float, warm: bool) -> bool:
        dep_name, tid, region = key
        tpl = self.templates[tid]
        need: dict[str, int] = {}
        for n in tpl.nodes:
            need[n] = need.get(n, 0) + 1
        for n, c in need.items():
            if self.held.get((region, n), 0) + c > self.avail.get((region, n), 0):
                return False
        dep = self.dep_by_name[dep_name]
        inst = Inst(self.next_id, dep, tpl, region, key)
        self.next_id += 1
        self._build(inst)
        self._accrue(t)
        for n, c in need.items():
            self.held[(region, n)] = self.held.get((region, n), 0) + c
        inst.rate = self._inst_rate(inst)
        self.dep_rate[dep.idx] += inst.rate
        self.insts[inst.id] = inst
        if warm:
            self._ready(inst, t)
        else:
            load = max(self.perf.load_s(tpl.model, s.node, s.layers) for s in tpl.stages)
            self._push(t + load + self.cfg.startup_s, K_READY, inst)
        return True

    def _build(self, inst: Inst) -> None:
        tpl = inst.tpl
        m = self.catalog.models[tpl.model]
        paths = template_paths(tpl)
        batch_of = [1] * len(tpl.stages)
        for idxs, _ in paths:
            b = max(1, min(tpl.stages[i].batch for i in idxs))
            for i in idxs:
                batch_of[i] = max(batch_of[i], b)
        inst.stages = []
        for j, s in enumerate(tpl.stages):
            tab = self._table(tpl.model, s.node, s.tp, s.layers, batch_of[j])
            cap = self.perf.kv_capacity_tokens(tpl.model, s.node, layers=s.layers, tp=s.tp)
            inst.stages.append(StageRT(tab, cap))
        act = m.hidden * m.dtype_bytes
        for idxs, f in paths:
            hops = [0.0]
            for a, b in itertools.pairwise(idxs):
                na, nb = self.catalog.nodes[tpl.stages[a].node], self.catalog.nodes[tpl.stages[b].node]
                hops.append(act / min(na.nic_bytes_per_s, nb.nic_bytes_per_s))
            back = NET_LATENCY_S if len(idxs) > 1 else 0.0
            b = max(1, min(tpl.stages[i].batch for i in idxs))
            p = PathRT(inst, [inst.stages[i] for i in idxs], b, max(f, 1e-12), hops, back)
            inst.paths.append(p)
        inst.min_nic = min(self.catalog.nodes[n].nic_bytes_per_s for n in tpl.nodes)
        d = inst.dep
        if inst.mode == "prefill":
            w = tpl.prefill_tok_s / d.shape_in
        elif inst.mode == "decode":
            w = tpl.decode_tok_s / d.shape_out
        else:
            w = tpl.requests_per_s(d.shape_in, d.shape_out)
        inst.weight = w if w > 0 else 1.0

    def _group(self, inst: Inst) -> Group:
        d = inst.dep
        if inst.mode == "decode":
            g = d.decode.get(inst.region)
            if g is None:
                g = d.decode[inst.region] = Group()
            return g
        return d.entry

    def _ready(self, inst: Inst, t: float) -> None:
        if inst.state != LOADING:
            return
        inst.state = SERVING
        inst.t_ready = t
        g = self._group(inst)
        g.insts.append(inst)
        g.rebuild()
        for p in inst.paths:
            p.pullq = g.pullq
            if p.idle:
                g.pullq.idle[p] = None
        for p in inst.paths:
            for _ in range(len(p.idle)):
                if not g.pullq.q:
                    break
                self._wake(p, t)
        self._retire(t)

    def _unlist(self, inst: Inst) -> None:
        g = self._group(inst)
        if inst in g.insts:
            g.insts.remove(inst)
            g.rebuild()
        for p in inst.paths:
            g.pullq.idle.pop(p, None)

    def _stop(self, inst: Inst, t: float) -> None:
        if inst.state == LOADING:
            self._release(inst, t)
            return
        if inst.state != SERVING:
            return
        inst.state = DRAINING
        self._unlist(inst)
        moved: list[Req] = []
        for p in inst.paths:
            moved.extend(p.waiting)
            p.waiting.clear()
        for r in moved:
            if r.kv_ready:
                self._route_group(self._group(inst), r, t, True)
            else:
                self._route(r, t, True)
        if inst.n_active == 0:
            self._release(inst, t)

    def _release(self, inst: Inst, t: float) -> None:
        if inst.state == DEAD:
            return
        if inst.state == SERVING:
            self._unlist(inst)
        inst.state = DEAD
        for p in inst.paths:
            for mb in p.mbs:
                mb.dead = True
        self._accrue(t)
        for n in inst.nodes:
            self.held[(inst.region, n)] -= 1
        self.dep_rate[inst.dep.idx] -= inst.rate
        del self.insts[inst.id]
        if inst.t_ready >= 0:
            for j, s in enumerate(inst.stages):
                key = f"{inst.tpl.id}/{j}"
                self.busy_s[key] = self.busy_s.get(key, 0.0) + s.busy_s
                self.serve_s[key] = self.serve_s.get(key, 0.0) + (t - inst.t_ready)
                self.kv_peak[key] = max(self.kv_peak.get(key, 0.0), s.peak / s.cap if s.cap else 0.0)
        if self.pending:
            self._start_pending(t)

    def _start_pending(self, t: float) -> None:
        for key in sorted(self.pending):
            while self.pending.get(key, 0) > 0 and self._start(key, t, False):
                self.pending[key] -= 1
            if self.pending.get(key) == 0:
                del self.pending[key]

    def _evict(self, inst: Inst) -> list[Req]:
        """Every request held by ``inst`` (waiting, prefilling, decoding), reset to be recomputed."""
        out: list[Req] = []
        for p in inst.paths:
            out.extend(p.waiting)
            p.waiting.clear()
            for mb in p.mbs:
                for r in mb.pref:
                    r.pre_done = 0
                    out.append(r)
                for r in mb.dec:
                    r.gen = r.g_join + (mb.step - r.s_join)
                    out.append(r)
                mb.pref.clear()
                mb.dec.clear()
                mb.finish.clear()
                mb.n_dec = 0
                mb.ctx_sum = 0
        for s in inst.stages:
            s.used = 0
        inst.n_active = 0
        for r in out:
            r.kv = 0
            r.kv_ready = False
        return out

    def _kill(self, inst: Inst, t: float) -> None:
        reqs = self._evict(inst)
        self._release(inst, t)
        for r in reqs:
            r.retries += 1
            self.retries += 1
            r.dep.stats.retries += 1
            self._route(r, t, True)

    def _fault(self, ev: FaultEvent, t: float) -> None:
        self.fault_times.append(t)
        for _ in range(ev.count):
            cands = [i for i in self.insts.values() if i.region == ev.region and ev.node in i.nodes]
            if not cands:
                break
            cands.sort(key=lambda i: i.id)
            self._kill(cands[int(self.fault_rng.integers(0, len(cands)))], t)
        self._replan(t, "fault")

    def _market(self, ch: MarketChange, t: float) -> None:
        self._accrue(t)
        self.price, self.avail = self.sc.market_at(self.catalog, t)
        for d in self.deps:
            self.dep_rate[d.idx] = 0.0
        for inst in self.insts.values():
            inst.rate = self._inst_rate(inst)
            self.dep_rate[inst.dep.idx] += inst.rate
        self._replan(t, "market")

    def _live_counts(self) -> dict[tuple[str, str, str], int]:
        out: dict[tuple[str, str, str], int] = {}
        for i in self.insts.values():
            if i.state in (LOADING, SERVING):
                out[i.key] = out.get(i.key, 0) + 1
        return out

    def _replan(self, t: float, trigger: str, first: bool = False) -> None:
        demand = {d.name: float(self.rate_fns[d.idx](t)) for d in self.deps}
        live = self._live_counts()
        self.pending = {}
        req = PlanRequest(
            at=t, demand=demand, prices=dict(self.price), availability=dict(self.avail), current=live, trigger=trigger
        )
        w0 = time.perf_counter()
        plan = self.plan_fn(req)
        self.solve_s.append(time.perf_counter() - w0)
        self.replans += 1
        self.plan_seq += 1
        target = self._validate(plan)
        if first and not target and sum(demand.values()) > 0:
            raise SimError(
                f"the planner returned an empty plan at t=0 (status {plan.status!r}) for demand "
                + ", ".join(f"{k}={v:g} req/s" for k, v in demand.items())
                + "; nothing could serve any request"
            )
        keys = sorted(set(target) | set(live))
        changed = False
        for key in keys:
            mine = [i for i in self.insts.values() if i.key == key and i.state in (LOADING, SERVING)]
            diff = target.get(key, 0) - len(mine)
            if diff < 0:
                changed = True
                # loading ones first, then the serving ones already retiring, then the least busy
                mine.sort(key=lambda i: (i.state != LOADING, not i.retiring, i.n_active, -i.id))
                for inst in mine[:-diff]:
                    if inst.state == LOADING:
                        self._stop(inst, t)
                    else:
                        inst.retiring = True
                mine = mine[-diff:]
            for inst in mine:
                inst.retiring = False  # wanted again
        for key in keys:
            live_now = sum(1 for i in self.insts.values() if i.key == key and i.state in (LOADING, SERVING))
            diff = (
                target.get(key, 0)
                - live_now
                + sum(1 for i in self.insts.values() if i.key == key and i.state == SERVING and i.retiring)
            )
            if diff > 0:
                changed = True
                for _ in range(diff):
                    if not self._start(key, t, first and self.cfg.warm_start):
                        self.pending[key] = self.pending.get(key, 0) + 1
        self._retire(t)
        if changed:
            self.plan_changes.append(t)

    def _retire(self, t: float) -> None:
        """Make before break: a retiring instance keeps serving until every instance the plan wants for
        its deployment serves; it drains at once while its deployment waits for nodes (it may hold them)."""
        for d in self.deps:
            old = [i for i in self.insts.values() if i.dep is d and i.retiring and i.state == SERVING]
            if not old:
                continue
            waiting = any(k[0] == d.name for k in self.pending)
            loading = any(i.dep is d and i.state == LOADING for i in self.insts.values())
            if waiting or not loading:
                for inst in sorted(old, key=lambda i: i.id):
                    inst.retiring = False
                    self._stop(inst, t)

    def _validate(self, plan: Plan) -> dict[tuple[str, str, str], int]:
        out: dict[tuple[str, str, str], int] = {}
        for pi in plan.instances:
            where = f"plan {plan.seq} ({plan.policy}, trigger {plan.trigger})"
            if pi.count < 0:
                raise SimError(f"{where}: negative count {pi.count} for template {pi.template_id}")
            if pi.count == 0:
                continue
            if pi.deployment not in self.dep_by_name:
                raise SimError(f"{where}: unknown deployment {pi.deployment!r}")
            tpl = self.templates.get(pi.template_id)
            if tpl is None:
                raise SimError(f"{where}: template {pi.template_id!r} is not among the templates given")
            if tpl.model != self.dep_by_name[pi.deployment].model:
                raise SimError(
                    f"{where}: template {tpl.id} is for {tpl.model}, deployment {pi.deployment} serves "
                    f"{self.dep_by_name[pi.deployment].model}"
                )
            if not tpl.stages:
                raise SimError(f"{where}: template {tpl.id} has no stages")
            for n in tpl.nodes:
                if (pi.region, n) not in self.price:
                    raise SimError(f"{where}: region {pi.region!r} does not offer node type {n!r} (template {tpl.id})")
            key = (pi.deployment, pi.template_id, pi.region)
            out[key] = out.get(key, 0) + pi.count
        return out

    # ----------------------------------------------------------------- intervals
    def _tick(self, t0: float, t: float) -> None:
        self._accrue(t)
        iv = t - t0
        for d in self.deps:
            for pq in [d.entry.pullq, *(g.pullq for g in d.decode.values())]:
                q = pq.q
                while q and q[0].deadline < t:
                    self._fail(q.popleft(), "queue_timeout")
        for d in self.deps:
            st = d.stats
            cap = 0.0
            cap_pre: dict[str, float] = {}
            for i in d.entry.insts:
                if i.mode == "prefill":
                    cap_pre[i.region] = cap_pre.get(i.region, 0.0) + i.weight
                else:
                    cap += i.weight
            for region, pre in cap_pre.items():
                g = d.decode.get(region)
                cap += min(pre, sum(i.weight for i in g.insts)) if g is not None else 0.0
            queue = len(d.entry.pullq.q) + sum(len(g.pullq.q) for g in d.decode.values())
            n_inst = 0
            for inst in self.insts.values():
                if inst.dep is d:
                    n_inst += 1
                    for p in inst.paths:
                        queue += len(p.waiting)
            done = st.iv_completed + st.iv_failed
            self.series.append(
                (
                    round(t0, 6),
                    round(t, 6),
                    d.name,
                    st.iv_arrivals / iv if iv > 0 else 0.0,
                    cap,
                    st.iv_completed / iv if iv > 0 else 0.0,
                    st.iv_failed,
                    queue,
                    n_inst,
                    (st.cost - self.tick_cost[d.idx]) / iv * 3600.0 if iv > 0 else self.dep_rate[d.idx],
                    st.iv_met / done if done else math.nan,
                )
            )
            st.iv_arrivals = st.iv_completed = st.iv_failed = st.iv_met = 0
            self.tick_cost[d.idx] = st.cost
        self.last_tick = t
        if self.progress is not None:
            self.progress(min(t, self.duration), self.duration)
        if t < self.duration + self.cfg.drain_limit_s:
            self._push(t + self.interval, K_TICK, t)


def simulate(
    scenario: Scenario,
    templates: Mapping[str, Template],
    perf: PerfModel,
    plan_fn: PlanFn,
    *,
    seed: int = 0,
    trace: Path | str | None = None,
    rate_scale: float = 1.0,
    duration_s: float | None = None,
    interval_s: float = 60.0,
    on_bad_row: str = "stop",
    config: SimConfig | None = None,
    arrivals: Mapping[str, ArrivalSource] | None = None,
    progress: Callable[[float, float], None] | None = None,
) -> SimResult:
    """Simulate ``scenario`` served by the plans of ``plan_fn`` over ``templates`` (see the module docstring).

    ``trace`` replays one Azure-format trace for the whole scenario, each arrival going to a deployment
    by its demand share; without it each deployment follows its own demand (Poisson over its series, or
    its own trace). ``rate_scale`` multiplies every rate. ``arrivals`` overrides the source of named
    deployments. ``progress(t, duration_s)`` is called at every interval. The result depends only on the
    inputs and ``seed``.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise SimError(f"seed must be a non-negative integer, got {seed!r}")
    if not (isinstance(rate_scale, int | float) and rate_scale > 0 and math.isfinite(rate_scale)):
        raise SimError(f"rate_scale must be a positive number, got {rate_scale!r}")
    if not interval_s > 0:
        raise SimError(f"interval_s must be positive, got {interval_s!r}")
    if on_bad_row not in ("stop", "skip"):
        raise SimError(f"on_bad_row must be 'stop' or 'skip', got {on_bad_row!r}")
    dur = scenario.duration_s if duration_s is None else duration_s
    if not dur > 0:
        raise SimError(f"duration_s must be positive, got {dur!r}")
    if not scenario.deployments:
        raise SimError(f"scenario {scenario.name}: no deployments")
    tr = Path(trace) if trace is not None else None
    sim = _Sim(
        scenario,
        templates,
        perf,
        plan_fn,
        config or SimConfig(),
        seed,
        tr,
        float(rate_scale),
        float(dur),
        float(interval_s),
        on_bad_row,
        arrivals,
    )
    sim.progress = progress
    return sim.run()


__all__: Sequence[str] = ("PlanFn", "SimConfig", "SimError", "simulate", "template_paths")
