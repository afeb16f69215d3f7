"""The LP relaxation (directly, or by column generation) and the LP dives: for the most service, or, when
the LP serves every demand, for the least cost at full service."""

from __future__ import annotations

import math

import attrs
import highspy
import numpy as np
from numpy.typing import NDArray

from solvers.allocation.columns import _AGG, _PRE, _Columns
from solvers.allocation.heuristics import _State
from solvers.allocation.model import _add_cols, _highs, _iterations, _Matrix, _reduced_costs, _service_hi
from solvers.allocation.stopping import _LpStop

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


@attrs.define
class _LpOutcome:
    done: bool = False
    values: FloatArray | None = None
    bound: float = -math.inf
    unmet: float = 0.0
    iterations: int = 0
    columns: IntArray | None = None  # x columns that column generation generated
    duals: FloatArray | None = None  # row duals of the last LP solved (optimal for the whole LP)


def _lp_job(h: highspy.Highs, c: _Columns, mat: _Matrix, out: _LpOutcome) -> None:
    """LP relaxation: min cost with all demand served; if infeasible, min unmet, then min cost at it."""
    ok = highspy.HighsModelStatus.kOptimal
    h.run()
    out.iterations += _iterations(h)[0]
    status = h.getModelStatus()
    if status in (highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kUnboundedOrInfeasible):
        n = mat.num_cols
        idx = np.arange(n, dtype=np.int32)
        h.changeColsCost(n, idx, mat.serve_obj)
        h.changeRowBounds(mat.service_row, -np.inf, np.inf)
        h.run()
        out.iterations += _iterations(h)[0]
        if h.getModelStatus() != ok:
            return
        out.unmet = max(float(h.getInfo().objective_function_value), 0.0)
        h.changeColsCost(n, idx, mat.cost_obj)
        h.changeRowBounds(mat.service_row, -np.inf, _service_hi(c, out.unmet))
        h.run()
        out.iterations += _iterations(h)[0]
        status = h.getModelStatus()
    if status == ok:
        out.done = True
        sol = h.getSolution()
        out.values = np.asarray(sol.col_value, dtype=np.float64)
        out.duals = np.asarray(sol.row_dual, dtype=np.float64)
        out.bound = float(h.getInfo().objective_function_value)


_AUTO_GENERATED = 5000  # columns from which "auto" uses column generation (ext-50 has 6.6k, core-400 2.1k)
_CG_INITIAL = 2  # best columns per (model, region, mode) that column generation starts from
_CG_ADD = 10  # most columns added per model and round


def _cg_job(c: _Columns, mat: _Matrix, mip_gap: float, out: _LpOutcome, stop: _LpStop) -> None:
    """The LP relaxation by column generation over the x columns (keep, y, u are always in).

    Start from each (model, region, mode)'s best columns by capacity per USD/h and the current ones;
    solve the restricted LP, price every column at its row duals, add the most negative reduced costs
    (up to _CG_ADD per model), repeat until none is negative: the restricted LP is then optimal for
    the full LP. First for min unmet (always feasible), then for min cost at that service level.
    """
    J = c.J
    eff = np.where(c.mode == _AGG, c.rate, np.where(c.mode == _PRE, c.prate, c.drate)) / np.maximum(c.cost, 1e-12)
    key = (c.m * c.R + c.r) * 3 + c.mode
    order = np.lexsort((-eff, key))
    first = np.ones(len(order), dtype=bool)
    first[1:] = key[order][1:] != key[order][:-1]
    rank = np.arange(len(order)) - np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
    chosen = np.zeros(J, dtype=bool)
    chosen[order[rank < _CG_INITIAL]] = True
    chosen[c.cur > 0] = True
    order_vars = np.concatenate([np.nonzero(chosen)[0], np.arange(J, mat.num_cols)])
    h = _highs(mat, mat.serve_obj, math.inf, mip_gap, mip=False, cols=order_vars)
    stop.attach(h)
    ok = highspy.HighsModelStatus.kOptimal
    for objective in (mat.serve_obj, mat.cost_obj):
        if objective is mat.cost_obj:
            h.changeColsCost(len(order_vars), np.arange(len(order_vars), dtype=np.int32), mat.cost_obj[order_vars])
            h.changeRowBounds(mat.service_row, -np.inf, _service_hi(c, out.unmet))
        while True:
            h.run()
            out.iterations += _iterations(h)[0]
            if h.getModelStatus() != ok:
                return
            duals = np.asarray(h.getSolution().row_dual, dtype=np.float64)
            d = _reduced_costs(mat, objective, duals)[:J]
            scale = max(1.0, float(np.abs(objective).max()))
            cand = np.nonzero((d < -1e-9 * scale) & ~chosen)[0]
            if len(cand) == 0:
                break
            cand = cand[np.lexsort((d[cand], c.m[cand]))]
            firsts = np.searchsorted(c.m[cand], c.m[cand], side="left")
            new = cand[np.arange(len(cand)) - firsts < _CG_ADD]
            chosen[new] = True
            _add_cols(h, mat, objective, new)
            order_vars = np.concatenate([order_vars, new])
        if objective is mat.serve_obj:
            out.unmet = max(float(h.getInfo().objective_function_value), 0.0)
    values = np.zeros(mat.num_cols)
    values[order_vars] = np.asarray(h.getSolution().col_value, dtype=np.float64)
    out.done = True
    out.values = values
    out.duals = duals
    out.bound = float(h.getInfo().objective_function_value)
    out.columns = np.nonzero(chosen)[0]


@attrs.define
class _DiveOutcome:
    """How far an LP dive went (LP solves), whether it ended integral, and its last rounded-down plan."""

    steps: int = 0
    done: bool = False
    plan: IntArray | None = None


def _dive_job(c: _Columns, mat: _Matrix, mip_gap: float, limit: int | None, out: _DiveOutcome,
              stop: _LpStop, *, cost: bool = False) -> None:  # fmt: skip
    """LP diving for the most service: solve the min-unmet LP, round up (as a lower bound) the fractional
    integer variables that fit the availability with the others at their floors (parts >= 0.5, largest
    first, else the largest; when none fits, bound the least fractional one to its floor), and solve
    again, until the LP is integral (or infeasible). ``cost``: the same on the cost LP with every demand
    served (its floors, once integral, serve every demand)."""
    n_int = c.J + len(mat.keep_cols)
    col_of = np.concatenate([np.arange(c.J), mat.keep_cols])
    if cost:
        h = _highs(mat, mat.cost_obj, _service_hi(c, 0.0), mip_gap, mip=False)
    else:
        h = _highs(mat, mat.serve_obj, math.inf, mip_gap, mip=False)
    stop.attach(h)
    lo = mat.col_lo[:n_int].copy()
    hi = mat.col_hi[:n_int].copy()
    idx = np.arange(n_int, dtype=np.int32)
    while limit is None or out.steps < limit:
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return
        out.steps += 1
        v = np.asarray(h.getSolution().col_value, dtype=np.float64)[:n_int]
        base = np.floor(v + 1e-6)
        x = np.bincount(col_of, weights=base, minlength=c.J).round().astype(np.int64)
        out.plan = x
        frac = v - base
        state = _State(c, x)
        ups: list[int] = []
        for i in np.argsort(-frac, kind="stable"):
            if frac[i] <= 1e-6 or (ups and frac[i] < 0.5):
                break
            j = int(col_of[i])
            if state.fits(j):
                state.change(j, 1)
                ups.append(int(i))
        if not ups:
            part = np.where(frac > 1e-6, frac, np.inf)
            if not np.isfinite(part).any():
                out.done = True
                return
            down = int(np.argmin(part))  # nothing fits once more: the least fractional one goes down
            hi[down] = base[down]
        else:
            lo[ups] = base[ups] + 1
        h.changeColsBounds(n_int, idx, lo, np.maximum(hi, lo))
