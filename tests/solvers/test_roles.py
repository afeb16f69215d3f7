"""Option roles (``solvers.problem``): a path of p stages charges p micro-batches to each of its nodes, a
node that several paths cross the sum of theirs, and the model's ends go to the stages holding layer 0 and
the last layer. Every placer agrees with brute force on menus with roles, including multisets whose
placements have paths of different lengths."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from solvers.brute import brute_force_place
from solvers.fastplace import place
from solvers.placement import milp_place
from solvers.problem import FIRST, LAST, NodeMenu, PlacementInputError, check_problem
from solvers.rules import evaluate_placement, placement_roles
from solvers.shapes import exhaustive_shapes, shape_search
from solvers.small import exact_small
from tests.solvers.instances import mixed_paths_problem, random_shaped_roles, random_tiny_problem, with_roles
from tests.solvers.test_placement import LIMIT, _check_placement, _same, agree_with_brute


def test_placement_roles_count_every_path() -> None:
    """A chain of 3: 3 each; a fork a -> {b, c}: 2 + 2 on a, 2 on b and c; a diamond: 6, 3, 3, 6."""
    n, L = 3, 6
    depth, ends = placement_roles(n, L, [0, 2, 4], [2, 4, 6], [(3, 0), (0, 1), (1, 2), (2, 3)])
    assert depth == [3, 3, 3] and ends == [FIRST, 0, LAST]
    depth, ends = placement_roles(n, L, [0, 3, 3], [3, 6, 6], [(3, 0), (0, 1), (0, 2), (1, 3), (2, 3)])
    assert depth == [4, 2, 2] and ends == [FIRST, LAST, LAST]
    n = 4
    edges = [(4, 0), (0, 1), (0, 2), (1, 3), (2, 3), (3, 4)]
    depth, ends = placement_roles(n, L, [0, 2, 2, 4], [2, 4, 4, 6], edges)
    assert depth == [6, 3, 3, 6] and ends == [FIRST, 0, 0, LAST]
    depth, ends = placement_roles(2, 6, [0, 0], [6, 6], [(2, 0), (0, 2), (2, 1), (1, 2)])
    assert depth == [1, 1] and ends == [FIRST | LAST] * 2


def test_mixed_path_lengths_are_charged_per_path() -> None:
    """A replica beside a two-stage chain in one multiset: each path pays its own micro-batches."""
    p = mixed_paths_problem()
    for res in (brute_force_place(p), milp_place(p), milp_place(p, warm_start=False, symmetry=False), place(p)):
        assert res.status == "optimal" and res.value == pytest.approx(9.0)
        _check_placement(p, res)
        assert res.option[0] == 0 and res.start[0] == 0  # the big node alone, 1 micro-batch
    old = attrs.evolve(p, menus=tuple(_at_least(m, 3) for m in p.menus))  # the old rule: n = 3 on every node
    for res in (brute_force_place(old), milp_place(old), place(old)):
        assert res.value == pytest.approx(2.0)
    keep = np.array([1, 2])  # the big node cannot hold every layer: the fork, 2 + 2 micro-batches through it
    big = _at_least(NodeMenu(*(np.asarray(x)[..., keep] for x in _fields(p.menus[0]))), 1)
    fork = attrs.evolve(p, menus=(big, *p.menus[1:]))
    for res in (brute_force_place(fork), milp_place(fork), milp_place(fork, warm_start=False), place(fork)):
        assert res.status == "optimal" and res.value == pytest.approx(4.0)
        _check_placement(fork, res)
        assert res.option[0] == 1  # the option charged for 4 micro-batches


def _fields(m: NodeMenu) -> tuple[np.ndarray, ...]:
    return (m.k, m.b, m.cap, m.lat, m.mem, m.d, m.ends)


def _at_least(m: NodeMenu, d: int) -> NodeMenu:
    keep = np.flatnonzero(m.d >= d)
    return NodeMenu(m.k[keep], m.b[keep], m.cap[keep], m.lat[:, keep], m.mem[keep], m.d[keep], m.ends[keep])


def test_evaluate_rejects_a_role_too_small() -> None:
    """The fork puts 4 micro-batches through the big node: its option charged for 2 is refused there."""
    p = mixed_paths_problem()
    fork = [(3, 0), (0, 1), (0, 2), (1, 3), (2, 3)]
    assert evaluate_placement(p, (1, 1, 1), (0, 2, 2), fork) is None  # big charged for 2
    got = evaluate_placement(p, (2, 1, 1), (0, 2, 2), fork)
    assert got is not None and got[0] == pytest.approx(4.0)
    assert evaluate_placement(p, (2, 0, 0), (0, 2, 2), fork) is None  # smalls charged for the embedding only


@pytest.mark.parametrize("seed", range(6))
def test_role_instances_agree_with_brute_force(seed: int) -> None:
    """25 instances per seed: L 2..8, n 1..3, random menus whose options are charged for random counts of
    micro-batches and random ends; brute force, the MILP (with and without its warm start and symmetry
    rows), the small-case enumeration and ``place`` agree, and the chain family never beats them."""
    rng = np.random.default_rng(5000 + seed)
    statuses = set()
    for _ in range(25):
        p = with_roles(rng, random_tiny_problem(rng, max_options=int(rng.integers(1, 5))))
        ref = brute_force_place(p)
        statuses.add(ref.status)
        small = exact_small(p)
        assert small is not None
        agree_with_brute(p, ref, small)
    assert statuses == {"optimal", "infeasible"}


@pytest.mark.parametrize("seed", range(3))
def test_shaped_role_instances_agree_with_brute_force(seed: int) -> None:
    """12 instances per seed where replicas, chains, forks and joins compete and the optimum often mixes
    paths of different lengths: every placer agrees with brute force."""
    rng = np.random.default_rng(7000 + seed)
    for _ in range(12):
        p = random_shaped_roles(rng)
        agree_with_brute(p, brute_force_place(p))


@pytest.mark.parametrize("seed", range(2))
def test_four_node_role_instances_agree_with_brute_force(seed: int) -> None:
    """n = 4 with roles (the fast method skips the shape search and proves by LP/MILP)."""
    rng = np.random.default_rng(6000 + seed)
    for _ in range(6):
        base = random_tiny_problem(rng, n=4, num_layers=int(rng.integers(2, 6)), max_options=int(rng.integers(1, 3)))
        p = with_roles(rng, base, variants=1)
        ref = brute_force_place(p)
        for res in (place(p, time_limit=LIMIT), milp_place(p, time_limit=LIMIT)):
            assert _same(ref, res), (ref, res)
            _check_placement(p, res)


def test_bad_roles_are_rejected() -> None:
    p = mixed_paths_problem()
    bad = attrs.evolve(p.menus[0], d=np.array([1, 0, 4]))
    with pytest.raises(PlacementInputError, match=r"menus\[0\]\.d"):
        check_problem(attrs.evolve(p, menus=(bad, *p.menus[1:])))
    bad = attrs.evolve(p.menus[0], ends=np.array([3, 1, 5]))
    with pytest.raises(PlacementInputError, match=r"menus\[0\]\.ends"):
        check_problem(attrs.evolve(p, menus=(bad, *p.menus[1:])))


@pytest.mark.parametrize("seed", range(3))
def test_shape_search_with_roles_agrees_with_brute_force(seed: int) -> None:
    """The shape search alone (and its unpruned reference) on menus with roles, n 1..4, including shaped
    instances where forks, joins and replicas beside chains compete."""
    rng = np.random.default_rng(8000 + seed)
    for t in range(16):
        n = 1 + t % 4
        if t % 2:
            p = random_shaped_roles(rng, n=n)
        else:
            L = int(rng.integers(2, 7 if n == 4 else 9))
            p = with_roles(rng, random_tiny_problem(rng, n=n, num_layers=L, max_options=int(rng.integers(1, 5))))
        ref = brute_force_place(p)
        for r in (shape_search(p), exhaustive_shapes(p), place(p, shape_budget=10**9)):
            assert r is not None
            assert _same(ref, r), (ref, r)
            _check_placement(p, r)
