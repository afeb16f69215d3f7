"""`just bench at-deadline`: Coral's plan at each scenario's own deadline, against the proven optimum.

For each scenario (default ``core,scarce``): the allocation problem at t = 0 (``coral plan``'s), its
optimum proven without a deadline (every phase to completion), then ``--runs`` solves at the scenario's
``deadline_s`` through a solver process (``actors.solver_process``, as ``coral plan`` solves), and the same
with a competing CPU-bound process (``python -c "while 1: pass"``) running beside it (``--compete``:
both, only, or none). Reported: p50 / p90 of the wall time of each solve (request to result, in the
owner), of the child's ``solve_s``, and of the gap of the plan's objective to the optimum; the share of
runs within 0.5%; the statuses; whether each run's effort replays to its plan exactly; ``uptime``; the
p50 seconds of each phase (``phase_s_p50``, the child's ``phase_s``) and in how many runs the deadline cut
or skipped each phase (``cut_or_skipped``: ``SolverEffort.as_mapping``'s keys, ``master.i`` the round,
``search.s`` the step of the neighbourhood search).

``--deadline S`` solves at S seconds instead of each scenario's own deadline (the speed target: ``core`` at
1 s, p50 <= 0.24 s at gap <= 1%). The first request sends the problem whole to the child, later ones only
what changed (``actors.solver_process``); wall and solve time are reported apart.

``--cells``: the savings study's cells instead (``solvers.study``: the scenario's request at t = 0 with
demand times each of ``--scales``, default 0.25,0.5,1,2,5, under each availability setting, seed
``--seed``), Coral's plan (every template, no starting plans: as the allocator solves) against each
cell's optimum (one cell: ``--scales 5 --availability quota``). The optimum is proven first with no
deadline (every phase to completion, gap 1e-6), at most ``--prove-limit`` seconds (default 600; a cell
not proven by then is reported as such, with its bound); ``prove_s`` is how long it took.
``--scenarios`` then names one scenario (default core). ``--best-known SCALE:SETTING=OBJ,...`` (e.g.
``5:cap4=325.148``): a cheaper plan found elsewhere (a longer run) for a cell its proof did not settle; the
gaps are then taken to the cheaper of the two (``reference``), which serves every demand that the proof's
plan does (a best known plan serves all).

CPU time: ``cpu_p50`` is the CPU seconds of the same solve run in this process (``time.process_time``),
which a busy machine inflates far less than wall time.

Run ``python bench/at_deadline.py [--scenarios core,scarce] [--runs 10] [--deadline S] [--store FILE] [--json]``
or ``python bench/at_deadline.py --cells [--scenarios core] [--scales ...] [--availability ...] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
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
from solvers.study import AVAILABILITY, cell_request


def problem(name: str, store: Path) -> tuple[AllocationProblem, float]:
    cat = load_catalog()
    perf = PerfModel(cat)
    sc = load_scenario(name, cat)
    with TemplateStore(store) as st:
        tpls = deployment_templates(st, sc, "coral", perf_version=perf.version)
    prob, _index = Planner("coral", sc, cat, perf, tpls, sc.planner.deadline_s).problem(request_at(sc, cat, 0.0))
    return prob, sc.planner.deadline_s


def cell_problems(
    name: str, store: Path, scales: list[float], settings: list[str], seed: int
) -> Iterator[tuple[float, str, AllocationProblem, float]]:
    """(scale, setting, the cell's problem for Coral's templates, the scenario's deadline) of each cell."""
    cat = load_catalog()
    perf = PerfModel(cat)
    sc = load_scenario(name, cat)
    with TemplateStore(store) as st:
        tpls = deployment_templates(st, sc, "coral", perf_version=perf.version)
    planner = Planner("coral", sc, cat, perf, tpls, sc.planner.deadline_s)
    base = request_at(sc, cat, 0.0, trigger="sweep")
    for setting in settings:
        for scale in scales:
            prob, _index = planner.problem(cell_request(base, scale, setting, cat, seed))
            yield scale, setting, prob, sc.planner.deadline_s


def prove(p: AllocationProblem, limit_s: float) -> dict[str, Any]:
    """The optimum of p: every phase to completion (gap 1e-6), within ``limit_s`` seconds."""
    t0, c0 = time.perf_counter(), time.process_time()
    opt = solve_allocation(p, deadline_s=limit_s, columns="all", mip_gap=1e-6)
    return {"optimum": opt.objective, "optimum_status": opt.status, "optimum_bound": opt.bound,
            "optimum_unmet_rps": float(opt.unmet_rps.sum()),
            "weighted_unmet": float(p.weights @ opt.unmet_rps), "prove_s": time.perf_counter() - t0,
            "prove_cpu_s": time.process_time() - c0}  # fmt: skip


def runs(
    proc: SolverProcess, p: AllocationProblem, deadline: float, best: float, n: int, best_unmet: float = 0.0
) -> dict[str, Any]:
    """``n`` solves at ``deadline`` against the optimum ``best`` (objective) serving all but ``best_unmet``
    req/s (priority-weighted); a plan that serves less counts as not within 0.5% whatever its cost."""
    walls, solves, gaps, statuses, exact, cpus, short = [], [], [], [], 0, [], 0
    phases: dict[str, list[float]] = {}
    efforts: Counter[str] = Counter()
    for _ in range(n):
        c0 = time.process_time()
        solve_allocation(p, deadline_s=deadline, columns="all")
        cpus.append(time.process_time() - c0)
        t0 = time.perf_counter()
        res = proc.solve(p, deadline_s=deadline, columns="all")
        walls.append(time.perf_counter() - t0)
        solves.append(res.solve_s)
        less = float(p.weights @ res.unmet_rps) > best_unmet + 1e-6 * max(1.0, float(p.weights @ p.demand_rps))
        short += less
        gaps.append(math.inf if less else (res.objective - best) / best if best > 0 else 0.0)
        statuses.append(res.status)
        for name, secs in res.phase_s.items():
            phases.setdefault(name, []).append(secs)
        efforts.update(k for k in res.effort.as_mapping() if "." not in k or k.startswith(("master.", "search.")))
        again = solve_allocation(p, effort=res.effort, columns="all")
        exact += (again.counts, again.objective, again.bound, again.gap) == (res.counts, res.objective, res.bound,
                                                                              res.gap)  # fmt: skip
    pct = lambda xs, q: float(np.percentile(xs, q, method="lower"))  # noqa: E731
    return {
        "wall_p50": pct(walls, 50), "wall_p90": pct(walls, 90), "solve_p50": pct(solves, 50),
        "solve_p90": pct(solves, 90), "gap_to_opt_p50": pct(gaps, 50), "gap_to_opt_p90": pct(gaps, 90),
        "within_0.5%": float(np.mean(np.array(gaps) <= 0.005)), "statuses": dict(Counter(statuses)),
        "serves_less": short, "replayed_exactly": f"{exact}/{n}", "cpu_p50": pct(cpus, 50), "uptime": os.getloadavg(),
        "phase_s_p50": {k: round(pct(v, 50), 3) for k, v in phases.items()}, "cut_or_skipped": dict(efforts),
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="core,scarce")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--compete", choices=("both", "only", "none"), default="both")
    ap.add_argument("--deadline", type=float, default=None, help="seconds (default: each scenario's own)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cells", action="store_true", help="the savings study's cells (see above)")
    ap.add_argument("--scales", default="0.25,0.5,1,2,5")
    ap.add_argument("--availability", default=",".join(AVAILABILITY))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prove-limit", type=float, default=600.0)
    ap.add_argument("--best-known", default="", help="SCALE:SETTING=OBJ,... (see above)")
    args = ap.parse_args()
    store = args.store or default_store_path()
    if args.cells:
        return cells(args, store)
    out = []
    with SolverProcess() as proc:
        for name in [s.strip() for s in args.scenarios.split(",") if s.strip()]:
            p, deadline = problem(name, store)
            deadline = args.deadline or deadline
            t0 = time.perf_counter()
            opt = solve_allocation(p, effort=SolverEffort(), columns="all", mip_gap=1e-6)
            row: dict[str, Any] = {"scenario": name, "deadline_s": deadline, "optimum": opt.objective,
                                   "optimum_status": opt.status, "optimum_s": time.perf_counter() - t0}  # fmt: skip
            row.update(compared(proc, p, deadline, opt.objective, args, float(p.weights @ opt.unmet_rps)))
            out.append(row)
            if not args.json:
                print(json.dumps(row))
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


def compared(
    proc: SolverProcess, p: AllocationProblem, deadline: float, best: float, args: Any, best_unmet: float = 0.0
) -> dict[str, Any]:
    """The runs at ``deadline`` against ``best``: alone, beside a CPU hog, or both (``--compete``)."""
    row: dict[str, Any] = {}
    if args.compete in ("both", "none"):
        row["alone"] = runs(proc, p, deadline, best, args.runs, best_unmet)
    if args.compete in ("both", "only"):
        hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
        try:
            row["competing"] = runs(proc, p, deadline, best, args.runs, best_unmet)
        finally:
            hog.kill()
            hog.wait()
    return row


def best_known(spec: str) -> dict[tuple[float, str], float]:
    """``--best-known``'s objectives by (scale, setting)."""
    out: dict[tuple[float, str], float] = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        try:
            cell, obj = item.split("=")
            scale, setting = cell.split(":")
            out[float(scale), setting.strip()] = float(obj)
        except ValueError:
            raise SystemExit(f"--best-known: expected SCALE:SETTING=OBJ, got {item!r}") from None
    return out


def cells(args: Any, store: Path) -> int:
    """``--cells``: each sweep cell's optimum, proven, against Coral's plan at the deadline."""
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    name = "core" if args.scenarios == "core,scarce" else names[0]
    scales = [float(x) for x in args.scales.split(",")]
    settings = [x.strip() for x in args.availability.split(",")]
    known = best_known(args.best_known)
    out = []
    with SolverProcess() as proc:
        for scale, setting, p, own in cell_problems(name, store, scales, settings, args.seed):
            deadline = args.deadline or own
            row: dict[str, Any] = {"scenario": name, "scale": scale, "availability": setting, "deadline_s": deadline}
            row.update(prove(p, args.prove_limit))
            ref = row["optimum"]
            if (scale, setting) in known and row["weighted_unmet"] <= 1e-6 and known[scale, setting] < ref:
                ref = known[scale, setting]
            row["reference"] = ref
            row.update(compared(proc, p, deadline, ref, args, row["weighted_unmet"]))
            out.append(row)
            if not args.json:
                print(json.dumps(row), flush=True)
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
