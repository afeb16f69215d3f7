"""Mesh benchmark: how fast the actor mesh runs a scenario, and where its time goes.

Runs the whole mesh in this process, as ``coral up`` does (``run_mesh`` on the simulated cloud and
engines, on a virtual clock, the start-up heap frozen: ``freeze_heap``), on a bundled scenario (default:
``default``, one hour), from a template store that already holds its library (``coral up --store STORE``
builds it on first use).

- ``--speed max`` (the default): as fast as possible; reported: wall seconds, CPU seconds of this
  process, simulated seconds per wall second (target: the default hour in at most 60 s wall);
- ``--speed N``: paced at N simulated seconds per wall second; reported: how far the clock fell behind
  the pace at its worst, when, and at each sixth of the run (target at 60: never more than 5 s behind),
  and the worst lag an idle core would have given, from each step's CPU time (``idle_core``: on a shared
  machine the measured lag is mostly the machine's);
- the plans with their triggers and times, each plan's landing (the kernel time it was published) and
  delay (landing minus start: the deadline D at ``--speed max``, later when paced and the answer came
  after D: ``actors.allocator``), the allocator's own wall time per plan (building the problem, handing
  it to the solver process, the solve it waited for, turning the result into the plan), the start-up
  time, and the slowest steps of the clock with the actors busy in each;
- plans are solved under the scenario's deadline, as ``coral up`` does; ``--no-deadline`` solves each to
  completion (the deterministic run, in the mesh and in ``--compare``'s simulator);
- ``--policy pd-homo`` plans every deployment as prefill/decode pairs (the KV handoff path), as
  ``coral up --policy``;
- per actor (workers summed as ``worker-*``): messages handled, timer calls (ticks) and the wall time
  spent in them, the share of the run's wall time, and the bus totals (routed, published);
- ``--profile FILE``: a cProfile of the run (``python -m pstats FILE``); ``--profile-window T0:T1`` limits it
  to the steps between those simulated times (the demand peak: ``1800:2400``);
- ``--hog``: runs one CPU-bound process beside the mesh for the whole run (the issue's targets are set
  on a 2-core machine with one other CPU-bound process running);
- ``--solver-nice K``: the allocator's solver process runs K nice levels below the mesh (``run_mesh``'s
  ``solver_nice``); each plan's solver status, gap, cost and unmet demand are printed, and their summary,
  to weigh what a slower solve costs the plans against what it gives the paced clock;
- ``--compare``: also runs the simulator on the same scenario, seed and planner, on the mesh's own
  requests (``deployment_arrivals``), with the mesh's provisioning and loading delays and its demand
  monitor (``SimConfig.for_cloud``), and prints each
  deployment's SLO attainment and share of requests served in both (target: within 1 point).

The machine's load average is printed with the figures: they depend on it. Run
``python bench/mesh.py [--scenario default] [--store PATH] [--speed max|N] [--duration S] [--json]``
(``just bench mesh``).
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402

from actors.allocator import publish_delay  # noqa: E402
from actors.compose import CoralMesh, RunOptions, library_for, make_setup, run_mesh  # noqa: E402
from actors.watch import RunState  # noqa: E402
from coral.catalog import load_catalog  # noqa: E402
from coral.cli.planning import PLAN_POLICIES, make_planner  # noqa: E402
from coral.cli.up_status import summarize  # noqa: E402
from coral.kernel import Mesh  # noqa: E402
from coral.messages.plan import NewPlan  # noqa: E402
from coral.perf import PerfModel  # noqa: E402
from coral.plan import Plan  # noqa: E402
from coral.scenario import load_scenario  # noqa: E402
from coral.sim import SimConfig, simulate  # noqa: E402
from coral.sim.arrivals import deployment_arrivals  # noqa: E402
from coral.store import TemplateStore, default_store_path  # noqa: E402
from solvers.allocation import SolverEffort, solve_allocation  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", default="default", help="scenario NAME (bundled) or FILE (default: default)")
    p.add_argument("--store", type=Path, default=None, help="template store (default: the user data dir)")
    p.add_argument("--speed", default="max", help="'max' or simulated seconds per wall second (default: max)")
    p.add_argument("--duration", type=float, default=None, help="simulated seconds (default: the scenario's)")
    p.add_argument(
        "--no-deadline",
        action="store_true",
        help="solve every plan to completion, as `coral up --no-deadline` (default: under the scenario's deadline)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the arrivals (default: 0)")
    p.add_argument(
        "--policy",
        choices=PLAN_POLICIES,
        default="coral",
        help="planner policy, as `coral up --policy` (default: coral; pd-homo runs every model as a P/D pair)",
    )
    p.add_argument("--profile", type=Path, default=None, help="write a cProfile of the run here")
    p.add_argument(
        "--profile-window",
        default=None,
        metavar="T0:T1",
        help="with --profile: profile only the steps between simulated times T0 and T1 (e.g. the peak)",
    )
    p.add_argument("--hog", action="store_true", help="run one CPU-bound process beside the mesh (busy loop)")
    p.add_argument(
        "--solver-nice",
        type=int,
        default=0,
        metavar="K",
        help="lower the solver process's CPU priority by K, 0-19 (default: 0, as `coral up`)",
    )
    p.add_argument("--compare", action="store_true", help="also run `coral simulate` and compare attainment")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p.parse_args()


class PlanLog(RunState):
    """The run's watcher state, plus each plan's simulated start, trigger and landing."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[float, str, float]] = []
        self.plan_log: list[Plan] = []

    def update(self, env: Any) -> None:
        super().update(env)
        if isinstance(env.msg, NewPlan):
            landed = self.landed if self.landed is not None else math.nan
            self.log.append((env.msg.plan.at, env.msg.plan.trigger, landed))
            self.plan_log.append(env.msg.plan)


def plan_quality(plans: list[Plan]) -> dict[str, Any]:
    """The plans' solver statuses, gaps, mean cost and mean unmet demand (what a slower solve would worsen)."""
    n = max(1, len(plans))
    return {
        "statuses": dict(Counter(p.status for p in plans).most_common()),
        "gap": {k: round(v, 5) for k, v in spread([p.gap for p in plans]).items()},
        "mean_cost_per_hour": round(sum(p.cost_per_hour for p in plans) / n, 2),
        "mean_unmet_rps": round(sum(p.unmet_rps for p in plans) / n, 3),
    }


def spread(xs: list[float]) -> dict[str, float]:
    """Median and maximum of ``xs`` (NaN when empty)."""
    if not xs:
        return {"p50": math.nan, "max": math.nan}
    ys = sorted(xs)
    return {"p50": ys[len(ys) // 2], "max": ys[-1]}


def worst(trace: list[tuple[float, float, float]], speed: float | None) -> dict[str, float]:
    """The step at which the clock was furthest behind the pace (the first, at max speed)."""
    if not trace:
        return {"t": math.nan, "wall_s": math.nan, "behind_s": 0.0}
    wall, t, lag = max(trace, key=lambda r: r[2]) if speed is not None else trace[0]
    return {"t": t, "wall_s": round(wall, 2), "behind_s": round(lag, 2)}


SLOW_STEP_S = 0.002
"""Steps of at least this much wall time get the actors busy in them recorded (``StepBusy``)."""


class StepBusy:
    """The actors' busy wall seconds in each step, the workers summed as ``worker-*``; recorded for slow
    steps only, and the actor list read once per simulated second (workers come and go), so that the
    bench's own work per step, which runs in the mesh's thread, stays small beside the mesh's."""

    def __init__(self, mesh: Any) -> None:
        self.mesh = mesh
        self.names: list[str] = []
        self.counters: list[Any] = []
        self.prev: list[float] = []
        self.second = math.nan

    def step(self, t: float, slow: bool) -> dict[str, float]:
        """Busy seconds per actor since the previous step (empty unless ``slow``)."""
        if math.floor(t) != self.second:
            self.second = math.floor(t)
            before = dict(zip(self.names, self.prev, strict=True))
            got = self.mesh.counters()
            self.names, self.counters = list(got), list(got.values())
            self.prev = [before.get(n, 0.0) for n in self.names]  # a new actor's time so far lands here
        now = [c.busy_s for c in self.counters]
        out: dict[str, float] = {}
        if slow:
            for name, a, b in zip(self.names, self.prev, now, strict=True):
                key = "worker-*" if name.startswith("worker-") else name
                out[key] = out.get(key, 0.0) + b - a
        self.prev = now
        return {k: v for k, v in out.items() if v > 1e-3}


def slowest(trace: list[tuple[float, float, float]], busy: list[dict[str, float]], n: int = 8) -> list[dict[str, Any]]:
    """The ``n`` steps that took the most wall time (the first from the clock's start), slowest first,
    each with the actors that were busy in it."""
    steps = [(trace[0][0], trace[0][1], 0)] if trace else []
    steps += [(b[0] - a[0], b[1], i + 1) for i, (a, b) in enumerate(itertools.pairwise(trace))]
    steps.sort(key=lambda r: -r[0])
    return [
        {
            "step_wall_s": round(d, 3),
            "t": t,
            "busy": {k: round(v, 3) for k, v in sorted(busy[i].items(), key=lambda kv: -kv[1])[:3]},
        }
        for d, t, i in steps[:n]
    ]


def idle_core(steps: list[tuple[float, float]], v0: float, speed: float | None) -> dict[str, Any]:
    """The pace an idle core would have kept, estimated from the CPU time of each step (this process
    only: the mesh runs on one thread; the solver process has a core of its own): each step starts at
    its paced wall time or when the one before it ended, whichever is later, and lasts its CPU time. A
    loaded machine stretches wall time, not CPU time much, so this shows what the mesh itself costs.
    Returns the CPU seconds of the slowest steps, of the busiest simulated minute (at ``--speed 60`` a
    minute has one wall second: more than 1 s of CPU in it cannot keep pace) and, paced, the worst lag
    (simulated s) this gives."""
    slow = sorted(steps, key=lambda r: -r[1])[:5]
    out: dict[str, Any] = {"slowest_cpu": [{"t": t, "cpu_s": round(c, 3)} for t, c in slow]}
    per_min: dict[int, float] = {}
    for t, c in steps:
        per_min[math.floor(t / 60)] = per_min.get(math.floor(t / 60), 0.0) + c
    if per_min:
        k, c = max(per_min.items(), key=lambda kv: kv[1])
        out["busiest_minute"] = {"t": 60 * k, "cpu_s": round(c, 2)}  # CPU s per 60 simulated s
    if speed is not None:
        wall, worst, at = 0.0, 0.0, math.nan
        for t, c in steps:
            wall = max(wall, (t - v0) / speed) + c
            lag = wall * speed - (t - v0)
            if lag > worst:
                worst, at = lag, t
        out["behind_s"], out["behind_at"] = round(worst, 2), at
    return out


def behind_at(trace: list[tuple[float, float, float]], duration_s: float, parts: int = 6) -> list[list[float]]:
    """How far behind the pace (simulated s) the clock was at each ``duration_s / parts`` of the run."""
    out = []
    for k in range(parts + 1):
        at = k * duration_s / parts
        row = next((r for r in trace if r[1] >= at), trace[-1] if trace else None)
        if row is not None:
            out.append([round(row[1]), round(row[2], 1)])
    return out


def profile_window(text: str | None) -> tuple[float, float] | None:
    """``T0:T1`` as simulated times (None when not given)."""
    if text is None:
        return None
    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError:
        raise SystemExit(f"--profile-window: expected T0:T1 (simulated seconds), got {text!r}") from None
    if not lo < hi:
        raise SystemExit(f"--profile-window: expected T0 < T1, got {text!r}")
    return lo, hi


def main() -> None:
    args = parse()

    speed = None if args.speed == "max" else float(args.speed)
    window = profile_window(args.profile_window)
    if window is not None and args.profile is None:
        raise SystemExit("--profile-window: needs --profile FILE (where the profile is written)")
    if speed is not None and not (math.isfinite(speed) and speed > 0):
        raise SystemExit(f"--speed: expected 'max' or a number > 0, got {args.speed!r}")
    if not 0 <= args.solver_nice <= 19:
        raise SystemExit(f"--solver-nice: expected an integer from 0 to 19, got {args.solver_nice}")
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
    setup = make_setup(
        sc,
        cat,
        perf,
        lib,
        RunOptions(seed=args.seed, policy=args.policy, deterministic=args.no_deadline, duration_s=args.duration),
    )
    state = PlanLog()
    meshes: list[Mesh] = []
    behind = [0.0]
    trace: list[tuple[float, float, float]] = []  # (wall s since start, simulated t, s behind the pace)
    busy: list[dict[str, float]] = []  # per step: the actors' busy wall seconds in it (workers summed)
    step_busy: list[StepBusy] = []
    t0: list[float] = []

    cms: list[CoralMesh] = []

    async def on_start(mesh: Mesh, cm: CoralMesh) -> None:
        meshes.append(mesh)
        cms.append(cm)
        step_busy.append(StepBusy(mesh))
        t0.extend((time.monotonic(), mesh.clock.now(), time.process_time()))
        started.append(t0[0] - started[0])

    cpu_steps: list[tuple[float, float]] = []  # per step: (simulated t, CPU s of this process in it)
    prof = cProfile.Profile() if args.profile is not None else None
    profiling = [False]

    def on_step(t: float) -> None:
        if prof is not None and window is not None:  # the steps that follow t, while t is inside
            inside = window[0] <= t < window[1]
            if inside and not profiling[0]:
                prof.enable()
            elif not inside and profiling[0]:
                prof.disable()
            profiling[0] = inside
        if t0:
            cpu = time.process_time()
            cpu_steps.append((t, cpu - t0[2]))
            wall = time.monotonic() - t0[0]
            lag = wall * speed - (t - t0[1]) if speed is not None else 0.0
            behind[0] = max(behind[0], lag)
            slow = wall - (trace[-1][0] if trace else 0.0) >= SLOW_STEP_S
            trace.append((wall, t, lag))
            busy.append(step_busy[0].step(t, slow))
            t0[2] = time.process_time()  # the bench's own bookkeeping is no step's CPU

    def solve(prob: Any, **kw: Any) -> Any:
        """The simulator's solves: to completion with --no-deadline, as the mesh's (else under the deadline)."""
        if args.no_deadline:
            kw["effort"] = SolverEffort()
        return solve_allocation(prob, **kw)

    def compare(mesh_summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
        with TemplateStore(Path(store), readonly=True) as st:
            plan_fn, templates = make_planner(args.policy, sc, cat, perf, st, solve=solve)
        delay = publish_delay(setup.deadline_s, setup.deterministic)  # plans take effect when the mesh's do
        cfg = SimConfig.for_cloud(setup.cloud, monitor=setup.demand, plan_delay_s=delay)
        arrivals = deployment_arrivals(
            sc, seed=args.seed, end_s=dur, length_dist=cfg.length_dist, cv_in=cfg.cv_in, cv_out=cfg.cv_out
        )  # the mesh's own requests
        sim = simulate(
            sc, templates, perf, plan_fn, seed=args.seed, duration_s=dur, config=cfg, arrivals=arrivals
        ).to_json()
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

    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.hog else None
    try:
        started = [time.monotonic()]
        load0 = os.getloadavg()
        cpu0 = time.process_time()
        if prof is not None and window is None:
            prof.enable()
        res = anyio.run(
            lambda: run_mesh(
                setup,
                sc,
                cat,
                perf,
                pace=speed,
                state=state,
                on_start=on_start,
                on_step=on_step,
                freeze_heap=True,
                solver_nice=args.solver_nice,
            ),
            backend="asyncio",
        )
        if prof is not None:
            prof.disable()  # idempotent, also after a window
            prof.dump_stats(str(args.profile))
        cpu = time.process_time() - cpu0
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    mesh = meshes[0]
    alloc = cms[0].allocator
    assert alloc is not None
    per: dict[str, dict[str, float]] = {}
    for name, c in mesh.counters().items():
        key = "worker-*" if name.startswith("worker-") else name
        row = per.setdefault(key, {"actors": 0, "handled": 0, "ticks": 0, "busy_s": 0.0})
        row["actors"] += 1
        row["handled"] += c.handled
        row["ticks"] += c.timers
        row["busy_s"] += c.busy_s
    dur = args.duration if args.duration is not None else sc.duration_s
    simulated = res.end + setup.timing.warmup_s  # the run starts warmup_s before the scenario's time 0
    out: dict[str, Any] = {
        "scenario": sc.name,
        "speed": args.speed,
        "hog": args.hog,
        "simulated_s": simulated,
        "wall_s": round(res.wall_s, 2),
        "cpu_s": round(cpu, 2),
        "x_real_time": round(simulated / res.wall_s, 1),
        "max_behind_s": round(behind[0], 2) if speed is not None else None,
        "start_s": round(started[-1], 2),
        "first_step_s": round(trace[0][0], 2) if trace else None,
        "worst": worst(trace, speed),
        "slowest_steps": slowest(trace, busy),
        "idle_core": idle_core(cpu_steps, t0[1] if t0 else 0.0, speed),
        "behind_at": behind_at(trace, dur) if speed is not None else None,
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "plans": len(state.log),
        "plan_times": [round(t) for t, _, _ in state.log],
        "plan_triggers": dict(Counter(trigger for _, trigger, _ in state.log).most_common()),
        "deadline_s": setup.deadline_s,
        "landing": cms[0].landing,
        "solver_nice": args.solver_nice,
        "plan_landings": [
            {
                "trigger": trig,
                "at": t,
                "landed": round(land, 3),
                "delay_s": round(land - t, 3),
                "status": p.status,
                "gap": round(p.gap, 5),
                "cost_per_hour": round(p.cost_per_hour, 2),
                "unmet_rps": round(p.unmet_rps, 3),
                "solve_s": round(p.solve_s, 3),
            }
            for (t, trig, land), p in zip(state.log, state.plan_log, strict=True)
        ],
        "plan_quality": plan_quality(state.plan_log),
        "plan_delay_s": {k: round(v, 3) for k, v in spread([land - t for t, _, land in state.log]).items()},
        "allocator_ms": {
            part: {k: round(1e3 * v, 1) for k, v in spread([getattr(x, part) for x in alloc.times]).items()}
            for part in ("build_s", "submit_s", "wait_s", "finish_s")
        },
        "bus": {"routed": mesh.broker.stats.routed, "published": mesh.broker.stats.published},
        "actors": {k: {**v, "busy_s": round(v["busy_s"], 3)} for k, v in sorted(per.items())},
    }
    if args.compare:
        out["compare"] = compare(summarize(setup, res.state, res.end, res.reason, res.wall_s, None))
    if args.json:
        print(json.dumps(out, indent=1))
        return
    beside = ", beside a CPU hog" if args.hog else ""
    print(
        f"mesh bench: scenario {sc.name}, speed {args.speed}{beside}, load {out['load_before']} -> {out['load_after']}"
    )
    print(
        f"  {simulated:.0f} simulated s in {res.wall_s:.1f} s wall ({out['x_real_time']}x real time), "
        f"{cpu:.1f} s CPU; bus: {out['bus']['routed']} routed, {out['bus']['published']} published"
    )
    print(f"  {out['plans']} plans, by trigger: {out['plan_triggers']}; at simulated t: {out['plan_times']}")
    d = out["plan_delay_s"]
    print(
        f"  plan delay (landing - start, simulated s; D = {setup.deadline_s:g} s, plans land on {out['landing']}): "
        f"median {d['p50']:.2f}, max {d['max']:.2f}; per plan (trigger start -> landing +delay):"
    )
    for r in out["plan_landings"]:
        print(
            f"    {r['trigger']:<24} t={r['at']:>9.3f} -> {r['landed']:>9.3f}  +{r['delay_s']:<7.3f} "
            f"{r['status']}, gap {r['gap']:.4f}, ${r['cost_per_hour']:.2f}/h, unmet {r['unmet_rps']:.2f} rps, "
            f"solve {r['solve_s']:.2f} s"
        )
    q = out["plan_quality"]
    print(
        f"  plans (solver process at nice +{args.solver_nice}): {q['statuses']}; gap median {q['gap']['p50']:.4f}, "
        f"max {q['gap']['max']:.4f}; mean ${q['mean_cost_per_hour']:.2f}/h, mean unmet {q['mean_unmet_rps']:.3f} rps"
    )
    a = out["allocator_ms"]
    print(
        "  allocator per plan, wall ms (median / max): "
        + ", ".join(f"{k[:-2]} {v['p50']:.1f} / {v['max']:.1f}" for k, v in a.items())
        + " (build, submit and finish hold the clock; wait is the solve, held only at --speed max)"
    )
    print(
        f"  start-up: {out['start_s']:.2f} s wall to the actors' start, then {out['first_step_s']:.2f} s to the "
        "clock's first step"
    )
    if speed is not None:
        w = out["worst"]
        print(
            f"  at most {behind[0]:.2f} simulated s ({behind[0] / speed:.2f} s wall) behind the pace, "
            f"at simulated t={w['t']:.0f} ({w['wall_s']:.1f} s into the run)"
        )
        print("  behind the pace (simulated t: s): " + ", ".join(f"{t}: {b}" for t, b in out["behind_at"]))
    ic = out["idle_core"]
    print(
        "  on an idle core (each step's CPU time, paced): "
        + (f"at most {ic['behind_s']:.2f} simulated s behind at t={ic['behind_at']:.0f}; " if speed else "")
        + "slowest steps' CPU: "
        + ", ".join(f"{r['cpu_s']:.3f} s at t={r['t']:.0f}" for r in ic["slowest_cpu"])
    )
    if "busiest_minute" in ic:
        b = ic["busiest_minute"]
        print(
            f"  busiest simulated minute: t={b['t']}-{b['t'] + 60}, {b['cpu_s']:.2f} s of CPU "
            f"({b['cpu_s']:.2f} cores at --speed 60)"
        )
    print("  slowest steps (wall s, ending at simulated t, busiest actors in it):")
    for r in out["slowest_steps"]:
        who = ", ".join(f"{k} {v:.2f} s" for k, v in r["busy"].items())
        print(f"    {r['step_wall_s']:.2f} s at t={r['t']:.0f}: {who}")
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
