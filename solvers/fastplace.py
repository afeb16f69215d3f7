"""The production placer: exact on the option grid. Measured before menus had option roles: milliseconds
up to three nodes; at four nodes 0.02-0.3 s (every real ``core`` multiset measured was proven); at five,
seconds (up to about a minute); at six the shape search often runs out of its work budget and the LP/MILP
residue ends unproven (see ``bench/placement_paths.py``). With roles the menus are 8-20x longer (every
count of micro-batches and set of ends): qwen3-32b at three nodes 0.1-0.5 s, at four 0.2-1.7 s (two
multisets, all proven, load 9-10); five and six nodes not re-measured.

``place`` runs, in order, stopping at the first step that proves the optimum:

1. Exact menu reductions (``solvers.reduce.reduce_problem``, listed in its docstring); each keeps the
   optimum value and an optimal placement, and a node left without options proves the problem infeasible.
2. n <= 3 (``solvers.small.exact_small``, method "shapes"): every shape that three nodes allow is enumerated and
   solved exactly (replicas, chains, one node feeding two, two feeding one; see that function).
3. n >= 4: the chain family (``solvers.chains.pipeline_dp``) gives a first placement: the best one whose weakly
   connected components are chains (pure pipelines and replicas of them). For a chain, node latencies
   add up whatever the order, which only decides the link latencies and capacities. So a subset U of
   nodes in order pi is worth min(lc(pi), B_U(T - ll(pi))), where B_U(beta) is the largest bottleneck
   capacity c such that a knapsack over U (one option per node with capacity >= c, the k summing to L)
   fits the latency budget beta. B_U comes from bisection over the capacities; the knapsack is a
   min-plus convolution per node in numpy. With one latency metric this is exact for the family; with
   two it minimises each metric and their normalised sum in turn (a heuristic: the later steps stay
   exact). A set-partition DP over the subsets adds the replicas.
4. If that placement reaches UB, or the tighter layer-work fixed point (the largest F with
   L F <= sum_i max_o k_o min(c_o, F); ``solvers.bounds.work_fixed_point``), it is optimal ("dp-proven").
5. The shape search (``solvers.shapes.shape_search``, method "shapes"), started from the step 3
   placement: every connected shape of every sub-multiset that could still beat the best placement
   known is decided exactly at that threshold, and the best partition into components is assembled.
   It proves the optimum unless its deterministic work budget (``shape_budget`` enumerated rows)
   runs out. Each shape fixes the role of each of its nodes (``solvers.problem``: the micro-batches
   of its paths through the node, the model ends it holds), and its nodes run only the options that
   allow it.
   With a ``floor`` (see ``place``) every step stops as soon as it proves that nothing beats it, and
   steps 3-4 are skipped: an incumbent below the floor does not help the search, and on a template
   build's multisets the search without it was faster overall (gemma-3-27b, N_max 6: 40 s instead of
   62 s on one core, same templates). With ``lp_floor`` the LP bound of step 6 is tried first, before
   step 3 (see ``place``).
6. Only then (the residue): the LP relaxation of the MILP bounds every placement; if it does not exceed
   the placement's value by more than 1e-7 (relative) it proves it ("lp-proven"). Otherwise its reduced
   costs fix to zero every option and edge that no placement better than the current one can use (LP
   duality), a few rounds, and the reference MILP (``solvers.placement.milp_place``) solves what is
   left, warm-started with the step 3 placement ("milp"). This is the slow step: the only one that can
   end unproven at ``time_limit``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import attrs
import numpy as np

from solvers.chains import chain_family
from solvers.placement import lp_reduce, milp_place
from solvers.problem import Edge, PlacementProblem, PlacementResult, check_problem
from solvers.reduce import Reduced, reduce_problem, subset_menu, work_bound
from solvers.rules import evaluate_placement, usable_edges
from solvers.shapes import shape_search
from solvers.small import exact_small

LP_ROUNDS = 4
PROOF_RTOL = 1e-7
LP_FLOOR_NODES = 6
"""``lp_floor`` tries the LP bound from this many nodes: below, the search is cheaper than the LP."""
PLACER = "shapes-1"
"""Version of the method for more than SMALL_NODES nodes; part of those templates' content keys."""
SHAPE_BUDGET = 100_000_000
"""Default work budget of the shape search (rows enumerated) before the LP/MILP residue path. About
25 s of one core at most; 6-node gemma-3-27b prefill multisets that ran out of 30M rows and then spent
10 s in the MILP without a proof were all proven within 100M rows, in 4-12 s."""


def _lift(red: Reduced, res: PlacementResult, original: PlacementProblem, dt: float) -> PlacementResult:
    """Map a result on the reduced problem back to the original option indices, re-checked exactly."""
    if not res.option:
        return attrs.evolve(res, solve_s=dt)
    option = tuple(int(red.index[i][o]) for i, o in enumerate(res.option))
    ev = evaluate_placement(original, option, res.start, res.flows.keys())
    if ev is None:  # pragma: no cover - the reduced problem keeps every latency and layer count
        raise AssertionError("a reduced placement failed its check on the original problem")
    bound = ev[0] if res.status == "optimal" else max(min(res.bound, red.ub), ev[0])
    return attrs.evolve(res, value=ev[0], option=option, flows=ev[1], bound=bound, solve_s=dt)


def _restrict(problem: PlacementProblem, keep: Sequence[np.ndarray], edges: set[Edge]) -> PlacementProblem:
    """``problem`` with only the kept options and edges (a dropped edge gets infinite latency)."""
    n = problem.n
    menus = tuple(subset_menu(m, k) for m, k in zip(problem.menus, keep, strict=True))
    ll = np.asarray(problem.link_lat, dtype=np.float64).copy()
    for u in range(n + 1):
        for v in range(n + 1):
            if (u, v) not in edges:
                ll[:, u, v] = np.inf
    return attrs.evolve(problem, menus=menus, link_lat=ll)


def _renumber(res: PlacementResult, keep: Sequence[np.ndarray]) -> PlacementResult:
    new = [np.cumsum(k) - 1 for k in keep]
    return attrs.evolve(res, option=tuple(int(new[i][o]) for i, o in enumerate(res.option)))


def _below(bound: float, method: str, t0: float) -> PlacementResult:
    return PlacementResult(0.0, "below", bound, method, solve_s=time.perf_counter() - t0)


def place(
    problem: PlacementProblem,
    *,
    time_limit: float = 10.0,
    shape_budget: int = SHAPE_BUDGET,
    floor: float | None = None,
    spanning: bool = False,
    lp_floor: bool = False,
) -> PlacementResult:
    """The optimal placement of ``problem`` (see the module docstring for the method).

    ``method`` names the step that settled it: "reduce" (proved infeasible), "shapes", "dp-proven",
    "lp-proven" or "milp". ``shape_budget`` bounds the shape search's work (n >= 4; deterministic);
    ``time_limit`` bounds the MILP step only (HiGHS may overrun it); that step is the only one that can
    end unproven (``feasible`` with a bound, or ``unknown``).

    ``floor`` (> 0): the caller needs the optimum only if it is worth more than ``floor`` (a template
    build drops a multiset that its smaller templates already match). Every step may then stop as soon
    as it proves that no placement is worth more: status ``below``, ``bound`` <= ``floor`` (that proof),
    value 0 and no placement; ``method`` names the step ("reduce": the reductions' upper bound). An
    optimum above ``floor`` is found and proven as without it.

    ``spanning`` (with ``floor``): the caller guarantees that no placement with two or more components
    (replicas side by side) is worth more than ``floor``, so the shape search decides only connected
    placements of all the nodes (``shape_search``'s ``spanning``).

    ``lp_floor`` (with ``floor``, at least ``LP_FLOOR_NODES`` nodes): before the search, the LP
    relaxation of the MILP bounds every placement; when that bound is at most ``floor`` the result is
    ``below`` (method "lp-proven"). It costs about 20 ms at six nodes: on 6-node gemma-3-27b prefill
    multisets it proved 93 of 130 floors, on mixtral-8x7b decode none of 51, so the template build asks
    for it in prefill mode only; at 4-5 nodes the search is cheaper than the LP (gemma-3-27b prefill:
    300 multisets each took 1.3-1.9x longer with it).
    """
    t0 = time.perf_counter()
    check_problem(problem)
    if spanning and floor is None:
        raise ValueError("spanning needs a floor")
    if time_limit <= 0 or math.isnan(time_limit):
        raise ValueError(f"time_limit must be > 0, got {time_limit}")
    if isinstance(shape_budget, bool) or not isinstance(shape_budget, int) or shape_budget < 0:
        raise ValueError(f"shape_budget must be an integer >= 0, got {shape_budget!r}")
    if floor is not None and not (0 < floor < math.inf):
        raise ValueError(f"floor must be > 0 and finite (or None), got {floor!r}")
    red = reduce_problem(problem)
    if red is None:
        return PlacementResult(0.0, "infeasible", 0.0, "reduce", solve_s=time.perf_counter() - t0)
    rp = red.problem
    if floor is not None and red.ub > floor:
        red = attrs.evolve(red, ub=min(red.ub, work_bound(rp)))
    if floor is not None and red.ub <= floor:
        return _below(red.ub, "reduce", t0)
    small = exact_small(rp)
    if small is not None:
        if small.status == "infeasible":
            return attrs.evolve(small, solve_s=time.perf_counter() - t0)
        return _lift(red, small, problem, time.perf_counter() - t0)
    if lp_floor and floor is not None and rp.n >= LP_FLOOR_NODES:
        lp_bound = lp_reduce(rp, floor)[0]
        if lp_bound <= floor:
            return _below(lp_bound, "lp-proven", t0)
    dp = chain_family(rp) if floor is None else None
    if dp is not None:
        ev = evaluate_placement(rp, dp.option, dp.start, dp.flows.keys())
        dp = attrs.evolve(dp, value=ev[0], flows=ev[1]) if ev is not None else None
    if dp is not None and dp.value < red.ub * (1 - 1e-9) and floor is None:
        red = attrs.evolve(red, ub=min(red.ub, work_bound(rp)))
    if dp is not None and dp.value >= red.ub * (1 - 1e-9):
        res = attrs.evolve(dp, status="optimal", bound=dp.value, method="dp-proven")
        return _lift(red, res, problem, time.perf_counter() - t0)
    inc = dp
    shape_bound = math.inf
    if shape_budget > 0:
        found = shape_search(rp, incumbent=dp, budget=shape_budget, floor=floor, spanning=spanning)
        if found is not None and found.status == "infeasible":
            return attrs.evolve(found, solve_s=time.perf_counter() - t0)
        if found is not None and found.status == "below":
            return _below(found.bound, "shapes", t0)
        if found is not None and found.status == "optimal":
            return _lift(red, found, problem, time.perf_counter() - t0)
        if found is not None:  # the budget ran out: a better incumbent and a bound for the residue
            inc = attrs.evolve(found, status="feasible", method="dp")
            shape_bound = found.bound
            if floor is not None and shape_bound <= floor:
                return _below(shape_bound, "shapes", t0)
    index = list(red.index)
    cur = rp
    if floor is not None and inc is not None and inc.value < floor:
        inc = None  # only placements above the floor matter now
    target = inc.value if inc is not None else (floor or 0.0)
    if target > 0:
        for _ in range(LP_ROUNDS):
            bound, keep, edges = lp_reduce(cur, target)
            if inc is not None and bound <= inc.value * (1 + PROOF_RTOL):
                res = attrs.evolve(inc, status="optimal", bound=inc.value, method="lp-proven")
                return _lift(Reduced(cur, tuple(index), bound), res, problem, time.perf_counter() - t0)
            if floor is not None and bound <= floor:
                return _below(bound, "lp-proven", t0)
            if inc is not None:
                for i, o in enumerate(inc.option):
                    keep[i][o] = True
                edges |= set(inc.flows.keys())
            elif any(not k.any() for k in keep):  # every node needs an option: nothing beats the floor
                return _below(target, "lp-proven", t0)
            if all(k.all() for k in keep) and len(edges) == len(usable_edges(cur)):
                break
            cur = _restrict(cur, keep, edges)
            index = [ix[k] for ix, k in zip(index, keep, strict=True)]
            if inc is not None:
                inc = _renumber(inc, keep)
    res = milp_place(cur, time_limit=time_limit, warm_start=inc is not None, initial=inc, symmetry=True)
    if res.status == "infeasible":
        if floor is not None and cur is not rp:  # no placement above the floor (the rest was fixed away)
            return _below(floor, "milp", t0)
        return attrs.evolve(res, solve_s=time.perf_counter() - t0)
    if floor is not None and res.bound <= floor:
        return _below(res.bound, "milp", t0)
    return _lift(Reduced(cur, tuple(index), min(red.ub, shape_bound)), res, problem, time.perf_counter() - t0)
