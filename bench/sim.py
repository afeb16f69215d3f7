"""Benchmark the fleet simulator: one hour at 50x the Azure conversation trace (~1M requests).

Two deployments share the trace by demand share (chat-8b: llama-3.1-8b, 2/3; chat-14b: qwen3-14b, 1/3)
over a hand-built fleet of about sixty instances in two regions (single-node templates on L40S and H100
nodes, a TP-4 L40S node, and a two-stage L4 pipeline), planned by ``GreedyPlanner`` every 300 s, with
one market change and one node loss. Prints wall time, simulated requests per wall second, events per
second and peak memory (``ru_maxrss``; ``--tracemalloc`` adds the Python heap peak, at some speed cost).

    python bench/sim.py [--rate-scale 50] [--duration 3600] [--trace FILE] [--profile] [--json]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import resource
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coral.catalog import load_catalog  # noqa: E402
from coral.perf import PerfModel  # noqa: E402
from coral.scenario import Demand, Deployment, FaultEvent, MarketChange, Planner, Scenario  # noqa: E402
from coral.sim import simulate  # noqa: E402
from coral.sim.handmade import DEFAULT_SHAPE, DEFAULT_SLO, GreedyPlanner, single, stage, template  # noqa: E402
from coral.templates import Template  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "azure-llm-2023-conv.csv"
EAST, WEST = "aws-us-east-1", "aws-us-west-2"


def build(perf: PerfModel, duration: float) -> tuple[Scenario, dict[str, Template], GreedyPlanner]:
    l8, q14 = "llama-3.1-8b", "qwen3-14b"
    pipe = template(
        perf,
        l8,
        [stage(perf, l8, "g6.xlarge", 0, 16, 64, index=0), stage(perf, l8, "g6.xlarge", 16, 32, 64, index=1)],
        tid=f"{l8}@g6.xlarge+g6.xlarge",
    )
    tpls = [
        single(perf, l8, "g6e.xlarge", 64),
        single(perf, l8, "p5.4xlarge", 256),
        pipe,
        single(perf, q14, "p5.4xlarge", 128),
        single(perf, q14, "g6e.12xlarge", 128),
    ]
    by_id = {t.id: t for t in tpls}
    options = {
        "chat-8b": [(tpls[0].id, EAST), (tpls[0].id, WEST), (pipe.id, EAST), (tpls[1].id, WEST)],
        "chat-14b": [(tpls[3].id, EAST), (tpls[3].id, WEST), (tpls[4].id, EAST), (tpls[4].id, WEST)],
    }
    sc = Scenario(
        name="bench-sim",
        path=Path("bench-sim.toml"),
        regions=(EAST, WEST),
        node_types=("g6e.xlarge", "g6e.12xlarge", "p5.4xlarge", "g6.xlarge"),
        deployments=(
            Deployment("chat-8b", l8, DEFAULT_SLO, DEFAULT_SHAPE, Demand(((0.0, 2.0),))),
            Deployment("chat-14b", q14, DEFAULT_SLO, DEFAULT_SHAPE, Demand(((0.0, 1.0),))),
        ),
        duration_s=duration,
        planner=Planner(replan_interval_s=300.0),
        market=(MarketChange(at=duration * 0.4, region=EAST, node="g6e.xlarge", availability=24),),
        events=(FaultEvent(at=duration * 0.6, kind="node_loss", region=EAST, node="g6e.xlarge", count=2),),
    )
    return sc, by_id, GreedyPlanner(by_id, options, utilisation=0.8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate-scale", type=float, default=50.0)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="run under cProfile and print the top functions")
    ap.add_argument("--tracemalloc", action="store_true", help="also measure the Python heap peak")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not args.trace.exists():
        sys.exit(f"trace {args.trace} not found (the shared traces folder is not next to this checkout)")
    perf = PerfModel(load_catalog())
    sc, templates, planner = build(perf, args.duration)
    if args.tracemalloc:
        tracemalloc.start()
    prof = cProfile.Profile() if args.profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    res = simulate(sc, templates, perf, planner, seed=args.seed, trace=args.trace, rate_scale=args.rate_scale)
    if prof:
        prof.disable()
    wall = time.perf_counter() - t0
    heap_peak = tracemalloc.get_traced_memory()[1] if args.tracemalloc else None
    s = res.summary()
    instances = max((sum(r[8] for r in res.series if r[1] == t) for t in {r[1] for r in res.series}), default=0)
    out = {
        "requests": s["requests"],
        "completed": s["completed"],
        "failed": s["failed"],
        "failed_by_reason": s["failed_by_reason"],
        "attainment": s["attainment"],
        "goodput_rps": s["goodput_rps"],
        "cost": s["cost"],
        "retries": s["retries"],
        "preemptions": s["preemptions"],
        "replans": s["replans"]["count"],
        "peak_instances": instances,
        "events": res.events,
        "wall_s": wall,
        "requests_per_wall_s": s["requests"] / wall,
        "events_per_wall_s": res.events / wall,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "python_heap_peak_mb": heap_peak / 2**20 if heap_peak is not None else None,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:>22}: {v:.4g}" if isinstance(v, float) else f"{k:>22}: {v}")
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
