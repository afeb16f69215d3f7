"""The HiGHS model of the allocation program.

Formulation
-----------
Letters (here and in the code of this package): models m (M of them), regions r (R), node types g (T),
templates t, columns j = (t, r) (J), disaggregated pools q = (m, r, l) where region r has decode columns
of model m whose KV transfer holds behind a prefill instance of NIC class l, and prefill columns of class
>= l (Q; ``solvers.allocation.columns``: a decode column is in one pool; a prefill column of class c may
feed every pool (m, r, l) with l <= c, the pairs (j, q) being F_j); the decomposition's groups are sets
of models, each named in the code by its first model (``lead``). Lossless reductions first:
exact-duplicate templates (same model, mode, node counts, capacities, load time) are merged; a column
exists only where the template fits region r's availability at least once and uses only node types
offered there; templates of models without demand, and prefill (decode) columns without a compatible
decode (prefill) column of their model in their region, are dropped (they can only cost).

Data per column j: model m_j, mode, node counts n[j, g]; hourly cost c_j = sum_g n[j, g] price[r, g];
churn penalty p_j = churn_factor * load_s / 3600 * c_j per started instance; upper bound
ub_j = min_g floor(avail[r, g] / n[j, g]); running count cur_j. An aggregated column serves
a_j = util / (in_m / P_j + out_m / D_j) req/s at the model's shape; a prefill instance feeds
e_j = min(util P_j / in_m, B_j / (in_m kv_m)) req/s (its compute, and its NICs' B_j = sum_g n[j, g] nic[g]
bytes/s carrying each request's in_m kv_m bytes of KV: both bound the requests it prefills), a decode
instance serves f_j = util D_j / out_m req/s. (util: the utilisation target; in_m, out_m: mean tokens per
request; kv_m: KV bytes per token.)

Variables:
- new_j in Z, 0 <= new_j <= ub_j: instances of column j started;
- keep_j in Z, 0 <= keep_j <= min(cur_j, ub_j): running instances kept (only where cur_j > 0);
  the plan is x_j = keep_j + new_j (split churn: no rows for it);
- v_q >= 0: req/s of prefill supply that pool q passes down its (m, r)'s chain to the next lower level
  q- (``columns``: each chain lists its pools from the highest level down; a prefill column j enters at
  the highest pool it may feed, its entry pool, and may feed it or any lower one). By flow
  decomposition this is the same as continuous shares z_{j,q} of each prefill column's instances
  feeding each pool (j, q) in F_j: one instance's requests may go to decode instances of several
  levels, and only the req/s matters;
- y_q >= 0, q = (m, r, l): req/s of model m served disaggregated in region r at NIC level l;
- u_m in [0, d_m]: unmet demand of model m in req/s, for each model with demand d_m > 0; w_m > 0 is its
  priority (the scenario's, default 1).

Constraints:
- demand (m):      sum_{j aggregated of m} a_j x_j + sum_{q of m} y_q + u_m >= d_m;
- avail (r, g):    sum_{j in r} n[j, g] x_j <= avail[r, g];
- prefill (q):     y_q + v_q <= v_{q+} + sum_{j prefill entering at q} e_j x_j, with q+ the next higher
                   pool of q's chain (no v_{q+} at the highest);
- decode (q):      y_q <= sum_{j decode in q} f_j x_j;
- service:        sum_m w_m u_m <= U.

Coefficient strengthening (exact): in the rows above each rate a_j, e_j, f_j is capped at its model's
demand d_m (the code's ``_capped``). Every plan x keeps a point (y, v, u) that serves as much: its
flows can be cut to total d_m, and then y_q + v_q - v_{q+} <= d_m in each prefill row and y_q <= d_m in
each decode row, so a column with a rate >= d_m and x_j >= 1 meets its row at d_m. The program's x
therefore keeps its feasible set and its optimum, and its LP relaxation gets much tighter: on core most
prefill and decode rates exceed their model's demand, and one model's MIP (optimum $12.53/h) has a root
LP bound of $11.77/h instead of $6.11/h.

Objective, lexicographic, in two phases ("serve first"):
1. serve: minimise sum_m w_m u_m with U = +inf, giving U*;
2. cost:  minimise sum_j c_j x_j + sum_j p_j new_j with U = U* (1 + 1e-9) + 1e-7 max(1, sum_m w_m d_m).

Two phases rather than a weight on u: with integer instances no finite weight is provably large
enough. A weight above the largest cost per req/s of any template fails when the last 0.1 req/s
needs a whole instance that costs more than 0.1 times the weight; a weight large enough for a given
tolerance is numerically ugly, and the study measured it 1.5x slower. Phase 1 is skipped (U* proven)
when the heuristic plan's unmet demand equals the LP relaxation's minimum, as whenever nothing is
scarce.
"""

from __future__ import annotations

import attrs
import highspy
import numpy as np
from numpy.typing import NDArray

from solvers.allocation.columns import _AGG, _DEC, _PRE, _Columns
from solvers.allocation.heuristics import _State

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


@attrs.frozen(eq=False)
class _Matrix:
    """The program in column-wise form: variables [new (J), keep (K), v (Q), y (Q), u (Md)]."""

    num_rows: int
    row_lo: FloatArray
    row_hi: FloatArray
    service_row: int
    col_lo: FloatArray
    col_hi: FloatArray
    start: NDArray[np.int32]
    index: NDArray[np.int32]
    value: FloatArray
    keep_cols: IntArray  # column j of each keep variable
    dem_models: IntArray  # model of each u variable
    cost_obj: FloatArray
    serve_obj: FloatArray
    integer: NDArray[np.int32]
    capped: _Columns  # the columns with each rate capped at its model's demand (the coefficients above)

    @property
    def num_cols(self) -> int:
        return len(self.col_lo)


def _capped(c: _Columns) -> _Columns:
    """c with each column's rates capped at its model's demand (the formulation's coefficient strengthening)."""
    d = c.demand[c.m]
    return attrs.evolve(c, rate=np.minimum(c.rate, d), prate=np.minimum(c.prate, d), drate=np.minimum(c.drate, d))


def _matrix(c: _Columns) -> _Matrix:
    J, Q, M = c.J, c.Q, c.M
    c = _capped(c)
    V = Q  # the carries v
    dem_models = np.nonzero(c.demand > 0)[0].astype(np.int64)
    row_dem = np.full(M, -1, dtype=np.int64)
    row_dem[dem_models] = np.arange(len(dem_models))
    n = len(dem_models)
    jj, gg = np.nonzero(c.nc > 0)
    av_used = np.zeros((c.R, c.T), dtype=bool)
    av_used[c.r[jj], gg] = True
    av_r, av_g = np.nonzero(av_used)
    row_av = np.full((c.R, c.T), -1, dtype=np.int64)
    row_av[av_r, av_g] = n + np.arange(len(av_r))
    n += len(av_r)
    pre = np.nonzero(c.mode == _PRE)[0]
    row_pre = n + np.arange(Q)
    row_dec = n + Q + np.arange(Q)
    n += 2 * Q
    service_row = n
    n += 1
    row_lo = np.full(n, -np.inf)
    row_hi = np.zeros(n)
    row_lo[: len(dem_models)] = c.demand[dem_models]
    row_hi[: len(dem_models)] = np.inf
    row_hi[row_av[av_r, av_g]] = c.avail[av_r, av_g]
    row_hi[service_row] = np.inf

    # entries of the x columns (new_j; keep copies them)
    cols: list[IntArray] = []
    rows: list[IntArray] = []
    vals: list[FloatArray] = []
    agg = np.nonzero(c.mode == _AGG)[0]
    cols.append(agg)
    rows.append(row_dem[c.m[agg]])
    vals.append(c.rate[agg])
    cols.append(jj)
    rows.append(row_av[c.r[jj], gg])
    vals.append(c.nc[jj, gg].astype(np.float64))
    dec = np.nonzero(c.mode == _DEC)[0]
    cols.append(pre)
    rows.append(row_pre[c.pool[pre]])
    vals.append(-c.prate[pre])
    cols.append(dec)
    rows.append(row_dec[c.pool[dec]])
    vals.append(-c.drate[dec])
    xc, xr, xv = np.concatenate(cols), np.concatenate(rows), np.concatenate(vals)
    keep_cols = np.nonzero(c.cur > 0)[0].astype(np.int64)
    K = len(keep_cols)
    keep_of = np.full(J, -1, dtype=np.int64)
    keep_of[keep_cols] = J + np.arange(K)
    kmask = keep_of[xc] >= 0
    # v, y and u columns
    g, k = c.pool_group, c.pool_pos
    nxt = c.pool_grid[g, np.minimum(k + 1, c.pool_grid.shape[1] - 1)]
    down = np.nonzero((k + 1 < c.pool_grid.shape[1]) & (nxt < Q))[0]
    v_ids = J + K + np.arange(V)
    v_c = np.concatenate([v_ids, v_ids[down]])
    v_r = np.concatenate([row_pre, row_pre[nxt[down]]])
    v_v = np.concatenate([np.ones(V), -np.ones(len(down))])
    gidx = np.arange(Q)
    y_c = np.concatenate([gidx, gidx, gidx]) + J + K + V
    y_r = np.concatenate([row_dem[c.pool_m], row_pre, row_dec])
    y_v = np.ones(len(y_c))
    u_ids = J + K + V + Q + np.arange(len(dem_models))
    u_c = np.concatenate([u_ids, u_ids])
    u_r = np.concatenate([row_dem[dem_models], np.full(len(dem_models), service_row)])
    u_v = np.concatenate([np.ones(len(dem_models)), c.weight[dem_models]])
    all_c = np.concatenate([xc, keep_of[xc[kmask]], v_c, y_c, u_c])
    all_r = np.concatenate([xr, xr[kmask], v_r, y_r, u_r])
    all_v = np.concatenate([xv, xv[kmask], v_v, y_v, u_v])
    order = np.lexsort((all_r, all_c))
    ncols = J + K + V + Q + len(dem_models)
    start = np.zeros(ncols + 1, dtype=np.int64)
    start[1:] = np.cumsum(np.bincount(all_c, minlength=ncols))
    col_lo = np.zeros(ncols)
    col_hi = np.concatenate(
        [
            c.ub.astype(np.float64),
            np.minimum(c.cur, c.ub)[keep_cols].astype(np.float64),
            np.full(V + Q, np.inf),
            c.demand[dem_models],
        ]
    )
    cost_obj = np.concatenate([c.cost + c.pen, c.cost[keep_cols], np.zeros(V + Q + len(dem_models))])
    serve_obj = np.concatenate([np.zeros(J + K + V + Q), c.weight[dem_models]])
    return _Matrix(
        num_rows=n,
        row_lo=row_lo,
        row_hi=row_hi,
        service_row=service_row,
        col_lo=col_lo,
        col_hi=col_hi,
        start=start[:-1].astype(np.int32),
        index=all_r[order].astype(np.int32),
        value=all_v[order],
        keep_cols=keep_cols,
        dem_models=dem_models,
        cost_obj=cost_obj,
        serve_obj=serve_obj,
        integer=np.arange(J + K, dtype=np.int32),
        capped=c,
    )


def _highs(
    mat: _Matrix,
    objective: FloatArray,
    service_hi: float,
    mip_gap: float,
    *,
    mip: bool,
    cols: IntArray | None = None,
    row_lo: FloatArray | None = None,
    cuts: list[tuple[IntArray, float]] | None = None,
) -> highspy.Highs:
    """A HiGHS model of the program, with all rows and the variables ``cols`` (default: all).

    ``row_lo`` replaces the rows' lower bounds; each cut (variables, lo) adds the row
    sum(objective[v] * v for v in variables) >= lo, over the variables present.
    """
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("mip_rel_gap", mip_gap)
    row_hi = mat.row_hi.copy()
    row_hi[mat.service_row] = service_hi
    empty = np.zeros(0, dtype=np.int32)
    h.addRows(mat.num_rows, mat.row_lo if row_lo is None else row_lo, row_hi, 0, empty, empty, np.zeros(0))
    if cols is None:
        cols = np.arange(mat.num_cols)
    _add_cols(h, mat, objective, cols)
    if cuts:
        pos = np.full(mat.num_cols, -1, dtype=np.int64)
        pos[cols] = np.arange(len(cols))
        present = [variables[pos[variables] >= 0] for variables, _lo in cuts]
        starts = np.cumsum([0] + [len(v) for v in present[:-1]]).astype(np.int32)
        index = np.concatenate([pos[v] for v in present]).astype(np.int32)
        lows = np.array([lo for _variables, lo in cuts])
        h.addRows(
            len(cuts), lows, np.full(len(cuts), np.inf), len(index), starts, index,
            np.concatenate([objective[v] for v in present]),
        )  # fmt: skip
    if mip:
        # HiGHS's MIP presolve never checks the interrupt callback: on core's whole cost MIP (177 rows,
        # 6,484 columns) it ran 2.2 s past a 0.05 s deadline at load 14 and removed 80 columns (the
        # neighbourhood search's MIPs, a few free variables and the rest fixed, turn it on: ``_mip_job``)
        h.setOptionValue("presolve", "off")
        # every MIP here starts from a feasible plan; the feasibility jump heuristic cost a fixed ~17 ms of
        # CPU per MIP even on 3 variables (HiGHS 1.15), most of a per-model MIP's time on core
        h.setOptionValue("mip_heuristic_run_feasibility_jump", False)
        integer = np.nonzero(cols < len(mat.integer))[0].astype(np.int32)
        kinds = np.full(len(integer), int(highspy.HighsVarType.kInteger), dtype=np.uint8)
        h.changeColsIntegrality(len(integer), integer, kinds)
    return h


def _col_entries(mat: _Matrix, cols: IntArray) -> tuple[IntArray, IntArray]:
    """(offsets, entries) of the variables ``cols``: their nonzeros' positions in ``mat.index``/``mat.value``,
    column after column, and where each column's start (len(cols) + 1 offsets)."""
    ends = np.append(mat.start[1:], len(mat.value)).astype(np.int64)
    lengths = ends[cols] - mat.start[cols]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return offsets, np.repeat(mat.start[cols] - offsets[:-1], lengths) + np.arange(offsets[-1])


def _add_cols(h: highspy.Highs, mat: _Matrix, objective: FloatArray, cols: IntArray) -> None:
    """Add the variables ``cols`` (indices into the full program) to h, in that order."""
    offsets, entries = _col_entries(mat, cols)
    start, index, value = offsets[:-1].astype(np.int32), mat.index[entries], mat.value[entries]
    h.addCols(len(cols), objective[cols], mat.col_lo[cols], mat.col_hi[cols], len(value), start, index, value)


def _reduced_costs(mat: _Matrix, objective: FloatArray, row_dual: FloatArray) -> FloatArray:
    """Reduced cost of every variable at the row duals: c - A^T y."""
    col_of_entry = np.repeat(np.arange(mat.num_cols), np.diff(np.append(mat.start, len(mat.value))))
    return objective - np.bincount(col_of_entry, weights=mat.value * row_dual[mat.index], minlength=mat.num_cols)


def _service_hi(c: _Columns, unmet: float) -> float:
    return unmet * (1 + 1e-9) + 1e-7 * max(1.0, float((c.weight * c.demand).sum()))


def _plan_vector(c: _Columns, mat: _Matrix, x: IntArray) -> FloatArray:
    """Plan x as a point of the program: its flows and carries under the capped rates serve as much."""
    s = _State(mat.capped, x)
    new = np.maximum(x - c.cur, 0)
    keep = np.minimum(x, c.cur)[mat.keep_cols]
    y = s.flows()
    u = np.maximum(c.demand - s.capacity(), 0.0)[mat.dem_models]
    return np.concatenate([new.astype(np.float64), keep.astype(np.float64), s.carries(), y, u])


def _x_of(c: _Columns, mat: _Matrix, values: FloatArray) -> IntArray:
    x = np.round(values[: c.J]).astype(np.int64)
    x[mat.keep_cols] += np.round(values[c.J : c.J + len(mat.keep_cols)]).astype(np.int64)
    return x


def _iterations(h: highspy.Highs) -> tuple[int, int]:
    info = h.getInfo()
    return max(int(info.simplex_iteration_count), 0), max(int(info.mip_node_count), 0)


def _highs_solution(values: FloatArray) -> highspy.HighsSolution:
    sol = highspy.HighsSolution()
    sol.col_value = values.tolist()
    sol.value_valid = True
    return sol
