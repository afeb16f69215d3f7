"""``coral plan``: solve the online allocation for a scenario at one moment and print the plan."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from coral.catalog.types import Catalog
from coral.cli.common import catalog_files, catalog_from, open_store, perf_from, print_json
from coral.display import gap_text
from coral.errors import CoralError
from coral.perf import PerfModel
from coral.plan import Plan
from coral.scenario import Scenario, load_scenario
from coral.store import TemplateStore

PLAN_POLICIES = ("coral", "homo", "pd-homo", "helix")
"""``solvers.planning.PLAN_POLICIES``, repeated so that the parser does not import the solvers."""


def add(sub: Any, parent: argparse.ArgumentParser) -> None:
    p = sub.add_parser("plan", parents=[parent], help="plan instances per region for a scenario")
    p.add_argument("--scenario", default="default", help="scenario NAME (bundled) or FILE (default: default)")
    p.add_argument(
        "--policy", default="coral", choices=PLAN_POLICIES,
        help="coral, a baseline (homo, pd-homo), or helix: one Helix placement over Coral's nodes per cluster",
    )  # fmt: skip
    p.add_argument("--at", type=float, default=0.0, help="scenario time in seconds (demand and market then)")
    p.add_argument("--deadline", type=float, default=None, help="solver deadline in seconds (default: scenario)")
    p.add_argument(
        "--helix-limit", type=float, default=None,
        help="helix: time limit in seconds of each cluster's placement MILP (default: the deadline)",
    )  # fmt: skip
    p.add_argument("--store", type=Path, default=None, help="template store (default: the user data dir)")
    p.add_argument("--no-build", action="store_true", help="fail instead of building missing templates")
    p.add_argument(
        "--vllm-only", action="store_true", help="use only templates that vLLM can run as they are (see templates show)"
    )
    p.add_argument("--json", action="store_true", help="print the plan and its templates as JSON")
    p.set_defaults(func=run_plan)


def ensure_templates(
    sc: Scenario, cat: Catalog, perf: PerfModel, store: TemplateStore, args: argparse.Namespace, *, quiet: bool
) -> None:
    """Build the scenario's template library where the store lacks it, with a progress bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from coral.cli.build import build_library, default_workers
    from coral.cli.jobs import scenario_jobs

    jobs = scenario_jobs(sc)
    with Progress(TextColumn("[bold]templates for " + sc.name), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), disable=quiet) as bar:  # fmt: skip
        task = bar.add_task("build", total=None)
        build_library(
            perf, store, jobs, list(sc.node_types), nmax=sc.planner.nmax, rho=sc.planner.rho,
            workers=default_workers(), catalog_files=catalog_files(args), profile_files=args.profiles,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )  # fmt: skip


def run_plan(args: argparse.Namespace) -> int:
    from actors.solver_process import SolverProcess
    from coral.cli.planning import deployment_templates, make_planner, request_at
    from solvers.reasons import unmet_reasons

    cat = catalog_from(args)
    perf = perf_from(args, cat)
    sc = load_scenario(args.scenario, cat)
    if not 0 <= args.at <= sc.duration_s:
        raise CoralError(f"--at must be within the scenario, 0..{sc.duration_s:g} s, got {args.at:g}")
    if args.deadline is not None and not args.deadline > 0:
        raise CoralError(f"--deadline must be positive, got {args.deadline}")
    with open_store(args, readonly=args.no_build, scenario=args.scenario) as store, SolverProcess() as proc:
        if not args.no_build:
            ensure_templates(sc, cat, perf, store, args, quiet=args.json)
        plan_fn, templates = make_planner(
            args.policy,
            sc,
            cat,
            perf,
            store,
            deadline_s=args.deadline,
            vllm_only=args.vllm_only,
            helix_limit_s=args.helix_limit,
            solve=proc.solve,
            bounded=proc.call,
        )
        req = request_at(sc, cat, args.at)
        plan = plan_fn(req)
        tpls = deployment_templates(
            store, sc, args.policy, exclude_vllm_incompatible=args.vllm_only, perf_version=perf.version
        )
    reasons = unmet_reasons(plan, req, tpls, sc, args.policy)
    if args.json:
        out = plan.to_json()
        out["unmet_reasons"] = reasons
        out["templates"] = {i.template_id: templates[i.template_id].to_json() for i in plan.instances
                            if i.template_id in templates}  # a helix cluster with no placement has none  # fmt: skip
        print_json(out)
        return 0
    print_plan(plan, Console(), reasons)
    return 0


def print_plan(plan: Plan, con: Console, reasons: Mapping[str, Sequence[str]] | None = None) -> None:
    """The plan as two tables: instances per region, and capacity vs demand per deployment."""
    title = f"plan #{plan.seq} ({plan.policy}) at t={plan.at:g} s: ${plan.cost_per_hour:,.2f}/h"
    t = Table(caption="$/h and req/s per instance", title=title)
    for c in ("region", "deployment", "mode", "n", "nodes per instance", "$/h", "req/s", "template"):
        t.add_column(c, justify="right" if c in ("n", "$/h", "req/s") else "left", no_wrap=c != "nodes per instance")
    for i in sorted(plan.instances, key=lambda i: (i.region, i.deployment, i.mode)):
        nodes = " + ".join(f"{i.nodes.count(n)}x{n}" for n in sorted(set(i.nodes)))
        t.add_row(i.region, i.deployment, i.mode[:4], str(i.count), nodes, f"{i.cost_per_hour:,.2f}",
                  f"{i.capacity_rps:,.2f}", i.template_id[:8])  # fmt: skip
    con.print(t)
    s = Table(title="capacity vs demand")
    for c in ("deployment", "model", "demand req/s", "capacity req/s", "unmet req/s"):
        s.add_column(c, justify="left" if c in ("deployment", "model") else "right")
    for d in plan.serving:
        s.add_row(d.deployment, d.model, f"{d.demand_rps:,.2f}", f"{d.capacity_rps:,.2f}",
                  f"[red]{d.unmet_rps:,.3f}[/]" if d.unmet_rps > 1e-6 else "0")  # fmt: skip
    con.print(s)
    for dep, why in (reasons or {}).items():
        con.print(f"unmet {dep}: " + "; ".join(why), markup=False, highlight=False)
    con.print(f"solve {plan.solve_s * 1e3:.0f} ms, status {plan.status}, gap {gap_text(plan.gap)}; "
              f"churn ${plan.churn_cost:,.2f}/h; served {plan.served_fraction:.1%} of demand")  # fmt: skip
