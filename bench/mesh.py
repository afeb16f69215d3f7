"""Mesh benchmark: how fast the actor mesh runs a scenario, and where its time goes.

Runs the whole mesh in this process, as ``coral up`` does (``run_mesh`` on the simulated cloud and
engines, on a virtual clock), on a bundled scenario (default: ``default``, one hour), from a template
store that already holds its library (``coral up --store STORE`` builds it on first use).

- ``--speed max`` (the default): as fast as possible; reported: wall seconds, CPU seconds of this
  process, simulated seconds per wall second (target: the default hour in at most 60 s wall);
- ``--speed N``: paced at N simulated seconds per wall second; reported: how far the clock fell behind
  the pace at its worst (target at 60: never more than 5 s behind);
- per actor (workers summed as ``worker-*``): messages handled, timer calls (ticks) and the wall time
  spent in them, the share of the run's wall time, and the bus totals (routed, published);
- ``--profile FILE``: a cProfile of the run (``python -m pstats FILE``);
- ``--compare``: also runs ``coral simulate`` on the same scenario, seed and planner, and prints each
  deployment's SLO attainment and share of requests served in both (target: within 1 point).

The machine's load average is printed with the figures: they depend on it. Run
``python bench/mesh.py [--scenario default] [--store PATH] [--speed max|N] [--duration S] [--json]``
(``just bench mesh``).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", default="default", help="scenario NAME (bundled) or FILE (default: default)")
    p.add_argument("--store", type=Path, default=None, help="template store (default: the user data dir)")
    p.add_argument("--speed", default="max", help="'max' or simulated seconds per wall second (default: max)")
    p.add_argument("--duration", type=float, default=None, help="simulated seconds (default: the scenario's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the arrivals (default: 0)")
    p.add_argument("--profile", type=Path, default=None, help="write a cProfile of the run here")
    p.add_argument("--compare", action="store_true", help="also run `coral simulate` and compare attainment")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p.parse_args()


def main() -> None:
    args = parse()
    import anyio

    from actors.compose import CoralMesh, RunOptions, library_for, make_setup, run_mesh
    from actors.watch import RunState
    from coral.catalog import load_catalog
    from coral.cli.planning import make_planner
    from coral.cli.up_status import summarize
    from coral.kernel import Mesh
    from coral.perf import PerfModel
    from coral.scenario import load_scenario
    from coral.sim import simulate
    from coral.store import TemplateStore, default_store_path

    speed = None if args.speed == "max" else float(args.speed)
    if speed is not None and not (math.isfinite(speed) and speed > 0):
        raise SystemExit(f"--speed: expected 'max' or a number > 0, got {args.speed!r}")
    cat = load_catalog()
    perf = PerfModel(cat)
    sc = load_scenario(args.scenario, cat)
    store = args.store if args.store is not None else default_store_path()
    if not Path(store).exists():
        raise SystemExit(f"--store: {store} does not exist (run `coral up --store {store}` once to build it)")
    with TemplateStore(Path(store), readonly=True) as st:
        lib = library_for(st, sc)
    if not any(lib.values()):
        raise SystemExit(f"--store: {store} holds no templates for scenario {sc.name!r}")
    setup = make_setup(sc, cat, perf, lib, RunOptions(seed=args.seed, deterministic=True, duration_s=args.duration))
    state = RunState()
    meshes: list[Mesh] = []
    behind = [0.0]
    t0: list[float] = []

    async def on_start(mesh: Mesh, _cm: CoralMesh) -> None:
        meshes.append(mesh)
        t0.extend((time.monotonic(), mesh.clock.now()))

    def on_step(t: float) -> None:
        if speed is not None and t0:
            behind[0] = max(behind[0], (time.monotonic() - t0[0]) * speed - (t - t0[1]))

    def compare(mesh_summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
        with TemplateStore(Path(store), readonly=True) as st:
            plan_fn, templates = make_planner("coral", sc, cat, perf, st)
        dur = args.duration if args.duration is not None else sc.duration_s
        sim = simulate(sc, templates, perf, plan_fn, seed=args.seed, duration_s=dur).to_json()
        rows = {}
        for name, m in mesh_summary["deployments"].items():
            s = sim["per_model"][name]
            rows[name] = {
                "mesh_attainment": m["slo_attainment"],
                "sim_attainment": s["attainment"]["both"],
                "diff_points": 100 * (m["slo_attainment"] - s["attainment"]["both"]),
                "mesh_served": m["completed"] / max(1, m["arrivals"]),
                "sim_served": s["completed"] / max(1, s["requests"]),
                "mesh_failed_by": m["failed_by"],
            }
        return rows

    load0 = os.getloadavg()
    cpu0 = time.process_time()
    prof = cProfile.Profile() if args.profile is not None else None
    if prof is not None:
        prof.enable()
    res = anyio.run(
        lambda: run_mesh(setup, sc, cat, perf, pace=speed, state=state, on_start=on_start, on_step=on_step),
        backend="asyncio",
    )
    if prof is not None:
        prof.disable()
        prof.dump_stats(str(args.profile))
    cpu = time.process_time() - cpu0
    mesh = meshes[0]
    per: dict[str, dict[str, float]] = {}
    for name, c in mesh.counters().items():
        key = "worker-*" if name.startswith("worker-") else name
        row = per.setdefault(key, {"actors": 0, "handled": 0, "ticks": 0, "busy_s": 0.0})
        row["actors"] += 1
        row["handled"] += c.handled
        row["ticks"] += c.timers
        row["busy_s"] += c.busy_s
    simulated = res.end + setup.timing.warmup_s  # the run starts warmup_s before the scenario's time 0
    out: dict[str, Any] = {
        "scenario": sc.name,
        "speed": args.speed,
        "simulated_s": simulated,
        "wall_s": round(res.wall_s, 2),
        "cpu_s": round(cpu, 2),
        "x_real_time": round(simulated / res.wall_s, 1),
        "max_behind_s": round(behind[0], 2) if speed is not None else None,
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "bus": {"routed": mesh.broker.stats.routed, "published": mesh.broker.stats.published},
        "actors": {k: {**v, "busy_s": round(v["busy_s"], 3)} for k, v in sorted(per.items())},
    }
    if args.compare:
        out["compare"] = compare(summarize(setup, res.state, res.end, res.reason, res.wall_s, None))
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"mesh bench: scenario {sc.name}, speed {args.speed}, load {out['load_before']} -> {out['load_after']}")
    print(
        f"  {simulated:.0f} simulated s in {res.wall_s:.1f} s wall ({out['x_real_time']}x real time), "
        f"{cpu:.1f} s CPU; bus: {out['bus']['routed']} routed, {out['bus']['published']} published"
    )
    if speed is not None:
        print(f"  at most {behind[0]:.2f} s behind the pace")
    for d, c in out.get("compare", {}).items():
        print(
            f"  {d:<10} attainment mesh {c['mesh_attainment']:.4f} simulate {c['sim_attainment']:.4f} "
            f"(diff {c['diff_points']:+.2f} points); served mesh {c['mesh_served']:.4f} "
            f"simulate {c['sim_served']:.4f}; mesh failed {c['mesh_failed_by']}"
        )
    print(f"  {'actor':<18} {'n':>4} {'handled':>9} {'ticks':>8} {'busy s':>8} {'share':>6}")
    for k, v in sorted(per.items(), key=lambda kv: -kv[1]["busy_s"]):
        share = v["busy_s"] / res.wall_s
        print(f"  {k:<18} {v['actors']:>4} {v['handled']:>9} {v['ticks']:>8} {v['busy_s']:>8.2f} {share:>6.1%}")


if __name__ == "__main__":
    main()
