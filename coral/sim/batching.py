"""Requests through instances: routing by capacity weight, admission to a path's waiting line or the
deployment's queue, continuous batching into micro-batches that pass the stages, KV-cache reservations
and preemption, completion, and the KV hand-off of disaggregated deployments."""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque

from coral.perf.roofline import NET_LATENCY_S
from coral.routing import instance_bound, kv_compatible
from coral.sim.state import (
    _EMPTY,
    DRAINING,
    K_HANDOFF,
    K_STAGE,
    MB,
    SERVING,
    Group,
    Inst,
    PathRT,
    Req,
    SimState,
    StageRT,
)


class Batching(SimState):
    """Requests through instances (see the module docstring)."""

    def _route(self, req: Req, t: float, front: bool) -> None:
        g = req.dep.entry
        if self.router_queues:
            self._dispatch(g, req, t, front)
        else:
            self._route_group(g, req, t, front)

    def _dispatch(self, g: Group, req: Req, t: float, front: bool) -> None:
        """The mesh's router (``SimState.router_queues``): to an instance with room under its bound, drawn by
        weight, into that instance's own queue; when none has room, into the deployment's queue (the
        router's), which ``_drain_router`` empties in order as room opens."""
        cands = self._room(g)
        if cands:
            self._enqueue(self._draw(cands), req, t)
            return
        q = g.pullq.q
        if len(q) >= self.qlimit:
            self._fail(req, "queue_full")
            return
        req.deadline = t + self.qtimeout
        if front:
            q.appendleft(req)
        else:
            q.append(req)

    def _room(self, g: Group) -> list[Inst]:
        """The instances of ``g`` with room under the router's bound (the hot path: no helper calls)."""
        out = []
        for i in g.insts:
            h = i.n_active + i.incoming + len(i.pq.q)
            for p in i.paths:
                h += len(p.waiting)
            if h < i.bound:
                out.append(i)
        return out

    def _draw(self, cands: list[Inst]) -> Inst:
        """One of ``cands`` with probability proportional to its weight (seeded)."""
        x = self.route_u.next() * sum(i.weight for i in cands)
        acc = 0.0
        for i in cands:
            acc += i.weight
            if x < acc:
                return i
        return cands[-1]

    def _enqueue(self, inst: Inst, req: Req, t: float) -> None:
        """``req`` reaches ``inst``'s engine: into a path's line if one has room and none waits before it, else
        into the instance's own queue, where it fails ``queue_timeout_s`` after it began to wait for this
        phase (its arrival, or its KV's; ``coral.engines.sim``)."""
        since = t if req.kv_ready or req.retries else req.t_arr
        req.deadline = since + self.qtimeout
        own = inst.pq
        if not own.q and self._take(inst, req, t):
            return
        own.q.append(req)
        if own.idle:
            self._wake(next(iter(own.idle)), t)

    def _drain_router(self, g: Group, t: float) -> None:
        """Place what waits in the router's queue, oldest first, while some instance has room."""
        q = g.pullq.q
        while q:
            cands = self._room(g)
            if not cands:
                return
            req = q.popleft()
            if req.deadline < t:
                self._fail(req, "queue_timeout")
                continue
            self._enqueue(self._draw(cands), req, t)

    def _expire(self, q: deque[Req], t: float) -> None:
        """Fail the requests of ``q`` whose wait has run out."""
        if any(r.deadline < t for r in q):
            keep = [r for r in q if r.deadline >= t]
            for r in q:
                if r.deadline < t:
                    self._fail(r, "queue_timeout")
            q.clear()
            q.extend(keep)

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
                lo = bisect.bisect_right(cum, x, 0, n - 1)
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
        if self.router_queues and (fin is not None or n_act) and inst.state == SERVING:
            g = inst.dep.decode.get(inst.region) if inst.mode == "decode" else inst.dep.entry
            if g is not None and g.pullq.q:
                self._drain_router(g, t)
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

    def _bound(self, inst: Inst) -> int:
        """The most requests the mesh's router gives ``inst`` at once: ``weight × (service + instance_queue_s)``
        (``actors.router``; service is the SLO's time for one request in the instance's mode)."""
        d = inst.dep
        return instance_bound(inst.weight, inst.mode, d.ttft, d.shape_out * d.tpot, self.cfg.instance_queue_s)

    def _held(self, inst: Inst) -> int:
        return inst.n_active + inst.incoming + self._unstarted(inst)

    @staticmethod
    def _unstarted(inst: Inst) -> int:
        """Requests ``inst`` holds but has not started: its queue and its paths' waiting lines."""
        return len(inst.pq.q) + sum(len(p.waiting) for p in inst.paths)

    def _decode_for(self, req: Req, region: str, nic: float) -> Inst | None:
        """The decode instance a handoff from a sender whose slowest NIC is ``nic`` goes to, as the router
        chooses: among the region's serving decode instances whose KV transfer holds behind it
        (``Template.kv_min_nic``; all of them when none does), those with room under the router's bound, by
        weight. When every one is full the router holds the request until one has room; here it is drawn
        among them all and waits in that instance's own line."""
        g = req.dep.decode.get(region)
        if g is None or not g.insts:
            return None
        ok = kv_compatible(g.insts, nic, lambda i: i.tpl.kv_min_nic) or g.insts
        return self._draw([i for i in ok if self._held(i) < i.bound] or ok)

    def _handoff(self, req: Req, src: Inst, t: float) -> None:
        dst = self._decode_for(req, src.region, src.min_nic)
        bw = min(src.min_nic, dst.min_nic) if dst is not None else src.min_nic  # the actual pair's link
        m = self.catalog.models[req.dep.model]
        dt = NET_LATENCY_S + (req.prompt + req.gen - 1) * m.kv_bytes_per_token / bw
        req.hint = dst
        if dst is not None:
            dst.incoming += 1
        req.kv_ready = True
        self.in_transit[id(req)] = req
        self._push(t + dt, K_HANDOFF, (req, src.region, src.min_nic))

    def _handoff_done(self, obj: tuple[Req, str, float], t: float) -> None:
        req, region, nic = obj
        if self.in_transit.pop(id(req), None) is None:
            return
        dst = req.hint
        req.hint = None
        if dst is not None:
            dst.incoming -= 1
            if dst.state != SERVING:  # lost or drained while the KV was on its way: the router places it again
                dst = self._decode_for(req, region, nic)
        if dst is not None:
            self._enqueue(dst, req, t)
            return
        g = req.dep.decode.get(region)
        if g is None:
            g = req.dep.decode[region] = Group()
        self._route_group(g, req, t, False)

    def _release(self, inst: Inst, t: float) -> None:
        """Free an instance's nodes once its last sequence ends (``Fleet._release``)."""
        raise NotImplementedError
