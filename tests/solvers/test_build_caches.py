"""The template build's shortcuts against the straightforward computations they replace: the vectorised
``usable_edges``, ``Knapsack``'s kept tables and its first knapsack step, ``reduce_problem``'s skipped
dominance passes, and the build's problem cache with node menus shared across sender classes."""

from __future__ import annotations

import itertools
import math

import attrs
import numpy as np
import pytest

from coral.perf import PerfModel
from coral.workload import Slo, WorkloadShape
from solvers import small
from solvers.chains import Knapsack
from solvers.library import ProblemCache
from solvers.minplus import minplus
from solvers.options import build_problem
from solvers.problem import FIRST, LAST, Edge, NodeMenu, PlacementProblem
from solvers.reduce import dominated, reduce_problem, subset_menu
from solvers.rules import class_reps, lat_tol, usable_edges
from solvers.small import exact_small
from tests.solvers.instances import random_shaped_roles, random_tiny_problem, with_roles


def _problems(seed: int, count: int) -> list[PlacementProblem]:
    """Random tiny problems, some with roles, some with unusable (infinite-latency) links."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(count):
        p = random_tiny_problem(rng, n=int(rng.integers(1, 4)), max_options=int(rng.integers(1, 8)))
        if t % 3 == 1:
            p = with_roles(rng, p)
        if t % 3 == 2:
            p = random_shaped_roles(rng, n=int(rng.integers(1, 4)))
        if rng.random() < 0.3:
            ll = np.asarray(p.link_lat, dtype=np.float64).copy()
            ll[:, rng.integers(0, p.n + 1), rng.integers(0, p.n + 1)] = np.inf
            p = attrs.evolve(p, link_lat=ll)
        out.append(p)
    return out


def _usable_edges_loop(problem: PlacementProblem) -> list[Edge]:
    """``usable_edges`` by its definition, one candidate edge at a time."""
    n = problem.n
    limit = np.asarray(problem.lat_limit, dtype=np.float64)
    ll = np.asarray(problem.link_lat, dtype=np.float64)
    minlat = [np.asarray(m.lat).min(axis=1) if m.size else np.full(len(limit), np.inf) for m in problem.menus]
    tol = lat_tol(limit)
    cand = [(n, i) for i in range(n)] + [(i, j) for i in range(n) for j in range(n) if i != j]
    out = []
    for u, v in [*cand, *((i, n) for i in range(n))]:
        x = ll[:, u, v]
        lu = minlat[u] if u < n else 0.0
        lv = minlat[v] if v < n else 0.0
        if np.isfinite(x).all() and np.all(x + lu + lv <= limit + tol):
            out.append((u, v))
    return out


def test_usable_edges_equals_the_loop() -> None:
    problems = _problems(31, 300)
    some = 0
    for p in problems:
        want = _usable_edges_loop(p)
        assert usable_edges(p) == want
        some += 0 < len(want) < p.n * (p.n + 1)
    assert some > 30  # problems where some edges are usable and some are not


def _table_direct(kn: Knapsack, i: int, c: float, role: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """Per k <= L: the least scalar latency (then the first in the sorted order) over node i's options
    with capacity >= c that ``role`` allows, its latency vector and its option index."""
    menu = kn.p.menus[i]
    lat = np.asarray(menu.lat, dtype=np.float64)
    s = kn.w @ lat
    g, gv, gi = np.full(kn.L + 1, np.inf), np.full((lat.shape[0], kn.L + 1), np.inf), np.full(kn.L + 1, -1)
    ok = np.asarray(menu.cap) >= c
    if kn.roles:
        ok &= menu.allowed(*role)
    for k in range(kn.L + 1):
        opts = np.flatnonzero(ok & (np.asarray(menu.k) == k))
        if opts.size:
            o = min(opts, key=lambda x: (s[x], x))  # ties: the lower index, as the stable sort keeps it
            g[k], gv[:, k], gi[k] = s[o], lat[:, o], o
    return g, gv, gi


def _solve_direct(kn: Knapsack, nodes: tuple[int, ...], c: float) -> tuple[float, tuple[int, ...]] | None:
    """The least scalar latency of a chain over ``nodes`` (k summing to L), by min-plus steps from the
    empty chain, and its options (None when no chain covers L)."""
    L = kn.L
    D = np.full(L + 1, np.inf)
    D[0] = 0.0
    steps = []
    for pos, i in enumerate(nodes):
        ends = (FIRST if pos == 0 else 0) | (LAST if pos == len(nodes) - 1 else 0)
        g, _, gi = _table_direct(kn, i, c, (len(nodes), ends))
        D, arg = minplus(D, g)
        steps.append((arg, gi))
    if not math.isfinite(D[L]):
        return None
    pos, opts = L, []
    for arg, gi in reversed(steps):
        prev = int(arg[pos])
        opts.append(int(gi[pos - prev]))
        pos = prev
    return float(D[L]), tuple(reversed(opts))


def test_knapsack_tables_and_solve_equal_the_direct_computation() -> None:
    """Every kept table equals the direct one (asked twice: the second answer is the kept one; with
    ``rep``, interchangeable nodes share theirs), and ``solve``'s chain has the direct least latency and
    options, for every order of every node subset."""
    found = 0
    for p in _problems(32, 50):
        nm = p.num_metrics
        for w, rep in itertools.product([*np.eye(nm), np.ones(nm)], (None, class_reps(p))):
            kn = Knapsack(p, w, rep)
            caps = np.unique(np.concatenate([np.asarray(m.cap, dtype=np.float64) for m in p.menus]))
            for c in [float(caps[0]), float(caps[len(caps) // 2]), float(caps[-1])]:
                for r in range(1, p.n + 1):
                    for nodes in itertools.permutations(range(p.n), r):
                        for i in nodes:
                            for role in ((r, FIRST), (r, 0), (r, LAST), (r, FIRST | LAST)):
                                for _ in range(2):
                                    got = kn.table(i, c, role)
                                    for x, y in zip(got, _table_direct(kn, i, c, role), strict=True):
                                        assert np.array_equal(x, y)
                        want = _solve_direct(kn, nodes, c)
                        sol = kn.solve(nodes, c, np.full(nm, np.inf))
                        assert (sol is None) == (want is None)
                        if sol is not None and want is not None:
                            found += 1
                            assert sol[0] == want[1]
                            assert sum(sol[1]) == kn.L
    assert found > 40


def test_reduce_leaves_no_dominated_option() -> None:
    """``reduce_problem`` skips a node's dominance pass when its capacities did not change since the last
    one: what it returns must still have no option dominated at its capacities (when every metric was
    kept, so that the comparison is the one the reduction made)."""
    checked = 0
    for p in _problems(33, 400):
        red = reduce_problem(p)
        if red is None or red.problem.num_metrics != p.num_metrics:
            continue
        for m in red.problem.menus:
            cap = np.asarray(m.cap, dtype=np.float64)
            assert not dominated(np.asarray(m.k), cap, np.asarray(m.lat), np.asarray(m.d), np.asarray(m.ends)).any()
            checked += m.size > 1
    assert checked > 100


@pytest.mark.slow
def test_problem_cache_shares_menus_across_sender_classes(perf: PerfModel) -> None:
    """Caches of several decode sender classes that share their node menus (as the build's do) give
    ``build_problem``'s problems at every class, whichever class asked first."""
    slo, shape = Slo(1.0, 0.05, 0.9), WorkloadShape(2048, 28)
    nics = sorted({perf.catalog.nodes[t].nic_bytes_per_s for t in perf.catalog.nodes})
    parts: dict = {}
    caches = {s: ProblemCache(perf, "qwen3-14b", "decode", slo, shape, s, parts=parts) for s in (None, *nics[:2])}
    types = sorted(perf.catalog.nodes)[:6]
    rng = np.random.default_rng(5)
    for t in range(9):
        nodes = [str(x) for x in rng.choice(types, size=1 + t % 4)]
        for s in (nics[1], None, nics[0]) if t % 2 else (None, nics[0], nics[1]):
            a, b = build_problem(perf, "qwen3-14b", nodes, "decode", slo, shape, s), caches[s].problem(nodes)
            for f in ("link_lat", "link_cap", "lat_limit"):
                assert np.array_equal(getattr(a, f), getattr(b, f)), (s, nodes, f)
            for x, y in zip(a.menus, b.menus, strict=True):
                for f in ("k", "b", "cap", "lat", "mem", "d", "ends"):
                    assert np.array_equal(getattr(x, f), getattr(y, f)), (s, nodes, f)
    assert parts  # the classes did share them


def test_exact_small_skips_only_symmetric_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    """``exact_small`` solves a shape only once per swap of interchangeable nodes: its answer (value,
    options, starts, flows) is the one it gives when every shape is solved (no node taken as
    interchangeable), and the shapes it solves are worth the same set of values, on problems that repeat a
    node kind."""
    rng = np.random.default_rng(34)
    seen: list[set[float]] = []
    plain = small._Small.candidates

    def candidates(self: small._Small, chain3: list) -> list:
        out = plain(self, chain3)
        seen.append({c[0] for c in out})
        return out

    monkeypatch.setattr(small._Small, "candidates", candidates)
    twins = 0
    for t in range(300):
        if t % 3 == 2:
            p = random_shaped_roles(rng, n=3)
        else:
            p = random_tiny_problem(rng, n=3, max_options=int(rng.integers(2, 8)))
            p = with_roles(rng, p) if t % 3 else p
        seen.clear()
        got = exact_small(p)
        values = seen[-1]
        with monkeypatch.context() as m:
            m.setattr(small, "class_reps", lambda q: list(range(q.n)))
            want = exact_small(p)
        assert got == want
        assert values == seen[-1]
        twins += len(set(class_reps(p))) < 3 and len(values) > 2
    assert twins > 30


def test_exact_small_tries_each_order_of_twins() -> None:
    """Two interchangeable nodes A and a third node B, one layer each: no link from A to B, so the only
    placement is the chain B, A, A (an order that a cruder symmetry rule, one chain per multiset of
    kinds, would skip)."""
    a = NodeMenu(k=np.array([1]), b=np.array([1]), cap=np.array([5.0]), lat=np.array([[0.1]]), mem=np.array([1.0]))
    b = attrs.evolve(a, cap=np.array([3.0]))
    ll = np.zeros((1, 4, 4))
    ll[:, [0, 1], 2] = np.inf
    p = PlacementProblem(3, ("A", "A", "B"), (a, a, b), ll, np.full((4, 4), np.inf), np.array([1.0]))
    assert class_reps(p) == [0, 0, 2]
    res = exact_small(p)
    assert res is not None and res.status == "optimal" and res.value == 3.0
    assert res.start[2] == 0 and sorted(res.start[:2]) == [1, 2]


def test_minplus_equals_its_definition() -> None:
    """out[q] = min over p <= q of a[p] + b[q - p] and the least such p, with infinities and ties."""
    rng = np.random.default_rng(35)
    for _ in range(300):
        L = int(rng.integers(0, 12))
        a, b = (rng.integers(0, 5, size=L + 1).astype(np.float64) for _ in range(2))
        a[rng.random(L + 1) < 0.3] = np.inf
        b[rng.random(L + 1) < 0.3] = np.inf
        out, arg = minplus(a, b)
        for q in range(L + 1):
            sums = [a[p] + b[q - p] for p in range(q + 1)]
            assert out[q] == min(sums) and arg[q] == int(np.argmin(sums))


def test_dropping_dominated_options_keeps_the_usable_edges() -> None:
    """``reduce_problem`` keeps its usable edges across a dominance pass: an option dominated at clipped
    capacities has latencies at least an undominated one's, so no node's least latency changes."""
    dropped = 0
    for p in _problems(36, 300):
        cap = min(float(np.max(m.cap)) for m in p.menus if m.size) / 2
        menus = []
        for m in p.menus:
            c = np.minimum(np.asarray(m.cap, dtype=np.float64), cap)
            drop = dominated(np.asarray(m.k), c, np.asarray(m.lat), np.asarray(m.d), np.asarray(m.ends))
            dropped += int(drop.sum())
            menus.append(subset_menu(m, ~drop, c))
        assert usable_edges(attrs.evolve(p, menus=tuple(menus))) == usable_edges(p)
    assert dropped > 100
