"""Exact placement of up to three nodes: every shape that three nodes allow (replicas, chains, one node
feeding two, two feeding one) enumerated and solved exactly (see ``exact_small``). Each shape fixes
every node's role (``solvers.problem``): a replica holds 1 micro-batch and both ends; a chain of p nodes
p micro-batches on each; one node feeding (fed by) two holds the 2 + 2 micro-batches of the two paths
through it and the embedding (LM head), the two others 2 each and the other end."""

from __future__ import annotations

import itertools

import numpy as np

from solvers.chains import Knapsack, best_chain
from solvers.problem import BOTH, FIRST, LAST, Edge, PlacementProblem, PlacementResult
from solvers.reduce import dominated
from solvers.rules import class_reps, evaluate_placement, lat_tol, usable_edges

SMALL_NODES = 3
"""Up to this many nodes ``exact_small`` settles every problem."""


def _group_best(keys: np.ndarray, vals: np.ndarray, nkeys: int) -> tuple[np.ndarray, np.ndarray]:
    """Per key in 0..nkeys-1: the largest value and its position (-inf and -1 where none)."""
    best = np.full(nkeys, -np.inf)
    pos = np.full(nkeys, -1, dtype=np.int64)
    if keys.size:
        order = np.lexsort((vals, keys))
        last = np.flatnonzero(np.concatenate((keys[order][1:] != keys[order][:-1], [True])))
        sel = order[last]
        best[keys[sel]] = vals[sel]
        pos[keys[sel]] = sel
    return best, pos


_Cand = tuple[float, tuple[int, ...], tuple[int, ...], tuple[Edge, ...]]


class _Small:
    """Every shape that n <= 3 nodes allow, each solved exactly (see ``exact_small``)."""

    def __init__(self, problem: PlacementProblem) -> None:
        self.p = problem
        self.n, self.L = problem.n, int(problem.num_layers)
        self.limit = np.asarray(problem.lat_limit, dtype=np.float64)
        self.budget = self.limit + lat_tol(self.limit)
        self.ll = np.asarray(problem.link_lat, dtype=np.float64)
        self.lc = np.asarray(problem.link_cap, dtype=np.float64)
        self.edges = set(usable_edges(problem))
        self.k = [np.asarray(m.k) for m in problem.menus]
        self.cap = [np.asarray(m.cap, dtype=np.float64) for m in problem.menus]
        self.lat = [np.asarray(m.lat, dtype=np.float64) for m in problem.menus]
        self.roles = problem.has_roles
        self._idx: dict[tuple[int, int, int], np.ndarray] = {}
        self._shapes: list[_Cand] | None = None
        self.rep = class_reps(problem)
        """Per node, the lowest-numbered node interchangeable with it: a shape and its image under a swap
        of interchangeable nodes are worth the same, so only the first of them (in the order tried) is
        solved; a later one could only tie with it, and the first of equal candidates is kept."""

    def first_seen(self, seen: set[tuple[int, ...]], nodes: tuple[int, ...]) -> bool:
        """Whether ``nodes`` (in their roles' order) is the first of its images under swaps of
        interchangeable nodes (and remember it)."""
        key = tuple(self.rep[x] for x in nodes)
        if key in seen:
            return False
        seen.add(key)
        return True

    def idx(self, i: int, depth: int, ends: int) -> np.ndarray:
        """The options of node i that a role of ``depth`` micro-batches and the ends ``ends`` allows
        (``NodeMenu.allowed``), less those dominated among them (``solvers.reduce``: same k, capacity >=
        and latencies <= in another allowed option); every option when the menu has no roles."""
        key = (self.rep[i], depth, ends)  # interchangeable nodes have the same menu
        got = self._idx.get(key)
        if got is None:
            if not self.roles:
                got = np.arange(self.k[i].size)
            else:
                sub = np.flatnonzero(self.p.menus[i].allowed(depth, ends))
                got = sub[~dominated(self.k[i][sub], self.cap[i][sub], self.lat[i][:, sub])]
            self._idx[key] = got
        return got

    def _has(self, *path: int) -> bool:
        return all(e in self.edges for e in itertools.pairwise(path))

    def _links(self, *path: int) -> tuple[np.ndarray, float]:
        pairs = list(itertools.pairwise(path))
        lat = np.sum([self.ll[:, u, v] for u, v in pairs], axis=0)
        return lat, min(float(self.lc[u, v]) for u, v in pairs)

    def single(self, i: int) -> tuple[float, int] | None:
        n = self.n
        if not self._has(n, i, n):
            return None
        lat, lcap = self._links(n, i, n)
        sub = self.idx(i, 1, BOTH)
        ok = (self.k[i][sub] == self.L) & np.all(self.lat[i][:, sub] + lat[:, None] <= self.budget[:, None], axis=0)
        if not ok.any():
            return None
        val = np.where(ok, np.minimum(self.cap[i][sub], lcap), -1.0)
        o = int(np.argmax(val))
        return float(val[o]), int(sub[o])

    def chain2(self, i: int, j: int) -> tuple[float, int, int] | None:
        n = self.n
        if not self._has(n, i, j, n):
            return None
        lat, lcap = self._links(n, i, j, n)
        si, sj = self.idx(i, 2, FIRST), self.idx(j, 2, LAST)
        pi_, pj = np.nonzero(self.k[i][si][:, None] + self.k[j][sj][None, :] == self.L)
        pi_, pj = si[pi_], sj[pj]
        ok = np.all(self.lat[i][:, pi_] + self.lat[j][:, pj] + lat[:, None] <= self.budget[:, None], axis=0)
        if not ok.any():
            return None
        val = np.where(ok, np.minimum(np.minimum(self.cap[i][pi_], self.cap[j][pj]), lcap), -1.0)
        t = int(np.argmax(val))
        return float(val[t]), int(pi_[t]), int(pj[t])

    def branch(self, a: int, j: int, l_: int, fork: bool) -> tuple[float, int, int, int] | None:
        """Node a holding [0, p) feeding j and l holding [p, L) (fork), or j, l feeding a (join)."""
        n = self.n
        paths = [(n, a, x, n) if fork else (n, x, a, n) for x in (j, l_)]
        if not all(self._has(*pt) for pt in paths):
            return None
        best: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        sa = self.idx(a, 4, FIRST if fork else LAST)  # two paths of two stages cross a
        for x, pt in zip((j, l_), paths, strict=True):
            lat, _ = self._links(*pt)
            sx = self.idx(x, 2, LAST if fork else FIRST)
            pa, px = np.nonzero(self.k[a][sa][:, None] + self.k[x][sx][None, :] == self.L)
            pa, px = sa[pa], sx[px]
            ok = np.all(self.lat[a][:, pa] + self.lat[x][:, px] + lat[:, None] <= self.budget[:, None], axis=0)
            pa, px = pa[ok], px[ok]
            lk = (self.lc[a, x], self.lc[x, n]) if fork else (self.lc[n, x], self.lc[x, a])
            cx = np.minimum(self.cap[x][px], min(lk))
            b, pos = _group_best(pa, cx, self.k[a].shape[0])
            best.append((b, pos, px))
        (bj, posj, pxj), (bl, posl, pxl) = best
        ok = np.isfinite(bj) & np.isfinite(bl)
        if not ok.any():
            return None
        own = self.lc[n, a] if fork else self.lc[a, n]
        val = np.where(ok, np.minimum(np.minimum(self.cap[a], own), bj + bl), -1.0)
        oa = int(np.argmax(val))
        return float(val[oa]), oa, int(pxj[posj[oa]]), int(pxl[posl[oa]])

    def chain3(
        self, order: tuple[int, ...], lat_links: np.ndarray, lcap: float, lower: float
    ) -> tuple[float, tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None:
        """The best chain ``order`` of three nodes worth more than ``lower``, by enumeration."""
        if lcap <= lower:
            return None
        i, j, l_ = order
        role = (self.idx(i, 3, FIRST), self.idx(j, 3, 0), self.idx(l_, 3, LAST))
        sel = [s[self.cap[x][s] > lower] for x, s in zip(order, role, strict=True)]
        if any(x.size == 0 for x in sel):
            return None
        (si, sj, sl) = sel
        ksum = self.k[i][si][:, None] + self.k[j][sj][None, :]
        pa, pb = np.nonzero(ksum < self.L)
        oa, ob = si[pa], sj[pb]
        kp = self.k[i][oa] + self.k[j][ob]
        lat_p = self.lat[i][:, oa] + self.lat[j][:, ob] + lat_links[:, None]
        cap_p = np.minimum(np.minimum(self.cap[i][oa], self.cap[j][ob]), lcap)
        best: tuple[float, tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None
        for kl in np.unique(self.k[l_][sl]):
            q = sl[self.k[l_][sl] == kl]
            pp = np.flatnonzero(kp == self.L - kl)
            if pp.size == 0:
                continue
            lat = lat_p[:, pp][:, :, None] + self.lat[l_][:, q][:, None, :]
            ok = np.all(lat <= self.budget[:, None, None], axis=0)
            val = np.where(ok, np.minimum(cap_p[pp][:, None], self.cap[l_][q][None, :]), -np.inf)
            t = int(np.argmax(val))
            a, b = divmod(t, q.size)
            v = float(val.flat[t])
            if v > lower and (best is None or v > best[0]):
                x, y = int(oa[pp[a]]), int(ob[pp[a]])
                best = (v, order, (x, y, int(q[b])), (int(self.k[i][x]), int(self.k[j][y]), int(kl)))
        return best

    def candidates(self, chain3: list[tuple[float, tuple[int, ...], tuple[int, ...], tuple[int, ...]]]) -> list[_Cand]:
        """Every shape's best placement: the replicas, chains of two beside replicas, forks and joins
        (computed once), then the given three-node chains."""
        n, L = self.n, self.L
        if self._shapes is None:
            self._shapes = self._other_shapes()
        out = list(self._shapes)
        for val, order, opts, ks in chain3:
            opt = [0] * n
            st = [0] * n
            pos = 0
            for x, o, k in zip(order, opts, ks, strict=True):
                opt[x], st[x] = o, pos
                pos += k
            assert pos == L
            seq = (n, *order, n)
            out.append((val, tuple(opt), tuple(st), tuple(itertools.pairwise(seq))))
        return out

    def _other_shapes(self) -> list[_Cand]:
        n = self.n
        out: list[_Cand] = []
        singles = [self.single(i) for i in range(n)]
        if all(s is not None for s in singles):
            out.append(
                (
                    sum(s[0] for s in singles if s is not None),
                    tuple(s[1] for s in singles if s is not None),
                    (0,) * n,
                    tuple(e for i in range(n) for e in ((n, i), (i, n))),
                )
            )
        nodes = range(n)
        seen: set[tuple[int, ...]] = set()
        for i, j in itertools.permutations(nodes, 2):
            if not self.first_seen(seen, (i, j)):
                continue
            c2 = self.chain2(i, j)
            if c2 is None:
                continue
            others = [x for x in nodes if x not in (i, j)]
            rest = [singles[x] for x in others]
            if any(r is None for r in rest):
                continue
            opt = [0] * n
            st = [0] * n
            opt[i], opt[j] = c2[1], c2[2]
            st[j] = int(self.k[i][c2[1]])
            edges: list[Edge] = [(n, i), (i, j), (j, n)]
            val = c2[0]
            for x, r in zip(others, rest, strict=True):
                assert r is not None
                opt[x] = r[1]
                edges += [(n, x), (x, n)]
                val += r[0]
            out.append((val, tuple(opt), tuple(st), tuple(edges)))
        if n == 3:
            for a in nodes:
                if not self.first_seen(seen, (a,)):
                    continue
                j, l_ = (x for x in nodes if x != a)
                for fork in (True, False):
                    br = self.branch(a, j, l_, fork)
                    if br is None:
                        continue
                    opt = [0] * n
                    opt[a], opt[j], opt[l_] = br[1], br[2], br[3]
                    st = [0] * n
                    if fork:
                        st[j] = st[l_] = int(self.k[a][br[1]])
                        edges = [(n, a), (a, j), (a, l_), (j, n), (l_, n)]
                    else:
                        st[a] = int(self.k[j][br[2]])
                        edges = [(n, j), (n, l_), (j, a), (l_, a), (a, n)]
                    out.append((br[0], tuple(opt), tuple(st), tuple(edges)))
        return out


def exact_small(problem: PlacementProblem) -> PlacementResult | None:
    """The proven optimum of a problem with n <= 3 nodes, by enumerating every shape: replicas,
    two-node chains beside a replica, three-node chains, one node feeding two (fork) and two feeding
    one (join); each is exact (three-node chains by the bisection knapsack with one latency metric,
    else by numpy over the options that could beat the other shapes; the others by numpy over all
    option pairs whose k add up to L). A shape that a swap of interchangeable nodes maps onto one
    solved before is skipped (it is worth the same). Returns status ``infeasible`` when no shape has a
    placement, and None when n > 3."""
    n = problem.n
    if n > SMALL_NODES:
        return None
    sm = _Small(problem)
    chain3: list[tuple[float, tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = []
    if n == 3:
        nm = problem.num_metrics
        weights = [np.ones(1)] if nm == 1 else [*np.eye(nm), np.ones(nm)]
        knaps = [Knapsack(problem, w, sm.rep) for w in weights]
        orders = []
        seen: set[tuple[int, ...]] = set()
        for order in itertools.permutations(range(3)):
            if not sm.first_seen(seen, order):
                continue
            seq = (n, *order, n)
            if sm._has(*seq):
                lat, lcap = sm._links(*seq)
                orders.append((lat, lcap, order))
                ch = best_chain(problem, order, sm.edges, knaps, orders=[(lat, lcap, order)])
                if ch is not None:
                    chain3.append((ch.value, ch.order, ch.options, ch.ks))
        if nm > 1:  # the knapsack above is a heuristic here: search what could beat the best so far
            lower = max([c[0] for c in sm.candidates(chain3)], default=-1.0)
            for lat, lcap, order in orders:
                found = sm.chain3(order, lat, lcap, lower)
                if found is not None:
                    chain3.append(found)
                    lower = max(lower, found[0])
    cands = sm.candidates(chain3)
    if not cands:
        return PlacementResult(0.0, "infeasible", 0.0, "shapes")
    best: PlacementResult | None = None
    for val, opt, st, edges in sorted(cands, key=lambda c: -c[0]):
        ev = evaluate_placement(problem, opt, st, edges)
        if ev is None:  # pragma: no cover - every candidate was checked against the limits
            raise AssertionError("an enumerated shape failed its check")
        if best is None or ev[0] > best.value:
            best = PlacementResult(ev[0], "optimal", ev[0], "shapes", opt, st, ev[1])
        if best.value >= val:
            break
    return best
