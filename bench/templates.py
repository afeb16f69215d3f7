"""`just bench templates`: build the template library and report enumeration, pruning, solve paths and speed.

Default: the `core` scenario's six models and twenty node types, N_max = 6, rho = 12, aggregated mode,
into a fresh store under /tmp, with a wall-clock budget. Models are built one after another (smallest
first); when the budget runs out the current model stops at the end of its level and the report says what
was covered. Figures per model: multisets enumerated; outcomes (kept, infeasible, dominated, split, of
which skipped by the upper bound without solving); solve paths ("reduce", "shapes", "dp-proven",
"lp-proven", "milp"; "bound-infeasible" / "bound-pruned" settled by upper bounds before any search;
"search-pruned": the placer proved it worth no more than its smaller templates; "lp-pruned": the LP
relaxation's bound proved that, before any search, tried in prefill mode only), in all and by size;
proven optimal; the gap distribution of the rest; time per solved multiset p50/p99 by size; wall time;
multisets per second per core, counting only those not already in the store (``--store`` resumes a
build, or grows it to a larger ``--nmax``).

``--sample-top K`` estimates a build too long to run: every level below N_max is built in full (so that the
floors are the real ones), and of the N_max level only a seeded random sample of K multisets per model and
mode. The report adds the sample's mean solve time, the whole level's estimated cost (mean x its size, in
core-hours) and the whole job's (plus the solve time of the levels below, in this run: on a store that
already holds them, those were not solved and do not count). Core-seconds are the workers' solve times.
Sampled multisets already in the store are not solved and are left out of the mean; when the whole
sample is there (a second run on the same store) there is no estimate.

``--catalog``: the default catalog instead of a scenario: every model and every node type of the built-in
catalog, each model under the scenario's SLO and shape where the scenario deploys it, else the "chat"
class (TTFT 2 s, TPOT 100 ms, 1155/211 tokens). It first prints how many multisets each model enumerates
per size (46 node types give tens of millions at N_max 6), then builds within the budget.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from coral.catalog import load_catalog
from coral.cli.build import BuildJob, build_library
from coral.perf import PerfModel
from coral.scenario import load_scenario
from coral.store import TemplateStore
from coral.workload import Slo, WorkloadShape
from solvers.combos import enumerate_multisets

CHAT_SLO = Slo(ttft_s=2.0, tpot_s=0.1, attainment=0.9)
CHAT_SHAPE = WorkloadShape(mean_in=1155, mean_out=211)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="core")
    ap.add_argument("--models", default=None, help="comma-separated (default: the scenario's)")
    ap.add_argument("--catalog", action="store_true", help="every model and node type of the built-in catalog")
    ap.add_argument("--modes", default="aggregated")
    ap.add_argument("--nmax", type=int, default=6)
    ap.add_argument("--rho", type=float, default=12.0)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--budget", type=float, default=1800.0, help="wall seconds for the whole run")
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    ap.add_argument(
        "--sample-top", type=int, default=0, metavar="K",
        help="solve every level below N_max, and of the N_max level only a seeded random sample of K multisets "
        "per model and mode; report the estimated cost of the whole level and of the whole build",
    )  # fmt: skip
    args = ap.parse_args()
    cat = load_catalog()
    perf = PerfModel(cat)
    sc = load_scenario(args.scenario, cat)
    targets = {d.model: (d.slo, d.shape) for d in sc.deployments}
    node_types = list(sc.node_types)
    if args.catalog:
        targets = {m: targets.get(m, (CHAT_SLO, CHAT_SHAPE)) for m in cat.models}
        node_types = sorted(cat.nodes)
    models = args.models.split(",") if args.models else sorted(targets, key=lambda m: cat.models[m].weight_bytes)
    if args.sample_top < 0:
        ap.error(f"--sample-top must be >= 0, got {args.sample_top}")
    for m in models:
        if m not in targets:
            ap.error(f"--models: {m!r} is not deployed by scenario {args.scenario!r} (known: {', '.join(targets)})")
    store_path = args.store or Path(tempfile.mkdtemp(prefix="coral-bench-")) / "templates.sqlite"
    print(
        f"machine: {os.cpu_count()} cores; workers {args.workers}; N_max {args.nmax}; rho {args.rho}; "
        f"{len(node_types)} node types; store {store_path}"
    )
    if args.catalog:
        total = 0
        for model in models:
            t0 = time.perf_counter()
            lv = enumerate_multisets(perf, model, node_types, targets[model][1], nmax=args.nmax, rho=args.rho)
            sizes = [len(v) for v in lv.values()]
            total += sum(sizes)
            took = time.perf_counter() - t0
            print(f"   {model}: {sum(sizes):,} multisets (by size {sizes}; enumerated in {took:.1f} s)")
        print(f"   all models: {total:,} multisets per mode")
    out = []
    t_all = time.perf_counter()
    with TemplateStore(store_path) as store:
        for model in models:
            slo, shape = targets[model]
            for mode in args.modes.split(","):
                left = args.budget - (time.perf_counter() - t_all)
                if left <= 0:
                    print(f"budget spent: {model} {mode} not built")
                    continue
                job = BuildJob(model, mode, slo, shape)
                r = build_library(perf, store, [job], node_types, nmax=args.nmax, rho=args.rho,
                                  workers=args.workers, deadline_s=left, sample_top=args.sample_top)  # fmt: skip
                row = _row(model, mode, r, args.workers, (args.nmax, args.sample_top) if args.sample_top else None)
                out.append(row)
                _print(row)
    total = time.perf_counter() - t_all
    print(f"total wall {total:.0f} s on {args.workers} workers")
    est = [r["estimate"] for r in out if r.get("estimate")]
    if args.sample_top and not est:
        print("no estimate: every sampled multiset was in the store already (use a store without them)")
    elif args.sample_top:
        core = sum(e["job_core_s"] for e in est)  # type: ignore[index]
        print(
            f"estimated whole build at N_max {args.nmax} ({len(est)} model-modes): {core / 3600:.1f} core-hours,"
            f" about {core / 3600 / args.workers:.1f} h on {args.workers} workers"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def _row(model: str, mode: str, r: object, workers: int, sample: tuple[int, int] | None = None) -> dict[str, object]:
    """One job's figures; ``sample`` (the N_max level, K) adds the estimate of ``--sample-top``."""
    from coral.cli.build import BuildReport

    assert isinstance(r, BuildReport)
    done = r.enumerated - r.unfinished
    estimate = None
    level, k = sample or (0, 0)
    n = min(k, r.top_level) - r.top_reused  # the sampled multisets solved in this run
    if sample is not None and not r.unfinished and n > 0:
        # bound-skipped multisets of the sample are not timed (no solve): they count as costing nothing
        mean = sum(r.seconds_by_size.get(level, [])) / n
        below = sum(sum(v) for size, v in r.seconds_by_size.items() if size != level)
        estimate = {
            "level": level, "level_multisets": r.top_level, "sampled": n, "mean_s": mean,
            "level_core_s": mean * r.top_level, "below_core_s": below, "job_core_s": below + mean * r.top_level,
        }  # fmt: skip
    per_size = {
        n: {
            "solved": len(v),
            "p50_ms": float(np.percentile(v, 50) * 1e3),
            "p99_ms": float(np.percentile(v, 99) * 1e3),
            "paths": dict(sorted(r.paths_by_size.get(n, {}).items())),
        }
        for n, v in sorted(r.seconds_by_size.items())
        if v
    }
    return {
        "model": model, "mode": mode, "enumerated": r.enumerated, "finished": done, "kept": r.kept,
        "infeasible": r.infeasible, "dominated": r.dominated, "split": r.split, "bound_skipped": r.bound_skipped,
        "by_path": r.by_path, "proven": r.proven, "unproven": len(r.gaps),
        "gap_p50": float(np.percentile(r.gaps, 50)) if r.gaps else 0.0, "gap_max": max(r.gaps, default=0.0),
        "reused": r.reused, "estimate": estimate, "per_size": per_size, "wall_s": r.wall_s,
        "per_s_per_core": (done - r.reused) / r.wall_s / workers if r.wall_s else 0.0,
    }  # fmt: skip


def _print(row: dict[str, object]) -> None:
    reused = f" ({row['reused']} of them already in the store)" if row["reused"] else ""
    print(
        f"\n== {row['model']} ({row['mode']}): {row['finished']}/{row['enumerated']} multisets{reused} in"
        f" {row['wall_s']:.0f} s = {row['per_s_per_core']:.1f} per second per core (of those not in the store)"
    )
    print(
        f"   kept {row['kept']}, infeasible {row['infeasible']}, dominated {row['dominated']}, split {row['split']}"
        f" (skipped by bound without solving: {row['bound_skipped']})"
    )
    print(
        f"   solve paths {row['by_path']}; proven optimal {row['proven']} of {row['kept']} kept;"
        f" unproven {row['unproven']} (gap p50 {row['gap_p50']:.2%}, max {row['gap_max']:.2%})"
    )
    for n, s in row["per_size"].items():  # type: ignore[attr-defined]
        paths = " ".join(f"{k}:{v}" for k, v in s["paths"].items())
        print(f"   n={n}: {s['solved']} solved, p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms; paths {paths}")
    e = row.get("estimate")
    if isinstance(e, dict):
        print(
            f"   estimate: n={e['level']} sampled {e['sampled']} of {e['level_multisets']} (seed 0), mean"
            f" {e['mean_s'] * 1e3:.0f} ms each: that level about {e['level_core_s'] / 3600:.2f} core-hours; the"
            f" whole job about {e['job_core_s'] / 3600:.2f} core-hours (levels below: {e['below_core_s']:.0f} s"
            " of solves in this run)"
        )


if __name__ == "__main__":
    sys.exit(main())
