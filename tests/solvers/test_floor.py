"""The placers' ``floor``: stop once no placement can beat it, exact above it (against brute force)."""

from __future__ import annotations

import itertools
import math

import attrs
import numpy as np
import pytest

from coral.perf import PerfModel
from coral.workload import Slo, WorkloadShape
from solvers import fastplace, library
from solvers.bounds import work_fixed_point
from solvers.brute import brute_force_place
from solvers.combos import layer_work_bound
from solvers.fastplace import place
from solvers.library import ProblemCache, place_one_batch, restrict_batch
from solvers.problem import PlacementProblem, PlacementResult
from solvers.rules import evaluate_placement
from solvers.shapes import shape_search

from .instances import random_tiny_problem

RTOL = 1e-6


def _check(p: PlacementProblem, ref: PlacementResult, res: PlacementResult, floor: float) -> str:
    """``res`` (placed with ``floor``) is the exact optimum when that beats the floor, else either the
    exact optimum or status ``below`` with a bound that is valid and no more than the floor."""
    best = ref.value if ref.status == "optimal" else 0.0
    if res.status == "below":
        assert best <= floor * (1 + 1e-9), (ref, res, floor)
        assert best <= res.bound * (1 + RTOL) + 1e-12
        assert res.bound <= floor
        assert res.value == 0.0 and res.option == ()
        return "below"
    assert res.status == ref.status, (ref, res, floor)
    assert res.value == pytest.approx(best, rel=RTOL, abs=1e-12)
    if res.status == "optimal":
        ev = evaluate_placement(p, res.option, res.start, res.flows.keys())
        assert ev is not None and ev[0] == pytest.approx(res.value, rel=RTOL, abs=1e-9)
    return "exact"


def _floors(best: float) -> list[float]:
    return [f for f in (best * 0.5, best * 0.999, best, best * 1.001, best * 2.0, 1e-3) if f > 0]


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2))])  # fast tier: seed 0
def test_place_with_floor_agrees_with_brute_force(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """n 1..4: at floors below, at and above the optimum; the shape search cut short (budget 30), the
    residue path (LP fixing, MILP) and the LP bound first (``lp_floor``, here from 4 nodes) honour the
    floor too."""
    monkeypatch.setattr(fastplace, "LP_FLOOR_NODES", 4)
    rng = np.random.default_rng(9100 + seed)
    seen: set[str] = set()
    for t in range(16):
        n = 1 + t % 4
        p = random_tiny_problem(rng, n=n, num_layers=int(rng.integers(2, 7)), max_options=int(rng.integers(1, 5)))
        ref = brute_force_place(p)
        for floor in _floors(ref.value if ref.status == "optimal" else 1.0):
            for kw in ({}, {"shape_budget": 30}, {"shape_budget": 0}, {"lp_floor": True}):
                seen.add(_check(p, ref, place(p, floor=floor, **kw), floor))
    assert seen == {"below", "exact"}


@pytest.mark.slow
def test_lp_floor_proves_floors_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """``lp_floor`` (here from 4 nodes): the LP relaxation's bound settles some floors before any search
    ("lp-proven", checked against brute force); ``place_one_batch`` with it agrees with the plain one.
    Below ``LP_FLOOR_NODES`` it is not tried."""
    monkeypatch.setattr(fastplace, "LP_FLOOR_NODES", 4)
    rng = np.random.default_rng(9900)
    by_lp = 0
    for _ in range(60):
        p = random_tiny_problem(rng, n=4, num_layers=int(rng.integers(3, 7)), max_options=int(rng.integers(1, 4)))
        ref = brute_force_place(p)
        best = ref.value if ref.status == "optimal" else 0.0
        for floor in _floors(best if best > 0 else 1.0):
            res = place(p, floor=floor, lp_floor=True)
            _check(p, ref, res, floor)
            if res.method == "lp-proven":
                by_lp += 1
                with monkeypatch.context() as m:
                    m.setattr(fastplace, "LP_FLOOR_NODES", 5)
                    assert place(p, floor=floor, lp_floor=True).method != "lp-proven"
            one = restrict_batch(p, int(p.menus[0].b[0]))  # a single batch size: the LP's verdict is the batch's
            if one is None:
                continue
            _, batch = place_one_batch(one, floor=floor, lp_floor=True)
            _, plain = place_one_batch(one, floor=floor)
            if "below" in (batch.status, plain.status):  # at most the floor, either way
                assert max(batch.value, plain.value) <= floor * (1 + 1e-9)
            else:
                assert (batch.status, batch.value) == (plain.status, pytest.approx(plain.value, rel=1e-12))
    assert by_lp >= 5


def test_place_one_batch_names_lp_proofs(monkeypatch: pytest.MonkeyPatch) -> None:
    """When ``place`` proves every batch size below the floor by the LP bound alone, the batch result's
    method is "below-lp" (the build's "lp-pruned"); ``lp_floor`` is passed on."""
    p = random_tiny_problem(np.random.default_rng(5), n=4)
    asked: list[bool] = []

    def lp_only(sub: PlacementProblem, *, time_limit: float, floor: float | None = None, spanning: bool = False,
                lp_floor: bool = False) -> PlacementResult:  # fmt: skip
        asked.append(lp_floor)
        assert floor is not None
        return PlacementResult(0.0, "below", floor * 0.5, "lp-proven")

    monkeypatch.setattr(library, "place", lp_only)
    _, res = place_one_batch(p, floor=1e-9, placer=lp_only, lp_floor=True)
    assert (res.status, res.method) == ("below", "below-lp") and asked and all(asked)


@pytest.mark.parametrize("seed", range(3))
def test_shape_search_with_floor(seed: int) -> None:
    """The shape search alone: above the floor it is exact; at or over the optimum it reports ``below``
    with the floor as its bound (and any placement it kept is valid and no better than the floor)."""
    rng = np.random.default_rng(9200 + seed)
    below = 0
    for t in range(16):
        n = 2 + t % 3
        p = random_tiny_problem(rng, n=n, num_layers=int(rng.integers(2, 7)), max_options=int(rng.integers(1, 5)))
        ref = brute_force_place(p)
        if ref.status != "optimal" or ref.value <= 0:
            continue
        for floor in _floors(ref.value):
            res = shape_search(p, floor=floor)
            assert res is not None
            if res.status == "below":
                below += 1
                assert ref.value <= floor * (1 + 1e-9) and res.bound == floor
                if res.option:
                    ev = evaluate_placement(p, res.option, res.start, res.flows.keys())
                    assert ev is not None and ev[0] <= floor * (1 + 1e-9)
            else:
                assert res.status == "optimal" and res.value == pytest.approx(ref.value, rel=RTOL)
    assert below > 0


@pytest.mark.parametrize("seed", range(2))
def test_one_batch_with_floor(seed: int) -> None:
    """``place_one_batch`` with a floor: the best over batch sizes when it beats the floor, else ``below``
    (or that exact best); a bad floor is refused."""
    rng = np.random.default_rng(9300 + seed)
    seen: set[str] = set()
    for _ in range(20):
        p = random_tiny_problem(rng, max_options=int(rng.integers(2, 7)))
        best = 0.0
        for b in sorted({int(x) for m in p.menus for x in m.b}):
            sub = restrict_batch(p, b)
            if sub is not None and (r := brute_force_place(sub)).status == "optimal":
                best = max(best, r.value)
        ref = PlacementResult(best, "optimal" if best > 0 else "infeasible", best, "brute")
        for floor in _floors(best if best > 0 else 1.0):
            sub, res = place_one_batch(p, floor=floor)
            seen.add(_check(sub, ref, res, floor))
    assert seen == {"below", "exact"}
    p = random_tiny_problem(rng)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="floor"):
            place_one_batch(p, floor=bad)
        with pytest.raises(ValueError, match="floor"):
            place(p, floor=bad)


def test_work_fixed_point_is_a_tight_valid_bound() -> None:
    """No flow above the fixed point satisfies the layer-work inequality, and flows just below it do
    (seeded random menus, with zero capacities and ties where the work equals the flow)."""
    rng = np.random.default_rng(9400)
    for _ in range(1500):
        L = int(rng.integers(1, 9))
        ks = [rng.integers(1, L + 1, size=int(rng.integers(1, 5))) for _ in range(int(rng.integers(1, 5)))]
        cs = [rng.uniform(0, 10, size=k.size) * (rng.random() < 0.9) for k in ks]
        u = work_fixed_point(ks, cs, L)

        def h(F: float, ks: list[np.ndarray] = ks, cs: list[np.ndarray] = cs, L: int = L) -> float:
            return sum(float(np.max(k * np.minimum(c, F))) for k, c in zip(ks, cs, strict=True)) / L

        Fs = np.linspace(u, 2 * u + 1, 40)[1:]
        # h at every F at once: the same terms, summed in the same order as h
        hs = sum(np.max(k * np.minimum(c, Fs[:, None]), axis=1) for k, c in zip(ks, cs, strict=True)) / L
        assert (hs < Fs).all(), (ks, cs, L, Fs[hs >= Fs])
        assert u == 0.0 or h(u * (1 - 1e-6)) >= u * (1 - 1e-6) * (1 - 1e-9)
    assert work_fixed_point([np.array([6])], [np.array([3.5])], 6) == pytest.approx(3.5)
    assert work_fixed_point([np.zeros(0, np.int64)], [np.zeros(0)], 4) == 0.0


def test_layer_work_bound_is_valid() -> None:
    """``layer_work_bound`` is at least the brute-force optimum, and 0 when the nodes cannot hold L layers
    all together (then no placement exists)."""
    rng = np.random.default_rng(9500)
    zero = 0
    for _ in range(120):
        p = random_tiny_problem(rng, max_options=int(rng.integers(1, 5)))
        ref = brute_force_place(p)
        ub = layer_work_bound(p)
        if ref.status == "optimal":
            assert ub >= ref.value * (1 - 1e-9)
        if sum(int(np.max(m.k)) for m in p.menus) < p.num_layers:
            assert ub == 0.0 and ref.status == "infeasible"
            zero += 1
    assert zero > 0


def test_layer_work_bound_counts_the_end_edges() -> None:
    """An option whose latency fits the limit but not with the cheapest source and sink edges added
    carries no flow: the bound leaves it out (and is 0 when that leaves a node with nothing), and stays
    valid against brute force on instances where the end edges take most of the limit."""
    rng = np.random.default_rng(9600)
    tighter = 0
    for _ in range(150):
        p = random_tiny_problem(rng, max_options=int(rng.integers(1, 5)))
        n = p.n
        ll = np.array(p.link_lat)
        ll[:, n, :n] += rng.uniform(0.0, 1.0) * p.lat_limit[:, None]
        p = attrs.evolve(p, link_lat=ll)
        ref = brute_force_place(p)
        ub = layer_work_bound(p)
        if ref.status == "optimal":
            assert ub >= ref.value * (1 - 1e-9)
        plain = layer_work_bound(attrs.evolve(p, link_lat=np.zeros_like(ll)))
        if ub < plain * (1 - 1e-9):
            tighter += 1
    assert tighter > 10


def test_decode_with_a_kv_transfer_beyond_the_tpot_is_settled_by_the_bound(perf: PerfModel) -> None:
    """qwen3-14b decode at the code shape on nodes with slow NICs (10-16 Gbps): the KV cache of a 2,048-token
    prompt over the entry node's own NIC, spread over the short-output quantile's steps, exceeds the 50 ms
    TPOT on the source edge alone. Every batch size's bound is 0, so a build settles each multiset without
    placing it, and the placer, asked anyway, agrees that nothing is feasible."""
    slo, shape = Slo(1.0, 0.05, 0.9), WorkloadShape(2048, 28)
    cache = ProblemCache(perf, "qwen3-14b", "decode", slo, shape)
    for nodes in (["gpu_1x_h100_sxm5"], ["g6.xlarge", "g5.xlarge"], ["Standard_NC4as_T4_v3"] * 2):
        p = cache.problem(nodes)
        assert p.link_lat[0, p.n, 0] > p.lat_limit[0]
        assert set(cache.batch_bounds(nodes).values()) == {0.0}
        for b in sorted(set(p.menus[0].b.tolist())):
            sub = restrict_batch(p, b)
            assert sub is None or place(sub).status == "infeasible"


def _nodes_only(p: PlacementProblem, keep: tuple[int, ...]) -> PlacementProblem:
    """``p`` restricted to the nodes ``keep`` (the source and sink stay the last index)."""
    idx = [*keep, p.n]
    ll, lc = np.asarray(p.link_lat), np.asarray(p.link_cap)
    return attrs.evolve(
        p,
        kinds=tuple(p.kinds[i] for i in keep),
        menus=tuple(p.menus[i] for i in keep),
        link_lat=ll[:, idx][:, :, idx],
        link_cap=lc[idx][:, idx],
    )


def _best_split(p: PlacementProblem) -> float:
    """The best placement with two or more components: max over splits A + B of OPT(A) + OPT(B) (each
    brute-forced, 0 when infeasible: a split whose part cannot be placed is no placement)."""
    opt: dict[tuple[int, ...], float] = {}
    for r in range(1, p.n):
        for keep in itertools.combinations(range(p.n), r):
            ref = brute_force_place(_nodes_only(p, keep))
            opt[keep] = ref.value if ref.status == "optimal" else -math.inf
    best = 0.0
    for keep, v in opt.items():
        rest = tuple(i for i in range(p.n) if i not in keep)
        best = max(best, v + opt[rest])
    return best


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])  # fast tier: seed 0
def test_spanning_search_above_the_best_split(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``spanning``: with a floor at least the best placement of several components (as a template
    build's floor is), searching only connected placements of all the nodes is still exact above the
    floor and ``below`` otherwise, against brute force. Four-node instances (the shape search's size),
    kept until 8 of them have a connected optimum above their best split."""
    rng = np.random.default_rng(9700 + seed)
    seen: set[str] = set()
    connected = 0
    for _ in range(300):
        p = random_tiny_problem(rng, n=4, num_layers=int(rng.integers(3, 7)), max_options=int(rng.integers(1, 4)))
        ref = brute_force_place(p)
        split = _best_split(p)
        best = ref.value if ref.status == "optimal" else 0.0
        connected += best > split * (1 + 1e-6)
        floors = {f for f in (*_floors(best if best > 0 else 1.0), split, split * 1.001) if f >= split and f > 0}
        for floor in sorted(floors):
            for kw in ({}, {"shape_budget": 30}, {"lp_floor": True}):
                with monkeypatch.context() as m:
                    m.setattr(fastplace, "LP_FLOOR_NODES", 4)
                    seen.add(_check(p, ref, place(p, floor=floor, spanning=True, **kw), floor))
        if connected >= 8:
            break
    assert connected >= 8 and seen == {"below", "exact"}
    p = random_tiny_problem(rng)
    with pytest.raises(ValueError, match="spanning"):
        place(p, spanning=True)
    with pytest.raises(ValueError, match="spanning"):
        place_one_batch(p, spanning=True)
