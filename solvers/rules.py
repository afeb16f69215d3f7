"""The rules every placement obeys, checked exactly, and the symmetry of interchangeable nodes.

Every placer (the reference MILP, the chain family, the small-case and shape enumerations) filters edges
with ``usable_edges``, re-checks its answer with ``evaluate_placement`` (ranges, coverage, each node's
option role against the micro-batches and ends it holds (``placement_roles``), latency per path with the
tolerance ``lat_tol``, then an exact maximum flow) and folds interchangeable nodes (same kind, menu and
links) with ``class_reps`` and ``Classes``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import attrs
import numpy as np

from solvers.brute import max_flow
from solvers.problem import FIRST, LAST, Edge, PlacementProblem, PlacementResult

LAT_RTOL = 1e-9


def usable_edges(problem: PlacementProblem) -> list[Edge]:
    """Edges that some feasible placement could choose: finite link latency and, with the cheapest
    options at both ends, within every latency limit."""
    n = problem.n
    limit = np.asarray(problem.lat_limit, dtype=np.float64)
    ll = np.asarray(problem.link_lat, dtype=np.float64)
    minlat = np.zeros((problem.num_metrics, n + 1))  # column n (the source, the sink) adds nothing
    for i, menu in enumerate(problem.menus):
        lat = np.asarray(menu.lat, dtype=np.float64)
        minlat[:, i] = lat.min(axis=1) if lat.shape[1] else np.inf
    total = ll + minlat[:, :, None] + minlat[:, None, :]
    tol = lat_tol(limit)
    ok = np.all(np.isfinite(ll), axis=0) & np.all(total <= (limit + tol)[:, None, None], axis=0)
    ok[np.arange(n + 1), np.arange(n + 1)] = False  # no self-loops, no source-to-sink edge
    src = [(n, i) for i in range(n) if ok[n, i]]
    mid = [(int(i), int(j)) for i, j in zip(*np.nonzero(ok[:n, :n]), strict=True)]
    return src + mid + [(i, n) for i in range(n) if ok[i, n]]


def lat_tol(limit: np.ndarray) -> np.ndarray:
    """The slack allowed on each latency limit: LAT_RTOL of the limit (at least of 1 s); 0 where unlimited."""
    return np.asarray(LAT_RTOL * np.where(np.isfinite(limit), np.maximum(limit, 1.0), 0.0))


def placement_roles(
    n: int, L: int, start: Sequence[int], end: Sequence[int], edges: Iterable[Edge]
) -> tuple[list[int], list[int]]:
    """Per node of a placement whose ranges chain along ``edges``: the micro-batches in flight through it
    (the sum, over the source-to-sink paths through it, of their stage counts: a path of p stages keeps p
    micro-batches in flight, and every one of them passes each of its stages) and the model ends it holds
    (``FIRST`` when it starts at layer 0, ``LAST`` when it ends at layer L).

    With N_in/S_in the number of paths from the source to node v and their summed stage counts (v
    included), and N_out/S_out the same from v to the sink, the paths through v count
    S_in N_out + N_in S_out - N_in N_out stages in all (v is counted in both halves)."""
    es = list(edges)
    order = sorted(range(n), key=lambda i: start[i])
    n_in, s_in = [0] * (n + 1), [0] * (n + 1)
    n_in[n] = 1
    for v in order:
        for u, w in es:
            if w == v:
                n_in[v] += n_in[u]
                s_in[v] += s_in[u] + n_in[u]
    n_out, s_out = [0] * (n + 1), [0] * (n + 1)
    n_out[n] = 1
    for v in reversed(order):
        for u, w in es:
            if u == v:
                n_out[v] += n_out[w]
                s_out[v] += s_out[w] + n_out[w]
    depth = [s_in[v] * n_out[v] + n_in[v] * s_out[v] - n_in[v] * n_out[v] for v in range(n)]
    ends = [(FIRST if start[v] == 0 else 0) | (LAST if end[v] == L else 0) for v in range(n)]
    return depth, ends


def evaluate_placement(
    problem: PlacementProblem, option: Sequence[int], start: Sequence[int], edges: Iterable[Edge]
) -> tuple[float, dict[Edge, float]] | None:
    """The exact value of a placement, or None when it breaks a rule (ranges, coverage, latency).

    Returns the maximum flow over ``edges`` and the flow on each of them.
    """
    n, L = problem.n, int(problem.num_layers)
    edges = sorted(set(edges))
    if len(option) != n or len(start) != n:
        return None
    ks = [int(problem.menus[i].k[option[i]]) for i in range(n)]
    ends = [start[i] + ks[i] for i in range(n)]
    if any(start[i] < 0 or ends[i] > L for i in range(n)):
        return None
    has_in, has_out = [False] * n, [False] * n
    for u, v in edges:
        if u == v or (u == n and v == n):
            return None
        if u == n and start[v] != 0:
            return None
        if v == n and ends[u] != L:
            return None
        if u < n and v < n and ends[u] != start[v]:
            return None
        if u < n:
            has_out[u] = True
        if v < n:
            has_in[v] = True
    if not (all(has_in) and all(has_out)):
        return None
    if problem.has_roles:
        depth, held = placement_roles(n, L, start, ends, edges)
        for i in range(n):
            menu, o = problem.menus[i], option[i]
            if int(menu.d[o]) < depth[i] or int(menu.ends[o]) & held[i] != held[i]:
                return None
    limit = np.asarray(problem.lat_limit, dtype=np.float64)
    ll = np.asarray(problem.link_lat, dtype=np.float64)
    if not np.isfinite(np.array([ll[:, u, v] for u, v in edges])).all():
        return None
    # Longest path per metric, nodes in order of start (edges go from smaller to larger start).
    pot = np.full((problem.num_metrics, n), -np.inf)
    for v in sorted(range(n), key=lambda i: start[i]):
        best = np.full(problem.num_metrics, -np.inf)
        for u, x in edges:
            if x == v:
                best = np.maximum(best, (0.0 if u == n else pot[:, u]) + ll[:, u, v])
        pot[:, v] = best + np.asarray(problem.menus[v].lat[:, option[v]], dtype=np.float64)
    worst = np.full(problem.num_metrics, -np.inf)
    for u, v in edges:
        if v == n:
            worst = np.maximum(worst, pot[:, u] + ll[:, u, n])
    if not np.all(worst <= limit + lat_tol(limit)):
        return None
    caps = tuple(float(problem.menus[i].cap[option[i]]) for i in range(n))
    return max_flow(n, edges, caps, np.asarray(problem.link_cap, dtype=np.float64))


def stages_of(problem: PlacementProblem, result: PlacementResult) -> list[tuple[int, int, int, int]]:
    """The stages of a placement: (node index, first layer, end layer (exclusive), option index),
    sorted by first layer then node. Empty for a result without a placement."""
    if not result.option:
        return []
    out = [
        (i, int(result.start[i]), int(result.start[i] + problem.menus[i].k[result.option[i]]), int(o))
        for i, o in enumerate(result.option)
    ]
    return sorted(out, key=lambda t: (t[1], t[0]))


def interchangeable(problem: PlacementProblem, i: int, j: int) -> bool:
    """Whether nodes i and j can swap roles in every placement: same kind, menu and links."""
    if problem.kinds[i] != problem.kinds[j]:
        return False
    a, b = problem.menus[i], problem.menus[j]
    if a is not b:
        for x, y in ((a.k, b.k), (a.cap, b.cap), (a.lat, b.lat), (a.d, b.d), (a.ends, b.ends)):
            if np.shape(x) != np.shape(y) or not np.array_equal(x, y):
                return False
    n = problem.n
    perm = list(range(n + 1))
    perm[i], perm[j] = j, i
    p = np.asarray(perm)
    ll, lc = np.asarray(problem.link_lat), np.asarray(problem.link_cap)
    off = ~np.eye(n + 1, dtype=bool)
    return bool(np.array_equal(ll[:, p][:, :, p][:, off], ll[:, off]) and np.array_equal(lc[p][:, p][off], lc[off]))


def class_reps(problem: PlacementProblem) -> list[int]:
    """Per node, the lowest-numbered node it is interchangeable with (itself when none is lower)."""
    n = problem.n
    rep = list(range(n))
    for j in range(n):
        for i in range(j):
            if rep[i] == i and interchangeable(problem, i, j):
                rep[j] = i
                break
    return rep


def canonical(problem: PlacementProblem, res: PlacementResult) -> PlacementResult:
    """The same placement with each run of consecutive interchangeable nodes sorted by (start, k),
    the order that the MILP's symmetry rows require."""
    n = problem.n
    perm = list(range(n))  # perm[new position] = old node
    i = 0
    while i < n:
        j = i
        while j + 1 < n and interchangeable(problem, j, j + 1):
            j += 1
        if j > i:
            block = sorted(range(i, j + 1), key=lambda x: (res.start[x], int(problem.menus[x].k[res.option[x]]), x))
            perm[i : j + 1] = block
        i = j + 1
    if perm == list(range(n)):
        return res
    new_of = {old: new for new, old in enumerate(perm)}
    new_of[n] = n
    return attrs.evolve(
        res,
        option=tuple(res.option[perm[x]] for x in range(n)),
        start=tuple(res.start[perm[x]] for x in range(n)),
        flows={(new_of[u], new_of[v]): f for (u, v), f in res.flows.items()},
    )


class Classes:
    """Interchangeable nodes (same kind, menu and links), numbered by their lowest member.

    ``reps`` are the classes' lowest members in order, ``members[c]`` the nodes of class c in order and
    ``full[c]`` their number; sub-multisets of the nodes are count vectors over the classes.
    """

    def __init__(self, problem: PlacementProblem) -> None:
        n = problem.n
        rep = class_reps(problem)
        self.rep = rep
        self.reps = sorted(set(rep))
        self.members = [[x for x in range(n) if rep[x] == r] for r in self.reps]
        self.full = tuple(len(m) for m in self.members)

    def canonical(self, nodes: tuple[int, ...]) -> tuple[tuple[int, ...], dict[int, int]]:
        """The canonical image of a subset of nodes (the lowest-numbered members of each of its classes,
        which has the same best placement up to relabelling), and the map from its nodes to ``nodes``."""
        relabel: dict[int, int] = {}
        for r, mem in zip(self.reps, self.members, strict=True):
            mine = [x for x in nodes if self.rep[x] == r]
            relabel.update(zip(mem[: len(mine)], mine, strict=True))
        return tuple(sorted(relabel)), relabel

    def subsets(self) -> list[tuple[int, ...]]:
        """Every non-empty sub-multiset, by size then lexicographically."""
        out = [c for c in itertools.product(*(range(f + 1) for f in self.full)) if sum(c) > 0]
        return sorted(out, key=lambda c: (sum(c), c))
