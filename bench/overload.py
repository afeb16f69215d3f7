"""Overload benchmark: arrivals at 10x the fleet's capacity for a minute, then back to normal.

The fleet is fixed (static hosts: ``--hosts N`` machines of one node type, policy ``homo``), so the planner
cannot scale out of the overload (with policy ``coral`` it switches templates, and the reload leaves no
capacity for minutes: a separate finding). The demand is ``--base`` x capacity, then ``--factor`` x capacity
for ``--overload-s`` kernel seconds, then ``--base`` again. Capacity is the template's requests/s on that node
type at the deployment's shape (the router's weight). Each run is the whole mesh (``run_mesh``, as ``coral up
--speed max --record`` runs it) in a child process; the run without the overload is the baseline, and the
overload runs once with the router's default bounds and once with tight ones.

Reported per run: the peak resident memory of the kernel process (the child, which holds the kernel and
every actor: its ``ru_maxrss``), wall time, arrivals, completed, failed by reason (shed as
``queue_full`` at the router's bound, ``no_capacity`` after waiting ``queue_timeout_s``, ``queue_timeout``
in an engine), the largest number of requests open at once (from the router's reports), and, in kernel
seconds after the overload ends: when the router's queue is empty again, and when the report window's SLO
attainment is back at the deployment's target (0.9) with the queue empty (None: not within the run).

Run ``python bench/overload.py [--hosts 2] [--factor 10] [--overload-s 60] [--json]`` (``just bench
overload``). Timings depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUNNER = "import sys; from coral.cli import main; sys.exit(main(sys.argv[1:]))"
REGION = "aws-us-east-1"
NODE = "g6e.xlarge"
MODEL = "llama-3.1-8b"
SLO = "{ ttft_s = 2.0, tpot_s = 0.1, attainment = 0.9 }"
SHAPE = "{ mean_in = 512, mean_out = 128 }"
BOUNDS = {"default": (120.0, 10_000), "tight": (10.0, 500)}
"""The router's bounds compared: MeshTiming's defaults, and tight ones (10 s of work per instance, 500
waiting per deployment)."""


def scenario_text(series: list[tuple[float, float]], duration: float) -> str:
    pts = ", ".join(f"[{t:g}, {r:.4f}]" for t, r in series)
    return f"""name = "bench-overload"
description = "overload benchmark"
regions = ["{REGION}"]
node_types = ["{NODE}"]
duration_s = {duration:g}

[planner]
nmax = 2
deadline_s = 1.0
replan_interval_s = 60

[[deployment]]
name = "chat-8b"
model = "{MODEL}"
slo = {SLO}
shape = {SHAPE}
demand = {{ series = [{pts}] }}
"""


def capacity(store: Path, scenario: Path, hosts: int) -> float:
    """Requests/s the fixed fleet serves: the best single-node template's weight, times the hosts."""
    from actors.compose import library_for
    from actors.supervisor import instance_weight
    from coral.catalog import load_catalog
    from coral.scenario import load_scenario
    from coral.store import TemplateStore

    cat = load_catalog()
    sc = load_scenario(str(scenario), cat)
    (dep,) = sc.deployments
    with TemplateStore(store, readonly=True) as st:
        lib = library_for(st, sc)[dep.name]
    single = [t for t in lib if len(t.stages) == 1 and t.mode == "aggregated" and t.slo == dep.slo]
    if not single:
        raise SystemExit(f"no single-node aggregated template for {dep.name} on {NODE}")
    return hosts * max(instance_weight(t, dep) for t in single)


def child(spec: dict[str, Any]) -> None:
    """Run one mesh in this process (the "kernel process" whose memory the parent measures)."""
    import anyio

    from actors.compose import RunOptions, library_for, make_setup, run_mesh
    from coral.catalog import load_catalog
    from coral.cli.up_cmd import summarize
    from coral.messages.mesh import CloudSetup, Host, MeshTiming
    from coral.perf import PerfModel
    from coral.scenario import load_scenario
    from coral.store import TemplateStore

    cat = load_catalog()
    perf = PerfModel(cat)
    sc = load_scenario(spec["scenario"], cat)
    with TemplateStore(Path(spec["store"]), readonly=True) as st:
        lib = library_for(st, sc)
    hosts = tuple(Host(f"h{i}", REGION, NODE) for i in range(spec["hosts"]))
    timing = MeshTiming(instance_queue_s=spec["instance_queue_s"], max_queue=spec["max_queue"])
    opts = RunOptions(policy="homo", deterministic=True, timing=timing, cloud=CloudSetup(kind="hosts", hosts=hosts))
    setup = make_setup(sc, cat, perf, lib, opts)
    res = anyio.run(lambda: run_mesh(setup, sc, cat, perf, journal=spec["journal"]), backend="asyncio")
    out = summarize(setup, res.state, res.end, res.reason, res.wall_s, None)
    out["peak_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(out, default=str))


def run(
    args: argparse.Namespace, tmp: Path, name: str, series: list[tuple[float, float]], duration: float, bounds: str
) -> dict[str, Any]:
    scen = tmp / f"{name}.toml"
    scen.write_text(scenario_text(series, duration))
    journal = tmp / f"{name}-{bounds}.journal"
    iq, mq = BOUNDS[bounds]
    spec = {"scenario": str(scen), "store": str(args.store), "hosts": args.hosts, "journal": str(journal),
            "instance_queue_s": iq, "max_queue": mq}  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the mesh failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    dep = summary["deployments"]["chat-8b"]
    return {
        "run": name,
        "bounds": f"{bounds} (instance_queue_s={iq:g}, max_queue={mq})",
        "peak_rss_mib": round(summary["peak_rss_kib"] / 1024, 1),
        "wall_s": round(wall, 2),
        "arrivals": dep["arrivals"],
        "completed": dep["completed"],
        "failed_by": dep["failed_by"],
        "open_at_end": dep["open"],
        "actor_crashes": summary["actor_crashes"],
        **reports(journal, series),
    }


def reports(journal: Path, series: list[tuple[float, float]]) -> dict[str, Any]:
    """Largest open count and the recovery time, from the router's reports in the journal."""
    import coral.messages  # noqa: F401 - registers the message tags
    from coral.kernel import read_journal
    from coral.messages.requests import RoutingStats

    over_end = series[2][0] if len(series) > 2 else None
    peak_open, peak_queued, drained_at, recovered_at = 0, 0, None, None
    for r in read_journal(journal):
        if r.tag != "req.stats":
            continue
        msg = r.decode()
        assert isinstance(msg, RoutingStats)
        (d,) = msg.deployments
        peak_open = max(peak_open, d.in_flight + d.queued)
        peak_queued = max(peak_queued, d.queued)
        after = over_end is not None and msg.at > over_end
        if after and drained_at is None and d.queued == 0:
            drained_at = msg.at
        if after and recovered_at is None and d.queued == 0 and d.window_attainment >= 0.9:
            recovered_at = msg.at
    out: dict[str, Any] = {"peak_open": peak_open, "peak_waiting_in_router": peak_queued}
    if over_end is not None:
        out["drained_s"] = None if drained_at is None else round(drained_at - over_end, 1)
        out["recovery_s"] = None if recovered_at is None else round(recovered_at - over_end, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=2, help="machines in the fixed fleet (default 2)")
    ap.add_argument("--factor", type=float, default=10.0, help="overload, in capacities (default 10)")
    ap.add_argument("--base", type=float, default=0.6, help="normal load, in capacities (default 0.6)")
    ap.add_argument("--overload-s", type=float, default=60.0, help="overload length, kernel s (default 60)")
    ap.add_argument("--store", type=Path, default=None, help="template store (default: a fresh temporary one)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(json.loads(args.child))
        return
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "hosts.toml").write_text(
            "".join(f'[[host]]\nname = "h{i}"\nregion = "{REGION}"\nnode = "{NODE}"\n\n' for i in range(args.hosts))
        )
        if args.store is None:
            args.store = tmp / "templates.sqlite"
        probe = tmp / "probe.toml"
        probe.write_text(scenario_text([(0.0, 1.0)], 60.0))
        subprocess.run(
            [sys.executable, "-c", RUNNER, "templates", "build", "--scenario", str(probe), "--store", str(args.store)],
            check=True, capture_output=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        cap = capacity(args.store, probe, args.hosts)
        t_on, t_off = 60.0, 60.0 + args.overload_s
        duration = t_off + 180.0
        base = args.base * cap
        over = [(0.0, base), (t_on, args.factor * cap), (t_off, base)]
        rows = [run(args, tmp, "baseline", [(0.0, base)], duration, "default")]
        rows += [run(args, tmp, "overload", over, duration, b) for b in BOUNDS]
    result = {"capacity_rps": round(cap, 3), "hosts": args.hosts, "node": NODE, "factor": args.factor, "runs": rows}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"fixed fleet (policy homo): {args.hosts} x {NODE}, capacity {cap:.2f} req/s; overload {args.factor:g}x for "
          f"{args.overload_s:g} s from t={t_on:g}")  # fmt: skip
    for r in rows:
        print(
            f"{r['run']} {r['bounds']}: peak RSS {r['peak_rss_mib']:.1f} MiB, wall {r['wall_s']:.1f} s, "
            f"arrivals {r['arrivals']}, completed {r['completed']}, failed {r['failed_by']}, "
            f"open at end {r['open_at_end']}, peak open {r['peak_open']} "
            f"(waiting in router {r['peak_waiting_in_router']})"
            + (
                f"; after the overload: router queue empty in {r['drained_s']} s, SLO met again in {r['recovery_s']} s"
                if "recovery_s" in r
                else ""
            )
        )


if __name__ == "__main__":
    main()
