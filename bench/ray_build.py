"""`just bench ray-build`: the template build on the local process pool and on Ray, side by side.

Builds one library twice into fresh stores, first with the local pool (``--workers``), then with Ray
(``--ray ADDRESS``; by default a local instance this benchmark starts, with all of this machine's CPUs),
checks that both stores hold the same outcomes and templates, and reports:

- the build rate of each, in multisets per second (every multiset enumerated, wall clock of the build);
- per level: multisets, wall seconds, the workers' busy seconds, and the overhead, wall - busy / workers
  (what a level costs beyond perfectly shared solving: dispatch, results, the level's tail, the driver);
  Ray's overhead per level is its figure minus the pool's, and its start (connect, upload Coral's code)
  is reported apart;
- the driver's own seconds per multiset (enumeration, keys, store reads and writes: ``wall_s - wait_s``),
  which no cluster parallelises;
- the estimate for the `core` library at N_max 6 on a cluster of ``--cluster-cores`` cores:

      T = start + Ray's level-1 overhead + 5 x (its largest later one) + M x (driver s per multiset) + W / cores

  with M = 1,672,608 multisets and W = 25.8 core-hours of solving (the README's figures: 24.0 core-hours
  estimated for the six-node level from a seeded sample, plus 55 min x 2 cores measured for N_max 5),
  and the cluster's cores taken as fast as this machine's. It is an upper estimate of the driver's share
  (its store writes overlap the solving) and a lower one of the tail of each level.

Run it under ``nice`` on a shared machine; the load average is printed with the figures. On a loaded
machine Ray's own local start can fail (it waits a fixed 30 s for its raylet): start the instance first
(``nice ray start --head --num-cpus 2``), pass ``--ray auto``, and ``ray stop`` after.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from coral.catalog import load_catalog
from coral.cli.build import BuildJob, BuildReport, build_library
from coral.errors import CoralError
from coral.perf import PerfModel
from coral.scenario import load_scenario
from coral.store import TemplateStore

CORE_MULTISETS = 1_672_608
"""Multisets of the `core` library at N_max 6, three modes (README, "coral templates build")."""
CORE_HOURS = 24.0 + 55 / 60 * 2
"""Core-hours of solving for that library: the six-node level (estimated) plus N_max 5 (measured)."""
LEVELS = 6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="core", help="the scenario whose node types, SLOs and shapes to use")
    ap.add_argument("--models", default="qwen3-32b", help="comma-separated models of the scenario")
    ap.add_argument("--modes", default="aggregated,prefill")
    ap.add_argument("--nmax", type=int, default=4)
    ap.add_argument("--rho", type=float, default=12.0)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="local pool processes")
    ap.add_argument("--ray", default=None, metavar="ADDRESS", help="a Ray cluster (default: a new local instance)")
    ap.add_argument("--cluster-cores", type=int, default=64, help="the cluster of the N_max 6 estimate")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    args = ap.parse_args()
    try:
        from coral.cli.build_ray import RaySolver  # optional dependency: the `ray` extra
    except ModuleNotFoundError:
        ap.error('Ray is not installed: pip install -e ".[ray]"')
    cat = load_catalog()
    perf = PerfModel(cat)
    sc = load_scenario(args.scenario, cat)
    targets = {d.model: d for d in sc.deployments}
    jobs = []
    for m in args.models.split(","):
        if m not in targets:
            ap.error(f"--models: {m!r} is not deployed by scenario {args.scenario!r} (known: {', '.join(targets)})")
        jobs += [BuildJob(m, mode, targets[m].slo, targets[m].shape) for mode in args.modes.split(",")]
    nodes = list(sc.node_types)
    tmp = Path(tempfile.mkdtemp(prefix="coral-raybench-"))
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print(f"build: {args.models} x {args.modes}, {len(nodes)} node types of {args.scenario}, N_max {args.nmax}")

    with TemplateStore(tmp / "pool.sqlite") as store:
        pool = build_library(perf, store, jobs, nodes, nmax=args.nmax, rho=args.rho, workers=args.workers)
    _print("local pool", pool)

    for attempt in range(1, 4):  # a loaded machine can fail Ray's fixed 30 s wait for a local raylet
        t0 = time.perf_counter()
        try:
            solver = RaySolver(args.ray, perf, 10.0)
            break
        except CoralError as e:
            print(f"ray start, attempt {attempt}: {e}")
            if attempt == 3:
                return 1
    start = time.perf_counter() - t0
    try:
        with TemplateStore(tmp / "ray.sqlite") as store:
            ray_rep = build_library(perf, store, jobs, nodes, nmax=args.nmax, rho=args.rho, solver=solver)
    finally:
        solver.close()
    print(f"ray start (connect or start an instance, upload Coral's code): {start:.1f} s")
    _print(f"ray ({args.ray or 'local instance'})", ray_rep)
    same = _contents(tmp / "pool.sqlite") == _contents(tmp / "ray.sqlite")
    print(f"outcomes and templates identical: {'yes' if same else 'NO'}")

    extra = {s: _overhead(ray_rep, s) - _overhead(pool, s) for s in ray_rep.level_wall_s if s in pool.level_wall_s}
    print("ray's overhead per level beyond the pool's (s): " + ", ".join(f"{s}: {v:+.2f}" for s, v in extra.items()))
    own = {s: _overhead(ray_rep, s) for s in ray_rep.level_wall_s}
    per_level = max([0.0, *(v for s, v in own.items() if s > 1)])
    first = max(0.0, own.get(1, 0.0))
    driver = (ray_rep.wall_s - ray_rep.wait_s) / ray_rep.enumerated
    cores = args.cluster_cores
    work = CORE_HOURS * 3600
    est = start + first + (LEVELS - 1) * per_level + CORE_MULTISETS * driver + work / cores
    print(
        f"N_max 6 core library on {cores} cores: start {start:.0f} s + level 1's overhead {first:.0f} s"
        f" + {LEVELS - 1} more levels x {per_level:.2f} s (the largest later level's overhead)"
        f" + {CORE_MULTISETS:,} multisets x {driver * 1e3:.3f} ms (driver)"
        f" + {CORE_HOURS:.1f} core-h x 3600 / {cores} = {start:.0f} + {first:.0f} + {(LEVELS - 1) * per_level:.0f}"
        f" + {CORE_MULTISETS * driver:.0f} + {work / cores:.0f} = {est:.0f} s ({est / 3600:.2f} h)"
    )
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "pool": _figures(pool),
                    "ray": _figures(ray_rep),
                    "ray_start_s": start,
                    "identical": same,
                    "ray_overhead_per_level_s": extra,
                    "estimate_nmax6_s": est,
                    "cluster_cores": cores,
                    "load": load,
                },
                indent=1,
            )
        )
    return 0 if same else 1


def _overhead(r: BuildReport, size: int) -> float:
    return r.level_wall_s[size] - r.level_busy_s[size] / r.workers


def _figures(r: BuildReport) -> dict[str, Any]:
    return {
        "workers": r.workers,
        "enumerated": r.enumerated,
        "solved": r.solved,
        "wall_s": r.wall_s,
        "rate": r.enumerated / r.wall_s,
        "driver_s": r.wall_s - r.wait_s,
        "levels": {s: [r.level_tasks[s], r.level_wall_s[s], r.level_busy_s[s]] for s in r.level_wall_s},
    }


def _print(name: str, r: BuildReport) -> None:
    print(
        f"{name}: {r.workers} workers, {r.enumerated} multisets in {r.wall_s:.1f} s = "
        f"{r.enumerated / r.wall_s:.1f} multisets/s ({r.solved} solved; driver {r.wall_s - r.wait_s:.1f} s)"
    )
    for s in r.level_wall_s:
        print(
            f"   level {s}: {r.level_tasks[s]:>6} multisets, wall {r.level_wall_s[s]:7.2f} s, busy"
            f" {r.level_busy_s[s]:7.2f} s, overhead {_overhead(r, s):+6.2f} s"
        )


def _contents(path: Path) -> tuple[list[Any], list[Any]]:
    with TemplateStore(path, readonly=True) as store:
        rows = store.db.execute("SELECT * FROM outcomes ORDER BY key").fetchall()
        bodies = store.db.execute("SELECT id, body FROM templates ORDER BY id").fetchall()
    return rows, [(i, {k: v for k, v in json.loads(b).items() if k != "solve_s"}) for i, b in bodies]


if __name__ == "__main__":
    raise SystemExit(main())
