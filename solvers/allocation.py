"""Online allocation: how many instances of which serving templates to run in which region.

Formulation
-----------
Sets: models m, regions r, node types g, templates t, columns j = (t, r). Lossless reductions first:
exact-duplicate templates (same model, mode, node counts, capacities, load time) are merged; a column
exists only where the template fits region r's availability at least once and uses only node types
offered there; templates of models without demand, and prefill (decode) columns in a region without
decode (prefill) columns of their model, are dropped (they can only cost).

Data per column j: model m_j, mode, node counts n[j, g]; hourly cost c_j = sum_g n[j, g] price[r, g];
churn penalty p_j = churn_factor * load_s / 3600 * c_j per started instance; upper bound
ub_j = min_g floor(avail[r, g] / n[j, g]); running count cur_j. An aggregated column serves
a_j = util / (in_m / P_j + out_m / D_j) req/s at the model's shape; a prefill column gives util * P_j
prompt tok/s and B_j = sum_g n[j, g] nic[g] bytes/s for KV transfer; a decode column util * D_j decode
tok/s. (util: the utilisation target; in_m, out_m: mean tokens per request; kv_m: KV bytes per token.)

Variables:
- new_j in Z, 0 <= new_j <= ub_j: instances of column j started;
- keep_j in Z, 0 <= keep_j <= min(cur_j, ub_j): running instances kept (only where cur_j > 0);
  the plan is x_j = keep_j + new_j (split churn: no rows for it);
- y[m, r] >= 0: req/s of model m served disaggregated in region r (where r has prefill and decode
  columns of m);
- u_m in [0, d_m]: unmet demand of model m in req/s, for each model with demand d_m > 0.

Constraints (rows scaled so that y has coefficient 1):
- demand (m):     sum_{j aggregated of m} a_j x_j + sum_r y[m, r] + u_m >= d_m;
- avail (r, g):   sum_{j in r} n[j, g] x_j <= avail[r, g];
- prefill (m, r): in_m y[m, r] <= util sum_{j prefill of m in r} P_j x_j;
- decode (m, r):  out_m y[m, r] <= util sum_{j decode of m in r} D_j x_j;
- kv (m, r):      in_m kv_m y[m, r] <= sum_{j prefill of m in r} B_j x_j;
- service:        sum_m u_m <= U.

Objective, lexicographic, in two phases ("serve first"):
1. serve: minimise sum_m u_m with U = +inf, giving U*;
2. cost:  minimise sum_j c_j x_j + sum_j p_j new_j with U = U* (1 + 1e-9) + 1e-7 max(1, sum_m d_m).

Two phases rather than a weight on u: with integer instances no finite weight is provably large
enough. A weight above the largest cost per req/s of any template fails when the last 0.1 req/s
needs a whole instance that costs more than 0.1 times the weight; a weight large enough for a given
tolerance is numerically ugly, and the study measured it 1.5x slower. Phase 1 is skipped (U* proven)
when the heuristic plan's unmet demand equals the LP relaxation's minimum, as whenever nothing is
scarce.

Solution path
-------------
1. Build the columns and rows from numpy arrays (one addRows and one addCols call).
2. LP relaxation: minimise cost with u fixed to 0; if infeasible, minimise sum u, then cost at that
   service level. With ``columns="generated"``: the same by column generation.
3. Heuristic (numpy, deterministic): round the LP down, then round up its fractional columns, most
   fractional first, while they serve unmet demand; fill what is left (aggregated instances that the
   demand fully uses, best req/s per USD/h first; the cheapest multiset of up to three aggregated
   instances for each model's rest; then best unmet-req/s per USD/h among all instances and
   prefill+decode pairs); drop instances not needed; local search per model (rebuild it from scratch,
   aggregated-first and disaggregated-first; drop up to three of its least efficient instances for the
   cheapest multiset of up to three that serves as much). The same from the current deployment cut to
   the availability; the better plan wins. The empty plan is always feasible, so there is always a plan.
   When the LP cannot serve every demand, rounding loses most, so an LP dive follows (``_dive_job``:
   round up what fits, else bound the least fractional variable down, re-solve, until integral).
4. Decomposition by model, when the LP serves every demand. Models share only the availability
   rows (the service row is then fixed at full service), so each group of models solves its own cost
   MIP over all its columns with the whole availability (every model alone at first, each in a
   child process, two or more at once). The sum of the group optima bounds the program from below,
   and when the union of their plans fits the availability it is optimal. Groups whose plans overrun
   a (region, node type) together are merged and solved again, from the repaired union; at worst
   one group holds every model. In a group's MIP, a variable whose one unit costs more than the
   group's part of the best plan so far is left out (costs are nonnegative, so it cannot be in a
   better plan).
5. MIP phase 1 (only when the plan still leaves more unmet demand than the LP bound), then phase 2
   (only when the decomposition did not prove the plan optimal; its groups' bounds are added as cuts
   sum_{v of group} cost_v v >= bound), each warm-started with the best plan so far, on
   single-threaded HiGHS.

Deadline, enforced from outside HiGHS: it overran its own ``time_limit`` by 2-3x here, and at the root
of an extended-size model its interrupt checks were up to 16 s apart, so neither its time limit nor
an interrupt callback stops it in time. The LP runs in a thread (its simplex checks are frequent;
at the deadline the thread is abandoned and interrupted at its next check). Each MIP runs in a forked
child process that streams its improving solutions through a pipe; at the deadline the parent keeps
the solutions fully received and kills the child. Replay: single-threaded HiGHS finds the same
improving solutions in the same order every run, so the number taken per phase (``SolverEffort``,
per group for the decomposition) fixes the plan without the clock.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import math
import os
import select
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import highspy
import numpy as np
from highspy import cb
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

MODES = ("aggregated", "prefill", "decode")
RESTRICTIONS = ("homo", "pd-homo", "homo-pd")
"""The portfolio's restrictions, each the template subset of a baseline: homogeneous aggregated templates,
homogeneous prefill and decode templates, and their union (every homogeneous template)."""
_AGG, _PRE, _DEC = 0, 1, 2
_TOL = 1e-9
_INTERRUPT_CALLBACKS = (
    cb.HighsCallbackType.kCallbackSimplexInterrupt,
    cb.HighsCallbackType.kCallbackIpmInterrupt,
    cb.HighsCallbackType.kCallbackMipInterrupt,
)


class AllocationInputError(ValueError):
    """An allocation problem with invalid input; the message names the field and the reason."""


def _names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _templates(value: Iterable[AllocTemplate]) -> tuple[AllocTemplate, ...]:
    return tuple(value)


def _to_floats(field: str, value: Any) -> FloatArray:
    try:
        return np.array(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise AllocationInputError(f"{field}: expected numbers, got {value!r} ({exc})") from exc


def _to_ints(field: str, value: Any) -> IntArray:
    """Integer arrays; anything else is kept as it is, for the validators to reject by name."""
    try:
        arr = np.array(value)
    except (TypeError, ValueError) as exc:
        raise AllocationInputError(f"{field}: expected integers, got {value!r} ({exc})") from exc
    if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
        return arr.astype(np.int64)
    if arr.dtype.kind in "iub":
        return arr.astype(np.int64)
    return arr


def _conv_node_counts(value: Any) -> IntArray:
    return _to_ints("AllocTemplate.node_counts", value)


def _conv_demand_rps(value: Any) -> FloatArray:
    return _to_floats("AllocationProblem.demand_rps", value)


def _conv_mean_in(value: Any) -> FloatArray:
    return _to_floats("AllocationProblem.mean_in", value)


def _conv_mean_out(value: Any) -> FloatArray:
    return _to_floats("AllocationProblem.mean_out", value)


def _conv_kv_bytes_per_token(value: Any) -> FloatArray:
    return _to_floats("AllocationProblem.kv_bytes_per_token", value)


def _conv_nic_bytes_s(value: Any) -> FloatArray:
    return _to_floats("AllocationProblem.nic_bytes_s", value)


def _conv_price(value: Any) -> FloatArray:
    return _to_floats("AllocationProblem.price", value)


def _subs(value: Iterable[tuple[str, SolverEffort]]) -> tuple[tuple[str, SolverEffort], ...]:
    return tuple(sorted(((str(a), b) for a, b in value), key=lambda item: item[0]))


def _pairs(value: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    return tuple(sorted((int(a), int(b)) for a, b in value))


def _conv_avail(value: Any) -> IntArray:
    return _to_ints("AllocationProblem.avail", value)


@attrs.frozen(eq=False)
class AllocTemplate:
    """A serving template as the allocator sees it.

    ``node_counts[g]`` is how many nodes of node type g one instance needs. Capacities are at the
    model's SLO: prefill (prompt) and decode tokens per second. ``load_s`` is the time to load the
    weights, which prices churn. ``key`` is a stable id (it matches the current deployment).
    """

    m: int
    mode: str
    node_counts: IntArray = attrs.field(converter=_conv_node_counts)
    prefill_tok_s: float
    decode_tok_s: float
    load_s: float
    key: str


@attrs.frozen(eq=False)
class AllocationProblem:
    """One online allocation instance, as numbers.

    ``avail[r, g]`` counts all nodes of type g that a plan may hold in region r, including the nodes
    of the current deployment. ``price[r, g]`` is USD per node-hour, ``np.inf`` where not offered.
    ``current`` maps (template key, region index) to the number of running instances.
    """

    models: tuple[str, ...] = attrs.field(converter=_names)
    demand_rps: FloatArray = attrs.field(converter=_conv_demand_rps)
    mean_in: FloatArray = attrs.field(converter=_conv_mean_in)
    mean_out: FloatArray = attrs.field(converter=_conv_mean_out)
    kv_bytes_per_token: FloatArray = attrs.field(converter=_conv_kv_bytes_per_token)
    node_types: tuple[str, ...] = attrs.field(converter=_names)
    nic_bytes_s: FloatArray = attrs.field(converter=_conv_nic_bytes_s)
    regions: tuple[str, ...] = attrs.field(converter=_names)
    price: FloatArray = attrs.field(converter=_conv_price)
    avail: IntArray = attrs.field(converter=_conv_avail)
    templates: tuple[AllocTemplate, ...] = attrs.field(converter=_templates)
    current: Mapping[tuple[str, int], int] = attrs.field(factory=dict)
    churn_factor: float = 1.0
    utilisation: float = 0.85

    def __attrs_post_init__(self) -> None:
        _validate(self)

    @property
    def num_models(self) -> int:
        return len(self.models)

    @property
    def num_regions(self) -> int:
        return len(self.regions)

    @property
    def num_node_types(self) -> int:
        return len(self.node_types)


@attrs.frozen
class SolverEffort:
    """How far each solver phase went: the number of HiGHS improving solutions it took.

    Per phase (``lp``, ``serve``, ``cost``): ``None`` ran to completion (or was not needed); an int k
    stopped after its k-th improving solution (0: skipped; for ``lp``, 0 means the LP was not used).
    Single-threaded HiGHS finds the same solutions in the same order every run, so passing a result's
    effort back to ``solve_allocation`` replays its plan exactly, whatever the wall clock does. A
    phase given k > 0 that never finds k solutions runs to completion.
    """

    lp: int | None = None
    serve: int | None = None
    cost: int | None = None
    dive: int | None = None
    """LP solves the diving heuristic made, when it stopped early (None: ran to completion or not needed)."""
    decompose: int | None = None
    """0: the decomposition by model was skipped (the deadline came first); None: it ran or was not needed."""
    restricted: tuple[tuple[str, SolverEffort], ...] = attrs.field(default=(), converter=_subs)
    """(restriction, the effort of its sub-solve) of each restriction of the portfolio (``RESTRICTIONS``)
    whose sub-solve was cut short; one not listed ran to completion or was not needed."""
    split: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_pairs)
    """(group, improving solutions taken) of each MIP of the decomposition by model stopped early (group:
    the bitmask of its model indices); a group not listed ran to completion or was not needed."""

    def as_mapping(self) -> dict[str, int]:
        """Flat ``{phase: k}`` for a plan record (``split.M`` per model); phases run to completion left out."""
        phases = (
            ("lp", self.lp), ("serve", self.serve), ("cost", self.cost), ("dive", self.dive),
            ("decompose", self.decompose),
        )  # fmt: skip
        out = {k: v for k, v in phases if v is not None}
        out.update({f"split.{m}": k for m, k in self.split})
        for name, sub in self.restricted:
            out.update({f"{name}.{k}": v for k, v in sub.as_mapping().items()})
        return out

    @classmethod
    def from_mapping(cls, record: Mapping[str, int]) -> SolverEffort:
        """The effort that ``as_mapping`` wrote."""
        subs: dict[str, dict[str, int]] = {}
        own: dict[str, int] = {}
        for k, v in record.items():
            head, _, rest = k.partition(".")
            if head in RESTRICTIONS:
                subs.setdefault(head, {})[rest] = int(v)
            else:
                own[k] = int(v)
        split = [(int(k.split(".", 1)[1]), v) for k, v in own.items() if k.startswith("split.")]
        phases = {k: v for k, v in own.items() if not k.startswith("split.")}
        restricted = [(name, cls.from_mapping(sub)) for name, sub in subs.items()]
        return cls(**phases, split=split, restricted=restricted)


@attrs.frozen
class AllocationResult:
    """A plan: instances per (template index, region index), its cost, service and solver status.

    ``status`` says only what was proven: ``optimal`` (service proven maximal and cost within ``mip_gap``
    of the bound), ``feasible`` (service proven maximal; the cost's ``gap`` is to a proven ``bound`` > 0)
    or ``no bound`` (the service level is not proven, or no cost bound above 0 is: ``bound`` 0, ``gap`` 1).
    ``objective`` is cost plus churn (USD/h); ``bound`` a proven lower bound on it at the plan's service
    level; ``gap`` = (objective - bound) / objective. ``unmet_bound`` is a
    proven lower bound on the total unmet req/s; ``service_proven`` says the plan's unmet demand meets
    it (within ``mip_gap``). ``phase_s``: seconds per phase (build, lp, heuristic, serve, cost);
    ``simplex_iterations`` and ``mip_nodes`` count the work HiGHS reported (nodes of a killed run as
    last reported); ``effort`` replays the plan; ``column_generation`` says which way it was solved.
    """

    counts: Mapping[tuple[int, int], int]
    cost_per_hour: float
    churn_cost: float
    served_rps: FloatArray
    unmet_rps: FloatArray
    status: str
    objective: float
    bound: float
    gap: float
    unmet_bound: float
    service_proven: bool
    solve_s: float
    phase_s: Mapping[str, float]
    effort: SolverEffort
    simplex_iterations: int
    mip_nodes: int
    num_columns: int
    num_rows: int
    merged_templates: int
    column_generation: bool
    split_groups: int = 0
    """MIPs the decomposition by model solved (0: not used; more than the models: groups were merged)."""

    @property
    def total_unmet_rps(self) -> float:
        return float(self.unmet_rps.sum())


def _fail(field: str, reason: str) -> AllocationInputError:
    return AllocationInputError(f"AllocationProblem.{field}: {reason}")


def _check_vector(p: AllocationProblem, name: str, n: int, what: str, *, positive: bool = False) -> None:
    arr = getattr(p, name)
    if arr.shape != (n,):
        raise _fail(name, f"shape {arr.shape}, expected ({n},) (one per {what})")
    if not np.all(np.isfinite(arr)):
        raise _fail(name, "must be finite")
    if positive and np.any(arr <= 0):
        raise _fail(name, f"must be > 0 (index {int(np.argmax(arr <= 0))})")
    if np.any(arr < 0):
        raise _fail(name, f"must be >= 0 (index {int(np.argmax(arr < 0))} is {arr[np.argmax(arr < 0)]})")


def _validate(p: AllocationProblem) -> None:
    M, T, R = p.num_models, p.num_node_types, p.num_regions
    for name in ("models", "node_types", "regions"):
        names = getattr(p, name)
        if len(set(names)) != len(names):
            raise _fail(name, "names must be unique")
    _check_vector(p, "demand_rps", M, "model")
    _check_vector(p, "mean_in", M, "model", positive=True)
    _check_vector(p, "mean_out", M, "model", positive=True)
    _check_vector(p, "kv_bytes_per_token", M, "model")
    _check_vector(p, "nic_bytes_s", T, "node type")
    if p.price.shape != (R, T):
        raise _fail("price", f"shape {p.price.shape}, expected ({R}, {T}) (regions x node types)")
    if np.any(np.isnan(p.price)) or np.any(p.price < 0) or np.any(np.isneginf(p.price)):
        raise _fail("price", "must be >= 0 USD/h, or inf where not offered")
    if p.avail.shape != (R, T):
        raise _fail("avail", f"shape {p.avail.shape}, expected ({R}, {T}) (regions x node types)")
    if p.avail.dtype.kind not in "iu":
        raise _fail("avail", "must hold integer node counts")
    if np.any(p.avail < 0):
        r, g = np.argwhere(p.avail < 0)[0]
        raise _fail("avail", f"must be >= 0 (region {p.regions[r]!r}, node type {p.node_types[g]!r})")
    if not (0.0 < p.utilisation <= 1.0):
        raise _fail("utilisation", f"must be in (0, 1], got {p.utilisation}")
    if not (math.isfinite(p.churn_factor) and p.churn_factor >= 0):
        raise _fail("churn_factor", f"must be finite and >= 0, got {p.churn_factor}")
    keys: set[str] = set()
    for i, t in enumerate(p.templates):
        if not isinstance(t, AllocTemplate):
            raise _fail(f"templates[{i}]", f"must be an AllocTemplate, got {type(t).__name__}")
        where = f"templates[{i}] ({t.key!r})"
        if t.key in keys:
            raise _fail(where, "duplicate key")
        keys.add(t.key)
        if not (isinstance(t.m, int | np.integer) and 0 <= t.m < M):
            raise _fail(f"{where}.m", f"unknown model index {t.m} (there are {M} models)")
        if t.mode not in MODES:
            raise _fail(f"{where}.mode", f"{t.mode!r} is not one of {MODES}")
        nc = t.node_counts
        if nc.shape != (T,) or nc.dtype.kind not in "iu":
            raise _fail(f"{where}.node_counts", f"must be {T} integer counts (one per node type)")
        if np.any(nc < 0) or nc.sum() == 0:
            raise _fail(f"{where}.node_counts", "counts must be >= 0 with at least one node")
        for field in ("prefill_tok_s", "decode_tok_s", "load_s"):
            v = getattr(t, field)
            if not (isinstance(v, int | float | np.number) and math.isfinite(v) and v >= 0):
                raise _fail(f"{where}.{field}", f"must be finite and >= 0, got {v}")
        if t.mode in ("aggregated", "prefill") and t.prefill_tok_s <= 0:
            raise _fail(f"{where}.prefill_tok_s", f"must be > 0 for mode {t.mode!r}")
        if t.mode in ("aggregated", "decode") and t.decode_tok_s <= 0:
            raise _fail(f"{where}.decode_tok_s", f"must be > 0 for mode {t.mode!r}")
    for entry, n in p.current.items():
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise _fail("current", f"keys must be (template key, region index) pairs, got {entry!r}")
        key, r = entry
        if key not in keys:
            raise _fail("current", f"unknown template key {key!r}")
        if not (isinstance(r, int | np.integer) and 0 <= r < R):
            raise _fail("current", f"region index {r} for {key!r} out of range (there are {R} regions)")
        if not (isinstance(n, int | np.integer) and n >= 0):
            raise _fail("current", f"count for ({key!r}, {r}) must be an int >= 0, got {n!r}")


# --------------------------------------------------------------------------------------------------
# Columns


@attrs.frozen(eq=False)
class _Columns:
    """The availability-filtered (template, region) columns and everything derived from them."""

    M: int
    R: int
    T: int
    demand: FloatArray
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
    group: IntArray  # disaggregated (m, r) group of prefill/decode columns, -1 otherwise
    group_m: IntArray  # (G,)
    group_r: IntArray
    by_model: tuple[IntArray, ...]  # columns of each model
    by_region: tuple[IntArray, ...]
    by_group_pre: tuple[IntArray, ...]
    by_group_dec: tuple[IntArray, ...]
    nz_type: IntArray  # (J, K): node types each column uses, padded with T
    nz_count: IntArray  # (J, K): how many of each, padded with 1

    @property
    def J(self) -> int:
        return len(self.tu)

    @property
    def G(self) -> int:
        return len(self.group_m)


def _columns(p: AllocationProblem) -> _Columns:
    M, R, T = p.num_models, p.num_regions, p.num_node_types
    util = p.utilisation
    # exact-duplicate merging (lossless); templates of models without demand are useless
    sig_to_u: dict[tuple[Any, ...], int] = {}
    members: list[list[int]] = []
    for i, t in enumerate(p.templates):
        if p.demand_rps[t.m] <= 0:
            continue
        sig = (int(t.m), t.mode, t.node_counts.tobytes(), t.prefill_tok_s, t.decode_tok_s, t.load_s)
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
    }
    load, m, mode, P, D = (per_u[k][tu] for k in ("load", "m", "mode", "P", "D"))
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
    }
    base = {
        "M": M,
        "R": R,
        "T": T,
        "demand": p.demand_rps,
        "mean_in": p.mean_in,
        "mean_out": p.mean_out,
        "kv": p.kv_bytes_per_token,
        "avail": p.avail,
        "members": tuple(tuple(ms) for ms in members),
        "cur_by_member": cur_by_member,
    }
    return _assemble(base, arrays)


def _assemble(base: dict[str, Any], arrays: dict[str, Any]) -> _Columns:
    """Columns from per-column arrays: drop prefill (decode) columns in a region without decode
    (prefill) columns of their model (they serve nothing), then index groups, models and regions."""
    M, R = base["M"], base["R"]
    m, r, mode = arrays["m"], arrays["r"], arrays["mode"]
    has_pre = np.zeros((M, R), dtype=bool)
    has_dec = np.zeros((M, R), dtype=bool)
    has_pre[m[mode == _PRE], r[mode == _PRE]] = True
    has_dec[m[mode == _DEC], r[mode == _DEC]] = True
    gm, gr = np.nonzero(has_pre & has_dec)
    gid = np.full((M, R), -1, dtype=np.int64)
    gid[gm, gr] = np.arange(len(gm))
    group = np.where(mode == _AGG, -1, gid[m, r])
    keep = (mode == _AGG) | (group >= 0)
    arrays = {k: v[keep] for k, v in arrays.items()}
    group = group[keep]
    m, r, mode = arrays["m"], arrays["r"], arrays["mode"]
    order = np.argsort(m, kind="stable")
    by_model = tuple(np.split(order, np.searchsorted(m[order], np.arange(1, M))))
    order_r = np.argsort(r, kind="stable")
    by_region = tuple(np.split(order_r, np.searchsorted(r[order_r], np.arange(1, R))))
    G = len(gm)
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
        group=group,
        group_m=gm.astype(np.int64),
        group_r=gr.astype(np.int64),
        by_model=by_model,
        by_region=by_region,
        by_group_pre=tuple(np.nonzero((group == g) & (mode == _PRE))[0] for g in range(G)),
        by_group_dec=tuple(np.nonzero((group == g) & (mode == _DEC))[0] for g in range(G)),
    )


# --------------------------------------------------------------------------------------------------
# Evaluation and greedy repair (pure numpy, deterministic)


def _flow(c: _Columns, g: IntArray | int, gp: Any, gd: Any, gn: Any) -> Any:
    """Disaggregated req/s of group(s) g from their prefill, decode and NIC capacity sums."""
    m = c.group_m[g]
    y = np.minimum(gp / c.mean_in[m], gd / c.mean_out[m])
    kvb = c.mean_in[m] * c.kv[m]
    with np.errstate(divide="ignore", invalid="ignore"):
        ykv = np.where(kvb > 0, gn / np.where(kvb > 0, kvb, 1.0), np.inf)
    return np.minimum(y, ykv)


class _State:
    """A plan x over the columns with incremental capacity sums, node usage and per-column room."""

    def __init__(self, c: _Columns, x: IntArray) -> None:
        self.c = c
        self.x = x.astype(np.int64).copy()
        xf = self.x.astype(np.float64)
        self.agg = np.bincount(c.m, weights=c.rate * xf, minlength=c.M)
        gi = np.maximum(c.group, 0)
        ing = c.group >= 0
        self.gp = np.bincount(gi[ing], weights=(c.pcap * xf)[ing], minlength=c.G)
        self.gd = np.bincount(gi[ing], weights=(c.dcap * xf)[ing], minlength=c.G)
        self.gn = np.bincount(gi[ing], weights=(c.nic * xf)[ing], minlength=c.G)
        self.used = np.zeros((c.R, c.T), dtype=np.int64)
        for g in range(c.T):
            self.used[:, g] = np.bincount(c.r, weights=c.nc[:, g] * xf, minlength=c.R).round().astype(np.int64)

    def room(self, idx: IntArray) -> IntArray:
        """How many more instances of each column in ``idx`` fit the availability left."""
        if len(idx) == 0:
            return np.zeros(0, dtype=np.int64)
        free = np.concatenate([self.c.avail - self.used, np.full((self.c.R, 1), 1 << 40)], axis=1)
        q = (free[self.c.r[idx][:, None], self.c.nz_type[idx]] // self.c.nz_count[idx]).min(axis=1)
        return np.maximum(q, 0)

    def flows(self) -> FloatArray:
        if self.c.G == 0:
            return np.zeros(0)
        return np.asarray(_flow(self.c, np.arange(self.c.G), self.gp, self.gd, self.gn), dtype=np.float64)

    def capacity(self) -> FloatArray:
        """Servable req/s per model (may exceed demand)."""
        flows = np.bincount(self.c.group_m, weights=self.flows(), minlength=self.c.M)
        return np.asarray(self.agg + flows, dtype=np.float64)

    def unmet(self) -> FloatArray:
        return np.maximum(self.c.demand - self.capacity(), 0.0)

    def change(self, j: int, k: int) -> None:
        c = self.c
        self.x[j] += k
        self.agg[c.m[j]] += k * c.rate[j]
        g = c.group[j]
        if g >= 0:
            self.gp[g] += k * c.pcap[j]
            self.gd[g] += k * c.dcap[j]
            self.gn[g] += k * c.nic[j]
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


def _repair(c: _Columns, x0: IntArray, frac: FloatArray | None = None) -> IntArray:
    """Greedy repair, then local search.

    With an LP solution ``frac`` (x0 its floor), first round up its fractional columns, most
    fractional first, while they serve unmet demand. Then add, best first, an aggregated instance
    fully used by the unmet demand (most req/s per USD/h), or a prefill or decode instance or pair
    (most req/s of unmet demand per USD/h). Cover what remains of each model with the cheapest
    multiset of up to three instances; drop instances that serve nothing needed; then local search
    on each model's tail.
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
    _tail_search(c, s)
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
    for m in models:
        _cover_tail(c, s, int(m))
    _ratio_greedy(c, s, is_model, aggregated=True)


def _full_use_greedy(c: _Columns, s: _State, is_model: BoolArray) -> None:
    tol = _TOL * np.maximum(c.demand, 1.0)
    while True:
        unmet = s.unmet()
        active = np.nonzero((unmet > tol) & is_model)[0]
        if len(active) == 0:
            return
        cand = np.concatenate([c.by_model[a] for a in active])
        cand = cand[c.mode[cand] == _AGG]
        cand = cand[s.room(cand) >= 1]
        cand = cand[c.rate[cand] <= unmet[c.m[cand]] + tol[c.m[cand]]]
        if len(cand) == 0:
            return
        j = int(cand[np.argmax(c.rate[cand] / np.maximum(_marginal_cost(c, s.x, cand), 1e-12))])
        m = c.m[j]
        k = min(int(s.room(np.array([j]))[0]), int((unmet[m] + tol[m]) // c.rate[j]))
        if s.x[j] < c.cur[j]:
            k = min(k, int(c.cur[j] - s.x[j]))  # its marginal cost rises once the running ones are used
        s.change(j, max(k, 1))


def _ratio_greedy(c: _Columns, s: _State, is_model: BoolArray, *, aggregated: bool) -> None:
    """Add the instance (with ``aggregated``, or only prefill/decode) or prefill+decode pair that
    serves the most unmet demand per USD/h, until none serves more."""
    tol = _TOL * np.maximum(c.demand, 1.0)
    while True:
        unmet = s.unmet()
        active = np.nonzero((unmet > tol) & is_model)[0]
        if len(active) == 0:
            return
        best_ratio = 0.0
        best: tuple[int, ...] = ()
        cand = np.concatenate([c.by_model[a] for a in active])
        cand = cand[aggregated | (c.mode[cand] != _AGG)]
        cand = cand[s.room(cand) >= 1]
        if len(cand):
            gain = np.where(c.mode[cand] == _AGG, c.rate[cand], 0.0)
            dis = c.mode[cand] != _AGG
            if np.any(dis):
                jd = cand[dis]
                g = c.group[jd]
                y0 = _flow(c, g, s.gp[g], s.gd[g], s.gn[g])
                y1 = _flow(c, g, s.gp[g] + c.pcap[jd], s.gd[g] + c.dcap[jd], s.gn[g] + c.nic[jd])
                gain[dis] = np.maximum(y1 - y0, 0.0)
            gain = np.minimum(gain, unmet[c.m[cand]])
            ratio = np.where(gain > tol[c.m[cand]], gain / np.maximum(_marginal_cost(c, s.x, cand), 1e-12), 0.0)
            k = int(np.argmax(ratio))
            if ratio[k] > 0:
                best_ratio, best = float(ratio[k]), (int(cand[k]),)
        for g in np.nonzero(np.isin(c.group_m, active) & (s.gp <= 0) & (s.gd <= 0))[0]:
            pair = _best_pair(c, s, int(g), float(unmet[c.group_m[g]]))
            if pair is not None and pair[0] > best_ratio:
                best_ratio, best = pair
        if not best:
            return
        for j in best:
            s.change(j, 1)


def _best_pair(c: _Columns, s: _State, g: int, unmet: float) -> tuple[float, tuple[int, ...]] | None:
    """The cheapest-per-capacity prefill and decode instances for an empty group, as (ratio, pair)."""
    pre, dec = c.by_group_pre[g], c.by_group_dec[g]
    pre, dec = pre[s.room(pre) >= 1], dec[s.room(dec) >= 1]
    if len(pre) == 0 or len(dec) == 0:
        return None
    cp, cd = _marginal_cost(c, s.x, pre), _marginal_cost(c, s.x, dec)
    a = int(pre[np.argmin(cp / c.pcap[pre])])
    b = int(dec[np.argmin(cd / c.dcap[dec])])
    if not s.fits_together(a, b):
        return None
    gain = min(float(_flow(c, g, c.pcap[a], c.dcap[b], c.nic[a])), unmet)
    if gain <= _TOL * max(float(c.demand[c.group_m[g]]), 1.0):
        return None
    return gain / max(float(_marginal_cost(c, s.x, np.array([a, b])).sum()), 1e-12), (a, b)


def _cover_tail(c: _Columns, s: _State, m: int) -> None:
    """Cover model m's unmet demand with the cheapest multiset of up to _TAIL aggregated instances."""
    unmet = float(s.unmet()[m])
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
            before = min(float(s.capacity()[m]), float(c.demand[m]))
            s.change(int(j), -1)
            if min(float(s.capacity()[m]), float(c.demand[m])) < before - tol[m]:
                s.change(int(j), 1)
                break


def _tail_search(c: _Columns, s: _State, max_passes: int = 50) -> None:
    """Local search per model: one pass of rebuilds (each model served again from scratch), then
    passes of tail exchanges (drop up to three of its least efficient instances, cover what they
    served with up to three others) while any pays. More rebuild passes measured 2.5x slower for a
    0.01% better plan."""
    for k in range(max_passes):
        if not any([(k == 0 and _rebuild_model(c, s, m)) or _improve_model(c, s, m) for m in range(c.M)]):
            return


def _rebuild_model(c: _Columns, s: _State, m: int) -> bool:
    """Remove all of model m's instances and serve it again from scratch; keep that if it is cheaper
    and serves as much."""
    cols = c.by_model[m]
    old = s.x[cols].copy()
    if not old.any():
        return False
    tol = _TOL * max(float(c.demand[m]), 1.0)
    served = min(float(s.capacity()[m]), float(c.demand[m]))
    before = sum(_objective(c, s.x))
    best, best_x = before - 1e-9 * max(before, 1.0), old
    variants = (False, True) if c.by_group_pre and np.any(c.group_m == m) else (False,)
    for disagg_first in variants:
        _set_counts(s, cols, np.zeros(len(cols), dtype=np.int64))
        _fill(c, s, np.array([m]), disagg_first=disagg_first)
        _prune(c, s, cols)
        value = sum(_objective(c, s.x))
        if min(float(s.capacity()[m]), float(c.demand[m])) >= served - tol and value < best:
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
    other = float(s.capacity()[m] - s.agg[m])
    served = min(float(s.capacity()[m]), float(c.demand[m]))
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
    served = min(float(s.capacity()[m]), float(c.demand[m]))
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


def _unmet_total(c: _Columns, x: IntArray) -> float:
    return float(_State(c, x).unmet().sum())


# --------------------------------------------------------------------------------------------------
# HiGHS model


@attrs.frozen(eq=False)
class _Matrix:
    """The program in column-wise form: variables [new (J), keep (K), y (G), u (Md)]."""

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

    @property
    def num_cols(self) -> int:
        return len(self.col_lo)


def _matrix(c: _Columns) -> _Matrix:
    J, G, M = c.J, c.G, c.M
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
    row_pre = n + np.arange(G)
    row_dec = n + G + np.arange(G)
    n += 2 * G
    has_kv = c.kv[c.group_m] > 0
    row_kv = np.full(G, -1, dtype=np.int64)
    row_kv[has_kv] = n + np.arange(int(has_kv.sum()))
    n += int(has_kv.sum())
    service_row = n
    n += 1
    row_lo = np.full(n, -np.inf)
    row_hi = np.zeros(n)
    row_lo[: len(dem_models)] = c.demand[dem_models]
    row_hi[: len(dem_models)] = np.inf
    row_hi[row_av[av_r, av_g]] = c.avail[av_r, av_g]
    row_hi[service_row] = np.inf

    # entries of the x columns (new_j; keep copies them); rows scaled so that y has coefficient 1
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
    pre = np.nonzero(c.mode == _PRE)[0]
    dec = np.nonzero(c.mode == _DEC)[0]
    cols.append(pre)
    rows.append(row_pre[c.group[pre]])
    vals.append(-c.pcap[pre] / c.mean_in[c.m[pre]])
    cols.append(dec)
    rows.append(row_dec[c.group[dec]])
    vals.append(-c.dcap[dec] / c.mean_out[c.m[dec]])
    pkv = pre[has_kv[c.group[pre]]]
    cols.append(pkv)
    rows.append(row_kv[c.group[pkv]])
    vals.append(-c.nic[pkv] / (c.mean_in[c.m[pkv]] * c.kv[c.m[pkv]]))
    xc, xr, xv = np.concatenate(cols), np.concatenate(rows), np.concatenate(vals)
    keep_cols = np.nonzero(c.cur > 0)[0].astype(np.int64)
    K = len(keep_cols)
    keep_of = np.full(J, -1, dtype=np.int64)
    keep_of[keep_cols] = J + np.arange(K)
    kmask = keep_of[xc] >= 0
    # y and u columns
    gidx = np.arange(G)
    y_c = np.concatenate([gidx, gidx, gidx, gidx[has_kv]]) + J + K
    y_r = np.concatenate([row_dem[c.group_m], row_pre, row_dec, row_kv[has_kv]])
    y_v = np.ones(len(y_c))
    u_ids = J + K + G + np.arange(len(dem_models))
    u_c = np.concatenate([u_ids, u_ids])
    u_r = np.concatenate([row_dem[dem_models], np.full(len(dem_models), service_row)])
    u_v = np.ones(len(u_c))
    all_c = np.concatenate([xc, keep_of[xc[kmask]], y_c, u_c])
    all_r = np.concatenate([xr, xr[kmask], y_r, u_r])
    all_v = np.concatenate([xv, xv[kmask], y_v, u_v])
    order = np.lexsort((all_r, all_c))
    ncols = J + K + G + len(dem_models)
    start = np.zeros(ncols + 1, dtype=np.int64)
    start[1:] = np.cumsum(np.bincount(all_c, minlength=ncols))
    col_lo = np.zeros(ncols)
    col_hi = np.concatenate(
        [
            c.ub.astype(np.float64),
            np.minimum(c.cur, c.ub)[keep_cols].astype(np.float64),
            np.full(G, np.inf),
            c.demand[dem_models],
        ]
    )
    cost_obj = np.concatenate([c.cost + c.pen, c.cost[keep_cols], np.zeros(G + len(dem_models))])
    serve_obj = np.concatenate([np.zeros(J + K + G), np.ones(len(dem_models))])
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
    )


@attrs.frozen
class _Deadline:
    """A point in time on ``clock`` (seconds) by which a phase must end."""

    at: float
    clock: Callable[[], float]

    def left(self) -> float:
        return self.at - self.clock()

    def passed(self) -> bool:
        return self.left() <= 0

    def share(self, fraction: float) -> _Deadline:
        """The deadline after ``fraction`` of the time left now."""
        now = self.clock()
        return _Deadline(now + fraction * max(self.at - now, 0.0), self.clock)


_LIVE_THREADS: set[threading.Thread] = set()


@atexit.register
def _join_abandoned() -> None:  # pragma: no cover - interpreter shutdown
    for t in list(_LIVE_THREADS):
        t.join()


class _LpThread:
    """An LP job in a worker thread that the caller abandons at the deadline; the interrupt callback
    then stops HiGHS at its next check (frequent in the simplex method)."""

    def __init__(self) -> None:
        self.stop = False
        self.error: BaseException | None = None

    def attach(self, h: highspy.Highs) -> None:
        h.setCallback(self._callback, None)
        for kind in _INTERRUPT_CALLBACKS:
            h.startCallback(kind)

    def _callback(self, kind: Any, message: str, data_out: Any, data_in: Any, user_data: Any) -> None:
        if data_in is not None and self.stop:
            data_in.user_interrupt = True

    def run(self, job: Callable[[], None], deadline: _Deadline | None) -> bool:
        """Run ``job()`` in a thread; True if it finished before the deadline."""

        def target() -> None:
            try:
                job()
            except BaseException as exc:  # re-raised in the caller if it still waits
                self.error = exc
            finally:
                _LIVE_THREADS.discard(thread)

        thread = threading.Thread(target=target, daemon=True)
        _LIVE_THREADS.add(thread)
        thread.start()
        thread.join(None if deadline is None else max(deadline.left(), 0.0))
        if thread.is_alive():
            self.stop = True
            return False
        if self.error is not None:
            raise self.error
        return True


_HEADER = struct.Struct("<cq")  # message kind, payload bytes
_END = struct.Struct("<idqq")  # model status, dual bound, simplex iterations, nodes
_BOUND = struct.Struct("<dq")  # dual bound, nodes


def _send(fd: int, kind: bytes, payload: bytes) -> None:
    data = memoryview(_HEADER.pack(kind, len(payload)) + payload)
    while data:
        data = data[os.write(fd, data) :]


class _ForkedMip:
    """A MIP solved by single-threaded HiGHS in a forked child process, killed at the deadline.

    HiGHS cannot be stopped promptly: at the root of a large model its interrupt checks were up to
    16 s apart, and it overran its own ``time_limit`` by 2-3x. So the child streams each improving
    solution (the integer variables) and its dual bound through a pipe, and at the deadline the parent
    keeps the solutions fully received and kills the child. Single-threaded HiGHS finds the same
    solutions in the same order every run, so the number taken (``limit`` in a replay) fixes the plan.
    Several may run at once (``_run_all``); each is one process with one HiGHS solve.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.solutions: list[IntArray] = []
        self.dual_bound = -math.inf
        self.nodes = 0
        self.iterations = 0
        self.status: highspy.HighsModelStatus | None = None
        self.finished = False
        self.fd = -1
        self.pid = -1
        self._buf = bytearray()

    def start(self, build: Callable[[], highspy.Highs], num_int: int) -> None:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            os.close(read_fd)
            code = 0
            try:
                self._child(build(), num_int, write_fd)
            except BaseException as exc:
                _send(write_fd, b"X", repr(exc).encode())
                code = 1
            finally:
                os._exit(code)
        os.close(write_fd)
        self.fd, self.pid = read_fd, pid

    def done(self) -> bool:
        """Finished, or took as many solutions as its limit allows."""
        return self.finished or (self.limit is not None and len(self.solutions) >= self.limit)

    def feed(self) -> None:
        """Read what the child sent (the fd is readable) and take its messages, up to the limit."""
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            raise RuntimeError("the HiGHS child process ended without a result")
        self._buf += chunk
        buf = self._buf
        while len(buf) >= _HEADER.size and not self.done():
            kind, size = _HEADER.unpack_from(buf)
            if len(buf) < _HEADER.size + size:
                break
            payload = bytes(buf[_HEADER.size : _HEADER.size + size])
            del buf[: _HEADER.size + size]
            self._message(kind, payload)

    def stop(self) -> None:
        """Close the pipe; kill the child unless it finished."""
        if self.fd < 0:
            return
        os.close(self.fd)
        self.fd = -1
        if not self.finished:
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)

    @staticmethod
    def _child(h: highspy.Highs, num_int: int, fd: int) -> None:  # pragma: no cover - in the child
        last = [-math.inf]

        def callback(kind: Any, message: str, data_out: Any, data_in: Any, user_data: Any) -> None:
            if kind == cb.HighsCallbackType.kCallbackMipImprovingSolution:
                x = np.round(np.asarray(data_out.mip_solution)[:num_int]).astype(np.int64)
                _send(fd, b"S", x.tobytes())
            elif math.isfinite(data_out.mip_dual_bound) and data_out.mip_dual_bound > last[0]:
                last[0] = float(data_out.mip_dual_bound)
                _send(fd, b"B", _BOUND.pack(last[0], int(data_out.mip_node_count)))

        h.setCallback(callback, None)
        h.startCallback(cb.HighsCallbackType.kCallbackMipImprovingSolution)
        h.startCallback(cb.HighsCallbackType.kCallbackMipInterrupt)
        h.run()
        info = h.getInfo()
        status = int(h.getModelStatus())
        _send(
            fd,
            b"E",
            _END.pack(status, float(info.mip_dual_bound), int(info.simplex_iteration_count), int(info.mip_node_count)),
        )

    def _message(self, kind: bytes, payload: bytes) -> None:
        if kind == b"S":
            self.solutions.append(np.frombuffer(payload, dtype=np.int64).copy())
        elif kind == b"B":
            bound, nodes = _BOUND.unpack(payload)
            self.dual_bound, self.nodes = max(self.dual_bound, bound), max(self.nodes, nodes)
        elif kind == b"E":
            status, bound, self.iterations, nodes = _END.unpack(payload)
            self.status = highspy.HighsModelStatus(status)
            self.nodes = max(self.nodes, nodes)
            if math.isfinite(bound):
                self.dual_bound = max(self.dual_bound, bound)
            self.finished = True
        else:
            raise RuntimeError(f"HiGHS child process failed: {payload.decode(errors='replace')}")

    def taken(self) -> list[IntArray]:
        return self.solutions if self.limit is None else self.solutions[: self.limit]


def _run_all(
    jobs: list[tuple[_ForkedMip, Callable[[], highspy.Highs], int]], workers: int, deadline: _Deadline | None
) -> None:
    """Run the MIPs in order, at most ``workers`` children at a time, until each is done or the deadline
    passes; those not started by then stay unstarted (none with limit 0 is started)."""
    queue = [job for job in jobs if job[0].limit != 0]
    live: list[_ForkedMip] = []
    try:
        while queue or live:
            while queue and len(live) < workers:
                run, build, num_int = queue.pop(0)
                run.start(build, num_int)
                live.append(run)
            timeout = None if deadline is None else deadline.left()
            if timeout is not None and timeout <= 0:
                return
            ready = select.select([r.fd for r in live], [], [], timeout)[0]
            if not ready:
                return
            for run in [r for r in live if r.fd in ready]:
                run.feed()
                if run.done():
                    run.stop()
                    live.remove(run)
    finally:
        for run in live:
            run.stop()


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
        integer = np.nonzero(cols < len(mat.integer))[0].astype(np.int32)
        kinds = np.full(len(integer), int(highspy.HighsVarType.kInteger), dtype=np.uint8)
        h.changeColsIntegrality(len(integer), integer, kinds)
    return h


def _add_cols(h: highspy.Highs, mat: _Matrix, objective: FloatArray, cols: IntArray) -> None:
    """Add the variables ``cols`` (indices into the full program) to h, in that order."""
    ends = np.append(mat.start[1:], len(mat.value)).astype(np.int64)
    lengths = ends[cols] - mat.start[cols]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    entries = np.repeat(mat.start[cols] - offsets[:-1], lengths) + np.arange(offsets[-1])
    start, index, value = offsets[:-1].astype(np.int32), mat.index[entries], mat.value[entries]
    h.addCols(len(cols), objective[cols], mat.col_lo[cols], mat.col_hi[cols], len(value), start, index, value)


def _reduced_costs(mat: _Matrix, objective: FloatArray, row_dual: FloatArray) -> FloatArray:
    """Reduced cost of every variable at the row duals: c - A^T y."""
    col_of_entry = np.repeat(np.arange(mat.num_cols), np.diff(np.append(mat.start, len(mat.value))))
    return objective - np.bincount(col_of_entry, weights=mat.value * row_dual[mat.index], minlength=mat.num_cols)


def _service_hi(c: _Columns, unmet: float) -> float:
    return unmet * (1 + 1e-9) + 1e-7 * max(1.0, float(c.demand.sum()))


def _plan_vector(c: _Columns, mat: _Matrix, x: IntArray) -> FloatArray:
    s = _State(c, x)
    new = np.maximum(x - c.cur, 0)
    keep = np.minimum(x, c.cur)[mat.keep_cols]
    y = s.flows()
    u = np.maximum(c.demand - s.capacity(), 0.0)[mat.dem_models]
    return np.concatenate([new.astype(np.float64), keep.astype(np.float64), y, u])


def _x_of(c: _Columns, mat: _Matrix, values: FloatArray) -> IntArray:
    x = np.round(values[: c.J]).astype(np.int64)
    x[mat.keep_cols] += np.round(values[c.J : c.J + len(mat.keep_cols)]).astype(np.int64)
    return x


def _iterations(h: highspy.Highs) -> tuple[int, int]:
    info = h.getInfo()
    return max(int(info.simplex_iteration_count), 0), max(int(info.mip_node_count), 0)


@attrs.define
class _LpOutcome:
    done: bool = False
    values: FloatArray | None = None
    bound: float = -math.inf
    unmet: float = 0.0
    iterations: int = 0
    columns: IntArray | None = None  # x columns that column generation generated


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
        out.values = np.asarray(h.getSolution().col_value, dtype=np.float64)
        out.bound = float(h.getInfo().objective_function_value)


_AUTO_GENERATED = 5000  # columns from which "auto" uses column generation (ext-50 has 6.6k, core-400 2.1k)
_CG_INITIAL = 2  # best columns per (model, region, mode) that column generation starts from
_CG_ADD = 10  # most columns added per model and round


def _cg_job(c: _Columns, mat: _Matrix, mip_gap: float, out: _LpOutcome, thread: _LpThread) -> None:
    """The LP relaxation by column generation over the x columns (keep, y, u are always in).

    Start from each (model, region, mode)'s best columns by capacity per USD/h and the current ones;
    solve the restricted LP, price every column at its row duals, add the most negative reduced costs
    (up to _CG_ADD per model), repeat until none is negative: the restricted LP is then optimal for
    the full LP. First for min unmet (always feasible), then for min cost at that service level.
    """
    J = c.J
    eff = np.where(c.mode == _AGG, c.rate, np.where(c.mode == _PRE, c.pcap, c.dcap)) / np.maximum(c.cost, 1e-12)
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
    thread.attach(h)
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
            d = _reduced_costs(mat, objective, np.asarray(h.getSolution().row_dual))[:J]
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
    out.bound = float(h.getInfo().objective_function_value)
    out.columns = np.nonzero(chosen)[0]


@attrs.define
class _DiveOutcome:
    """How far an LP dive went (LP solves), whether it ended integral, and its last rounded-down plan."""

    steps: int = 0
    done: bool = False
    plan: IntArray | None = None
    snapshot: tuple[int, IntArray | None, bool] = (0, None, False)
    """(steps, plan, done) written in one assignment after each step, for a reader that abandons the dive."""


def _dive_job(c: _Columns, mat: _Matrix, mip_gap: float, limit: int | None, out: _DiveOutcome,
              thread: _LpThread) -> None:  # fmt: skip
    """LP diving for the most service: solve the min-unmet LP, round up (as a lower bound) the fractional
    integer variables that fit the availability with the others at their floors (parts >= 0.5, largest
    first, else the largest; when none fits, bound the least fractional one to its floor), and solve
    again, until the LP is integral."""
    n_int = c.J + len(mat.keep_cols)
    col_of = np.concatenate([np.arange(c.J), mat.keep_cols])
    h = _highs(mat, mat.serve_obj, math.inf, mip_gap, mip=False)
    thread.attach(h)
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
        out.snapshot = (out.steps, x, False)
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
                out.snapshot = (out.steps, x, True)
                return
            down = int(np.argmin(part))  # nothing fits once more: the least fractional one goes down
            hi[down] = base[down]
        else:
            lo[ups] = base[ups] + 1
        h.changeColsBounds(n_int, idx, lo, np.maximum(hi, lo))


def _highs_solution(values: FloatArray) -> highspy.HighsSolution:
    sol = highspy.HighsSolution()
    sol.col_value = values.tolist()
    sol.value_valid = True
    return sol


# --------------------------------------------------------------------------------------------------
# The solve


def _better(c: _Columns, a: IntArray, b: IntArray) -> bool:
    """Whether plan a beats plan b: less unmet demand, then lower cost plus churn."""
    tol = 1e-7 * max(1.0, float(c.demand.sum()))
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
                out[(i, reg)] = k
                keep -= k
                rest -= k
        if rest > 0:
            out[(members[0], reg)] = out.get((members[0], reg), 0) + rest
    return out


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
) -> tuple[_ForkedMip, Callable[[], highspy.Highs], int]:
    """One MIP (over the variables ``cols``, default all), warm-started with plan ``start``, ready for
    ``_run_all``: (the run, its model builder, its number of integer variables)."""
    vector = _plan_vector(c, mat, start)

    def build() -> highspy.Highs:
        h = _highs(mat, objective, service_hi, mip_gap, mip=True, cols=cols, row_lo=row_lo, cuts=cuts)
        h.setSolution(_highs_solution(vector if cols is None else vector[cols]))
        return h

    n_x = c.J + len(mat.keep_cols)
    return _ForkedMip(limit), build, n_x if cols is None else int(np.sum(cols < n_x))


def _mip_plans(c: _Columns, mat: _Matrix, run: _ForkedMip, cols: IntArray | None) -> list[IntArray]:
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
) -> tuple[_ForkedMip, list[IntArray]]:
    """One MIP in a child process: (the run, the plans it found, in order)."""
    job = _mip_job(c, mat, objective, service_hi, start, limit, mip_gap, cols, cuts=cuts)
    _run_all([job], 1, deadline)
    return job[0], _mip_plans(c, mat, job[0], cols)


def _model_vars(c: _Columns, mat: _Matrix) -> list[IntArray]:
    """Per model: its variables (its columns' new and keep copies, its flows y, its unmet u)."""
    owner = np.concatenate([c.m, c.m[mat.keep_cols], c.group_m, mat.dem_models])
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


DIVE_SHARE = 0.3
"""Share of the deadline after the LP that the diving heuristic may use."""

SPLIT_MIN_COLUMNS = 300
"""Columns from which the decomposition runs: below, the full MIP was faster than starting a child
process per model (core's homogeneous restriction, 206 columns: 0.05 s against 0.14 s)."""

SPLIT_SHARE = 0.75
"""Share of the time left after the heuristic that the decomposition may use; the full MIP gets the rest."""

SPLIT_WORKERS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))
"""Per-group MIPs run at once (each a child process with one single-threaded HiGHS)."""


def _split_phase(
    c: _Columns,
    mat: _Matrix,
    start: IntArray,
    limits: Mapping[int, int],
    deadline: _Deadline | None,
    mip_gap: float,
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
    """
    out = _Split()
    variables = _model_vars(c, mat)
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
        masks = {g: sum(1 << m for m in ms) for g, ms in groups.items()}
        jobs = []
        for g, ms in groups.items():
            if g in plan_of:
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
            cuts = [(v, bound) for members, v, bound in found if members <= set(ms)]
            limit = limits.get(masks[g])
            job = _mip_job(c, mat, mat.cost_obj, hi, start, limit, mip_gap, cols, row_lo=lo, cuts=cuts)
            jobs.append((g, cols, job))
        jobs.sort(key=lambda job: -len(job[1]))  # largest first: the workers finish closer together
        _run_all([job for _g, _cols, job in jobs], SPLIT_WORKERS, deadline)
        out.groups += len(jobs)
        complete = True
        for g, cols, (run, _build, _n) in jobs:
            out.iterations += run.iterations
            out.nodes += run.nodes
            if run.finished and run.status == highspy.HighsModelStatus.kInfeasible:
                return _Split(stopped=out.stopped, groups=out.groups, iterations=out.iterations, nodes=out.nodes)
            own = np.concatenate([c.by_model[m] for m in groups[g]])
            plans = _mip_plans(c, mat, run, cols)
            plan_of[g] = (plans[-1] if plans else start)[own]
            proven_of[g] = run.finished and run.status == highspy.HighsModelStatus.kOptimal
            if not run.finished:
                out.stopped[masks[g]] = len(run.taken())
                complete = False
            elif math.isfinite(run.dual_bound):  # a stopped run's bound depends on the clock: not used
                bound_of[g] = max(bound_of[g], run.dual_bound)
                v = np.concatenate([variables[m] for m in groups[g]])
                found.append((frozenset(groups[g]), v, run.dual_bound))
        x = np.zeros(c.J, dtype=np.int64)
        for g, ms in groups.items():
            x[np.concatenate([c.by_model[m] for m in ms])] = plan_of[g]
        out.plan = x
        out.cuts = [(v, bound) for _members, v, bound in found]
        out.bound = sum(bound_of.values())
        out.proven = all(proven_of.values())
        over = _State(c, x).used > c.avail
        out.fits = not bool(over.any())
        if out.fits or not complete or len(groups) == 1:
            return out
        repaired = _repair(c, _fit(c, x))
        if _better(c, repaired, start):
            start = repaired
        for reg, typ in np.argwhere(over):
            users = sorted({owner[int(m)] for m in c.m[(x > 0) & (c.r == reg) & (c.nc[:, typ] > 0)]})
            for g in users[1:]:
                for m in groups.pop(g):
                    owner[m] = users[0]
                    groups[users[0]].append(m)
                bound_of[users[0]] += bound_of.pop(g)
                plan_of.pop(g, None)
                proven_of.pop(g, None)
            plan_of.pop(users[0], None)
            proven_of.pop(users[0], None)


_SKIP_ALL = SolverEffort(lp=0, serve=0, cost=0, dive=0, decompose=0)
"""The effort of a solve cut before it began: the greedy plan alone."""

RESTRICT_SHARE = 0.2
"""Share of the time left that each restriction of the portfolio may use."""


def _restrictions(p: AllocationProblem) -> list[tuple[str, IntArray]]:
    """(name, template indices) of each restriction of ``RESTRICTIONS`` that selects some but not all of
    p's templates, and not the same ones as an earlier restriction."""
    homo = np.array([int((t.node_counts > 0).sum()) == 1 for t in p.templates], dtype=bool)
    agg = np.array([t.mode == "aggregated" for t in p.templates], dtype=bool)
    masks = {"homo": homo & agg, "pd-homo": homo & ~agg, "homo-pd": homo}
    out: list[tuple[str, IntArray]] = []
    seen: set[bytes] = set()
    for name in RESTRICTIONS:
        mask = masks[name]
        if mask.any() and not mask.all() and mask.tobytes() not in seen:
            seen.add(mask.tobytes())
            out.append((name, np.nonzero(mask)[0]))
    return out


def _restrict(p: AllocationProblem, idx: IntArray) -> AllocationProblem:
    """The same problem over the templates ``idx`` (and their running instances)."""
    keep = {p.templates[i].key for i in idx}
    return attrs.evolve(
        p, templates=[p.templates[i] for i in idx], current={k: v for k, v in p.current.items() if k[0] in keep}
    )


def _column_of(c: _Columns) -> dict[tuple[int, int], int]:
    """Column of each (original template index, region) that has one."""
    out: dict[tuple[int, int], int] = {}
    for j in range(c.J):
        for i in c.members[int(c.tu[j])]:
            out[(i, int(c.r[j]))] = j
    return out


def _status(proven: bool, service_proven: bool, bound: float) -> str:
    """``optimal`` when proven; ``feasible`` when the service level is proven and a cost bound above 0
    exists (the gap is to it); else ``no bound``: without a proven service level a cost bound says
    nothing of the lexicographic optimum."""
    if proven:
        return "optimal"
    return "feasible" if service_proven and bound > 0 else "no bound"


def solve_allocation(
    problem: AllocationProblem,
    *,
    deadline_s: float = 1.0,
    mip_gap: float = 1e-4,
    effort: SolverEffort | None = None,
    columns: str = "auto",
    decompose: bool | None = None,
    clock: Callable[[], float] = time.perf_counter,
    portfolio: bool = True,
) -> AllocationResult:
    """Plan instances per template and region: serve the most demand, then at the least cost plus churn.

    Returns within about ``deadline_s`` (wall clock; HiGHS runs in a worker thread that is abandoned
    and interrupted at the deadline), always with a feasible plan. With ``effort`` the wall clock is
    ignored and each phase stops where ``effort`` says, which makes the solve deterministic: pass a
    result's ``effort`` back to replay exactly its plan.

    ``columns="generated"`` solves the LP by column generation and the MIPs over the generated
    columns plus the current and the heuristic plan's: the MIPs find better plans in time at the
    extended size, but their bounds hold only for those columns, so the reported bound is the LP's.
    ``"all"`` solves the MIPs over all columns; ``"auto"`` (default) generates columns from 5,000
    (template, region) columns up (the extended size, where it measured 1-5% cheaper plans).

    ``decompose``: when the LP serves every demand, first solve each model's MIP alone over all its
    columns, merging models whose plans overrun the same availability (see ``_split_phase``); the full
    MIP runs only when that does not prove the plan optimal, with the group bounds as cuts. ``None``
    (default) decomposes from ``SPLIT_MIN_COLUMNS`` columns up.

    ``portfolio``: first solve each restriction of ``RESTRICTIONS`` that selects some but not all of the
    templates (a baseline's problem) alone, in ``RESTRICT_SHARE`` of the time left each; its plan is a
    plan of this problem, so the result is never worse than a restriction solved to its optimum.

    ``clock`` (seconds) measures the deadline; a test passes a fake one to cut the solve at any phase.
    Every phase that the deadline cuts or skips is recorded in the result's ``effort``.
    """
    if columns not in ("auto", "all", "generated"):
        raise AllocationInputError(f"columns: must be 'auto', 'all' or 'generated', got {columns!r}")
    if not (deadline_s > 0 and math.isfinite(deadline_s)):
        raise AllocationInputError(f"deadline_s: must be finite and > 0, got {deadline_s}")
    if not (0 <= mip_gap < 1):
        raise AllocationInputError(f"mip_gap: must be in [0, 1), got {mip_gap}")
    t0 = time.perf_counter()
    deadline = None if effort is not None else _Deadline(clock() + deadline_s, clock)
    limits = effort if effort is not None else SolverEffort()
    phase_s: dict[str, float] = {}
    c = _columns(problem)
    mat = _matrix(c)
    if columns == "auto":
        columns = "generated" if c.J >= _AUTO_GENERATED else "all"
    t1 = time.perf_counter()
    phase_s["build"] = t1 - t0
    svc_tol = 1e-7 * max(1.0, float(c.demand.sum()))
    iters = nodes = 0
    used: dict[str, int | None] = {"lp": None, "serve": None, "cost": None, "dive": None, "split": None}

    def out_of_time() -> bool:
        return deadline is not None and deadline.passed()

    def mip_vars(plan: IntArray) -> IntArray | None:
        """All variables, or with generated columns those plus the plan's and the current ones."""
        if columns == "all" or lp.columns is None:
            return None
        x_cols = np.union1d(lp.columns, np.nonzero((plan > 0) | (c.cur > 0))[0])
        return np.concatenate([x_cols, np.arange(c.J, mat.num_cols)])

    # LP relaxation
    lp = _LpOutcome()
    if c.J > 0:
        if limits.lp == 0 or out_of_time():
            used["lp"] = 0
        else:
            thread = _LpThread()
            if columns == "all":
                h = _highs(mat, mat.cost_obj, _service_hi(c, 0.0), mip_gap, mip=False)
                thread.attach(h)
                job = functools.partial(_lp_job, h, c, mat, lp)
            else:
                job = functools.partial(_cg_job, c, mat, mip_gap, lp, thread)
            if thread.run(job, deadline):
                iters += lp.iterations
            else:
                lp = _LpOutcome()
                used["lp"] = 0
    t2 = time.perf_counter()
    phase_s["lp"] = t2 - t1

    # rounding and greedy repair: from the LP, and from the current deployment
    best = np.zeros(c.J, dtype=np.int64)
    if c.J > 0:
        if not lp.done or np.any(c.cur > 0):
            best = _repair(c, _fit_current(c))
        if lp.values is not None:
            v = lp.values[: c.J].copy()
            v[mat.keep_cols] += lp.values[c.J : c.J + len(mat.keep_cols)]
            rounded = _repair(c, np.floor(v + 1e-6).astype(np.int64), frac=v)
            if not _better(c, best, rounded):
                best = rounded
    # the portfolio: each baseline's restriction solved alone; its plan is a plan of this problem too
    restricted: list[tuple[str, SolverEffort]] = []
    t_restrict = time.perf_counter()
    if portfolio and c.J > 0:
        where = _column_of(c)
        for name, idx in _restrictions(problem):
            sub = _restrict(problem, idx)
            kw: dict[str, Any] = {"mip_gap": mip_gap, "columns": columns, "portfolio": False}
            if deadline is None:
                res = solve_allocation(sub, effort=dict(limits.restricted).get(name, SolverEffort()), **kw)
            elif out_of_time():
                res = solve_allocation(sub, effort=_SKIP_ALL, **kw)
            else:
                left = max(RESTRICT_SHARE * deadline.left(), 1e-6)
                res = solve_allocation(sub, deadline_s=left, clock=clock, **kw)
            if res.effort != SolverEffort():
                restricted.append((name, res.effort))
            x = np.zeros(c.J, dtype=np.int64)
            for (i, reg), n in res.counts.items():
                x[where[(int(idx[i]), reg)]] += n
            if _better(c, x, best):
                best = x
    phase_s["restrict"] = time.perf_counter() - t_restrict

    # LP diving when not every demand can be served (rounding loses most there)
    if c.J > 0 and lp.done and lp.unmet > svc_tol:
        if limits.dive == 0 or out_of_time():
            used["dive"] = 0
        else:
            dive = _DiveOutcome()
            thread = _LpThread()
            share = None if deadline is None else deadline.share(DIVE_SHARE)
            finished = thread.run(functools.partial(_dive_job, c, mat, mip_gap, limits.dive, dive, thread), share)
            steps, plan, done = dive.snapshot  # one read: an abandoned dive thread may still write
            if not finished or (limits.dive is not None and not done):
                used["dive"] = steps
            if plan is not None:
                dived = _repair(c, _fit(c, plan))
                if _better(c, dived, best):
                    best = dived
    t3 = time.perf_counter()
    phase_s["heuristic"] = t3 - t2

    # per-model MIPs, when the LP serves every demand: their union is optimal when it fits
    split = _Split()
    split_optimal = False
    if decompose is None:
        decompose = c.J >= SPLIT_MIN_COLUMNS
    if decompose and c.J > 0 and lp.done and lp.unmet <= svc_tol and (limits.decompose == 0 or out_of_time()):
        used["split"] = 0
    elif decompose and c.J > 0 and lp.done and lp.unmet <= svc_tol:
        share = None if deadline is None else deadline.share(SPLIT_SHARE)
        split = _split_phase(c, mat, best, dict(limits.split), share, mip_gap)
        iters, nodes = iters + split.iterations, nodes + split.nodes
        if split.plan is not None:
            x = split.plan if split.fits else _repair(c, _fit(c, split.plan))
            if _better(c, x, best) or (split.fits and split.proven):
                best = x
            split_optimal = split.fits and split.proven and _unmet_total(c, best) <= svc_tol
    t_split = time.perf_counter()
    phase_s["split"] = t_split - t3
    t3 = t_split

    # MIP phase 1 (serve), only when the LP bound does not already prove the service level
    unmet_bound = lp.unmet if lp.done else 0.0
    if c.J == 0:
        unmet_bound = float(c.demand.sum())
    if c.J > 0 and _unmet_total(c, best) > unmet_bound + svc_tol:
        if limits.serve == 0 or out_of_time():
            used["serve"] = 0
        else:
            half = None if deadline is None else deadline.share(0.5)
            run, plans = _mip_phase(c, mat, mat.serve_obj, math.inf, best, limits.serve, half, mip_gap, mip_vars(best))
            iters, nodes = iters + run.iterations, nodes + run.nodes
            used["serve"] = None if run.finished else len(run.taken())
            for x in plans:
                if _better(c, x, best):
                    best = x
            if columns == "all":
                unmet_bound = max(unmet_bound, run.dual_bound)
            if columns == "all" and run.status == highspy.HighsModelStatus.kOptimal:
                unmet_bound = max(unmet_bound, _unmet_total(c, best) * (1 - mip_gap))
    unmet_best = _unmet_total(c, best)
    service_proven = unmet_best <= unmet_bound + svc_tol or unmet_best * (1 - mip_gap) <= unmet_bound
    t4 = time.perf_counter()
    phase_s["serve"] = t4 - t3

    # MIP phase 2 (cost) at the best service level found
    cost_bound = -math.inf
    cost_optimal = False
    if c.J > 0 and not split_optimal:
        if limits.cost == 0 or out_of_time():
            used["cost"] = 0
        else:
            hi = _service_hi(c, unmet_best)
            cuts = split.cuts if unmet_best <= svc_tol else None
            run, plans = _mip_phase(
                c, mat, mat.cost_obj, hi, best, limits.cost, deadline, mip_gap, mip_vars(best), cuts
            )  # fmt: skip
            iters, nodes = iters + run.iterations, nodes + run.nodes
            used["cost"] = None if run.finished else len(run.taken())
            for x in plans:
                if _unmet_total(c, x) <= unmet_best + svc_tol and _better(c, x, best):
                    best = x
            if columns == "all":
                cost_bound = run.dual_bound
                cost_optimal = run.status == highspy.HighsModelStatus.kOptimal
    t5 = time.perf_counter()
    phase_s["cost"] = t5 - t4

    cost, churn = _objective(c, best)
    objective = cost + churn
    bounds = [0.0, cost_bound]
    if lp.done and unmet_best <= lp.unmet + svc_tol:
        bounds.append(lp.bound)
    if unmet_best <= svc_tol:
        bounds.append(split.bound)
    bound = min(max(bounds), objective)
    gap = (objective - bound) / objective if objective > 0 else 0.0
    status = _status(c.J == 0 or split_optimal or (service_proven and (cost_optimal or gap <= mip_gap)),
                     service_proven, bound)  # fmt: skip
    if status == "no bound":
        bound, gap = 0.0, 1.0 if objective > 0 else 0.0
    served = np.minimum(_State(c, best).capacity(), c.demand) if c.J else np.zeros(c.M)
    return AllocationResult(
        counts=_counts(c, best),
        cost_per_hour=cost,
        churn_cost=churn,
        served_rps=served,
        unmet_rps=c.demand - served,
        status=status,
        objective=objective,
        bound=bound,
        gap=gap,
        unmet_bound=unmet_bound,
        service_proven=service_proven,
        solve_s=time.perf_counter() - t0,
        phase_s=phase_s,
        effort=SolverEffort(
            lp=used["lp"],
            serve=used["serve"],
            cost=used["cost"],
            dive=used["dive"],
            decompose=used["split"],
            split=split.stopped.items(),
            restricted=restricted,
        ),
        simplex_iterations=iters,
        mip_nodes=nodes,
        num_columns=mat.num_cols,
        num_rows=mat.num_rows,
        merged_templates=sum(len(ms) - 1 for ms in c.members),
        column_generation=columns == "generated",
        split_groups=split.groups,
    )
