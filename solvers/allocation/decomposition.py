"""MIPs warm-started from a plan, and the exact decomposition by model."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import attrs
import highspy
import numpy as np
from numpy.typing import NDArray

from solvers.allocation.columns import _TOL, _Columns
from solvers.allocation.heuristics import _better, _fit, _repair, _State
from solvers.allocation.model import (
    _col_entries,
    _highs,
    _highs_solution,
    _Matrix,
    _plan_vector,
    _reduced_costs,
    _service_hi,
)
from solvers.allocation.stopping import _Deadline, _LpStop, _Mip, _passed

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def _mip_job(
    c: _Columns,
    mat: _Matrix,
    objective: FloatArray,
    service_hi: float,
    start: IntArray,
    limit: int | None,
    mip_gap: float,
    cols: IntArray | None,
    *,
    row_lo: FloatArray | None = None,
    cuts: list[tuple[IntArray, float]] | None = None,
    max_nodes: int | None = None,
    presolve: bool = False,
) -> tuple[_Mip, Callable[[], highspy.Highs], int]:
    """One MIP (over the variables ``cols``, default all), warm-started with plan ``start``: (the run, its
    model builder, its number of integer variables). ``max_nodes``: HiGHS's branch-and-bound node limit
    (a count, so a run it ends replays exactly). ``presolve``: run HiGHS's presolve, which does not check
    the deadline (``model._highs``), so only for models that it reduces in milliseconds."""
    vector = _plan_vector(c, mat, start)

    def build() -> highspy.Highs:
        h = _highs(mat, objective, service_hi, mip_gap, mip=True, cols=cols, row_lo=row_lo, cuts=cuts)
        h.setSolution(_highs_solution(vector if cols is None else vector[cols]))
        if max_nodes is not None:
            h.setOptionValue("mip_max_nodes", max_nodes)
        if presolve:
            h.setOptionValue("presolve", "on")
        return h

    n_x = c.J + len(mat.keep_cols)
    return _Mip(limit), build, n_x if cols is None else int(np.sum(cols < n_x))


def _mip_plans(c: _Columns, mat: _Matrix, run: _Mip, cols: IntArray | None) -> list[IntArray]:
    """The plans (x over the columns) that a MIP run took, in the order it found them."""
    n_x = c.J + len(mat.keep_cols)
    plans = []
    for sol in run.taken():
        full = np.zeros(n_x, dtype=np.int64)
        full[np.arange(n_x) if cols is None else cols[cols < n_x]] = sol
        x = full[: c.J].copy()
        x[mat.keep_cols] += full[c.J :]
        plans.append(x)
    return plans


def _mip_phase(
    c: _Columns,
    mat: _Matrix,
    objective: FloatArray,
    service_hi: float,
    start: IntArray,
    limit: int | None,
    deadline: _Deadline | None,
    mip_gap: float,
    cols: IntArray | None,
    cuts: list[tuple[IntArray, float]] | None = None,
    on_solution: Callable[[_Mip, list[IntArray]], None] | None = None,
    max_nodes: int | None = None,
    presolve: bool = False,
) -> tuple[_Mip, list[IntArray]]:
    """One MIP: (the run, the plans it found, in order). ``on_solution(run, plans)`` is called after each
    solution it takes, with the plans so far."""
    run, build, num_int = _mip_job(
        c, mat, objective, service_hi, start, limit, mip_gap, cols, cuts=cuts, max_nodes=max_nodes, presolve=presolve
    )
    each = None if on_solution is None else (lambda r: on_solution(r, _mip_plans(c, mat, r, cols)))
    run.run(build, num_int, deadline, each)
    return run, _mip_plans(c, mat, run, cols)


def _model_vars(c: _Columns, mat: _Matrix) -> list[IntArray]:
    """Per model: its variables (its columns' new and keep copies, its carries v, its flows y, its unmet u)."""
    owner = np.concatenate([c.m, c.m[mat.keep_cols], c.pool_m, c.pool_m, mat.dem_models])
    order = np.argsort(owner, kind="stable")
    return list(np.split(order, np.searchsorted(owner[order], np.arange(1, c.M))))


@attrs.define
class _Split:
    """Outcome of the per-group MIPs: the union plan, the sum of their bounds, and cuts for the full MIP."""

    plan: IntArray | None = None
    bound: float = -math.inf
    proven: bool = False
    fits: bool = False
    cuts: list[tuple[IntArray, float]] = attrs.Factory(list)
    stopped: dict[int, int] = attrs.Factory(dict)
    groups: int = 0
    iterations: int = 0
    nodes: int = 0


SPLIT_MIN_COLUMNS = 300
"""Columns from which the decomposition runs: below, the full MIP was faster than one MIP per model
(core's homogeneous restriction, 206 columns: 0.05 s against 0.14 s)."""

SPLIT_SHARE = 0.75
"""Share of the time left after the heuristic that the decomposition may use; the full MIP gets the rest."""


def _group_floor(mat: _Matrix, cols: IntArray, row_lo: FloatArray, duals: FloatArray, d: FloatArray) -> float:
    """L_g of a group's program (its variables ``cols``, its rows bounded by ``row_lo`` and ``mat.row_hi``),
    from the LP's row duals y and reduced costs d (``_split_phase``'s docstring says how it prunes); -inf
    where a dual's sign meets an infinite bound (no pruning then)."""
    rows = np.unique(mat.index[_col_entries(mat, cols)[1]])
    y = duals[rows]
    tol = 1e-9  # a dual or reduced cost this small counts as 0
    bound_of_row = np.where(y > tol, row_lo[rows], np.where(y < -tol, mat.row_hi[rows], 0.0))
    if not np.all(np.isfinite(bound_of_row)):
        return -math.inf
    neg = d[cols] < -tol
    hi = mat.col_hi[cols][neg]
    if not np.all(np.isfinite(hi)):
        return -math.inf
    return float(y @ bound_of_row + d[cols][neg] @ hi)


ROUND_MIN = 2_000
"""Integer variables from which a group's MIP gets a first round (``_split_phase``)."""

ROUND_SHARE = 0.1
"""The first round's reduced-cost threshold, as a share of the group's gap z_g - L_g."""


def _priced(
    cols: IntArray, reduced: FloatArray, floor: float, incumbent: float, vector: FloatArray, n_x: int
) -> IntArray:
    """``cols`` less the integer variables j with L_g + d_j > z_g (``_split_phase``), except those the plan
    ``vector`` uses."""
    margin = 1e-6 * max(1.0, abs(incumbent))
    out = (cols < n_x) & (reduced[cols] > 0) & (floor + reduced[cols] > incumbent + margin)
    return cols[~out | (vector[cols] > 0)]


def _group_lp(
    mat: _Matrix, cols: IntArray, lo: FloatArray, hi: float, deadline: _Deadline | None
) -> tuple[FloatArray | None, int]:
    """(the row duals of a group's own LP over its variables ``cols``, rows bounded below by ``lo``, or None
    when the deadline cut it or it did not end optimal; its simplex iterations)."""
    if _passed(deadline):
        return None, 0
    h = _highs(mat, mat.cost_obj, hi, 0.0, mip=False, cols=cols, row_lo=lo)
    stop = _LpStop(deadline)
    stop.attach(h)
    h.run()
    iterations = max(int(h.getInfo().simplex_iteration_count), 0)
    if stop.interrupted or h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None, iterations
    return np.asarray(h.getSolution().row_dual, dtype=np.float64)[: mat.num_rows], iterations


def _split_phase(
    c: _Columns,
    mat: _Matrix,
    start: IntArray,
    limits: Mapping[int, int],
    deadline: _Deadline | None,
    mip_gap: float,
    duals: FloatArray | None = None,
) -> _Split:
    """Decomposition by model, exact: solve each group of models' cost MIP alone, with all its demand
    served and the whole availability to itself; merge the groups whose plans together overrun a
    (region, node type), and repeat.

    Groups share only the availability rows (the service row is fixed at full service), so the sum of
    the group optima bounds the full program from below, and when the union of their plans fits the
    availability it is optimal. It ends there, at one group of all models, or at the deadline.
    In each group's MIP, when ``start`` serves the group's demand, a variable whose one unit costs more
    than the group's part of ``start`` cannot be in a better plan, and is left out. ``limits``: solutions
    to take per group (key: the bitmask of its models; a replay), else all.

    ``duals``: the row duals y of the LP at full service. With them, an integer variable j of group g is
    also left out when L_g + d_j > z_g (reduced-cost fixing per group; z_g the group's part of ``start``,
    d = cost - A^T y). For every point x of the group's program, cost(x) = sum_j d_j x_j + sum_i y_i (A x)_i
    >= L_g + sum_{j: d_j > 0} d_j x_j, with L_g = sum_{rows i of g} min(y_i lo_i, y_i hi_i) +
    sum_{j: d_j < 0} d_j hi_j, so a plan with x_j >= 1 costs more than z_g; the group's optimum (at most
    z_g) is inside what is kept. Variables that ``start`` uses are kept, so it stays a warm start.

    A group that keeps more than ``ROUND_MIN`` integer variables solves its own LP over them first (the
    bound holds for any y; the whole LP's duals price availability that the other groups use, the
    group's own only what it uses itself) and prunes again with those duals. Then a first round:
    its MIP over the variables with d_j <= ``ROUND_SHARE`` (z_g - L_g) and start's, whose plan, when
    cheaper, becomes z_g (pruning again) and the warm start of the group's MIP. Effort: the group's LP and
    round are recorded under -mask (0: neither is used, as the deadline came first or the LP did not end
    optimal; else the round's solutions taken when the deadline cut it).

    The bounds of a merged group's finished parts prune its variables (one unit of a part's variable costs
    at most the incumbent less the other parts' bounds) but are not rows of its MIP: such a row (a part's
    cost >= its bound) is dense, and HiGHS's root cut separation, most of these MIPs' time, slowed with
    them (``extended``: six merged groups' MIPs took 0.5-6.4 s with the rows, 0.3-2.2 s without, with the
    same optima). They remain cuts of the full MIP (``_Split.cuts``).
    """
    out = _Split()
    variables = _model_vars(c, mat)
    n_x = c.J + len(mat.keep_cols)
    reduced = None if duals is None else _reduced_costs(mat, mat.cost_obj, duals)
    dem_row = np.full(c.M, -1, dtype=np.int64)
    dem_row[mat.dem_models] = np.arange(len(mat.dem_models))
    hi = _service_hi(c, 0.0)
    first_u = mat.num_cols - len(mat.dem_models)
    owner = {int(m): int(m) for m in mat.dem_models}  # model -> its group's first model
    groups = {int(m): [int(m)] for m in mat.dem_models}
    bound_of = {int(m): 0.0 for m in mat.dem_models}  # group -> a proven lower bound on its cost
    plan_of: dict[int, IntArray] = {}  # group -> the x part of its own optimum (or best found)
    proven_of: dict[int, bool] = {}
    found: list[tuple[frozenset[int], IntArray, float]] = []  # finished groups: models, variables, bound
    while True:
        vector = _plan_vector(c, mat, start)
        short = _State(c, start).unmet() > _TOL * np.maximum(c.demand, 1.0)
        masks = {lead: sum(1 << m for m in ms) for lead, ms in groups.items()}
        todo = []
        for lead, ms in groups.items():
            if lead in plan_of:
                continue
            lo = mat.row_lo.copy()
            lo[: len(mat.dem_models)] = -np.inf
            rows = dem_row[ms]
            lo[rows] = mat.row_lo[rows]
            cols = np.sort(np.concatenate([variables[m] for m in ms]))
            cols = cols[cols < first_u]  # every demand is served: no unmet variables
            # start's part is an upper bound on the group's optimum only where it serves the group's demand
            incumbent = math.inf if short[ms].any() else float(mat.cost_obj[cols] @ vector[cols])
            # one unit of a variable of part k costs at most the incumbent less the other parts' bounds;
            # the parts: the largest finished groups inside this one (groups only merge, so disjoint)
            inside = [(members, bound) for members, _v, bound in found if members <= set(ms)]
            parts = [(a, bound) for a, bound in inside if not any(a < b for b, _bound in inside)]
            slack = np.full(mat.num_cols, incumbent)
            for members, bound in parts:
                for members2, _bound2 in parts:
                    if not members2 & members:
                        slack[np.concatenate([variables[m] for m in members2])] -= bound
            cols = cols[mat.cost_obj[cols] <= slack[cols] * (1 + 1e-9) + 1e-9]
            floor = -math.inf
            if duals is not None and reduced is not None and math.isfinite(incumbent):
                floor = _group_floor(mat, cols, lo, duals, reduced)
                cols = _priced(cols, reduced, floor, incumbent, vector, n_x)
            todo.append((lead, ms, lo, cols, incumbent, floor))
        todo.sort(key=lambda job: len(job[3]))  # smallest first: at a deadline, the most groups are done
        jobs = []
        for lead, ms, lo, cols, incumbent, floor in todo:
            warm = start
            key = -masks[lead]  # the group's own LP and first round (a replay's 0: neither ran)
            if math.isfinite(floor) and int(np.sum(cols < n_x)) > ROUND_MIN:
                own_lp, iterations = (None, 0) if limits.get(key) == 0 else _group_lp(mat, cols, lo, hi, deadline)
                out.iterations += iterations
                if own_lp is None:
                    out.stopped[key] = 0
                else:
                    d_g = _reduced_costs(mat, mat.cost_obj, own_lp)
                    floor_g = _group_floor(mat, cols, lo, own_lp, d_g)
                    cols = _priced(cols, d_g, floor_g, incumbent, vector, n_x)
                    delta = ROUND_SHARE * (incumbent - floor_g)
                    few = cols[(cols >= n_x) | (d_g[cols] <= delta) | (vector[cols] > 0)]
                    run, build, num_int = _mip_job(
                        c, mat, mat.cost_obj, hi, start, limits.get(key), mip_gap, few, row_lo=lo
                    )  # fmt: skip
                    run.run(build, num_int, deadline)
                    out.iterations += run.iterations
                    out.nodes += run.nodes
                    if not run.finished:
                        out.stopped[key] = len(run.taken())
                    plans = _mip_plans(c, mat, run, few)
                    if plans:
                        own = np.concatenate([c.by_model[m] for m in ms])
                        warm = start.copy()
                        warm[own] = plans[-1][own]
                        better = _plan_vector(c, mat, warm)
                        incumbent = min(incumbent, float(mat.cost_obj[cols] @ better[cols]))
                        cols = _priced(cols, d_g, floor_g, incumbent, better, n_x)
            job = _mip_job(c, mat, mat.cost_obj, hi, warm, limits.get(masks[lead]), mip_gap, cols, row_lo=lo)
            job[0].run(job[1], job[2], deadline)
            jobs.append((lead, cols, job, warm))
        out.groups += len(jobs)
        complete = True
        for lead, cols, (run, _build, _n), warm in jobs:
            out.iterations += run.iterations
            out.nodes += run.nodes
            if run.finished and run.status == highspy.HighsModelStatus.kInfeasible:
                return _Split(stopped=out.stopped, groups=out.groups, iterations=out.iterations, nodes=out.nodes)
            own = np.concatenate([c.by_model[m] for m in groups[lead]])
            plans = _mip_plans(c, mat, run, cols)
            plan_of[lead] = (plans[-1] if plans else warm)[own]
            proven_of[lead] = run.finished and run.status == highspy.HighsModelStatus.kOptimal
            if not run.finished:
                out.stopped[masks[lead]] = len(run.taken())
                complete = False
            elif math.isfinite(run.dual_bound):  # a stopped run's bound depends on the clock: not used
                bound_of[lead] = max(bound_of[lead], run.dual_bound)
                v = np.concatenate([variables[m] for m in groups[lead]])
                found.append((frozenset(groups[lead]), v, run.dual_bound))
        x = np.zeros(c.J, dtype=np.int64)
        for lead, ms in groups.items():
            x[np.concatenate([c.by_model[m] for m in ms])] = plan_of[lead]
        out.plan = x
        out.cuts = [(v, bound) for _members, v, bound in found]
        out.bound = sum(bound_of.values())
        out.proven = all(proven_of.values())
        over = _State(c, x).used > c.avail
        out.fits = not bool(over.any())
        if out.fits or not complete or len(groups) == 1:
            return out
        # the repaired union as the next start, only where start leaves demand unmet: a start that serves
        # every demand beat it in all 29 merges measured (extended, core-size instances), and the repair
        # took 0.2 s each on extended
        if short.any():
            repaired = _repair(c, _fit(c, x))
            if _better(c, repaired, start):
                start = repaired
        for reg, typ in np.argwhere(over):
            users = sorted({owner[int(m)] for m in c.m[(x > 0) & (c.r == reg) & (c.nc[:, typ] > 0)]})
            for lead in users[1:]:
                for m in groups.pop(lead):
                    owner[m] = users[0]
                    groups[users[0]].append(m)
                bound_of[users[0]] += bound_of.pop(lead)
                plan_of.pop(lead, None)
                proven_of.pop(lead, None)
            plan_of.pop(users[0], None)
            proven_of.pop(users[0], None)
