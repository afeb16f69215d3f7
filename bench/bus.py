"""Bus benchmark: kernel throughput and round-trip latency, and the mesh's reaction time to a stockout.

1. Throughput and request/reply p50/p99 through the kernel over inproc, tcp and tcp with CurveZMQ, for a
   small message and a ~50 KB plan-like one (``bench/bus_bench.py``, reused as is).
2. Reaction time: the whole mesh (price watcher, demand monitor, allocator, supervisor with the simulated
   cloud, stage workers, router with seeded traffic) runs the ``core`` scenario, paced at ``--speed``
   scenario seconds per wall second as ``coral up`` runs it, with the solver under the scenario's deadline.
   After a warm-up, each of ``--runs`` rounds sends a market quote that makes the node type the current
   plan uses most unavailable (availability 0), and measures the wall time from the price watcher's
   ``MarketUpdate`` to the allocator's next ``NewPlan`` (both as received by a client on the bus), then
   restores the availability and waits for the plan that follows. Reported: p50 and p90 of the reaction,
   the solve time inside it, and the time from the quote itself; once with the allocation MIP over all
   template columns (exact) and once with generated columns (``solve_allocation(columns="generated")``).

The core scenario's templates are built with N_max = 2 (the scenario asks for 3; N_max 2 keeps the
first build under a minute) into ``/tmp/coral-bench-core-nmax2.sqlite`` unless ``--store`` names another.
Run ``python bench/bus.py [--json] [--skip-bus] [--runs 20]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bus_bench  # noqa: E402

from actors.compose import CoralMesh, RunOptions, RunState, library_for, make_setup, run_mesh  # noqa: E402
from actors.feed import MARKET_SOURCE  # noqa: E402
from coral.catalog import load_catalog  # noqa: E402
from coral.kernel import BusClient, Mesh  # noqa: E402
from coral.messages import PRICE_WATCHER, MarketQuotes, MarketUpdate, NewPlan, Quote  # noqa: E402
from coral.perf import PerfModel  # noqa: E402
from coral.scenario import load_scenario  # noqa: E402
from coral.store import TemplateStore  # noqa: E402

DEFAULT_STORE = Path("/tmp/coral-bench-core-nmax2.sqlite")
NMAX = 2


def ensure_core_store(path: Path) -> dict[str, Any]:
    """Build the core scenario's templates (N_max 2) into ``path`` if they are missing."""
    from coral.cli.build import build_library, default_workers
    from coral.cli.jobs import scenario_jobs

    cat = load_catalog()
    perf = PerfModel(cat)
    sc = load_scenario("core", cat)
    t0 = time.perf_counter()
    with TemplateStore(path) as store:
        rep = build_library(
            perf,
            store,
            scenario_jobs(sc),
            list(sc.node_types),
            nmax=NMAX,
            rho=sc.planner.rho,
            workers=default_workers(),
        )
    return {"store": str(path), "nmax": NMAX, "templates_kept": rep.kept, "reused": rep.reused,
            "build_s": round(time.perf_counter() - t0, 1)}  # fmt: skip


async def reaction(store_path: Path, runs: int, speed: float, warmup_s: float, columns: str) -> dict[str, Any]:
    """Stockout -> plan reaction times in a running core mesh (see the module docstring)."""
    cat = load_catalog()
    perf = PerfModel(cat)
    sc = load_scenario("core", cat)
    with TemplateStore(store_path, readonly=True) as store:
        library = library_for(store, sc)
    setup = make_setup(sc, cat, perf, library, RunOptions(seed=1, columns=columns))
    stop = anyio.Event()
    st = RunState()
    seen: list[tuple[float, object]] = []
    ctx: dict[str, Any] = {"phase": "warm", "samples": [], "from_quote": [], "solve": []}

    async def listen(bench: BusClient) -> None:
        async for env in bench:  # ends when the mesh closes the client
            seen.append((time.perf_counter(), env.msg))

    def busiest(plan: NewPlan) -> tuple[str, str]:
        use: dict[tuple[str, str], int] = {}
        for i in plan.plan.instances:
            for n in i.nodes:
                use[(i.region, n)] = use.get((i.region, n), 0) + i.count
        return max(sorted(use), key=lambda k: use[k])

    def plans_after(t_wall: float) -> list[tuple[float, NewPlan]]:
        return [(t, m) for t, m in seen if t > t_wall and isinstance(m, NewPlan)]

    async def on_step(t: float) -> None:
        mesh: Mesh = ctx["mesh"]
        phase = ctx["phase"]
        if phase == "warm":
            if t >= warmup_s and st.plan is not None and st.market is not None:
                ctx["phase"] = "inject"
            return
        if phase == "inject":
            plan = next(m for _, m in reversed(seen) if isinstance(m, NewPlan))
            key = busiest(plan)
            quote = next(q for q in st.market.quotes if q.key == key) if st.market else None
            assert quote is not None
            ctx["restore"] = quote
            ctx["t_quote"] = time.perf_counter()
            out = Quote(quote.region, quote.node, quote.price, 0)
            mesh.send(PRICE_WATCHER, MarketQuotes(t, "bench", (out,), full=False), source=MARKET_SOURCE)
            ctx["phase"] = "wait"
            return
        if phase == "wait":
            ups = [(tw, m) for tw, m in seen if tw > ctx["t_quote"] and isinstance(m, MarketUpdate)]
            if not ups:
                return
            t_up = ups[0][0]
            later = [(tw, m) for tw, m in plans_after(t_up) if "market" in m.plan.trigger]
            if not later:
                return
            t_plan, plan = later[0]
            ctx["samples"].append(t_plan - t_up)
            ctx["from_quote"].append(t_plan - ctx["t_quote"])
            ctx["solve"].append(plan.plan.solve_s)
            q = ctx["restore"]
            ctx["t_quote"] = time.perf_counter()
            mesh.send(PRICE_WATCHER, MarketQuotes(t, "bench", (q,), full=False), source=MARKET_SOURCE)
            ctx["phase"] = "restore"
            return
        if phase == "restore" and plans_after(ctx["t_quote"]):
            ctx["phase"] = "inject" if len(ctx["samples"]) < runs else "done"
            if ctx["phase"] == "done":
                stop.set()

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:

        async def on_start(mesh: Mesh, cm: CoralMesh) -> None:
            ctx["mesh"] = mesh
            tg.start_soon(listen, await mesh.client("bench", subscribe=["mkt.update", "plan.new"], inbox_size=1 << 14))

        res = await run_mesh(setup, sc, cat, perf, pace=speed, stop=stop, state=st, on_start=on_start, on_step=on_step)
    samples = sorted(ctx["samples"])
    if not samples:
        raise RuntimeError(f"no stockout reaction measured (run ended at t={res.end}: {res.reason})")
    workers = sum(len(i.node_ids) for i in st.fleet.instances) if st.fleet else 0

    def q(xs: list[float], p: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))]

    return {
        "bench": "reaction",
        "scenario": "core",
        "runs": len(samples),
        "speed": speed,
        "columns": columns,
        "instances": len(st.fleet.instances) if st.fleet else 0,
        "nodes": workers,
        "mkt_update_to_plan_p50_s": round(statistics.median(samples), 3),
        "mkt_update_to_plan_p90_s": round(q(samples, 0.9), 3),
        "mkt_update_to_plan_max_s": round(samples[-1], 3),
        "quote_to_plan_p50_s": round(statistics.median(ctx["from_quote"]), 3),
        "solve_p50_s": round(statistics.median(ctx["solve"]), 3),
        "solve_max_s": round(max(ctx["solve"]), 3),
        "virtual_s": round(res.end - setup.timing.warmup_s * -1, 1),
        "wall_s": round(time.perf_counter() - t0, 1),
    }


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    if not args.skip_bus:
        for transport in ("inproc", "tcp", "tcp+curve"):
            for kind, n in (("small", args.small), ("plan", args.plan)):
                results.append({"bench": "throughput", **await bus_bench.throughput(transport, kind, n, args.window)})
                results.append({"bench": "latency", **await bus_bench.latency(transport, kind, args.rtt)})
    for columns in args.columns:
        results.append(await reaction(args.store, args.runs, args.speed, args.warmup, columns))
    return results


def cli() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--small", type=int, default=100_000, help="small messages per throughput run")
    parser.add_argument("--plan", type=int, default=2_000, help="plan messages per throughput run")
    parser.add_argument("--window", type=int, default=2_000, help="most messages in flight")
    parser.add_argument("--rtt", type=int, default=2_000, help="round trips per latency run")
    parser.add_argument("--runs", type=int, default=20, help="stockout rounds (default 20)")
    parser.add_argument("--speed", type=float, default=60.0, help="scenario seconds per wall second (default 60)")
    parser.add_argument("--warmup", type=float, default=30.0, help="scenario seconds before the first stockout")
    parser.add_argument("--store", type=Path, default=DEFAULT_STORE, help=f"template store (default {DEFAULT_STORE})")
    parser.add_argument(
        "--columns",
        nargs="+",
        default=["all", "generated"],
        choices=("all", "generated"),
        help="allocation column modes to measure the reaction with (default: both)",
    )
    parser.add_argument("--skip-bus", action="store_true", help="only the reaction time")
    parser.add_argument("--json", action="store_true", help="print JSON lines")
    args = parser.parse_args()
    build = ensure_core_store(args.store)
    results = [{"bench": "templates", **build}, *anyio.run(main, args, backend="asyncio")]
    for r in results:
        if args.json:
            print(json.dumps(r))
        elif r["bench"] == "throughput":
            print(f"throughput {r['transport']:9} {r['message']:5} {r['msgs_per_s']:>9,} msg/s  dropped={r['dropped']}")
        elif r["bench"] == "latency":
            lat = f"p50={r['rtt_p50_us']:>8} us  p99={r['rtt_p99_us']:>8} us"
            print(f"latency    {r['transport']:9} {r['message']:5} {lat}")
        elif r["bench"] == "templates":
            print(f"templates  core N_max {r['nmax']} in {r['store']}: {r['templates_kept']} kept ({r['build_s']} s)")
        else:
            print(
                f"reaction   core, columns={r['columns']}, {r['runs']} stockouts at speed {r['speed']:g} "
                f"({r['instances']} instances, "
                f"{r['nodes']} nodes): MarketUpdate -> Plan p50 {r['mkt_update_to_plan_p50_s']} s, "
                f"p90 {r['mkt_update_to_plan_p90_s']} s (solve p50 {r['solve_p50_s']} s); "
                f"quote -> Plan p50 {r['quote_to_plan_p50_s']} s"
            )


if __name__ == "__main__":
    cli()
