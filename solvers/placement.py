r"""The reference placement MILP (HiGHS).

Notation (see ``solvers/problem.py``): nodes i = 0..n-1; the source and the sink are both index n in
the ``[u, v]`` link arrays; node i has options o in O_i with k_o layers, capacity c_o and latency
lat[m, o] for metric m; L layers; T_m the latency limit of metric m (metrics with T_m = inf are
unconstrained). E is the set of usable edges: (src, i), (i, sink) and (i, j), i != j, minus those whose
link latency is infinite or so large that no path through them can meet a limit. ll[m, u, v] and
lc[u, v] are the link latency and capacity.

Variables
    z[i,o] in {0,1}     node i runs option o
    w[i,o] >= 0         flow through node i while it runs o (0 unless z[i,o] = 1)
    s[i] in Z           start layer, 0 <= s_i <= U_i := L - min_o k_o
    e[u,v] in {0,1}     edge (u, v) in E is chosen
    f[u,v] >= 0         flow on edge (u, v), f <= lc[u,v]
    pi[m,i] in [0,T_m]  latency potential of metric m at node i's output
    y[P] in [0,1]       path P is chosen (only for menus with roles): one per source-to-sink path P over
                        E that visits each node at most once, with |P| stages and edge set E(P)
    with k_i := sum_o k_o z[i,o], lat_i^m := sum_o lat[m,o] z[i,o], F := sum_i f[src,i]; an option's role
    (``solvers.problem``) is d_o (micro-batches charged) and its ends (FIRST_o, LAST_o in {0, 1}).

Objective
    maximise F.

Constraints
    (1) sum_o z[i,o] = 1                                          one option per node
    (2) w[i,o] <= c_o z[i,o]                                      capacity of the option run
    (3) sum_u f[u,i] = sum_o w[i,o] = sum_v f[i,v]                conservation through node i
    (4) s_i + U_i e[src,i] <= U_i                                 a source edge starts at layer 0
    (5) s_i + k_i >= L e[i,sink];   s_i + k_i <= L                a sink edge ends at layer L
    (6) s_j - s_i - k_i <= M+ (1 - e[i,j]),  M+ = U_j - min k_i   an edge (i, j) chains the ranges:
        s_j - s_i - k_i >= -L (1 - e[i,j])                        s_j = s_i + k_i
    (7) f[u,v] <= min(lc[u,v], max_o c_o(u), max_o c_o(v)) e[u,v] flow only on chosen edges, tight M
    (8) sum_u e[u,i] >= 1;  sum_v e[i,v] >= 1                     every node has an in and an out edge
    (9) per constrained metric m (T := T_m, l := ll[m]):
        pi[m,i] >= lat_i^m                                        (valid: link latencies are >= 0)
        pi[m,i] >= lat_i^m + l[src,i] e[src,i]
        pi[m,j] >= pi[m,i] + lat_j^m + l[i,j] - (T + l[i,j]) (1 - e[i,j])
        pi[m,i] + l[i,sink] e[i,sink] <= T
        The big-M T + l[i,j] suffices because pi[m,i] <= T and pi[m,j] >= lat_j^m; pi <= T is valid
        because every node reaches the sink over latencies >= 0. So every source-to-sink path over the
        chosen edges meets T: pi is at least its longest path, and the sink rows bound it.
    (10) aggregated cuts, from a path decomposition of the flow (every path crosses exactly L layers and
        meets every limit, and the graph is acyclic):
        sum_{i,o} k_o w[i,o] = L F                                layer work
        sum_{i,o} lat[m,o] w[i,o] + sum_{(u,v) in E} ll[m,u,v] f[u,v] <= T_m F   per constrained metric
        sum_o w[i,o] <= F                                         no node carries more than the total
    (11) symmetry breaking (on by default; measured faster on multisets with repeated node types,
        although the solver study found it neutral): for consecutive interchangeable nodes i < j
        (same kind, same menu, same links), s_i <= s_j and, on a tie, k_i <= k_j:
        k_i - k_j <= L (s_j - s_i). Any placement can be relabelled to satisfy both.
    (12) ends (menus with roles; a row only where some option lacks the end):
        s_i + sum_o FIRST_o z[i,o] >= 1                           a node at layer 0 runs a FIRST option
        s_i + sum_o (k_o - LAST_o) z[i,o] <= L - 1                a node ending at L runs a LAST option
    (13) micro-batches (menus with roles): the chosen edges are acyclic (ranges rise along them), so the
        paths of the placement are exactly the P with every edge chosen, and a path of |P| stages keeps
        |P| micro-batches in flight through each of its nodes:
        y[P] >= sum_{e in E(P)} e[e] - |E(P)| + 1                 y[P] = 1 when P is chosen
        sum_o min(d_o, D_i) z[i,o] >= sum_{P through i} |P| y[P]  D_i := sum_{P through i} |P|
        (divided by D_i). y is only bounded below, so a placement is feasible iff every node's option is
        charged for at least the summed stage counts of its paths (the rule of ``solvers.rules``).

Numerics: flows are divided by the largest capacity and latencies by T_m, so every coefficient is O(1);
the big-Ms are the tight ones above. HiGHS runs on one thread with its output off, with presolve in the
mode chosen by ``presolve`` (measured in ``bench/placement_bench.py``), ``mip_rel_gap`` 1e-7, and a
time limit; HiGHS may overrun its own time limit (the solver study saw 3 s become 6-7 s), so callers
that need a hard deadline must enforce it from outside (a worker process). The answer is polished:
its option, start and edge choice are re-checked exactly (ranges, latency per path) and its flows are
recomputed by an exact max flow, so ``value`` never relies on solver tolerances.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence

import highspy
import numpy as np

from solvers.chains import pipeline_dp
from solvers.problem import FIRST, LAST, Edge, PlacementProblem, PlacementResult, check_problem
from solvers.rules import canonical, evaluate_placement, interchangeable, usable_edges

MIP_REL_GAP = 1e-7
MIP_FEAS_TOL = 1e-9  # integrality: an edge at e = 1e-6 "off" would leak 1e-6 of its capacity


class _Rows:
    """Accumulates constraint rows as COO triplets, then emits one CSR block."""

    def __init__(self) -> None:
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.r: list[np.ndarray] = []
        self.c: list[np.ndarray] = []
        self.v: list[np.ndarray] = []

    def add(self, cols: Sequence[int] | np.ndarray, vals: Sequence[float] | np.ndarray, lo: float, hi: float) -> None:
        row = len(self.lo)
        cols_a = np.asarray(cols, dtype=np.int64)
        self.lo.append(lo)
        self.hi.append(hi)
        self.r.append(np.full(cols_a.shape[0], row, dtype=np.int64))
        self.c.append(cols_a)
        self.v.append(np.asarray(vals, dtype=np.float64))

    def add_block(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """Rows given as triplets with row numbers local to the block (0..len(lo)-1)."""
        base = len(self.lo)
        self.lo.extend(np.asarray(lo, dtype=np.float64).tolist())
        self.hi.extend(np.asarray(hi, dtype=np.float64).tolist())
        self.r.append(np.asarray(rows, dtype=np.int64) + base)
        self.c.append(np.asarray(cols, dtype=np.int64))
        self.v.append(np.asarray(vals, dtype=np.float64))

    def csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        r = np.concatenate(self.r) if self.r else np.zeros(0, np.int64)
        c = np.concatenate(self.c) if self.c else np.zeros(0, np.int64)
        v = np.concatenate(self.v) if self.v else np.zeros(0)
        order = np.lexsort((c, r))
        r, c, v = r[order], c[order], v[order]
        if r.size:  # merge repeated (row, column) entries
            first = np.ones(r.size, dtype=bool)
            first[1:] = (r[1:] != r[:-1]) | (c[1:] != c[:-1])
            group = np.cumsum(first) - 1
            v = np.bincount(group, weights=v)
            r, c = r[first], c[first]
        keep = v != 0.0
        r, c, v = r[keep], c[keep], v[keep]
        starts = np.searchsorted(r, np.arange(len(self.lo)), side="left")
        lo = np.asarray(self.lo, dtype=np.float64)
        hi = np.asarray(self.hi, dtype=np.float64)
        return lo, hi, starts.astype(np.int32), c.astype(np.int32), v


class _Model:
    """Column layout of the MILP for one problem."""

    def __init__(self, problem: PlacementProblem, symmetry: bool) -> None:
        self.p = problem
        n, L = problem.n, int(problem.num_layers)
        self.n, self.L = n, L
        self.edges = usable_edges(problem)
        limit = np.asarray(problem.lat_limit, dtype=np.float64)
        self.metrics = [m for m in range(problem.num_metrics) if math.isfinite(limit[m])]
        self.limit = limit
        sizes = [menu.size for menu in problem.menus]
        caps = np.concatenate([np.asarray(m.cap, dtype=np.float64) for m in problem.menus])
        self.fscale = float(caps.max()) if caps.size and caps.max() > 0 else 1.0
        self.zoff = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        nz = int(self.zoff[-1])
        ne = len(self.edges)
        self.nz, self.ne = nz, ne
        self.Z, self.W = 0, nz
        self.S = 2 * nz
        self.E = self.S + n
        self.Fc = self.E + ne
        self.P = self.Fc + ne
        self.Y = self.P + len(self.metrics) * n
        self.roles = problem.has_roles
        self.paths = _simple_paths(n, self.edges) if self.roles else []
        self.ncol = self.Y + len(self.paths)
        self.symmetry = symmetry
        self.kmin = np.array([int(np.min(m.k)) for m in problem.menus], dtype=np.int64)
        self.U = L - self.kmin
        self.capmax = np.array([float(np.max(m.cap)) for m in problem.menus])
        lc = np.asarray(problem.link_cap, dtype=np.float64)
        self.fub = (
            np.array(
                [
                    min(lc[u, v], self.capmax[u] if u < n else np.inf, self.capmax[v] if v < n else np.inf)
                    for u, v in self.edges
                ]
            )
            / self.fscale
        )

    def pi(self, mm: int, i: int) -> int:
        return self.P + mm * self.n + i

    def build(self, h: highspy.Highs) -> None:
        p, n, L = self.p, self.n, self.L
        nz, ne = self.nz, self.ne
        ks = np.concatenate([np.asarray(m.k, dtype=np.float64) for m in p.menus])
        caps = np.concatenate([np.asarray(m.cap, dtype=np.float64) for m in p.menus]) / self.fscale
        node_of = np.repeat(np.arange(n), [m.size for m in p.menus])

        lower = np.zeros(self.ncol)
        upper = np.empty(self.ncol)
        upper[self.Z : self.Z + nz] = 1.0
        upper[self.W : self.W + nz] = caps
        upper[self.S : self.S + n] = self.U
        upper[self.E : self.E + ne] = 1.0
        upper[self.Fc : self.Fc + ne] = self.fub
        upper[self.P :] = 1.0  # pi and y
        cost = np.zeros(self.ncol)
        src_t = np.array([t for t, (u, _) in enumerate(self.edges) if u == n], dtype=np.int64)
        cost[self.Fc + src_t] = 1.0
        empty = np.zeros(0, np.int32)
        if (
            h.addCols(self.ncol, cost, lower, upper, 0, np.zeros(self.ncol, np.int32), empty, np.zeros(0))
            != highspy.HighsStatus.kOk
        ):
            raise RuntimeError("HiGHS rejected the placement columns")
        integer = np.concatenate(
            [np.arange(self.Z, self.Z + nz), np.arange(self.S, self.S + n), np.arange(self.E, self.E + ne)]
        ).astype(np.int32)
        h.changeColsIntegrality(integer.size, integer, np.ones(integer.size, dtype=np.uint8))
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)

        rows = _Rows()
        zc = np.arange(nz)
        # (1) one-hot
        rows.add_block(node_of, self.Z + zc, np.ones(nz), np.ones(n), np.ones(n))
        # (2) w <= c z
        rows.add_block(
            np.concatenate([zc, zc]),
            np.concatenate([self.W + zc, self.Z + zc]),
            np.concatenate([np.ones(nz), -caps]),
            np.full(nz, -np.inf),
            np.zeros(nz),
        )
        ins: list[list[int]] = [[] for _ in range(n)]
        outs: list[list[int]] = [[] for _ in range(n)]
        for t, (u, v) in enumerate(self.edges):
            if v < n:
                ins[v].append(t)
            if u < n:
                outs[u].append(t)
        ll = np.asarray(p.link_lat, dtype=np.float64)
        for i in range(n):
            zi = np.arange(self.zoff[i], self.zoff[i + 1])
            ki = ks[zi]
            # (3) conservation
            rows.add([*(self.Fc + t for t in ins[i]), *(self.W + zi)], [1.0] * len(ins[i]) + [-1.0] * len(zi), 0, 0)
            rows.add([*(self.W + zi), *(self.Fc + t for t in outs[i])], [1.0] * len(zi) + [-1.0] * len(outs[i]), 0, 0)
            # (5b) s + k <= L
            rows.add([self.S + i, *(self.Z + zi)], [1.0, *ki], -np.inf, L)
            # (8) coverage
            rows.add([self.E + t for t in ins[i]], [1.0] * len(ins[i]), 1, np.inf)
            rows.add([self.E + t for t in outs[i]], [1.0] * len(outs[i]), 1, np.inf)
            # (10c) node flow <= F
            rows.add([*(self.W + zi), *(self.Fc + src_t)], [1.0] * len(zi) + [-1.0] * len(src_t), -np.inf, 0)
            # (9a) pi >= lat
            for mm, m in enumerate(self.metrics):
                lat = np.asarray(p.menus[i].lat[m], dtype=np.float64) / self.limit[m]
                rows.add([self.pi(mm, i), *(self.Z + zi)], [1.0, *(-lat)], 0, np.inf)
        for t, (u, v) in enumerate(self.edges):
            et = self.E + t
            # (7) flow only on chosen edges
            rows.add([self.Fc + t, et], [1.0, -self.fub[t]], -np.inf, 0)
            if u == n:
                i = v
                if self.U[i] > 0:  # (4)
                    rows.add([self.S + i, et], [1.0, float(self.U[i])], -np.inf, float(self.U[i]))
                for mm, m in enumerate(self.metrics):
                    lnk = ll[m, u, v] / self.limit[m]
                    if lnk > 0:
                        zi = np.arange(self.zoff[i], self.zoff[i + 1])
                        lat = np.asarray(p.menus[i].lat[m], dtype=np.float64) / self.limit[m]
                        rows.add([self.pi(mm, i), *(self.Z + zi), et], [1.0, *(-lat), -lnk], 0, np.inf)
            elif v == n:
                i = u
                zi = np.arange(self.zoff[i], self.zoff[i + 1])
                rows.add([self.S + i, *(self.Z + zi), et], [1.0, *ks[zi], -float(L)], 0, np.inf)  # (5a)
                for mm, m in enumerate(self.metrics):
                    lnk = ll[m, u, v] / self.limit[m]
                    if lnk > 0:
                        rows.add([self.pi(mm, i), et], [1.0, lnk], -np.inf, 1.0)
            else:
                i, j = u, v
                zi = np.arange(self.zoff[i], self.zoff[i + 1])
                zj = np.arange(self.zoff[j], self.zoff[j + 1])
                mup = float(max(0, self.U[j] - self.kmin[i]))
                cols = [self.S + j, self.S + i, *(self.Z + zi), et]
                rows.add(cols, [1.0, -1.0, *(-ks[zi]), mup], -np.inf, mup)  # (6)
                rows.add(cols, [1.0, -1.0, *(-ks[zi]), -float(L)], -float(L), np.inf)
                for mm, m in enumerate(self.metrics):
                    lnk = ll[m, u, v] / self.limit[m]
                    lat = np.asarray(p.menus[j].lat[m], dtype=np.float64) / self.limit[m]
                    rows.add(
                        [self.pi(mm, j), self.pi(mm, i), *(self.Z + zj), et],
                        [1.0, -1.0, *(-lat), -(1.0 + lnk)],
                        -1.0,
                        np.inf,
                    )
        # (10a) layer work, (10b) latency work
        fsrc = self.Fc + src_t
        rows.add([*(self.W + zc), *fsrc], [*ks, *([-float(L)] * len(src_t))], 0, 0)
        for m in self.metrics:
            lat_all = np.concatenate([np.asarray(mn.lat[m], dtype=np.float64) for mn in p.menus]) / self.limit[m]
            lnk_all = np.array([ll[m, u, v] for u, v in self.edges]) / self.limit[m]
            rows.add(
                [*(self.W + zc), *(self.Fc + np.arange(ne)), *fsrc],
                [*lat_all, *lnk_all, *([-1.0] * len(src_t))],
                -np.inf,
                0,
            )
        if self.symmetry:
            for i in range(n - 1):
                if interchangeable(p, i, i + 1):
                    rows.add([self.S + i, self.S + i + 1], [1.0, -1.0], -np.inf, 0)
                    zi = np.arange(self.zoff[i], self.zoff[i + 1])
                    zj = np.arange(self.zoff[i + 1], self.zoff[i + 2])
                    rows.add(
                        [*(self.Z + zi), *(self.Z + zj), self.S + i, self.S + i + 1],
                        [*ks[zi], *(-ks[zj]), float(L), -float(L)],
                        -np.inf,
                        0,
                    )
        if self.roles:
            self._role_rows(rows, ks)
        lo, hi, starts, idx, val = rows.csr()
        if h.addRows(lo.size, lo, hi, idx.size, starts, idx, val) != highspy.HighsStatus.kOk:
            raise RuntimeError("HiGHS rejected the placement rows")

    def _role_rows(self, rows: _Rows, ks: np.ndarray) -> None:
        """(12) the ends each node's option is charged for, (13) the micro-batches through it."""
        p, n, L = self.p, self.n, self.L
        eidx = {e: t for t, e in enumerate(self.edges)}
        through: list[list[int]] = [[] for _ in range(n)]
        for q, path in enumerate(self.paths):
            pairs = list(itertools.pairwise((n, *path, n)))
            cols = [self.Y + q, *(self.E + eidx[e] for e in pairs)]
            rows.add(cols, [1.0] + [-1.0] * len(pairs), 1 - len(pairs), np.inf)
            for i in path:
                through[i].append(q)
        for i in range(n):
            zi = np.arange(self.zoff[i], self.zoff[i + 1])
            menu = p.menus[i]
            first = (np.asarray(menu.ends) & FIRST) > 0
            last = (np.asarray(menu.ends) & LAST) > 0
            if not first.all():  # (12a)
                rows.add([self.S + i, *(self.Z + zi[first])], [1.0] * (1 + int(first.sum())), 1.0, np.inf)
            if not last.all():  # (12b)
                rows.add([self.S + i, *(self.Z + zi)], [1.0, *(ks[zi] - last)], -np.inf, L - 1.0)
            size = np.array([len(self.paths[q]) for q in through[i]], dtype=np.float64)
            top = float(size.sum())
            d = np.minimum(np.asarray(menu.d, dtype=np.float64), top)
            if top > 0 and d.min() < top:  # (13)
                cols = [*(self.Z + zi), *(self.Y + np.asarray(through[i], dtype=np.int64))]
                rows.add(cols, [*(d / top), *(-size / top)], 0.0, np.inf)

    def solution_vector(
        self, option: Sequence[int], start: Sequence[int], flows: dict[Edge, float]
    ) -> np.ndarray | None:
        """The column values of a placement (for a warm start), or None if it uses an unusable edge."""
        p, n = self.p, self.n
        x = np.zeros(self.ncol)
        eidx = {e: t for t, e in enumerate(self.edges)}
        if any(e not in eidx for e in flows):
            return None
        inflow = np.zeros(n)
        for (u, v), fl in flows.items():
            t = eidx[(u, v)]
            x[self.E + t] = 1.0
            x[self.Fc + t] = min(fl / self.fscale, self.fub[t])
            if v < n:
                inflow[v] += fl
        for i in range(n):
            x[self.Z + self.zoff[i] + option[i]] = 1.0
            x[self.W + self.zoff[i] + option[i]] = inflow[i] / self.fscale
            x[self.S + i] = start[i]
        for q, path in enumerate(self.paths):
            x[self.Y + q] = float(all(e in flows for e in itertools.pairwise((n, *path, n))))
        ll = np.asarray(p.link_lat, dtype=np.float64)
        for mm, m in enumerate(self.metrics):
            pot = np.zeros(n)
            for v in sorted(range(n), key=lambda i: start[i]):
                best = 0.0
                for u, w in flows:
                    if w == v:
                        best = max(best, (0.0 if u == n else pot[u]) + ll[m, u, v])
                pot[v] = best + float(p.menus[v].lat[m, option[v]])
            x[self.P + mm * n : self.P + (mm + 1) * n] = np.minimum(pot / self.limit[m], 1.0)
        return x

    def decode(self, x: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...], list[Edge]]:
        option = tuple(int(np.argmax(x[self.Z + self.zoff[i] : self.Z + self.zoff[i + 1]])) for i in range(self.n))
        start = tuple(round(float(x[self.S + i])) for i in range(self.n))
        edges = [e for t, e in enumerate(self.edges) if x[self.E + t] > 0.5]
        return option, start, edges


def _simple_paths(n: int, edges: Sequence[Edge]) -> list[tuple[int, ...]]:
    """Every source-to-sink path over ``edges`` that visits each node at most once, as its nodes."""
    succ: dict[int, list[int]] = {}
    for u, v in edges:
        succ.setdefault(u, []).append(v)
    out: list[tuple[int, ...]] = []

    def walk(seq: tuple[int, ...]) -> None:
        for v in succ.get(seq[-1], []):
            if v == n:
                out.append(seq)
            elif v not in seq:
                walk((*seq, v))

    for v in succ.get(n, []):
        walk((v,))
    return out


def lp_reduce(
    problem: PlacementProblem, value: float, *, symmetry: bool = True, rtol: float = 1e-6
) -> tuple[float, list[np.ndarray], set[Edge]]:
    """Reduced-cost fixing from the MILP's LP relaxation, given a placement worth ``value``.

    Solves the LP relaxation (an upper bound on every placement) and returns it, with, per node, a mask
    of the options and the set of edges that some placement worth more than ``value`` * (1 - ``rtol``)
    could still use: an option or edge whose variable is 0 in the LP optimum and whose reduced cost
    brings the LP bound below that threshold when the variable is forced to 1 cannot (LP duality).
    """
    check_problem(problem)
    model = _Model(problem, symmetry)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    model.build(h)
    nc = model.ncol
    h.changeColsIntegrality(nc, np.arange(nc, dtype=np.int32), np.zeros(nc, dtype=np.uint8))
    h.run()
    keep_all = [np.ones(m.size, dtype=bool) for m in problem.menus]
    if h.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
        return 0.0, [np.zeros(m.size, dtype=bool) for m in problem.menus], set()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return math.inf, keep_all, set(model.edges)
    sol = h.getSolution()
    bound = float(h.getInfo().objective_function_value)
    x = np.asarray(sol.col_value)
    rc = np.asarray(sol.col_dual)  # <= 0 at the lower bound of a maximisation
    threshold = value * (1 - rtol) / model.fscale - 1e-9
    off = (x < 1e-9) & (bound + rc < threshold)
    z_off = off[model.Z : model.Z + model.nz]
    keep = [~z_off[model.zoff[i] : model.zoff[i + 1]] for i in range(problem.n)]
    e_off = off[model.E : model.E + model.ne]
    edges = {e for t, e in enumerate(model.edges) if not e_off[t]}
    return bound * model.fscale, keep, edges


def milp_place(
    problem: PlacementProblem,
    *,
    time_limit: float = 10.0,
    warm_start: bool = True,
    initial: PlacementResult | None = None,
    symmetry: bool = True,
    presolve: str = "on",
) -> PlacementResult:
    """Solve the placement MILP of the module docstring with HiGHS.

    ``warm_start`` seeds HiGHS with ``initial`` or, when that is None, with the chain family of
    ``solvers.chains``. ``time_limit`` is passed to HiGHS (which may overrun it). Returns status
    ``optimal``, ``feasible`` (with ``bound``), ``infeasible`` or ``unknown``; ``method`` is "milp".
    """
    t0 = time.perf_counter()
    check_problem(problem)
    if time_limit <= 0 or math.isnan(time_limit):
        raise ValueError(f"time_limit must be > 0, got {time_limit}")
    if any(m.size == 0 for m in problem.menus):
        return PlacementResult(0.0, "infeasible", 0.0, "milp", solve_s=time.perf_counter() - t0)
    if warm_start and initial is None:
        initial = pipeline_dp(problem)
    model = _Model(problem, symmetry)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("parallel", "off")
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("presolve", presolve)
    h.setOptionValue("mip_rel_gap", MIP_REL_GAP)
    h.setOptionValue("mip_abs_gap", 1e-9)
    h.setOptionValue("mip_feasibility_tolerance", MIP_FEAS_TOL)
    h.setOptionValue("random_seed", 0)
    model.build(h)
    start_x = None
    if warm_start and initial is not None and initial.option:
        seed = canonical(problem, initial) if symmetry else initial
        start_x = model.solution_vector(seed.option, seed.start, dict(seed.flows))
        if start_x is not None:
            idx = np.arange(model.ncol, dtype=np.int32)
            h.setSolution(model.ncol, idx, start_x)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    ms = highspy.HighsModelStatus
    best: tuple[float, tuple[int, ...], tuple[int, ...], dict[Edge, float]] | None = None
    if initial is not None and initial.option:
        ev = evaluate_placement(problem, initial.option, initial.start, initial.flows.keys())
        if ev is not None:
            best = (ev[0], tuple(initial.option), tuple(initial.start), ev[1])
    if info.primal_solution_status == 2:  # a feasible solution
        option, start, edges = model.decode(np.asarray(h.getSolution().col_value))
        ev = evaluate_placement(problem, option, start, edges)
        if ev is not None and (best is None or ev[0] > best[0]):
            best = (ev[0], option, start, ev[1])
    dt = time.perf_counter() - t0
    if status == ms.kInfeasible:
        if best is not None:  # cannot happen unless tolerances misled HiGHS; trust the checked placement
            return PlacementResult(best[0], "feasible", math.inf, "milp", best[1], best[2], best[3], dt)
        return PlacementResult(0.0, "infeasible", 0.0, "milp", solve_s=dt)
    bound = float(info.mip_dual_bound) * model.fscale
    if not math.isfinite(bound):
        bound = math.inf
    if best is None:
        return PlacementResult(0.0, "unknown", bound, "milp", solve_s=dt)
    value = best[0]
    # Proven only if the checked placement reaches HiGHS's bound: a solution that met the rows only
    # within HiGHS's tolerances fails the exact check and leaves the proof to the caller.
    optimal = status == ms.kOptimal and bound <= value * (1 + 10 * MIP_REL_GAP) + 1e-12
    bound = value if optimal else max(bound, value)
    st = "optimal" if optimal else "feasible"
    return PlacementResult(value, st, bound, "milp", best[1], best[2], best[3], dt)
