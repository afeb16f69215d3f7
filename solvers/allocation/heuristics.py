"""Plan evaluation and the greedy repair and local search heuristics (pure numpy, deterministic)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping

import numpy as np
from numpy.typing import NDArray

from solvers.allocation.columns import _AGG, _PRE, _TOL, _Columns

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


def _chain_flows(grid: IntArray, gs: FloatArray, gd: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Max flow of each (m, r)'s chain of pools (``columns``): prefill supply gs_k enters at position k and
    may feed any position >= k, position k's decode serves at most gd_k. With S_k and D_k the sums up to
    k and V_k = S_k - D_k (V_0 = 0), the flow through positions 1..k is F_k = D_k + min_{i<=k} V_i (min
    cut). Returns (F per grid cell, V with V_0 first, its prefix minima)."""
    S = np.cumsum(gs[grid], axis=1)
    D = np.cumsum(gd[grid], axis=1)
    V = np.concatenate([np.zeros((len(grid), 1)), S - D], axis=1)
    low = np.minimum.accumulate(V, axis=1)
    return D + low[:, 1:], V, low


class _State:
    """A plan x over the columns with incremental supply and decode sums per pool, node usage and
    per-column room. The pools' flows are the max flow of each chain (``_chain_flows``): exact for x."""

    def __init__(self, c: _Columns, x: IntArray) -> None:
        self.c = c
        self.x = x.astype(np.int64).copy()
        nz = np.flatnonzero(self.x)  # a plan uses few columns: sum over those alone
        xf = self.x[nz].astype(np.float64)
        self.agg = np.bincount(c.m[nz], weights=c.rate[nz] * xf, minlength=c.M)
        pool = c.pool[nz]
        ing = pool >= 0
        # one padding pool (index Q) that the grid points to
        self.gs: FloatArray = np.bincount(pool[ing], weights=(c.prate[nz] * xf)[ing], minlength=c.Q + 1).astype(
            np.float64
        )
        self.gd: FloatArray = np.bincount(pool[ing], weights=(c.drate[nz] * xf)[ing], minlength=c.Q + 1).astype(
            np.float64
        )
        self.used = np.zeros((c.R, c.T), dtype=np.int64)
        np.add.at(self.used, c.r[nz], c.nc[nz] * self.x[nz, None])
        self._chains: tuple[IntArray, ...] | None = None  # per model: its rows of c.pool_grid (model_capacity)

    def room(self, idx: IntArray) -> IntArray:
        """How many more instances of each column in ``idx`` fit the availability left."""
        if len(idx) == 0:
            return np.zeros(0, dtype=np.int64)
        free = np.concatenate([self.c.avail - self.used, np.full((self.c.R, 1), 1 << 40)], axis=1)
        q = (free[self.c.r[idx][:, None], self.c.nz_type[idx]] // self.c.nz_count[idx]).min(axis=1)
        return np.maximum(q, 0)

    def flows(self) -> FloatArray:
        """req/s served by each pool's decode instances."""
        c = self.c
        if c.Q == 0:
            return np.zeros(0)
        F = _chain_flows(c.pool_grid, self.gs, self.gd)[0]
        y = np.zeros(c.Q + 1)
        y[c.pool_grid] = np.diff(F, axis=1, prepend=0.0)
        return y[: c.Q]

    def capacity(self) -> FloatArray:
        """Servable req/s per model (may exceed demand)."""
        c = self.c
        if c.Q == 0:
            return np.asarray(self.agg, dtype=np.float64).copy()
        F = _chain_flows(c.pool_grid, self.gs, self.gd)[0]
        chain_m = c.pool_m[c.pool_grid[:, 0]]
        return np.asarray(self.agg + np.bincount(chain_m, weights=F[:, -1], minlength=c.M), dtype=np.float64)

    def model_capacity(self, m: int) -> float:
        """``capacity()[m]`` from model m's own chains: the same sums in the same order, so the same value."""
        c = self.c
        if self._chains is None:
            chain_m = c.pool_m[c.pool_grid[:, 0]] if c.Q else np.zeros(0, dtype=np.int64)
            self._chains = tuple(np.flatnonzero(chain_m == k) for k in range(c.M))
        rows = self._chains[m]
        if len(rows) == 0:
            return float(self.agg[m])
        F = _chain_flows(c.pool_grid[rows], self.gs, self.gd)[0]
        return float(self.agg[m] + np.bincount(np.zeros(len(rows), dtype=np.int64), weights=F[:, -1])[0])

    def model_unmet(self, m: int) -> float:
        """``unmet()[m]``, from model m's own chains."""
        return max(float(self.c.demand[m]) - self.model_capacity(m), 0.0)

    def unmet_of(self, models: IntArray) -> FloatArray:
        """``unmet()`` at ``models``, 0 at the other models."""
        if len(models) == self.c.M:
            return self.unmet()
        out = np.zeros(self.c.M)
        for m in models:
            out[m] = self.model_unmet(int(m))
        return out

    def gains(self, idx: IntArray) -> FloatArray:
        """How much more its chain serves (req/s) with one more instance of each column in ``idx``
        (aggregated: its rate): adding supply s at position k makes the flow D_L + min(P_k, W_k + s),
        decode d there D_L + d + min(P_k, W_k - d), with P_k = min_{i<k} V_i and W_k = min_{i>=k} V_i."""
        c = self.c
        out = c.rate[idx].copy()
        dis = c.mode[idx] != _AGG
        if not np.any(dis):
            return out
        jd = idx[dis]
        F, V, low = _chain_flows(c.pool_grid, self.gs, self.gd)
        high = np.minimum.accumulate(V[:, ::-1], axis=1)[:, ::-1]
        q = c.pool[jd]
        g, k = c.pool_group[q], c.pool_pos[q]
        before, after = low[g, k], high[g, k + 1]
        d_end = F[g, -1] - low[g, -1]
        sup, dem = c.prate[jd], c.drate[jd]
        new = d_end + np.where(
            c.mode[jd] == _PRE, np.minimum(before, after + sup), dem + np.minimum(before, after - dem)
        )
        out[dis] = np.maximum(new - F[g, -1], 0.0)
        return out

    def pair_gain(self, a: int, b: int) -> float:
        """How much more b's chain serves with one more instance of prefill column a and of decode
        column b (both of that chain)."""
        c = self.c
        gs, gd = self.gs.copy(), self.gd.copy()
        gs[c.pool[a]] += c.prate[a]
        gd[c.pool[b]] += c.drate[b]
        row = c.pool_grid[c.pool_group[c.pool[b]]][None, :]
        return float(_chain_flows(row, gs, gd)[0][0, -1] - _chain_flows(row, self.gs, self.gd)[0][0, -1])

    def carries(self) -> FloatArray:
        """The req/s of prefill supply each pool passes down its chain (the program's v) with ``flows()``:
        the supply that entered at it or above less what the pools down to it serve."""
        c = self.c
        if c.Q == 0:
            return np.zeros(0)
        F = _chain_flows(c.pool_grid, self.gs, self.gd)[0]
        v = np.zeros(c.Q + 1)
        v[c.pool_grid] = np.maximum(np.cumsum(self.gs[c.pool_grid], axis=1) - F, 0.0)
        return v[: c.Q]

    def unmet(self) -> FloatArray:
        return np.maximum(self.c.demand - self.capacity(), 0.0)

    def change(self, j: int, k: int) -> None:
        c = self.c
        self.x[j] += k
        self.agg[c.m[j]] += k * c.rate[j]
        q = c.pool[j]
        if q >= 0:
            self.gs[q] += k * c.prate[j]
            self.gd[q] += k * c.drate[j]
        self.used[c.r[j]] += k * c.nc[j]

    def fits(self, j: int) -> bool:
        """Whether one more instance of column j fits."""
        reg = self.c.r[j]
        return bool(np.all(self.used[reg] + self.c.nc[j] <= self.c.avail[reg]))

    def fits_together(self, a: int, b: int) -> bool:
        c = self.c
        reg = c.r[a]
        return bool(np.all(self.used[reg] + c.nc[a] + c.nc[b] <= c.avail[reg]))


def _objective(c: _Columns, x: IntArray) -> tuple[float, float]:
    """(hourly cost, churn penalty) of plan x."""
    # elementwise sums: BLAS dot products stall badly on a loaded 2-core machine
    return float((c.cost * x).sum()), float((c.pen * np.maximum(x - c.cur, 0)).sum())


def _marginal_cost(c: _Columns, x: IntArray, idx: IntArray) -> FloatArray:
    return c.cost[idx] + np.where(x[idx] >= c.cur[idx], c.pen[idx], 0.0)


_TAIL = 3  # instances dropped and added per tail move
_FRONTIER = 24  # most columns on a model's cost/rate frontier used for tail covers
_DROP_POOL = 8  # least efficient used columns of a model considered for dropping


@functools.cache
def _multisets(n: int, k_max: int) -> IntArray:
    """All count vectors over n items with total at most k_max, as rows (the first is all zero)."""
    rows = [
        np.bincount(np.array(cmb, dtype=np.int64), minlength=n)
        for k in range(k_max + 1)
        for cmb in itertools.combinations_with_replacement(range(n), k)
    ]
    return np.array(rows, dtype=np.int64).reshape(len(rows), n)


def _frontier(c: _Columns, s: _State, cols: IntArray) -> IntArray:
    """Columns of ``cols`` on the frontier of marginal cost (ascending) versus rate (increasing)."""
    if len(cols) == 0:
        return cols
    mc = _marginal_cost(c, s.x, cols)
    order = np.lexsort((-c.rate[cols], mc))
    rates = c.rate[cols[order]]
    prev_max = np.maximum.accumulate(np.concatenate([[-1.0], rates[:-1]]))
    front = cols[order[rates > prev_max + 1e-12]]
    return front[-_FRONTIER:] if len(front) > _FRONTIER else front


def _cover_table(c: _Columns, s: _State, front: IntArray) -> tuple[FloatArray, FloatArray, IntArray, IntArray]:
    """Every multiset of up to _TAIL frontier instances, sorted by rate, with the index of the cheapest
    multiset of at least that rate: (rates, costs, cheapest-from-here, count rows)."""
    counts = _multisets(len(front), _TAIL)
    rates = (counts * c.rate[front][None, :]).sum(axis=1)
    costs = (counts * _marginal_cost(c, s.x, front)[None, :]).sum(axis=1)
    order = np.argsort(rates, kind="stable")
    rates, costs, counts = rates[order], costs[order], counts[order]
    rev = costs[::-1]
    at_min = rev <= np.minimum.accumulate(rev)
    last = np.maximum.accumulate(np.where(at_min, np.arange(len(rev)), 0))
    cheapest = (len(rev) - 1 - last)[::-1]
    return rates, costs, cheapest, counts


class _Budget:
    """Steps of local search (one model rebuilt or its tail exchanged) that a search may take: it stops
    at ``limit`` steps (a replay's count) or once ``stop()`` says so (the deadline), and then ``cut`` is
    set; ``taken`` counts the steps taken, which replays the search exactly."""

    def __init__(self, limit: int | None, stop: Callable[[], bool]) -> None:
        self.limit = limit
        self.stop = stop
        self.taken = 0
        self.cut = False

    def step(self) -> bool:
        if self.cut or (self.limit is not None and self.taken >= self.limit) or self.stop():
            self.cut = True
            return False
        self.taken += 1
        return True


def _repair(c: _Columns, x0: IntArray, frac: FloatArray | None = None, budget: _Budget | None = None) -> IntArray:
    """Greedy repair, then local search.

    With an LP solution ``frac`` (x0 its floor), first round up its fractional columns, most
    fractional first, while they serve unmet demand. Then add, best first, an aggregated instance
    fully used by the unmet demand (most req/s per USD/h), or a prefill or decode instance or pair
    (most req/s of unmet demand per USD/h). Cover what remains of each model with the cheapest
    multiset of up to three instances; drop instances that serve nothing needed; then local search
    on each model's tail (within ``budget``, if given).
    """
    s = _State(c, x0)
    tol = _TOL * np.maximum(c.demand, 1.0)
    if frac is not None:
        part = frac - x0
        for j in np.nonzero(part > 1e-6)[0][np.argsort(-part[part > 1e-6], kind="stable")]:
            if s.fits(int(j)) and s.unmet()[c.m[j]] > tol[c.m[j]]:
                s.change(int(j), 1)
    _fill(c, s, np.arange(c.M))
    _prune(c, s)
    _tail_search(c, s, budget=budget)
    return s.x


def _fill(c: _Columns, s: _State, models: IntArray, *, disagg_first: bool = False) -> None:
    """Serve the unmet demand of ``models``: aggregated instances that the demand fully uses (most
    req/s per USD/h first), then the cheapest cover of the rest by up to three aggregated instances,
    then the most req/s of unmet demand per USD/h among all instances and prefill+decode pairs.
    ``disagg_first`` starts with that last step on prefill and decode instances only."""
    is_model = np.zeros(c.M, dtype=bool)
    is_model[models] = True
    if disagg_first:
        _ratio_greedy(c, s, is_model, aggregated=False)
    _full_use_greedy(c, s, is_model)
    for m in models[np.argsort(-c.weight[models], kind="stable")]:  # highest priority first
        _cover_tail(c, s, int(m))
    _ratio_greedy(c, s, is_model, aggregated=True)


def _full_use_greedy(c: _Columns, s: _State, is_model: BoolArray) -> None:
    tol = _TOL * np.maximum(c.demand, 1.0)
    models = np.flatnonzero(is_model)
    while True:
        unmet = s.unmet_of(models)
        active = np.nonzero((unmet > tol) & is_model)[0]
        if len(active) == 0:
            return
        cand = np.concatenate([c.by_model[a] for a in active])
        cand = cand[c.mode[cand] == _AGG]
        cand = cand[s.room(cand) >= 1]
        cand = cand[c.rate[cand] <= unmet[c.m[cand]] + tol[c.m[cand]]]
        if len(cand) == 0:
            return
        value = c.weight[c.m[cand]] * c.rate[cand]
        j = int(cand[np.argmax(value / np.maximum(_marginal_cost(c, s.x, cand), 1e-12))])
        m = c.m[j]
        k = min(int(s.room(np.array([j]))[0]), int((unmet[m] + tol[m]) // c.rate[j]))
        if s.x[j] < c.cur[j]:
            k = min(k, int(c.cur[j] - s.x[j]))  # its marginal cost rises once the running ones are used
        s.change(j, max(k, 1))


def _ratio_greedy(c: _Columns, s: _State, is_model: BoolArray, *, aggregated: bool) -> None:
    """Add the instance (with ``aggregated``, or only prefill/decode) or prefill+decode pair that
    serves the most unmet demand per USD/h, until none serves more."""
    tol = _TOL * np.maximum(c.demand, 1.0)
    models = np.flatnonzero(is_model)
    while True:
        unmet = s.unmet_of(models)
        active = np.nonzero((unmet > tol) & is_model)[0]
        if len(active) == 0:
            return
        best_ratio = 0.0
        best: tuple[int, ...] = ()
        cand = np.concatenate([c.by_model[a] for a in active])
        cand = cand[aggregated | (c.mode[cand] != _AGG)]
        fit = np.zeros(c.J, dtype=bool)  # the columns of cand (every prefill and decode column of active) that fit
        fit[cand] = s.room(cand) >= 1
        cand = cand[fit[cand]]
        if len(cand):
            gain = np.minimum(s.gains(cand), unmet[c.m[cand]])
            value = c.weight[c.m[cand]] * gain
            ratio = np.where(gain > tol[c.m[cand]], value / np.maximum(_marginal_cost(c, s.x, cand), 1e-12), 0.0)
            k = int(np.argmax(ratio))
            if ratio[k] > 0:
                best_ratio, best = float(ratio[k]), (int(cand[k]),)
        for q in np.nonzero(np.isin(c.pool_m, active) & (s.gd[: c.Q] <= 0))[0]:
            pair = _best_pair(c, s, int(q), float(unmet[c.pool_m[q]]), fit)
            if pair is not None and pair[0] > best_ratio:
                best_ratio, best = pair
        if not best:
            return
        for j in best:
            s.change(j, 1)


def _best_pair(c: _Columns, s: _State, q: int, unmet: float, fit: BoolArray) -> tuple[float, tuple[int, ...]] | None:
    """The cheapest-per-capacity prefill instance that may feed pool q (without decode instances) and
    decode instance of q, as (ratio, pair); ``fit``: whether one more instance of each column fits (at
    least for those of q's chain)."""
    pre, dec = c.by_pool_pre[q], c.by_pool_dec[q]
    pre, dec = pre[fit[pre]], dec[fit[dec]]
    if len(pre) == 0 or len(dec) == 0:
        return None
    cp, cd = _marginal_cost(c, s.x, pre), _marginal_cost(c, s.x, dec)
    a = int(pre[np.argmin(cp / np.maximum(c.prate[pre], 1e-300))])
    b = int(dec[np.argmin(cd / c.drate[dec])])
    if not s.fits_together(a, b):
        return None
    gain = min(s.pair_gain(a, b), unmet)
    if gain <= _TOL * max(float(c.demand[c.pool_m[q]]), 1.0):
        return None
    value = float(c.weight[c.pool_m[q]]) * gain
    return value / max(float(_marginal_cost(c, s.x, np.array([a, b])).sum()), 1e-12), (a, b)


def _cover_tail(c: _Columns, s: _State, m: int) -> None:
    """Cover model m's unmet demand with the cheapest multiset of up to _TAIL aggregated instances."""
    unmet = s.model_unmet(m)
    if unmet <= _TOL * max(float(c.demand[m]), 1.0):
        return
    cols = c.by_model[m]
    agg = cols[c.mode[cols] == _AGG]
    front = _frontier(c, s, agg[s.room(agg) >= 1])
    if len(front) == 0:
        return
    rates, _costs, cheapest, counts = _cover_table(c, s, front)
    pos = int(np.searchsorted(rates, unmet * (1 - 1e-12), side="left"))
    if pos < len(rates):
        _apply(s, front, counts[cheapest[pos]])


def _apply(s: _State, front: IntArray, counts: IntArray) -> bool:
    """Add counts[i] instances of front[i] while they fit; True if all fitted."""
    for j, k in zip(front, counts, strict=True):
        for _ in range(int(k)):
            if not s.fits(int(j)):
                return False
            s.change(int(j), 1)
    return True


def _prune(c: _Columns, s: _State, cols: IntArray | None = None) -> None:
    """Drop instances (of ``cols``), largest saving first, while their model's service does not fall."""
    tol = _TOL * np.maximum(c.demand, 1.0)
    pos = np.nonzero(s.x > 0)[0] if cols is None else cols[s.x[cols] > 0]
    saving = c.cost[pos] + np.where(s.x[pos] > c.cur[pos], c.pen[pos], 0.0)
    for j in pos[np.argsort(-saving, kind="stable")]:
        m = c.m[j]
        while s.x[j] > 0:
            before = min(s.model_capacity(int(m)), float(c.demand[m]))
            s.change(int(j), -1)
            if min(s.model_capacity(int(m)), float(c.demand[m])) < before - tol[m]:
                s.change(int(j), 1)
                break


def _tail_search(c: _Columns, s: _State, max_passes: int = 50, budget: _Budget | None = None) -> None:
    """Local search per model: one pass of rebuilds (each model served again from scratch), then
    passes of tail exchanges (drop up to three of its least efficient instances, cover what they
    served with up to three others) while any pays. More rebuild passes measured 2.5x slower for a
    0.01% better plan. With ``budget``, each model's step takes one of its steps."""
    for k in range(max_passes):
        changed = False
        for m in range(c.M):
            if budget is not None and not budget.step():
                return
            changed = ((k == 0 and _rebuild_model(c, s, m)) or _improve_model(c, s, m)) or changed
        if not changed:
            return


def _rebuild_model(c: _Columns, s: _State, m: int) -> bool:
    """Remove all of model m's instances and serve it again from scratch; keep that if it is cheaper
    and serves as much."""
    cols = c.by_model[m]
    old = s.x[cols].copy()
    if not old.any():
        return False
    tol = _TOL * max(float(c.demand[m]), 1.0)
    served = min(s.model_capacity(int(m)), float(c.demand[m]))
    before = sum(_objective(c, s.x))
    best, best_x = before - 1e-9 * max(before, 1.0), old
    variants = (False, True) if np.any(c.pool_m == m) else (False,)
    for disagg_first in variants:
        _set_counts(s, cols, np.zeros(len(cols), dtype=np.int64))
        _fill(c, s, np.array([m]), disagg_first=disagg_first)
        _prune(c, s, cols)
        value = sum(_objective(c, s.x))
        if min(s.model_capacity(int(m)), float(c.demand[m])) >= served - tol and value < best:
            best, best_x = value, s.x[cols].copy()
    _set_counts(s, cols, best_x)
    return best_x is not old


def _set_counts(s: _State, cols: IntArray, counts: IntArray) -> None:
    """Set x[cols] = counts: removals first, so that the additions fit whenever the result does."""
    delta = counts - s.x[cols]
    for i in np.nonzero(delta < 0)[0]:
        s.change(int(cols[i]), int(delta[i]))
    for i in np.nonzero(delta > 0)[0]:
        s.change(int(cols[i]), int(delta[i]))


def _improve_model(c: _Columns, s: _State, m: int) -> bool:
    cols = c.by_model[m]
    agg = cols[c.mode[cols] == _AGG]
    used = agg[s.x[agg] > 0]
    if len(used) == 0:
        return False
    tol = _TOL * max(float(c.demand[m]), 1.0)
    other = s.model_capacity(int(m)) - float(s.agg[m])
    served = min(s.model_capacity(int(m)), float(c.demand[m]))
    used = used[np.argsort(c.rate[used] / _marginal_cost(c, s.x, used), kind="stable")][:_DROP_POOL]
    drops = _multisets(len(used), _TAIL)
    drops = drops[np.all(drops <= s.x[used][None, :], axis=1)]
    over = np.maximum(s.x[used] - c.cur[used], 0)
    saving = drops * c.cost[used][None, :] + c.pen[used][None, :] * (over - np.maximum(over - drops, 0))
    drop_save = saving.sum(axis=1)
    need = served - other - (s.agg[m] - (drops * c.rate[used][None, :]).sum(axis=1))
    front = _frontier(c, s, agg[(s.room(agg) >= 1) | (s.x[agg] > 0)])
    rates, costs, cheapest, counts = _cover_table(c, s, front)
    pos = np.searchsorted(rates, need - tol, side="left")
    ok = pos < len(rates)
    choice = np.where(ok, cheapest[np.minimum(pos, len(rates) - 1)], 0)
    delta = np.where(ok, costs[choice], np.inf) - drop_save
    before = sum(_objective(c, s.x))
    for d in np.argsort(delta, kind="stable")[:4]:
        if not delta[d] < -1e-9 * max(before, 1.0):
            break
        if _try_move(c, s, m, used, drops[d], front, counts[choice[d]], served - tol, before):
            return True
    return False


def _try_move(
    c: _Columns,
    s: _State,
    m: int,
    used: IntArray,
    drop: IntArray,
    front: IntArray,
    add: IntArray,
    served_min: float,
    before: float,
) -> bool:
    """Drop and add instances if the plan then fits, still serves ``served_min`` of model m and costs
    less; otherwise leave s as it was."""
    for j, k in zip(used, drop, strict=True):
        if k:
            s.change(int(j), -int(k))
    added: list[int] = []
    ok = True
    for j, k in zip(front, add, strict=True):
        for _ in range(int(k)):
            if not s.fits(int(j)):
                ok = False
                break
            s.change(int(j), 1)
            added.append(int(j))
    served = min(s.model_capacity(int(m)), float(c.demand[m]))
    if ok and served >= served_min and sum(_objective(c, s.x)) < before - 1e-9 * max(before, 1.0):
        return True
    for j in added:
        s.change(j, -1)
    for j, k in zip(used, drop, strict=True):
        if k:
            s.change(int(j), int(k))
    return False


def _fit_current(c: _Columns) -> IntArray:
    """The current deployment, cut to what fits the availability now (columns in order)."""
    return _fit(c, c.cur)


def _fit(c: _Columns, x: IntArray) -> IntArray:
    """Plan ``x`` cut to what fits the availability (columns in order)."""
    s = _State(c, np.zeros(c.J, dtype=np.int64))
    for j in np.nonzero(x > 0)[0]:
        k = min(int(x[j]), int(s.room(np.array([j]))[0]))
        if k > 0:
            s.change(int(j), k)
    return s.x


def _embed(c: _Columns, counts: Mapping[tuple[int, int], int]) -> IntArray:
    """Plan x over the columns holding ``counts`` instances of each (original template index, region);
    those without a column are left out."""
    col: dict[tuple[int, int], int] = {}
    for j in range(c.J):
        for i in c.members[int(c.tu[j])]:
            col[(i, int(c.r[j]))] = j
    x = np.zeros(c.J, dtype=np.int64)
    for key, n in counts.items():
        if key in col and n > 0:
            x[col[key]] += int(n)
    return x


def _unmet_total(c: _Columns, x: IntArray) -> float:
    """Unmet req/s of plan x, each model's weighted by its priority."""
    return float((c.weight * _State(c, x).unmet()).sum())


def _better(c: _Columns, a: IntArray, b: IntArray) -> bool:
    """Whether plan a beats plan b: less (priority-weighted) unmet demand, then lower cost plus churn."""
    tol = 1e-7 * max(1.0, float((c.weight * c.demand).sum()))
    ua, ub = _unmet_total(c, a), _unmet_total(c, b)
    if ua < ub - tol:
        return True
    if ua > ub + tol:
        return False
    oa, ob = sum(_objective(c, a)), sum(_objective(c, b))
    return oa < ob - 1e-9 * max(1.0, ob)


def _counts(c: _Columns, x: IntArray) -> dict[tuple[int, int], int]:
    """Map column counts back to original template indices: kept instances to the templates that
    run them, started ones to the first of the merged duplicates."""
    out: dict[tuple[int, int], int] = {}
    for j in np.nonzero(x > 0)[0]:
        reg = int(c.r[j])
        members = c.members[int(c.tu[j])]
        keep = min(int(x[j]), int(c.cur[j]))
        rest = int(x[j])
        for i in members:
            k = min(keep, c.cur_by_member.get((i, reg), 0))
            if k > 0:
                out[(i, reg)] = out.get((i, reg), 0) + k
                keep -= k
                rest -= k
        if rest > 0:
            out[(members[0], reg)] = out.get((members[0], reg), 0) + rest
    return out
