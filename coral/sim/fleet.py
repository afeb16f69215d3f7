"""Fleet changes: instances started, loaded, retired, drained, stopped and killed as plans, market
changes and faults arrive; re-planning; the cost of every node held; and the per-interval series."""

from __future__ import annotations

import itertools
import math
import time

from coral.perf.roofline import NET_LATENCY_S
from coral.plan import Plan, PlanRequest
from coral.scenario import FaultEvent, MarketChange
from coral.sim.batching import Batching
from coral.sim.state import (
    DEAD,
    DRAINING,
    K_PLAN,
    K_READY,
    K_TICK,
    LOADING,
    SERVING,
    Group,
    Inst,
    PathRT,
    Req,
    SimError,
    StageRT,
    template_paths,
)


class Fleet(Batching):
    """Fleet changes and the accounts (see the module docstring)."""

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
            self._push(t + self.cfg.provision_s + load + self.cfg.startup_s, K_READY, inst)
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
            ends = (s.start == 0, s.end == m.num_layers)  # exact ends, as the placers charge them
            base = float(
                self.perf.stage_bytes(tpl.model, layers=s.layers, batch=1, context=0, node=s.node, tp=s.tp, ends=ends)
            )
            free = self.perf.usable_bytes(s.node, s.tp) - base
            cap = max(0, int(free // (s.layers * m.kv_bytes_per_token_layer)))
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
        """Make a plan from the state at ``t``; apply it now, or at ``t + plan_delay_s`` (``SimConfig``)."""
        delay = 0.0 if first else self.cfg.plan_delay_s
        if delay > 0 and self.flight is not None:
            self.held_triggers.add(trigger)
            return
        if self.mon_demand is not None:
            demand = dict(self.mon_demand)
        else:
            demand = {d.name: float(self.rate_fns[d.idx](t)) for d in self.deps}
        req = PlanRequest(
            at=t,
            demand=demand,
            prices=dict(self.price),
            availability=dict(self.avail),
            current=self._live_counts(),
            trigger=trigger,
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
        if delay > 0:
            self.flight = target
            self._push(t + delay, K_PLAN, None)
            return
        self._apply(target, t, first)

    def _land(self, t: float) -> None:
        """Apply the plan in flight; the triggers that came meanwhile make the next plan now."""
        target, self.flight = self.flight, None
        assert target is not None
        self._apply(target, t, False)
        if self.held_triggers:
            trigger = "+".join(sorted(self.held_triggers))
            self.held_triggers.clear()
            self._replan(t, trigger)

    def _apply(self, target: dict[tuple[str, str, str], int], t: float, first: bool) -> None:
        """Start and retire instances towards ``target`` (make before break)."""
        live = self._live_counts()
        self.pending = {}
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
