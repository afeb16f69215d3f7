"""Allocation benchmark: solve time and gap of the online allocation program under its deadline.

For each configuration (``core-50``, ``core-400``, ``ext-50``, ``ext-400``: study size and templates per
model) it builds a seeded synthetic instance (``tests/solvers/alloc_instances.py``), solves it cold,
then re-solves it ``--resolves`` times in an online loop: each step perturbs every model's demand
(seeded lognormal, sigma 0.1 around the base demand) and passes the previous plan as the current
deployment. The deadline is 1 s for ``core`` and 10 s for ``extended`` (``--deadline`` overrides).
Reported per configuration: p50 / p99 of the re-solves' wall time and gap (to the best LP/MIP bound),
the share of re-solves that proved the gap, the statuses, and the mean churn. ``--columns``
(auto, all, generated) is solve_allocation's ``columns``: auto generates columns at the extended
size.

Run ``python bench/alloc_bench.py [--configs core-50,ext-400] [--resolves 20] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from solvers.allocation import AllocationProblem, AllocationResult, solve_allocation
from tests.solvers.alloc_instances import generate, perturbed

CONFIGS = {
    "core-50": ("core", 50, 1.0),
    "core-400": ("core", 400, 1.0),
    "ext-50": ("extended", 50, 10.0),
    "ext-400": ("extended", 400, 10.0),
}


def _with_current(p: AllocationProblem, res: AllocationResult) -> dict[tuple[str, int], int]:
    return {(p.templates[i].key, r): n for (i, r), n in res.counts.items()}


def run_config(name: str, args: argparse.Namespace) -> dict[str, Any]:
    size, tpm, deadline = CONFIGS[name]
    deadline = args.deadline or deadline
    base = generate(size, tpm, seed=args.seed, load=args.load, scarcity=args.scarcity)
    cold = solve_allocation(base, deadline_s=deadline, mip_gap=args.mip_gap, columns=args.columns)
    prev = cold
    rows: list[dict[str, Any]] = []
    for k in range(args.resolves):
        step = perturbed(base, seed=1000 * args.seed + k)
        step = attrs.evolve(step, current=_with_current(base, prev))
        t0 = time.perf_counter()
        res = solve_allocation(step, deadline_s=deadline, mip_gap=args.mip_gap, columns=args.columns)
        wall = time.perf_counter() - t0
        rows.append(
            {
                "wall_s": wall,
                "gap": res.gap,
                "status": res.status,
                "objective": res.objective,
                "churn": res.churn_cost,
                "unmet": res.total_unmet_rps,
                "lp_s": res.phase_s["lp"],
                "heuristic_s": res.phase_s["heuristic"],
            }
        )
        prev = res
    walls = np.array([r["wall_s"] for r in rows])
    gaps = np.array([r["gap"] for r in rows])
    return {
        "config": name,
        "deadline_s": deadline,
        "columns": cold.num_columns,
        "rows": cold.num_rows,
        "templates": len(base.templates),
        "merged": cold.merged_templates,
        "cold": {"wall_s": cold.solve_s, "gap": cold.gap, "status": cold.status, "objective": cold.objective},
        "resolves": len(rows),
        "wall_p50": float(np.percentile(walls, 50)),
        "wall_p99": float(np.percentile(walls, 99)),
        "gap_p50": float(np.percentile(gaps, 50)),
        "gap_p99": float(np.percentile(gaps, 99)),
        "proven_share": float(np.mean([r["status"] == "optimal" for r in rows])),
        "gap_below_1pct": float(np.mean(gaps <= 0.01)),
        "statuses": dict(Counter(r["status"] for r in rows)),
        "churn_mean": float(np.mean([r["churn"] for r in rows])),
        "objective_mean": float(np.mean([r["objective"] for r in rows])),
        "unmet_max": float(max(r["unmet"] for r in rows)),
        "lp_s_p50": float(np.percentile([r["lp_s"] for r in rows], 50)),
        "heuristic_s_p50": float(np.percentile([r["heuristic_s"] for r in rows], 50)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="core-50,core-400,ext-50,ext-400")
    ap.add_argument("--resolves", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--load", type=float, default=0.35, help="demand as a share of the fleet (generator)")
    ap.add_argument("--scarcity", type=float, default=1.0, help="availability divisor (generator)")
    ap.add_argument("--deadline", type=float, default=None, help="override the per-size deadline (s)")
    ap.add_argument("--mip-gap", type=float, default=1e-4)
    ap.add_argument("--columns", choices=("auto", "all", "generated"), default="auto")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = [run_config(name, args) for name in args.configs.split(",")]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    head = f"{'config':10} {'cols':>6} {'rows':>5} {'wall p50':>9} {'wall p99':>9}"
    print(head + f" {'gap p50':>8} {'gap p99':>8} {'<=1%':>5}  statuses (cold: status, gap)")
    for r in results:
        print(
            f"{r['config']:10} {r['columns']:6d} {r['rows']:5d} {r['wall_p50']:9.3f} {r['wall_p99']:9.3f} "
            f"{r['gap_p50']:8.2%} {r['gap_p99']:8.2%} {r['gap_below_1pct']:5.0%}  {r['statuses']} "
            f"(cold: {r['cold']['status']}, {r['cold']['gap']:.2%})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
