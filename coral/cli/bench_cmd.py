"""``coral bench``: Coral against the baselines on the same scenarios, prices, availability and demand.

For each scenario and policy: one plan at t = 0, then ``--resolves`` re-solves with the demand of every
deployment perturbed (seeded, log-normal, sigma 0.2), each warm-started from the previous plan, which
gives the solve-time percentiles and the gap distribution.

``helix`` places one Helix MILP over each cluster of Coral's plan (see ``solvers.planning``): its cost is
Coral's by construction, so it is compared with Coral on capacity and service, and it is not a candidate
for the "best baseline" that the ratios refer to (the cost-minimising baselines ``homo`` and ``pd-homo``).
Its solve times are those of its placement MILPs. Its re-solves do not warm-start Coral's plan inside it
(a helix plan's instances are not Coral templates), so its clusters come from Coral plans solved cold.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from coral.cli.common import catalog_from, perf_from, print_json
from coral.errors import CoralError
from coral.plan import PlanRequest
from coral.scenario import load_scenario
from coral.store import TemplateStore, default_store_path

POLICIES = ("coral", "homo", "pd-homo", "helix")
FIXED_CLUSTER = ("helix",)
"""Policies given Coral's nodes rather than choosing their own: never the best baseline."""


def add(sub: Any, parent: argparse.ArgumentParser) -> None:
    p = sub.add_parser("bench", parents=[parent], help="compare Coral with the baselines on scenarios")
    p.add_argument(
        "--scenarios", default=None,
        help="comma-separated scenario names or files (default: core,extended,scarce; with --sweep: core)",
    )  # fmt: skip
    p.add_argument("--resolves", type=int, default=20, help="re-solves with perturbed demand per policy")
    p.add_argument(
        "--policies", default=",".join(POLICIES),
        help=f"comma-separated policies to run (default: {','.join(POLICIES)}; coral is always run)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed of the demand perturbations (default: 0)")
    p.add_argument("--deadline", type=float, default=None, help="solver deadline in seconds (default: scenario's)")
    p.add_argument(
        "--helix-limit", type=float, default=None,
        help="helix: time limit in seconds of each cluster's placement MILP (default: the deadline)",
    )  # fmt: skip
    p.add_argument("--store", type=Path, default=None, help="template store (default: the user data dir)")
    p.add_argument("--no-build", action="store_true", help="fail instead of building missing templates")
    p.add_argument("--json", action="store_true", help="print one row per scenario and policy as JSON")
    g = p.add_argument_group("savings study (--sweep)")
    g.add_argument(
        "--sweep", action="store_true",
        help="the savings study on one scenario: demand scales x availability settings, Coral against homo, "
        "pd-homo, homogeneous with prefill/decode, all aggregated (see README: When does Coral save money)",
    )  # fmt: skip
    g.add_argument("--scales", default=None, help="--sweep: comma-separated demand scales (default: 0.25,...,50)")
    g.add_argument(
        "--availability", default=None,
        help="--sweep: comma-separated settings of catalog, scarce, cap4, quota (default: all four)",
    )  # fmt: skip
    g.add_argument("--quick", action="store_true", help="--sweep: a small subset (scales 0.5,5; catalog, quota)")
    g.add_argument("--plot", type=Path, default=None, metavar="FILE.png", help="--sweep: write a heatmap PNG")
    p.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from actors.solver_process import SolverProcess
    from coral.cli.plan_cmd import ensure_templates
    from coral.cli.planning import make_planner, request_at

    if args.sweep:
        from coral.cli.sweep_cmd import run_sweep

        return run_sweep(args)
    for flag in ("scales", "availability", "plot"):
        if getattr(args, flag) is not None:
            raise CoralError(f"--{flag} is an option of --sweep")
    if args.quick:
        raise CoralError("--quick is an option of --sweep")
    if args.deadline is not None and not args.deadline > 0:
        raise CoralError(f"--deadline must be positive, got {args.deadline}")
    if args.resolves < 1:
        raise CoralError(f"--resolves must be at least 1, got {args.resolves}")
    chosen = {x.strip() for x in args.policies.split(",") if x.strip()}
    unknown = sorted(chosen - set(POLICIES))
    if unknown:
        raise CoralError(f"--policies: unknown policy {unknown[0]!r}; choose from {', '.join(POLICIES)}")
    policies = [x for x in POLICIES if x in chosen or x == "coral"]
    cat = catalog_from(args)
    perf = perf_from(args, cat)
    rows: list[dict[str, Any]] = []
    path = args.store or default_store_path()
    with TemplateStore(path) as store, SolverProcess() as proc:
        for name in [s.strip() for s in (args.scenarios or "core,extended,scarce").split(",") if s.strip()]:
            sc = load_scenario(name, cat)
            if not args.no_build:
                ensure_templates(sc, cat, perf, store, args, quiet=args.json)
            base = request_at(sc, cat, 0.0, trigger="bench")
            for policy in policies:
                plan_fn, _ = make_planner(
                    policy, sc, cat, perf, store, deadline_s=args.deadline, helix_limit_s=args.helix_limit,
                    solve=proc.solve, bounded=proc.call,
                )  # fmt: skip
                first = plan_fn(base)
                rng = np.random.default_rng(args.seed)
                times, gaps = [first.solve_s], [first.gap]
                prev = first
                for _ in range(args.resolves):
                    demand = {k: v * float(rng.lognormal(0.0, 0.2)) for k, v in base.demand.items()}
                    req = PlanRequest(0.0, demand, base.prices, base.availability, prev.counts(), "bench")
                    prev = plan_fn(req)
                    times.append(prev.solve_s)
                    gaps.append(prev.gap)
                rows.append({
                    "scenario": sc.name,
                    "policy": policy,
                    "cost_per_hour": first.cost_per_hour,
                    "served_fraction": first.served_fraction,
                    "unmet_rps": first.unmet_rps,
                    "capacity_rps": sum(d.capacity_rps for d in first.serving),
                    "status": first.status,
                    "gap": first.gap,
                    "solve_p50_s": float(np.percentile(times, 50)),
                    "solve_p99_s": float(np.percentile(times, 99)),
                    "gap_p50": float(np.percentile(gaps, 50)),
                    "gap_max": float(np.max(gaps)),
                    "resolves": len(times),
                })  # fmt: skip
    for r in rows:
        base_rows = [b for b in rows if b["scenario"] == r["scenario"] and b["policy"] not in ("coral", *FIXED_CLUSTER)]
        best_cost = min((b["cost_per_hour"] for b in base_rows if b["served_fraction"] >= 1 - 1e-6), default=None)
        best_served = max((b["served_fraction"] for b in base_rows), default=0.0)
        r["cost_ratio_vs_best_baseline"] = (
            best_cost / r["cost_per_hour"] if best_cost and r["cost_per_hour"] > 0 else None
        )
        r["served_ratio_vs_best_baseline"] = r["served_fraction"] / best_served if best_served > 0 else None
    if args.json:
        print_json(rows)
        return 0
    t = Table(title="Coral vs baselines (ratios: best baseline / policy for cost, policy / best baseline for served)")
    for c in ("scenario", "policy", "$/h", "cost ratio", "capacity req/s", "served", "served ratio", "status",
              "p50 s", "p99 s", "gap max"):  # fmt: skip
        t.add_column(c, justify="left" if c in ("scenario", "policy", "status") else "right")
    for r in rows:
        cr = r["cost_ratio_vs_best_baseline"]
        sr = r["served_ratio_vs_best_baseline"]
        t.add_row(r["scenario"], r["policy"], f"{r['cost_per_hour']:,.2f}", f"{cr:.2f}x" if cr else "-",
                  f"{r['capacity_rps']:,.2f}", f"{r['served_fraction']:.1%}", f"{sr:.2f}x" if sr else "-", r["status"],
                  f"{r['solve_p50_s']:.3f}", f"{r['solve_p99_s']:.3f}", f"{r['gap_max']:.2%}")  # fmt: skip
    Console().print(t)
    return 0
