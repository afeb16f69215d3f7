"""The instance supervisor: reconciles the fleet to each plan through a cloud provider.

On a plan it stops surplus instances (the ones still provisioning first, then loading, then serving;
newest first) and starts missing ones: one node per template stage from the cloud (all or none; a
refusal waits as a pending start, retried at every tick and wake until the next plan). The first plan's instances
start warm when ``warm_start`` (the fleet that exists when a run begins).

A surplus instance still on its way (provisioning or loading) is a ``bridge`` instead of being stopped
while its deployment's serving capacity, with the bridges kept before it, stays below min(its demand,
the new plan's capacity): it is nearer to serving than any fresh start, so stopping it would only
lengthen the shortfall (a demand estimate that climbs over several re-plans, or a re-plan after a node
loss, would otherwise stop each start before it serves). A bridge that comes to serve retires at once
(below); one whose nodes a start of the plan needs, and the cloud lacks, stops (it serves nothing yet).
A later plan that wants it again takes it back.

Make before break: a surplus serving instance keeps serving (``retiring``) and drains (hands back the
requests it had not started and releases its nodes once the rest finished) only when the deployment's
serving capacity without it stays at or above its floor, min(capacity serving or bridged when the plan
came, the new plan's capacity): so a transition never takes a deployment below the lesser of the old and
the new plan unless nodes are lost. The one exception: a start waits for nodes the cloud cannot give, and
retiring instances in its region hold exactly node types it lacks, enough to cover the shortfall
(counting free nodes and nodes of instances already draining); those drain, because draining them is
what lets the start go ahead. They drain so only when the start's deployment serves less than its
demand, or when their own deployment has no instance on the way whose serving would free them anyway
(else two deployments could wait on each other's nodes for ever); and an instance that is the last
capacity of its deployment drains so only for a start of its own deployment (a replacement that needs
its very nodes), never for another's, and only when no other instance of its deployment is starting,
loading or draining: a deployment replaced on the nodes it holds rolls one instance at a time.
Capacity is ``coral.capacity``'s (prefill and decode pair up per region). When a deployment's serving
capacity falls below the latest plan's demand for it, or rises back, ``CapacityShort`` says so
(``fleet.unmet``).

Delivery is prompt (``actors.base``): a plan, a loaded stage, a drained instance or an engine fault is
acted on within ``HOP_S`` of its arrival, not at the next tick: it marks an instance serving once all its
stages are loaded (and tells its head worker to serve), releases drained instances, drains what make
before break then allows, retries pending starts, and publishes the fleet. Each tick (periodic work) it
also spawns a stage worker on every node the cloud reports ready and tells it which stage to load, and
watches heartbeats: a node silent for ``heartbeat_timeout_s`` is lost, and with it its instance (the other
nodes are released). A preempted node (the cloud gives notice), or one
whose worker reports an engine fault (a real server died), is lost at once. It publishes ``FleetUpdate``
when anything changed, a ``FleetAction`` per decision and ``NodeLost`` per lost node.

Resume after a crash (``restore``, before the actor starts): the instances of the journal's fleet state
whose nodes all still run at the provider are adopted (as ``provisioning``: the simulated stage workers
lived in the kernel process and died with it, so each node gets a fresh worker). One that was serving or
retiring re-attaches warm (its node kept running with the model loaded: no load time, as a real node
agent that outlived the kernel would); one still provisioning or loading loads again from the start. An
instance that was draining, or that lost a node, gives its remaining nodes back; a journal node gone at the provider is
``NodeLost`` (cause ``gone after crash``). Nodes the provider runs that the journal does not know (rented
after the last fleet update) are adopted as instances from their tags when ``unknown="adopt"`` and every
stage of the instance is there, else released. Every node is tagged with its instance, deployment,
template and stage when rented.

Fault injections (``fleet.fault``) go to its cloud, which kills nodes by telling their workers to die:
that is the simulated world acting, so the supervisor learns of a silent loss only from the missing
heartbeats, like it would of a real one. A node lost for silence is released at the provider, and
``terminate`` (the world again: the provider ends the machine) ends its worker if it still runs, wedged
(a ``hang`` fault: connected but silent).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping

import attrs

from actors.base import TickActor
from actors.cloud import TAG_DEPLOYMENT, TAG_INSTANCE, TAG_STAGE, TAG_TEMPLATE, CloudNode, CloudProvider
from actors.recovery import FleetState
from coral.capacity import capacity_rps
from coral.catalog.types import Catalog
from coral.kernel import Envelope
from coral.messages.control import SUPERVISOR, DrainInstance
from coral.messages.fleet import (
    LIVE_STATES,
    ROUTABLE_STATES,
    CapacityShort,
    DrainOrder,
    EngineFault,
    FaultInjected,
    FleetAction,
    FleetUpdate,
    InstanceDrained,
    InstanceInfo,
    KillNode,
    LoadStage,
    NodeLost,
    PendingStart,
    ReleaseNode,
    ServeInstance,
    StageLoaded,
    WorkerHeartbeat,
)
from coral.messages.market import MarketUpdate
from coral.messages.mesh import MeshTiming
from coral.messages.plan import NewPlan
from coral.scenario import Deployment
from coral.templates import Template

Key = tuple[str, str, str]
SpawnWorker = Callable[[str, str, str], Awaitable[str]]
"""Start the stage worker of a node: (node id, region, node type) -> the worker's actor name."""

_VICTIM_RANK = {"provisioning": 0, "loading": 1, "serving": 2, "retiring": 2}
_PLANNABLE = (*LIVE_STATES, "retiring")
_EPS = 1e-9


@attrs.define
class Reconciled:
    """What ``Supervisor.restore`` did: instances adopted, nodes released and nodes lost."""

    adopted: list[str] = attrs.field(factory=list)
    released: list[str] = attrs.field(factory=list)
    lost: list[str] = attrs.field(factory=list)


def _inst_num(iid: str) -> int:
    return int(iid[1:]) if iid[:1] == "i" and iid[1:].isdigit() else 0


@attrs.define
class NodeRec:
    id: str
    region: str
    node: str
    instance: str
    stage: int
    state: str = "provisioning"  # provisioning | up | lost | released
    worker: str = ""
    last_seen: float = 0.0
    loaded: bool = False
    endpoint: str = ""


@attrs.define
class InstRec:
    id: str
    num: int
    deployment: str
    template: Template
    region: str
    state: str
    since: float
    nodes: list[str]
    warm: bool
    drained: bool = False
    bridge: bool = False  # surplus to the plan, kept loading because its deployment serves too little

    @property
    def key(self) -> Key:
        return (self.deployment, self.template.id, self.region)


def instance_weight(t: Template, d: Deployment) -> float:
    """Requests/s an instance of ``t`` serves at ``d``'s shape (its routing weight), as the simulator uses."""
    if t.mode == "prefill":
        w = t.prefill_tok_s / d.shape.mean_in
    elif t.mode == "decode":
        w = t.decode_tok_s / d.shape.mean_out
    else:
        w = t.requests_per_s(d.shape.mean_in, d.shape.mean_out)
    return w if w > 0 else 1.0


class Supervisor(TickActor):
    """Reconciles the fleet to the plan (see the module docstring)."""

    prompt = True

    def __init__(
        self,
        name: str = SUPERVISOR,
        *,
        timing: MeshTiming,
        cloud: CloudProvider,
        templates: Mapping[str, Template],
        deployments: Mapping[str, Deployment],
        catalog: Catalog,
        spawn_worker: SpawnWorker,
        warm_start: bool = True,
        terminate: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(name, tick_s=timing.tick_s, subscribe=["plan.new", "mkt.update"])
        self.timing = timing
        self.cloud = cloud
        self.templates = dict(templates)
        self.deployments = dict(deployments)
        self.catalog = catalog
        self.spawn_worker = spawn_worker
        self.terminate = terminate
        self.warm_start = warm_start
        self.planned = False
        self.nodes: dict[str, NodeRec] = {}
        self.instances: dict[str, InstRec] = {}
        self.pending: dict[Key, int] = {}
        self.target: dict[Key, int] = {}
        self.next_num = 0
        self.seq = 0
        self.cost_rate = 0.0
        self.spent = 0.0
        self.changed: set[str] = set()  # what changed since the last FleetUpdate (its trigger)
        self.lost: list[str] = []
        self.stopped: list[str] = []
        self.by_operator: list[str] = []
        self.out: list[object] = []
        self.resume_up: list[str] = []  # adopted nodes already running: they get a worker at the first tick
        self.floor: dict[str, float] = {}  # per deployment: the capacity a transition keeps (module docstring)
        self.demand: dict[str, float] = {}  # per deployment: the latest plan's demand, req/s
        self.short: set[str] = set()  # deployments whose serving capacity is below their demand
        self.lost_since_plan: set[str] = set()  # deployments that lost a node since the latest plan

    # -- inputs --------------------------------------------------------------------------------------

    async def on_message(self, env: Envelope) -> None:
        msg = env.msg
        now = self.ctx.now()
        if isinstance(msg, WorkerHeartbeat):
            rec = self.nodes.get(msg.node_id)
            if rec is not None and rec.state == "up":
                rec.last_seen = max(rec.last_seen, msg.at)
        elif isinstance(msg, StageLoaded):
            rec = self.nodes.get(msg.node_id)
            if rec is not None and rec.instance == msg.instance:
                rec.loaded = True
                rec.endpoint = msg.endpoint
        elif isinstance(msg, EngineFault):
            rec = self.nodes.get(msg.node_id)
            if rec is not None and rec.state == "up":
                await self._lose(rec, now, f"engine: {msg.reason.splitlines()[0] if msg.reason else 'fault'}")
        elif isinstance(msg, InstanceDrained):
            inst = self.instances.get(msg.instance)
            if inst is not None:
                inst.drained = True
        elif isinstance(msg, NewPlan):
            await self._reconcile(msg, now)
        elif isinstance(msg, MarketUpdate):
            self.cloud.set_market(msg)
            self.changed.add("market")
        elif isinstance(msg, FaultInjected):
            for nid in self.cloud.inject(msg, now):
                rec = self.nodes.get(nid)
                if rec is not None and rec.worker:
                    await self.ctx.send(rec.worker, KillNode(nid, msg.kind))

    async def command(self, msg: object) -> tuple[str, str] | None:
        if not isinstance(msg, DrainInstance):
            return await super().command(msg)
        inst = self.instances.get(msg.instance)
        if inst is None:
            return ("instance", f"unknown instance {msg.instance!r}")
        if inst.state not in _PLANNABLE:
            return ("instance", f"instance {msg.instance} is {inst.state}, not running")
        await self._stop(inst, self.ctx.now(), "operator", at_once=True)
        self.by_operator.append(inst.id)
        return None

    # -- decisions -----------------------------------------------------------------------------------

    def _action(self, now: float, action: str, inst: InstRec, reason: str) -> None:
        self.out.append(FleetAction(now, action, inst.id, inst.deployment, inst.template.id, inst.region, reason))
        self.changed.add("instances")

    def weight(self, inst: InstRec) -> float:
        """Requests/s ``inst`` serves at its deployment's shape."""
        return instance_weight(inst.template, self.deployments[inst.deployment])

    def capacity(self, insts: Iterable[InstRec]) -> dict[str, float]:
        """Serving capacity per deployment of ``insts`` (``coral.capacity``; all of them counted)."""
        return capacity_rps((i.deployment, i.region, i.template.mode, self.weight(i)) for i in insts)

    def _routable(self) -> list[InstRec]:
        return [i for i in self.instances.values() if i.state in ROUTABLE_STATES]

    def _planned_capacity(self, target: Mapping[Key, int]) -> dict[str, float]:
        rows = []
        for (dep, tid, region), n in target.items():
            tpl = self.templates[tid]
            rows += [(dep, region, tpl.mode, instance_weight(tpl, self.deployments[dep]))] * n
        return capacity_rps(rows)

    async def _reconcile(self, msg: NewPlan, now: float) -> None:
        plan = msg.plan
        target = plan.counts()
        planned = self._planned_capacity(target)
        self.demand = {s.deployment: s.demand_rps for s in plan.serving}
        self.lost_since_plan = set()
        live: dict[Key, list[InstRec]] = {}
        for inst in self.instances.values():
            if inst.state in _PLANNABLE:
                live.setdefault(inst.key, []).append(inst)
        surplus: list[InstRec] = []
        for key in sorted(set(target) | set(live)):
            have = sorted(live.get(key, []), key=lambda i: (_VICTIM_RANK[i.state], -i.num))
            cut = max(0, len(have) - target.get(key, 0))
            surplus += have[:cut]
            for inst in have[cut:]:
                if inst.state == "retiring" or inst.bridge:  # wanted again
                    inst.state = "serving" if inst.state == "retiring" else inst.state
                    inst.bridge = False
                    self.changed.add("instances")
            live[key] = have[cut:]
        bridges = self._bridges(surplus, planned)
        for inst in surplus:
            if inst in bridges:
                if not inst.bridge:
                    inst.bridge = True
                    self._action(now, "keep", inst, f"plan {plan.seq}: bridges until its replacement serves")
            else:
                inst.bridge = False
                await self._stop(inst, now, f"plan {plan.seq}")
        coming = self.capacity([*self._routable(), *bridges])
        self.floor = {d: min(coming.get(d, 0.0), planned.get(d, 0.0)) for d in self.deployments}
        self.target = target
        warm = self.warm_start and not self.planned
        self.planned = True
        self.pending = {}
        for key in sorted(target):
            for _ in range(target[key] - len(live.get(key, []))):
                if not await self._start_or_free(key, now, warm, f"plan {plan.seq}"):
                    self.pending[key] = self.pending.get(key, 0) + 1
                    d, tid, region = key
                    self.out.append(FleetAction(now, "refused", "", d, tid, region, "no capacity"))
        self.changed.add("plan")

    def _bridges(self, surplus: list[InstRec], planned: Mapping[str, float]) -> list[InstRec]:
        """The surplus instances still on their way (provisioning or loading) that keep loading: per
        deployment, the ones nearest to serving first (loading before provisioning, oldest first), while
        its serving capacity plus theirs stays below min(its demand, the new plan's capacity). Stopping
        them would leave the deployment short until a fresh start loads from nothing."""
        have = self._routable()
        kept: list[InstRec] = []
        coming = [i for i in surplus if i.state in ("provisioning", "loading")]
        for inst in sorted(coming, key=lambda i: (i.state != "loading", i.num)):
            d = inst.deployment
            need = min(self.demand.get(d, 0.0), planned.get(d, 0.0))
            if self.capacity([*have, *kept]).get(d, 0.0) < need - 1e-6:
                kept.append(inst)
        return kept

    async def _start_or_free(self, key: Key, now: float, warm: bool, reason: str) -> bool:
        """Start an instance of ``key``; when the cloud lacks nodes that bridging instances (not serving
        yet) hold in its region, enough of them to cover the shortfall, stop those and start."""
        if self._start(key, now, warm, reason):
            return True
        dep, tid, region = key
        need = Counter(s.node for s in self.templates[tid].stages)
        lack = +Counter({n: k - self.cloud.free(region, n) for n, k in need.items()})
        picks: list[InstRec] = []
        cover: Counter[str] = Counter()
        for inst in sorted(self.instances.values(), key=lambda i: -i.num):
            if not lack or not (inst.bridge and inst.region == region and inst.state in ("provisioning", "loading")):
                continue
            types = Counter(inst.template.nodes)
            if not set(types) & set(lack):
                continue
            picks.append(inst)
            cover += types
            if all(cover[n] >= k for n, k in lack.items()):
                break
        if not lack or not all(cover[n] >= k for n, k in lack.items()):
            return False
        for inst in picks:
            inst.bridge = False
            await self._stop(inst, now, f"nodes needed by a start of {dep}")
        return self._start(key, now, warm, reason)

    def _start(self, key: Key, now: float, warm: bool, reason: str) -> bool:
        dep, tid, region = key
        tpl = self.templates[tid]
        got: list[str] = []
        for k, s in enumerate(tpl.stages):
            tags = {TAG_INSTANCE: f"i{self.next_num + 1}", TAG_DEPLOYMENT: dep, TAG_TEMPLATE: tid, TAG_STAGE: str(k)}
            nid = self.cloud.provision(region, s.node, now, warm=warm, tags=tags)
            if nid is None:
                for g in got:
                    self.cloud.release(g, now)
                return False
            got.append(nid)
        self.next_num += 1
        inst = InstRec(f"i{self.next_num}", self.next_num, dep, tpl, region, "provisioning", now, got, warm)
        self.instances[inst.id] = inst
        for stage, nid in enumerate(got):
            self.nodes[nid] = NodeRec(nid, region, tpl.stages[stage].node, inst.id, stage)
        self._action(now, "start", inst, reason)
        return True

    # -- resume ---------------------------------------------------------------------------------------

    def restore(self, fleet: FleetState, now: float, *, unknown: str = "release") -> Reconciled:
        """Take over a crashed run's fleet (see the module docstring); call before the actor starts."""
        if unknown not in ("adopt", "release"):
            raise ValueError(f"unknown: must be 'adopt' or 'release', got {unknown!r}")
        alive = {n.id: n for n in self.cloud.alive()}
        rec = Reconciled()
        self.planned = True
        self.next_num = max(self.next_num, fleet.next_num)
        self.seq, self.spent = fleet.fleet_seq, fleet.spent_usd
        claimed: set[str] = set()
        for st in fleet.instances:
            claimed.update(st.node_ids)
            tpl = self.templates.get(st.template_id)
            missing = [n for n in st.node_ids if n not in alive]
            if tpl is not None and st.node_ids and not missing and st.state in _PLANNABLE:
                warm = st.state in ("serving", "retiring")
                self._adopt(st.id, st.num, st.deployment, tpl, st.region, list(st.node_ids), st.since, now, rec, warm)
                continue
            for k, nid in enumerate(st.node_ids):
                if nid in alive:
                    self.cloud.release(nid, now)
                    rec.released.append(nid)
                else:
                    node_type = tpl.stages[k].node if tpl is not None and k < len(tpl.stages) else ""
                    self.out.append(NodeLost(now, nid, st.region, node_type, st.id, "gone after crash"))
                    rec.lost.append(nid)
            action = "lost" if missing else "stop"
            self.out.append(FleetAction(now, action, st.id, st.deployment, st.template_id, st.region, "resume"))
        groups: dict[str, list[CloudNode]] = {}
        for nid, node in alive.items():
            if nid not in claimed:
                groups.setdefault(node.tags.get(TAG_INSTANCE, f"?{nid}"), []).append(node)
        for iid in sorted(groups, key=lambda i: (len(i), i)):
            nodes = groups[iid]
            inst = self._from_tags(iid, nodes) if unknown == "adopt" else None
            if inst is not None:
                dep, tpl, region, ordered = inst
                num = _inst_num(iid)
                self._adopt(iid, num, dep, tpl, region, ordered, now, now, rec, False)
                self.next_num = max(self.next_num, num)
                continue
            for node in nodes:
                self.cloud.release(node.id, now)
                rec.released.append(node.id)
        self.changed.add("instances")
        return rec

    def _from_tags(self, iid: str, nodes: list[CloudNode]) -> tuple[str, Template, str, list[str]] | None:
        """An instance rebuilt from its nodes' tags, if every stage is there and consistent."""
        if iid in self.instances or _inst_num(iid) <= 0:
            return None
        tags = [n.tags for n in nodes]
        tid, dep = tags[0].get(TAG_TEMPLATE, ""), tags[0].get(TAG_DEPLOYMENT, "")
        tpl = self.templates.get(tid)
        if tpl is None or dep not in self.deployments:
            return None
        if any(t.get(TAG_TEMPLATE) != tid or t.get(TAG_DEPLOYMENT) != dep for t in tags):
            return None
        by_stage = {t.get(TAG_STAGE, ""): n for t, n in zip(tags, nodes, strict=True)}
        if sorted(by_stage) != sorted(str(k) for k in range(len(tpl.stages))) or len(by_stage) != len(nodes):
            return None
        ordered = [by_stage[str(k)] for k in range(len(tpl.stages))]
        if any(n.node != tpl.stages[k].node or n.region != ordered[0].region for k, n in enumerate(ordered)):
            return None
        return dep, tpl, ordered[0].region, [n.id for n in ordered]

    def _adopt(
        self,
        iid: str,
        num: int,
        dep: str,
        tpl: Template,
        region: str,
        node_ids: list[str],
        since: float,
        now: float,
        rec: Reconciled,
        warm: bool,
    ) -> None:
        inst = InstRec(iid, num, dep, tpl, region, "provisioning", since, node_ids, warm)
        self.instances[iid] = inst
        running = {n.id for n in self.cloud.alive() if n.state == "running"}
        for stage, nid in enumerate(node_ids):
            self.nodes[nid] = NodeRec(nid, region, tpl.stages[stage].node, iid, stage)
            if nid in running:
                self.resume_up.append(nid)
        self._action(now, "adopt", inst, "resumed after a crash")
        rec.adopted.append(iid)

    async def _stop(self, inst: InstRec, now: float, reason: str, *, at_once: bool = False) -> None:
        if inst.state in ("serving", "retiring") and not at_once:
            if inst.state == "serving":
                inst.state = "retiring"
                self._action(now, "retire", inst, reason)
            return
        if inst.state in ("serving", "retiring"):
            await self._drain(inst, now, reason)
            return
        await self._release_nodes(inst, now, reason)
        inst.state = "stopped"
        self.stopped.append(inst.id)
        self._action(now, "stop", inst, reason)

    async def _drain(self, inst: InstRec, now: float, reason: str) -> None:
        inst.state = "draining"
        await self.ctx.send(self.nodes[inst.nodes[0]].worker, DrainOrder(inst.id, reason))
        self._action(now, "drain", inst, reason)

    async def _release_nodes(self, inst: InstRec, now: float, reason: str) -> None:
        for nid in inst.nodes:
            rec = self.nodes[nid]
            if rec.state in ("lost", "released"):
                continue
            if rec.state == "up" and rec.worker:
                await self.ctx.send(rec.worker, ReleaseNode(nid, reason))
            rec.state = "released"
            self.cloud.release(nid, now)

    async def _lose(self, rec: NodeRec, now: float, cause: str) -> None:
        if rec.state in ("lost", "released"):
            return
        rec.state = "lost"
        self.cloud.release(rec.id, now)
        if cause == "heartbeat" and rec.worker and self.terminate is not None:
            self.terminate(rec.id)  # the provider ends the machine: a worker merely wedged there ends too
        self.out.append(NodeLost(now, rec.id, rec.region, rec.node, rec.instance, cause))
        inst = self.instances[rec.instance]
        self.lost_since_plan.add(inst.deployment)
        if inst.state in ("stopped", "lost"):
            return
        await self._release_nodes(inst, now, f"node {rec.id} lost")
        inst.state = "lost"
        self.lost.append(inst.id)
        self._action(now, "lost", inst, f"node {rec.id}: {cause}")

    async def _node_up(self, rec: NodeRec, now: float) -> None:
        inst = self.instances[rec.instance]
        try:
            rec.worker = await self.spawn_worker(rec.id, rec.region, rec.node)
        except Exception as exc:  # a worker that cannot start is a node we cannot use
            await self._lose(rec, now, f"worker did not start: {type(exc).__name__}: {exc}")
            return
        rec.state = "up"
        rec.last_seen = now
        if inst.state not in LIVE_STATES:
            await self.ctx.send(rec.worker, ReleaseNode(rec.id, f"instance {inst.id} is {inst.state}"))
            rec.state = "released"
            self.cloud.release(rec.id, now)
            return
        head = rec.stage == 0
        msg = LoadStage(inst.id, inst.deployment, inst.template.id, rec.stage, inst.region, head, inst.warm)
        await self.ctx.send(rec.worker, msg)

    async def on_tick(self, now: float) -> None:
        self.spent += self.cost_rate * self.tick_s / 3600.0
        up, self.resume_up = self.resume_up, []
        for nid in up:
            node = self.nodes.get(nid)
            if node is not None and node.state == "provisioning":
                await self._node_up(node, now)
        for ev in self.cloud.poll(now):
            rec = self.nodes.get(ev.node_id)
            if rec is None:
                continue
            if ev.kind == "ready" and rec.state == "provisioning":
                await self._node_up(rec, now)
            elif ev.kind in ("preempted", "failed"):
                await self._lose(rec, now, "preempted" if ev.kind == "preempted" else "failed while provisioning")
        timeout = self.timing.heartbeat_timeout_s
        for rec in sorted(self.nodes.values(), key=lambda r: (len(r.id), r.id)):
            if rec.state == "up" and now - rec.last_seen > timeout:
                await self._lose(rec, now, "heartbeat")
        await self.on_wake(now)

    async def on_wake(self, now: float) -> None:
        """What the messages just applied allow: instances that now serve or have drained, drains make
        before break permits, pending starts the freed nodes let go ahead; then the fleet update."""
        for inst in sorted(self.instances.values(), key=lambda i: i.num):
            recs = [self.nodes[n] for n in inst.nodes]
            if inst.state == "provisioning" and all(r.state == "up" for r in recs):
                inst.state = "loading"
                self.changed.add("instances")
            if inst.state == "loading" and all(r.loaded for r in recs):
                inst.state = "serving"
                await self.ctx.send(recs[0].worker, ServeInstance(inst.id))
                self._action(now, "serving", inst, "all stages loaded")
                if inst.bridge:  # it serves until its replacement does (make before break)
                    inst.bridge = False
                    inst.state = "retiring"
                    self._action(now, "retire", inst, "bridge: surplus to the plan")
            if inst.state == "draining" and inst.drained:
                await self._release_nodes(inst, now, "drained")
                inst.state = "stopped"
                self.stopped.append(inst.id)
                self._action(now, "release", inst, "drained")
        await self._retire(now)
        for key in sorted(self.pending):
            while self.pending[key] > 0 and await self._start_or_free(key, now, False, "pending start"):
                self.pending[key] -= 1
                self.changed.add("pending")
        self.pending = {k: v for k, v in self.pending.items() if v > 0}
        rate = sum(self.cloud.price(r.id) for r in self.nodes.values() if r.state in ("provisioning", "up"))
        if rate != self.cost_rate:
            self.cost_rate = rate
            self.changed.add("cost")
        self._check_short(now)
        await self._publish(now)

    async def _retire(self, now: float) -> None:
        """Drain the retiring instances make-before-break allows (see the module docstring)."""
        keep = self._routable()
        for inst in sorted(keep, key=lambda i: i.num):
            if inst.state != "retiring":
                continue
            rest = [i for i in keep if i is not inst]
            if self.capacity(rest).get(inst.deployment, 0.0) >= self.floor.get(inst.deployment, 0.0) - _EPS:
                keep = rest
                await self._drain(inst, now, "replacement serving")
        for inst, reason in self._blocking():
            await self._drain(inst, now, reason)

    def _blocking(self) -> list[tuple[InstRec, str]]:
        """Retiring instances whose nodes are exactly what a waiting start lacks, enough to cover it."""
        spare: Counter[tuple[str, str]] = Counter()  # (region, node type): nodes coming free
        for inst in self.instances.values():
            if inst.state == "draining":
                for nid in inst.nodes:
                    if self.nodes[nid].state in ("provisioning", "up"):
                        spare[(inst.region, self.nodes[nid].node)] += 1
        retiring = sorted((i for i in self.instances.values() if i.state == "retiring"), key=lambda i: -i.num)
        coming = {i.deployment for i in self.instances.values() if i.state in ("provisioning", "loading")}
        chosen: list[tuple[InstRec, str]] = []
        taken: set[str] = set()
        for key in sorted(self.pending):
            dep, tid, region = key
            need = Counter(s.node for s in self.templates[tid].stages)
            lack: Counter[str] = Counter()
            for node, n in need.items():
                have = self.cloud.free(region, node) + spare[(region, node)]
                lack[node] = max(0, n - have)
                spare[(region, node)] = max(0, spare[(region, node)] - n)
            lack = +lack
            if not lack:
                continue
            picks: list[InstRec] = []
            cover: Counter[str] = Counter()
            left = [i for i in self._routable() if i.id not in taken]
            urgent = self.capacity(left).get(dep, 0.0) < self.demand.get(dep, 0.0) - 1e-6
            for inst in retiring:
                types = Counter(inst.template.nodes)
                if inst.id in taken or inst.region != region or not set(types) <= set(lack):
                    continue
                if not urgent and inst.deployment in coming:
                    continue  # its own replacements will serve and free it: wait for them
                rest = [i for i in left if i is not inst]
                if self.capacity(rest).get(inst.deployment, 0.0) <= _EPS and (
                    inst.deployment != dep or self._in_flight(inst.deployment, taken | {i.id for i in picks})
                ):
                    continue  # the last capacity: only for its own replacement, and one at a time
                left = rest
                picks.append(inst)
                cover += types
                if all(cover[n] >= k for n, k in lack.items()):
                    break
            if not all(cover[n] >= k for n, k in lack.items()):
                continue
            for inst in picks:
                taken.add(inst.id)
                chosen.append((inst, f"nodes needed by a waiting start of {dep}"))
            for node, k in (cover - lack).items():
                spare[(region, node)] += k
        return chosen

    def _in_flight(self, dep: str, picked: set[str]) -> bool:
        """Whether ``dep`` has an instance on its way (starting or loading), draining, or picked to drain."""
        return any(
            i.deployment == dep and (i.state in ("provisioning", "loading", "draining") or i.id in picked)
            for i in self.instances.values()
        )

    def _why_short(self, dep: str) -> str:
        if dep in self.lost_since_plan:
            return "nodes lost"
        if any(n > 0 for (d, _, _), n in self.pending.items() if d == dep):
            return "waiting for nodes"
        if any(i.deployment == dep and i.state in ("provisioning", "loading") for i in self.instances.values()):
            return "replacement loading"
        return "plan"

    def _check_short(self, now: float) -> None:
        """Say when a deployment's serving capacity falls below its demand, or rises back to it."""
        cap = self.capacity(self._routable())
        for dep in sorted(self.demand):
            want, have = self.demand[dep], cap.get(dep, 0.0)
            short = have < want - 1e-6
            if short == (dep in self.short):
                continue
            if short:
                self.short.add(dep)
                cause = self._why_short(dep)
            else:
                self.short.discard(dep)
                cause = ""
            self.out.append(CapacityShort(now, dep, want, have, short, cause))

    async def _publish(self, now: float) -> None:
        for msg in self.out:
            await self.ctx.publish(msg)
        self.out = []
        if not self.changed:
            return
        trigger = "+".join(sorted(self.changed))
        self.changed = set()
        infos = []
        for inst in sorted(self.instances.values(), key=lambda i: i.num):
            if inst.state in ("stopped", "lost"):
                continue
            d = self.deployments[inst.deployment]
            head = self.nodes[inst.nodes[0]].worker
            kv_nic = min(self.catalog.nodes[n].nic_bytes_per_s for n in inst.template.nodes)
            infos.append(
                InstanceInfo(
                    inst.id,
                    inst.deployment,
                    inst.template.id,
                    inst.region,
                    inst.template.mode,
                    inst.state,
                    inst.template.nodes,
                    tuple(inst.nodes),
                    head,
                    instance_weight(inst.template, d),
                    kv_nic,
                    inst.since,
                    self.nodes[inst.nodes[0]].endpoint,
                    inst.template.kv_min_nic if inst.template.mode == "decode" else 0.0,
                )
            )
        pending = tuple(PendingStart(d, t, r, n) for (d, t, r), n in sorted(self.pending.items()))
        self.seq += 1
        await self.ctx.publish(
            FleetUpdate(
                self.seq,
                now,
                tuple(infos),
                tuple(self.lost),
                tuple(self.stopped),
                tuple(self.by_operator),
                pending,
                self.cost_rate,
                self.spent,
                trigger,
            )
        )
        for iid in self.lost + self.stopped:
            inst = self.instances.pop(iid)
            for nid in inst.nodes:
                rec = self.nodes.get(nid)
                if rec is not None and rec.instance == iid:  # a static host may serve a new instance already
                    del self.nodes[nid]
        self.lost, self.stopped, self.by_operator = [], [], []

    @property
    def live(self) -> list[InstRec]:
        """Instances provisioning, loading, serving, retiring or draining."""
        return [i for i in self.instances.values() if i.state not in ("stopped", "lost")]
