"""Fix-and-optimise neighbourhood search from the best plan: small cost MIPs, each over one region's or one
model's columns with every other integer variable fixed at the best plan's value.

Formulation
-----------
The program of ``solvers.allocation.model`` at full service (phase 2, U = U* with U* = 0). Letters as
there and in ``solvers.allocation.master`` (z_LP the LP optimum with all demand served, d_i the reduced
cost of integer variable i at its duals, x^B the best plan so far as a point (new, keep) of the program);
besides: the neighbourhoods N_1, ..., N_n, sets of columns: each model m's {j : m_j = m} and each region
r's {j : r_j = r} (the nonempty ones), fewest columns first (models before regions, then by index, on a
tie); each neighbourhood's width w_k, from 0, and Delta_w = 2^w f z_LP (f = ``SEARCH_DELTA``).

Step s solves, with k = (s mod n) + 1, N = N_k, w = w_k and x^B taken when the step starts,

    min sum_i cost_i x_i   s.t. the program's rows,
                                x_i = x^B_i           for the integer variables i of columns outside N,
                                x_i = 0               for i of a column in N with x^B_i = 0, LP value 0
                                                      and d_i > Delta_w (a keep_j is never fixed so),

warm-started with x^B (which satisfies it), with at most ``SEARCH_NODES`` branch-and-bound nodes. Its
plans are plans of the program, so the best plan only improves. A step without an improvement widens its
neighbourhood (w_k grows by one, up to ``SEARCH_WIDEN``); the search ends after n steps in a row without
an improvement at the widest Delta (every neighbourhood a local optimum there), after ``SEARCH_CYCLES`` n
steps, or at the deadline; in the search-first order of the largest programs (``solvers.allocation.solve``)
already after n steps in a row without an improvement at any Delta. It proves no bound. The steps run and
the improving solutions taken in the last one are the phase's effort (``SolverEffort.search``).

Why: models share only the availability rows, and regions only the demand rows, so fixing the rest
leaves MIPs that HiGHS mostly solves at its root in milliseconds (a few of the larger take 0.1-0.8 s),
where a master round over the same Delta on core's 5x cells takes the whole second.
"""

from __future__ import annotations

import attrs
import numpy as np
from numpy.typing import NDArray

from solvers.allocation.columns import _Columns
from solvers.allocation.decomposition import _mip_phase
from solvers.allocation.master import _Master
from solvers.allocation.model import _Matrix, _plan_vector, _service_hi
from solvers.allocation.stopping import _Deadline, _Mip

IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


SEARCH_DELTA = 0.005
"""f: Delta_0 / z_LP, the first reduced-cost threshold under which a variable of the neighbourhood is free."""

SEARCH_NODES = 50
"""Branch-and-bound nodes each step's MIP may take (a count, so a run it ends replays exactly)."""

SEARCH_WIDEN = 2
"""The widest w: a neighbourhood's Delta grows from f z_LP to 2^2 f z_LP = 2% of z_LP."""

SEARCH_CYCLES = 8
"""Most passes over the neighbourhoods (each improvement strictly lowers the cost, so the search ends
anyway; this bounds its length where the improvements are small)."""

SEARCH_SHARE = 0.8
"""Share of the time left after the master rounds that the search may use."""


def _neighbourhoods(c: _Columns) -> list[BoolArray]:
    """N_1, ..., N_n: each model's columns and each region's, the nonempty ones, fewest columns first (the
    small MIPs, which take milliseconds, come before the large ones, which can take the phase's time)."""
    hoods = [mask for mask in [c.m == m for m in range(c.M)] + [c.r == r for r in range(c.R)] if mask.any()]
    return sorted(hoods, key=lambda mask: int(mask.sum()))


def _step(
    c: _Columns,
    mat: _Matrix,
    st: _Master,
    best: IntArray,
    hood: BoolArray,
    limit: int | None,
    deadline: _Deadline | None,
    mip_gap: float,
    width: int,
) -> tuple[_Mip, list[IntArray]]:
    """One step's MIP over neighbourhood ``hood`` from plan ``best`` at width ``width``: (its run, the plans
    it found)."""
    n_x = c.J + len(mat.keep_cols)
    column = np.concatenate([np.arange(c.J), mat.keep_cols])  # the column of each integer variable
    vector = _plan_vector(c, mat, best)
    inside = hood[column]
    delta = 2.0**width * SEARCH_DELTA * abs(st.lp_cost) + 1e-9 * max(1.0, abs(st.lp_cost))
    free = inside & (st.support | (st.reduced <= delta) | (vector[:n_x] > 0))
    free[c.J :] |= inside[c.J :]
    fixed = ~inside & (vector[:n_x] > 0)  # outside N at a nonzero value; the rest of outside N is left out (0)
    lo, hi = mat.col_lo.copy(), mat.col_hi.copy()
    lo[:n_x][fixed] = hi[:n_x][fixed] = vector[:n_x][fixed]
    cols = np.concatenate([np.nonzero(free | fixed)[0], np.arange(n_x, mat.num_cols)])
    sub = attrs.evolve(mat, col_lo=lo, col_hi=hi)
    # presolve removes the fixed variables and the rows they settle: on extended's re-solves the search's
    # 60-90 MIPs per solve took 0.5-0.8 s with it, 0.9-1.6 s without, with the same plans
    return _mip_phase(
        c, sub, sub.cost_obj, _service_hi(c, 0.0), best, limit, deadline, mip_gap, cols, max_nodes=SEARCH_NODES,
        presolve=True,
    )  # fmt: skip
