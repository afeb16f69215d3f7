"""The discrete-event fleet simulator: requests through instances of templates, with re-planning.

This module runs the event loop (``simulate``); the runtime objects are in ``coral.sim.state``, requests
through instances in ``coral.sim.batching`` and fleet changes in ``coral.sim.fleet``.

Model (honest, simple, one event per micro-batch per stage rather than one per token):

- **Requests** arrive from per-deployment sources (see ``coral.sim.arrivals``). The deployment's router
  (the mesh's, ``actors.router``) gives each request to one of its serving instances with room, drawn by
  capacity weight (seeded): an instance holds at most ``weight × (service + instance_queue_s)`` requests
  (in service, in its paths' lines and in its own queue). When none has room the request waits in the
  router's queue (bounded: ``queue_full`` beyond it), oldest first, until an instance has room; that
  queue is what the demand monitor counts as backlog. The instance then picks one of its routes (a
  SOURCE-to-SINK path of the template's flow decomposition) by flow weight; each path keeps a short line
  (one micro-batch's worth) and the rest waits in the instance's own queue. A request waiting longer than
  ``queue_timeout_s`` (at the router since it began to wait there, in an instance since its arrival or
  its KV's) fails (``queue_timeout``).
- **Instances** run continuous batching. A path of ``p`` stages has ``p`` micro-batches (vLLM's virtual
  engines) of at most ``batch`` sequences (the smallest stage batch on the path). A micro-batch is
  formed at the first stage: decoding sequences first (one token each), then prefill chunks, FCFS,
  within ``token_budget`` tokens. It then passes through the stages in order, queueing at a busy stage
  and paying the activation transfer between stages, so a stage's idle time shows. An iteration's time
  on a stage is the perf model's decode step (batch, mean context) plus its prefill time for the chunk
  (time-shared, as the template capacities assume). The sequence whose prefill completes emits its
  first token at the end of that iteration; each later iteration emits one token per decoding sequence.
- **KV cache** per stage, in tokens (what fits beside its layers and the model ends it holds). A sequence
  reserves its prompt (plus any tokens it regenerates) on admission and one token per decode step.
  Admission waits while a stage of the path is full. When the decode step cannot grow, the most recently
  admitted sequence of the micro-batch is preempted and recomputed later (vLLM's recompute policy). A
  request longer than a path's whole KV capacity fails (``too_long``).
- **Disaggregated** deployments (prefill-mode and decode-mode templates in one region): the prefill
  instance emits the first token, then hands the request to a decode instance of the same region chosen
  as the router does (only those whose KV transfer holds behind the sender, ``Template.kv_min_nic``, all
  when none does; by weight among those with room) and sends it the KV cache (prompt tokens x
  ``kv_bytes_per_token`` over the smaller NIC of the two instances, plus the network latency); that time
  shows in TPOT and end-to-end latency.
- **Fleet**: ``plan_fn`` is called at t=0, every ``replan_interval_s``, at each step of a demand
  series, and at each market change and fault. The demand it sees per deployment is the series value at
  that moment (times ``rate_scale``), or for trace demand the trace's highest 60 s rate over the next
  replan interval (scaled, and split by share when one trace feeds several deployments): the plan must
  hold until the next re-plan, and the mesh's demand monitor likewise plans for the recent peak of its
  sliding means. The peak, not the mean: the Azure conversation trace bursts to 1.3-1.4x its 5-minute mean
  for minutes at a time, and the planner's queueing headroom is sized for Poisson arrivals at the planned
  rate, not for a burst on top. New instances are
  ready after ``provision_s`` (the nodes), then the slowest stage's ``load_s`` plus ``startup_s`` (the
  engine), as in the mesh's simulated cloud (``SimConfig``; the t=0 fleet is warm unless
  ``warm_start`` is off); starts beyond a node type's availability wait until nodes free.
  Plans are reconciled as the mesh's supervisor does (``actors.supervisor``): a surplus instance still
  on its way is a bridge (it keeps loading, and retires once it serves) while its deployment's serving
  capacity with the bridges before it is below min(its demand, the plan's capacity); other surplus
  instances stop if not serving yet, and retire if serving: a retiring instance keeps serving until its
  deployment's capacity without it holds the transition's floor, min(the capacity serving or bridged
  when the plan came, the plan's capacity), or until a waiting start needs its nodes; then it drains: it
  takes no new work, its waiting requests go back to the router, and it releases its nodes when its last
  sequence ends. Faults kill instances
  holding the named node type; their requests are retried elsewhere (counted) and keep the tokens they
  already streamed.
- **Cost** integrates the price of every node held (loading, serving, draining) over time.
- Arrivals stop at ``duration_s``; the run continues until every request has completed or failed (at
  most ``drain_limit_s`` more; what is left then fails as ``unfinished``).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from coral.demand import DemandEstimator, moved
from coral.perf import PerfModel
from coral.scenario import Scenario
from coral.sim.arrivals import (
    ArrivalSource,
    LengthDist,
    PoissonArrivals,
    ShareSplitter,
    TraceArrivals,
)
from coral.sim.fleet import Fleet
from coral.sim.report import SimResult
from coral.sim.state import (
    DEAD,
    K_ARRIVAL,
    K_FAULT,
    K_HANDOFF,
    K_MARKET,
    K_MONITOR,
    K_PLAN,
    K_READY,
    K_REPLAN,
    K_STAGE,
    K_TICK,
    PlanFn,
    Req,
    SimConfig,
    SimError,
)
from coral.templates import Template


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


class _Sim(Fleet):
    """The event loop: arrivals from the sources, then every event in time order (see the module docstring)."""

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
        super().__init__(scenario, templates, perf, plan_fn, cfg, seed, duration_s, interval_s)
        self.router_queues = True
        self._make_sources(trace, rate_scale, on_bad_row, arrivals, self.arrival_seed)

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

    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        tuning = self.cfg.monitor
        if tuning is not None:
            prior = {d.name: float(self.rate_fns[d.idx](0.0)) for d in self.deps}
            self.monitor = DemandEstimator([d.name for d in self.deps], prior, tuning, 0.0)
            self.mon_counts = [0] * len(self.deps)
            self.mon_demand = self.monitor.estimate()
            self._push(min(self.cfg.monitor_tick_s, self.duration), K_MONITOR, 0.0)
        self._replan(0.0, "initial", first=True)
        k = 1
        ri = self.sc.planner.replan_interval_s
        while k * ri < self.duration:
            self._push(k * ri, K_REPLAN, None)
            k += 1
        for ch in self.sc.market:
            if 0 < ch.at < self.duration:
                self._push(ch.at, K_MARKET, ch)
        if self.series_deps and self.monitor is None:
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
            elif kind == K_MONITOR:
                self._monitor(obj, t)
            elif kind == K_PLAN:
                self._land(t)
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

    def _waiting(self) -> dict[str, int]:
        """Requests waiting per deployment, as the mesh's router counts them: in the router's queue, or
        at an instance that has not started them (its queue and its paths' waiting lines)."""
        out = {d.name: len(d.entry.pullq.q) for d in self.deps}
        if self.router_queues:
            for inst in self.insts.values():
                n = self._unstarted(inst)
                if n:
                    out[inst.dep.name] += n
        return out

    def _monitor(self, since: float, t: float) -> None:
        """The demand monitor's tick: observe the arrivals since the last, re-plan when the estimate moved."""
        assert self.monitor is not None and self.mon_demand is not None and self.cfg.monitor is not None
        self.monitor.observe(since, t, {d.name: self.mon_counts[d.idx] for d in self.deps})
        for d in self.deps:
            self._expire(d.entry.pullq.q, t)
        self.monitor.backlog(self._waiting())
        self.mon_counts = [0] * len(self.deps)
        est = self.monitor.estimate()
        if moved(self.mon_demand, est, self.monitor):
            self.mon_demand = est
            self.monitor.published(est)
            self._replan(t, "demand")
        if t < self.duration:
            self._push(min(t + self.cfg.monitor_tick_s, self.duration), K_MONITOR, t)

    def _arrive(self, a: tuple[float, int, int, int], t: float) -> None:
        dep = self.deps[a[1]]
        if self.monitor is not None:
            self.mon_counts[dep.idx] += 1
        req = Req(dep, t, a[2], a[3] if a[3] > 0 else 1)
        st = dep.stats
        st.requests += 1
        st.iv_arrivals += 1
        self.active += 1
        self._route(req, t, False)


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


__all__: Sequence[str] = ("PlanFn", "SimConfig", "SimError", "simulate")
