"""Deciding one labelled shape at a flow threshold F, exactly (``Labelled.decide``): boundaries placed
one at a time by the row enumeration (``enumerate_rows``, cut by ``_last_cut_ok``), runs of cut nodes
contracted into min-plus tables or Pareto fronts, free nodes given their least-latency option that meets
their cuts; and the screening of many labellings of one family in one enumeration (``screen``). With
option roles (``solvers.problem``) every shape node uses only the options its role allows
(``shape_roles``: the micro-batches of the shape's paths through it and the ends it holds), which the
shape fixes; the label-free tests before the decision (``family``) use every option, which only makes
them weaker, never wrong."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import attrs
import numpy as np

from solvers.problem import FIRST, LAST, Edge
from solvers.shapes.catalogue import Skeleton
from solvers.shapes.family import Family
from solvers.shapes.layout import Step, row_plan
from solvers.shapes.tables import ElementAt, Role, Tables


@attrs.frozen
class Witness:
    """A placement of one component: per node (option, start), and its edges (problem indices)."""

    option: dict[int, int]
    start: dict[int, int]
    edges: tuple[Edge, ...]


class TooBig(Exception):
    """A search would enumerate more rows than its work budget allows."""


class Budget:
    """The search's deterministic work budget: how many more rows it may enumerate."""

    __slots__ = ("left",)

    def __init__(self, rows: int) -> None:
        self.left = rows

    def spend(self, rows: int) -> None:
        """Count ``rows`` enumerated rows; TooBig when that exhausts the budget."""
        self.left -= rows
        if self.left < 0:
            raise TooBig(rows)


@attrs.frozen(eq=False)
class Prep:
    """A labelled shape at one threshold F (``Labelled.prep``): each element's tables (``ElementAt``),
    the paths' least latencies (metrics, paths), which of the family's cuts are kept (all their edges
    carry less than F), each cut's edge capacity, the kept cuts as (elements, edges' sum), and each
    element's range of layer counts (elements, 2), when known (``Family.spans``)."""

    els: list[ElementAt]
    base: np.ndarray
    kept: np.ndarray
    es: np.ndarray
    kept_cuts: list[tuple[list[int], float]]
    span: np.ndarray | None = None


def enumerate_rows(fam: Family, preps: Sequence[Prep], F: float, budget: Budget) -> tuple[np.ndarray, np.ndarray]:
    """For labellings of one family (``preps``, one each), every kept-boundary position vector
    0 = B_0 < ... < B_r = L in which each element's length has a usable option, no path's latency lower
    bound exceeds the limits and every kept cut can carry F, built boundary by boundary: the vectors
    (R, r + 1) and the index into ``preps`` of the labelling each belongs to (R,), grouped by labelling
    in order. A path's bound is its links plus, per element, its least latency at its length once that
    is known (at any length before). An element not yet ended holds at least its layers so far plus one
    per boundary left, so its capacity is at most the largest at that length or more; positions outside
    the lengths some option allows are never generated."""
    tb = fam.tb
    L = tb.L
    plan = row_plan(fam.sh, L)
    nl, ne = len(preps), len(fam.sh.elements)
    ok_tab = np.array([[x.allowed for x in pr.els] for pr in preps]).reshape(nl, ne, L + 1)
    lb = np.array([[x.lb_lat for x in pr.els] for pr in preps]).reshape(nl, ne, tb.nm, L + 1)
    acc = np.array([pr.base for pr in preps]).reshape(nl, tb.nm, -1).transpose(1, 0, 2)  # (nm, R, P)
    if any(pr.span is not None for pr in preps):  # only the lengths in each element's span
        span = np.array([pr.span if pr.span is not None else [[0, L]] * ne for pr in preps]).reshape(nl, ne, 2)
        kk = np.arange(L + 1)
        before_span = np.where(ok_tab[:, :, None, :], lb, np.inf).min(axis=3)
        ok_tab &= (kk >= span[:, :, :1]) & (kk <= span[:, :, 1:])
        with np.errstate(invalid="ignore"):
            rise = np.where(ok_tab[:, :, None, :], lb, np.inf).min(axis=3) - before_span  # (nl, ne, nm), >= 0
        acc = acc + (np.where(np.isfinite(rise), rise, 0.0).transpose(2, 0, 1) @ plan.onpath)
        acc[:, ~np.all(ok_tab.any(axis=2), axis=1), :] = np.inf  # an element with no length left: no row
    kmin = np.argmax(ok_tab, axis=2)  # (nl, ne)
    kmax = L - np.argmax(ok_tab[:, :, ::-1], axis=2)
    floor = np.where(ok_tab[:, :, None, :], lb, np.inf).min(axis=3)  # (nl, ne, nm)
    with np.errstate(invalid="ignore"):
        extra = (lb - floor[..., None]).transpose(0, 1, 3, 2)  # (nl, ne, L + 1, nm): latency above the least
    tabs: list[np.ndarray] = []
    before: list[np.ndarray] = []
    es = np.zeros((nl, 0))
    if F > 0 and any(pr.kept_cuts for pr in preps):
        es = np.where(np.array([pr.kept for pr in preps]), np.array([pr.es for pr in preps]), np.inf)  # (nl, C)
        ub = np.array([[x.ub_cap for x in pr.els] for pr in preps])
        ub = np.maximum(ub, -1e30).reshape(nl, ne, L + 1)  # finite, so that 0 x it is 0
        sufmax = np.maximum.accumulate(ub[:, :, ::-1], axis=2)[:, :, ::-1]
        tabs = [np.where(st.ended[None, :, None], ub, sufmax) for st in plan.steps]
        before = [sufmax, *tabs[:-1]]  # exact for the elements whose length is known before step t
    cmT = fam.cut_mat.T
    qq = np.arange(ne)[None, :]
    r = plan.r
    rows = np.zeros((nl, 1), np.int64)
    lab = np.arange(nl)
    for t in range(1, r + 1):
        st = plan.steps[t - 1]
        if t < r:
            lo = rows[:, -1] + 1
            if st.lo_q.size:
                lo = np.maximum(lo, (rows[:, st.lo_col] + kmin[lab[:, None], st.lo_q[None, :]]).max(axis=1))
            hi = np.full(rows.shape[0], L - (r - t))
            if st.hi_q.size:
                far = kmax[lab[:, None], st.hi_q[None, :]] - st.hi_off
                hi = np.minimum(hi, (rows[:, st.hi_col] + far).min(axis=1))
            if st.cl_q.size:
                lo = np.maximum(lo, (L - kmax[lab[:, None], st.cl_q[None, :]]).max(axis=1))
            if st.cu_q.size:
                hi = np.minimum(hi, (L - kmin[lab[:, None], st.cu_q[None, :]] - st.cu_off).min(axis=1))
            if tabs:
                hi = _last_cut_ok(rows, lab, lo, hi, st, before[t - 1], cmT, es, F, L)
            cnt = np.maximum(hi - lo + 1, 0)
            idx = np.repeat(np.arange(rows.shape[0]), cnt)
            start = np.cumsum(cnt) - cnt
            new = lo[idx] + (np.arange(idx.size) - start[idx])
        else:
            idx = np.arange(rows.shape[0])
            new = np.full(rows.shape[0], L, np.int64)
        budget.spend(idx.size)
        rows = np.concatenate([rows[idx], new[:, None]], axis=1)
        acc, lab = acc[:, idx], lab[idx]
        if st.ends.size:
            end = np.where(st.tail[None, :], L, rows[:, t][:, None])
            k = end - rows[:, st.starts]  # (R, elements whose length is now known)
            ok = ok_tab[lab[:, None], st.ends[None, :], k].all(axis=1)
            rows, acc, lab, k = rows[ok], acc[:, ok], lab[ok], k[ok]
            if st.onpath is not None:
                acc += extra[lab[:, None], st.ends[None, :], k].transpose(2, 0, 1) @ st.onpath
            ok = np.all(acc <= tb.budget[:, None, None], axis=(0, 2))
            rows, acc, lab = rows[ok], acc[:, ok], lab[ok]
        if tabs and rows.shape[0]:
            lens = np.minimum(rows[:, st.cb] + st.db - rows[:, st.ca] - st.da, L)
            most = tabs[t - 1][lab[:, None], qq, lens]  # (R, ne)
            ok = np.all(most @ cmT + es[lab] >= F, axis=1)
            rows, acc, lab = rows[ok], acc[:, ok], lab[ok]
        if rows.shape[0] == 0:
            break
    return rows, lab


def _last_cut_ok(
    rows: np.ndarray,
    lab: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    st: Step,
    tab: np.ndarray,
    cmT: np.ndarray,
    es: np.ndarray,
    F: float,
    L: int,
) -> np.ndarray:
    """Per row, the last position p in [lo, hi] for boundary t at which every kept cut may still carry F
    (lo - 1 when none), by bisection. Each element's capacity bound is its largest at its length or more
    (``tab``: exact for lengths known before t): its length grows with p, or does not depend on it, but
    for an element that starts at t and ends at L, taken at its longest (L - hi). So the bound of every
    cut falls as p grows, the positions that pass form a prefix of [lo, hi], and the later, exact test
    keeps only positions inside it."""
    ne = tab.shape[1]
    qq = np.arange(ne)[None, :]

    def passes(sel: np.ndarray, p: np.ndarray) -> np.ndarray:
        ext = np.concatenate([rows[sel], p[:, None]], axis=1)
        lens = np.minimum(ext[:, st.cb] + st.db - ext[:, st.ca] - st.da, L)
        if st.cl_q.size:
            lens[:, st.cl_q] = (L - hi[sel])[:, None]
        return np.all(tab[lab[sel, None], qq, lens] @ cmT + es[lab[sel]] >= F, axis=1)

    top = np.where(lo <= hi, hi, lo - 1)
    sel = np.flatnonzero(lo <= hi)
    fail = sel[~passes(sel, lo[sel])]
    top[fail] = lo[fail] - 1
    low = lo.copy()
    sel = np.flatnonzero(low < top)
    while sel.size:
        mid = (low[sel] + top[sel] + 1) // 2
        ok = passes(sel, mid)
        low[sel[ok]] = mid[ok]
        top[sel[~ok]] = mid[~ok] - 1
        sel = sel[low[sel] < top[sel]]
    return top


@functools.cache
def shape_roles(sk: Skeleton) -> tuple[Role, ...]:
    """Per node of the shape, its role (``solvers.problem``): the micro-batches through it, the summed
    stage counts of the shape's paths through it, and the ends it holds (layer 0 where its interval
    starts at boundary 0, the last layer where it ends at boundary m)."""
    depth = [0] * sk.s
    for path in sk.paths:
        for x in path:
            depth[x] += len(path)
    return tuple(
        (depth[x], (FIRST if sk.iv[x][0] == 0 else 0) | (LAST if sk.iv[x][1] == sk.m else 0)) for x in range(sk.s)
    )


class Labelled:
    """One shape with a problem node on each of its nodes (see ``decide``)."""

    def __init__(self, fam: Family, row: int) -> None:
        sh, tb = fam.sh, fam.tb
        self._work: dict[int, np.ndarray] = {}
        self._comp = 0
        self.sh, self.tb = sh, tb
        self.sk = sh.sk
        self.nodes = tuple(int(x) for x in fam.labels[row])
        s, n = sh.sk.s, tb.n
        self.pedge = {e: (n if e[0] == s else self.nodes[e[0]], n if e[1] == s else self.nodes[e[1]]) for e in sh.edges}
        self.segments, self.kept, self.elements = sh.segments, sh.kept, sh.elements
        self.elem_iv, self.elem_of, self.need = sh.elem_iv, sh.elem_of, sh.need
        self.paths_el = [list(p) for p in sh.paths_el]
        self.plink = fam.plink[:, row, :].T  # (npath, nm)
        self.fam, self.row = fam, row
        self.cut_els = fam.cut_els
        self.cut_es = fam.cut_es[row]
        self.cut_emax = fam.cut_emax[row]
        self.edges_sk = list(sh.edges)
        self.roles: tuple[Role | None, ...] = shape_roles(sh.sk) if tb.roles else (None,) * s

    def _segment_front(self, seg: tuple[int, ...], F: float) -> tuple[np.ndarray, list[tuple[np.ndarray, int, int]]]:
        """Per total length K, the Pareto front of latency vectors of the chain ``seg`` when every
        capacity is >= F: (metrics, L + 1, A), inf where padded; and per added node its back-pointers
        (L + 1, A) into the flattened (K', a, b) candidates with the widths A and B."""
        tb = self.tb
        key = (tuple(self.nodes[x] for x in seg), F, tuple(sorted(self.nodes)), tuple(self.roles[x] for x in seg))
        if key in tb.fronts:
            return tb.fronts[key]
        work = self._work
        L, nm = tb.L, tb.nm
        first = self.nodes[seg[0]]
        lat0, _ = _collapsed(tb, first, F, work.get(first), self._comp, self.roles[seg[0]])
        front = np.where(lat0 <= tb.budget[:, None, None], lat0, np.inf)
        front = np.where(np.all(np.isfinite(front), axis=0)[None], front, np.inf)
        backs: list[tuple[np.ndarray, int, int]] = []
        kk = np.arange(L + 1)
        d = kk[:, None] - kk[None, :]
        valid = (d >= 1) & (kk[None, :] >= 1)
        dd = np.where(valid, d, 0)
        for j in range(1, len(seg)):
            node = self.nodes[seg[j]]
            pu, pv = self.pedge[(seg[j - 1], seg[j])]
            opts, _ = _collapsed(tb, node, F, work.get(node), self._comp, self.roles[seg[j]])
            A, B = front.shape[2], opts.shape[2]
            cand = (
                front[:, None, :, :, None] + opts[:, dd][:, :, :, None, :] + tb.ll[:, pu, pv][:, None, None, None, None]
            )
            bad = ~valid[None, :, :, None, None] | np.any(cand > tb.budget[:, None, None, None, None], axis=0)[None]
            cand = np.where(bad, np.inf, cand).reshape(nm, L + 1, -1)
            arg, front = _pareto_rows(cand)
            backs.append((arg, A, B))
        if len(tb.fronts) > 4096:
            tb.fronts.clear()
        tb.fronts[key] = (front, backs)
        return front, backs

    def _element(self, q: int, F: float, work: dict[int, np.ndarray]) -> ElementAt:
        """Element q at threshold F (cached per node or segment, F and component)."""
        tb = self.tb
        e = self.elements[q]
        seg = q < len(self.segments)
        key = (tuple(self.nodes[x] for x in e), self.need[q], F, self._comp, tuple(self.roles[x] for x in e))
        got = tb.elements.get(key)
        if got is not None:
            return got
        backs: list[tuple[np.ndarray, int, int]] = []
        if seg:
            lat, backs = self._segment_front(e, F)
            cap = np.full(lat.shape[1:], max(F, 0.0))
            ok = np.all(np.isfinite(lat), axis=0)
        else:
            i = self.nodes[e[0]]
            ok = tb.useful(i, F, self.roles[e[0]])
            if self.need[q] and F > 0:
                ok = ok & (tb.cap[i] >= F)
            if work:
                ok = ok & work[i]
            lat = tb.lat[i]
            cap = np.minimum(tb.cap[i], F) if F > 0 else tb.cap[i]
        allowed = np.asarray(ok.any(axis=1))
        lb_lat = np.where(ok[None], lat, np.inf).min(axis=2)  # (nm, L+1)
        fin = lb_lat[:, allowed]
        lbmin = fin.min(axis=1) if fin.size else np.full(tb.nm, np.inf)
        ub_cap = np.where(ok, cap, -np.inf).max(axis=1)  # per k: largest (clipped) capacity of a usable option
        out = ElementAt(lat, cap, ok, backs, allowed, lb_lat, lbmin, ub_cap)
        if len(tb.elements) > 4096:
            tb.elements.clear()
        tb.elements[key] = out
        return out

    def prep(self, F: float, span: np.ndarray | None = None) -> Prep | None:
        """Per element, its usable options at threshold F and the bounds the row enumeration uses;
        None when some path's least latency already exceeds a limit or no option passes the work test.
        ``span``: the elements' ranges of layer counts from ``Family.spans`` at F, when known."""
        tb = self.tb
        kept = self.cut_emax < F if F > 0 else np.zeros(self.cut_emax.size, bool)
        kept_cuts = [(self.cut_els[c], float(self.cut_es[c])) for c in np.flatnonzero(kept)]
        ne = len(self.elements)
        work: dict[int, np.ndarray] = {}
        nodes_mask = 0
        if F > 0:
            nodes_mask = sum(1 << i for i in set(self.nodes))
            got = tb.work_mask(nodes_mask, F)
            if got is None:
                return None
            work = got
        self._work = work
        self._comp = nodes_mask
        els = [self._element(q, F, work) for q in range(ne)]
        lbmin = np.array([x.lbmin for x in els])  # (ne, nm)
        if not np.isfinite(lbmin).all():
            return None
        base = self.plink.T + lbmin.T @ row_plan(self.sh, tb.L).onpath  # (nm, P)
        if np.any(base > tb.budget[:, None]):
            return None
        return Prep(els, base, kept, self.cut_es, kept_cuts, span)

    def decide(self, F: float, budget: Budget, prep: Prep | None = None) -> Witness | None:
        """A placement of this labelled shape with maximum flow >= F (any feasible one when F <= 0),
        or None when none exists. ``budget`` counts the rows enumerated; TooBig when it runs out.
        ``prep``: ``self.prep(F)``, when already computed."""
        tb = self.tb
        nm = tb.nm
        ne = len(self.elements)
        nseg = len(self.segments)
        if prep is None and F > 0:
            span = self.fam.spans([self.row], F).get(self.row)
            got = self.prep(F, span) if span is not None else None
        else:
            got = prep if prep is not None else self.prep(F)
        if got is None:
            return None
        el_lat = [x.lat for x in got.els]
        el_cap = [x.cap for x in got.els]
        el_ok = [x.ok for x in got.els]
        seg_backs = [x.backs for x in got.els[:nseg]]
        lb_lat = [x.lb_lat for x in got.els]
        ub_cap = [x.ub_cap for x in got.els]
        kept_cuts = got.kept_cuts
        rowsB = enumerate_rows(self.fam, [got], F, budget)[0]
        if rowsB.shape[0] == 0:
            return None
        cand = [q for q in range(nseg, ne) if not (self.need[q] and F > 0)]
        cand = [q for q in cand if nm == 1 or tb.ordered[self.nodes[self.elements[q][0]]]]
        free = _free_set(cand, [els for els, _ in kept_cuts], [el_lat[q].shape[2] for q in range(ne)])
        fixed = [q for q in range(ne) if q not in free]
        ks = np.stack([rowsB[:, b] - rowsB[:, a] for a, b in self.elem_iv], axis=1)
        # level-by-level expansion over the fixed elements, pruned by latency lower bounds on every
        # path and capacity upper bounds on every kept cut
        rows = np.arange(rowsB.shape[0])
        kr = ks
        cur_lat = np.stack([lb_lat[q][:, ks[:, q]] for q in range(ne)], axis=2)  # (nm, R, ne)
        cur_cap = np.stack([ub_cap[q][ks[:, q]] for q in range(ne)], axis=1)  # (R, ne)
        slot = np.zeros((rows.size, ne), np.int64)

        def bounds_ok(lat_: np.ndarray, cap_: np.ndarray) -> np.ndarray:
            good = np.ones(cap_.shape[0], bool)
            for pi, els in enumerate(self.paths_el):
                tot = lat_[:, :, els].sum(axis=2) + self.plink[pi][:, None]
                good &= np.all(tot <= tb.budget[:, None], axis=0)
            for els, es in kept_cuts:
                good &= cap_[:, els].sum(axis=1) + es >= F
            return good

        keep = bounds_ok(cur_lat, cur_cap)
        rows, kr, cur_lat, cur_cap, slot = rows[keep], kr[keep], cur_lat[:, keep], cur_cap[keep], slot[keep]
        widths = {q: int(el_ok[q][np.unique(kr[:, q])].sum(axis=1).max()) if rows.size else 1 for q in fixed}
        for q in sorted(fixed, key=lambda x: widths[x]):
            if rows.size == 0:
                return None
            okq = el_ok[q]
            width = max(1, int(okq[kr[:, q]].sum(axis=1).max()))
            order = np.argsort(~okq, axis=1, kind="stable")[:, :width]
            comp = np.where(np.take_along_axis(okq, order, axis=1), order, -1)
            cand = comp[kr[:, q]]  # (R, width)
            rr, jj = np.nonzero(cand >= 0)
            budget.spend(rr.size)
            sl = cand[rr, jj]
            rows, kr, slot = rows[rr], kr[rr], slot[rr]
            cur_lat, cur_cap = cur_lat[:, rr], cur_cap[rr]
            slot[:, q] = sl
            cur_lat[:, :, q] = el_lat[q][:, kr[:, q], sl]
            cur_cap[:, q] = el_cap[q][kr[:, q], sl]
            keep = bounds_ok(cur_lat, cur_cap)
            rows, kr, cur_lat, cur_cap, slot = rows[keep], kr[keep], cur_lat[:, keep], cur_cap[keep], slot[keep]
        R = rows.size
        if R == 0:
            return None
        capv = cur_cap
        latv = cur_lat
        ok = np.ones(R, bool)
        ar = np.arange(R)
        for q in sorted(free):
            req = np.zeros(R)
            for els, es in kept_cuts:
                if q in els:
                    others = np.full(R, es)
                    for x in els:
                        if x != q:
                            others += capv[:, x]
                    req = np.maximum(req, F - others)
            C = el_cap[q][kr[:, q]]
            good = el_ok[q][kr[:, q]] & (req[:, None] <= C)
            j = np.argmax(good, axis=1)
            ok &= good[ar, j]
            slot[:, q] = j
            capv[:, q] = C[ar, j]
            latv[:, :, q] = el_lat[q][:, kr[:, q], j]
        for pi, els in enumerate(self.paths_el):
            tot = latv[:, :, els].sum(axis=2) + self.plink[pi][:, None]
            ok &= np.all(tot <= tb.budget[:, None], axis=0)
        for els, es in kept_cuts:
            ok &= capv[:, els].sum(axis=1) + es >= F
        hit = np.flatnonzero(ok)
        if hit.size == 0:
            return None
        t = int(hit[self._rank(hit, kr, slot, capv, nseg)])
        return self._witness(rowsB[rows[t]], kr[t], slot[t], seg_backs, F)

    def _rank(self, hit: np.ndarray, kr: np.ndarray, slot: np.ndarray, capv: np.ndarray, nseg: int) -> int:
        """The feasible row with the largest flow lower bound: every finite cut of the shape with the
        unclipped capacities of the chosen options (a segment counts as F)."""
        tb = self.tb
        if hit.size == 1:
            return 0
        cap = capv[hit].copy()
        for q in range(nseg, len(self.elements)):
            node = self.nodes[self.elements[q][0]]
            cap[:, q] = tb.cap[node][kr[hit, q], slot[hit, q]]
        low = np.full(hit.size, np.inf)
        for els, es in zip(self.cut_els, self.cut_es.tolist(), strict=True):
            if math.isfinite(es):
                low = np.minimum(low, es + cap[:, els].sum(axis=1))
        return int(np.argmax(low))

    def _witness(
        self,
        Bk: np.ndarray,
        kr: np.ndarray,
        slot: np.ndarray,
        seg_backs: list[list[tuple[np.ndarray, int, int]]],
        F: float,
    ) -> Witness:
        tb = self.tb
        option: dict[int, int] = {}
        start: dict[int, int] = {}
        for q, e in enumerate(self.elements):
            pos = int(Bk[self.elem_iv[q][0]])
            if q < len(self.segments):
                F_slots = [
                    _collapsed(tb, self.nodes[x], F, self._work.get(self.nodes[x]), self._comp, self.roles[x])[1]
                    for x in e
                ]
                K, idx = int(kr[q]), int(slot[q])
                parts: list[tuple[int, int]] = []
                for j in range(len(e) - 1, 0, -1):
                    arg, A, B = seg_backs[q][j - 1]
                    flat = int(arg[K, idx])
                    b = flat % B
                    rest = flat // B
                    a, Kp = rest % A, rest // A
                    parts.append((K - Kp, int(F_slots[j][K - Kp, b])))
                    K, idx = Kp, a
                parts.append((K, int(F_slots[0][K, idx])))
                parts.reverse()
                for x, (k, b) in zip(e, parts, strict=True):
                    node = self.nodes[x]
                    option[node] = int(tb.opt[node][k, b])
                    start[node] = pos
                    pos += k
            else:
                node = self.nodes[e[0]]
                option[node] = int(tb.opt[node][int(kr[q]), int(slot[q])])
                start[node] = pos
        return Witness(option, start, tuple(self.pedge[x] for x in self.edges_sk))


def screen(fam: Family, rows: Sequence[int], F: float, budget: Budget) -> list[tuple[Labelled, Prep]]:
    """The labellings of ``rows`` of ``fam`` (in order) for which the row enumeration at F finds a boundary
    vector, each with its ``prep``; one enumeration for all of them. Those left out have no placement
    with flow >= F, nor with more."""
    live: list[tuple[Labelled, Prep]] = []
    spans = fam.spans(rows, F) if F > 0 else None
    for r in rows:
        if spans is not None and r not in spans:
            continue
        lab = Labelled(fam, r)
        pr = lab.prep(F, None if spans is None else spans[r])
        if pr is not None:
            live.append((lab, pr))
    if not live:
        return []
    _, who = enumerate_rows(fam, [pr for _, pr in live], F, budget)
    hit = np.zeros(len(live), bool)
    hit[who] = True
    return [live[j] for j in np.flatnonzero(hit)]


def _collapsed(
    tb: Tables, i: int, F: float, extra: np.ndarray | None = None, comp: int = 0, role: Role | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The options of node i with capacity >= F whose latencies no other such option beats (and that
    ``extra`` and ``role`` allow: ``Tables.useful``), compacted per k: latencies (metrics, L + 1, B), inf
    where padded, and their slots (L + 1, B), -1 padded. Cached when ``extra`` is the ``work_mask`` of
    the nodes ``comp`` at F (or None, with ``comp`` 0)."""
    key = (i, F, comp if extra is not None else -1, role)
    got = tb.collapsed.get(key)
    if got is not None:
        return got
    out = _collapse(tb, i, F, extra, role)
    if len(tb.collapsed) > 4096:
        tb.collapsed.clear()
    tb.collapsed[key] = out
    return out


def _collapse(
    tb: Tables, i: int, F: float, extra: np.ndarray | None, role: Role | None
) -> tuple[np.ndarray, np.ndarray]:
    okm = tb.useful(i, F, role) & (tb.cap[i] >= F)
    if extra is not None:
        okm = okm & extra
    width = max(1, int(okm.sum(axis=1).max()))
    order = np.argsort(~okm, axis=1, kind="stable")[:, :width]
    good = np.take_along_axis(okm, order, axis=1)
    slots = np.where(good, order, -1)
    lat = np.where(
        good[None], np.take_along_axis(tb.lat[i], np.broadcast_to(order, (tb.nm, *order.shape)), axis=2), np.inf
    )
    return lat, slots


def _free_set(cand: list[int], cuts: list[list[int]], widths: list[int]) -> set[int]:
    """The candidates to leave free: no kept cut holds two of them; the most option slots saved."""
    best: tuple[int, ...] = ()
    best_w = -1.0
    for size in range(len(cand), 0, -1):
        for sub in itertools.combinations(cand, size):
            if all(sum(1 for x in sub if x in c) <= 1 for c in cuts):
                w = sum(math.log(widths[x] + 1) for x in sub)
                if w > best_w:
                    best, best_w = sub, w
        if best:
            break
    return set(best)


def _pareto_rows(cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``cand`` (metrics, R, M): the indices (R, A) of its Pareto-minimal finite columns
    (-1 where padded) and their values (metrics, R, A) (inf where padded)."""
    nm, R, _ = cand.shape
    fin = np.all(np.isfinite(cand), axis=0)
    if nm == 1:
        arg = np.argmin(cand[0], axis=1)[:, None]
        val = np.take_along_axis(cand[0], arg, axis=1)[None]
        return np.where(np.isfinite(val[0]), arg, -1), val
    # keep the finite columns only (as a compact list per row) before sorting
    width = max(1, int(fin.sum(axis=1).max()))
    pick = np.argsort(~fin, axis=1, kind="stable")[:, :width]
    sub = np.take_along_axis(cand, np.broadcast_to(pick, (nm, R, width)), axis=2)
    subfin = np.take_along_axis(fin, pick, axis=1)
    sub = np.where(subfin[None], sub, np.inf)
    if nm == 2:
        o1 = np.argsort(sub[1], axis=1, kind="stable")
        o0 = np.argsort(np.take_along_axis(sub[0], o1, axis=1), axis=1, kind="stable")
        order = np.take_along_axis(o1, o0, axis=1)
        l1 = np.take_along_axis(sub[1], order, axis=1)
        prev = np.minimum.accumulate(np.concatenate([np.full((R, 1), np.inf), l1[:, :-1]], axis=1), axis=1)
        keep_sorted = (l1 < prev) & np.take_along_axis(subfin, order, axis=1)
        keep = np.zeros((R, width), bool)
        np.put_along_axis(keep, order, keep_sorted, axis=1)
    else:
        le = np.all(sub[:, :, None, :] <= sub[:, :, :, None], axis=0)
        lt = np.any(sub[:, :, None, :] < sub[:, :, :, None], axis=0)
        earlier = np.arange(width)[None, :] < np.arange(width)[:, None]
        dom = le & (lt | (~lt & earlier[None]))
        dom &= ~np.eye(width, dtype=bool)[None]
        keep = subfin & ~dom.any(axis=2)
    A = max(1, int(keep.sum(axis=1).max()))
    idx = np.argsort(~keep, axis=1, kind="stable")[:, :A]
    kept = np.take_along_axis(keep, idx, axis=1)
    arg = np.where(kept, np.take_along_axis(pick, idx, axis=1), -1)
    val = np.where(kept[None], np.take_along_axis(sub, np.broadcast_to(idx, (nm, R, A)), axis=2), np.inf)
    return arg, val
