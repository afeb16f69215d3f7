"""The allocation problem as numbers, its validation, the solver's effort record and its result."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


MODES = ("aggregated", "prefill", "decode")
RESTRICTIONS = ("homo", "pd-homo", "homo-pd", "agg")
"""The portfolio's restrictions, each the template subset of a baseline or a column of the savings study
(``solvers.study``), smallest first: homogeneous aggregated templates, homogeneous prefill and decode
templates, their union (every homogeneous template), and every aggregated template (mixed types included)."""


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


def _conv_priority(value: Any) -> FloatArray | None:
    return None if value is None else _to_floats("AllocationProblem.priority", value)


def _subs(value: Iterable[tuple[str, SolverEffort]]) -> tuple[tuple[str, SolverEffort], ...]:
    return tuple(sorted(((str(a), b) for a, b in value), key=lambda item: item[0]))


def _pairs(value: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    return tuple(sorted((int(a), int(b)) for a, b in value))


def _pair(value: tuple[int, int] | None) -> tuple[int, int] | None:
    return None if value is None else (int(value[0]), int(value[1]))


def _conv_avail(value: Any) -> IntArray:
    return _to_ints("AllocationProblem.avail", value)


@attrs.frozen(eq=False)
class AllocTemplate:
    """A serving template as the allocator sees it.

    ``node_counts[g]`` is how many nodes of node type g one instance needs. Capacities are at the
    model's SLO: prefill (prompt) and decode tokens per second. ``load_s`` is the time to load the
    weights, which prices churn. ``key`` is a stable id (it matches the current deployment).
    ``kv_min_nic`` (decode only): the slowest NIC, in bytes/s, that a prefill instance's slowest node
    may have and still feed this decode template within its SLO (0: any).
    """

    m: int
    mode: str
    node_counts: IntArray = attrs.field(converter=_conv_node_counts)
    prefill_tok_s: float
    decode_tok_s: float
    load_s: float
    key: str
    kv_min_nic: float = 0.0


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
    priority: FloatArray | None = attrs.field(default=None, converter=_conv_priority)
    """Weight of each model's unmet req/s in the serve-first phase (> 0; None: 1 for every model)."""

    def __attrs_post_init__(self) -> None:
        _validate(self)

    @property
    def weights(self) -> FloatArray:
        """``priority``, or 1 for every model."""
        return np.ones(self.num_models) if self.priority is None else self.priority

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
    heuristic: int | None = None
    """Local-search steps the heuristic took when the deadline cut it (None: it ran to completion)."""
    serve: int | None = None
    cost: int | None = None
    dive: int | None = None
    """LP solves the diving heuristic made, when it stopped early (None: ran to completion or not needed)."""
    decompose: int | None = None
    """0: the decomposition by model was skipped (the deadline came first); None: it ran or was not needed."""
    master: tuple[int, int] | None = attrs.field(default=None, converter=_pair)
    """(round i, solutions k) when the restricted master MIPs (``solvers.allocation.master``) stopped early: its
    rounds before i ran to completion, round i took k improving solutions (0: not started), none after.
    None: it ran to completion or was not needed."""
    search: tuple[int, int] | None = attrs.field(default=None, converter=_pair)
    """(step s, solutions k) when the neighbourhood search (``solvers.allocation.neighbourhood``) stopped
    early: its steps before s ran to completion, step s took k improving solutions (0: not started), none
    after. None: it ran to completion or was not needed."""
    restricted: tuple[tuple[str, SolverEffort], ...] = attrs.field(default=(), converter=_subs)
    """(restriction, the effort of its sub-solve) of each restriction of the portfolio (``RESTRICTIONS``)
    whose sub-solve was cut short; one not listed ran to completion or was not needed."""
    split: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_pairs)
    """(group, improving solutions taken) of each MIP of the decomposition by model stopped early (group:
    the bitmask of its model indices); a group not listed ran to completion or was not needed."""

    def as_mapping(self) -> dict[str, int]:
        """Flat ``{phase: k}`` for a plan record (``split.M`` per model); phases run to completion left out."""
        phases = (
            ("lp", self.lp), ("heuristic", self.heuristic), ("serve", self.serve), ("cost", self.cost),
            ("dive", self.dive),
            ("decompose", self.decompose),
        )  # fmt: skip
        out = {k: v for k, v in phases if v is not None}
        if self.master is not None:
            out[f"master.{self.master[0]}"] = self.master[1]
        if self.search is not None:
            out[f"search.{self.search[0]}"] = self.search[1]
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
        master = next(((int(k.split(".", 1)[1]), v) for k, v in own.items() if k.startswith("master.")), None)
        search = next(((int(k.split(".", 1)[1]), v) for k, v in own.items() if k.startswith("search.")), None)
        phases = {k: v for k, v in own.items() if not k.startswith(("split.", "master.", "search."))}
        restricted = [(name, cls.from_mapping(sub)) for name, sub in subs.items()]
        return cls(**phases, master=master, search=search, split=split, restricted=restricted)


@attrs.frozen
class AllocationResult:
    """A plan: instances per (template index, region index), its cost, service and solver status.

    ``status`` says only what was proven: ``optimal`` (service proven maximal and cost within ``mip_gap``
    of the bound), ``feasible`` (service proven maximal; the cost's ``gap`` is to a proven ``bound`` > 0)
    or ``no bound`` (the service level is not proven, or no cost bound above 0 is: ``bound`` 0, ``gap`` 1).
    ``objective`` is cost plus churn (USD/h); ``bound`` a proven lower bound on it at the plan's service
    level; ``gap`` = (objective - bound) / objective. ``unmet_bound`` is a proven lower bound on the total
    unmet req/s, each model's weighted by its priority; ``service_proven`` says the plan's unmet demand
    meets it (within ``mip_gap``). ``phase_s``: seconds per phase (build, lp, heuristic, serve, cost);
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
    capacity_rps: FloatArray
    """req/s each model's instances serve as the program counts them (may exceed its demand)."""
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
    if p.priority is not None:
        _check_vector(p, "priority", M, "model", positive=True)
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
    keys = _template_keys(p)
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


_CHECKED: list[tuple[tuple[AllocTemplate, ...], int, int, frozenset[str]]] = []
"""The last template tuples validated, with the model and node type counts they were checked against and
their keys: a problem rebuilt from another with new demand, prices or availability (``attrs.evolve``, as
the solver process does per solve) shares its templates tuple and skips their loop (0.1-1 s at 7,700
templates)."""


def _template_keys(p: AllocationProblem) -> frozenset[str]:
    """Validate the templates (each names its field and reason); their keys."""
    for ts, M, T, keys_seen in _CHECKED:
        if ts is p.templates and (p.num_models, p.num_node_types) == (M, T):
            return keys_seen
    M, T = p.num_models, p.num_node_types
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
        for field in ("prefill_tok_s", "decode_tok_s", "load_s", "kv_min_nic"):
            v = getattr(t, field)
            if not (isinstance(v, int | float | np.number) and math.isfinite(v) and v >= 0):
                raise _fail(f"{where}.{field}", f"must be finite and >= 0, got {v}")
        if t.mode in ("aggregated", "prefill") and t.prefill_tok_s <= 0:
            raise _fail(f"{where}.prefill_tok_s", f"must be > 0 for mode {t.mode!r}")
        if t.mode in ("aggregated", "decode") and t.decode_tok_s <= 0:
            raise _fail(f"{where}.decode_tok_s", f"must be > 0 for mode {t.mode!r}")
    _CHECKED[:] = [*_CHECKED[-8:], (p.templates, M, T, frozenset(keys))]
    return frozenset(keys)
