"""Placement solvers: brute force, the reference MILP and the fast exact method agree, exactly."""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest

from solvers.brute import brute_force_place, max_flow
from solvers.chains import pipeline_dp
from solvers.fastplace import place
from solvers.placement import lp_reduce, milp_place
from solvers.problem import NodeMenu, PlacementInputError, PlacementProblem, PlacementResult, check_problem
from solvers.reduce import reduce_problem
from solvers.rules import evaluate_placement, stages_of
from solvers.shapes import exhaustive_shapes, shape_search, skeletons
from solvers.small import exact_small
from tests.solvers.instances import branching_problem, fork_problem, random_mid_problem, random_tiny_problem

RTOL = 1e-6


def _same(a: PlacementResult, b: PlacementResult) -> bool:
    if a.status != b.status:
        return False
    return abs(a.value - b.value) <= RTOL * max(abs(a.value), abs(b.value)) + 1e-12


def _check_placement(problem: PlacementProblem, res: PlacementResult) -> None:
    """A reported placement is valid and worth exactly what it claims."""
    if res.status == "infeasible":
        assert res.option == ()
        return
    ev = evaluate_placement(problem, res.option, res.start, res.flows.keys())
    assert ev is not None
    assert ev[0] == pytest.approx(res.value, rel=RTOL, abs=1e-9)
    assert sum(f for (u, _), f in res.flows.items() if u == problem.n) == pytest.approx(res.value, rel=1e-6, abs=1e-9)


TINY_SEEDS = range(8)


@pytest.mark.parametrize("seed", TINY_SEEDS)
def test_tiny_instances_agree_with_brute_force(seed: int) -> None:
    """30 instances per seed (240 in all): L 2..8, n 1..3, random menus, limits and link capacities."""
    rng = np.random.default_rng(1000 + seed)
    statuses = set()
    for _ in range(30):
        p = random_tiny_problem(rng, max_options=int(rng.integers(1, 7)))
        ref = brute_force_place(p)
        statuses.add(ref.status)
        agree_with_brute(p, ref)
    assert statuses == {"optimal", "infeasible"}


LIMIT = 600.0
"""The placers' time limit on the tiny random instances: a guard against a hang, far above the under 1 s
that each needs alone. HiGHS counts wall time, and at load 15-20 the default 10 s once left a MILP
'feasible' (not proven), which these exactness checks refuse."""


def agree_with_brute(p: PlacementProblem, ref: PlacementResult, *more: PlacementResult) -> None:
    """``place``, the MILP (with and without its warm start and symmetry rows) and ``more`` all match the
    brute-force ``ref`` and prove it; the chain family never beats it."""
    exact = (place(p, time_limit=LIMIT), milp_place(p, time_limit=LIMIT))
    for res in (*exact, milp_place(p, warm_start=False, symmetry=False, time_limit=LIMIT), *more):
        assert _same(ref, res), (ref, res)
        assert res.status in ("optimal", "infeasible")
        _check_placement(p, res)
    dp = pipeline_dp(p)
    if dp.status == "feasible":
        _check_placement(p, dp)
        assert dp.value <= ref.value * (1 + 1e-9) + 1e-9


@pytest.mark.parametrize("seed", range(3))
def test_four_node_instances_agree_with_brute_force(seed: int) -> None:
    """n = 4: ``place`` (chain DP, then the shape search) and its residue path (LP fixing and MILP,
    with the shape search switched off) both match brute force."""
    rng = np.random.default_rng(2000 + seed)
    methods = set()
    for _ in range(15):
        p = random_tiny_problem(rng, n=4, num_layers=int(rng.integers(2, 7)), max_options=int(rng.integers(1, 5)))
        ref = brute_force_place(p)
        fast = place(p, time_limit=LIMIT)
        residue = place(p, shape_budget=0, time_limit=LIMIT)
        cut_short = place(p, shape_budget=30, time_limit=LIMIT)  # the shape search runs out: its best and bound go on
        methods.add(fast.method)
        for res in (fast, residue, cut_short):
            assert _same(ref, res), (ref, res)
            assert res.status in ("optimal", "infeasible")
            _check_placement(p, res)
        assert residue.method in ("reduce", "dp-proven", "lp-proven", "milp")
    assert "shapes" in methods


@pytest.mark.parametrize("seed", range(4))
def test_shape_search_agrees_with_brute_force(seed: int) -> None:
    """The shape search on its own (no incumbent, no reductions), and its unpruned reference version, are
    exact: n 1..4, L 2..8 (n = 4: L <= 6)."""
    rng = np.random.default_rng(3000 + seed)
    for t in range(20):
        n = 1 + t % 4
        L = int(rng.integers(2, 7 if n == 4 else 9))
        p = random_tiny_problem(rng, n=n, num_layers=L, max_options=int(rng.integers(1, 6)))
        ref = brute_force_place(p)
        res = shape_search(p)
        full = exhaustive_shapes(p)  # every component of every sub-multiset, without the pruning
        for r in (res, full):
            assert r is not None
            assert _same(ref, r), (ref, r)
            _check_placement(p, r)


@pytest.mark.parametrize("seed", range(2))
def test_four_node_shapes_match_milp(seed: int) -> None:
    """n = 4 with L up to 8 and two metrics, beyond quick brute force: ``place`` matches the reference
    MILP wherever the MILP proves its answer (and it proves most of these)."""
    rng = np.random.default_rng(4000 + seed)
    proven = 0
    for _ in range(8):
        p = random_tiny_problem(rng, n=4, num_layers=int(rng.integers(6, 9)), max_options=5)
        fast = place(p)
        assert fast.status in ("optimal", "infeasible")
        _check_placement(p, fast)
        ref = milp_place(p, time_limit=30.0)
        if ref.proven:
            proven += 1
            assert _same(ref, fast), (ref, fast)
        else:
            assert fast.value >= ref.value * (1 - RTOL)
    assert proven >= 6


@pytest.mark.slow
def test_five_and_six_nodes_match_milp() -> None:
    """Five and six nodes on small random problems: wherever ``place`` needs the shape search, it
    matches the reference MILP's proven optimum (or does at least as well when the MILP stops early)."""
    rng = np.random.default_rng(19)
    agree = 0
    for t in range(24):
        n = 5 + t % 2
        p = random_tiny_problem(rng, n=n, num_layers=int(rng.integers(n, n + 3)), max_options=4)
        fast = place(p)
        assert fast.status in ("optimal", "infeasible")
        _check_placement(p, fast)
        if fast.method != "shapes":
            continue
        ref = milp_place(p, time_limit=20.0)
        if ref.proven:
            assert _same(ref, fast), (ref, fast)
            agree += fast.value > 0
        else:
            assert fast.value >= ref.value * (1 - RTOL)
    assert agree >= 8


def test_shape_search_out_of_budget_is_unproven() -> None:
    """A budget too small to finish gives the best placement known, marked unproven, with a valid bound."""
    rng = np.random.default_rng(23)
    seen = 0
    for _ in range(30):
        p = random_tiny_problem(rng, n=4, num_layers=6, max_options=5, style="perf")
        ref = brute_force_place(p)
        res = shape_search(p, budget=20)
        if res is None or res.status != "feasible":
            continue
        seen += 1
        _check_placement(p, res)
        assert res.value <= ref.value * (1 + RTOL) + 1e-12
        assert res.bound >= ref.value * (1 - RTOL)
    assert seen >= 3


def test_skeleton_catalogue() -> None:
    """Connected shapes up to relabelling: 1, 1, 3, 10, 45, 249 for 1..6 nodes."""
    assert [len(skeletons(s)) for s in range(1, 7)] == [1, 1, 3, 10, 45, 249]
    with pytest.raises(ValueError, match="s must be"):
        skeletons(0)


def test_four_node_fork_is_found() -> None:
    """One node feeding three is the unique optimum (15); chains and replicas reach only 10."""
    p = fork_problem()
    assert pipeline_dp(p).value == pytest.approx(10.0)
    for res in (brute_force_place(p), milp_place(p), place(p)):
        assert res.status == "optimal"
        assert res.value == pytest.approx(15.0)
        assert stages_of(p, res) == [(0, 0, 4, 0), (1, 4, 8, 0), (2, 4, 8, 0), (3, 4, 8, 0)]
        assert {e for e, f in res.flows.items() if f > 0} == {(4, 0), (0, 1), (0, 2), (0, 3), (1, 4), (2, 4), (3, 4)}
    assert place(p).method == "shapes"


def test_branching_shape_is_found() -> None:
    """One node holding layers 0..3 feeding two nodes holding 4..7 is the unique optimum (10)."""
    p = branching_problem()
    for res in (brute_force_place(p), milp_place(p), milp_place(p, warm_start=False), place(p)):
        assert res.status == "optimal"
        assert res.value == pytest.approx(10.0)
        assert stages_of(p, res) == [(0, 0, 4, 0), (1, 4, 8, 0), (2, 4, 8, 0)]
        assert set(res.flows) == {(3, 0), (0, 1), (0, 2), (1, 3), (2, 3)}
    dp = pipeline_dp(p)
    assert dp.value == pytest.approx(8.0)  # replicas of chains cannot do better


def test_zero_flow_node_is_allowed() -> None:
    """A node may hang off the graph carrying nothing, as long as its paths meet the limits."""
    p = branching_problem()
    small = attrs.evolve(p.menus[1], cap=np.array([0.0]))
    q = attrs.evolve(p, menus=(p.menus[0], small, p.menus[2]))
    for res in (brute_force_place(q), milp_place(q), place(q)):
        assert res.value == pytest.approx(5.0)
        _check_placement(q, res)


def test_mid_size_fast_matches_milp() -> None:
    rng = np.random.default_rng(7)
    for n, L, nm in ((2, 14, 1), (3, 12, 1), (3, 10, 2), (4, 8, 1)):
        p = random_mid_problem(rng, n=n, num_layers=L, num_metrics=nm)
        fast = place(p)
        ref = milp_place(p, time_limit=60.0)
        assert ref.status == "optimal"
        assert _same(ref, fast), (ref, fast)
        _check_placement(p, fast)


def test_reductions_keep_the_optimum() -> None:
    rng = np.random.default_rng(11)
    for _ in range(40):
        p = random_tiny_problem(rng, max_options=6)
        ref = brute_force_place(p)
        red = reduce_problem(p)
        if red is None:
            assert ref.status == "infeasible"
            continue
        assert ref.value <= red.ub * (1 + 1e-9) + 1e-9
        sub = brute_force_place(red.problem)
        assert _same(ref, sub)
        for i, menu in enumerate(red.problem.menus):
            assert np.all(menu.k == p.menus[i].k[red.index[i]])


def test_lp_reduce_keeps_better_placements() -> None:
    rng = np.random.default_rng(5)
    for _ in range(20):
        p = random_tiny_problem(rng, n=3, max_options=5)
        ref = brute_force_place(p)
        if ref.status != "optimal" or ref.value <= 0:
            continue
        bound, keep, edges = lp_reduce(p, ref.value * 0.5, symmetry=False)
        assert bound >= ref.value * (1 - 1e-7)
        for i, o in enumerate(ref.option):
            assert keep[i][o]
        assert set(ref.flows) <= edges


def test_exact_small_scope() -> None:
    rng = np.random.default_rng(3)
    assert exact_small(random_tiny_problem(rng, n=4, num_layers=4)) is None
    for _ in range(20):  # two latency metrics: three-node chains are enumerated
        q = random_tiny_problem(rng, n=3, num_metrics=2, max_options=6)
        res = exact_small(q)
        assert res is not None and _same(brute_force_place(q), res)


def test_single_node_and_replicas() -> None:
    menu = NodeMenu(
        k=np.array([2, 2, 1]),
        b=np.array([1, 2, 1]),
        cap=np.array([3.0, 5.0, 9.0]),
        lat=np.array([[1.0, 2.5, 0.4]]),
        mem=np.ones(3),
    )
    one = PlacementProblem(2, ("a",), (menu,), np.zeros((1, 2, 2)), np.full((2, 2), np.inf), np.array([2.0]))
    for res in (brute_force_place(one), milp_place(one), place(one)):
        assert res.status == "optimal" and res.value == pytest.approx(3.0)
        assert stages_of(one, res) == [(0, 0, 2, 0)]
    two = PlacementProblem(2, ("a", "a"), (menu, menu), np.zeros((1, 3, 3)), np.full((3, 3), np.inf), np.array([2.0]))
    for res in (brute_force_place(two), milp_place(two), place(two)):
        assert res.value == pytest.approx(9.0)  # a two-stage chain of k = 1 options beats 3 + 3


def test_infeasible_when_no_option_covers() -> None:
    menu = NodeMenu(k=np.array([1]), b=np.array([1]), cap=np.array([1.0]), lat=np.array([[0.1]]), mem=np.ones(1))
    p = PlacementProblem(3, ("a",), (menu,), np.zeros((1, 2, 2)), np.full((2, 2), np.inf), np.array([1.0]))
    for res in (brute_force_place(p), milp_place(p), place(p)):
        assert res.status == "infeasible" and res.value == 0.0 and res.proven
        assert stages_of(p, res) == []


def test_evaluate_placement_rejects_broken_placements() -> None:
    p = branching_problem()
    good = [(3, 0), (0, 1), (0, 2), (1, 3), (2, 3)]
    assert evaluate_placement(p, (0, 0, 0), (0, 4, 4), good) is not None
    assert evaluate_placement(p, (0, 0, 0), (0, 3, 4), good) is None  # ranges do not chain
    assert evaluate_placement(p, (0, 0, 0), (0, 4, 4), good[:-1]) is None  # node 2 has no way out
    tight = attrs.evolve(p, lat_limit=np.array([2.2]))
    assert evaluate_placement(tight, (0, 0, 0), (0, 4, 4), good) is None  # 1 + 1 + 3 * 0.1 > 2.2


def test_max_flow_small() -> None:
    lc = np.full((3, 3), np.inf)
    lc[0, 1] = 2.0
    val, flows = max_flow(2, [(2, 0), (0, 1), (1, 2)], (5.0, 4.0), lc)
    assert val == pytest.approx(2.0)
    assert flows[(0, 1)] == pytest.approx(2.0)


def test_result_gap() -> None:
    r = PlacementResult(value=9.0, status="feasible", bound=10.0, method="milp")
    assert r.gap == pytest.approx(0.1) and not r.proven
    assert PlacementResult(0.0, "infeasible", 0.0, "milp").gap == 0.0


# ----------------------------------------------------------------------------------------------------
# Bad input


def _good() -> PlacementProblem:
    return branching_problem()


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda p: attrs.evolve(p, num_layers=0), "num_layers"),
        (lambda p: attrs.evolve(p, kinds=("a", "b")), "kinds"),
        (lambda p: attrs.evolve(p, lat_limit=np.array([0.0])), "lat_limit"),
        (lambda p: attrs.evolve(p, lat_limit=np.array([[1.0]])), "lat_limit"),
        (lambda p: attrs.evolve(p, link_lat=np.zeros((1, 3, 3))), "link_lat"),
        (lambda p: attrs.evolve(p, link_lat=-np.ones((1, 4, 4))), "link_lat"),
        (lambda p: attrs.evolve(p, link_cap=np.full((4, 3), np.inf)), "link_cap"),
        (lambda p: attrs.evolve(p, link_cap=np.full((4, 4), np.nan)), "link_cap"),
        (lambda p: attrs.evolve(p, menus=(attrs.evolve(p.menus[0], cap=np.array([1.0, -1.0])), *p.menus[1:])), "cap"),
        (lambda p: attrs.evolve(p, menus=(attrs.evolve(p.menus[0], k=np.array([0, 8])), *p.menus[1:])), ".k"),
        (
            lambda p: attrs.evolve(p, menus=(attrs.evolve(p.menus[0], lat=np.array([[np.nan, 1.0]])), *p.menus[1:])),
            "lat",
        ),
        (lambda p: attrs.evolve(p, menus=(attrs.evolve(p.menus[0], lat=np.ones((2, 2))), *p.menus[1:])), "lat"),
        (lambda p: attrs.evolve(p, menus=()), "menus"),
    ],
)
def test_bad_input_is_rejected(change: object, needle: str) -> None:
    assert callable(change)
    bad = change(_good())
    with pytest.raises(PlacementInputError, match=needle.replace(".", r"\.")):
        check_problem(bad)
    for solver in (brute_force_place, milp_place, place, pipeline_dp):
        with pytest.raises(PlacementInputError):
            solver(bad)


def test_mismatched_menu_arrays() -> None:
    with pytest.raises(ValueError, match="one entry per option"):
        NodeMenu(k=np.array([1, 2]), b=np.array([1]), cap=np.array([1.0, 2.0]), lat=np.ones((1, 2)), mem=np.ones(2))


def test_bad_shape_budget() -> None:
    p = branching_problem()
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="shape_budget"):
            place(p, shape_budget=bad)  # type: ignore[arg-type]


def test_bad_time_limit_and_size() -> None:
    p = _good()
    for solver in (milp_place, place):
        with pytest.raises(ValueError, match="time_limit"):
            solver(p, time_limit=0.0)
        with pytest.raises(ValueError, match="time_limit"):
            solver(p, time_limit=math.nan)
    big = attrs.evolve(p, num_layers=40)
    with pytest.raises(PlacementInputError, match="brute_force_place"):
        brute_force_place(big)
