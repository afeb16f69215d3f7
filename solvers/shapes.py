r"""Exact placement by shape enumeration: every connected shape of up to six nodes, solved exactly.

A placement's weakly connected components are independent (their flows add up; their paths are
disjoint), so the optimum is the best partition of the nodes into components, each placed in the best
*connected* way. A connected placement has a *shape* (a ``Skeleton``): m + 1 boundaries
0 = B_0 < B_1 < ... < B_m = L, an interval (a_i, b_i) of boundary indices per node (node i holds layers
B_{a_i} .. B_{b_i} - 1), and the edges between nodes whose intervals abut; edges from the source go to
every node with a_i = 0 and edges to the sink leave every node with b_i = m (a node that starts at layer
0 can have no other input). ``skeletons(s)`` lists every connected shape of s nodes up to relabelling:
1, 1, 3, 10, 45 and 249 for s = 1..6. A *labelled* shape assigns a problem node to each shape node;
interchangeable nodes (same kind, menu and links) make many labellings equal, and the shape's
automorphisms identify more.

Deciding one labelled shape at a flow threshold F (``_Labelled.decide``) is exact: is there a choice of
boundaries and options with maximum flow >= F in which every source-to-sink path meets every latency
limit? It uses four exact facts.

- Max-flow min-cut: flow >= F iff every cut of the shape (a set of nodes and edges whose removal
  separates source from sink) has capacity >= F. A cut that contains an edge of capacity >= F always
  has; so only the shape's minimal cuts made of nodes and of edges with capacity < F are checked.
- Capacity clipping: a flow of value F puts at most F on any node, so capacities above F act as F, and
  among the options of one node with the same k and capacity >= F only those with the least latencies
  matter (one option when the latencies grow with the capacity in every metric, which the perf model's
  menus do).
- A *cut node* ({i} is a cut: every path goes through it) needs capacity >= F. A maximal run of cut
  nodes that follow each other with nothing else ending or starting in between (a chain inside the
  shape) is contracted: its least latency for each total length is a min-plus convolution (one metric)
  or a Pareto front of latency vectors (several metrics), with back-pointers to its split and options.
- *Free* nodes: for nodes of which no cut holds two, once the options of every other node are fixed,
  each free node's cuts ask for a capacity of at least F minus the rest of the cut, and the option of
  least latency that meets it is best, because a smaller latency never hurts a path and more capacity
  never hurts a cut (for several metrics this needs the ordered latencies above; other nodes are fixed).

Before a labelled shape is decided, cheap necessary tests run over all labellings of the shape at once
(``_prefilter``, then ``_Family.candidates``): every path can cover the L layers within the limits (its
cut nodes with options of capacity >= F only, and every node with the options that pass the component's
layer-work test at F only: sum_i k_i min(c_i, F) >= L F), every cut node has such an option of capacity
>= F that fits its paths, every cut whose edges all carry less than F has enough node capacity, and
the nodes' layer counts can meet all of it together: the counts on a path add up to L, a node's
capacity is at most its best with at least its least count, and a cut's capacity need caps each of its
nodes' counts (bounds propagation, ``_Family._length_bounds``). The ranges of counts it leaves bound
each element's lengths in the enumeration below (``_Family.spans``).

Shapes with the same intervals differ only in their edges; if the shape with every such edge and every
latency set to zero cannot reach F for a labelling, none of them can (``_EdgeRelaxation``), so one
decision rules out a labelling for all of them, and the next shapes drop it before their families are built.

The rest is enumerated with numpy (``_enumerate``): the remaining boundaries, placed one at a time, each
only at the positions that the lengths with a usable option allow (an element's length is checked as
soon as it is known: at its end, or at its start when it ends at L) and, by bisection, only up to the
last position at which every kept cut may still carry F (``_last_cut_ok``); each prefix kept only while
every path's latency bound and every kept cut (with the capacities its elements may have at their
lengths so far) still allow F; then times the options of the fixed nodes, every row checked against every path's
latency (node latencies plus the labelled links) and every kept cut. A feasible row is a placement of
the component; its value is recomputed by an exact maximum flow. The labellings of one shape are
screened in groups (``_Family.screen``): one enumeration of their boundaries together, so that only
those with a boundary vector are decided one by one.

``shape_search`` then finds the best partition (see its docstring): thresholds from an incumbent and
from upper bounds skip most components, and each component's best value is raised by repeated decisions
(a feasible decision at F returns a placement worth v >= F; the next decision asks for more than v)
until none is feasible, which proves it. A sub-multiset's first bound is the layer-work fixed point
(``work_fixed_point``). With a ``floor`` the search only asks for placements above it. Everything is
exact; the work is bounded by a deterministic budget of enumerated rows (``budget``); when it runs out
the search returns its best placement, unproven, with an upper bound.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Sequence

import attrs
import numpy as np

from solvers.placement import LAT_RTOL, class_reps, evaluate_placement
from solvers.problem import Edge, PlacementProblem, PlacementResult

SEARCH_RTOL = 1e-9
"""A new placement must beat the best one by this much (relative) to count as better."""

ROUNDS = 4
"""Rounds of bounds propagation in ``_Family._length_bounds`` (each is exact; more narrow a little more)."""

SCREEN = 64
"""Labellings of one shape whose boundary vectors are enumerated together (``_Family.screen``)."""

# ----------------------------------------------------------------------------------------------------
# The catalogue of connected shapes


@attrs.frozen
class Skeleton:
    """A connected shape of ``s`` nodes (see the module docstring).

    ``edges`` are the edges between nodes; ``paths`` every source-to-sink path as a node sequence;
    ``cuts`` every minimal cut as (nodes, edges), where an edge (s, i) leaves the source and (i, s) enters
    the sink; ``aut`` the node permutations that map the shape onto itself.
    """

    m: int
    iv: tuple[tuple[int, int], ...]
    edges: tuple[tuple[int, int], ...]
    aut: tuple[tuple[int, ...], ...]

    @property
    def s(self) -> int:
        return len(self.iv)

    @property
    def paths(self) -> tuple[tuple[int, ...], ...]:
        return _paths(self.iv, self.edges, self.m)

    @property
    def cuts(self) -> tuple[tuple[tuple[int, ...], tuple[tuple[int, int], ...]], ...]:
        return _cuts(self.iv, self.edges, self.m)

    def all_edges(self) -> list[tuple[int, int]]:
        """Source edges, node edges and sink edges (source and sink are index ``s``)."""
        s, m = self.s, self.m
        src = [(s, i) for i in range(s) if self.iv[i][0] == 0]
        return src + list(self.edges) + [(i, s) for i in range(s) if self.iv[i][1] == m]


def _perms_within(iv: Sequence[tuple[int, int]]) -> Iterator[tuple[int, ...]]:
    """Node permutations that keep every node's interval (relabellings of one shape)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, x in enumerate(iv):
        groups.setdefault(x, []).append(i)
    gl = list(groups.values())
    for choice in itertools.product(*(itertools.permutations(g) for g in gl)):
        perm = list(range(len(iv)))
        for g, c in zip(gl, choice, strict=True):
            for a, b in zip(g, c, strict=True):
                perm[a] = b
        yield tuple(perm)


@functools.cache
def _paths(iv: tuple[tuple[int, int], ...], edges: tuple[tuple[int, int], ...], m: int) -> tuple[tuple[int, ...], ...]:
    s = len(iv)
    succ: dict[int, list[int]] = {i: [] for i in range(s)}
    for x, y in edges:
        succ[x].append(y)
    out: list[tuple[int, ...]] = []

    def walk(i: int, seq: tuple[int, ...]) -> None:
        if iv[i][1] == m:
            out.append(seq)
        for j in succ[i]:
            walk(j, (*seq, j))

    for i in range(s):
        if iv[i][0] == 0:
            walk(i, (i,))
    return tuple(out)


@functools.cache
def _cuts(
    iv: tuple[tuple[int, int], ...], edges: tuple[tuple[int, int], ...], m: int
) -> tuple[tuple[tuple[int, ...], tuple[tuple[int, int], ...]], ...]:
    """Minimal cuts of the node-split graph: each node is on the source side, cut (its input half on the
    source side, its output half on the sink side) or on the sink side; an edge is cut when its tail's
    output half is on the source side and its head's input half on the sink side."""
    s = len(iv)
    all_edges = [(s, i) for i in range(s) if iv[i][0] == 0] + list(edges) + [(i, s) for i in range(s) if iv[i][1] == m]
    states = _states(s)
    tail = np.concatenate([states, np.zeros((states.shape[0], 1), np.int64)], axis=1)
    head = np.concatenate([states, np.full((states.shape[0], 1), 2, np.int64)], axis=1)
    mask = np.zeros(states.shape[0], dtype=np.int64)
    for i in range(s):
        mask |= (states[:, i] == 1).astype(np.int64) << i
    for t, (u, v) in enumerate(all_edges):
        mask |= ((tail[:, u] == 0) & (head[:, v] == 2)).astype(np.int64) << (s + t)
    uniq = np.unique(mask)
    sub = (uniq[:, None] & uniq[None, :]) == uniq[:, None]  # [a, b]: a is a subset of b
    np.fill_diagonal(sub, False)
    keep = uniq[~sub.any(axis=0)].tolist()
    out = [
        (tuple(i for i in range(s) if x >> i & 1), tuple(e for t, e in enumerate(all_edges) if x >> (s + t) & 1))
        for x in keep
    ]
    return tuple(sorted(out))


@functools.cache
def _states(s: int) -> np.ndarray:
    return np.array(list(itertools.product(range(3), repeat=s)), dtype=np.int64).reshape(-1, s)


@functools.cache
def skeletons(s: int) -> tuple[Skeleton, ...]:
    """Every connected shape of ``s`` nodes, once up to relabelling."""
    if s < 1:
        raise ValueError(f"s must be >= 1, got {s}")
    out: dict[tuple[object, ...], Skeleton] = {}
    for m in range(1, s + 1):
        ivs = [(a, b) for a in range(m) for b in range(a + 1, m + 1)]
        inner = (1 << m) - 2  # bits 1..m-1
        for combo in itertools.combinations_with_replacement(ivs, s):
            ends = starts = 0
            for a, b in combo:
                ends |= 1 << b
                starts |= 1 << a
            if ends & starts & inner != inner:
                continue
            junctions = []
            for t in range(1, m):
                enders = {i for i, (_, b) in enumerate(combo) if b == t}
                starters = {i for i, (a, _) in enumerate(combo) if a == t}
                pairs = [(x, y) for x in sorted(enders) for y in sorted(starters)]
                opts = []
                for bits in range(1, 1 << len(pairs)):
                    es = [pairs[q] for q in range(len(pairs)) if bits >> q & 1]
                    if {x for x, _ in es} == enders and {y for _, y in es} == starters:
                        opts.append(es)
                junctions.append(opts)
            perms = list(_perms_within(combo))
            for choice in itertools.product(*junctions):
                edges = [e for j in choice for e in j]
                if not _connected(s, edges):
                    continue
                key = min(tuple(sorted((p[x], p[y]) for x, y in edges)) for p in perms)
                if (combo, key) in out:
                    continue
                eset = set(key)
                aut = tuple(p for p in perms if {(p[x], p[y]) for x, y in eset} == eset)
                out[(combo, key)] = Skeleton(m, combo, key, aut)
    return tuple(out.values())


def _connected(s: int, edges: Sequence[tuple[int, int]]) -> bool:
    par = list(range(s))

    def find(x: int) -> int:
        while par[x] != x:
            par[x] = par[par[x]]
            x = par[x]
        return x

    for x, y in edges:
        par[find(x)] = find(y)
    return len({find(i) for i in range(s)}) == 1


# ----------------------------------------------------------------------------------------------------
# Per-problem option tables


class _Tables:
    """Per node: the options of each k, sorted by capacity (then latency), in padded arrays.

    ``cap[i]`` (L + 1, W_i), -1 where padded; ``lat[i]`` (metrics, L + 1, W_i), inf where padded;
    ``opt[i]`` (L + 1, W_i), the option index, -1 where padded. ``ordered[i]``: along the capacity order
    the latencies never fall in any metric, at every k. ``gmin[i]`` (metrics, L + 1): the least latency
    of each metric over the options with k layers.
    """

    def __init__(self, problem: PlacementProblem) -> None:
        self.p = problem
        self.n, self.L, self.nm = problem.n, int(problem.num_layers), problem.num_metrics
        lim = np.asarray(problem.lat_limit, dtype=np.float64)
        self.budget = lim + LAT_RTOL * np.where(np.isfinite(lim), np.maximum(lim, 1.0), 0.0)
        self.ll = np.asarray(problem.link_lat, dtype=np.float64)
        self.lc = np.asarray(problem.link_cap, dtype=np.float64)
        L = self.L
        self.cap: list[np.ndarray] = []
        self.lat: list[np.ndarray] = []
        self.opt: list[np.ndarray] = []
        self.ordered: list[bool] = []
        for menu in problem.menus:
            k = np.asarray(menu.k)
            cap = np.asarray(menu.cap, dtype=np.float64)
            lat = np.asarray(menu.lat, dtype=np.float64)
            sel = np.flatnonzero(k <= L)
            counts = np.bincount(k[sel], minlength=L + 1) if sel.size else np.zeros(L + 1, np.int64)
            w = max(1, int(counts.max()))
            C = np.full((L + 1, w), -1.0)
            T = np.full((self.nm, L + 1, w), np.inf)
            opt = np.full((L + 1, w), -1, np.int64)
            order = sel[np.lexsort((lat[:, sel].sum(axis=0), cap[sel], k[sel]))]
            ks = k[order]
            slot = np.arange(order.size) - np.searchsorted(ks, ks, side="left")
            C[ks, slot] = cap[order]
            T[:, ks, slot] = lat[:, order]
            opt[ks, slot] = order
            ordered = True
            if order.size > 1:
                same = ks[1:] == ks[:-1]
                ordered = not bool(np.any(same & np.any(np.diff(lat[:, order], axis=1) < 0, axis=0)))
            self.cap.append(C)
            self.lat.append(T)
            self.opt.append(opt)
            self.ordered.append(ordered)
        self.maxcap = np.array([float(c.max()) for c in self.cap])
        self.gmin = [t.min(axis=2) for t in self.lat]
        self._useful: dict[tuple[int, float], np.ndarray] = {}
        self._cover_at: dict[tuple[int, int, float, int], np.ndarray] = {}
        self._work_mask: dict[tuple[int, float], dict[int, np.ndarray] | None] = {}
        self._cover_work: dict[tuple[int, float, int], np.ndarray | None] = {}
        self._work_best: dict[tuple[int, float], np.ndarray] = {}
        self.collapsed: dict[tuple[int, float, int], tuple[np.ndarray, np.ndarray]] = {}
        self.elements: dict[tuple[tuple[int, ...], bool, float, int], _ElementAt] = {}
        self._cover_tab: np.ndarray | None = None
        self._cover_full: np.ndarray | None = None
        self._slack: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._fit: tuple[np.ndarray, np.ndarray] | None = None
        self.fronts: dict[
            tuple[tuple[int, ...], float, tuple[int, ...]], tuple[np.ndarray, list[tuple[np.ndarray, int, int]]]
        ] = {}

    def useful(self, i: int, F: float) -> np.ndarray:
        """(L + 1, W) mask of the options of node i worth enumerating at threshold F: every option with
        capacity < F, and among those with capacity >= F only the ones whose latencies no other such
        option beats (the first one when the node is ordered)."""
        key = (i, F)
        if key in self._useful:
            return self._useful[key]
        C, T, opt = self.cap[i], self.lat[i], self.opt[i]
        big = C >= F
        if self.ordered[i]:
            firstbig = big & ~np.concatenate([np.zeros((C.shape[0], 1), bool), big[:, :-1]], axis=1)
            out = (opt >= 0) & (~big | firstbig)
        else:
            le = np.all(T[:, :, None, :] <= T[:, :, :, None], axis=0)  # [k, x, y]: y <= x
            eq = np.all(T[:, :, None, :] == T[:, :, :, None], axis=0)
            w = C.shape[1]
            earlier = np.arange(w)[None, :] < np.arange(w)[:, None]  # [x, y]: y before x
            beats = big[:, None, :] & big[:, :, None] & le & (~eq | earlier[None])
            beats &= ~np.eye(w, dtype=bool)[None]
            out = (opt >= 0) & ~beats.any(axis=2)
        if len(self._useful) > 4096:
            self._useful.clear()
        self._useful[key] = out
        return out

    def work_ok(self, nodes: Sequence[int], F: float) -> list[np.ndarray] | None:
        """Per node of ``nodes``, the (L + 1, W) mask of options whose layer work k * min(cap, F) leaves
        room for flow F: every unit of flow crosses L layers and a node carries at most min(cap, F), so
        sum_i k_i min(c_i, F) >= L F; an option is kept only if it reaches L F minus the most the other
        nodes can add. None when even the most work of every node falls short."""
        kk = np.arange(self.L + 1)[:, None]
        works = [np.where(self.opt[i] >= 0, kk * np.minimum(self.cap[i], F), -np.inf) for i in nodes]
        best = [float(w.max()) for w in works]
        total = sum(best)
        need = self.L * F
        if total < need * (1 - 1e-12):
            return None
        return [w >= need - (total - b) - 1e-9 * need for w, b in zip(works, best, strict=True)]

    def slack(self, i: int, rest: int) -> tuple[np.ndarray, np.ndarray]:
        """For node i on a path with the other nodes ``rest`` (a bit mask): per option of i (flattened),
        its latency plus the least latency with which ``rest`` covers the remaining layers, and its
        capacity. An option fits the path only if that sum plus the path's links fits the limits."""
        key = (i, rest)
        if key not in self._slack:
            self.cover_masks(np.zeros(1, np.int64))
            assert self._cover_full is not None
            need = self._cover_full[rest]  # (nm, L+1): covering exactly j layers
            L = self.L
            kk = np.arange(L + 1)
            rem = need[:, L - kk]  # (nm, L+1) for k layers held by i
            if rest == 0:
                rem = np.where(kk[None, :] == L, 0.0, np.inf)
            tot = self.lat[i] + rem[:, :, None]
            ok = self.opt[i] >= 0
            self._slack[key] = (tot[:, ok], self.cap[i][ok])
        return self._slack[key]

    def fit_cap(self, keys: np.ndarray, room: np.ndarray) -> np.ndarray:
        """One metric only: for row r, node ``keys[r] >> n`` on a path with the other nodes
        ``keys[r] & (2^n - 1)``, the largest capacity of its options whose ``slack`` is at most
        ``room[r]`` (-inf when none is)."""
        if self._fit is None:
            n = self.n
            tabs = {  # a node is never in its own rest
                u: self.slack(u >> n, u & ((1 << n) - 1)) for u in range(n << n) if not (u >> (u >> n)) & 1
            }
            width = max(1, max(c.size for _, c in tabs.values()))
            T = np.full((n << n, width), np.inf)
            C = np.full((n << n, width + 1), -np.inf)
            for u, (tot, cap) in tabs.items():
                if cap.size:
                    order = np.argsort(tot[0], kind="stable")
                    T[u, : cap.size] = tot[0][order]
                    C[u, 1 : cap.size + 1] = np.maximum.accumulate(cap[order])
                    C[u, cap.size + 1 :] = C[u, cap.size]  # padding that fits (infinite room) adds nothing
            self._fit = (T, C)
        T, C = self._fit
        room = room + 1e-12 * np.maximum(np.abs(room), 1.0)  # never stricter than tot + links <= budget
        cnt = (T[keys] <= room[:, None]).sum(axis=1)  # sorted rows: the options that fit come first
        return C[keys, cnt]

    def cover_masks(self, masks: np.ndarray) -> np.ndarray:
        """``cover`` for node sets given as bit masks: (metrics, len(masks))."""
        if self._cover_tab is None:
            tab = self._subset_cover({i: self.gmin[i] for i in range(self.n)}, (1 << self.n) - 1)
            self._cover_tab = tab[:, :, self.L].T.copy()  # (nm, 2^n)
            self._cover_full = tab
        return self._cover_tab[:, masks]

    def _subset_cover(self, g: dict[int, np.ndarray], within: int, base: int = 0) -> np.ndarray:
        """(2^n, metrics, L+1): per node set inside bit mask ``within`` that contains ``base``, the least
        latency with which its nodes, each holding >= 1 layer at latency ``g[i][:, k]`` for k layers,
        cover exactly j layers (inf for the other sets)."""
        n, L = self.n, self.L
        tab = np.full((1 << n, self.nm, L + 1), np.inf)
        kk = np.arange(L + 1)
        d = kk[:, None] - kk[None, :]
        dd = np.clip(d, 0, L)
        step = {}  # per node: [m, j, j'] the latency of holding j - j' layers (inf where j' > j or j == j')
        for i, gi in g.items():
            held = gi.copy()
            held[:, 0] = np.inf
            step[i] = np.where(d[None] >= 0, held[:, dd], np.inf)
        acc = np.full((self.nm, L + 1), np.inf)
        acc[:, 0] = 0.0
        for i in range(n):
            if base >> i & 1:
                acc = (acc[:, None, :] + step[i]).min(axis=2)
        tab[base] = acc
        rest = within & ~base
        for sub in range(1, 1 << n):
            if sub & ~rest:
                continue
            i = (sub & -sub).bit_length() - 1
            tab[base | sub] = (tab[base | (sub & (sub - 1))][:, None, :] + step[i]).min(axis=2)
        return tab

    def cover_work(self, comp: int, F: float, cut: int = 0) -> np.ndarray | None:
        """(metrics, 2^n): per set of nodes within bit mask ``comp`` that contains ``cut``, the least
        latency with which they (each holding >= 1 layer) cover L layers using only the options that pass
        ``work_ok`` of ``comp`` at F, and for the nodes of ``cut`` only those of capacity >= F (equal to
        ``cover_at(set, cut, F, comp)``); inf for the other sets. None when ``work_ok`` fails (cached)."""
        key = (comp, F, cut)
        if key in self._cover_work:
            return self._cover_work[key]
        work = self.work_mask(comp, F)
        out = None
        if work is not None:
            g = {
                i: np.where((w & (self.cap[i] >= F) if cut >> i & 1 else w)[None], self.lat[i], np.inf).min(axis=2)
                for i, w in work.items()
            }
            out = self._subset_cover(g, comp, cut)[:, :, self.L].T.copy()
        if len(self._cover_work) > 1024:
            self._cover_work.clear()
        self._cover_work[key] = out
        return out

    def work_cap(self, comp: int, F: float) -> np.ndarray:
        """Per node, the largest capacity of its options that pass ``work_ok`` of the nodes ``comp`` at F
        (-inf for a node outside ``comp``, or when none passes)."""
        return self.work_best(comp, F)[:, 0]

    def work_best(self, comp: int, F: float) -> np.ndarray:
        """(n, L + 2): [i, k] the largest capacity of node i's options with >= k layers that pass
        ``work_mask(comp, F)``, -inf where none does (cached)."""
        key = (comp, F)
        got = self._work_best.get(key)
        if got is None:
            L = self.L
            got = np.full((self.n, L + 2), -np.inf)
            for i, w in (self.work_mask(comp, F) or {}).items():
                got[i, : L + 1] = np.maximum.accumulate(np.where(w, self.cap[i], -np.inf).max(axis=1)[::-1])[::-1]
            if len(self._work_best) > 4096:
                self._work_best.clear()
            self._work_best[key] = got
        return got

    def work_mask(self, comp: int, F: float) -> dict[int, np.ndarray] | None:
        """``work_ok`` for the nodes of bit mask ``comp`` at F, per node (cached); None when it fails."""
        key = (comp, F)
        if key not in self._work_mask:
            nodes = [i for i in range(self.n) if comp >> i & 1]
            wk = self.work_ok(nodes, F)
            if len(self._work_mask) > 4096:
                self._work_mask.clear()
            self._work_mask[key] = None if wk is None else dict(zip(nodes, wk, strict=True))
        return self._work_mask[key]

    def cover_at(self, mask: int, cut: int, F: float, comp: int = 0) -> np.ndarray:
        """Per metric, the least latency with which the nodes of bit mask ``mask`` (each holding >= 1
        layer) cover all L layers when those of ``cut`` use only options of capacity >= F; with ``comp``
        (a component's nodes, a superset of ``mask``) only the options that pass its ``work_ok`` at F."""
        key = (mask, cut, F, comp)
        got = self._cover_at.get(key)
        if got is not None:
            return got
        L = self.L
        acc = np.full((self.nm, L + 1), np.inf)
        acc[:, 0] = 0.0
        kk = np.arange(L + 1)
        d = kk[:, None] - kk[None, :]
        dd = np.clip(d, 0, L)
        work = self.work_mask(comp, F) if comp else {}
        if work is None:
            self._cover_at[key] = np.full(self.nm, np.inf)
            return self._cover_at[key]
        for i in range(self.n):
            if not mask >> i & 1:
                continue
            if i in work:
                allow = work[i] & (self.cap[i] >= F) if cut >> i & 1 else work[i]
                g = np.where(allow[None], self.lat[i], np.inf).min(axis=2)
            elif cut >> i & 1:
                g = np.where(self.cap[i][None] >= F, self.lat[i], np.inf).min(axis=2)
            else:
                g = self.gmin[i].copy()
            g[:, 0] = np.inf
            cand = acc[:, None, :] + g[:, dd]
            acc = np.where(d[None] >= 0, cand, np.inf).min(axis=2)
        if len(self._cover_at) > 65536:
            self._cover_at.clear()
        self._cover_at[key] = acc[:, L]
        return self._cover_at[key]

    def cover(self, nodes: tuple[int, ...]) -> np.ndarray:
        """Per metric, the least latency with which ``nodes`` (each holding >= 1 layer) cover all L
        layers, metric by metric (a lower bound for any path through exactly these nodes): ``cover_at``
        with no node restricted."""
        mask = 0
        for i in nodes:
            mask |= 1 << i
        return self.cover_at(mask, 0, 0.0)


# ----------------------------------------------------------------------------------------------------
# Deciding one labelled shape


@attrs.frozen
class _Witness:
    """A placement of one component: per node (option, start), and its edges (problem indices)."""

    option: dict[int, int]
    start: dict[int, int]
    edges: tuple[Edge, ...]


class TooBig(Exception):
    """A search would enumerate more rows than its work budget allows."""


@attrs.frozen(eq=False)
class _Shape:
    """What deciding a shape needs that does not depend on its labels.

    Runs of cut nodes joined by chain links (a boundary where exactly one node ends and one starts) are
    contracted into *segments*; the *elements* are the segments, then the other nodes, each with its
    interval over the kept boundaries. ``paths_el`` lists each path's elements; ``path_edges`` its edges
    outside segments (indices into ``edges``, which is ``Skeleton.all_edges()``); ``path_all`` all of
    its edges. ``cuts`` holds every minimal cut but the single cut nodes, as (elements, edge indices).
    """

    sk: Skeleton
    edges: tuple[tuple[int, int], ...]
    cutnode: tuple[bool, ...]
    segments: tuple[tuple[int, ...], ...]
    kept: tuple[int, ...]
    elements: tuple[tuple[int, ...], ...]
    elem_iv: tuple[tuple[int, int], ...]
    elem_of: tuple[int, ...]
    need: tuple[bool, ...]
    paths_el: tuple[tuple[int, ...], ...]
    path_edges: tuple[tuple[int, ...], ...]
    path_all: tuple[tuple[int, ...], ...]
    cuts: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]


@functools.cache
def _shape(sk: Skeleton) -> _Shape:
    s = sk.s
    edges = tuple(sk.all_edges())
    eidx = {e: t for t, e in enumerate(edges)}
    cutset = set(sk.cuts)
    cutnode = tuple(((i,), ()) in cutset for i in range(s))
    ends = {t: [i for i in range(s) if sk.iv[i][1] == t] for t in range(1, sk.m)}
    starts = {t: [i for i in range(s) if sk.iv[i][0] == t] for t in range(1, sk.m)}
    link = {t for t in range(1, sk.m) if len(ends[t]) == 1 and len(starts[t]) == 1}
    nxt = {ends[t][0]: starts[t][0] for t in link}
    prv = {v: u for u, v in nxt.items()}
    segments: list[tuple[int, ...]] = []
    seg_of = [-1] * s
    for i in range(s):
        if not cutnode[i] or (i in prv and cutnode[prv[i]]):
            continue
        run = [i]
        while run[-1] in nxt and cutnode[nxt[run[-1]]]:
            run.append(nxt[run[-1]])
        if len(run) > 1:
            for x in run:
                seg_of[x] = len(segments)
            segments.append(tuple(run))
    inner = {sk.iv[x][1] for seg in segments for x in seg[:-1]}
    kept = tuple(t for t in range(sk.m + 1) if t not in inner)
    pos = {t: q for q, t in enumerate(kept)}
    elements = [*segments, *((i,) for i in range(s) if seg_of[i] < 0)]
    elem_iv = tuple((pos[sk.iv[e[0]][0]], pos[sk.iv[e[-1]][1]]) for e in elements)
    elem_of = [0] * s
    for q, e in enumerate(elements):
        for x in e:
            elem_of[x] = q
    internal = {(seg[j], seg[j + 1]) for seg in segments for j in range(len(seg) - 1)}
    paths_el, path_edges, path_all = [], [], []
    for path in sk.paths:
        pairs = list(itertools.pairwise((s, *path, s)))
        path_all.append(tuple(eidx[e] for e in pairs))
        path_edges.append(tuple(eidx[e] for e in pairs if e not in internal))
        els: list[int] = []
        for x in path:
            if not els or els[-1] != elem_of[x]:
                els.append(elem_of[x])
        paths_el.append(tuple(els))
    cuts = tuple(
        (tuple(elem_of[x] for x in nc), tuple(eidx[e] for e in ec))
        for nc, ec in sk.cuts
        if not (len(nc) == 1 and not ec and cutnode[nc[0]])
    )
    return _Shape(
        sk,
        edges,
        cutnode,
        tuple(segments),
        kept,
        tuple(elements),
        elem_iv,
        tuple(elem_of),
        tuple(cutnode[e[0]] for e in elements),
        tuple(paths_el),
        tuple(path_edges),
        tuple(path_all),
        cuts,
    )


@attrs.frozen(eq=False)
class _Step:
    """What ``_enumerate`` does when it places kept boundary t at position p.

    ``ends``: the elements whose length becomes known: those ending at t, and those ending at L that
    start at t (at 1 for those that start at 0); ``tail`` marks the latter (their end is L), ``starts``
    holds their start boundaries and ``onpath`` their paths ((ends, paths) 0/1, None when on none).
    Every element's length is at least rows[:, cb] + db - rows[:, ca] - da, exactly once ``ended``.
    The positions worth trying: p >= rows[:, lo_col] + kmin[lo_q] and p <= rows[:, hi_col] +
    kmax[hi_q] - hi_off (columns of boundaries already placed), p >= L - kmax[cl_q] and
    p <= L - kmin[cu_q] - cu_off, with kmin/kmax each element's least and largest allowed length."""

    ends: np.ndarray
    starts: np.ndarray
    tail: np.ndarray
    onpath: np.ndarray | None
    cb: np.ndarray
    db: np.ndarray
    ca: np.ndarray
    da: np.ndarray
    ended: np.ndarray
    lo_col: np.ndarray
    lo_q: np.ndarray
    hi_col: np.ndarray
    hi_q: np.ndarray
    hi_off: np.ndarray
    cl_q: np.ndarray
    cu_q: np.ndarray
    cu_off: np.ndarray


@attrs.frozen(eq=False)
class _RowPlan:
    """One ``_Step`` per kept boundary 1..r of a shape with L layers, and which elements each path holds
    (elements, paths) 0/1."""

    r: int
    steps: tuple[_Step, ...]
    onpath: np.ndarray


@functools.cache
def _row_plan(sh: _Shape, L: int) -> _RowPlan:
    r = len(sh.kept) - 1
    iv = np.array(sh.elem_iv, np.int64).reshape(-1, 2)
    a, b = iv[:, 0], iv[:, 1]
    tail = b == r
    known = np.where(tail, np.maximum(a, 1), b)  # the step at which each element's length is known
    onp = np.zeros((len(sh.elements), len(sh.paths_el)))
    for pi, els in enumerate(sh.paths_el):
        onp[list(els), pi] = 1.0
    steps = []
    for t in range(1, r + 1):
        ends = np.flatnonzero(known == t)
        op = onp[ends]
        ended = known <= t
        closing = np.flatnonzero((b == t) & (a < t))
        opened = np.flatnonzero((a < t) & (t < b) & ~tail)
        starting = np.flatnonzero((a == t) & ~tail)
        tails = np.flatnonzero(tail & (a == t)) if t < r else np.zeros(0, np.int64)
        steps.append(
            _Step(
                ends=ends,
                starts=a[ends],
                tail=tail[ends],
                onpath=op if op.any() else None,
                cb=np.where(ended & tail, 0, np.minimum(b, t)),
                db=np.where(ended & tail, L, np.maximum(b - t, 0)),
                ca=np.minimum(a, t),
                da=np.maximum(a - t, 0),
                ended=ended,
                lo_col=a[closing],
                lo_q=closing,
                hi_col=np.concatenate([a[closing], a[opened]]),
                hi_q=np.concatenate([closing, opened]),
                hi_off=np.concatenate([np.zeros(closing.size, np.int64), b[opened] - t]),
                cl_q=tails,
                cu_q=np.concatenate([tails, starting]),
                cu_off=np.concatenate([np.zeros(tails.size, np.int64), r - b[starting]]),
            )
        )
    return _RowPlan(r, tuple(steps), onp)


@attrs.frozen(eq=False)
class _CutTables:
    """A shape's cuts (``_Shape.cuts``) as arrays: each cut's edge indices padded with E (an extra column)
    to the widest cut, whether it has edges, how often it holds each element (cuts, elements), and its
    elements as indices padded with the element count (an extra column) to the largest cut."""

    edges: np.ndarray
    has_edges: np.ndarray
    elements: np.ndarray
    element_idx: np.ndarray


@functools.cache
def _cut_tables(sh: _Shape) -> _CutTables:
    E = len(sh.edges)
    width = max([len(ec) for _, ec in sh.cuts] + [1])
    edges = np.full((len(sh.cuts), width), E, np.int64)
    elements = np.zeros((len(sh.cuts), len(sh.elements)))
    idx = np.full((len(sh.cuts), max([len(els) for els, _ in sh.cuts] + [1])), len(sh.elements), np.int64)
    for c, (els, ec) in enumerate(sh.cuts):
        edges[c, : len(ec)] = ec
        np.add.at(elements[c], list(els), 1.0)
        idx[c, : len(els)] = els
    return _CutTables(edges, np.array([bool(ec) for _, ec in sh.cuts], bool), elements, idx)


@attrs.frozen(eq=False)
class _NodeTables:
    """A shape's elements, node-level cuts and paths as 0/1 matrices, for ``_Family._length_bounds`` and
    ``_prefilter``: ``element_nodes`` (elements, s), ``cut`` the cut nodes, ``edge_u``/``edge_v`` the ends
    of ``_Shape.edges``, ``path_edges`` (paths, longest) each path's edges padded with E, ``path_outer``
    the same for its edges outside segments (``_Shape.path_edges``), ``cut_nodes``
    (cuts, s) for every minimal cut but the single cut nodes, ``cut_edges`` (cuts, widest) their edge
    indices into ``_Shape.edges``, padded with E (reads 0) and E + 1 (reads -inf), ``path_nodes``
    (paths, s)."""

    element_nodes: np.ndarray
    cut: np.ndarray
    edge_u: np.ndarray
    edge_v: np.ndarray
    path_edges: np.ndarray
    path_outer: np.ndarray
    cut_nodes: np.ndarray
    cut_neg: np.ndarray
    cut_edges: np.ndarray
    path_nodes: np.ndarray
    path_neg: np.ndarray
    path_pos: np.ndarray


@functools.cache
def _node_tables(sh: _Shape) -> _NodeTables:
    sk = sh.sk
    s, E = sk.s, len(sh.edges)
    eidx = {e: t for t, e in enumerate(sh.edges)}
    cuts = [(nc, ec) for nc, ec in sk.cuts if not (len(nc) == 1 and not ec)]
    nodes = np.zeros((len(cuts), s))
    width = max([len(ec) for _, ec in cuts] + [1])
    edges = np.full((len(cuts), width), E + 1, np.int64)
    for c, (nc, ec) in enumerate(cuts):
        nodes[c, list(nc)] = 1.0
        edges[c, : len(ec)] = [eidx[e] for e in ec]
        if not ec:
            edges[c, 0] = E
    paths = np.zeros((len(sk.paths), s), np.int64)
    for p, path in enumerate(sk.paths):
        paths[p, list(path)] = 1
    on = paths > 0
    elements = np.zeros((len(sh.elements), s), np.int64)
    for q, e in enumerate(sh.elements):
        elements[q, list(e)] = 1
    path_edges = np.full((len(sh.path_all), max(len(pe) for pe in sh.path_all)), E, np.int64)
    for p, pe in enumerate(sh.path_all):
        path_edges[p, : len(pe)] = pe
    path_outer = np.full((len(sh.path_edges), max([len(pe) for pe in sh.path_edges] + [1])), E, np.int64)
    for p, pe in enumerate(sh.path_edges):
        path_outer[p, : len(pe)] = pe
    return _NodeTables(
        elements,
        np.flatnonzero(np.array(sh.cutnode, bool)),
        np.array([u for u, _ in sh.edges], np.int64),
        np.array([v for _, v in sh.edges], np.int64),
        path_edges,
        path_outer,
        nodes,
        np.where(nodes > 0, 0.0, -np.inf),
        edges,
        paths,
        np.where(on, 0.0, -np.inf),
        np.where(on, 0.0, np.inf),
    )


class _Family:
    """Every labelling of one shape by one sub-multiset, as arrays (one row per labelling), with the
    label-dependent data: link latencies per path, edge capacities per cut, and a coverage test."""

    def __init__(self, sh: _Shape, labels: np.ndarray, tb: _Tables) -> None:
        self.sh, self.tb = sh, tb
        n, s = tb.n, sh.sk.s
        nt = _node_tables(sh)
        ext = np.concatenate([labels, np.full((labels.shape[0], 1), n, np.int64)], axis=1)
        U, V = ext[:, nt.edge_u], ext[:, nt.edge_v]  # (NL, E); index s maps to n (source / sink)
        elat = tb.ll[:, U, V]  # (nm, NL, E)
        padded = np.concatenate([elat, np.zeros((*elat.shape[:2], 1))], axis=2)
        full = padded[:, :, nt.path_edges].sum(axis=3)  # (nm, NL, P)
        masks = (1 << labels) @ nt.path_nodes.T  # (NL, P): a labelling holds distinct nodes
        covers = _fits(full + tb.cover_masks(masks), tb.budget)  # each path's nodes can cover the layers
        self.kept_rows = np.flatnonzero(covers)  # which rows of the ``labels`` given are kept
        labels, U, V, full, masks = labels[covers], U[covers], V[covers], full[:, covers], masks[covers]
        self.labels = labels  # (NL, s) problem nodes
        self.elat = elat[:, covers]
        self.ecap = tb.lc[U, V]  # (NL, E)
        nl = labels.shape[0]
        self.plink = padded[:, covers][:, :, nt.path_outer].sum(axis=3)  # (nm, NL, P): links outside segments
        self._full, self._masks = full, masks  # (nm, NL, P) path link sums, (NL, P) path node sets
        # per cut: sum and largest of its edge capacities; per element: the largest capacity of its nodes
        ct = _cut_tables(sh)
        padded = np.concatenate([self.ecap, np.full((nl, 1), -np.inf)], axis=1)[:, ct.edges]  # (NL, C, widest)
        emax = padded.max(axis=2)  # (NL, C): -inf for a cut of nodes only
        live = np.flatnonzero(np.isfinite(emax).any(axis=0) | ~ct.has_edges)
        self.cuts = [sh.cuts[c] for c in live]  # the cuts that some labelling can keep
        self.cut_emax = emax[:, live]
        self.cut_es = np.concatenate([self.ecap, np.zeros((nl, 1))], axis=1)[:, ct.edges[live]].sum(axis=2)
        self.cut_els = [list(els) for els, _ in self.cuts]
        self.cut_mat = ct.elements[live]  # (C, elements): how often a cut holds each
        self.cut_idx = ct.element_idx[live]  # (C, largest): its elements, padded with the element count
        # kappa: per shape node, the largest capacity of an option that fits every path through it
        kap = np.full((nl, s), np.inf)
        bits = 1 << labels  # (NL, s)
        if nl and tb.nm == 1:  # every (labelling, path, node on it) at once
            on = nt.path_nodes > 0  # (P, s)
            keys = labels[:, None, :] * (1 << n) + (masks[:, :, None] - bits[:, None, :])  # (NL, P, s)
            room = np.broadcast_to((tb.budget[0] - full[0])[:, :, None], keys.shape)
            got = np.full(keys.shape, np.inf)
            got[:, on] = tb.fit_cap(keys[:, on].reshape(-1), room[:, on].reshape(-1)).reshape(nl, -1)
            kap = got.min(axis=1)
        for pi, path in enumerate(sh.sk.paths if nl and tb.nm > 1 else ()):
            lk = full[:, :, pi]  # (nm, NL)
            for j in path:
                rest = masks[:, pi] - bits[:, j]  # a labelling holds distinct problem nodes
                keys = labels[:, j] * (1 << n) + rest
                uniq, inv = np.unique(keys, return_inverse=True)
                inv = inv.reshape(-1)
                tabs = [tb.slack(int(u) >> n, int(u) & ((1 << n) - 1)) for u in uniq]
                width = max(t[1].size for t in tabs)
                tot = np.full((len(tabs), tb.nm, width), np.inf)
                cap = np.full((len(tabs), width), -np.inf)
                for u, (tt, cc) in enumerate(tabs):
                    tot[u, :, : cc.size] = tt
                    cap[u, : cc.size] = cc
                fits = np.all(tot[inv].transpose(1, 0, 2) + lk[:, :, None] <= tb.budget[:, None, None], axis=0)
                kap[:, j] = np.minimum(kap[:, j], np.where(fits, cap[inv], -np.inf).max(axis=1))
        self.kappa = kap
        self.viable = np.all(kap > -np.inf, axis=1)
        self.el_maxcap = np.stack([kap[:, list(e)].min(axis=1) for e in sh.elements], axis=1)
        self._spans: tuple[float, dict[int, np.ndarray]] | None = None  # the last candidates' (F, spans)

    def candidates(self, F: float, paths: bool = True) -> np.ndarray:
        """The labellings that pass the cheap tests at threshold F: every path can cover the layers
        within the limits (its cut nodes with options of capacity >= F only, since all the flow crosses
        them, and every node with the options that pass ``work_ok`` at F only: a component that carries
        F uses no other), every cut node can carry F, and every kept cut can. ``paths=False`` skips the
        path test, for labellings that ``_prefilter`` kept at the same F (it ran that test)."""
        ok = self.viable.copy()
        if F <= 0 or not ok.any():
            return np.flatnonzero(ok)
        tb = self.tb
        comp = int(np.bitwise_or.reduce(1 << self.labels[0]))  # every labelling holds the same nodes
        if tb.work_mask(comp, F) is None:
            return np.zeros(0, np.int64)
        wmax = tb.work_cap(comp, F)
        elcap = self.el_maxcap.copy()
        for q, e in enumerate(self.sh.elements):
            elcap[:, q] = np.minimum(elcap[:, q], wmax[self.labels[:, list(e)]].min(axis=1))
        for q, need in enumerate(self.sh.need):
            if need:
                ok &= elcap[:, q] >= F
        if paths:
            cmask = (1 << self.labels[:, _node_tables(self.sh).cut]).sum(axis=1)
            ok &= _paths_cover(tb, comp, F, self._full, self._masks, cmask)
        if self.cuts:
            with np.errstate(invalid="ignore"):
                padded = np.concatenate([elcap, np.zeros((elcap.shape[0], 1))], axis=1)
                tot = self.cut_es + padded[:, self.cut_idx].sum(axis=2)  # (NL, C)
                ok &= np.all((self.cut_emax >= F) | (tot >= F), axis=1)
        rows = np.flatnonzero(ok)
        if rows.size:
            live, lo, hi = self._length_bounds(rows, F)
            self._spans = (F, self._element_spans(rows, live, lo, hi))
            rows = rows[live]
        return rows

    def spans(self, rows: Sequence[int], F: float) -> dict[int, np.ndarray]:
        """Per labelling of ``rows`` that ``_length_bounds`` keeps at F (> 0): each element's range of
        layer counts (elements, 2) as [least, most]; a labelling left out has no placement of flow F."""
        if self._spans is not None and self._spans[0] == F:  # candidates(F) kept exactly these
            got = self._spans[1]
            return {r: got[r] for r in rows if r in got}
        idx = np.asarray(rows, np.int64)
        if idx.size == 0:
            return {}
        comp = int(np.bitwise_or.reduce(1 << self.labels[0]))
        if self.tb.work_mask(comp, F) is None:
            return {}
        return self._element_spans(idx, *self._length_bounds(idx, F))

    def _element_spans(
        self, rows: np.ndarray, live: np.ndarray, lo: np.ndarray, hi: np.ndarray
    ) -> dict[int, np.ndarray]:
        em = _node_tables(self.sh).element_nodes  # (elements, s)
        span = np.stack([lo @ em.T, hi @ em.T], axis=2)  # (R, elements, 2)
        return {int(rows[j]): span[t] for t, j in enumerate(live.tolist())}

    def _length_bounds(self, rows: np.ndarray, F: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The labellings of ``rows`` (indices into it) whose nodes' layer counts can satisfy, together,
        the necessary conditions below, and for each the range [lo, hi] (labellings, s) left to each
        node's count (bounds propagation; a labelling left out has no placement that carries F).

        Node j holds lo_j <= k_j <= hi_j layers (1 <= lo, hi <= L at first). Along every path the k
        add up to L, so lo_j >= L - (sum of the other hi on the path) and hi_j <= L - (sum of the other
        lo). Its capacity is at most cm_j: the largest of its options with k >= lo_j that pass the
        component's ``work_ok`` (the others carry no part of F), and at most kappa_j (the options that
        fit the latency limits of its paths). A cut node needs capacity >= F; a node of a cut whose
        edges all carry less than F needs r_j >= F - (the cut's edge capacities) - (the other cm in the
        cut). So hi_j <= the largest k at which an option passing ``work_ok`` has capacity >= r_j. Each
        round applies every rule once (``ROUNDS`` rounds); an empty range rules the labelling out."""
        tb, sh = self.tb, self.sh
        L = tb.L
        nt = _node_tables(sh)
        lab = self.labels[rows]
        R, s = lab.shape
        comp = int(np.bitwise_or.reduce(1 << self.labels[0]))
        ML = tb.work_best(comp, F)[lab]  # (R, s, L + 2): largest work capacity with >= k layers
        kap = self.kappa[rows]
        ecap = np.concatenate([self.ecap[rows], np.zeros((R, 1)), np.full((R, 1), -np.inf)], axis=1)
        pad = ecap[:, nt.cut_edges]  # (R, C, widest): 0 / -inf padding for the sum / the largest
        es = np.where(np.isneginf(pad), 0.0, pad).sum(axis=2)
        kept = pad.max(axis=2) < F  # (R, C); a cut of nodes only has largest 0: kept
        cutT = nt.cut_nodes.T  # (s, C) 0/1
        neg = nt.cut_neg[None]  # (1, C, s): 0 where the cut holds the node, else -inf
        pm = nt.path_nodes  # (P, s) 0/1
        pneg, ppos = nt.path_neg[None], nt.path_pos[None]  # (1, P, s): 0 on the path, else -inf / +inf
        base = np.where(np.array(sh.cutnode)[None, :], F, -np.inf)
        lo = np.ones((R, s), np.int64)
        hi = np.full((R, s), L, np.int64)
        jj = np.arange(s)[None, :]
        live = np.arange(R)  # the rows still possible, and their data below
        for _ in range(ROUNDS):
            cm = np.maximum(np.minimum(ML[np.arange(live.size)[:, None], jj, lo], kap), 0.0)
            req = base
            if cutT.shape[1]:
                slack = np.where(kept, F - es - cm @ cutT, -np.inf)  # (R, C)
                req = np.maximum(base, (slack[:, :, None] + neg).max(axis=1) + cm)
            hi = np.minimum(hi, (req[:, :, None] <= ML).sum(axis=2) - 1)
            shi = hi @ pm.T  # (R, P)
            slo = lo @ pm.T
            nlo = np.maximum(lo, (L - shi[:, :, None] + hi[:, None, :] + pneg).max(axis=1))
            hi = np.minimum(hi, (L - slo[:, :, None] + lo[:, None, :] + ppos).min(axis=1)).astype(np.int64)
            lo = nlo.astype(np.int64)
            ok = np.all(lo <= hi, axis=1)
            if not ok.all():
                live, ML, kap, es, kept, lo, hi = live[ok], ML[ok], kap[ok], es[ok], kept[ok], lo[ok], hi[ok]
                if live.size == 0:
                    break
            lo, hi = np.maximum(lo, 1), np.minimum(hi, L)
        return live, lo, hi

    def labelled(self, row: int) -> _Labelled:
        return _Labelled(self, row)

    def screen(self, rows: Sequence[int], F: float, budget: list[int]) -> list[tuple[_Labelled, _Prep]]:
        """The labellings of ``rows`` (in order) for which the row enumeration at F finds a boundary
        vector, each with its ``prep``; one enumeration for all of them. Those left out have no placement
        with flow >= F, nor with more."""
        live: list[tuple[_Labelled, _Prep]] = []
        spans = self.spans(rows, F) if F > 0 else None
        for r in rows:
            if spans is not None and r not in spans:
                continue
            lab = self.labelled(r)
            pr = lab.prep(F, None if spans is None else spans[r])
            if pr is not None:
                live.append((lab, pr))
        if not live:
            return []
        _, who = _enumerate(self, [pr for _, pr in live], F, budget)
        hit = np.zeros(len(live), bool)
        hit[who] = True
        return [live[j] for j in np.flatnonzero(hit)]


def _prefilter(sh: _Shape, labels: np.ndarray, tb: _Tables, F: float) -> np.ndarray:
    """The labellings (rows of ``labels``) worth building a ``_Family`` for at threshold F: each cut node
    has an option of capacity >= F that passes the component's ``work_ok`` at F, and each path can cover
    the L layers within the limits with the options that pass it, its cut nodes with options of capacity
    >= F only, plus its links (first without the links and the cut nodes' restriction, by
    ``_Tables.cover_work``, then with them). These are tests of
    ``_Family.candidates`` (the second one is its path test, which it then need not repeat at F), and a
    larger F only makes them stricter."""
    if F <= 0 or labels.shape[0] == 0:
        return labels
    comp = int(np.bitwise_or.reduce(1 << labels[0]))
    tab = tb.cover_work(comp, F)
    if tab is None:
        return labels[:0]
    nt = _node_tables(sh)
    ok = np.all(tb.work_cap(comp, F)[labels[:, nt.cut]] >= F, axis=1)  # all the flow crosses a cut node
    bits = 1 << labels
    masks = bits @ nt.path_nodes.T  # (R, P): a labelling holds distinct nodes, so the sum is the union
    ok &= _fits(tab[:, masks], tb.budget)
    if not ok.any():
        return labels[:0]
    labels, bits, masks = labels[ok], bits[ok], masks[ok]
    ext = np.concatenate([labels, np.full((labels.shape[0], 1), tb.n, np.int64)], axis=1)
    pl = _path_links(sh, tb, ext)
    return labels[_paths_cover(tb, comp, F, pl, masks, bits[:, nt.cut].sum(axis=1))]


def _paths_cover(
    tb: _Tables, comp: int, F: float, links: np.ndarray, masks: np.ndarray, cmask: np.ndarray
) -> np.ndarray:
    """Per labelling (R,): every path's links (metrics, R, paths) plus the least latency with which its
    nodes (``masks`` (R, paths), bit masks) cover the L layers fit the limits, the cut nodes (``cmask``
    (R,)) held to options of capacity >= F and every node to those passing ``work_ok`` of ``comp``."""
    ok = np.zeros(masks.shape[0], bool)
    for cm in np.unique(cmask).tolist():
        rows = np.flatnonzero(cmask == cm)
        tab = tb.cover_work(comp, F, cm)
        if tab is not None:
            ok[rows] = _fits(links[:, rows] + tab[:, masks[rows]], tb.budget)
    return ok


def _fits(lat: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """(metrics, R, paths) latencies -> (R,): every path finite and within the limits in every metric."""
    b = budget.reshape((-1, *([1] * (lat.ndim - 1))))
    return np.all((lat <= b) & (lat < np.inf), axis=(0, 2))


def _path_links(sh: _Shape, tb: _Tables, ext: np.ndarray) -> np.ndarray:
    """(metrics, labellings, paths): each path's summed link latencies, for labellings ``ext`` (one
    column per shape node, then one holding n for the source and sink)."""
    nt = _node_tables(sh)
    elat = tb.ll[:, ext[:, nt.edge_u], ext[:, nt.edge_v]]  # (nm, NL, E)
    elat = np.concatenate([elat, np.zeros((*elat.shape[:2], 1))], axis=2)
    return elat[:, :, nt.path_edges].sum(axis=3)


@attrs.frozen(eq=False)
class _ElementAt:
    """One element (a node, or a segment's front) at a threshold: option latencies (metrics, L + 1, W),
    capacities clipped at F and usable options (L + 1, W), a segment's back-pointers, the lengths with a
    usable option, the least latency per length (metrics, L + 1) and overall (metrics,), and the largest
    usable capacity per length (L + 1)."""

    lat: np.ndarray
    cap: np.ndarray
    ok: np.ndarray
    backs: list[tuple[np.ndarray, int, int]]
    allowed: np.ndarray
    lb_lat: np.ndarray
    lbmin: np.ndarray
    ub_cap: np.ndarray


@attrs.frozen(eq=False)
class _Prep:
    """A labelled shape at one threshold F (``_Labelled.prep``): each element's tables (``_ElementAt``),
    the paths' least latencies (metrics, paths), which of the family's cuts are kept (all their edges
    carry less than F), each cut's edge capacity, the kept cuts as (elements, edges' sum), and each
    element's range of layer counts (elements, 2), when known (``_Family.spans``)."""

    els: list[_ElementAt]
    base: np.ndarray
    kept: np.ndarray
    es: np.ndarray
    kept_cuts: list[tuple[list[int], float]]
    span: np.ndarray | None = None


def _enumerate(fam: _Family, preps: Sequence[_Prep], F: float, budget: list[int]) -> tuple[np.ndarray, np.ndarray]:
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
    plan = _row_plan(fam.sh, L)
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
        budget[0] -= idx.size
        if budget[0] < 0:
            raise TooBig(idx.size)
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
    st: _Step,
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


class _Labelled:
    """One shape with a problem node on each of its nodes (see ``decide``)."""

    def __init__(self, fam: _Family, row: int) -> None:
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

    def _segment_front(self, seg: tuple[int, ...], F: float) -> tuple[np.ndarray, list[tuple[np.ndarray, int, int]]]:
        """Per total length K, the Pareto front of latency vectors of the chain ``seg`` when every
        capacity is >= F: (metrics, L + 1, A), inf where padded; and per added node its back-pointers
        (L + 1, A) into the flattened (K', a, b) candidates with the widths A and B."""
        tb = self.tb
        key = (tuple(self.nodes[x] for x in seg), F, tuple(sorted(self.nodes)))
        if key in tb.fronts:
            return tb.fronts[key]
        work = self._work
        L, nm = tb.L, tb.nm
        first = self.nodes[seg[0]]
        lat0, _ = _collapsed(tb, first, F, work.get(first), self._comp)
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
            opts, _ = _collapsed(tb, node, F, work.get(node), self._comp)
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

    def _element(self, q: int, F: float, work: dict[int, np.ndarray]) -> _ElementAt:
        """Element q at threshold F (cached per node or segment, F and component)."""
        tb = self.tb
        e = self.elements[q]
        seg = q < len(self.segments)
        key = (tuple(self.nodes[x] for x in e), self.need[q], F, self._comp)
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
            ok = tb.useful(i, F)
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
        out = _ElementAt(lat, cap, ok, backs, allowed, lb_lat, lbmin, ub_cap)
        if len(tb.elements) > 4096:
            tb.elements.clear()
        tb.elements[key] = out
        return out

    def prep(self, F: float, span: np.ndarray | None = None) -> _Prep | None:
        """Per element, its usable options at threshold F and the bounds the row enumeration uses;
        None when some path's least latency already exceeds a limit or no option passes the work test.
        ``span``: the elements' ranges of layer counts from ``_Family.spans`` at F, when known."""
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
        base = self.plink.T + lbmin.T @ _row_plan(self.sh, tb.L).onpath  # (nm, P)
        if np.any(base > tb.budget[:, None]):
            return None
        return _Prep(els, base, kept, self.cut_es, kept_cuts, span)

    def decide(self, F: float, budget: list[int], prep: _Prep | None = None) -> _Witness | None:
        """A placement of this labelled shape with maximum flow >= F (any feasible one when F <= 0),
        or None when none exists. ``budget[0]`` counts down the rows enumerated; TooBig when exhausted.
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
        rowsB = _enumerate(self.fam, [got], F, budget)[0]
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
            budget[0] -= rr.size
            if budget[0] < 0:
                raise TooBig(rr.size)
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
    ) -> _Witness:
        tb = self.tb
        option: dict[int, int] = {}
        start: dict[int, int] = {}
        for q, e in enumerate(self.elements):
            pos = int(Bk[self.elem_iv[q][0]])
            if q < len(self.segments):
                F_slots = [_collapsed(tb, self.nodes[x], F, self._work.get(self.nodes[x]), self._comp)[1] for x in e]
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
        return _Witness(option, start, tuple(self.pedge[x] for x in self.edges_sk))


def _collapsed(
    tb: _Tables, i: int, F: float, extra: np.ndarray | None = None, comp: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The options of node i with capacity >= F whose latencies no other such option beats (and that
    ``extra`` allows), compacted per k: latencies (metrics, L + 1, B), inf where padded, and their
    slots (L + 1, B), -1 padded. Cached when ``extra`` is the ``work_mask`` of the nodes ``comp`` at F
    (or None, with ``comp`` 0)."""
    key = (i, F, comp if extra is not None else -1)
    got = tb.collapsed.get(key)
    if got is not None:
        return got
    out = _collapse(tb, i, F, extra)
    if len(tb.collapsed) > 4096:
        tb.collapsed.clear()
    tb.collapsed[key] = out
    return out


def _collapse(tb: _Tables, i: int, F: float, extra: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    okm = tb.useful(i, F) & (tb.cap[i] >= F)
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


# ----------------------------------------------------------------------------------------------------
# The search over partitions into components


class _Classes:
    """Interchangeable nodes (same kind, menu and links); sub-multisets are count vectors over them."""

    def __init__(self, problem: PlacementProblem) -> None:
        n = problem.n
        rep = class_reps(problem)
        self.reps = sorted(set(rep))
        self.members = [[x for x in range(n) if rep[x] == r] for r in self.reps]
        self.full = tuple(len(m) for m in self.members)

    def subsets(self) -> list[tuple[int, ...]]:
        """Every non-empty sub-multiset, by size then lexicographically."""
        out = [c for c in itertools.product(*(range(f + 1) for f in self.full)) if sum(c) > 0]
        return sorted(out, key=lambda c: (sum(c), c))

    def labellings(self, sk: Skeleton, counts: tuple[int, ...]) -> np.ndarray:
        """Problem nodes for the shape's nodes (one row per labelling by the sub-multiset ``counts``),
        one labelling per orbit of the shape's automorphisms."""
        lab, occ = _class_labels(sk, counts)
        width = max(len(m) for m in self.members)
        table = np.array([m + [-1] * (width - len(m)) for m in self.members], dtype=np.int64)
        return table[lab, occ]


_CLASS_LABELS: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]] = {}


def _class_labels(sk: Skeleton, counts: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """For ``Classes.labellings``: the class of each shape node, one row per orbit of the shape's
    automorphisms, and each node's occurrence index within its class (cached: no problem data)."""
    key = (sk.m, sk.iv, sk.edges, counts)
    got = _CLASS_LABELS.get(key)
    if got is not None:
        return got
    classes = tuple(c for c, q in enumerate(counts) for _ in range(q))
    perms = _multiset_perms(classes)  # (P, s) class labels
    base = len(counts) + 1
    weights = base ** np.arange(sk.s - 1, -1, -1, dtype=np.int64)
    code = perms @ weights
    canon = code.copy()
    for a in sk.aut:
        canon = np.minimum(canon, perms[:, list(a)] @ weights)
    lab = perms[code == canon]
    occ = np.zeros_like(lab)
    for j in range(1, sk.s):
        occ[:, j] = (lab[:, :j] == lab[:, j : j + 1]).sum(axis=1)
    if len(_CLASS_LABELS) > 65536:
        _CLASS_LABELS.clear()
    _CLASS_LABELS[key] = (lab, occ)
    return lab, occ


@functools.cache
def _multiset_perms(classes: tuple[int, ...]) -> np.ndarray:
    return np.array(sorted(set(itertools.permutations(classes))), dtype=np.int64).reshape(-1, len(classes))


@functools.cache
def _variants(s: int) -> dict[tuple[int, tuple[tuple[int, int], ...]], int]:
    """Per interval pattern (m, iv) of the connected shapes of ``s`` nodes: how many shapes have it."""
    out: dict[tuple[int, tuple[tuple[int, int], ...]], int] = {}
    for sk in skeletons(s):
        out[(sk.m, sk.iv)] = out.get((sk.m, sk.iv), 0) + 1
    return out


@functools.cache
def _full_shape(m: int, iv: tuple[tuple[int, int], ...]) -> tuple[Skeleton, np.ndarray]:
    """The shape with intervals ``iv`` and every possible edge (each node ending at a boundary feeds each
    node starting there), and its automorphisms (every permutation that keeps the intervals) as rows."""
    s = len(iv)
    edges = tuple((i, j) for i in range(s) for j in range(s) if iv[i][1] == iv[j][0])
    aut = tuple(_perms_within(iv))
    return Skeleton(m, iv, edges, aut), np.array(aut, dtype=np.int64).reshape(-1, s)


class _EdgeRelaxation:
    """Rules out labelled shapes many at a time, exactly.

    Shapes that share their intervals differ only in their edges, and each has a subset of the edges of
    the *full* shape with those intervals. Adding edges never lowers a maximum flow, never adds a cut
    node, and never makes an option unusable but through latency. So if the full shape with every
    latency set to zero (the same problem otherwise) has no placement of flow >= F for a labelling, no
    shape with those intervals has one for it. The test is the full shape's ``_Family.candidates`` and
    ``_Family.screen`` (a boundary vector), without its decision: with every latency zero, a boundary
    vector that meets every cut nearly always has options to match (1,939 of 1,939 on 150 gemma-3-27b
    prefill multisets), and keeping a labelling is always safe. A labelling is identified up to the full
    shape's automorphisms and interchangeable nodes; the smallest F at which each was ruled out is kept
    (a larger F is ruled out too), and the largest at which it passed (kept again below it, which is
    always safe)."""

    def __init__(self, problem: PlacementProblem, cl: _Classes) -> None:
        free = tuple(attrs.evolve(m, lat=np.zeros_like(np.asarray(m.lat, dtype=np.float64))) for m in problem.menus)
        self.tb = _Tables(attrs.evolve(problem, menus=free, link_lat=np.zeros_like(problem.link_lat)))
        self.cl = cl
        self.cls = np.zeros(problem.n, np.int64)
        for c, mem in enumerate(cl.members):
            self.cls[mem] = c
        self.base = len(cl.members) + 1
        self.fams: dict[tuple[object, ...], tuple[_Family, dict[int, int]]] = {}
        self.out: dict[tuple[object, ...], float] = {}
        self.passed: dict[tuple[object, ...], float] = {}
        self.cand: dict[tuple[object, ...], set[int]] = {}

    def _code(self, iv: tuple[tuple[int, int], ...], perms: np.ndarray, labels: np.ndarray) -> np.ndarray:
        weights = self.base ** np.arange(len(iv) - 1, -1, -1, dtype=np.int64)
        pat = self.cls[labels]  # (R, s)
        return (pat[:, perms] @ weights).min(axis=1)  # (R,)

    def codes(self, sk: Skeleton, labels: np.ndarray) -> np.ndarray | None:
        """Per labelling (row of ``labels``), its identity for ``rules_out``; None when ``sk`` is the only
        shape with its intervals (nothing to share)."""
        if _variants(sk.s)[(sk.m, sk.iv)] < 2:
            return None
        return self._code(sk.iv, _full_shape(sk.m, sk.iv)[1], labels)

    def open(self, sk: Skeleton, counts: tuple[int, ...], codes: np.ndarray, F: float) -> np.ndarray:
        """Per code, False when it is ruled out at F without a decision: already, at F or below, or now
        because the full shape's labelling fails ``_Family.candidates`` at F (recorded)."""
        out = self.out
        got = np.array([out.get((sk.m, sk.iv, int(c)), math.inf) > F for c in codes.tolist()], bool)
        if F <= 0 or not got.any():
            return got
        _, rows, cand = self._candidates(sk, counts, F)
        for j in np.flatnonzero(got).tolist():
            code = int(codes[j])
            if rows.get(code, -1) not in cand:  # -1: no path of the full shape can cover the layers
                got[j] = False
                key = (sk.m, sk.iv, code)
                out[key] = min(out.get(key, math.inf), F)
        return got

    def _candidates(self, sk: Skeleton, counts: tuple[int, ...], F: float) -> tuple[_Family, dict[int, int], set[int]]:
        """The full shape's family for ``sk``'s intervals, its row per code, and its candidates at F."""
        fk = (sk.m, sk.iv, counts)
        if fk not in self.fams:
            full, perms = _full_shape(sk.m, sk.iv)
            labs = self.cl.labellings(full, counts)
            fam = _Family(_shape(full), labs, self.tb)
            self.fams[fk] = (fam, {int(x): r for r, x in enumerate(self._code(sk.iv, perms, fam.labels))})
        fam, rows = self.fams[fk]
        ck = (fk, F)
        if ck not in self.cand:
            self.cand = {ck: set(fam.candidates(F).tolist())}
        return fam, rows, self.cand[ck]

    def rules_out(self, sk: Skeleton, counts: tuple[int, ...], code: int, F: float, budget: list[int]) -> bool:
        """Whether no shape with ``sk``'s intervals, labelled as ``code`` says, has flow >= F (F > 0)."""
        return not self.keep(sk, counts, [code], F, budget)[0]

    def keep(
        self, sk: Skeleton, counts: tuple[int, ...], codes: Sequence[int], F: float, budget: list[int]
    ) -> list[bool]:
        """Per code, whether the full shape passes the screen at F for it (False: every shape with
        ``sk``'s intervals is ruled out for that labelling). Undecided codes are screened together."""
        if F <= 0:
            return [True] * len(codes)
        fam, rows, cand = self._candidates(sk, counts, F)
        verdict: dict[int, bool] = {}
        ask: list[int] = []
        for code in codes:
            key = (sk.m, sk.iv, code)
            if code in verdict:
                continue
            if self.out.get(key, math.inf) <= F:
                verdict[code] = False
            elif self.passed.get(key, -math.inf) >= F:
                verdict[code] = True
            elif rows.get(code, -1) not in cand:  # -1: no path of the full shape can cover the layers
                verdict[code] = False
                self.out[key] = min(self.out.get(key, math.inf), F)
            else:
                verdict[code] = False
                ask.append(code)
        if ask:
            live = {lab.row for lab, _ in fam.screen([rows[c] for c in ask], F, budget)}
            for code in ask:
                key = (sk.m, sk.iv, code)
                if rows[code] in live:
                    verdict[code] = True
                    self.passed[key] = max(self.passed.get(key, -math.inf), F)
                else:
                    self.out[key] = min(self.out.get(key, math.inf), F)
        return [verdict[code] for code in codes]


def _component_value(tb: _Tables, nodes: Sequence[int], w: _Witness) -> float:
    """The exact maximum flow of one component placement (on the sub-problem of its nodes)."""
    p = tb.p
    idx = list(nodes)
    pos = {x: q for q, x in enumerate(idx)}
    sub = _subproblem(p, idx)
    m = len(idx)
    edges = [(m if u == p.n else pos[u], m if v == p.n else pos[v]) for u, v in w.edges]
    ev = evaluate_placement(sub, [w.option[x] for x in idx], [w.start[x] for x in idx], edges)
    if ev is None:  # pragma: no cover - decide checks every path and range
        raise AssertionError("a shape witness failed its exact check")
    return ev[0]


def _subproblem(p: PlacementProblem, nodes: Sequence[int]) -> PlacementProblem:
    idx = [*nodes, p.n]
    ll = np.asarray(p.link_lat)[:, idx][:, :, idx]
    lc = np.asarray(p.link_cap)[idx][:, idx]
    return attrs.evolve(
        p, kinds=tuple(p.kinds[i] for i in nodes), menus=tuple(p.menus[i] for i in nodes), link_lat=ll, link_cap=lc
    )


def exhaustive_shapes(problem: PlacementProblem, *, budget: int = 50_000_000) -> PlacementResult | None:
    """Reference version of the search: the best connected placement of every sub-multiset (each raised
    by repeated decisions from "any feasible"), then the best partition. None when over ``budget``."""
    tb = _Tables(problem)
    cl = _Classes(problem)
    bud = [budget]
    best: dict[tuple[int, ...], tuple[float, tuple[int, ...], _Witness] | None] = {}
    try:
        for counts in cl.subsets():
            s = sum(counts)
            cur: tuple[float, tuple[int, ...], _Witness] | None = None
            for sk in skeletons(s):
                fam = _Family(_shape(sk), cl.labellings(sk, counts), tb)
                for row in range(fam.labels.shape[0]):
                    lab = fam.labelled(row)
                    nodes = lab.nodes
                    F = 0.0 if cur is None else cur[0] * (1 + SEARCH_RTOL) + 1e-300
                    while (w := lab.decide(F, bud)) is not None:
                        v = _component_value(tb, nodes, w)
                        if cur is not None and v <= cur[0]:  # pragma: no cover - decide asked for more
                            raise AssertionError("no progress")
                        cur = (v, nodes, w)
                        F = v * (1 + SEARCH_RTOL) + 1e-300
            best[counts] = cur
    except TooBig:
        return None
    return _assemble(problem, tb, cl, best, "shapes")


def _assemble(
    problem: PlacementProblem,
    tb: _Tables,
    cl: _Classes,
    conn: dict[tuple[int, ...], tuple[float, tuple[int, ...], _Witness] | None],
    method: str,
) -> PlacementResult:
    """The best partition of the full multiset into components with known best placements."""
    subs = cl.subsets()
    part: dict[tuple[int, ...], tuple[float, list[tuple[int, ...]]]] = {tuple(0 for _ in cl.full): (0.0, [])}
    for counts in subs:
        cand: tuple[float, list[tuple[int, ...]]] | None = None
        first = next(c for c, q in enumerate(counts) if q)
        for a in itertools.product(*(range(q + 1) for q in counts)):
            if a[first] == 0:
                continue
            rest = tuple(x - y for x, y in zip(counts, a, strict=True))
            ca = conn.get(a)
            if ca is None or rest not in part:
                continue
            v = ca[0] + part[rest][0]
            if cand is None or v > cand[0]:
                cand = (v, [a, *part[rest][1]])
        if cand is not None:
            part[counts] = cand
    if cl.full not in part:
        return PlacementResult(0.0, "infeasible", 0.0, method)
    used = [0] * len(cl.full)
    option = [0] * problem.n
    start = [0] * problem.n
    edges: list[Edge] = []
    for a in part[cl.full][1]:
        rec = conn[a]
        assert rec is not None
        _, nodes, w = rec
        remap: dict[int, int] = {problem.n: problem.n}
        for c in range(len(cl.full)):
            mine = [x for x in nodes if x in cl.members[c]]
            for x in sorted(mine):
                remap[x] = cl.members[c][used[c]]
                used[c] += 1
        for x in nodes:
            option[remap[x]] = w.option[x]
            start[remap[x]] = w.start[x]
        edges += [(remap[u], remap[v]) for u, v in w.edges]
    ev = evaluate_placement(problem, option, start, edges)
    if ev is None:  # pragma: no cover - components are disjoint and each was checked
        raise AssertionError("an assembled placement failed its check")
    return PlacementResult(ev[0], "optimal", ev[0], method, tuple(option), tuple(start), ev[1])


def work_fixed_point(ks: Sequence[np.ndarray], caps: Sequence[np.ndarray], L: int) -> float:
    """The largest flow F that the layer work allows: L F <= sum_i max_o k_o min(c_o, F) over each node
    i's options (k_o, c_o), since every unit of flow crosses L layers and a node carries at most F.
    The right side h(F) is concave, piecewise linear (kinks at the capacities) and h(0) = 0, so the
    F with h(F) >= F form an interval [0, F*]; returns an upper end of a bracket of F* narrower than
    1e-9 of the gap between the two capacities around it (a valid bound, nearly exact)."""
    if any(k.size == 0 for k in ks):
        return 0.0
    fronts = [
        _work_front(np.asarray(k, dtype=np.float64), np.asarray(c, dtype=np.float64))
        for k, c in zip(ks, caps, strict=True)
    ]
    ks, caps = [f[0] for f in fronts], [f[1] for f in fronts]
    pts = np.unique(np.concatenate(caps))
    pts = pts[pts > 0]
    if pts.size == 0:
        return 0.0

    def h(u: np.ndarray) -> np.ndarray:
        tot = np.zeros(u.shape)
        for k, c in zip(ks, caps, strict=True):
            tot += np.max(
                np.asarray(k, dtype=np.float64)[:, None] * np.minimum(np.asarray(c)[:, None], u[None, :]), axis=0
            )
        return tot / L

    hp = h(pts)
    ok = np.flatnonzero(hp >= pts * (1 - 1e-12))  # lenient: the bound stays valid
    if ok.size == 0:  # h(F) = s F on [0, pts[0]] with s < 1
        return 0.0
    j = int(ok[-1])
    if j == pts.size - 1:  # beyond the largest capacity h is flat
        return float(hp[j])
    lo, hi = float(pts[j]), float(pts[j + 1])  # h(lo) >= lo, h(hi) < hi: F* in [lo, hi)
    for _ in range(5):  # h is not linear in between (two options' work can cross): narrow the bracket
        grid = np.linspace(lo, hi, 65)
        good = np.flatnonzero(h(grid) >= grid * (1 - 1e-12))
        t = int(good[-1])
        lo, hi = float(grid[t]), float(grid[min(t + 1, 64)])
    return hi


def _work_front(k: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The options (k, c) that no other option matches in both k and c: only they can attain
    max_o k_o min(c_o, F) for some F."""
    order = np.lexsort((-c, -k))
    ks, cs = k[order], c[order]
    best = np.maximum.accumulate(np.r_[-np.inf, cs[:-1]])
    keep = cs > best
    return ks[keep], cs[keep]


def _bound(tb: _Tables, nodes: Sequence[int]) -> float:
    """A cheap upper bound on the flow of any placement of ``nodes``: the layer-work fixed point
    (``work_fixed_point``), itself below the sum of their capacities."""
    ks, caps = [], []
    kk = np.arange(tb.L + 1)[:, None]
    for i in nodes:
        sel = tb.opt[i] >= 0
        ks.append(np.broadcast_to(kk, sel.shape)[sel])
        caps.append(tb.cap[i][sel])
    return work_fixed_point(ks, caps, tb.L)


def _best_so_far(
    problem: PlacementProblem,
    tb: _Tables,
    cl: _Classes,
    low: dict[tuple[int, ...], tuple[float, tuple[int, ...], _Witness] | None],
    bound: float,
    incumbent: PlacementResult | None,
) -> PlacementResult | None:
    """The better of ``incumbent`` and the best partition of the components placed so far, unproven."""
    found = _assemble(problem, tb, cl, low, "shapes")
    best = found if found.status != "infeasible" else None
    if incumbent is not None and incumbent.option and (best is None or incumbent.value > best.value):
        best = incumbent
    if best is None:
        return None
    return attrs.evolve(best, status="feasible", bound=max(bound, best.value), method="shapes")


def _threshold(tau: float, cur: tuple[float, tuple[int, ...], _Witness] | None) -> float:
    """The flow a component must exceed: the larger of ``tau`` and its best placement so far (0 when
    neither is positive: any placement then counts)."""
    F = max(tau, cur[0] if cur is not None else -math.inf)
    return 0.0 if F < 0 or -math.inf == F else F * (1 + SEARCH_RTOL) + 1e-300


def shape_search(
    problem: PlacementProblem,
    *,
    incumbent: PlacementResult | None = None,
    budget: int = 20_000_000,
    floor: float | None = None,
    spanning: bool = False,
) -> PlacementResult | None:
    """The proven optimum of ``problem`` (n <= 6) by shapes (status ``optimal`` or ``infeasible``).

    When the work budget runs out it returns the best placement known (the incumbent or a partition
    of the components placed so far) with status ``feasible`` and the partition bound UP(all nodes)
    below as ``bound``, or None when it knows no placement.

    With ``floor`` the caller needs the optimum only if it exceeds ``floor``: the search starts with V
    just below ``floor`` (as if a placement worth that much were known), and when no placement can beat
    it, returns status ``below`` with ``bound`` = ``floor`` (no placement is worth more) and the best
    placement it found, if any (value <= ``floor``, not proven optimal).

    Each sub-multiset S of the nodes (up to interchangeable nodes) has an upper bound up(S) on its best
    connected placement, first ``_bound``. UP(X) is the best partition of X by these bounds and V the
    best placement known (a partition into components already placed, or ``incumbent``). S matters only
    while up(S) + UP(rest) > V, where rest is the multiset without S; then its connected shapes are
    decided at the threshold V - UP(rest): each placement found raises the threshold, and when none is
    left, up(S) drops to the threshold (or to the best placement found, which is then exact). The search
    ends when no S matters: no partition can beat V. ``budget`` bounds the rows enumerated.

    ``spanning`` (with ``floor``): the caller knows that no placement with two or more components is
    worth more than ``floor`` (a template build's floor is at least the best split into smaller
    templates), so only connected placements of all the nodes are searched: every proper S starts with
    up(S) = -inf.
    """
    if spanning and floor is None:
        raise ValueError("spanning needs a floor")
    tb = _Tables(problem)
    cl = _Classes(problem)
    relax = _EdgeRelaxation(problem, cl)
    subs = cl.subsets()
    zero = tuple(0 for _ in cl.full)
    rep = {c: tuple(m for cc, q in enumerate(c) for m in cl.members[cc][:q]) for c in subs}
    up: dict[tuple[int, ...], float] = {
        c: _bound(tb, rep[c]) if not spanning or c == cl.full else -math.inf for c in subs
    }
    low: dict[tuple[int, ...], tuple[float, tuple[int, ...], _Witness] | None] = dict.fromkeys(subs)
    done: set[tuple[int, ...]] = set()
    bud = [budget]
    V = -math.inf
    best_assembled: PlacementResult | None = None
    if incumbent is not None and incumbent.option and incumbent.status != "infeasible":
        V = incumbent.value
    # up[c] may be set up to a factor (1 + SEARCH_RTOL) below the truth and the search ends at
    # UP <= V (1 + SEARCH_RTOL): with V at floor / (1 + SEARCH_RTOL)^2 the optimum is then <= floor.
    v_floor = -math.inf if floor is None else floor / (1 + SEARCH_RTOL) ** 2
    real = V
    V = max(V, v_floor)

    def partitions(val: dict[tuple[int, ...], float]) -> dict[tuple[int, ...], float]:
        out = {zero: 0.0}
        for counts in subs:
            first = next(c for c, q in enumerate(counts) if q)
            best = -math.inf
            for a in itertools.product(*(range(q + 1) for q in counts)):
                if a[first] == 0:
                    continue
                rest = tuple(x - y for x, y in zip(counts, a, strict=True))
                v = val[a] + out[rest]
                best = max(best, v)
            out[counts] = best
        return out

    try:
        while True:
            lows = {c: (lc[0] if (lc := low[c]) is not None else -math.inf) for c in subs}
            lowp = partitions(lows)
            if lowp[cl.full] > real or (best_assembled is None and lowp[cl.full] > -math.inf and lowp[cl.full] >= real):
                best_assembled = _assemble(problem, tb, cl, {c: low[c] for c in subs}, "shapes")
                real = max(real, best_assembled.value)
                V = max(V, real)
            upp = partitions(up)
            if upp[cl.full] <= V * (1 + SEARCH_RTOL) and -math.inf < V:
                break
            if upp[cl.full] == -math.inf:
                break
            pending = []
            for c in subs:
                if c in done:
                    continue
                rest = tuple(f - x for f, x in zip(cl.full, c, strict=True))
                if upp[rest] == -math.inf:
                    continue
                if up[c] + upp[rest] > V * (1 + SEARCH_RTOL) or -math.inf == V:
                    pending.append(c)
            if not pending:  # pragma: no cover - the bound test above ends the loop first
                break
            c = min(pending, key=lambda x: (sum(x), x))
            rest = tuple(f - x for f, x in zip(cl.full, c, strict=True))
            tau = V - upp[rest]
            cur = low[c]
            feasible = cur is not None
            comp = sum(1 << i for i in rep[c])
            for sk in skeletons(sum(c)):
                F = _threshold(tau, cur)
                sh = _shape(sk)
                if F > 0 and _node_tables(sh).cut.size > int((tb.work_cap(comp, F) >= F).sum()):
                    continue  # a cut node carries all of F: too few nodes can (``_prefilter``'s first test)
                labels = _prefilter(sh, cl.labellings(sk, c), tb, F)
                codes = relax.codes(sk, labels) if labels.shape[0] else None
                if codes is not None:
                    still = relax.open(sk, c, codes, F)
                    labels, codes = labels[still], codes[still]
                if labels.shape[0] == 0:
                    continue
                fam = _Family(sh, labels, tb)
                if codes is not None:
                    codes = codes[fam.kept_rows]
                cands = fam.candidates(F, paths=False).tolist()  # the prefilter ran the path test at F
                for at in range(0, len(cands), SCREEN):
                    chunk = cands[at : at + SCREEN]
                    F = _threshold(tau, cur)
                    if codes is not None:
                        alive = relax.keep(sk, c, [int(codes[row]) for row in chunk], F, bud)
                        chunk = [row for row, ok in zip(chunk, alive, strict=True) if ok]
                    f_screen = F
                    for lab, prep in fam.screen(chunk, f_screen, bud):
                        F = _threshold(tau, cur)
                        pre: _Prep | None = prep if f_screen == F else None
                        while (w := lab.decide(F, bud, pre)) is not None:
                            v = _component_value(tb, lab.nodes, w)
                            feasible = True
                            if cur is None or v > cur[0]:
                                cur = (v, lab.nodes, w)
                                low[c] = cur
                            F = max(F, v) * (1 + SEARCH_RTOL) + 1e-300
                            pre = None
            low[c] = cur
            done.add(c)
            if cur is not None and cur[0] > tau:
                up[c] = cur[0]
            elif not feasible and tau < 0:
                up[c] = -math.inf
            else:
                up[c] = min(up[c], max(tau, cur[0] if cur is not None else -math.inf))
    except TooBig:
        return _best_so_far(problem, tb, cl, low, partitions(up)[cl.full], incumbent)
    if floor is not None and real < v_floor:  # proven: nothing is worth more than floor
        below = _best_so_far(problem, tb, cl, low, floor, incumbent)
        if below is None:
            return PlacementResult(0.0, "below", floor, "shapes")
        return attrs.evolve(below, status="below", bound=floor)
    if best_assembled is None:
        if -math.inf < V and incumbent is not None:
            return attrs.evolve(incumbent, status="optimal", bound=incumbent.value, method="shapes")
        return PlacementResult(0.0, "infeasible", 0.0, "shapes")
    if incumbent is not None and incumbent.option and incumbent.value > best_assembled.value:
        return attrs.evolve(incumbent, status="optimal", bound=incumbent.value, method="shapes")
    return best_assembled
