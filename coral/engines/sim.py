"""The simulated engine: one instance run by the fleet simulator's timing model (``coral.sim.engine``).

The head node's engine holds the whole instance exactly as the simulator models it (continuous batching,
micro-batches through pipeline stages with activation transfers, KV admission and recompute preemption,
prefill chunks within a token budget); the other nodes' engines only load their stage and report their
health. The instance model is the simulator's own: ``_InstanceModel`` reuses ``coral.sim.engine._Sim``'s
per-instance methods on a state that holds one instance, so there is one timing model, not two.

Time: the engine advances only in ``poll(now)``, processing its event heap up to ``now``; requests
submitted with ``avail`` in the engine's past are admitted at the engine's current time. A request handed
over from a prefill instance (``WorkItem.kv_nic`` > 0) first pays the KV transfer, as in the simulator:
the network latency plus its tokens' KV bytes over the slower of the two instances' NICs.

Queue timeout: a request that waits in the instance's queue fails ``queue_timeout_s`` after it began to
wait for this phase, as in the simulator, where it waits in one queue: its arrival (a first attempt) or its
handoff's KV arriving (a decode request), not its admission here; the mesh's router may have held it
before (every instance full), and two timeouts in a row would let it wait twice as long and then be
served late, after its SLO, in front of fresher requests.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence

import numpy as np

from coral.engines import EngineError, EngineMetrics, StageAssignment, check_load
from coral.messages.requests import Outcome, WorkItem
from coral.perf import PerfModel
from coral.perf.roofline import NET_LATENCY_S
from coral.sim.engine import _Sim
from coral.sim.state import (
    DEAD,
    DRAINING,
    K_ARRIVAL,
    K_STAGE,
    LOADING,
    MB,
    DepRT,
    Inst,
    PathRT,
    Req,
    SimConfig,
    Uniforms,
)


class _InstanceModel(_Sim):
    """The simulator's state reduced to one instance; completions are collected instead of counted."""

    def __init__(self, perf: PerfModel, stage: StageAssignment, cfg: SimConfig, seed: int) -> None:
        # Deliberately not calling _Sim.__init__: it builds a whole fleet with arrival sources.
        self.perf = perf
        self.catalog = perf.catalog
        self.cfg = cfg
        self.budget = cfg.token_budget
        self.qlimit = cfg.queue_limit
        self.qtimeout = cfg.queue_timeout_s
        self.heap = []
        self.seq = 0
        self.now = 0.0
        self.tables = {}
        self.preemptions = 0
        self.route_u = Uniforms(np.random.default_rng(seed))
        self.dep = DepRT(0, stage.deployment)
        tpl = stage.template
        self.inst = Inst(0, self.dep, tpl, stage.region, (stage.deployment.name, tpl.id, stage.region))
        self._build(self.inst)
        self.kv_bytes = float(self.catalog.models[tpl.model].kv_bytes_per_token)
        self.items: dict[Req, WorkItem] = {}
        self.out: list[Outcome] = []
        self.since: dict[Req, float] = {}  # when an admitted request began to wait (module docstring)
        self.drained_at: float | None = None
        self.completed = 0
        self.failed = 0

    def _complete(self, req: Req, t: float) -> None:
        item = self.items.pop(req)
        self.completed += 1
        self.out.append(Outcome(item.id, "done", t, req.first_t))

    def _fail(self, req: Req, reason: str) -> None:
        item = self.items.pop(req, None)
        if item is None:
            return
        self.failed += 1
        self.out.append(Outcome(item.id, "failed", self.now, req.first_t, reason))

    def _handoff(self, req: Req, src: Inst, t: float) -> None:
        item = self.items.pop(req)
        self.out.append(Outcome(item.id, "handoff", t, req.first_t, tokens=req.gen))

    def _retire(self, t: float) -> None:
        """One instance has no fleet to make before breaking: its supervisor retires it."""

    def _release(self, inst: Inst, t: float) -> None:
        inst.state = DEAD
        for p in inst.paths:
            for mb in p.mbs:
                mb.dead = True
        self.drained_at = t


class SimEngine:
    """The simulated engine of one node (see the module docstring)."""

    def __init__(self, perf: PerfModel, *, config: SimConfig | None = None, seed: int = 0) -> None:
        self.perf = perf
        self.config = config or SimConfig()
        self.seed = seed
        self.stage: StageAssignment | None = None
        self.ready_at: float | None = None
        self._model: _InstanceModel | None = None
        self._bounced: list[Outcome] = []
        self._draining = False
        self._stopped = False
        self._min_iter: dict[PathRT, float] = {}

    # -- lifecycle ----------------------------------------------------------------------------------

    def load(self, stage: StageAssignment, now: float) -> float:
        """Start loading ``stage``; return the time it is ready (the weight load plus the start-up)."""
        check_load(self.stage, stage)
        tpl = stage.template
        s = tpl.stages[stage.stage]
        load = 0.0 if stage.warm else self.perf.load_s(tpl.model, s.node, s.layers) + self.config.startup_s
        self.stage = stage
        self.ready_at = now + load
        if stage.head:
            self._model = _InstanceModel(self.perf, stage, self.config, self.seed)
        return self.ready_at

    def loaded(self, now: float) -> bool:
        """Whether the stage is ready at ``now``."""
        return self.ready_at is not None and now >= self.ready_at

    @property
    def fault(self) -> str:
        """The simulated engine never faults by itself (the simulated cloud kills its node instead)."""
        return ""

    def serve(self, now: float) -> None:
        """Every stage is loaded: the instance serves from ``now``."""
        m = self._model
        if m is None or m.inst.state != LOADING:
            return
        m.now = max(m.now, now)
        m._ready(m.inst, m.now)

    def submit(self, items: Sequence[WorkItem], now: float) -> None:
        """Queue requests for the instance; after a drain or stop they are handed back at the next poll."""
        m = self._head("submit")
        if self._draining or self._stopped:
            self._bounced.extend(Outcome(i.id, "returned", now) for i in items)
            return
        for item in items:
            req = Req(m.dep, item.t_arr, item.prompt, max(item.out, 1))
            avail = item.avail
            if item.kv_nic > 0:
                req.gen = max(item.gen, 1)
                req.first_t = item.first_t
                req.kv_ready = True
                bw = min(item.kv_nic, m.inst.min_nic)
                avail += NET_LATENCY_S + (item.prompt + req.gen - 1) * m.kv_bytes / bw
            m.since[req] = avail if item.kv_nic > 0 or item.attempt > 0 else item.t_arr
            m.items[req] = item
            m.seq += 1
            heapq.heappush(m.heap, (max(avail, m.now), m.seq, K_ARRIVAL, req))

    def poll(self, now: float) -> list[Outcome]:
        """Run the instance up to ``now``; return what finished since the previous poll."""
        out, self._bounced = self._bounced, []
        m = self._model
        if m is None or self._stopped:
            return out
        heap = m.heap
        while heap and heap[0][0] <= now:
            t, _, kind, obj = heapq.heappop(heap)
            m.now = t
            if kind == K_STAGE:
                m._stage_done(obj, t)
            elif kind == K_ARRIVAL:
                m._route_group(m._group(m.inst), obj, t, False)
                obj.deadline = min(obj.deadline, m.since.pop(obj, t) + m.qtimeout)
        pq = m._group(m.inst).pullq.q
        while pq and pq[0].deadline < now:
            req = pq.popleft()
            m.now = max(m.now, req.deadline)
            m._fail(req, "queue_timeout")
        m.now = max(m.now, now)
        out.extend(m.out)
        m.out = []
        return out

    def metrics(self) -> EngineMetrics:
        m = self._model
        if m is None:
            return EngineMetrics()
        return EngineMetrics(
            in_flight=len(m.items),
            queued=self.waiting(),
            completed=m.completed,
            failed=m.failed,
            preemptions=m.preemptions,
            busy_s=sum(s.busy_s for s in m.inst.stages),
        )

    def drain(self, now: float) -> list[Outcome]:
        """Stop taking work: return the requests not started yet; the active ones run to completion."""
        m = self._model
        self._draining = True
        if m is None or m.inst.state == DEAD:
            return []
        inst = m.inst
        pending: list[Req] = []
        if inst.state != LOADING:
            m._unlist(inst)
        for p in inst.paths:
            pending.extend(p.waiting)
            p.waiting.clear()
        pq = m._group(inst).pullq.q
        pending.extend(pq)
        pq.clear()
        arrivals = [e for e in m.heap if e[2] == K_ARRIVAL]
        if arrivals:
            m.heap = [e for e in m.heap if e[2] != K_ARRIVAL]
            heapq.heapify(m.heap)
            pending.extend(e[3] for e in sorted(arrivals))
            for e in arrivals:
                m.since.pop(e[3], None)
        back = [Outcome(m.items.pop(r).id, "returned", now) for r in pending if r in m.items]
        if inst.state == LOADING or inst.n_active == 0:
            m._release(inst, max(m.now, now))
        else:
            inst.state = DRAINING
        return back

    @property
    def drained(self) -> bool:
        """Whether a drain finished (or there is nothing to drain)."""
        if not self._draining:
            return False
        return self._model is None or self._model.drained_at is not None

    def stop(self, now: float) -> int:
        """Drop everything; return how many requests were abandoned."""
        self._stopped = True
        m = self._model
        if m is None:
            return 0
        n = len(m.items)
        m.items.clear()
        m.heap.clear()
        if m.inst.state != DEAD:
            m._release(m.inst, max(m.now, now))
        return n

    @property
    def model(self) -> _InstanceModel | None:
        """The head engine's instance model (None on other nodes)."""
        return self._model

    def waiting(self) -> int:
        """Requests the instance holds but has not started: in its queue or a path's waiting line."""
        m = self._model
        if m is None:
            return 0
        return len(m._group(m.inst).pullq.q) + sum(len(p.waiting) for p in m.inst.paths)

    def next_event_at(self) -> float | None:
        """The engine time of its next event (a request entering, a stage finishing), None when idle."""
        m = self._model
        if m is None or self._stopped or not m.heap:
            return None
        return float(m.heap[0][0])

    def handoff_window(self) -> tuple[float, float] | None:
        """When the next KV handoff can happen and by when it must be reported, if nothing is submitted,
        drained or stopped before then: ``(lo, due)``, or None when no request can be handed off.

        A handoff at ``h`` is admitted on its decode instance at ``h`` plus its KV transfer, at least
        ``slack`` = ``NET_LATENCY_S`` plus the prompt's KV bytes over this instance's slowest NIC (the
        decode instance's can only be slower); reported by ``h + slack`` it is still admitted exactly.
        Per micro-batch in flight, with its event at ``t`` and ``d`` the path's shortest iteration with a
        prefill: if this iteration finishes prompts, they hand off at ``t`` at the earliest and are due by
        ``t`` plus their least slack; any later handoff of it comes from a later iteration, at ``t + d`` at
        the earliest, due by then plus the least slack ``s`` of the requests held. While a path has an
        idle micro-batch, an arrival at ``t`` can start one: at ``t + d`` at the earliest, due ``s`` later.
        ``lo`` and ``due`` are the least of these.
        """
        m = self._model
        if m is None or self._stopped or not m.heap or not m.items:
            return None
        inst = m.inst
        per_token = m.kv_bytes / inst.min_nic
        s = NET_LATENCY_S + min(r.prompt for r in m.items) * per_token
        idle = any(p.idle for p in inst.paths)
        lo = due = math.inf
        for t, _, kind, obj in m.heap:
            if t >= due:
                continue
            if kind == K_STAGE:
                mb: MB = obj
                if mb.dead:
                    continue
                nxt = t + self._shortest(mb.path)
                done = [r.prompt for r in itertools.islice(mb.pref, mb.c_np) if r.pre_done + r.chunk >= r.need_pre]
                if done:
                    lo = min(lo, t)
                    due = min(due, t + NET_LATENCY_S + min(done) * per_token, nxt + s)
                else:
                    lo = min(lo, nxt)
                    due = min(due, nxt + s)
            elif kind == K_ARRIVAL and idle:
                nxt = t + min(self._shortest(p) for p in inst.paths)
                lo = min(lo, nxt)
                due = min(due, nxt + s)
        return None if due == math.inf else (lo, due)

    def _shortest(self, path: PathRT) -> float:
        """A lower bound of one iteration with a prefill chunk on ``path``: each stage's least prefill time
        in its table (reads interpolate between table points, so never below it)."""
        got = self._min_iter.get(path)
        if got is None:
            got = self._min_iter[path] = sum(min(min(r) for r in st.table.prefill_rows[1:]) for st in path.stages)
        return max(got, 0.0)

    def progress(self) -> dict[int, tuple[int, float]]:
        """Per request in flight on this (head) engine: (tokens generated so far, first-token time or -1)."""
        m = self._model
        if m is None:
            return {}
        live: dict[Req, int] = {}  # a decoding sequence's count is kept lazily: its micro-batch's steps tell
        for p in m.inst.paths:
            for mb in p.mbs:
                for req in mb.dec:
                    live[req] = req.g_join + (mb.step - req.s_join)
        return {item.id: (live.get(req, req.gen), req.first_t) for req, item in m.items.items()}

    def _head(self, what: str) -> _InstanceModel:
        if self._model is None:
            where = "not loaded" if self.stage is None else f"node of stage {self.stage.stage} is not the head"
            raise EngineError(f"{what}: this engine takes no requests ({where})")
        return self._model


__all__ = ["SimEngine"]
