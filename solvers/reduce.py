"""Exact menu reductions of a placement problem: each keeps the optimum value and an optimal placement.

- drop options with k > L;
- drop an option whose latency, plus the least latency with which the other nodes could cover the
  remaining L - k layers (a knapsack over the other nodes, each used at most once), plus the least
  link latencies into and out of the node, exceeds a limit: no path through it can meet the limit;
- clip capacities at an upper bound UB on the total flow (no node carries more than the total), where
  UB is the least of the layer-work bound sum_i max_o k_o c_o / L (every unit of flow crosses L
  layers) and the capacity out of the source and into the sink;
- drop an option dominated by another of the same node with the same k: capacity >= and latency
  <= in every metric, and a role that may run wherever its own may (charged for at least as many
  micro-batches and at least the same ends; memory does not matter otherwise: every option already fits);
- drop a latency metric that no path can exceed (every node's largest latency plus n + 1 of the
  largest link latencies fits its limit); edges unusable before stay unusable.
Repeated until nothing changes. A node left without options proves the problem infeasible.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from solvers.bounds import work_fixed_point
from solvers.minplus import minplus
from solvers.problem import Edge, NodeMenu, PlacementProblem
from solvers.rules import lat_tol, usable_edges


@attrs.frozen(eq=False)
class Reduced:
    """A reduced copy of a problem: ``index[i][o']`` is the original index of reduced option o'."""

    problem: PlacementProblem
    index: tuple[np.ndarray, ...]
    ub: float


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


def work_bound(problem: PlacementProblem) -> float:
    """The layer-work fixed point of ``problem``'s menus (``solvers.bounds.work_fixed_point``): tighter
    than ``_upper_bound``'s work term, which clips capacities at its own value only once."""
    ks = [np.asarray(m.k) for m in problem.menus]
    return work_fixed_point(ks, [np.asarray(m.cap, dtype=np.float64) for m in problem.menus], int(problem.num_layers))


def subset_menu(menu: NodeMenu, keep: np.ndarray, cap: np.ndarray | None = None) -> NodeMenu:
    return NodeMenu(
        k=np.asarray(menu.k)[keep],
        b=np.asarray(menu.b)[keep],
        cap=(np.asarray(menu.cap, dtype=np.float64) if cap is None else cap)[keep],
        lat=np.asarray(menu.lat, dtype=np.float64)[:, keep],
        mem=np.asarray(menu.mem, dtype=np.float64)[keep],
        d=np.asarray(menu.d)[keep],
        ends=np.asarray(menu.ends)[keep],
    )


def dominated(
    k: np.ndarray, cap: np.ndarray, lat: np.ndarray, d: np.ndarray | None = None, ends: np.ndarray | None = None
) -> np.ndarray:
    """Options dominated by another with the same k that may run wherever they may (a role charged for at
    least as many micro-batches and at least the same ends; ties: the lower index survives)."""
    n = k.shape[0]
    out = np.zeros(n, dtype=bool)
    if n < 2:
        return out
    order = np.argsort(k, kind="stable")
    ks = k[order]
    starts = np.flatnonzero(np.concatenate(([True], ks[1:] != ks[:-1])))
    sizes = np.diff(np.append(starts, n))
    starts, sizes = starts[sizes >= 2], sizes[sizes >= 2]
    if starts.size == 0:
        return out
    # every group of equal k at once: grp[g, s] is the s-th option of group g, padded with its first
    # option where the group is shorter than the widest (``valid`` masks the padding)
    width = np.arange(int(sizes.max()))
    valid = width[None, :] < sizes[:, None]
    grp = order[np.where(valid, starts[:, None] + width[None, :], starts[:, None])]
    d = np.zeros(n, np.int64) if d is None else d
    ends = np.zeros(n, np.int64) if ends is None else ends
    c, la, dg, eg = cap[grp], lat[:, grp], d[grp], ends[grp]
    x, y = (slice(None), slice(None), None), (slice(None), None, slice(None))  # [g, x, y]: y dominates x?
    ge = c[y] >= c[x]
    le = np.all(la[:, :, None, :] <= la[:, :, :, None], axis=0)
    strict = (c[y] > c[x]) | np.any(la[:, :, None, :] < la[:, :, :, None], axis=0)
    strict |= (dg[y] > dg[x]) | (eg[y] != eg[x])
    role = (dg[y] >= dg[x]) & ((eg[y] & eg[x]) == eg[x])  # y runs where x does
    dom = ge & le & role & (strict | (grp[y] < grp[x])) & valid[y]
    dom[:, width, width] = False
    out[grp[valid]] = dom.any(axis=2)[valid]
    return out


def reduce_problem(problem: PlacementProblem) -> Reduced | None:
    """The exact reductions of the module docstring; None when they prove the problem infeasible."""
    n, L = problem.n, int(problem.num_layers)
    limit = np.asarray(problem.lat_limit, dtype=np.float64)
    tol = lat_tol(limit)
    ll = np.asarray(problem.link_lat, dtype=np.float64)
    index = [np.arange(m.size) for m in problem.menus]
    cur = problem
    clean = [False] * n  # node i's menu has no dominated option at its current capacities
    edges = usable_edges(cur)
    for _ in range(20):
        changed = False
        cut = False
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
                changed = cut = True
                menus[i] = subset_menu(menu, keep)
                index[i] = index[i][keep]
            if menus[i].size == 0:
                return None
        cur = attrs.evolve(cur, menus=tuple(menus))
        if cut:
            edges = usable_edges(cur)
        ub = _upper_bound(cur, edges)
        menus = list(cur.menus)
        for i in range(n):
            menu = menus[i]
            cap = np.minimum(np.asarray(menu.cap, dtype=np.float64), ub)
            clipped = bool((cap < menu.cap).any())
            if clean[i] and not clipped:  # dropping options (above) leaves the rest undominated
                continue
            lat = np.asarray(menu.lat, dtype=np.float64)
            drop = dominated(np.asarray(menu.k), cap, lat, np.asarray(menu.d), np.asarray(menu.ends))
            clean[i] = True
            if clipped or drop.any():
                changed = changed or bool(drop.any())
                menus[i] = subset_menu(menu, ~drop, cap)
                index[i] = index[i][~drop]
        cur = attrs.evolve(cur, menus=tuple(menus))  # ``edges`` hold: a dominated option's latencies
        if not changed:  # are at least those of an undominated one, so no node's least latency changed
            break
    cur = _drop_slack_metrics(cur, edges)
    return Reduced(cur, tuple(index), _upper_bound(cur, usable_edges(cur)))


def _drop_slack_metrics(problem: PlacementProblem, edges: Sequence[Edge]) -> PlacementProblem:
    """Remove the metrics that no path can exceed: the sum of every node's largest latency plus n + 1
    of the largest usable link latencies (``edges``: ``usable_edges(problem)``) fits the limit (a path
    visits each node at most once)."""
    n = problem.n
    limit = np.asarray(problem.lat_limit, dtype=np.float64)
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
