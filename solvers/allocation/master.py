"""Restricted master MIPs (price and branch): the cost MIP over the columns that the LP prices cheap.

Formulation
-----------
The program of ``solvers.allocation.model`` at full service (phase 2, U = U* with U* = 0), with every
integer variable left out (fixed at 0) whose LP reduced cost is above a threshold. Letters as there;
besides: z_LP the LP optimum with all demand served, pi its row duals, d_i = cost_i - A_i^T pi the
reduced cost of integer variable i (a new_j or keep_j), Delta >= 0 the round's threshold, x^B the best
plan so far and z^B its cost plus churn.

Round k keeps the integer variables S_k = {i : LP value_i > 0 or d_i <= Delta_k} plus every keep_j and
the new_j of each column that x^B uses, and all continuous variables (v, y, u); it solves

    min sum_{i in S_k} cost_i x_i   s.t. the program's rows, x_i = 0 for i not in S_k,

warm-started with x^B, where Delta_k = s_k = f 2^k max(z_LP, z^B - z_LP) (f = ``MASTER_FIRST``), or
z^B - z_LP where that is at most 1.5 s_k (the round that can prove x^B optimal, one round early), z^B
taken when the round starts.

Bound: for every plan x of the program, cost(x) >= z_LP + sum_{i at its lower bound 0} d_i x_i (LP
duality; the terms of variables at their upper bound and of the rows' slacks are >= 0 too). A plan with
x_i >= 1 for some i not in S_k (d_i > Delta_k) therefore costs more than z_LP + Delta_k, and every plan
costs at least min(L_k, z_LP + Delta_k), where L_k is the restricted MIP's dual bound (a lower bound on
every plan inside S_k; +inf when that MIP is infeasible). The rounds end when that bound is within the
MIP gap of z^B, or after a round solved to its end with Delta_k = z^B - z_LP or with every variable in
S_k: every plan cheaper than z^B is then inside S_k, so the round's optimum is the program's (within the
MIP gap). Each round is cut by the deadline; the rounds and the improving solutions taken in the
last one are the phase's effort (``SolverEffort.master``).

Why: on the savings study's cells at 2x and 5x demand the LP bound is 3-12% below the optimum, the
rounding heuristic 5-20% above it, and the whole MIP needs 4-120 s; a restricted MIP over the few hundred
variables priced within 2-4% of z_LP held the optimum in every 2x cell and solved in 0.05-0.5 s. At 5x
a round of 2% (640 variables on core's 5x scarce cell) spent 5 s at the root in HiGHS's cut loop, so
the rounds start small: there Delta = 0.5% (106 variables) solved in 0.5 s to a plan cheaper than the
whole MIP found in 120 s; on core and ``scarce`` the three rounds added below 2% took 0.03 s in all.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
import highspy
import numpy as np
from numpy.typing import NDArray

from solvers.allocation.columns import _Columns
from solvers.allocation.decomposition import _mip_phase
from solvers.allocation.model import _Matrix, _reduced_costs, _service_hi
from solvers.allocation.relaxation import _LpOutcome
from solvers.allocation.stopping import _Deadline, _Mip

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


MASTER_FIRST = 0.0025
"""f: the first round's threshold as a share of the LP bound (doubled each round; the module docstring
says why it is small)."""

MASTER_NODES = 200
"""Branch-and-bound nodes each round's MIP may take: a round that needs more ends the rounds (the
decomposition and the whole MIP, which prove such instances better, follow)."""

MASTER_SHARE = 0.35
"""Share of the time left after the heuristic that the restricted master MIPs may use: on core and
``scarce`` they end in 0.03 s, at 5x demand a round they cannot finish would take it all, and the
neighbourhood search, which follows, found cheaper plans there in the rest."""


@attrs.define
class _Master:
    """Where the rounds stand: the next round, its threshold's bound, and the best bound proven."""

    lp_cost: float
    reduced: FloatArray  # d_i of the integer variables (new, keep)
    support: NDArray[np.bool_]  # LP value_i > 0
    round: int = 0
    bound: float = -math.inf  # min(L_k, z_LP + Delta_k), the best over the rounds run
    whole: bool = False  # the last round held every variable
    solved: bool = False  # the last round's MIP ran to its end, optimal or infeasible
    exact: bool = False  # ... and had Delta = z^B - z_LP or every variable: x^B is then optimal
    iterations: int = 0
    nodes: int = 0


def _master_start(c: _Columns, mat: _Matrix, lp: _LpOutcome) -> _Master | None:
    """The rounds' state from the LP (which must serve every demand and carry its duals), or None."""
    if lp.values is None or lp.duals is None:
        return None
    n_x = c.J + len(mat.keep_cols)
    d = _reduced_costs(mat, mat.cost_obj, lp.duals)[:n_x]
    return _Master(lp_cost=lp.bound, reduced=d, support=lp.values[:n_x] > 1e-9)


def _delta(st: _Master, best_cost: float) -> float:
    """Delta_k of the next round (best_cost: z^B, inf when no plan serves every demand)."""
    gap = max(best_cost - st.lp_cost, 0.0)
    scale = max(abs(st.lp_cost), gap if math.isfinite(gap) else 0.0, 1e-9)
    step = MASTER_FIRST * 2.0**st.round * scale
    return gap if gap <= 1.5 * step else step


def _master_vars(c: _Columns, mat: _Matrix, st: _Master, best: IntArray, delta: float) -> IntArray:
    """S_k with the continuous variables: indices into the program's variables, sorted."""
    n_x = c.J + len(mat.keep_cols)
    tol = 1e-9 * max(1.0, abs(st.lp_cost))
    keep = st.support | (st.reduced <= delta + tol)
    keep[c.J :] = True
    keep[: c.J] |= best > 0
    return np.concatenate([np.nonzero(keep)[0], np.arange(n_x, mat.num_cols)])


def _master_round(
    c: _Columns,
    mat: _Matrix,
    st: _Master,
    best: IntArray,
    best_cost: float,
    limit: int | None,
    deadline: _Deadline | None,
    mip_gap: float,
    on_solution: Callable[[_Mip, list[IntArray]], None] | None = None,
) -> tuple[_Mip, list[IntArray]]:
    """Round ``st.round``: (its MIP run, the plans it found); ``st`` moves to the next round, with the
    round's bound when its MIP finished or took a solution (a cut run's bound is its k-th solution's)."""
    delta = _delta(st, best_cost)
    cols = _master_vars(c, mat, st, best, delta)
    n_x = c.J + len(mat.keep_cols)
    mip, plans = _mip_phase(
        c, mat, mat.cost_obj, _service_hi(c, 0.0), best, limit, deadline, mip_gap, cols, on_solution=on_solution,
        max_nodes=MASTER_NODES,
    )  # fmt: skip
    st.iterations += mip.iterations
    st.nodes += mip.nodes
    inside = math.inf if mip.finished and mip.status == highspy.HighsModelStatus.kInfeasible else mip.dual_bound
    st.whole = int(np.sum(cols < n_x)) == n_x
    ends = (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kInfeasible)
    st.solved = mip.finished and mip.status in ends
    st.exact = st.solved and (st.whole or delta >= best_cost - st.lp_cost)
    outside = math.inf if st.whole else st.lp_cost + delta - 1e-9 * max(1.0, abs(st.lp_cost))
    st.bound = max(st.bound, min(inside, outside))
    st.round += 1
    return mip, plans
