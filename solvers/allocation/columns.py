"""The availability-filtered (template, region) columns of an allocation problem (lossless reductions:
merged duplicate templates, columns that fit their region, prefill/decode only where paired).

KV pairing by NIC. A prefill instance sends its KV cache from its slowest node's NIC, its class
``pclass_j``; a decode template holds its SLO only behind a sender of NIC at least ``kv_min_nic``
(``solvers.library.kv_min_nic``). So the disaggregated pools are q = (m, r, l): model m in region r at
level l, one of the prefill classes of (m, r). A decode column j joins the pool of the least class
l >= kv_min_nic_j (the prefill columns that may feed it are exactly those of class >= l; none: it is
dropped). A prefill column of class c is copied into every pool (m, r, l) with l <= c that holds a
decode column: each copy is its own integer variable (its instances feed that level), and the copies
share the template's availability rows. Every pair kept is compatible and every compatible pair is in
some pool, so a deployment is servable disaggregated whenever some available compatible pair is;
what this costs against sharing one prefill instance across levels is at most one prefill instance per
extra level of a pool (instances are whole).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
from numpy.typing import NDArray

from solvers.allocation.problem import MODES, AllocationProblem

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
    pcap: FloatArray  # util * P for prefill columns, else 0
    dcap: FloatArray  # util * D for decode columns, else 0
    nic: FloatArray  # bytes/s for prefill columns, else 0
    pclass: FloatArray  # the slowest node's NIC (bytes/s) of prefill columns, else 0
    need: FloatArray  # kv_min_nic of decode columns, else 0
    pool: IntArray  # disaggregated pool q = (m, r, l) of prefill/decode columns, -1 otherwise
    pool_m: IntArray  # (Q,)
    pool_r: IntArray
    pool_level: FloatArray  # (Q,) the prefill NIC class l of the pool
    by_model: tuple[IntArray, ...]  # columns of each model
    by_region: tuple[IntArray, ...]
    by_pool_pre: tuple[IntArray, ...]
    by_pool_dec: tuple[IntArray, ...]
    nz_type: IntArray  # (J, K): node types each column uses, padded with T
    nz_count: IntArray  # (J, K): how many of each, padded with 1

    @property
    def J(self) -> int:
        return len(self.tu)

    @property
    def Q(self) -> int:
        return len(self.pool_m)


def _columns(p: AllocationProblem) -> _Columns:
    M, R, T = p.num_models, p.num_regions, p.num_node_types
    util = p.utilisation
    # exact-duplicate merging (lossless); templates of models without demand are useless
    sig_to_u: dict[tuple[Any, ...], int] = {}
    members: list[list[int]] = []
    for i, t in enumerate(p.templates):
        if p.demand_rps[t.m] <= 0:
            continue
        sig = (int(t.m), t.mode, t.node_counts.tobytes(), t.prefill_tok_s, t.decode_tok_s, t.load_s, t.kv_min_nic)
        u = sig_to_u.setdefault(sig, len(members))
        if u == len(members):
            members.append([])
        members[u].append(i)
    reps = [p.templates[ms[0]] for ms in members]
    U = len(reps)
    nc_u = np.array([t.node_counts for t in reps], dtype=np.int64).reshape(U, T)
    offered = np.isfinite(p.price)
    bad = (nc_u > 0).astype(np.int64) @ (~offered).T.astype(np.int64) > 0  # (U, R)
    per_g = np.where(nc_u[:, None, :] > 0, p.avail[None, :, :] // np.maximum(nc_u[:, None, :], 1), 1 << 40)
    ub_ur = per_g.min(axis=2) if T else np.zeros((U, R), dtype=np.int64)
    tu, r = np.nonzero((ub_ur >= 1) & ~bad)
    tu = tu.astype(np.int64)
    r = r.astype(np.int64)
    nc = nc_u[tu]
    cost = (nc * np.where(offered, p.price, 0.0)[r]).sum(axis=1)
    per_u = {
        "load": np.array([t.load_s for t in reps], dtype=np.float64),
        "m": np.array([t.m for t in reps], dtype=np.int64),
        "mode": np.array([MODES.index(t.mode) for t in reps], dtype=np.int64),
        "P": np.array([t.prefill_tok_s for t in reps], dtype=np.float64),
        "D": np.array([t.decode_tok_s for t in reps], dtype=np.float64),
        "need": np.array([t.kv_min_nic if t.mode == "decode" else 0.0 for t in reps], dtype=np.float64),
    }
    load, m, mode, P, D, need = (per_u[k][tu] for k in ("load", "m", "mode", "P", "D", "need"))
    agg = mode == _AGG
    rate = np.zeros(len(tu))
    rate[agg] = util / (p.mean_in[m[agg]] / P[agg] + p.mean_out[m[agg]] / D[agg])
    # current deployment -> merged columns
    col_of = np.full((U, R), -1, dtype=np.int64)
    col_of[tu, r] = np.arange(len(tu))
    u_of = {i: u for u, ms in enumerate(members) for i in ms}
    key_to_i = {t.key: i for i, t in enumerate(p.templates)}
    cur = np.zeros(len(tu), dtype=np.int64)
    cur_by_member: dict[tuple[int, int], int] = {}
    for (key, reg), n in p.current.items():
        i = key_to_i[key]
        if n <= 0 or i not in u_of:
            continue
        cur_by_member[(i, int(reg))] = int(n)
        j = col_of[u_of[i], reg]
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
        "pcap": np.where(mode == _PRE, util * P, 0.0),
        "dcap": np.where(mode == _DEC, util * D, 0.0),
        "nic": np.where(mode == _PRE, (nc * p.nic_bytes_s[None, :]).sum(axis=1), 0.0),
        "pclass": np.where(
            mode == _PRE, np.where(nc > 0, p.nic_bytes_s[None, :], np.inf).min(axis=1, initial=np.inf), 0.0
        ),
        "need": need,
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
        "members": tuple(tuple(ms) for ms in members),
        "cur_by_member": cur_by_member,
    }
    return _assemble(base, arrays)


def _pools(arrays: dict[str, Any]) -> tuple[IntArray, IntArray, IntArray, IntArray, FloatArray]:
    """The KV pairing (module docstring): (rows to take, each one's pool or -1, and pool_m, pool_r,
    pool_level). Aggregated columns are taken once with pool -1; a decode column once in its level's
    pool, or not at all; a prefill column once per pool it may feed (a copy), the highest level first."""
    m, r, mode, pclass, need = (arrays[k] for k in ("m", "r", "mode", "pclass", "need"))
    classes: dict[tuple[int, int], list[float]] = {}
    for j in np.nonzero(mode == _PRE)[0].tolist():
        classes.setdefault((int(m[j]), int(r[j])), []).append(float(pclass[j]))
    levels = {g: np.unique(v) for g, v in classes.items()}
    dec_level: dict[int, tuple[int, int, float]] = {}
    used: set[tuple[int, int, float]] = set()
    for j in np.nonzero(mode == _DEC)[0].tolist():
        g = (int(m[j]), int(r[j]))
        lv = levels.get(g)
        if lv is None:
            continue
        i = int(np.searchsorted(lv, need[j] * (1.0 - 1e-12), side="left"))
        if i < len(lv):
            dec_level[j] = (*g, float(lv[i]))
            used.add((*g, float(lv[i])))
    keys = sorted(used)
    pid = {k: q for q, k in enumerate(keys)}
    by_group: dict[tuple[int, int], list[tuple[float, int]]] = {}  # (m, r) -> its pools' (level, q), highest first
    for q, k in reversed(list(enumerate(keys))):
        by_group.setdefault(k[:2], []).append((k[2], q))
    rows: list[int] = []
    pool: list[int] = []
    mode_l, m_l, r_l, pclass_l = mode.tolist(), m.tolist(), r.tolist(), pclass.tolist()
    for j, mj in enumerate(mode_l):
        if mj == _AGG:
            rows.append(j)
            pool.append(-1)
        elif mj == _DEC:
            if j in dec_level:
                rows.append(j)
                pool.append(pid[dec_level[j]])
        else:
            for level, q in by_group.get((m_l[j], r_l[j]), ()):
                if level <= pclass_l[j]:
                    rows.append(j)
                    pool.append(q)
    return (
        np.asarray(rows, dtype=np.int64),
        np.asarray(pool, dtype=np.int64),
        np.asarray([k[0] for k in keys], dtype=np.int64),
        np.asarray([k[1] for k in keys], dtype=np.int64),
        np.asarray([k[2] for k in keys], dtype=np.float64),
    )


def _assemble(base: dict[str, Any], arrays: dict[str, Any]) -> _Columns:
    """Columns from per-column arrays: pair prefill and decode columns into pools by NIC level (``_pools``;
    a column with no partner serves nothing and is dropped, a prefill column may be copied), then index
    pools, models and regions."""
    M, R = base["M"], base["R"]
    rows, pool, gm, gr, glevel = _pools(arrays)
    copy = np.zeros(len(rows), dtype=bool)
    copy[1:] = rows[1:] == rows[:-1]
    arrays = {k: v[rows] for k, v in arrays.items()}
    arrays["cur"] = np.where(copy, 0, arrays["cur"])  # running instances count once, on the first copy
    m, r, mode = arrays["m"], arrays["r"], arrays["mode"]
    order = np.argsort(m, kind="stable")
    by_model = tuple(np.split(order, np.searchsorted(m[order], np.arange(1, M))))
    order_r = np.argsort(r, kind="stable")
    by_region = tuple(np.split(order_r, np.searchsorted(r[order_r], np.arange(1, R))))
    Q = len(gm)
    nc = arrays["nc"]
    K = max(int((nc > 0).sum(axis=1).max()), 1) if len(nc) else 1
    order_t = np.argsort(nc <= 0, axis=1, kind="stable")[:, :K]
    nz_count = np.take_along_axis(nc, order_t, axis=1)
    nz_type = np.where(nz_count > 0, order_t, base["T"])
    return _Columns(
        **base,
        nz_type=nz_type.astype(np.int64),
        nz_count=np.maximum(nz_count, 1),
        **arrays,
        pool=pool,
        pool_m=gm.astype(np.int64),
        pool_r=gr.astype(np.int64),
        pool_level=glevel,
        by_model=by_model,
        by_region=by_region,
        by_pool_pre=tuple(np.nonzero((pool == q) & (mode == _PRE))[0] for q in range(Q)),
        by_pool_dec=tuple(np.nonzero((pool == q) & (mode == _DEC))[0] for q in range(Q)),
    )
