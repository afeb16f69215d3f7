"""`just bench at-deadline`: Coral's plan at each scenario's own deadline, against the proven optimum.

For each scenario (default ``core,scarce``): the allocation problem at t = 0 (``coral plan``'s), its
optimum proven without a deadline (every phase to completion), then ``--runs`` solves at the scenario's
``deadline_s`` through a solver process (``actors.solver_process``, as ``coral plan`` solves), and the same
with a competing CPU-bound process (``python -c "while 1: pass"``) running beside it (``--compete``:
both, only, or none). Reported: p50 / p90 of the wall time of each solve (request to result, in the
owner), of the child's ``solve_s``, and of the gap of the plan's objective to the optimum; the share of
runs within 0.5%; the statuses; whether each run's effort replays to its plan exactly; ``uptime``.

``--deadline S`` solves at S seconds instead of each scenario's own deadline (the speed target: ``core`` at
1 s, p50 <= 0.24 s at gap <= 1%). The first request sends the problem whole to the child, later ones only
what changed (``actors.solver_process``); wall and solve time are reported apart.

Run ``python bench/at_deadline.py [--scenarios core,scarce] [--runs 10] [--deadline S] [--store FILE] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.solver_process import SolverProcess
from coral.catalog import load_catalog
from coral.cli.planning import deployment_templates
from coral.perf import PerfModel
from coral.scenario import load_scenario
from coral.store import TemplateStore, default_store_path
from solvers.allocation import AllocationProblem, SolverEffort, solve_allocation
from solvers.planning import Planner, request_at


def problem(name: str, store: Path) -> tuple[AllocationProblem, float]:
    cat = load_catalog()
    perf = PerfModel(cat)
    sc = load_scenario(name, cat)
    with TemplateStore(store) as st:
        tpls = deployment_templates(st, sc, "coral", perf_version=perf.version)
    prob, _index = Planner("coral", sc, cat, perf, tpls, sc.planner.deadline_s).problem(request_at(sc, cat, 0.0))
    return prob, sc.planner.deadline_s


def runs(proc: SolverProcess, p: AllocationProblem, deadline: float, best: float, n: int) -> dict[str, Any]:
    walls, solves, gaps, statuses, exact = [], [], [], [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        res = proc.solve(p, deadline_s=deadline, columns="all")
        walls.append(time.perf_counter() - t0)
        solves.append(res.solve_s)
        gaps.append((res.objective - best) / best if best > 0 else 0.0)
        statuses.append(res.status)
        again = solve_allocation(p, effort=res.effort, columns="all")
        exact += (again.counts, again.objective, again.bound, again.gap) == (res.counts, res.objective, res.bound,
                                                                              res.gap)  # fmt: skip
    pct = lambda xs, q: float(np.percentile(xs, q))  # noqa: E731
    return {
        "wall_p50": pct(walls, 50), "wall_p90": pct(walls, 90), "solve_p50": pct(solves, 50),
        "solve_p90": pct(solves, 90), "gap_to_opt_p50": pct(gaps, 50), "gap_to_opt_p90": pct(gaps, 90),
        "within_0.5%": float(np.mean(np.array(gaps) <= 0.005)), "statuses": dict(Counter(statuses)),
        "replayed_exactly": f"{exact}/{n}", "uptime": os.getloadavg(),
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="core,scarce")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--compete", choices=("both", "only", "none"), default="both")
    ap.add_argument("--deadline", type=float, default=None, help="seconds (default: each scenario's own)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    store = args.store or default_store_path()
    out = []
    with SolverProcess() as proc:
        for name in [s.strip() for s in args.scenarios.split(",") if s.strip()]:
            p, deadline = problem(name, store)
            deadline = args.deadline or deadline
            t0 = time.perf_counter()
            opt = solve_allocation(p, effort=SolverEffort(), columns="all", mip_gap=1e-6)
            row: dict[str, Any] = {"scenario": name, "deadline_s": deadline, "optimum": opt.objective,
                                   "optimum_status": opt.status, "optimum_s": time.perf_counter() - t0}  # fmt: skip
            if args.compete in ("both", "none"):
                row["alone"] = runs(proc, p, deadline, opt.objective, args.runs)
            if args.compete in ("both", "only"):
                hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
                try:
                    row["competing"] = runs(proc, p, deadline, opt.objective, args.runs)
                finally:
                    hog.kill()
                    hog.wait()
            out.append(row)
            if not args.json:
                print(json.dumps(row))
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
