"""The search over partitions into components (``shape_search``): thresholds from an incumbent and from
upper bounds skip components, the edge relaxation rules a labelling out for every shape with the same
intervals (``EdgeRelaxation``), each component's best value is raised by repeated decisions until none
is feasible, and the best partition is assembled (``_assemble``). ``exhaustive_shapes`` is the reference
version without the thresholds."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import attrs
import numpy as np

from solvers.bounds import work_fixed_point
from solvers.problem import ANY_DEPTH, BOTH, Edge, PlacementProblem, PlacementResult
from solvers.rules import Classes, evaluate_placement
from solvers.shapes.catalogue import Skeleton, class_labels, full_shape, skeletons, variants
from solvers.shapes.decide import Budget, Labelled, Prep, TooBig, Witness, screen
from solvers.shapes.family import SCREEN, Family, prefilter
from solvers.shapes.layout import node_tables, shape_layout
from solvers.shapes.tables import Tables

SEARCH_RTOL = 1e-9
"""A new placement must beat the best one by this much (relative) to count as better."""


def labellings(cl: Classes, sk: Skeleton, counts: tuple[int, ...]) -> np.ndarray:
    """Problem nodes for the shape's nodes (one row per labelling by the sub-multiset ``counts`` of
    ``cl``'s classes), one labelling per orbit of the shape's automorphisms."""
    lab, occ = class_labels(sk, counts)
    width = max(len(m) for m in cl.members)
    table = np.array([m + [-1] * (width - len(m)) for m in cl.members], dtype=np.int64)
    return table[lab, occ]


class EdgeRelaxation:
    """Rules out labelled shapes many at a time, exactly.

    Shapes that share their intervals differ only in their edges, and each has a subset of the edges of
    the *full* shape with those intervals. Adding edges never lowers a maximum flow, never adds a cut
    node, and never makes an option unusable but through latency and option roles (more paths put more
    micro-batches through a node). So if the full shape with every latency set to zero and every role
    dropped (the same problem otherwise) has no placement of flow >= F for a labelling, no
    shape with those intervals has one for it. The test is the full shape's ``Family.candidates`` and
    ``screen`` (a boundary vector), without its decision: with every latency zero, a boundary
    vector that meets every cut nearly always has options to match (1,939 of 1,939 on 150 gemma-3-27b
    prefill multisets), and keeping a labelling is always safe. A labelling is identified up to the full
    shape's automorphisms and interchangeable nodes; the smallest F at which each was ruled out is kept
    (a larger F is ruled out too), and the largest at which it passed (kept again below it, which is
    always safe)."""

    def __init__(self, problem: PlacementProblem, cl: Classes) -> None:
        free = tuple(  # every latency zero; no roles either: more edges put more micro-batches through a node
            attrs.evolve(
                m,
                lat=np.zeros_like(np.asarray(m.lat, dtype=np.float64)),
                d=np.full(m.size, ANY_DEPTH, np.int64),
                ends=np.full(m.size, BOTH, np.int64),
            )
            for m in problem.menus
        )
        self.tb = Tables(attrs.evolve(problem, menus=free, link_lat=np.zeros_like(problem.link_lat)))
        self.cl = cl
        self.cls = np.zeros(problem.n, np.int64)
        for c, mem in enumerate(cl.members):
            self.cls[mem] = c
        self.base = len(cl.members) + 1
        self.fams: dict[tuple[object, ...], tuple[Family, dict[int, int]]] = {}
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
        if variants(sk.s)[(sk.m, sk.iv)] < 2:
            return None
        return self._code(sk.iv, full_shape(sk.m, sk.iv)[1], labels)

    def open(self, sk: Skeleton, counts: tuple[int, ...], codes: np.ndarray, F: float) -> np.ndarray:
        """Per code, False when it is ruled out at F without a decision: already, at F or below, or now
        because the full shape's labelling fails ``Family.candidates`` at F (recorded)."""
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

    def _candidates(self, sk: Skeleton, counts: tuple[int, ...], F: float) -> tuple[Family, dict[int, int], set[int]]:
        """The full shape's family for ``sk``'s intervals, its row per code, and its candidates at F."""
        fk = (sk.m, sk.iv, counts)
        if fk not in self.fams:
            full, perms = full_shape(sk.m, sk.iv)
            labs = labellings(self.cl, full, counts)
            fam = Family(shape_layout(full), labs, self.tb)
            self.fams[fk] = (fam, {int(x): r for r, x in enumerate(self._code(sk.iv, perms, fam.labels))})
        fam, rows = self.fams[fk]
        ck = (fk, F)
        if ck not in self.cand:
            self.cand = {ck: set(fam.candidates(F).tolist())}
        return fam, rows, self.cand[ck]

    def rules_out(self, sk: Skeleton, counts: tuple[int, ...], code: int, F: float, budget: Budget) -> bool:
        """Whether no shape with ``sk``'s intervals, labelled as ``code`` says, has flow >= F (F > 0)."""
        return not self.keep(sk, counts, [code], F, budget)[0]

    def keep(self, sk: Skeleton, counts: tuple[int, ...], codes: Sequence[int], F: float, budget: Budget) -> list[bool]:
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
            live = {lab.row for lab, _ in screen(fam, [rows[c] for c in ask], F, budget)}
            for code in ask:
                key = (sk.m, sk.iv, code)
                if rows[code] in live:
                    verdict[code] = True
                    self.passed[key] = max(self.passed.get(key, -math.inf), F)
                else:
                    self.out[key] = min(self.out.get(key, math.inf), F)
        return [verdict[code] for code in codes]


def _component_value(tb: Tables, nodes: Sequence[int], w: Witness) -> float:
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
    tb = Tables(problem)
    cl = Classes(problem)
    bud = Budget(budget)
    best: dict[tuple[int, ...], tuple[float, tuple[int, ...], Witness] | None] = {}
    try:
        for counts in cl.subsets():
            s = sum(counts)
            cur: tuple[float, tuple[int, ...], Witness] | None = None
            for sk in skeletons(s):
                fam = Family(shape_layout(sk), labellings(cl, sk, counts), tb)
                for row in range(fam.labels.shape[0]):
                    lab = Labelled(fam, row)
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
    tb: Tables,
    cl: Classes,
    conn: dict[tuple[int, ...], tuple[float, tuple[int, ...], Witness] | None],
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


def _bound(tb: Tables, nodes: Sequence[int]) -> float:
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
    tb: Tables,
    cl: Classes,
    low: dict[tuple[int, ...], tuple[float, tuple[int, ...], Witness] | None],
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


def _threshold(tau: float, cur: tuple[float, tuple[int, ...], Witness] | None) -> float:
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
    tb = Tables(problem)
    cl = Classes(problem)
    relax = EdgeRelaxation(problem, cl)
    subs = cl.subsets()
    zero = tuple(0 for _ in cl.full)
    rep = {c: tuple(m for cc, q in enumerate(c) for m in cl.members[cc][:q]) for c in subs}
    up: dict[tuple[int, ...], float] = {
        c: _bound(tb, rep[c]) if not spanning or c == cl.full else -math.inf for c in subs
    }
    low: dict[tuple[int, ...], tuple[float, tuple[int, ...], Witness] | None] = dict.fromkeys(subs)
    done: set[tuple[int, ...]] = set()
    bud = Budget(budget)
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
                sh = shape_layout(sk)
                if F > 0 and node_tables(sh).cut.size > int((tb.work_cap(comp, F) >= F).sum()):
                    continue  # a cut node carries all of F: too few nodes can (``prefilter``'s first test)
                labels = prefilter(sh, labellings(cl, sk, c), tb, F)
                codes = relax.codes(sk, labels) if labels.shape[0] else None
                if codes is not None:
                    still = relax.open(sk, c, codes, F)
                    labels, codes = labels[still], codes[still]
                if labels.shape[0] == 0:
                    continue
                fam = Family(sh, labels, tb)
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
                    for lab, prep in screen(fam, chunk, f_screen, bud):
                        F = _threshold(tau, cur)
                        pre: Prep | None = prep if f_screen == F else None
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
