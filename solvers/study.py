"""The savings study: where Coral's plans are cheaper than its baselines', and which part of it pays.

A *cell* is one (demand scale s, availability setting a). Its plan request is the scenario's at t = 0
with every deployment's demand times s and, per (region, node type), the availability that a gives:

- ``catalog``: the scenario's own (for ``core``: the catalog's);
- ``scarce``: top-tier nodes (H100, H200 and A100 GPUs) limited to 1 per region for shapes of 8 GPUs or
  more and to 2 for smaller ones (what ``fixtures/scenarios/scarce.toml`` does to ``core``);
- ``cap4``: at most 4 nodes of each type per region;
- ``quota``: a seeded quota of 0-4 nodes per (region, node type), never more than the scenario offers.

Each *column* solves the same allocation program (``solvers.planning.Planner``, same prices,
availability, demand and deadline) over a subset of the templates, so that the columns, read from left
to right, show where the gain comes from:

- ``homo``: homogeneous aggregated replicas (the ``homo`` baseline);
- ``pd-homo``: homogeneous prefill and decode instances (the ``pd-homo`` baseline);
- ``homo+pd``: every homogeneous template, aggregated or prefill/decode (the gain of splitting);
- ``agg``: every aggregated template, mixed node types included (the gain of mixing types);
- ``coral``: every template.

A column's figures: cost per hour, the fraction of demand served, and goodput, the output tokens per
second of the demand served (served req/s times the deployment's mean output tokens). Every template's
capacity is its SLO-compliant capacity, loaded no further than its queue meets the TTFT target
(``solvers.planning``), so the demand a plan serves is served within the SLO.

Never worse: in every cell Coral's plan must be at least as good as every other column's, in the
allocation program's own lexicographic order: its priority-weighted unmet demand is at most the
column's (within ``SERVE_TOL`` of the weighted demand), and where the two serve the same, its cost plus
churn penalty (the program's objective; a cell starts from no instances, so every instance pays the
penalty of its load time) is at most the column's (within ``COST_TOL``, the solvers' optimality gaps).
The table shows the cost alone, so a column with a slightly lower cost but a higher penalty is not
better. ``Cell.worse_than`` names the columns that beat it. Coral's solve is given the other columns'
plans of the cell as starting plans (``sweep_cell``): each is a plan of Coral's program too, serving at
least as much there, so this holds in every cell however short the deadline or busy the machine; what
the deadline and the load decide is how much Coral gains on top.

Pure: the caller reads the store and the scenario, and passes the planners in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs
import numpy as np

from coral.catalog.types import Catalog
from coral.errors import CoralError
from coral.plan import Plan, PlanRequest
from coral.scenario import Scenario
from coral.templates import Template
from solvers.planning import policy_admits

AVAILABILITY = ("catalog", "scarce", "cap4", "quota")
"""The availability settings of a sweep, in table order."""
COLUMNS = ("homo", "pd-homo", "homo+pd", "agg", "coral")
"""The template subsets solved in each cell, in table order (``coral`` last)."""
BASELINES = ("homo", "pd-homo")
"""The columns that are baselines of their own (``coral bench``'s); the others are parts of Coral."""
SCALES = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0)
"""The default demand scales."""
QUICK_SCALES = (0.5, 5.0)
QUICK_AVAILABILITY = ("catalog", "quota")
TOP_TIER = ("h100", "h200", "a100")
"""GPU families that ``scarce`` limits (the prefix of the catalog's GPU type names)."""
CAP = 4
QUOTA_MAX = 4
SERVE_TOL = 1e-6
COST_TOL = 1e-3


def column_admits(column: str, t: Template) -> bool:
    """Whether a column of the study may use a template."""
    homogeneous = len(set(t.nodes)) == 1
    if column in BASELINES:
        return policy_admits(column, t)
    if column == "homo+pd":
        return homogeneous
    if column == "agg":
        return t.mode == "aggregated"
    if column == "coral":
        return True
    raise CoralError(f"unknown study column {column!r}; choose from {', '.join(COLUMNS)}")


def column_templates(column: str, templates: Mapping[str, Sequence[Template]]) -> dict[str, list[Template]]:
    """Each deployment's templates that a column may use."""
    return {d: [t for t in ts if column_admits(column, t)] for d, ts in templates.items()}


def availability(
    setting: str, base: Mapping[tuple[str, str], int], catalog: Catalog, seed: int
) -> dict[tuple[str, str], int]:
    """Availability per (region, node type) under a setting (see the module docstring); ``base`` is the
    scenario's own."""
    if setting == "catalog":
        return dict(base)
    if setting == "cap4":
        return {k: min(v, CAP) for k, v in base.items()}
    if setting == "scarce":
        out = {}
        for (r, n), v in base.items():
            node = catalog.nodes[n]
            if node.gpu.startswith(TOP_TIER):
                v = min(v, 1 if node.gpu_count >= 8 else 2)
            out[(r, n)] = v
        return out
    if setting == "quota":
        rng = np.random.default_rng(seed)
        return {k: min(base[k], int(rng.integers(0, QUOTA_MAX + 1))) for k in sorted(base)}
    raise CoralError(f"unknown availability setting {setting!r}; choose from {', '.join(AVAILABILITY)}")


def cell_request(base: PlanRequest, scale: float, setting: str, catalog: Catalog, seed: int) -> PlanRequest:
    """The plan request of one cell: ``base`` with demand times ``scale`` and the setting's availability."""
    return attrs.evolve(
        base,
        demand={k: v * scale for k, v in base.demand.items()},
        availability=availability(setting, base.availability, catalog, seed),
        current={},
        trigger="sweep",
    )


@attrs.frozen
class ColumnResult:
    """One column's plan in one cell."""

    column: str
    cost_per_hour: float
    served_fraction: float
    goodput_tok_s: float
    weighted_unmet_rps: float
    status: str
    gap: float
    unmet_rps: Mapping[str, float]
    """Unmet req/s per deployment (deployments fully served left out)."""
    churn_cost: float = 0.0
    """The churn penalty (USD/h) that the program adds to the cost in its objective."""

    @property
    def objective(self) -> float:
        """Cost plus churn penalty: what the allocation program minimises at a service level."""
        return self.cost_per_hour + self.churn_cost


def column_result(column: str, plan: Plan, sc: Scenario) -> ColumnResult:
    """A plan's figures for the study."""
    deps = {d.name: d for d in sc.deployments}
    goodput = sum((s.demand_rps - s.unmet_rps) * deps[s.deployment].shape.mean_out for s in plan.serving)
    weighted = sum(deps[s.deployment].priority * s.unmet_rps for s in plan.serving)
    return ColumnResult(
        column=column,
        cost_per_hour=plan.cost_per_hour,
        served_fraction=plan.served_fraction,
        goodput_tok_s=goodput,
        weighted_unmet_rps=weighted,
        status=plan.status,
        gap=plan.gap,
        unmet_rps={s.deployment: s.unmet_rps for s in plan.serving if s.unmet_rps > SERVE_TOL},
        churn_cost=plan.churn_cost,
    )


def not_worse(a: ColumnResult, b: ColumnResult, weighted_demand: float) -> bool:
    """Whether plan a is at least as good as plan b: serves as much (priority-weighted), and where both
    serve the same, costs no more, churn penalty included (tolerances: ``SERVE_TOL``, ``COST_TOL``)."""
    tol = SERVE_TOL * max(1.0, weighted_demand)
    if a.weighted_unmet_rps < b.weighted_unmet_rps - tol:
        return True
    if a.weighted_unmet_rps > b.weighted_unmet_rps + tol:
        return False
    return a.objective <= b.objective * (1 + COST_TOL) + 1e-9


@attrs.frozen
class Cell:
    """One (demand scale, availability setting) of the sweep and its columns' results."""

    scale: float
    availability: str
    demand_rps: float
    weighted_demand_rps: float
    results: tuple[ColumnResult, ...]

    def result(self, column: str) -> ColumnResult:
        return next(r for r in self.results if r.column == column)

    @property
    def worse_than(self) -> tuple[str, ...]:
        """The columns whose plan beats Coral's (empty when Coral is never worse)."""
        coral = self.result("coral")
        return tuple(
            r.column for r in self.results if r.column != "coral" and not not_worse(coral, r, self.weighted_demand_rps)
        )

    @property
    def best_baseline(self) -> ColumnResult:
        """The best of the baselines (``BASELINES``), in the program's order (ties: the first)."""
        best = self.result(BASELINES[0])
        for name in BASELINES[1:]:
            r = self.result(name)
            if not not_worse(best, r, self.weighted_demand_rps):
                best = r
        return best

    @property
    def saving(self) -> float | None:
        """1 - Coral's cost / the best baseline's, where both serve the same demand; else None."""
        return self.saving_of("coral")

    def saving_of(self, column: str) -> float | None:
        """1 - a column's cost / the best baseline's, where both serve the same demand; else None."""
        r, base = self.result(column), self.best_baseline
        tol = SERVE_TOL * max(1.0, self.weighted_demand_rps)
        if abs(r.weighted_unmet_rps - base.weighted_unmet_rps) > tol or base.cost_per_hour <= 0:
            return None
        return 1.0 - r.cost_per_hour / base.cost_per_hour

    @property
    def goodput_gain(self) -> float | None:
        """Coral's goodput / the best baseline's - 1 (None when the baseline serves nothing)."""
        base = self.best_baseline.goodput_tok_s
        return self.result("coral").goodput_tok_s / base - 1.0 if base > 0 else None

    def to_json(self) -> dict[str, object]:
        return {
            "scale": self.scale,
            "availability": self.availability,
            "demand_rps": self.demand_rps,
            "columns": {r.column: attrs.asdict(r) for r in self.results},
            "best_baseline": self.best_baseline.column,
            "saving_vs_best_baseline": self.saving,
            "savings_vs_best_baseline": {c: self.saving_of(c) for c in COLUMNS if c not in BASELINES},
            "goodput_gain_vs_best_baseline": self.goodput_gain,
            "coral_worse_than": list(self.worse_than),
        }


def sweep_cell(
    planners: Mapping[str, Callable[..., Plan]],
    sc: Scenario,
    req: PlanRequest,
    scale: float,
    setting: str,
    *,
    on_column: Callable[[str], None] | None = None,
) -> Cell:
    """Solve one cell with every column's planner (``COLUMNS`` order; ``on_column`` after each). Coral's
    planner gets the other columns' plans as ``starts`` (plans over subsets of its templates that it
    must not lose to), so that its plan is never worse than theirs, whatever the deadline or the load."""
    results = []
    plans: list[Plan] = []
    for column in COLUMNS:
        plan = planners[column](req, starts=tuple(plans)) if column == "coral" else planners[column](req)
        plans.append(plan)
        results.append(column_result(column, plan, sc))
        if on_column is not None:
            on_column(column)
    prio = {d.name: d.priority for d in sc.deployments}
    return Cell(
        scale=scale,
        availability=setting,
        demand_rps=float(sum(req.demand.values())),
        weighted_demand_rps=float(sum(prio[k] * v for k, v in req.demand.items())),
        results=tuple(results),
    )
