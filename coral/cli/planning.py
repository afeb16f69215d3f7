"""Read the templates a scenario's deployments may use from the store, and bind a planner to them."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from coral.catalog.types import Catalog
from coral.errors import CoralError
from coral.perf import PerfModel
from coral.plan import Plan, PlanRequest
from coral.scenario import Scenario
from coral.store import TemplateStore
from coral.templates import Template
from solvers.allocation import AllocationResult, solve_allocation
from solvers.library import distinct, is_current
from solvers.planning import PLAN_POLICIES, POLICIES, Planner, policy_admits, request_at

__all__ = [
    "PLAN_POLICIES",
    "POLICIES",
    "PlanFn",
    "check_coverage",
    "deployment_templates",
    "make_planner",
    "request_at",
]

PlanFn = Callable[[PlanRequest], Plan]


def deployment_templates(
    store: TemplateStore,
    sc: Scenario,
    policy: str,
    *,
    exclude_vllm_incompatible: bool = False,
    perf_version: str | None = None,
) -> dict[str, list[Template]]:
    """Templates usable by each deployment under a policy (matching model, SLO, shape and node types, made
    by the current formulation and, when given, perf model: stale ones from an older build are left out;
    one per multiset, ``solvers.library.distinct``)."""
    if policy not in PLAN_POLICIES:
        raise CoralError(f"unknown policy {policy!r}; choose from {', '.join(PLAN_POLICIES)}")
    allowed = set(sc.node_types)
    out: dict[str, list[Template]] = {}
    for d in sc.deployments:
        tpls = [
            t
            for t in store.query(model=d.model, slo=d.slo)
            if t.shape == d.shape
            and set(t.nodes) <= allowed
            and policy_admits(policy, t)
            and (t.vllm_ok or not exclude_vllm_incompatible)
            and is_current(t, perf_version)
        ]
        out[d.name] = distinct(tpls)
    return out


def check_coverage(
    sc: Scenario, tpls: Mapping[str, Sequence[Template]], policy: str, store_path: str, *, vllm_only: bool = False
) -> None:
    """Every deployment needs templates that can serve it (aggregated, or prefill and decode); otherwise
    name the build command, or the SLO that no node combination meets. Baselines may leave demand unmet
    (``helix`` needs what ``coral`` needs: it takes Coral's plan as its clusters)."""
    for d in sc.deployments:
        modes = {t.mode for t in tpls[d.name]}
        if "aggregated" in modes or {"prefill", "decode"} <= modes:
            continue
        if vllm_only and policy in ("coral", "helix"):
            raise CoralError(
                f"deployment {d.name!r} (model {d.model}) has no templates in {store_path} that vLLM can run as "
                "they are (see `coral templates show ID` for the reason of each); drop --vllm-only to plan with all"
            )
        if policy in ("coral", "helix"):
            raise CoralError(
                f"deployment {d.name!r} (model {d.model}) has no templates in {store_path}; run "
                f"`coral templates build --scenario {sc.path}` (if it has run, no node combination within "
                f"N_max = {sc.planner.nmax} meets its SLO of TTFT {d.slo.ttft_s:g} s / TPOT {d.slo.tpot_s:g} s)"
            )


def make_planner(
    policy: str,
    sc: Scenario,
    cat: Catalog,
    perf: PerfModel,
    store: TemplateStore,
    *,
    deadline_s: float | None = None,
    vllm_only: bool = False,
    helix_limit_s: float | None = None,
    solve: Callable[..., AllocationResult] | None = None,
    bounded: Callable[[Callable[[], Any], float], Any] | None = None,
) -> tuple[PlanFn, dict[str, Template]]:
    """A plan function for ``policy`` and the templates it may use, keyed by id (``vllm_only``: only the
    templates vLLM can run as they are). Under ``helix`` the plans use Helix placements made as they are
    solved: each plan adds those it uses to the returned dict; ``helix_limit_s`` is each placement MILP's time
    limit (default: the deadline). ``solve``: the allocation solve to use (a solver process's; default
    ``solve_allocation`` in this process); ``bounded``: runs Helix's placements under a hard limit (a
    solver process's ``call``)."""
    tpls = deployment_templates(store, sc, policy, exclude_vllm_incompatible=vllm_only, perf_version=perf.version)
    check_coverage(sc, tpls, policy, str(store.path), vllm_only=vllm_only)
    if helix_limit_s is not None and not helix_limit_s > 0:
        raise CoralError(f"--helix-limit must be positive, got {helix_limit_s}")
    planner = Planner(policy, sc, cat, perf, tpls, deadline_s or sc.planner.deadline_s, helix_limit_s=helix_limit_s,
                      solve=solve or solve_allocation, bounded=bounded)  # fmt: skip
    counter = itertools.count(1)
    by_id = {t.id: t for ts in tpls.values() for t in ts}
    # the program's columns depend on the templates and the scenario only, both fixed here: built once
    # (``extended``: 2 s a request), and every request's problem shares their tuple, which spares its
    # validation and the solve's merging (both cached by the tuple: solvers.allocation.problem, columns)
    columns = planner.program_columns()

    def plan_fn(req: PlanRequest) -> Plan:
        if policy == "helix":
            plan, made = planner.helix_plan(req, seq=next(counter), columns=columns)
            by_id.update(made)
            return plan
        return planner(req, seq=next(counter), columns=columns)

    return plan_fn, by_id
