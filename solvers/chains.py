"""The chain family: the best placement whose weakly connected components are chains (pure pipelines
and replicas of them), a first placement and a warm start for the exact placers.

For a chain, node latencies add up whatever the order, which only decides the link latencies and
capacities. So a subset U of nodes in order pi is worth min(lc(pi), B_U(T - ll(pi))), where B_U(beta)
is the largest bottleneck capacity c such that a knapsack over U (one option per node with capacity
>= c whose role allows its place in the chain: |U| micro-batches, the embedding on the first node, the LM
head on the last; the k summing to L) fits the latency budget beta. B_U comes from bisection over the capacities;
the knapsack is a min-plus convolution per node in numpy (``solvers.minplus``). With one latency
metric this is exact for the family; with two it minimises each metric and their normalised sum in turn
(a heuristic: the exact placers that start from it stay exact). A set-partition DP over the subsets
adds the replicas.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence

import attrs
import numpy as np

from solvers.minplus import minplus
from solvers.problem import FIRST, LAST, Edge, PlacementProblem, PlacementResult, check_problem
from solvers.rules import Classes, evaluate_placement, lat_tol, usable_edges


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


class Knapsack:
    """Per node: options sorted by (k, scalar latency), for thresholded least-latency tables (each table
    kept once computed: a chain search asks for the same ones across its orders and bisection steps).
    ``rep``: per node, a node with the same menu whose tables it shares (default: its own)."""

    def __init__(self, problem: PlacementProblem, weight: np.ndarray, rep: Sequence[int] | None = None) -> None:
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
        self.roles = problem.has_roles
        self.rep = list(range(problem.n)) if rep is None else list(rep)
        self._allowed: dict[tuple[int, tuple[int, int]], tuple[np.ndarray, ...]] = {}
        self._tables: dict[tuple[int, float, tuple[int, int]], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def _options(self, i: int, role: tuple[int, int]) -> tuple[np.ndarray, ...]:
        """Node i's sorted (k, s, lat, cap, option) over its options with k <= L whose role allows ``role``."""
        key = (i, role)
        got = self._allowed.get(key)
        if got is None:
            k, s, lat, cap, order = self.nodes[i]
            keep = k <= self.L
            if self.roles:
                keep &= self.p.menus[i].allowed(*role)[order]
            got = self._allowed[key] = (k[keep], s[keep], lat[:, keep], cap[keep], order[keep])
        return got

    def table(self, i: int, c: float, role: tuple[int, int] = (1, 0)) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """g[k] (scalar), gv[:, k] (latency vector) and option per k, over options with cap >= c whose role
        allows ``role`` (micro-batches through the node, ends it holds): per k, the first in the sorted
        order (the least scalar latency). Shared: the caller must not write to them."""
        key = (self.rep[i], c, role)
        got = self._tables.get(key)
        if got is None:
            k, s, lat, cap, order = self._options(i, role)
            sel = np.flatnonzero(cap >= c)
            km = k[sel]
            sel = sel[np.concatenate(([True], km[1:] != km[:-1]))] if km.size else sel
            g = np.full(self.L + 1, np.inf)
            gv = np.full((lat.shape[0], self.L + 1), np.inf)
            gi = np.full(self.L + 1, -1, dtype=np.int64)
            ksel = k[sel]
            g[ksel] = s[sel]
            gv[:, ksel] = lat[:, sel]
            gi[ksel] = order[sel]
            got = self._tables[key] = (g, gv, gi)
        return got

    def solve(
        self, nodes: Sequence[int], c: float, budget: np.ndarray
    ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """Options (and k) of ``nodes`` with caps >= c, k summing to L, least scalar latency; None unless
        that latency vector fits ``budget``."""
        L = self.L
        q = np.arange(L + 1)
        last = len(nodes) - 1
        steps = []
        D = Dv = np.zeros(0)
        for pos, i in enumerate(nodes):
            ends = (FIRST if pos == 0 else 0) | (LAST if pos == last else 0)
            g, gv, gi = self.table(i, c, (len(nodes), ends))
            if pos == 0:  # the convolution with the empty chain (0 at k = 0, inf elsewhere) is g itself
                D, Dv, arg = g, gv, np.zeros(L + 1, np.int64)
            else:
                D, arg = minplus(D, g)
                Dv = Dv[:, arg] + gv[:, q - arg]
            steps.append((arg, gi))
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


def best_chain(
    problem: PlacementProblem,
    nodes: tuple[int, ...],
    edges: set[Edge],
    knaps: list[Knapsack],
    orders: list[tuple[np.ndarray, float, tuple[int, ...]]] | None = None,
) -> _Chain | None:
    limit = np.asarray(problem.lat_limit, dtype=np.float64)
    tol = lat_tol(limit)
    caps = np.unique(np.concatenate([np.asarray(problem.menus[i].cap, dtype=np.float64) for i in nodes]))
    best: _Chain | None = None
    for lat_links, lcap, perm in _orders(problem, nodes, edges) if orders is None else orders:
        budget = limit - lat_links + tol
        if np.any(budget < 0):
            continue
        for ks in knaps:
            cand = caps[caps <= lcap] if math.isfinite(lcap) else caps
            cand = np.unique(np.append(cand, min(lcap, float(caps.max()))))
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


def chain_family(problem: PlacementProblem) -> PlacementResult | None:
    n = problem.n
    edges = set(usable_edges(problem))
    nm = problem.num_metrics
    weights = [np.eye(nm)[m] for m in range(nm)] + ([np.ones(nm)] if nm > 1 else [])
    knaps = [Knapsack(problem, w) for w in weights]
    chains: dict[int, _Chain] = {}
    memo: dict[tuple[int, ...], _Chain | None] = {}
    classes = Classes(problem)
    for mask in range(1, 1 << n):
        nodes = tuple(i for i in range(n) if mask >> i & 1)
        canon, relabel = classes.canonical(nodes)
        if canon not in memo:
            memo[canon] = best_chain(problem, canon, edges, knaps)
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


def pipeline_dp(problem: PlacementProblem) -> PlacementResult:
    """The best chain-family placement (pipelines and replicas of pipelines); see the module docstring.

    ``status`` is ``feasible`` (``bound`` inf) when one is found, else ``unknown``; ``method`` "dp".
    """
    t0 = time.perf_counter()
    check_problem(problem)
    res = chain_family(problem)
    dt = time.perf_counter() - t0
    if res is None:
        return PlacementResult(0.0, "unknown", math.inf, "dp", solve_s=dt)
    ev = evaluate_placement(problem, res.option, res.start, res.flows.keys())
    if ev is None:  # cannot happen: the chain was checked against the limits with their tolerance
        return PlacementResult(0.0, "unknown", math.inf, "dp", solve_s=dt)
    return attrs.evolve(res, value=ev[0], flows=ev[1], solve_s=dt)
