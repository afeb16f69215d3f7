"""The production placer: exact on the option grid. Milliseconds up to three nodes; at four nodes
0.02-0.3 s (every real ``core`` multiset measured was proven); at five, seconds (up to about a minute);
at six the shape search often runs out of its work budget and the LP/MILP residue ends unproven (see
``bench/placement_paths.py``).

``place`` runs, in order, stopping at the first step that proves the optimum:

1. Exact menu reductions (``reduce_problem``); each keeps the optimum value and an optimal placement:
   - drop options with k > L;
   - drop an option whose latency, plus the least latency with which the other nodes could cover the
     remaining L - k layers (a knapsack over the other nodes, each used at most once), plus the least
     link latencies into and out of the node, exceeds a limit: no path through it can meet the limit;
   - clip capacities at an upper bound UB on the total flow (no node carries more than the total), where
     UB is the least of the layer-work bound sum_i max_o k_o c_o / L (every unit of flow crosses L
     layers) and the capacity out of the source and into the sink;
   - drop an option dominated by another of the same node with the same k: capacity >= and latency
     <= in every metric (memory does not matter: every option already fits);
   - drop a latency metric that no path can exceed (every node's largest latency plus n + 1 of the
     largest link latencies fits its limit); edges unusable before stay unusable.
   Repeated until nothing changes. A node left without options proves the problem infeasible.
2. n <= 3 (``exact_small``, method "shapes"): every shape that three nodes allow is enumerated and
   solved exactly (replicas, chains, one node feeding two, two feeding one; see that function).
3. n >= 4: the chain family (``pipeline_dp``) gives a first placement: the best one whose weakly
   connected components are chains (pure pipelines and replicas of them). For a chain, node latencies
   add up whatever the order, which only decides the link latencies and capacities. So a subset U of
   nodes in order pi is worth min(lc(pi), B_U(T - ll(pi))), where B_U(beta) is the largest bottleneck
   capacity c such that a knapsack over U (one option per node with capacity >= c, the k summing to L)
   fits the latency budget beta. B_U comes from bisection over the capacities; the knapsack is a
   min-plus convolution per node in numpy. With one latency metric this is exact for the family; with
   two it minimises each metric and their normalised sum in turn (a heuristic: the later steps stay
   exact). A set-partition DP over the subsets adds the replicas.
4. If that placement reaches UB, or the tighter layer-work fixed point (the largest F with
   L F <= sum_i max_o k_o min(c_o, F); ``solvers.shapes.work_fixed_point``), it is optimal ("dp-proven").
5. The shape search (``solvers.shapes.shape_search``, method "shapes"), started from the step 3
   placement: every connected shape of every sub-multiset that could still beat the best placement
   known is decided exactly at that threshold, and the best partition into components is assembled.
   It proves the optimum unless its deterministic work budget (``shape_budget`` enumerated rows)
   runs out.
   With a ``floor`` (see ``place``) every step stops as soon as it proves that nothing beats it, and
   steps 3-4 are skipped: an incumbent below the floor does not help the search, and on a template
   build's multisets the search without it was faster overall (gemma-3-27b, N_max 6: 40 s instead of
   62 s on one core, same templates). With ``lp_floor`` the LP bound of step 6 is tried first, before
   step 3 (see ``place``).
6. Only then (the residue): the LP relaxation of the MILP bounds every placement; if it does not exceed
   the placement's value by more than 1e-7 (relative) it proves it ("lp-proven"). Otherwise its reduced
   costs fix to zero every option and edge that no placement better than the current one can use (LP
   duality), a few rounds, and the reference MILP (``solvers.placement.milp_place``) solves what is
   left, warm-started with the step 3 placement ("milp"). This is the slow step: the only one that can
   end unproven at ``time_limit``.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence

import attrs
import numpy as np

from solvers.placement import (
    LAT_RTOL,
    class_reps,
    evaluate_placement,
    lp_reduce,
    milp_place,
    usable_edges,
)
from solvers.problem import Edge, NodeMenu, PlacementProblem, PlacementResult, check_problem
from solvers.shapes import shape_search, work_fixed_point

FloatArray = np.ndarray
LP_ROUNDS = 4
PROOF_RTOL = 1e-7
LP_FLOOR_NODES = 6
"""``lp_floor`` tries the LP bound from this many nodes: below, the search is cheaper than the LP."""
SMALL_NODES = 3
"""Up to this many nodes ``exact_small`` settles every problem."""
PLACER = "shapes-1"
"""Version of the method for more than SMALL_NODES nodes; part of those templates' content keys."""
SHAPE_BUDGET = 100_000_000
"""Default work budget of the shape search (rows enumerated) before the LP/MILP residue path. About
25 s of one core at most; 6-node gemma-3-27b prefill multisets that ran out of 30M rows and then spent
10 s in the MILP without a proof were all proven within 100M rows, in 4-12 s."""


@attrs.frozen(eq=False)
class Reduced:
    """A reduced copy of a problem: ``index[i][o']`` is the original index of reduced option o'."""

    problem: PlacementProblem
    index: tuple[np.ndarray, ...]
    ub: float


def _tol(limit: np.ndarray) -> np.ndarray:
    return np.asarray(LAT_RTOL * np.where(np.isfinite(limit), np.maximum(limit, 1.0), 0.0))


_TOEPLITZ: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _toeplitz(L: int) -> tuple[np.ndarray, np.ndarray]:
    """Index q - p for q, p in 0..L, and the mask q >= p."""
    if L not in _TOEPLITZ:
        q = np.arange(L + 1)[:, None]
        p = np.arange(L + 1)[None, :]
        _TOEPLITZ[L] = (np.clip(q - p, 0, L), q >= p)
    return _TOEPLITZ[L]


def minplus(a: FloatArray, b: FloatArray) -> tuple[FloatArray, np.ndarray]:
    """out[q] = min_p a[p] + b[q - p] over p <= q, and the minimising p (vectors of length L + 1)."""
    L = a.shape[0] - 1
    idx, ok = _toeplitz(L)
    cand = np.where(ok, a[None, :] + b[idx], np.inf)
    arg = np.argmin(cand, axis=1)
    return cand[np.arange(L + 1), arg], arg


# ----------------------------------------------------------------------------------------------------
# Reductions


def _gmin(problem: PlacementProblem) -> np.ndarray:
    """g[i, m, k]: the least latency of metric m over node i's options with k layers (inf if none)."""
    n, L, nm = problem.n, int(problem.num_layers), problem.num_metrics
    g = np.full((n, nm, L + 1), np.inf)
    for i, menu in enumerate(problem.menus):
        k = np.asarray(menu.k)
        sel = k <= L
        for m in range(nm):
            np.minimum.at(g[i, m], k[sel], np.asarray(menu.lat[m], dtype=np.float64)[sel])
    return g


def _upper_bound(problem: PlacementProblem, edges: Sequence[Edge]) -> float:
    n, L = problem.n, int(problem.num_layers)
    lc = np.asarray(problem.link_cap, dtype=np.float64)
    work = 0.0
    src = 0.0
    snk = 0.0
    for i, menu in enumerate(problem.menus):
        if menu.size == 0:
            return 0.0
        cap = np.asarray(menu.cap, dtype=np.float64)
        k = np.asarray(menu.k)
        work += float(np.max(k * cap))
        src += min(lc[n, i], float(np.max(cap))) if (n, i) in edges else 0.0
        snk += min(lc[i, n], float(np.max(cap))) if (i, n) in edges else 0.0
    return min(work / L, src, snk)


def _work_ub(problem: PlacementProblem) -> float:
    """The layer-work fixed point of ``problem``'s menus (``solvers.shapes.work_fixed_point``): tighter
    than ``_upper_bound``'s work term, which clips capacities at its own value only once."""
    ks = [np.asarray(m.k) for m in problem.menus]
    return work_fixed_point(ks, [np.asarray(m.cap, dtype=np.float64) for m in problem.menus], int(problem.num_layers))


def _subset_menu(menu: NodeMenu, keep: np.ndarray, cap: FloatArray | None = None) -> NodeMenu:
    return NodeMenu(
        k=np.asarray(menu.k)[keep],
        b=np.asarray(menu.b)[keep],
        cap=(np.asarray(menu.cap, dtype=np.float64) if cap is None else cap)[keep],
        lat=np.asarray(menu.lat, dtype=np.float64)[:, keep],
        mem=np.asarray(menu.mem, dtype=np.float64)[keep],
    )


def _dominated(k: np.ndarray, cap: FloatArray, lat: FloatArray) -> np.ndarray:
    """Options dominated by another with the same k (ties: the lower index survives)."""
    out = np.zeros(k.shape[0], dtype=bool)
    order = np.argsort(k, kind="stable")
    ks = k[order]
    bounds = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1], True])
    for a, b in itertools.pairwise(bounds):
        grp = order[a:b]
        if grp.size < 2:
            continue
        c = cap[grp]
        la = lat[:, grp]
        ge = c[None, :] >= c[:, None]  # [x, y]: y has cap >= x's
        le = np.all(la[:, None, :] <= la[:, :, None], axis=0)  # y's latency <= x's
        strict = (c[None, :] > c[:, None]) | np.any(la[:, None, :] < la[:, :, None], axis=0)
        tie = grp[None, :] < grp[:, None]
        dom = ge & le & (strict | tie)
        np.fill_diagonal(dom, False)
        out[grp] = dom.any(axis=1)
    return out


def reduce_problem(problem: PlacementProblem) -> Reduced | None:
    """The exact reductions of the module docstring; None when they prove the problem infeasible."""
    n, L = problem.n, int(problem.num_layers)
    limit = np.asarray(problem.lat_limit, dtype=np.float64)
    tol = _tol(limit)
    ll = np.asarray(problem.link_lat, dtype=np.float64)
    index = [np.arange(m.size) for m in problem.menus]
    cur = problem
    for _ in range(20):
        changed = False
        edges = usable_edges(cur)
        g = _gmin(cur)
        menus = list(cur.menus)
        for i in range(n):
            menu = menus[i]
            k = np.asarray(menu.k)
            keep = k <= L
            if not keep.all():
                changed = True
            # least latency of the other nodes covering r layers (each node optional, used once)
            cover = np.full((cur.num_metrics, L + 1), np.inf)
            cover[:, 0] = 0.0
            for j in range(n):
                if j != i:
                    for m in range(cur.num_metrics):
                        gj = g[j, m].copy()
                        gj[0] = 0.0
                        cover[m] = minplus(cover[m], gj)[0]
            ins = [u for u, v in edges if v == i]
            outs = [v for u, v in edges if u == i]
            if not ins or not outs:
                return None
            link_lb = ll[:, ins, i].min(axis=1) + ll[:, i, outs].min(axis=1)
            full = ll[:, n, i] + ll[:, i, n] if ((n, i) in edges and (i, n) in edges) else np.full(len(limit), np.inf)
            lat = np.asarray(menu.lat, dtype=np.float64)
            kk = np.clip(k, 0, L)
            rest = np.where(kk[None, :] == L, full[:, None], cover[:, L - kk] + link_lb[:, None])
            fits = np.all(lat + rest <= limit[:, None] + tol[:, None], axis=0)
            keep &= fits
            if not keep.all():
                changed = True
                menus[i] = _subset_menu(menu, keep)
                index[i] = index[i][keep]
            if menus[i].size == 0:
                return None
        cur = attrs.evolve(cur, menus=tuple(menus))
        edges = usable_edges(cur)
        ub = _upper_bound(cur, edges)
        menus = list(cur.menus)
        for i in range(n):
            menu = menus[i]
            cap = np.minimum(np.asarray(menu.cap, dtype=np.float64), ub)
            clipped = bool((cap < menu.cap).any())
            drop = _dominated(np.asarray(menu.k), cap, np.asarray(menu.lat, dtype=np.float64))
            if clipped or drop.any():
                changed = changed or bool(drop.any())
                menus[i] = _subset_menu(menu, ~drop, cap)
                index[i] = index[i][~drop]
        cur = attrs.evolve(cur, menus=tuple(menus))
        if not changed:
            break
    cur = _drop_slack_metrics(cur)
    return Reduced(cur, tuple(index), _upper_bound(cur, usable_edges(cur)))


def _drop_slack_metrics(problem: PlacementProblem) -> PlacementProblem:
    """Remove the metrics that no path can exceed: the sum of every node's largest latency plus n + 1
    of the largest usable link latencies fits the limit (a path visits each node at most once)."""
    n = problem.n
    limit = np.asarray(problem.lat_limit, dtype=np.float64)
    edges = usable_edges(problem)
    ll = np.asarray(problem.link_lat, dtype=np.float64)
    worst = sum(np.asarray(m.lat, dtype=np.float64).max(axis=1) for m in problem.menus)
    worst = worst + (n + 1) * np.max([ll[:, u, v] for u, v in edges], axis=0) if edges else worst
    keep = np.flatnonzero(worst > limit)
    if keep.size == limit.size:
        return problem
    if keep.size == 0:  # every metric is slack: keep one, unconstrained
        keep = np.array([0])
        limit = limit.copy()
        limit[0] = np.inf
    menus = tuple(attrs.evolve(m, lat=np.asarray(m.lat, dtype=np.float64)[keep]) for m in problem.menus)
    new_ll = ll[keep].copy()
    unusable = np.ones((n + 1, n + 1), dtype=bool)
    for u, v in edges:
        unusable[u, v] = False
    new_ll[:, unusable] = np.inf  # an edge unusable before stays unusable
    return attrs.evolve(problem, menus=menus, link_lat=new_ll, lat_limit=limit[keep])


# ----------------------------------------------------------------------------------------------------
# The chain family


@attrs.frozen
class _Chain:
    value: float
    order: tuple[int, ...]
    options: tuple[int, ...]  # per node of ``order``
    ks: tuple[int, ...]


def _orders(
    problem: PlacementProblem, nodes: Sequence[int], edges: set[Edge]
) -> list[tuple[np.ndarray, float, tuple[int, ...]]]:
    """Pareto-best orders of ``nodes`` as chains: (link latency per metric, link capacity, order)."""
    n = problem.n
    ll = np.asarray(problem.link_lat, dtype=np.float64)
    lc = np.asarray(problem.link_cap, dtype=np.float64)
    seen: dict[tuple[tuple[float, ...], float], tuple[int, ...]] = {}
    for perm in itertools.permutations(nodes):
        seq = (n, *perm, n)
        pairs = list(itertools.pairwise(seq))
        if any(e not in edges for e in pairs):
            continue
        lat = tuple(float(x) for x in np.sum([ll[:, u, v] for u, v in pairs], axis=0))
        cap = min(float(lc[u, v]) for u, v in pairs)
        seen.setdefault((lat, cap), perm)
    items = [(np.array(lat), cap, perm) for (lat, cap), perm in seen.items()]
    out = []
    for a in items:
        dominated = any((b[1] >= a[1] and np.all(b[0] <= a[0]) and (b[1] > a[1] or np.any(b[0] < a[0]))) for b in items)
        if not dominated:
            out.append(a)
    return out


class _Knapsack:
    """Per node: options sorted by (k, scalar latency), for thresholded least-latency tables."""

    def __init__(self, problem: PlacementProblem, weight: np.ndarray) -> None:
        self.p = problem
        self.L = int(problem.num_layers)
        limit = np.asarray(problem.lat_limit, dtype=np.float64)
        scale = np.where(np.isfinite(limit), limit, 1.0)
        self.w = weight / scale
        self.nodes = []
        for menu in problem.menus:
            lat = np.asarray(menu.lat, dtype=np.float64)
            s = self.w @ lat
            k = np.asarray(menu.k)
            order = np.lexsort((s, k))
            self.nodes.append((k[order], s[order], lat[:, order], np.asarray(menu.cap, dtype=np.float64)[order], order))

    def table(self, i: int, c: float) -> tuple[FloatArray, FloatArray, np.ndarray]:
        """g[k] (scalar), gv[:, k] (latency vector) and option per k, over options with cap >= c."""
        k, s, lat, cap, order = self.nodes[i]
        mask = cap >= c
        km = k[mask]
        first = np.flatnonzero(np.r_[True, km[1:] != km[:-1]]) if km.size else np.zeros(0, np.int64)
        g = np.full(self.L + 1, np.inf)
        gv = np.full((lat.shape[0], self.L + 1), np.inf)
        gi = np.full(self.L + 1, -1, dtype=np.int64)
        sel = np.flatnonzero(mask)[first]
        ksel = k[sel]
        ok = ksel <= self.L
        g[ksel[ok]] = s[sel[ok]]
        gv[:, ksel[ok]] = lat[:, sel[ok]]
        gi[ksel[ok]] = order[sel[ok]]
        return g, gv, gi

    def solve(
        self, nodes: Sequence[int], c: float, budget: FloatArray
    ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """Options (and k) of ``nodes`` with caps >= c, k summing to L, least scalar latency; None unless
        that latency vector fits ``budget``."""
        L = self.L
        D = np.full(L + 1, np.inf)
        D[0] = 0.0
        Dv = np.zeros((self.w.shape[0], L + 1))
        steps = []
        for i in nodes:
            g, gv, gi = self.table(i, c)
            D_new, arg = minplus(D, g)
            q = np.arange(L + 1)
            Dv = Dv[:, arg] + gv[:, q - arg]
            steps.append((arg, gi))
            D = D_new
        if not math.isfinite(D[L]):
            return None
        if not np.all(Dv[:, L] <= budget):
            return None
        pos = L
        opts: list[int] = []
        ks: list[int] = []
        for arg, gi in reversed(steps):
            prev = int(arg[pos])
            ks.append(pos - prev)
            opts.append(int(gi[pos - prev]))
            pos = prev
        return tuple(reversed(opts)), tuple(reversed(ks))


def _best_chain(
    problem: PlacementProblem,
    nodes: tuple[int, ...],
    edges: set[Edge],
    knaps: list[_Knapsack],
    orders: list[tuple[FloatArray, float, tuple[int, ...]]] | None = None,
) -> _Chain | None:
    limit = np.asarray(problem.lat_limit, dtype=np.float64)
    tol = _tol(limit)
    caps = np.unique(np.concatenate([np.asarray(problem.menus[i].cap, dtype=np.float64) for i in nodes]))
    best: _Chain | None = None
    for lat_links, lcap, perm in _orders(problem, nodes, edges) if orders is None else orders:
        budget = limit - lat_links + tol
        if np.any(budget < 0):
            continue
        for ks in knaps:
            cand = caps[caps <= lcap] if math.isfinite(lcap) else caps
            cand = np.unique(np.r_[cand, min(lcap, float(caps.max()))])
            if best is not None:
                cand = cand[cand > best.value]
            if cand.size == 0:
                continue
            lo, hi = -1, cand.size - 1  # find the largest feasible index
            found = None
            if (sol := ks.solve(perm, float(cand[0]), budget)) is None:
                continue
            found = (0, sol)
            lo = 0
            while lo < hi:
                mid = (lo + hi + 1) // 2
                sol = ks.solve(perm, float(cand[mid]), budget)
                if sol is None:
                    hi = mid - 1
                else:
                    lo, found = mid, (mid, sol)
            opts, kk = found[1]
            value = min(lcap, min(float(problem.menus[i].cap[o]) for i, o in zip(perm, opts, strict=True)))
            if best is None or value > best.value:
                best = _Chain(value, perm, opts, kk)
    return best


def _chain_family(problem: PlacementProblem) -> PlacementResult | None:
    n = problem.n
    edges = set(usable_edges(problem))
    nm = problem.num_metrics
    weights = [np.eye(nm)[m] for m in range(nm)] + ([np.ones(nm)] if nm > 1 else [])
    knaps = [_Knapsack(problem, w) for w in weights]
    chains: dict[int, _Chain] = {}
    memo: dict[tuple[int, ...], _Chain | None] = {}
    classes = _Classes(problem)
    for mask in range(1, 1 << n):
        nodes = tuple(i for i in range(n) if mask >> i & 1)
        canon, relabel = classes.canonical(nodes)
        if canon not in memo:
            memo[canon] = _best_chain(problem, canon, edges, knaps)
        ch = memo[canon]
        if ch is not None:
            chains[mask] = attrs.evolve(ch, order=tuple(relabel[x] for x in ch.order))
    # set partition into chains
    best: dict[int, tuple[float, tuple[int, ...]]] = {0: (0.0, ())}
    for mask in range(1, 1 << n):
        low = mask & -mask
        rest = mask ^ low
        cand: tuple[float, tuple[int, ...]] | None = None
        sub = rest
        while True:
            part = sub | low
            if part in chains and (mask ^ part) in best:
                v = chains[part].value + best[mask ^ part][0]
                if cand is None or v > cand[0]:
                    cand = (v, (part, *best[mask ^ part][1]))
            if sub == 0:
                break
            sub = (sub - 1) & rest
        if cand is not None:
            best[mask] = cand
    full = (1 << n) - 1
    if full not in best:
        return None
    option = [0] * n
    start = [0] * n
    flows: dict[Edge, float] = {}
    for part in best[full][1]:
        ch = chains[part]
        pos = 0
        prev = n
        for i, o, k in zip(ch.order, ch.options, ch.ks, strict=True):
            option[i], start[i] = o, pos
            flows[(prev, i)] = ch.value
            pos += k
            prev = i
        flows[(prev, n)] = ch.value
    return PlacementResult(best[full][0], "feasible", math.inf, "dp", tuple(option), tuple(start), flows)


class _Classes:
    """Interchangeable nodes (same kind, menu and links): a subset of nodes and its canonical image,
    which takes the lowest-numbered members of each class, have the same best chain up to relabelling."""

    def __init__(self, problem: PlacementProblem) -> None:
        n = problem.n
        rep = class_reps(problem)
        self.rep = rep
        self.members = {r: [x for x in range(n) if rep[x] == r] for r in set(rep)}

    def canonical(self, nodes: tuple[int, ...]) -> tuple[tuple[int, ...], dict[int, int]]:
        """The canonical subset, and the map from its nodes to ``nodes``."""
        relabel: dict[int, int] = {}
        for r, mem in self.members.items():
            mine = [x for x in nodes if self.rep[x] == r]
            relabel.update(zip(mem[: len(mine)], mine, strict=True))
        return tuple(sorted(relabel)), relabel


def pipeline_dp(problem: PlacementProblem) -> PlacementResult:
    """The best chain-family placement (pipelines and replicas of pipelines); see the module docstring.

    ``status`` is ``feasible`` (``bound`` inf) when one is found, else ``unknown``; ``method`` "dp".
    """
    t0 = time.perf_counter()
    check_problem(problem)
    res = _chain_family(problem)
    dt = time.perf_counter() - t0
    if res is None:
        return PlacementResult(0.0, "unknown", math.inf, "dp", solve_s=dt)
    ev = evaluate_placement(problem, res.option, res.start, res.flows.keys())
    if ev is None:  # cannot happen: the chain was checked against the limits with their tolerance
        return PlacementResult(0.0, "unknown", math.inf, "dp", solve_s=dt)
    return attrs.evolve(res, value=ev[0], flows=ev[1], solve_s=dt)


# ----------------------------------------------------------------------------------------------------
# Exact enumeration for n <= 3


def _group_best(keys: np.ndarray, vals: FloatArray, nkeys: int) -> tuple[FloatArray, np.ndarray]:
    """Per key in 0..nkeys-1: the largest value and its position (-inf and -1 where none)."""
    best = np.full(nkeys, -np.inf)
    pos = np.full(nkeys, -1, dtype=np.int64)
    if keys.size:
        order = np.lexsort((vals, keys))
        last = np.flatnonzero(np.r_[keys[order][1:] != keys[order][:-1], True])
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
        self.budget = self.limit + _tol(self.limit)
        self.ll = np.asarray(problem.link_lat, dtype=np.float64)
        self.lc = np.asarray(problem.link_cap, dtype=np.float64)
        self.edges = set(usable_edges(problem))
        self.k = [np.asarray(m.k) for m in problem.menus]
        self.cap = [np.asarray(m.cap, dtype=np.float64) for m in problem.menus]
        self.lat = [np.asarray(m.lat, dtype=np.float64) for m in problem.menus]

    def _has(self, *path: int) -> bool:
        return all(e in self.edges for e in itertools.pairwise(path))

    def _links(self, *path: int) -> tuple[FloatArray, float]:
        pairs = list(itertools.pairwise(path))
        lat = np.sum([self.ll[:, u, v] for u, v in pairs], axis=0)
        return lat, min(float(self.lc[u, v]) for u, v in pairs)

    def single(self, i: int) -> tuple[float, int] | None:
        n = self.n
        if not self._has(n, i, n):
            return None
        lat, lcap = self._links(n, i, n)
        ok = (self.k[i] == self.L) & np.all(self.lat[i] + lat[:, None] <= self.budget[:, None], axis=0)
        if not ok.any():
            return None
        val = np.where(ok, np.minimum(self.cap[i], lcap), -1.0)
        o = int(np.argmax(val))
        return float(val[o]), o

    def chain2(self, i: int, j: int) -> tuple[float, int, int] | None:
        n = self.n
        if not self._has(n, i, j, n):
            return None
        lat, lcap = self._links(n, i, j, n)
        pi_, pj = np.nonzero(self.k[i][:, None] + self.k[j][None, :] == self.L)
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
        best: list[tuple[FloatArray, np.ndarray, np.ndarray]] = []
        for x, pt in zip((j, l_), paths, strict=True):
            lat, _ = self._links(*pt)
            pa, px = np.nonzero(self.k[a][:, None] + self.k[x][None, :] == self.L)
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
        self, order: tuple[int, ...], lat_links: FloatArray, lcap: float, lower: float
    ) -> tuple[float, tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None:
        """The best chain ``order`` of three nodes worth more than ``lower``, by enumeration."""
        if lcap <= lower:
            return None
        i, j, l_ = order
        sel = [np.flatnonzero(self.cap[x] > lower) for x in order]
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
        n, L = self.n, self.L
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
        for i, j in itertools.permutations(nodes, 2):
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


def exact_small(problem: PlacementProblem) -> PlacementResult | None:
    """The proven optimum of a problem with n <= 3 nodes, by enumerating every shape: replicas,
    two-node chains beside a replica, three-node chains, one node feeding two (fork) and two feeding
    one (join); each is exact (three-node chains by the bisection knapsack with one latency metric,
    else by numpy over the options that could beat the other shapes; the others by numpy over all
    option pairs whose k add up to L). Returns status ``infeasible`` when no shape has a placement,
    and None when n > 3."""
    n = problem.n
    if n > SMALL_NODES:
        return None
    sm = _Small(problem)
    chain3: list[tuple[float, tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = []
    if n == 3:
        nm = problem.num_metrics
        weights = [np.ones(1)] if nm == 1 else [*np.eye(nm), np.ones(nm)]
        knaps = [_Knapsack(problem, w) for w in weights]
        orders = []
        for order in itertools.permutations(range(3)):
            seq = (n, *order, n)
            if sm._has(*seq):
                lat, lcap = sm._links(*seq)
                orders.append((lat, lcap, order))
                ch = _best_chain(problem, order, sm.edges, knaps, orders=[(lat, lcap, order)])
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


# ----------------------------------------------------------------------------------------------------
# The placer


def _lift(red: Reduced, res: PlacementResult, original: PlacementProblem, dt: float) -> PlacementResult:
    """Map a result on the reduced problem back to the original option indices, re-checked exactly."""
    if not res.option:
        return attrs.evolve(res, solve_s=dt)
    option = tuple(int(red.index[i][o]) for i, o in enumerate(res.option))
    ev = evaluate_placement(original, option, res.start, res.flows.keys())
    if ev is None:  # pragma: no cover - the reduced problem keeps every latency and layer count
        raise AssertionError("a reduced placement failed its check on the original problem")
    bound = ev[0] if res.status == "optimal" else max(min(res.bound, red.ub), ev[0])
    return attrs.evolve(res, value=ev[0], option=option, flows=ev[1], bound=bound, solve_s=dt)


def _restrict(problem: PlacementProblem, keep: Sequence[np.ndarray], edges: set[Edge]) -> PlacementProblem:
    """``problem`` with only the kept options and edges (a dropped edge gets infinite latency)."""
    n = problem.n
    menus = tuple(_subset_menu(m, k) for m, k in zip(problem.menus, keep, strict=True))
    ll = np.asarray(problem.link_lat, dtype=np.float64).copy()
    for u in range(n + 1):
        for v in range(n + 1):
            if (u, v) not in edges:
                ll[:, u, v] = np.inf
    return attrs.evolve(problem, menus=menus, link_lat=ll)


def _renumber(res: PlacementResult, keep: Sequence[np.ndarray]) -> PlacementResult:
    new = [np.cumsum(k) - 1 for k in keep]
    return attrs.evolve(res, option=tuple(int(new[i][o]) for i, o in enumerate(res.option)))


def _below(bound: float, method: str, t0: float) -> PlacementResult:
    return PlacementResult(0.0, "below", bound, method, solve_s=time.perf_counter() - t0)


def place(
    problem: PlacementProblem,
    *,
    time_limit: float = 10.0,
    shape_budget: int = SHAPE_BUDGET,
    floor: float | None = None,
    spanning: bool = False,
    lp_floor: bool = False,
) -> PlacementResult:
    """The optimal placement of ``problem`` (see the module docstring for the method).

    ``method`` names the step that settled it: "reduce" (proved infeasible), "shapes", "dp-proven",
    "lp-proven" or "milp". ``shape_budget`` bounds the shape search's work (n >= 4; deterministic);
    ``time_limit`` bounds the MILP step only (HiGHS may overrun it); that step is the only one that can
    end unproven (``feasible`` with a bound, or ``unknown``).

    ``floor`` (> 0): the caller needs the optimum only if it is worth more than ``floor`` (a template
    build drops a multiset that its smaller templates already match). Every step may then stop as soon
    as it proves that no placement is worth more: status ``below``, ``bound`` <= ``floor`` (that proof),
    value 0 and no placement; ``method`` names the step ("reduce": the reductions' upper bound). An
    optimum above ``floor`` is found and proven as without it.

    ``spanning`` (with ``floor``): the caller guarantees that no placement with two or more components
    (replicas side by side) is worth more than ``floor``, so the shape search decides only connected
    placements of all the nodes (``shape_search``'s ``spanning``).

    ``lp_floor`` (with ``floor``, at least ``LP_FLOOR_NODES`` nodes): before the search, the LP
    relaxation of the MILP bounds every placement; when that bound is at most ``floor`` the result is
    ``below`` (method "lp-proven"). It costs about 20 ms at six nodes: on 6-node gemma-3-27b prefill
    multisets it proved 93 of 130 floors, on mixtral-8x7b decode none of 51, so the template build asks
    for it in prefill mode only; at 4-5 nodes the search is cheaper than the LP (gemma-3-27b prefill:
    300 multisets each took 1.3-1.9x longer with it).
    """
    t0 = time.perf_counter()
    check_problem(problem)
    if spanning and floor is None:
        raise ValueError("spanning needs a floor")
    if time_limit <= 0 or math.isnan(time_limit):
        raise ValueError(f"time_limit must be > 0, got {time_limit}")
    if isinstance(shape_budget, bool) or not isinstance(shape_budget, int) or shape_budget < 0:
        raise ValueError(f"shape_budget must be an integer >= 0, got {shape_budget!r}")
    if floor is not None and not (0 < floor < math.inf):
        raise ValueError(f"floor must be > 0 and finite (or None), got {floor!r}")
    red = reduce_problem(problem)
    if red is None:
        return PlacementResult(0.0, "infeasible", 0.0, "reduce", solve_s=time.perf_counter() - t0)
    rp = red.problem
    if floor is not None and red.ub > floor:
        red = attrs.evolve(red, ub=min(red.ub, _work_ub(rp)))
    if floor is not None and red.ub <= floor:
        return _below(red.ub, "reduce", t0)
    small = exact_small(rp)
    if small is not None:
        if small.status == "infeasible":
            return attrs.evolve(small, solve_s=time.perf_counter() - t0)
        return _lift(red, small, problem, time.perf_counter() - t0)
    if lp_floor and floor is not None and rp.n >= LP_FLOOR_NODES:
        lp_bound = lp_reduce(rp, floor)[0]
        if lp_bound <= floor:
            return _below(lp_bound, "lp-proven", t0)
    dp = _chain_family(rp) if floor is None else None
    if dp is not None:
        ev = evaluate_placement(rp, dp.option, dp.start, dp.flows.keys())
        dp = attrs.evolve(dp, value=ev[0], flows=ev[1]) if ev is not None else None
    if dp is not None and dp.value < red.ub * (1 - 1e-9) and floor is None:
        red = attrs.evolve(red, ub=min(red.ub, _work_ub(rp)))
    if dp is not None and dp.value >= red.ub * (1 - 1e-9):
        res = attrs.evolve(dp, status="optimal", bound=dp.value, method="dp-proven")
        return _lift(red, res, problem, time.perf_counter() - t0)
    inc = dp
    shape_bound = math.inf
    if shape_budget > 0:
        found = shape_search(rp, incumbent=dp, budget=shape_budget, floor=floor, spanning=spanning)
        if found is not None and found.status == "infeasible":
            return attrs.evolve(found, solve_s=time.perf_counter() - t0)
        if found is not None and found.status == "below":
            return _below(found.bound, "shapes", t0)
        if found is not None and found.status == "optimal":
            return _lift(red, found, problem, time.perf_counter() - t0)
        if found is not None:  # the budget ran out: a better incumbent and a bound for the residue
            inc = attrs.evolve(found, status="feasible", method="dp")
            shape_bound = found.bound
            if floor is not None and shape_bound <= floor:
                return _below(shape_bound, "shapes", t0)
    index = list(red.index)
    cur = rp
    if floor is not None and inc is not None and inc.value < floor:
        inc = None  # only placements above the floor matter now
    target = inc.value if inc is not None else (floor or 0.0)
    if target > 0:
        for _ in range(LP_ROUNDS):
            bound, keep, edges = lp_reduce(cur, target)
            if inc is not None and bound <= inc.value * (1 + PROOF_RTOL):
                res = attrs.evolve(inc, status="optimal", bound=inc.value, method="lp-proven")
                return _lift(Reduced(cur, tuple(index), bound), res, problem, time.perf_counter() - t0)
            if floor is not None and bound <= floor:
                return _below(bound, "lp-proven", t0)
            if inc is not None:
                for i, o in enumerate(inc.option):
                    keep[i][o] = True
                edges |= set(inc.flows.keys())
            elif any(not k.any() for k in keep):  # every node needs an option: nothing beats the floor
                return _below(target, "lp-proven", t0)
            if all(k.all() for k in keep) and len(edges) == len(usable_edges(cur)):
                break
            cur = _restrict(cur, keep, edges)
            index = [ix[k] for ix, k in zip(index, keep, strict=True)]
            if inc is not None:
                inc = _renumber(inc, keep)
    res = milp_place(cur, time_limit=time_limit, warm_start=inc is not None, initial=inc, symmetry=True)
    if res.status == "infeasible":
        if floor is not None and cur is not rp:  # no placement above the floor (the rest was fixed away)
            return _below(floor, "milp", t0)
        return attrs.evolve(res, solve_s=time.perf_counter() - t0)
    if floor is not None and res.bound <= floor:
        return _below(res.bound, "milp", t0)
    return _lift(Reduced(cur, tuple(index), min(red.ub, shape_bound)), res, problem, time.perf_counter() - t0)
