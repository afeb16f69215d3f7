"""A synthetic bus journal for the TUI's replay and snapshot tests, built from the message classes.

It tells a short story on the bundled default scenario's market (two regions, ten node types): a run is
set up with heterogeneous templates (an L40S + H100 pipeline, a data-parallel L4 tail), the first plan
starts instances, they load and serve, traffic statistics come in, the router crashes and restarts, an
H100 stockout forces a re-plan, a node is lost, an operator overrides a demand, a worker gives up, and
the run ends. Regenerate the fixture with ``python -m tests.tui.synth`` (then review the snapshots).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from coral.catalog import load_catalog
from coral.kernel import ActorCrashed, ActorGaveUp, ActorRestarted, ErrorEvent, Fsync, Journal, PeerLost, encode
from coral.messages import (
    CommandResult,
    DemandUpdate,
    DeploymentTraffic,
    FleetAction,
    FleetUpdate,
    InstanceInfo,
    MarketUpdate,
    MeshEnd,
    MeshSetup,
    NewPlan,
    NodeLost,
    PendingStart,
    PlanChange,
    Quote,
    RoutingStats,
    SetDemand,
    SloChanged,
)
from coral.messages.mesh import CloudSetup, DemandTuning, MeshTiming
from coral.plan import DeploymentServing, Plan, PlannedInstances
from coral.scenario import load_scenario
from coral.templates import Route, Stage, Template
from coral.workload import Slo, WorkloadShape

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "journals" / "tui-demo.jrnl"

CHAT = Slo(2.0, 0.1, 0.9)
CODE = Slo(1.0, 0.05, 0.9)
CHAT_SHAPE = WorkloadShape(1155, 211)
CODE_SHAPE = WorkloadShape(2048, 28)
DEPLOYMENTS = {"chat-8b": "llama-3.1-8b", "code-14b": "qwen3-14b", "chat-32b": "qwen3-32b"}
GPU = {
    "g6e.xlarge": "l40s-48g",
    "g6e.12xlarge": "l40s-48g",
    "g6.xlarge": "l4-24g",
    "g6.12xlarge": "l4-24g",
    "g5.xlarge": "a10g-24g",
    "p5.4xlarge": "h100-80g",
    "p4d.24xlarge": "a100-40g",
    "a2-highgpu-1g": "a100-40g",
    "a2-ultragpu-1g": "a100-80g",
    "g2-standard-4": "l4-24g",
}
TP = {"g6e.12xlarge": 4, "g6.12xlarge": 4, "p4d.24xlarge": 8}


def _template(
    tid: str,
    model: str,
    layers: int,
    slo: Slo,
    shape: WorkloadShape,
    stages: list[tuple[str, int, int]],
    rps: float,
    mode: str = "aggregated",
) -> Template:
    st = tuple(
        Stage(i, node, GPU[node], TP.get(node, 1), s, e, 32, 40e9, 0.02, 0.2) for i, (node, s, e) in enumerate(stages)
    )
    heads = [s.index for s in st if s.start == 0]
    tails = [s.index for s in st if s.end == layers]
    routes = [Route(-1, h, rps) for h in heads] + [Route(t, -2, rps) for t in tails]
    for a in st:
        routes.extend(Route(a.index, b.index, rps) for b in st if b.start == a.end)
    tok = rps * shape.mean_in * 2
    return Template(
        tid,
        model,
        layers,
        mode,
        slo,
        shape,
        tuple(n for n, _, _ in stages),
        st,
        tuple(routes),
        tok,
        tok / 5,
        slo.ttft_s * 0.8,
        slo.tpot_s * 0.8,
        "roofline-1",
        "optimal",
        0.0,
        0.0,
        "milp",
        0.5,
    )


TEMPLATES = [
    _template("a1c8e3f0b2d4e6f8a0b2c4d6", "llama-3.1-8b", 32, CHAT, CHAT_SHAPE, [("g6e.xlarge", 0, 32)], 3.2),
    _template(
        "b7d2c1e9f3a5b7c9d1e3f5a7",
        "llama-3.1-8b",
        32,
        CHAT,
        CHAT_SHAPE,
        [("g6.xlarge", 0, 16), ("g6.xlarge", 16, 32)],
        1.9,
    ),
    _template("c3e5a7b9d1f3a5c7e9b1d3f5", "qwen3-14b", 40, CODE, CODE_SHAPE, [("a2-highgpu-1g", 0, 40)], 2.1),
    _template(
        "d9f1b3d5e7a9c1e3a5b7d9f1",
        "qwen3-14b",
        40,
        CODE,
        CODE_SHAPE,
        [("g2-standard-4", 0, 14), ("g2-standard-4", 14, 27), ("g2-standard-4", 27, 40)],
        1.2,
    ),
    _template(
        "e2a4c6e8a0c2e4a6c8e0a2c4",
        "qwen3-32b",
        64,
        CHAT,
        CHAT_SHAPE,
        [("g6e.12xlarge", 0, 40), ("p5.4xlarge", 40, 64)],
        2.6,
    ),
    _template(
        "f5b7d9f1b3d5f7b9d1f3b5d7",
        "qwen3-32b",
        64,
        CHAT,
        CHAT_SHAPE,
        [("g6e.xlarge", 0, 30), ("g6.xlarge", 30, 64), ("g6.xlarge", 30, 64)],
        1.4,
    ),
]
BY_ID = {t.id: t for t in TEMPLATES}
DEPLOYMENT_OF = {t.id: next(d for d, m in DEPLOYMENTS.items() if m == t.model) for t in TEMPLATES}


class _Writer:
    def __init__(self, journal: Journal) -> None:
        self.j = journal

    def publish(self, t: float, source: str, msg: object) -> None:
        tag, body = encode(msg)
        self.j.append(t, "publish", source, tag.decode(), tag.decode(), body)

    def send(self, t: float, source: str, dest: str, msg: object) -> None:
        tag, body = encode(msg)
        self.j.append(t, "send", source, dest, tag.decode(), body)


def _market(
    t: float,
    seq: int,
    base: dict[tuple[str, str], tuple[float, int]],
    changed: Iterable[tuple[str, str]],
    reason: str = "source",
    overridden: tuple[str, ...] = (),
) -> MarketUpdate:
    quotes = tuple(Quote(r, n, p, a) for (r, n), (p, a) in sorted(base.items()))
    ch = set(changed)
    return MarketUpdate(seq, t, quotes, tuple(q for q in quotes if q.key in ch), overridden, reason)


def _plan(
    seq: int,
    t: float,
    trigger: str,
    counts: dict[tuple[str, str], int],
    prices: dict[tuple[str, str], float],
    demand: dict[str, float],
) -> Plan:
    insts = []
    cap = dict.fromkeys(DEPLOYMENTS, 0.0)
    for (tid, region), n in sorted(counts.items()):
        tpl = BY_ID[tid]
        dep = DEPLOYMENT_OF[tid]
        cost = sum(prices[(region, node)] for node in tpl.nodes)
        rps = tpl.prefill_tok_s / (2 * tpl.shape.mean_in)
        cap[dep] += n * rps
        insts.append(PlannedInstances(dep, tid, region, n, tpl.nodes, tpl.mode, round(cost, 3), round(rps, 3)))
    serving = tuple(
        DeploymentServing(d, m, demand[d], round(cap[d], 3), round(max(0.0, demand[d] - cap[d]), 3))
        for d, m in DEPLOYMENTS.items()
    )
    total = round(sum(i.cost_per_hour * i.count for i in insts), 3)
    gap = 0.004 if trigger.startswith("market") else 0.0
    status = "time_limit" if gap else "optimal"
    return Plan(
        seq, t, "coral", trigger, tuple(insts), serving, total, 0.0, status, gap, total * (1 - gap), 0.05 + seq / 100
    )


def _diff(plan: Plan, prev: Plan | None) -> tuple[PlanChange, ...]:
    return tuple(PlanChange(d, tid, r, n) for (d, tid, r), n in plan.diff(prev).items())


def setup_message() -> MeshSetup:
    """The run's setup record: the default scenario with the synthetic templates."""
    cat = load_catalog([])
    sc = load_scenario("default", cat)
    return MeshSetup(
        "default",
        "fixtures/scenarios/default.toml",
        Path(sc.path).read_text(),
        7,
        "coral",
        600.0,
        1.0,
        MeshTiming(drain_s=60.0),
        CloudSetup(),
        DemandTuning(),
        True,
        True,
        (),
        (),
        "synthetic",
        "roofline-1",
        tuple(TEMPLATES),
    )


def write(path: Path) -> None:
    """Write the demo journal to ``path`` (replacing it)."""
    cat = load_catalog([])
    sc = load_scenario("default", cat)
    prices, avail = sc.market_at(cat, 0.0)
    base = {k: (prices[k], avail[k]) for k in sorted(prices)}
    if path.exists():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    with Journal.open(path, fsync=Fsync.NEVER) as j:
        w = _Writer(j)
        w.publish(-10.0, "mesh", setup_message())
        demand = {"chat-8b": 6.0, "code-14b": 3.0, "chat-32b": 2.0}
        w.publish(0.0, "price-watcher", _market(0.0, 1, base, base))
        w.publish(0.0, "demand-monitor", DemandUpdate(1, 0.0, dict(demand), dict(demand), (), "initial"))
        counts1 = {
            ("a1c8e3f0b2d4e6f8a0b2c4d6", "aws-us-east-1"): 2,
            ("b7d2c1e9f3a5b7c9d1e3f5a7", "aws-us-east-1"): 1,
            ("c3e5a7b9d1f3a5c7e9b1d3f5", "gcp-us-central1"): 1,
            ("d9f1b3d5e7a9c1e3a5b7d9f1", "gcp-us-central1"): 1,
            ("e2a4c6e8a0c2e4a6c8e0a2c4", "aws-us-east-1"): 1,
        }
        plan1 = _plan(1, 1.0, "initial", counts1, prices, demand)
        w.publish(1.0, "allocator", NewPlan(plan1, _diff(plan1, None)))
        instances: dict[str, InstanceInfo] = {}
        num = 0
        for (tid, region), n in sorted(counts1.items()):
            for _ in range(n):
                num += 1
                tpl = BY_ID[tid]
                iid = f"i{num}"
                nodes = tuple(f"n{num}{k}" for k in range(len(tpl.nodes)))
                rps = tpl.prefill_tok_s / (2 * tpl.shape.mean_in)
                instances[iid] = InstanceInfo(
                    iid,
                    DEPLOYMENT_OF[tid],
                    tid,
                    region,
                    tpl.mode,
                    "provisioning",
                    tpl.nodes,
                    nodes,
                    f"worker-{nodes[0]}",
                    round(rps, 3),
                    1e9,
                    2.0,
                )
                w.publish(2.0, "supervisor", FleetAction(2.0, "start", iid, DEPLOYMENT_OF[tid], tid, region, "plan 1"))
        fleet_seq = 0

        def fleet(t: float, trigger: str, pending: tuple[PendingStart, ...] = (), lost: tuple[str, ...] = ()) -> None:
            nonlocal fleet_seq
            fleet_seq += 1
            live = [i for i in instances.values() if i.state in ("provisioning", "loading", "serving", "draining")]
            cost = sum(prices[(i.region, n)] for i in live for n in i.node_types)
            w.publish(
                t,
                "supervisor",
                FleetUpdate(
                    fleet_seq,
                    t,
                    tuple(live),
                    lost,
                    (),
                    (),
                    pending,
                    round(cost, 3),
                    round(cost * (t + 10) / 3600, 4),
                    trigger,
                ),
            )

        fleet(2.0, "plan")
        for iid in list(instances):
            instances[iid] = _evolve(instances[iid], state="loading", since=32.0)
        fleet(32.0, "nodes ready")
        for iid in list(instances):
            instances[iid] = _evolve(instances[iid], state="serving", since=90.0)
            i = instances[iid]
            w.publish(90.0, "supervisor", FleetAction(90.0, "serving", iid, i.deployment, i.template_id, i.region))
        fleet(90.0, "loaded")
        stats_seq = 0
        totals = {d: [0, 0, 0] for d in DEPLOYMENTS}  # completed, failed, met

        def stats(t: float, rates: dict[str, tuple[float, float]]) -> None:
            nonlocal stats_seq
            stats_seq += 1
            deps = []
            for d, (rps, att) in rates.items():
                done = round(rps * 5)
                met = round(done * att)
                c = totals[d]
                c[0] += done
                c[2] += met
                deps.append(
                    DeploymentTraffic(
                        d,
                        c[0] + 3,
                        c[0] + 2,
                        c[0],
                        c[1],
                        {},
                        0,
                        2,
                        0,
                        c[2],
                        0.4,
                        1.6,
                        0.03,
                        0.08,
                        6.0,
                        att if done else -1.0,
                    )
                )
            w.publish(t, "router", RoutingStats(stats_seq, t, tuple(deps)))

        for k in range(19, 60):
            t = 5.0 * k
            wave = 1.0 + 0.1 * ((k % 7) - 3) / 3
            stats(
                t, {"chat-8b": (6.0 * wave, 0.97), "code-14b": (3.0, 0.95 if k < 40 else 0.82), "chat-32b": (2.0, 0.93)}
            )
            if k == 40:
                w.publish(200.0, "kernel", ActorCrashed("router", "KeyError: 'i9'", 1))
                w.publish(200.0, "kernel", ActorRestarted("router", "KeyError: 'i9'", 1))
                w.publish(201.0, "kernel", ErrorEvent("kernel", "req.dispatch", "no peer named 'worker-n99'"))
            if k == 50:
                base[("aws-us-east-1", "p5.4xlarge")] = (prices[("aws-us-east-1", "p5.4xlarge")], 0)
                base[("gcp-us-central1", "g2-standard-4")] = (0.612, 64)
                changed = [("aws-us-east-1", "p5.4xlarge"), ("gcp-us-central1", "g2-standard-4")]
                w.publish(250.0, "price-watcher", _market(250.0, 2, base, changed))
                prices = {k2: v[0] for k2, v in base.items()}
                counts2 = dict(counts1)
                del counts2[("e2a4c6e8a0c2e4a6c8e0a2c4", "aws-us-east-1")]
                counts2[("f5b7d9f1b3d5f7b9d1f3b5d7", "aws-us-east-1")] = 2
                plan2 = _plan(2, 251.0, "market", counts2, prices, demand)
                w.publish(251.0, "allocator", NewPlan(plan2, _diff(plan2, plan1)))
                old = next(i for i in instances.values() if i.template_id == "e2a4c6e8a0c2e4a6c8e0a2c4")
                instances[old.id] = _evolve(old, state="draining", since=252.0)
                w.publish(
                    252.0,
                    "supervisor",
                    FleetAction(252.0, "drain", old.id, old.deployment, old.template_id, old.region, "plan 2"),
                )
                for _ in range(2):
                    num += 1
                    tpl = BY_ID["f5b7d9f1b3d5f7b9d1f3b5d7"]
                    iid = f"i{num}"
                    nodes = tuple(f"n{num}{k2}" for k2 in range(len(tpl.nodes)))
                    instances[iid] = InstanceInfo(
                        iid,
                        "chat-32b",
                        tpl.id,
                        "aws-us-east-1",
                        "aggregated",
                        "loading",
                        tpl.nodes,
                        nodes,
                        f"worker-{nodes[0]}",
                        1.4,
                        1e9,
                        252.0,
                    )
                    w.publish(
                        252.0,
                        "supervisor",
                        FleetAction(252.0, "start", iid, "chat-32b", tpl.id, "aws-us-east-1", "plan 2"),
                    )
                fleet(252.0, "plan")
            if k == 53:
                victim = instances["i2"]
                w.publish(
                    265.0, "supervisor", NodeLost(265.0, "n20", victim.region, victim.node_types[0], "i2", "heartbeat")
                )
                w.publish(
                    265.0,
                    "supervisor",
                    FleetAction(
                        265.0, "lost", "i2", victim.deployment, victim.template_id, victim.region, "node n20: heartbeat"
                    ),
                )
                del instances["i2"]
                pend = (PendingStart("chat-8b", victim.template_id, victim.region, 1),)
                fleet(265.0, "lost", pend, ("i2",))
            if k == 55:
                w.send(275.0, "tui-4242.1", "operator", SetDemand("chat-8b", 9.0, 1))
                w.publish(276.0, "demand-monitor", CommandResult("ctl.demand", True, "demand-monitor", 276.0, ref=-1))
                demand["chat-8b"] = 9.0
                est = {**demand, "chat-8b": 6.2}
                w.publish(276.0, "demand-monitor", DemandUpdate(2, 276.0, dict(demand), est, ("chat-8b",), "operator"))
                w.publish(276.0, "allocator", SloChanged("code-14b", 1.5, 0.05, 0.9, 276.0))
            if k == 57:
                w.publish(285.0, "kernel", ActorCrashed("worker-n51", "RuntimeError: engine died", 4))
                w.publish(285.0, "kernel", ActorGaveUp("worker-n51", "RuntimeError: engine died", 4))
                w.publish(286.0, "kernel", PeerLost("tui-9999.1", 12.0))
        for iid in list(instances):
            i = instances[iid]
            if i.state == "loading":
                instances[iid] = _evolve(i, state="serving", since=290.0)
        del instances[next(i.id for i in instances.values() if i.state == "draining")]
        fleet(290.0, "loaded")
        w.publish(300.0, "mesh", MeshEnd(300.0, "end of scenario"))


def _evolve(i: InstanceInfo, **kw: Any) -> InstanceInfo:
    import attrs

    return attrs.evolve(i, **kw)


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURE
    write(out)
    print(f"wrote {out}")
