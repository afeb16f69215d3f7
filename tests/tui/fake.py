"""A small fake of ``coral up`` for the TUI's tests: one actor named ``operator`` that owns every setting,
and ``FakeInspector``, named ``allocator``, that answers the TUI's inspection requests.

``FakeCoral`` keeps a toy world (three deployments, two regions, the synthetic journal's templates),
answers each control command like its real owner would (validating names and values, replying with a
``CommandResult`` and publishing it on ``ctl.result``), and publishes what the command changed: a demand,
market or fleet update and, unless paused, a new plan. Its planner is deliberately simple (enough
instances of each deployment's cheapest allowed template, in the cheapest region that has the nodes), but
it reacts to every command the way the real mesh does, so the tests can see each change on screen.
"""

from __future__ import annotations

import math
from typing import Any

import anyio
import attrs

from coral.kernel import Actor, Envelope
from coral.messages import (
    ClockInfo,
    ClockRequest,
    CommandResult,
    DemandUpdate,
    DeploymentInfo,
    DrainInstance,
    FleetAction,
    FleetUpdate,
    ForbidTemplate,
    InstanceInfo,
    MarketUpdate,
    NewPlan,
    PauseAllocator,
    PinTemplate,
    PlanChange,
    PlanPreview,
    PreviewRequest,
    Quote,
    Replan,
    ScenarioInfo,
    ScenarioRequest,
    SetAvailability,
    SetChurn,
    SetDemand,
    SetPrice,
    SetSlo,
    SetSpeed,
    SloChanged,
    TemplateEntry,
    TemplatesReply,
    TemplatesRequest,
    is_command,
)
from coral.plan import DeploymentServing, Plan, PlannedInstances

from .synth import BY_ID, DEPLOYMENT_OF, DEPLOYMENTS, TEMPLATES, setup_message

REGIONS = ("aws-us-east-1", "gcp-us-central1")
MARKET = {
    ("aws-us-east-1", "g6e.xlarge"): (1.861, 8),
    ("aws-us-east-1", "g6.xlarge"): (0.805, 16),
    ("aws-us-east-1", "g6e.12xlarge"): (10.49, 2),
    ("aws-us-east-1", "p5.4xlarge"): (6.88, 2),
    ("gcp-us-central1", "a2-highgpu-1g"): (3.673, 4),
    ("gcp-us-central1", "g2-standard-4"): (0.705, 16),
    ("gcp-us-central1", "g6e.xlarge"): (2.10, 4),
}
SLO_FLOOR_S = 0.5
"""The fake has templates only for TTFT targets at or above this (a stricter SLO is refused)."""


def capacity(tid: str) -> float:
    t = BY_ID[tid]
    return round(t.prefill_tok_s / (2 * t.shape.mean_in), 3)


class FakeCoral(Actor):
    """The fake operator gateway and allocator (see the module docstring)."""

    def __init__(self, name: str = "operator") -> None:
        super().__init__(name)
        self.received: list[Any] = []
        self.demand = {"chat-8b": 6.0, "code-14b": 3.0, "chat-32b": 2.0}
        self.overrides: set[str] = set()
        self.market = dict(MARKET)
        self.market_over: set[str] = set()
        self.forbidden: set[str] = set()
        self.pins: dict[str, str] = {}
        self.slo = {"chat-8b": (2.0, 0.1, 0.9), "code-14b": (1.0, 0.05, 0.9), "chat-32b": (2.0, 0.1, 0.9)}
        self.churn = 1.0
        self.paused = False
        self.plan: Plan | None = None
        self.instances: dict[str, InstanceInfo] = {}
        self.seq = {"plan": 0, "fleet": 0, "market": 0, "demand": 0, "num": 0}
        self.t = 0.0
        self.behind_s = 0.0
        self.speed = 10.0
        """The pace ``ClockInfo`` says (kernel s per wall s), as ``coral up --speed 10``; ``SetSpeed`` sets it."""
        """What the fake says when asked how far behind the wall clock it is (``ClockRequest``)."""

    async def on_start(self) -> None:
        if self.plan is None:
            await self.ctx.publish(setup_message())
            await self._publish_market(list(self.market), "source")
            await self._publish_demand("initial")
            await self._replan("initial")

    def _tick(self) -> float:
        self.t += 1.0
        return self.t

    # -- publishing ----------------------------------------------------------------------------------

    async def _publish_market(self, changed: list[tuple[str, str]], reason: str) -> None:
        self.seq["market"] += 1
        quotes = tuple(Quote(r, n, p, a) for (r, n), (p, a) in sorted(self.market.items()))
        ch = tuple(q for q in quotes if q.key in set(changed))
        msg = MarketUpdate(self.seq["market"], self._tick(), quotes, ch, tuple(sorted(self.market_over)), reason)
        await self.ctx.publish(msg)

    async def _publish_demand(self, reason: str) -> None:
        self.seq["demand"] += 1
        msg = DemandUpdate(
            self.seq["demand"],
            self._tick(),
            dict(self.demand),
            dict(self.demand),
            tuple(sorted(self.overrides)),
            reason,
        )
        await self.ctx.publish(msg)

    def _allowed(self, dep: str) -> list[str]:
        if dep in self.pins:
            return [self.pins[dep]]
        return [t.id for t in TEMPLATES if DEPLOYMENT_OF[t.id] == dep and t.id not in self.forbidden]

    def _solve(self) -> dict[tuple[str, str, str], int]:
        left = {k: a for k, (_, a) in self.market.items()}
        counts: dict[tuple[str, str, str], int] = {}
        for dep in sorted(self.demand):
            options = []
            for tid in self._allowed(dep):
                nodes = BY_ID[tid].nodes
                for region in REGIONS:
                    if all((region, n) in self.market for n in nodes):
                        cost = sum(self.market[(region, n)][0] for n in nodes)
                        options.append((cost / capacity(tid), tid, region))
            need = self.demand[dep]
            for _, tid, region in sorted(options):
                nodes = BY_ID[tid].nodes
                while need > 1e-9 and all(left[(region, n)] >= nodes.count(n) for n in set(nodes)):
                    for n in nodes:
                        left[(region, n)] -= 1
                    counts[(dep, tid, region)] = counts.get((dep, tid, region), 0) + 1
                    need -= capacity(tid)
        return counts

    async def _replan(self, trigger: str) -> None:
        if self.paused:
            return
        counts = self._solve()
        insts = tuple(
            PlannedInstances(
                d,
                tid,
                r,
                n,
                BY_ID[tid].nodes,
                "aggregated",
                round(sum(self.market[(r, x)][0] for x in BY_ID[tid].nodes), 3),
                capacity(tid),
            )
            for (d, tid, r), n in sorted(counts.items())
        )
        serving = []
        for dep, model in DEPLOYMENTS.items():
            cap = sum(i.capacity_rps * i.count for i in insts if i.deployment == dep)
            serving.append(DeploymentServing(dep, model, self.demand[dep], cap, max(0.0, self.demand[dep] - cap)))
        self.seq["plan"] += 1
        cost = round(sum(i.cost_per_hour * i.count for i in insts), 3)
        at = self._tick()
        plan = Plan(
            self.seq["plan"],
            at,
            "coral",
            trigger,
            insts,
            tuple(serving),
            cost,
            0.1 * self.churn,
            "optimal",
            0.0,
            cost,
            0.01,
        )
        diff = tuple(PlanChange(d, t, r, n) for (d, t, r), n in plan.diff(self.plan).items())
        self.plan = plan
        await self.ctx.publish(NewPlan(plan, diff))
        await self._reconcile(plan, at)

    async def _reconcile(self, plan: Plan, at: float) -> None:
        live: dict[tuple[str, str, str], list[InstanceInfo]] = {}
        for i in self.instances.values():
            if i.state == "serving":
                live.setdefault(i.key, []).append(i)
        target = plan.counts()
        for key in sorted(set(live) | set(target)):
            have = sorted(live.get(key, []), key=lambda i: i.id)
            for i in have[target.get(key, 0) :]:
                del self.instances[i.id]
                await self.ctx.publish(FleetAction(at, "stop", i.id, i.deployment, i.template_id, i.region, "plan"))
            for _ in range(target.get(key, 0) - len(have)):
                self.seq["num"] += 1
                iid = f"i{self.seq['num']}"
                tpl = BY_ID[key[1]]
                nodes = tuple(f"n{self.seq['num']}{k}" for k in range(len(tpl.nodes)))
                self.instances[iid] = InstanceInfo(
                    iid,
                    key[0],
                    key[1],
                    key[2],
                    "aggregated",
                    "serving",
                    tpl.nodes,
                    nodes,
                    f"worker-{nodes[0]}",
                    capacity(key[1]),
                    1e9,
                    at,
                )
                await self.ctx.publish(FleetAction(at, "start", iid, key[0], key[1], key[2], "plan"))
        await self._publish_fleet(at, "plan")

    async def _publish_fleet(self, at: float, trigger: str, drained: tuple[str, ...] = ()) -> None:
        self.seq["fleet"] += 1
        cost = sum(self.market[(i.region, n)][0] for i in self.instances.values() for n in i.node_types)
        msg = FleetUpdate(
            self.seq["fleet"],
            at,
            tuple(sorted(self.instances.values(), key=lambda i: i.id)),
            (),
            (),
            drained,
            (),
            round(cost, 3),
            0.0,
            trigger,
        )
        await self.ctx.publish(msg)

    # -- commands ------------------------------------------------------------------------------------

    async def handle(self, env: Envelope) -> None:
        msg = env.msg
        if isinstance(msg, ClockRequest) and env.kind == "request":
            await self.ctx.reply(env, ClockInfo(self.t, self.speed, self.behind_s))
            return
        if isinstance(msg, SetSpeed):  # the pace is the driver's, as at coral up's gateway
            self.received.append(msg)
            bad = msg.problems()
            if bad is None:
                self.speed = msg.speed or 0.0
            field, reason = bad or ("", "")
            await self.ctx.reply(env, CommandResult(env.tag, bad is None, "operator", self.t, field, reason))
            return
        if not is_command(msg):
            return
        self.received.append(msg)
        bad = msg.problems() or await self._apply(msg)
        field, reason = bad if bad is not None else ("", "")
        result = CommandResult(env.tag, bad is None, "operator", self.t, field, reason, msg.ref)
        await self.ctx.publish(result)
        if env.kind == "request":
            await self.ctx.reply(env, result)
        if bad is None:
            await self._after(msg)

    async def _apply(self, msg: Any) -> tuple[str, str] | None:
        if isinstance(msg, SetDemand | SetSlo | PinTemplate) and msg.deployment not in self.demand:
            return ("deployment", f"unknown deployment {msg.deployment!r}")
        if isinstance(msg, SetAvailability | SetPrice) and (msg.region, msg.node) not in self.market:
            return ("node", f"region {msg.region} does not offer node type {msg.node!r}")
        if isinstance(msg, SetDemand):
            if msg.rps is None:
                self.overrides.discard(msg.deployment)
                self.demand[msg.deployment] = 2.0
            else:
                self.overrides.add(msg.deployment)
                self.demand[msg.deployment] = float(msg.rps)
        elif isinstance(msg, SetAvailability):
            price, avail = self.market[(msg.region, msg.node)]
            self.market[(msg.region, msg.node)] = (
                price,
                MARKET[(msg.region, msg.node)][1] if msg.count is None else msg.count,
            )
            self.market_over.add(f"{msg.region}/{msg.node}")
        elif isinstance(msg, SetPrice):
            price, avail = self.market[(msg.region, msg.node)]
            self.market[(msg.region, msg.node)] = (
                MARKET[(msg.region, msg.node)][0] if msg.price is None else msg.price,
                avail,
            )
            self.market_over.add(f"{msg.region}/{msg.node}")
        elif isinstance(msg, SetSlo):
            if msg.ttft_s < SLO_FLOOR_S:
                return ("ttft_s", f"no template meets TTFT {msg.ttft_s:g} s; build them with `coral templates build`")
            self.slo[msg.deployment] = (msg.ttft_s, msg.tpot_s, msg.attainment)
        elif isinstance(msg, ForbidTemplate):
            if msg.template_id not in BY_ID:
                return ("template_id", f"unknown template {msg.template_id!r}")
            if msg.forbid:
                self.forbidden.add(msg.template_id)
            else:
                self.forbidden.discard(msg.template_id)
        elif isinstance(msg, PinTemplate):
            if msg.template_id is None:
                self.pins.pop(msg.deployment, None)
            elif msg.template_id not in BY_ID or DEPLOYMENT_OF[msg.template_id] != msg.deployment:
                return ("template_id", f"template {msg.template_id} cannot serve {msg.deployment!r}")
            else:
                self.pins[msg.deployment] = msg.template_id
        elif isinstance(msg, DrainInstance):
            if msg.instance not in self.instances:
                return ("instance", f"unknown instance {msg.instance!r}")
        elif isinstance(msg, PauseAllocator):
            self.paused = msg.paused
        elif isinstance(msg, SetChurn):
            self.churn = float(msg.factor)
        return None

    async def _after(self, msg: Any) -> None:
        if isinstance(msg, SetDemand):
            await self._publish_demand("operator")
            await self._replan("demand")
        elif isinstance(msg, SetAvailability | SetPrice):
            await self._publish_market([(msg.region, msg.node)], "operator")
            await self._replan("market")
        elif isinstance(msg, SetSlo):
            ttft, tpot, att = self.slo[msg.deployment]
            await self.ctx.publish(SloChanged(msg.deployment, ttft, tpot, att, self._tick()))
            await self._replan("slo")
        elif isinstance(msg, ForbidTemplate | PinTemplate):
            await self._replan("templates")
        elif isinstance(msg, DrainInstance):
            inst = self.instances[msg.instance]
            at = self._tick()
            self.instances[msg.instance] = attrs.evolve(inst, state="draining", since=at)
            await self.ctx.publish(
                FleetAction(at, "drain", inst.id, inst.deployment, inst.template_id, inst.region, "operator")
            )
            await self._publish_fleet(at, "operator", (inst.id,))
            await self._replan("fleet")
        elif isinstance(msg, Replan):
            await self._replan("operator")
        elif isinstance(msg, PauseAllocator):
            if not msg.paused:
                await self._replan("resume")
        elif isinstance(msg, SetChurn):
            await self._replan("churn")


class FakeInspector(Actor):
    """The fake allocator's answers to inspection requests (templates, scenario, previews), from the
    state of ``FakeCoral``; a preview solves with the fake's planner on a copy of its settings."""

    def __init__(self, coral: FakeCoral, name: str = "allocator") -> None:
        super().__init__(name)
        self.coral = coral
        self.asked: list[Any] = []
        self.templates_delay_s = 0.0
        """How long a templates answer takes (a loaded mesh answers after the TUI drew what it had)."""

    async def handle(self, env: Envelope) -> None:
        msg = env.msg
        if env.kind != "request":
            return
        self.asked.append(msg)
        if isinstance(msg, ScenarioRequest):
            c = self.coral
            deps = tuple(DeploymentInfo(d, DEPLOYMENTS[d], *c.slo[d]) for d in sorted(c.demand))
            gpus = tuple(sorted({(s.node, s.gpu) for t in TEMPLATES for s in t.stages}))
            await self.ctx.reply(env, ScenarioInfo("fake", REGIONS, tuple(sorted({n for _, n in MARKET})), deps, gpus))
        elif isinstance(msg, TemplatesRequest):
            await anyio.sleep(self.templates_delay_s)
            ids = [i for i in msg.ids if i in BY_ID]
            ids += [t.id for t in TEMPLATES if DEPLOYMENT_OF[t.id] == msg.deployment and t.id not in ids]
            usable = {d: set(self.coral._allowed(d)) for d in DEPLOYMENTS}
            entries = tuple(
                TemplateEntry(DEPLOYMENT_OF[i], BY_ID[i], capacity(i), i in usable[DEPLOYMENT_OF[i]]) for i in ids
            )
            await self.ctx.reply(env, TemplatesReply(entries, tuple(i for i in msg.ids if i not in BY_ID)))
        elif isinstance(msg, PreviewRequest):
            await self.ctx.reply(env, self.preview(msg))

    def preview(self, req: PreviewRequest) -> PlanPreview:
        c = self.coral
        if req.template_id and req.template_id not in BY_ID:
            return PlanPreview(False, c.t, "template_id", f"unknown template {req.template_id!r}")
        trial = FakeCoral(c.name)
        trial.demand, trial.market = dict(c.demand), dict(c.market)
        trial.forbidden, trial.pins = set(c.forbidden), dict(c.pins)
        if req.action == "pin":
            trial.pins[req.deployment] = req.template_id
        elif req.action == "unpin":
            trial.pins.pop(req.deployment, None)
        elif req.action == "forbid":
            trial.forbidden.add(req.template_id)
        else:
            trial.forbidden.discard(req.template_id)
        counts = trial._solve()
        cost = sum(sum(c.market[(r, n)][0] for n in BY_ID[t].nodes) * k for (_, t, r), k in counts.items())
        unmet = 0.0
        for dep in DEPLOYMENTS:
            cap = sum(capacity(t) * k for (d, t, _), k in counts.items() if d == dep)
            unmet += max(0.0, c.demand[dep] - cap)
        now = c.plan
        rows = tuple(
            PlannedInstances(d, t, r, k, BY_ID[t].nodes, "aggregated", 0.0, capacity(t))
            for (d, t, r), k in sorted(counts.items())
        )
        return PlanPreview(
            True, c.t, status="optimal", instances=sum(counts.values()), cost_per_hour=round(cost, 3),
            unmet_rps=unmet, current_instances=sum(r.count for r in now.instances) if now else 0,
            current_cost_per_hour=now.cost_per_hour if now else 0.0,
            current_unmet_rps=now.unmet_rps if now else 0.0, rows=rows,
        )  # fmt: skip


def demand_capacity(plan: Plan, dep: str) -> float:
    return math.fsum(s.capacity_rps for s in plan.serving if s.deployment == dep)
