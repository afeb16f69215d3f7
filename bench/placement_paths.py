"""`just bench placement-paths`: the production placer on real multisets, by size and solve path.

Problems are built the way a template build builds them (``solvers.options.build_problem``): for each
deployment of a scenario (default ``core``: its model, SLO and request shape, aggregated mode), a seeded
sample of the node multisets that ``solvers.combos.enumerate_multisets`` lists at each size n (the
scenario's node types, rho = 12). Per n it prints the p50 and p99 time per multiset, how many were
proven optimal (or infeasible), the gap of the rest, and which path settled each one: "reduce",
"shapes", "dp-proven", "lp-proven" or "milp". ``--compare`` also runs the placer with the shape search
switched off (``shape_budget=0``: chain DP, LP proof, LP fixing, then the MILP), which is how ``place``
worked before the shape search, and checks that both agree wherever both are proven.
"""

from __future__ import annotations

import argparse
import collections
import random
import time

import numpy as np

from coral.catalog import load_catalog
from coral.perf import PerfModel
from coral.scenario import load_scenario
from solvers.combos import enumerate_multisets
from solvers.fastplace import SHAPE_BUDGET, place
from solvers.options import build_problem
from solvers.problem import PlacementResult


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def _line(label: str, n: int, rows: list[PlacementResult], secs: list[float]) -> str:
    methods = collections.Counter(r.method for r in rows)
    proven = sum(r.proven for r in rows)
    gaps = [r.gap for r in rows if not r.proven]
    gap = f"gap p50 {_pct(gaps, 50):.2%} max {max(gaps):.2%}" if gaps else "-"
    paths = " ".join(f"{k}:{v}" for k, v in sorted(methods.items()))
    return (
        f"{label:>8} n={n} {len(rows):>4} solved  p50 {_pct(secs, 50):7.3f} s  p99 {_pct(secs, 99):7.3f} s"
        f"  mean {np.mean(secs):7.3f} s  proven {proven}/{len(rows)}  unproven {gap}  paths {paths}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="core")
    ap.add_argument("--sizes", default="4,5,6", help="comma-separated node counts")
    ap.add_argument("--per-model", type=int, default=5, help="multisets sampled per model and size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape-budget", type=int, default=SHAPE_BUDGET)
    ap.add_argument("--time-limit", type=float, default=10.0, help="MILP seconds (residue only)")
    ap.add_argument("--compare", action="store_true", help="also run place without the shape search")
    ap.add_argument("--verbose", action="store_true", help="one line per multiset")
    args = ap.parse_args()
    cat = load_catalog()
    perf = PerfModel(cat)
    sc = load_scenario(args.scenario, cat)
    sizes = [int(x) for x in args.sizes.split(",")]
    rng = random.Random(args.seed)
    print(
        f"scenario {args.scenario}: {len(sc.deployments)} models, {len(sc.node_types)} node types; "
        f"{args.per_model} multisets per model and size; seed {args.seed}; shape budget {args.shape_budget}; "
        f"MILP limit {args.time_limit:g} s"
    )
    levels = {
        d.model: enumerate_multisets(perf, d.model, list(sc.node_types), d.shape, nmax=max(sizes), rho=12.0)
        for d in sc.deployments
    }
    for n in sizes:
        new: list[PlacementResult] = []
        old: list[PlacementResult] = []
        tn: list[float] = []
        to: list[float] = []
        disagree = 0
        for d in sc.deployments:
            pool = levels[d.model][n]
            for nodes in rng.sample(pool, min(args.per_model, len(pool))):
                problem = build_problem(perf, d.model, nodes, "aggregated", d.slo, d.shape)
                t0 = time.perf_counter()
                res = place(problem, time_limit=args.time_limit, shape_budget=args.shape_budget)
                tn.append(time.perf_counter() - t0)
                new.append(res)
                line = f"  {d.model} {'+'.join(nodes)}: {res.status}/{res.method} {res.value:.6g} {tn[-1]:.3f}s"
                if args.compare:
                    t0 = time.perf_counter()
                    ref = place(problem, time_limit=args.time_limit, shape_budget=0)
                    to.append(time.perf_counter() - t0)
                    old.append(ref)
                    line += f" | without shapes {ref.status}/{ref.method} {ref.value:.6g} {to[-1]:.3f}s"
                    if ref.proven and res.proven and abs(ref.value - res.value) > 1e-6 * max(1.0, ref.value):
                        disagree += 1
                        line += "  DISAGREE"
                if args.verbose:
                    print(line, flush=True)
        print(_line("place", n, new, tn), flush=True)
        if args.compare:
            better = sum(a.value > b.value * (1 + 1e-9) for a, b in zip(new, old, strict=True))
            print(_line("no-shape", n, old, to), flush=True)
            print(f"{'':>8} n={n} shapes found a better placement in {better}/{len(new)}; disagreements {disagree}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
