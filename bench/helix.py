"""`just bench helix`: Coral against the Helix baseline in single-model mode on fixed clusters.

For each (model, cluster): Helix as it was ("before": one placement MILP over every node of the cluster,
each stage its own micro-batch, every node charged for the cluster's full depth; ``helix_place``) and as
its paper describes it ("after": the best data-parallel split of the cluster into groups, each placed by
the MILP at its own depth and batch size, nodes may idle; ``helix_plan``). Coral builds
templates for the sub-multisets of the cluster (the fast exact placer, lossless pruning), then runs the
allocation program with the cluster as its availability: once with unbounded demand (its most throughput
from these nodes) and once with Helix's throughput as demand (its cost for the same service). Prices are
us-east-1 on-demand; utilisation 1 for both, so capacities compare directly.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from coral.catalog import load_catalog
from coral.perf import PerfModel
from coral.workload import Slo, WorkloadShape
from solvers.allocation import AllocationProblem, AllocTemplate, solve_allocation
from solvers.combos import best_split, best_sub, prune_verdict
from solvers.fastplace import place
from solvers.helix import all_sub_multisets, helix_place, helix_plan
from solvers.options import build_problem

CASES = [
    ("qwen3-14b", ("g6e.xlarge", "g6e.xlarge", "g6.xlarge", "g5.xlarge")),
    ("qwen3-32b", ("g6e.xlarge", "g6e.xlarge", "g6.12xlarge", "p5.4xlarge")),
    ("llama-3.3-70b", ("g6e.12xlarge", "g6e.12xlarge", "g6.12xlarge", "p4d.24xlarge")),
    ("mixtral-8x7b", ("g6e.xlarge", "g6e.12xlarge", "g5.12xlarge", "g6.xlarge")),
]
SLO = Slo(ttft_s=2.0, tpot_s=0.1)
SHAPE = WorkloadShape(1155, 211)
REGION = "aws-us-east-1"


def coral(perf: PerfModel, model: str, cluster: tuple[str, ...], prices: dict[str, float], demand: float):  # type: ignore[no-untyped-def]
    types = sorted(set(cluster))
    partition: dict[tuple[str, ...], float] = {}
    cols = []
    for ms in all_sub_multisets(cluster):
        r = place(build_problem(perf, model, ms, "aggregated", SLO, SHAPE), time_limit=60.0)
        cap = r.value if r.status in ("optimal", "feasible") else 0.0
        split, sub = best_split(ms, partition), best_sub(ms, partition)
        partition[ms] = max(cap, split)
        if cap > 0 and prune_verdict(cap, sub, split) is None:
            counts = [ms.count(t) for t in types]
            cols.append(AllocTemplate(0, "aggregated", counts, 2 * cap, 2 * cap, 0.0, "+".join(ms)))
    prob = AllocationProblem(
        models=[model], demand_rps=[demand], mean_in=[1.0], mean_out=[1.0], kv_bytes_per_token=[0.0],
        node_types=types, nic_bytes_s=[1e9] * len(types), regions=[REGION],
        price=[[prices[t] for t in types]], avail=[[cluster.count(t) for t in types]], templates=cols,
        churn_factor=0.0, utilisation=1.0,
    )  # fmt: skip
    res = solve_allocation(prob, deadline_s=30.0, mip_gap=0.0)
    return float(res.served_rps.sum()), res.cost_per_hour, res.status


def main() -> int:
    cat = load_catalog()
    perf = PerfModel(cat)
    prices = {n: o.price for n, o in cat.regions[REGION].offers.items()}
    limit = float(sys.argv[1]) if len(sys.argv) > 1 else 120.0
    print(f"{'model':<15} {'cluster':<52} {'$/h':>6} | {'before req/s':>12} {'after req/s':>11} {'after groups':<40} "
          f"| {'coral max':>9} {'$/h':>7} | {'coral@before $/h':>16} {'coral@after $/h':>15}")  # fmt: skip
    rows = []
    for model, cluster in CASES:
        t0 = time.perf_counter()
        h = helix_place(perf, model, cluster, SLO, SHAPE, time_limit=limit)
        after = helix_plan(perf, model, cluster, SLO, SHAPE, time_limit=limit)
        h_cost = sum(prices[n] for n in cluster)
        before = h.value if h.status in ("optimal", "feasible") else 0.0
        c_thr, c_cost_max, _ = coral(perf, model, cluster, prices, 1e6)
        _, c_before, _ = coral(perf, model, cluster, prices, before) if before > 0 else (0.0, 0.0, "")
        _, c_after, _ = coral(perf, model, cluster, prices, after.value) if after.value > 0 else (0.0, 0.0, "")
        groups = " | ".join("+".join(g) for g, _t in after.groups) + (f" (idle {'+'.join(after.idle)})" if after.idle
                                                                       else "")  # fmt: skip
        rows.append(
            (
                c_thr / before if before else np.inf,
                c_thr / after.value if after.value else np.inf,
                1 - c_before / h_cost if before else np.nan,
                1 - c_after / h_cost if after.value else np.nan,
            )
        )
        print(f"{model:<15} {' + '.join(cluster):<52} {h_cost:>6.2f} | {before:>12.2f} {after.value:>11.2f} "
              f"{groups:<40} | {c_thr:>9.2f} {c_cost_max:>7.2f} | {c_before:>16.2f} {c_after:>15.2f}   "
              f"(before {h.status} gap {h.gap:.1%}; after {after.status} gap {after.gap:.1%}, {after.milps} MILPs; "
              f"{time.perf_counter() - t0:.0f} s)")  # fmt: skip
    r = np.array(rows)
    print(f"Coral's most req/s / Helix's: {np.mean(r[:, 0]):.2f}x before, {np.mean(r[:, 1]):.2f}x after (mean)")
    print(f"Coral's cost at Helix's req/s, below Helix's cluster: {np.nanmean(r[:, 2]):.1%} before, "
          f"{np.nanmean(r[:, 3]):.1%} after (mean)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
