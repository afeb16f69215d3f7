"""Fleet changes: instances started, loaded, retired, drained, stopped and killed as plans, market
changes and faults arrive; re-planning; the cost of every node held; and the per-interval series."""

from __future__ import annotations

import itertools
import math
import time

from coral.capacity import capacity_rps
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
    DepRT,
    Group,
    Inst,
    PathRT,
    Req,
    SimError,
    StageRT,
    template_paths,
)
from coral.templates import Template


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
            inst.t_up = t
            self._ready(inst, t)
        else:
            inst.t_up = t + self.cfg.provision_s
            load = max(self.perf.load_s(tpl.model, s.node, s.layers) for s in tpl.stages)
            self._push(inst.t_up + load + self.cfg.startup_s, K_READY, inst)
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
        inst.weight = _weight(tpl, inst.dep)
        inst.bound = self._bound(inst)

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
        if inst.bridge:  # it serves until its replacement does (make before break)
            inst.bridge = False
            inst.retiring = True
        g = self._group(inst)
        g.insts.append(inst)
        g.rebuild()
        for p in inst.paths:
            p.pullq = inst.pq if self.router_queues else g.pullq
            if p.idle:
                p.pullq.idle[p] = None
        if self.router_queues:
            self._drain_router(g, t)
        else:
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
            p.pullq.idle.pop(p, None)

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
        moved.extend(inst.pq.q)
        inst.pq.q.clear()
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
            self._retire(t)

    def _start_pending(self, t: float) -> None:
        for key in sorted(self.pending):
            while self.pending.get(key, 0) > 0 and self._start_or_free(key, t, False):
                self.pending[key] -= 1
            if self.pending.get(key) == 0:
                del self.pending[key]

    def _evict(self, inst: Inst) -> list[Req]:
        """Every request held by ``inst`` (waiting, prefilling, decoding), reset to be recomputed."""
        out: list[Req] = list(inst.pq.q)
        inst.pq.q.clear()
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
        self._retire(t)

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
            if i.state == LOADING or (i.state == SERVING and not i.retiring):  # bridges count, as in the mesh
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
            self.flight = (plan, target)
            self._push(t + delay, K_PLAN, None)
            return
        self._apply(plan, target, t, first)

    def _land(self, t: float) -> None:
        """Apply the plan in flight; the triggers that came meanwhile make the next plan now."""
        flight, self.flight = self.flight, None
        assert flight is not None
        self._apply(*flight, t, False)
        if self.held_triggers:
            trigger = "+".join(sorted(self.held_triggers))
            self.held_triggers.clear()
            self._replan(t, trigger)

    def _apply(self, plan: Plan, target: dict[tuple[str, str, str], int], t: float, first: bool) -> None:
        """Reconcile the fleet to ``plan`` (``target``: its validated counts), as the mesh's supervisor does:
        surplus instances still on their way become bridges while their deployment serves too little, the
        others stop (serving ones retire: they drain once the transition's floor holds without them), and
        missing ones start (or wait for nodes)."""
        self.pending = {}
        self.planned_demand = {s.deployment: s.demand_rps for s in plan.serving}
        planned = capacity_rps(
            (dep, region, self.templates[tid].mode, _weight(self.templates[tid], self.dep_by_name[dep]))
            for (dep, tid, region), n in target.items()
            for _ in range(n)
        )
        live: dict[tuple[str, str, str], list[Inst]] = {}
        for i in self.insts.values():
            if i.state in (LOADING, SERVING):
                live.setdefault(i.key, []).append(i)
        surplus: list[Inst] = []
        changed = False
        for key in sorted(set(target) | set(live)):
            have = sorted(live.get(key, []), key=lambda i: (self._rank(i, t), -i.id))
            cut = max(0, len(have) - target.get(key, 0))
            surplus += have[:cut]
            for inst in have[cut:]:
                inst.retiring = inst.bridge = False  # wanted again
            live[key] = have[cut:]
        bridges = self._bridges(surplus, planned, t)
        for inst in surplus:
            if inst in bridges:
                inst.bridge = True
            elif not inst.retiring:
                changed = True
                inst.bridge = False
                if inst.state == LOADING:
                    self._stop(inst, t)
                else:
                    inst.retiring = True
        coming = self._capacity([*self._routable(), *bridges])
        self.floor = {d.name: min(coming.get(d.name, 0.0), planned.get(d.name, 0.0)) for d in self.deps}
        for key in sorted(target):
            for _ in range(target[key] - len(live.get(key, []))):
                changed = True
                if not self._start_or_free(key, t, first and self.cfg.warm_start):
                    self.pending[key] = self.pending.get(key, 0) + 1
        self._retire(t)
        if changed:
            self.plan_changes.append(t)

    def _rank(self, inst: Inst, t: float) -> int:
        """The supervisor's order of victims: provisioning, loading, then serving (newest first within)."""
        if inst.state == SERVING:
            return 2
        return 1 if t >= inst.t_up else 0

    def _routable(self) -> list[Inst]:
        return [i for i in self.insts.values() if i.state == SERVING]

    def _capacity(self, insts: list[Inst]) -> dict[str, float]:
        return capacity_rps((i.dep.name, i.region, i.mode, i.weight) for i in insts)

    def _bridges(self, surplus: list[Inst], planned: dict[str, float], t: float) -> list[Inst]:
        """The surplus instances still on their way that keep loading: per deployment, the nearest to
        serving first (loading before provisioning, oldest first), while its serving capacity plus theirs
        stays below min(its demand, the new plan's capacity) (``actors.supervisor``)."""
        have = self._routable()
        kept: list[Inst] = []
        coming = [i for i in surplus if i.state == LOADING]
        for inst in sorted(coming, key=lambda i: (self._rank(i, t) != 1, i.id)):
            d = inst.dep.name
            need = min(self.planned_demand.get(d, 0.0), planned.get(d, 0.0))
            if self._capacity([*have, *kept]).get(d, 0.0) < need - 1e-6:
                kept.append(inst)
        return kept

    def _free(self, region: str, node: str) -> int:
        return self.avail.get((region, node), 0) - self.held.get((region, node), 0)

    def _start_or_free(self, key: tuple[str, str, str], t: float, warm: bool) -> bool:
        """Start an instance of ``key``; when nodes are lacking that bridges (not serving yet) of its region
        hold, enough of them to cover the shortfall, stop those and start."""
        if self._start(key, t, warm):
            return True
        _, tid, region = key
        need: dict[str, int] = {}
        for n in self.templates[tid].nodes:
            need[n] = need.get(n, 0) + 1
        lack = {n: k - self._free(region, n) for n, k in need.items() if k > self._free(region, n)}
        picks: list[Inst] = []
        cover: dict[str, int] = {}
        for inst in sorted(self.insts.values(), key=lambda i: -i.id):
            if not (inst.bridge and inst.region == region and inst.state == LOADING):
                continue
            if not set(inst.nodes) & set(lack):
                continue
            picks.append(inst)
            for n in inst.nodes:
                cover[n] = cover.get(n, 0) + 1
            if all(cover.get(n, 0) >= k for n, k in lack.items()):
                break
        if not lack or not all(cover.get(n, 0) >= k for n, k in lack.items()):
            return False
        pending, self.pending = self.pending, {}  # the freed nodes are for this start, not the waiting ones
        for inst in picks:
            inst.bridge = False
            self._stop(inst, t)
        self.pending = pending
        return self._start(key, t, warm)

    def _retire(self, t: float) -> None:
        """Make before break, as the mesh's supervisor: a retiring instance drains once its deployment's
        serving capacity without it stays at or above the transition's floor, min(the capacity serving or
        bridged when the plan came, the plan's capacity); and retiring instances whose nodes a waiting start
        lacks drain for it (``_blocking``)."""
        if self.retiring_now:
            return
        self.retiring_now = True
        try:
            keep = self._routable()
            for inst in sorted(keep, key=lambda i: i.id):
                if not inst.retiring:
                    continue
                rest = [i for i in keep if i is not inst]
                if self._capacity(rest).get(inst.dep.name, 0.0) >= self.floor.get(inst.dep.name, 0.0) - 1e-9:
                    keep = rest
                    inst.retiring = False
                    self._stop(inst, t)
            for inst in self._blocking():
                inst.retiring = False
                self._stop(inst, t)
        finally:
            self.retiring_now = False

    def _blocking(self) -> list[Inst]:
        """Retiring instances whose nodes are exactly what a waiting start lacks, enough to cover it; only
        when the start's deployment serves less than its demand or their own has no replacement on its way,
        and a deployment's last capacity only for its own replacement, one at a time
        (``actors.supervisor``)."""
        spare: dict[tuple[str, str], int] = {}  # draining instances' nodes are coming free
        for inst in self.insts.values():
            if inst.state == DRAINING:
                for n in inst.nodes:
                    spare[(inst.region, n)] = spare.get((inst.region, n), 0) + 1
        retiring = sorted((i for i in self.insts.values() if i.state == SERVING and i.retiring), key=lambda i: -i.id)
        coming = {i.dep.name for i in self.insts.values() if i.state == LOADING}
        chosen: list[Inst] = []
        taken: set[int] = set()
        for key in sorted(self.pending):
            dep, tid, region = key
            need: dict[str, int] = {}
            for n in self.templates[tid].nodes:
                need[n] = need.get(n, 0) + 1
            lack: dict[str, int] = {}
            for node, k in need.items():
                have = self._free(region, node) + spare.get((region, node), 0)
                if k > have:
                    lack[node] = k - have
                spare[(region, node)] = max(0, spare.get((region, node), 0) - k)
            if not lack:
                continue
            picks: list[Inst] = []
            cover: dict[str, int] = {}
            left = [i for i in self._routable() if i.id not in taken]
            urgent = self._capacity(left).get(dep, 0.0) < self.planned_demand.get(dep, 0.0) - 1e-6
            for inst in retiring:
                if inst.id in taken or inst.region != region or not set(inst.nodes) <= set(lack):
                    continue
                d = inst.dep.name
                if not urgent and d in coming:
                    continue  # its own replacements will serve and free it
                rest = [i for i in left if i is not inst]
                if self._capacity(rest).get(d, 0.0) <= 1e-9 and (
                    d != dep or self._in_flight(d, taken | {i.id for i in picks})
                ):
                    continue  # the last capacity: only for its own replacement, and one at a time
                left = rest
                picks.append(inst)
                for n in inst.nodes:
                    cover[n] = cover.get(n, 0) + 1
                if all(cover.get(n, 0) >= k for n, k in lack.items()):
                    break
            if not all(cover.get(n, 0) >= k for n, k in lack.items()):
                continue
            for inst in picks:
                taken.add(inst.id)
                chosen.append(inst)
            for node, k in cover.items():
                if k > lack.get(node, 0):
                    spare[(region, node)] = spare.get((region, node), 0) + k - lack.get(node, 0)
        return chosen

    def _in_flight(self, dep: str, picked: set[int]) -> bool:
        """Whether ``dep`` has an instance on its way, draining, or picked to drain."""
        return any(
            i.dep.name == dep and (i.state in (LOADING, DRAINING) or i.id in picked) for i in self.insts.values()
        )

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
                self._expire(pq.q, t)
        for inst in self.insts.values():
            if inst.pq.q:
                self._expire(inst.pq.q, t)
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
                    queue += len(inst.pq.q)
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


def _weight(tpl: Template, d: DepRT) -> float:
    """Requests/s an instance of ``tpl`` serves at ``d``'s shape: its routing weight and capacity."""
    if tpl.mode == "prefill":
        w = tpl.prefill_tok_s / d.shape_in
    elif tpl.mode == "decode":
        w = tpl.decode_tok_s / d.shape_out
    else:
        w = tpl.requests_per_s(d.shape_in, d.shape_out)
    return w if w > 0 else 1.0
