"""Exhaustive placement search: the exactness reference for tiny problems (L <= 8, n <= 3; it
accepts up to n = 4 and L = 12, where it takes seconds).

It enumerates, independently of the MILP and the fast method, every layer interval (start, k) per node,
keeps the interval sets whose ranges chain (each start is 0 or another node's end, each end is L or
another node's start), then every subset of the compatible edges in which each node has an incoming and
an outgoing edge, then every option per node with the chosen k whose role allows its position (it is
charged for at least the micro-batches through it, the summed stage counts of the paths through it, and
for the model ends it holds: ``solvers.problem``). A combination is feasible when every source-to-sink
path over the chosen edges meets every latency limit (node and link latencies summed).
Its value is the maximum flow with node capacities ``cap`` and edge capacities ``link_cap``, computed by
augmenting paths on the node-split graph and memoised per (edge set, capacities).
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque

import numpy as np

from solvers.problem import Edge, PlacementInputError, PlacementProblem, PlacementResult, check_problem

MAX_LAYERS = 12
MAX_NODES = 4
LAT_RTOL = 1e-9


def brute_force_place(problem: PlacementProblem) -> PlacementResult:
    """The exact optimum of a tiny ``problem`` by exhaustive enumeration (see the module docstring)."""
    t0 = time.perf_counter()
    check_problem(problem)
    n, L = problem.n, int(problem.num_layers)
    if n > MAX_NODES or L > MAX_LAYERS:
        raise PlacementInputError(
            f"brute_force_place handles n <= {MAX_NODES} nodes and <= {MAX_LAYERS} layers, got n={n}, L={L}"
        )
    nm = problem.num_metrics
    limit = np.asarray(problem.lat_limit, dtype=np.float64)
    tol = LAT_RTOL * np.where(np.isfinite(limit), np.maximum(limit, 1.0), 0.0)
    link_lat = np.asarray(problem.link_lat, dtype=np.float64)
    link_cap = np.asarray(problem.link_cap, dtype=np.float64)

    by_k: list[dict[int, list[int]]] = []
    for menu in problem.menus:
        d: dict[int, list[int]] = {}
        for o, k in enumerate(np.asarray(menu.k).tolist()):
            if k <= L:
                d.setdefault(int(k), []).append(o)
        by_k.append(d)
    intervals = [[(s, k) for k in sorted(d) for s in range(L - k + 1)] for d in by_k]

    memo: dict[tuple[tuple[Edge, ...], tuple[float, ...]], tuple[float, dict[Edge, float]]] = {}
    best_val = -1.0
    best: tuple[tuple[int, ...], tuple[int, ...], dict[Edge, float]] | None = None

    for combo in itertools.product(*intervals):
        starts = [s for s, _ in combo]
        ends = [s + k for s, k in combo]
        if not _chains(starts, ends, L):
            continue
        compat: list[Edge] = [(n, i) for i in range(n) if starts[i] == 0]
        compat += [(i, j) for i in range(n) for j in range(n) if i != j and ends[i] == starts[j]]
        compat += [(i, n) for i in range(n) if ends[i] == L]
        compat = [(u, v) for u, v in compat if np.isfinite(link_lat[:, u, v]).all()]
        all_options = [by_k[i][combo[i][1]] for i in range(n)]
        for mask in range(1, 1 << len(compat)):
            edges = [compat[t] for t in range(len(compat)) if mask >> t & 1]
            if not _covered(edges, n):
                continue
            depth, held = _roles(n, L, starts, ends, edges)
            option_lists = [
                [
                    o
                    for o in all_options[i]
                    if int(problem.menus[i].d[o]) >= depth[i] and int(problem.menus[i].ends[o]) & held[i] == held[i]
                ]
                for i in range(n)
            ]
            node_lat = [
                [np.asarray(problem.menus[i].lat[:, o], dtype=np.float64) for o in option_lists[i]] for i in range(n)
            ]
            paths = _paths(edges, n)
            path_link = [sum((link_lat[:, u, v] for u, v in _pairs(p, n)), np.zeros(nm)) for p in paths]
            if any(not np.all(pl <= limit + tol) for pl in path_link):
                continue
            for choice in itertools.product(*(range(len(ol)) for ol in option_lists)):
                ok = True
                for p, pl in zip(paths, path_link, strict=True):
                    total = pl + sum((node_lat[i][choice[i]] for i in p), np.zeros(nm))
                    if not np.all(total <= limit + tol):
                        ok = False
                        break
                if not ok:
                    continue
                options = tuple(option_lists[i][choice[i]] for i in range(n))
                caps = tuple(float(problem.menus[i].cap[options[i]]) for i in range(n))
                key = (tuple(edges), caps)
                if key not in memo:
                    memo[key] = max_flow(n, edges, caps, link_cap)
                val, flows = memo[key]
                if val > best_val:
                    best_val = val
                    best = (options, tuple(starts), flows)
    dt = time.perf_counter() - t0
    if best is None:
        return PlacementResult(value=0.0, status="infeasible", bound=0.0, method="brute", solve_s=dt)
    return PlacementResult(
        value=best_val,
        status="optimal",
        bound=best_val,
        method="brute",
        option=best[0],
        start=best[1],
        flows=best[2],
        solve_s=dt,
    )


def _roles(n: int, L: int, starts: list[int], ends: list[int], edges: list[Edge]) -> tuple[list[int], list[int]]:
    """Per node, the micro-batches through it (the summed stage counts of the source-to-sink paths through
    it, counted path by path here, independently of ``solvers.rules``) and the ends it holds (bit 1: it
    starts at layer 0; bit 2: it ends at layer L)."""
    depth = [0] * n
    for p in _paths(edges, n):
        for i in p:
            depth[i] += len(p)
    held = [(1 if starts[i] == 0 else 0) | (2 if ends[i] == L else 0) for i in range(n)]
    return depth, held


def _chains(starts: list[int], ends: list[int], L: int) -> bool:
    end_set, start_set = set(ends), set(starts)
    return all(s == 0 or s in end_set for s in starts) and all(e == L or e in start_set for e in ends)


def _covered(edges: list[Edge], n: int) -> bool:
    has_in = [False] * n
    has_out = [False] * n
    for u, v in edges:
        if u < n:
            has_out[u] = True
        if v < n:
            has_in[v] = True
    return all(has_in) and all(has_out)


def _paths(edges: list[Edge], n: int) -> list[tuple[int, ...]]:
    """Every source-to-sink path (as its node sequence) over ``edges``; the graph is acyclic."""
    succ: dict[int, list[int]] = {}
    for u, v in edges:
        succ.setdefault(u, []).append(v)
    out: list[tuple[int, ...]] = []

    def walk(u: int, seq: tuple[int, ...]) -> None:
        for v in succ.get(u, []):
            if v == n:
                out.append(seq)
            else:
                walk(v, (*seq, v))

    for v in succ.get(n, []):
        walk(v, (v,))
    return out


def _pairs(path: tuple[int, ...], n: int) -> list[Edge]:
    return list(itertools.pairwise((n, *path, n)))


def max_flow(
    n: int, edges: list[Edge], caps: tuple[float, ...], link_cap: np.ndarray
) -> tuple[float, dict[Edge, float]]:
    """Maximum source-to-sink flow over ``edges`` with node capacities ``caps`` (Edmonds-Karp).

    Vertices: 0 source, 1 sink, 2 + 2i node i's entry, 3 + 2i its exit. Returns the value and the flow
    on every edge (chosen edges carrying nothing included, with 0).
    """
    size = 2 * n + 2

    def vin(x: int) -> int:
        return 0 if x == n else 2 + 2 * x

    def vout(x: int) -> int:
        return 1 if x == n else 3 + 2 * x

    cap = [[0.0] * size for _ in range(size)]
    for i in range(n):
        cap[vin(i)][vout(i)] = caps[i]
    for u, v in edges:
        a, b = (0 if u == n else vout(u)), (1 if v == n else vin(v))
        cap[a][b] += float(link_cap[u, v])
    flow = [[0.0] * size for _ in range(size)]
    total = 0.0
    while True:
        parent = [-1] * size
        parent[0] = 0
        q = deque([0])
        while q and parent[1] < 0:
            a = q.popleft()
            for b in range(size):
                if parent[b] < 0 and cap[a][b] - flow[a][b] > 1e-12:
                    parent[b] = a
                    q.append(b)
        if parent[1] < 0:
            break
        push = math.inf
        b = 1
        while b != 0:
            a = parent[b]
            push = min(push, cap[a][b] - flow[a][b])
            b = a
        if not math.isfinite(push):
            raise PlacementInputError("max_flow: unbounded flow (a node capacity is infinite)")
        b = 1
        while b != 0:
            a = parent[b]
            flow[a][b] += push
            flow[b][a] -= push
            b = a
        total += push
    out: dict[Edge, float] = {}
    for u, v in edges:
        a, b = (0 if u == n else vout(u)), (1 if v == n else vin(v))
        out[(u, v)] = max(0.0, flow[a][b])
    return total, out
