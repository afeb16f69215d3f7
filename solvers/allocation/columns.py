"""The availability-filtered (template, region) columns of an allocation problem (lossless reductions:
merged duplicate templates, columns that fit their region, prefill/decode only where paired).

KV pairing by NIC. A prefill instance sends the KV cache of each request it prefilled from its own nodes'
NICs (B_j bytes/s), the slowest node's being its class ``pclass_j``; a decode template holds its SLO only
behind a sender of NIC at least ``kv_min_nic`` (``solvers.library.kv_min_nic``). So the disaggregated
pools are q = (m, r, l): model m in region r at level l, one of the prefill classes of (m, r). A decode
column j joins the pool of the least class l >= kv_min_nic_j (the prefill columns that may feed it are
exactly those of class >= l; none: it is dropped). A prefill column of class c is ONE column (one integer
count) that may feed every pool (m, r, l) with l <= c that holds a decode column, by continuous shares of
its instances (none: it is dropped; ``by_pool_pre``: the prefill columns that may feed each pool). Its
entry pool ``pool_j`` is the highest of them. The pools of one (m, r) form a chain, highest level first
(``pool_pos``, ``pool_grid``): a prefill instance entering at position k may feed positions >= k.

Per instance, a prefill column feeds ``prate_j`` = min(util P_j / in_m, B_j / (in_m kv_m)) req/s (each
request's KV leaves from the instance that prefilled it, so its compute and its NIC bound it together),
and a decode column serves ``drate_j`` = util D_j / out_m req/s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
from numpy.typing import NDArray

from solvers.allocation.problem import MODES, AllocationProblem, AllocTemplate

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


_AGG, _PRE, _DEC = 0, 1, 2
_TOL = 1e-9


@attrs.frozen(eq=False)
class _Columns:
    """The availability-filtered (template, region) columns and everything derived from them."""

    M: int
    R: int
    T: int
    demand: FloatArray
    weight: FloatArray  # priority of each model's unmet req/s
    mean_in: FloatArray
    mean_out: FloatArray
    kv: FloatArray
    avail: IntArray  # (R, T)
    members: tuple[tuple[int, ...], ...]  # unique template -> original template indices
    cur_by_member: Mapping[tuple[int, int], int]  # (original index, region) -> running count
    tu: IntArray  # (J,) unique template
    r: IntArray
    m: IntArray
    mode: IntArray
    nc: IntArray  # (J, T)
    cost: FloatArray
    pen: FloatArray
    ub: IntArray
    cur: IntArray
    rate: FloatArray  # req/s for aggregated columns, else 0
    prate: FloatArray  # req/s a prefill instance feeds, else 0
    drate: FloatArray  # req/s a decode instance serves, else 0
    pclass: FloatArray  # the slowest node's NIC (bytes/s) of prefill columns, else 0
    need: FloatArray  # kv_min_nic of decode columns, else 0
    pool: IntArray  # pool q = (m, r, l) of a decode column, entry pool of a prefill column, -1 otherwise
    pool_m: IntArray  # (Q,)
    pool_r: IntArray
    pool_level: FloatArray  # (Q,) the prefill NIC class l of the pool
    pool_pos: IntArray  # (Q,) position in its (m, r)'s chain, 0 = highest level
    pool_group: IntArray  # (Q,) its (m, r)'s chain
    pool_grid: IntArray  # (G, L): each chain's pools by position, padded with Q
    by_model: tuple[IntArray, ...]  # columns of each model
    by_region: tuple[IntArray, ...]
    by_pool_pre: tuple[IntArray, ...]  # prefill columns that may feed pool q
    by_pool_dec: tuple[IntArray, ...]  # decode columns of pool q
    nz_type: IntArray  # (J, K): node types each column uses, padded with T
    nz_count: IntArray  # (J, K): how many of each, padded with 1

    @property
    def J(self) -> int:
        return len(self.tu)

    @property
    def Q(self) -> int:
        return len(self.pool_m)


@attrs.frozen(eq=False)
class _Merged:
    """A templates tuple's exact duplicates merged (``_merged``), with each unique template's data."""

    members: tuple[tuple[int, ...], ...]  # unique template -> original template indices
    u_of: IntArray  # original template -> its unique template
    key_to_i: Mapping[str, int]
    nc: IntArray  # (U, T)
    nz_type: IntArray  # (U, K): node types each unique template uses, padded with T
    nz_count: IntArray  # (U, K): how many of each, padded with 1
    per_u: Mapping[str, NDArray[Any]]  # load, m, mode, P, D, need per unique template


_MERGED: list[tuple[tuple[AllocTemplate, ...], int, _Merged]] = []
"""The last templates tuples merged: a problem rebuilt from another with new demand, prices or
availability (the solver process's ``attrs.evolve`` per solve) shares its templates tuple and skips the
loop over them (60 ms of CPU at core's 8,668 templates)."""


def _merged(p: AllocationProblem) -> _Merged:
    """Merge p's exact-duplicate templates (same model, mode, node counts, capacities, load time, KV
    need: lossless), in order of first appearance."""
    T = p.num_node_types
    for ts, t_seen, merged in _MERGED:
        if ts is p.templates and t_seen == T:
            return merged
    sig_to_u: dict[tuple[Any, ...], int] = {}
    members: list[list[int]] = []
    u_of = np.zeros(len(p.templates), dtype=np.int64)
    for i, t in enumerate(p.templates):
        sig = (int(t.m), t.mode, t.node_counts.tobytes(), t.prefill_tok_s, t.decode_tok_s, t.load_s, t.kv_min_nic)
        u = sig_to_u.setdefault(sig, len(members))
        if u == len(members):
            members.append([])
        members[u].append(i)
        u_of[i] = u
    reps = [p.templates[ms[0]] for ms in members]
    U = len(reps)
    nc = np.array([t.node_counts for t in reps], dtype=np.int64).reshape(U, T)
    K = max(int((nc > 0).sum(axis=1).max()), 1) if U else 1
    order_t = np.argsort(nc <= 0, axis=1, kind="stable")[:, :K]
    nz_count = np.take_along_axis(nc, order_t, axis=1)
    merged = _Merged(
        members=tuple(tuple(ms) for ms in members),
        u_of=u_of,
        key_to_i={t.key: i for i, t in enumerate(p.templates)},
        nc=nc,
        nz_type=np.where(nz_count > 0, order_t, T).astype(np.int64),
        nz_count=np.maximum(nz_count, 1),
        per_u={
            "load": np.array([t.load_s for t in reps], dtype=np.float64),
            "m": np.array([t.m for t in reps], dtype=np.int64),
            "mode": np.array([MODES.index(t.mode) for t in reps], dtype=np.int64),
            "P": np.array([t.prefill_tok_s for t in reps], dtype=np.float64),
            "D": np.array([t.decode_tok_s for t in reps], dtype=np.float64),
            "need": np.array([t.kv_min_nic if t.mode == "decode" else 0.0 for t in reps], dtype=np.float64),
        },
    )
    _MERGED[:] = [*_MERGED[-8:], (p.templates, T, merged)]
    return merged


def _columns(p: AllocationProblem) -> _Columns:
    M, R, T = p.num_models, p.num_regions, p.num_node_types
    util = p.utilisation
    # exact-duplicate merging (lossless); templates of models without demand are useless
    merged = _merged(p)
    live = np.nonzero(p.demand_rps[merged.per_u["m"]] > 0)[0] if p.templates else np.zeros(0, dtype=np.int64)
    members = [merged.members[u] for u in live.tolist()]
    U = len(members)
    renum = np.full(len(merged.members), -1, dtype=np.int64)
    renum[live] = np.arange(U)
    nc_u = merged.nc[live].reshape(U, T)
    nz_type_u, nz_count_u = merged.nz_type[live], merged.nz_count[live]
    offered = np.isfinite(p.price)
    # over each template's node types only (padding type T: offered, unbounded)
    off_pad = np.concatenate([offered, np.ones((R, 1), dtype=bool)], axis=1)
    av_pad = np.concatenate([p.avail, np.full((R, 1), 1 << 40, dtype=p.avail.dtype)], axis=1)
    bad = ~off_pad[:, nz_type_u].all(axis=2).T  # (U, R)
    ub_ur = (av_pad[:, nz_type_u] // nz_count_u[None]).min(axis=2).T if T else np.zeros((U, R), dtype=np.int64)
    tu, r = np.nonzero((ub_ur >= 1) & ~bad)
    tu = tu.astype(np.int64)
    r = r.astype(np.int64)
    nc = nc_u[tu]
    cost = (nc * np.where(offered, p.price, 0.0)[r]).sum(axis=1)
    load, m, mode, P, D, need = (merged.per_u[k][live][tu] for k in ("load", "m", "mode", "P", "D", "need"))
    agg = mode == _AGG
    rate = np.zeros(len(tu))
    rate[agg] = util / (p.mean_in[m[agg]] / P[agg] + p.mean_out[m[agg]] / D[agg])
    # current deployment -> merged columns
    col_of = np.full((U, R), -1, dtype=np.int64)
    col_of[tu, r] = np.arange(len(tu))
    key_to_i = merged.key_to_i
    cur = np.zeros(len(tu), dtype=np.int64)
    cur_by_member: dict[tuple[int, int], int] = {}
    for (key, reg), n in p.current.items():
        i = key_to_i[key]
        u = int(renum[merged.u_of[i]])
        if n <= 0 or u < 0:
            continue
        cur_by_member[(i, int(reg))] = int(n)
        j = col_of[u, reg]
        if j >= 0:
            cur[j] += int(n)
    ub = ub_ur[tu, r]
    arrays = {
        "tu": tu,
        "r": r,
        "m": m,
        "mode": mode,
        "nc": nc,
        "cost": cost,
        "pen": p.churn_factor * load / 3600.0 * cost,
        "ub": ub,
        "cur": np.minimum(cur, ub),
        "rate": rate,
        "prate": np.where(mode == _PRE, _prefill_rate(p, m, P, (nc * p.nic_bytes_s[None, :]).sum(axis=1)), 0.0),
        "drate": np.where(mode == _DEC, util * D / p.mean_out[m], 0.0),
        "pclass": np.where(
            mode == _PRE, np.where(nc > 0, p.nic_bytes_s[None, :], np.inf).min(axis=1, initial=np.inf), 0.0
        ),
        "need": need,
        "nz_type": nz_type_u[tu],
        "nz_count": nz_count_u[tu],
    }
    base = {
        "M": M,
        "R": R,
        "T": T,
        "demand": p.demand_rps,
        "weight": p.weights,
        "mean_in": p.mean_in,
        "mean_out": p.mean_out,
        "kv": p.kv_bytes_per_token,
        "avail": p.avail,
        "members": tuple(members),
        "cur_by_member": cur_by_member,
    }
    return _assemble(base, arrays)


def _prefill_rate(p: AllocationProblem, m: NDArray[Any], P: NDArray[Any], B: NDArray[Any]) -> FloatArray:
    """req/s one prefill instance feeds: its compute's util P / in_m and its NICs' B / (in_m kv_m)."""
    kvb = p.mean_in[m] * p.kv_bytes_per_token[m]
    with np.errstate(divide="ignore", invalid="ignore"):
        nic = np.where(kvb > 0, B / np.where(kvb > 0, kvb, 1.0), np.inf)
        return np.asarray(np.minimum(p.utilisation * P / p.mean_in[m], nic), dtype=np.float64)


def _pools(arrays: dict[str, Any]) -> tuple[IntArray, IntArray, IntArray, IntArray, FloatArray]:
    """The KV pairing (module docstring): (columns to keep, each one's pool or -1, and pool_m, pool_r,
    pool_level). Aggregated columns are kept with pool -1; a decode column in its level's pool, or not
    at all; a prefill column with its entry pool (the highest level it may feed), or not at all.

    Levels are ranked among all prefill classes, and each (m, r) with a level as one integer key
    ``(m * R' + r) * W + rank``, so each lookup is one ``searchsorted``."""
    m, r, mode, pclass, need = (arrays[k] for k in ("m", "r", "mode", "pclass", "need"))
    pre = np.nonzero(mode == _PRE)[0]
    dec = np.nonzero(mode == _DEC)[0]
    levels = np.unique(pclass[pre])
    W = len(levels) + 1
    g = m * (int(r.max(initial=0)) + 1) + r
    have = np.unique(g[pre] * W + np.searchsorted(levels, pclass[pre]))  # each (m, r)'s prefill classes
    # each decode column: the least class of its (m, r) at least its kv_min_nic
    at = np.searchsorted(have, g[dec] * W + np.searchsorted(levels, need[dec] * (1.0 - 1e-12), side="left"))
    hit = at < len(have)
    hit[hit] = have[at[hit]] // W == g[dec[hit]]
    dec_key = have[at[hit]]
    used = np.unique(dec_key)  # the pools, sorted by (m, r, level)
    pool = np.full(len(mode), -1, dtype=np.int64)
    keep = mode == _AGG
    pool[dec[hit]] = np.searchsorted(used, dec_key)
    keep[dec[hit]] = True
    # each prefill column: the highest pool of its (m, r) at a level at most its class
    at = np.searchsorted(used, g[pre] * W + np.searchsorted(levels, pclass[pre]), side="right") - 1
    ok = at >= 0
    ok[ok] = used[at[ok]] // W == g[pre[ok]]
    pool[pre[ok]] = at[ok]
    keep[pre[ok]] = True
    rows = np.nonzero(keep)[0].astype(np.int64)
    first = np.zeros(len(used), dtype=np.int64)  # a column of each pool, for its (m, r)
    first[pool[rows][pool[rows] >= 0]] = rows[pool[rows] >= 0]
    return (
        rows,
        pool[rows],
        m[first].astype(np.int64),
        r[first].astype(np.int64),
        levels[used % W].astype(np.float64),
    )


def _assemble(base: dict[str, Any], arrays: dict[str, Any]) -> _Columns:
    """Columns from per-column arrays: pair prefill and decode columns into pools by NIC level (``_pools``;
    a column with no partner serves nothing and is dropped), chain each (m, r)'s pools, list the share
    variables, then index pools, models and regions."""
    M, R = base["M"], base["R"]
    rows, pool, gm, gr, glevel = _pools(arrays)
    arrays = {k: v[rows] for k, v in arrays.items()}
    m, r, mode = arrays["m"], arrays["r"], arrays["mode"]
    order = np.argsort(m, kind="stable")
    by_model = tuple(np.split(order, np.searchsorted(m[order], np.arange(1, M))))
    order_r = np.argsort(r, kind="stable")
    by_region = tuple(np.split(order_r, np.searchsorted(r[order_r], np.arange(1, R))))
    Q = len(gm)
    # chains: pools are sorted by (m, r, level), so each (m, r)'s pools are contiguous, lowest level first
    first = np.ones(Q, dtype=bool)
    first[1:] = (gm[1:] != gm[:-1]) | (gr[1:] != gr[:-1])
    group = np.cumsum(first) - 1 if Q else np.zeros(0, dtype=np.int64)
    G = int(group[-1]) + 1 if Q else 0
    size = np.bincount(group, minlength=G)
    last = np.cumsum(size) - 1  # each chain's highest pool
    pos = last[group] - np.arange(Q) if Q else np.zeros(0, dtype=np.int64)
    grid = np.full((G, max(int(size.max()), 1) if G else 1), Q, dtype=np.int64)
    grid[group, pos] = np.arange(Q)
    pre = np.nonzero(mode == _PRE)[0]
    n_feed = size[group[pool[pre]]] - pos[pool[pre]] if len(pre) else np.zeros(0, dtype=np.int64)
    feed_j = np.repeat(pre, n_feed)
    offsets = np.repeat(np.cumsum(n_feed) - n_feed, n_feed)
    feed_pos = np.repeat(pos[pool[pre]], n_feed) + np.arange(len(feed_j)) - offsets
    feed_q = grid[group[pool[feed_j]], feed_pos] if len(feed_j) else np.zeros(0, dtype=np.int64)
    order_f = np.argsort(feed_q, kind="stable")
    fed = np.split(feed_j[order_f], np.searchsorted(feed_q[order_f], np.arange(1, Q))) if Q else []
    dec_order = np.argsort(np.where(mode == _DEC, pool, Q), kind="stable")
    dec_pool = np.where(mode == _DEC, pool, Q)[dec_order]
    by_dec = np.split(dec_order, np.searchsorted(dec_pool, np.arange(1, Q + 1)))[:Q] if Q else []
    return _Columns(
        **base,
        **arrays,
        pool=pool,
        pool_m=gm.astype(np.int64),
        pool_r=gr.astype(np.int64),
        pool_level=glevel,
        pool_pos=pos.astype(np.int64),
        pool_group=group.astype(np.int64),
        pool_grid=grid,
        by_model=by_model,
        by_region=by_region,
        by_pool_pre=tuple(np.asarray(f, dtype=np.int64) for f in fed),
        by_pool_dec=tuple(np.asarray(d, dtype=np.int64) for d in by_dec),
    )
