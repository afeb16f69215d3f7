"""`just bench placement`: the fast exact placer against the reference MILP on realistic problems.

Problems come from the bundled catalog and perf model (``solvers.options.build_problem``): a random
model (L = 32..94 layers), a random multiset of n node types, a random mode, SLO and request shape,
drawn from a seeded generator, so menus hold 50-700 options per node. Per n it prints the p50 and p99
solve time of both placers, which step settled each fast solve, how many each proved optimal (or
infeasible), and whether the two agree wherever both proved their answer.
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np

from coral.catalog import load_catalog
from coral.perf import PerfModel
from coral.workload import Slo, WorkloadShape
from solvers.fastplace import place
from solvers.options import build_problem
from solvers.placement import milp_place
from solvers.problem import PlacementProblem

MODELS = ("qwen3-14b", "qwen3-32b", "gemma-3-27b", "llama-3.3-70b", "mixtral-8x7b", "qwen3-235b-a22b")
NODES = (
    "g6e.xlarge",
    "g6e.12xlarge",
    "g6e.24xlarge",
    "g6.xlarge",
    "g6.12xlarge",
    "g5.xlarge",
    "g5.12xlarge",
    "p4d.24xlarge",
    "p5.4xlarge",
    "a2-highgpu-4g",
    "gpu_1x_h100_sxm5",
)


def realistic(rng: np.random.Generator, perf: PerfModel, n: int) -> tuple[PlacementProblem, str]:
    """One random problem with n nodes, and a one-line description of it."""
    model = str(rng.choice(MODELS))
    nodes = [str(x) for x in rng.choice(NODES, size=n)]
    mode = str(rng.choice(["aggregated", "decode", "prefill"]))
    slo = Slo(ttft_s=float(rng.choice([0.5, 1.0, 2.0, 4.0])), tpot_s=float(rng.choice([0.03, 0.05, 0.08, 0.12])))
    shape = WorkloadShape(float(rng.choice([256, 1000, 2000])), float(rng.choice([128, 300, 600])))
    problem = build_problem(perf, model, nodes, mode, slo, shape)
    return problem, f"{model} {mode} {'+'.join(sorted(nodes))}"


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--per-n", type=int, default=8, help="problems per node count")
    ap.add_argument("--nmax", type=int, default=6, help="largest node count")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds per solve (HiGHS may overrun)")
    ap.add_argument("--no-milp", action="store_true", help="run the fast placer only")
    ap.add_argument("--verbose", action="store_true", help="one line per problem")
    args = ap.parse_args()
    perf = PerfModel(load_catalog())
    rng = np.random.default_rng(args.seed)
    print(f"seed {args.seed}, {args.per_n} problems per n, time limit {args.time_limit:g} s")
    header = (
        f"{'n':>2} {'infeas':>6} {'fast p50':>9} {'fast p99':>9} {'fast proven':>11} "
        f"{'milp p50':>9} {'milp p99':>9} {'milp proven':>11} {'agree':>6}  fast methods"
    )
    print(header)
    for n in range(1, args.nmax + 1):
        tf: list[float] = []
        tm: list[float] = []
        methods: collections.Counter[str] = collections.Counter()
        fast_proven = milp_proven = infeasible = agree = both = 0
        for _ in range(args.per_n):
            problem, desc = realistic(rng, perf, n)
            sizes = [m.size for m in problem.menus]
            t0 = time.perf_counter()
            fast = place(problem, time_limit=args.time_limit)
            tf.append(time.perf_counter() - t0)
            methods[fast.method] += 1
            fast_proven += fast.proven
            infeasible += fast.status == "infeasible"
            line = f"  L={problem.num_layers} opts={sizes} {desc}: fast {fast.status}/{fast.method} {fast.value:.6g}"
            line += f" {tf[-1]:.3f}s"
            if not args.no_milp:
                t0 = time.perf_counter()
                ref = milp_place(problem, time_limit=args.time_limit)
                tm.append(time.perf_counter() - t0)
                milp_proven += ref.proven
                if ref.proven and fast.proven:
                    both += 1
                    same = ref.status == fast.status and abs(ref.value - fast.value) <= 1e-6 * max(1.0, ref.value)
                    agree += same
                    if not same:
                        line += "  DISAGREE"
                line += f" | milp {ref.status} {ref.value:.6g} {tm[-1]:.3f}s"
            if args.verbose:
                print(line, flush=True)
        mline = " ".join(f"{k}:{v}" for k, v in sorted(methods.items()))
        milp_cols = (
            f"{_pct(tm, 50):9.3f} {_pct(tm, 99):9.3f} {milp_proven:>5}/{args.per_n:<5}"
            if tm
            else f"{'-':>9} {'-':>9} {'-':>11}"
        )
        print(
            f"{n:>2} {infeasible:>6} {_pct(tf, 50):9.3f} {_pct(tf, 99):9.3f} {fast_proven:>5}/{args.per_n:<5} "
            f"{milp_cols} {f'{agree}/{both}' if tm else '-':>6}  {mline}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
