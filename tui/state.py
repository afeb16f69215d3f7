"""The TUI's view-state and the one adapter between bus messages and it.

Every dependency of the TUI on message fields lives in this module: the reducer ``apply(state, env)``
that folds one bus envelope into a new ``State``, ``merge_snapshots`` (how a flood merges snapshot messages),
and the steering forms (``ACTIONS``, ``build_command``) that turn what the operator typed into a control
message. The widgets read only the plain attrs classes defined here.

``State`` and its parts are frozen; ``apply`` never mutates its input (it copies the mappings it
changes), so a state can be kept, compared and snapshotted. Time in the state is the kernel's time as the
messages carry it; the reducer never reads a clock.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from coral.kernel import DecodeError, Envelope, ErrorEvent
from coral.kernel.codec import decode
from coral.messages import control as ctl
from coral.messages.demand import DemandUpdate
from coral.messages.fleet import LIVE_STATES, ROUTABLE_STATES, FaultInjected, FleetAction, FleetUpdate, NodeLost
from coral.messages.market import MarketUpdate
from coral.messages.mesh import MeshEnd, MeshSetup
from coral.messages.plan import NewPlan
from coral.messages.requests import RoutingStats
from coral.plan import PlannedInstances
from coral.templates import Template

HISTORY_S = 15 * 60.0
"""How much kernel time the sparklines keep."""
MAX_PLANS = 500
MAX_EVENTS = 2000
MAX_COMMANDS = 200
RECENT_S = 60.0
"""A market entry that changed within this much kernel time counts as a recent change."""
LOST_SHOWN_S = 120.0
"""A lost instance stays in the fleet view for this much kernel time."""
GOODPUT_S = 60.0
"""Goodput is measured over (at least) this much kernel time of traffic reports."""
RUNNING_STATES = frozenset(LIVE_STATES) | frozenset(ROUTABLE_STATES)
"""Instances that count as running (and holding nodes with ``draining``)."""

TOPICS = (
    "mesh.",
    "plan.new",
    "fleet.update",
    "fleet.action",
    "fleet.node_lost",
    "fleet.fault",
    "dem.update",
    "mkt.update",
    "req.stats",
    "ctl.",
    "slo.changed",
    "kernel.actor.",
    "kernel.error",
    "kernel.peer.",
    "kernel.shutdown",
    "kernel.auth.",
    "gw.refused",
)
"""The bus topics (tag prefixes) the TUI subscribes to."""

SNAPSHOT_TAGS = frozenset({"fleet.update", "dem.update", "req.stats", "mkt.update"})
"""Messages that carry a full snapshot: of several queued ones only the latest matters (see ``coalesce``)."""

EVENT_KINDS = ("crash", "fault", "error", "command", "plan", "fleet", "market", "demand", "peer", "access", "mesh")
SEVERITIES = ("info", "warn", "error")


# -- view-state -------------------------------------------------------------------------------------


@attrs.frozen
class StageView:
    """One node of a template: its node type, GPU type and layers ``[start, end)``."""

    node: str
    gpu: str
    start: int
    end: int


@attrs.frozen
class TemplateView:
    """What the TUI shows of a template."""

    id: str
    model: str
    mode: str
    num_layers: int
    nodes: tuple[str, ...]
    stages: tuple[StageView, ...]
    ttft_s: float = 0.0
    tpot_s: float = 0.0


@attrs.frozen
class InstanceView:
    """One instance of the live fleet."""

    id: str
    deployment: str
    template_id: str
    region: str
    mode: str
    state: str
    node_types: tuple[str, ...]
    weight: float
    since: float

    @property
    def live(self) -> bool:
        """Running: provisioning, loading, serving or retiring (not draining, stopped or lost)."""
        return self.state in RUNNING_STATES

    @property
    def drainable(self) -> bool:
        """An instance the supervisor accepts a drain command for."""
        return self.state in LIVE_STATES


@attrs.frozen
class QuoteView:
    """Price and availability of one (region, node type), with its previous values and when it changed."""

    region: str
    node: str
    gpu: str
    price: float
    availability: int
    overridden: bool = False
    prev_price: float | None = None
    prev_availability: int | None = None
    changed_at: float | None = None

    @property
    def stockout(self) -> bool:
        return self.availability <= 0


@attrs.frozen
class SloView:
    ttft_s: float
    tpot_s: float
    attainment: float


@attrs.frozen
class Sample:
    """One point of a deployment's history: demand and live capacity (req/s), window attainment (-1: none)."""

    t: float
    demand: float
    capacity: float
    attainment: float


@attrs.frozen
class DeploymentView:
    """Per deployment: demand, capacity, SLO attainment, cost and templates in use."""

    name: str
    model: str = ""
    slo: SloView | None = None
    demand: float = 0.0
    estimate: float = 0.0
    demand_seen: bool = False
    override: bool = False
    capacity: float = 0.0
    planned_capacity: float = 0.0
    unmet: float = 0.0
    cost_per_hour: float = 0.0
    templates: tuple[tuple[str, int], ...] = ()
    pinned: str | None = None
    attainment: float = -1.0
    window_attainment: float = -1.0
    completed: int = 0
    failed: int = 0
    slo_met: int = 0
    queued: int = 0
    in_flight: int = 0
    ttft_p99: float = 0.0
    tpot_p99: float = 0.0
    history: tuple[Sample, ...] = ()


@attrs.frozen
class ServingRow:
    deployment: str
    model: str
    demand: float
    capacity: float
    unmet: float


@attrs.frozen
class DiffRow:
    deployment: str
    template_id: str
    region: str
    delta: int


@attrs.frozen
class PlanView:
    """One plan of the history, whole; ``n`` numbers the plans this TUI saw (``seq`` restarts with a run)."""

    n: int
    seq: int
    at: float
    policy: str
    trigger: str
    status: str
    gap: float
    solve_s: float
    cost_per_hour: float
    churn_cost: float
    starts: int
    stops: int
    demand: float
    unmet: float
    instances: tuple[PlannedInstances, ...]
    serving: tuple[ServingRow, ...]
    diff: tuple[DiffRow, ...]


@attrs.frozen
class EventView:
    """One line of the event log; ``n`` numbers events as the TUI received them."""

    n: int
    t: float
    kind: str
    severity: str
    source: str
    text: str


@attrs.frozen
class CommandView:
    """A command this TUI sent, and what became of it (``pending``, ``ok``, ``refused``, ``failed``)."""

    n: int
    action: str
    text: str
    status: str = "pending"
    field: str = ""
    reason: str = ""


@attrs.frozen
class Link:
    """The TUI's connection: ``connecting``, ``connected``, ``lost``, ``replay`` or ``replay-ended``."""

    state: str = "connecting"
    detail: str = ""
    address: str = ""


@attrs.frozen
class State:
    """Everything the TUI shows."""

    link: Link = Link()
    now: float = 0.0
    scenario: str = ""
    policy: str = ""
    ended: str = ""
    gpu_of: Mapping[str, str] = attrs.field(factory=dict)
    templates: Mapping[str, TemplateView] = attrs.field(factory=dict)
    deployments: Mapping[str, DeploymentView] = attrs.field(factory=dict)
    market: Mapping[tuple[str, str], QuoteView] = attrs.field(factory=dict)
    market_seq: int = 0
    instances: Mapping[str, InstanceView] = attrs.field(factory=dict)
    pending_starts: int = 0
    fleet_cost: float | None = None
    spent: float = 0.0
    plans: tuple[PlanView, ...] = ()
    plan_count: int = 0
    events: tuple[EventView, ...] = ()
    event_count: int = 0
    dropped: int = 0
    commands: tuple[CommandView, ...] = ()
    command_count: int = 0
    paused: bool = False
    churn: float | None = None
    forbidden: frozenset[str] = frozenset()
    goodput: float = 0.0
    attainment: float = -1.0
    stats_hist: tuple[tuple[float, int], ...] = ()
    crashes: int = 0
    down: frozenset[str] = frozenset()
    errors: int = 0

    @property
    def cost_per_hour(self) -> float:
        """The live fleet's cost rate, or the latest plan's before the fleet reported."""
        if self.fleet_cost is not None:
            return self.fleet_cost
        return self.plans[-1].cost_per_hour if self.plans else 0.0

    @property
    def live_instances(self) -> int:
        return sum(1 for i in self.instances.values() if i.live)

    @property
    def regions(self) -> tuple[str, ...]:
        return tuple(sorted({r for r, _ in self.market} | {i.region for i in self.instances.values()}))

    @property
    def node_types(self) -> tuple[str, ...]:
        nodes = {n for _, n in self.market}
        for i in self.instances.values():
            nodes.update(i.node_types)
        return tuple(sorted(nodes))

    def nodes_in_use(self) -> dict[tuple[str, str], int]:
        """(region, node type) -> nodes held by live or draining instances."""
        out: dict[tuple[str, str], int] = {}
        for i in self.instances.values():
            if i.live or i.state == "draining":
                for n in i.node_types:
                    out[(i.region, n)] = out.get((i.region, n), 0) + 1
        return out

    def gpu(self, node: str) -> str:
        return self.gpu_of.get(node, "?")

    def plan(self, n: int) -> PlanView | None:
        """The plan this TUI numbered ``n`` (``PlanView.n``)."""
        for p in reversed(self.plans):
            if p.n == n:
                return p
        return None

    def resolve_template(self, text: str) -> str | None:
        """The full id of a known template from its id or an unambiguous prefix."""
        if text in self.templates:
            return text
        hits = [t for t in self.known_templates() if t.startswith(text)]
        return hits[0] if len(hits) == 1 else None

    def known_templates(self) -> list[str]:
        ids = set(self.templates)
        for p in self.plans[-1:]:
            ids.update(r.template_id for r in p.instances)
        ids.update(i.template_id for i in self.instances.values())
        return sorted(ids)

    def recent(self, q: QuoteView) -> bool:
        """Whether a market entry changed within ``RECENT_S`` of the latest kernel time."""
        return q.changed_at is not None and self.now - q.changed_at <= RECENT_S


def initial_state(*, gpu_of: Mapping[str, str] | None = None, link: Link | None = None) -> State:
    """An empty state; ``gpu_of`` maps node types to GPU types (from the catalog)."""
    return State(link=link or Link(), gpu_of=dict(gpu_of or {}))


# -- the reducer ------------------------------------------------------------------------------------


def snapshot_request() -> ctl.SnapshotRequest:
    """What a client attaching late asks the operator gateway for."""
    return ctl.SnapshotRequest()


def unpack_snapshot(reply: object) -> tuple[list[Envelope], dict[str, Any]]:
    """The envelopes of a ``Snapshot`` reply, in order, and what they cover (tag -> its latest message).
    A record that does not decode becomes an error event; anything but a snapshot gives nothing."""
    if not isinstance(reply, ctl.Snapshot):
        return [], {}
    envs: list[Envelope] = []
    covered: dict[str, Any] = {}
    for rec in reply.records:
        try:
            msg = decode(rec.tag.encode(), rec.body)
        except DecodeError as exc:
            envs.append(Envelope("publish", rec.source, "kernel.error", ErrorEvent(rec.source, rec.tag, str(exc))))
            continue
        covered[rec.tag] = msg
        envs.append(Envelope("publish", rec.source, rec.tag, msg))
    return envs, covered


def covered_by(covered: dict[str, Any], env: Envelope) -> bool:
    """Whether a live message is already in the snapshot folded before it (the same one, or older)."""
    seen = covered.get(env.tag)
    if seen is None:
        return False
    if isinstance(env.msg, NewPlan) and isinstance(seen, NewPlan):
        return bool(env.msg.plan.seq <= seen.plan.seq)
    at, seen_at = getattr(env.msg, "at", None), getattr(seen, "at", None)
    if isinstance(at, float) and isinstance(seen_at, float):
        return at < seen_at or (at == seen_at and env.msg == seen)
    return bool(env.msg == seen)


def apply(state: State, env: Envelope) -> State:
    """Fold one bus envelope into the state (a new state; ``state`` is left as it was)."""
    if env.tag == CLOCK_TAG:
        return _on_clock(state, env)
    handler = _HANDLERS.get(env.tag)
    if handler is None:
        if env.tag.startswith("ctl.") and ctl.is_command(env.msg):
            return _event(state, state.now, "command", "info", env.source, f"{describe_command(env.msg)} -> {env.tag}")
        return state
    return handler(state, env)


def apply_all(state: State, envs: Iterable[Envelope]) -> State:
    """Fold several envelopes, in order."""
    for env in envs:
        state = apply(state, env)
    return state


def with_link(state: State, link: Link) -> State:
    """The state with a new connection status (logged as a mesh event when it changes)."""
    if link == state.link:
        return state
    state = attrs.evolve(state, link=link)
    if link.state in ("lost", "connected"):
        sev = "warn" if link.state == "lost" else "info"
        state = _event(state, state.now, "mesh", sev, "tui", f"{link.state}: {link.detail}".rstrip(": "))
    return state


def with_dropped(state: State, dropped: int) -> State:
    """Count events a flood made the bus worker drop, with one log line."""
    if dropped <= 0:
        return state
    state = attrs.evolve(state, dropped=state.dropped + dropped)
    return _event(state, state.now, "error", "warn", "tui", f"{dropped} events dropped (flood)")


def add_templates(state: State, templates: Iterable[Template]) -> State:
    """Add templates (from the run's setup or the template store) so that stage bars can be drawn."""
    new = dict(state.templates)
    for t in templates:
        new[t.id] = _template_view(t)
    return attrs.evolve(state, templates=new)


def missing_templates(state: State) -> list[str]:
    """Ids of templates the fleet or the latest plan uses that the state has no stages for."""
    return [t for t in state.known_templates() if t not in state.templates]


def _template_view(t: Template) -> TemplateView:
    stages = tuple(StageView(s.node, s.gpu, s.start, s.end) for s in t.stages)
    return TemplateView(t.id, t.model, t.mode, t.num_layers, tuple(t.nodes), stages, t.slo.ttft_s, t.slo.tpot_s)


def _event(state: State, t: float, kind: str, severity: str, source: str, text: str) -> State:
    n = state.event_count + 1
    events = (*state.events[-(MAX_EVENTS - 1) :], EventView(n, t, kind, severity, source, text))
    return attrs.evolve(state, events=events, event_count=n)


def _dep(state: State, name: str) -> DeploymentView:
    return state.deployments.get(name) or DeploymentView(name)


def _with_sample(d: DeploymentView, t: float) -> DeploymentView:
    s = Sample(t, d.demand, d.capacity, d.window_attainment)
    hist = list(d.history)
    if hist and hist[-1].t >= t:
        hist[-1] = attrs.evolve(s, t=hist[-1].t)
    else:
        hist.append(s)
    cut = t - HISTORY_S
    i = 0
    while i < len(hist) and hist[i].t < cut:
        i += 1
    return attrs.evolve(d, history=tuple(hist[i:]))


def _on_setup(state: State, env: Envelope) -> State:
    """A new run: everything of the previous one goes but the event log and this TUI's commands."""
    m: MeshSetup = env.msg
    state = State(
        link=state.link,
        now=-float(m.timing.warmup_s),
        scenario=m.scenario_name,
        policy=m.policy,
        gpu_of=state.gpu_of,
        events=state.events,
        event_count=state.event_count,
        dropped=state.dropped,
        commands=state.commands,
        command_count=state.command_count,
        plan_count=state.plan_count,
    )
    state = add_templates(state, m.templates)
    deps = {
        name: DeploymentView(name, model=model, slo=slo) for name, model, slo in _scenario_deployments(m.scenario_toml)
    }
    state = attrs.evolve(state, deployments=deps)
    text = f"run set up: scenario {m.scenario_name}, policy {m.policy}, {len(m.templates)} templates, seed {m.seed}"
    return _event(state, state.now, "mesh", "info", env.source, text)


def _scenario_deployments(text: str) -> list[tuple[str, str, SloView | None]]:
    """(name, model, SLO) of each deployment of a scenario's TOML text (best effort: [] if unreadable)."""
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, TypeError):
        return []
    out = []
    for d in data.get("deployment", []):
        if not isinstance(d, dict) or not isinstance(d.get("name"), str):
            continue
        slo = d.get("slo")
        sv = None
        if isinstance(slo, dict):
            try:
                sv = SloView(float(slo["ttft_s"]), float(slo["tpot_s"]), float(slo.get("attainment", 0.9)))
            except (KeyError, TypeError, ValueError):
                sv = None
        out.append((d["name"], str(d.get("model", "")), sv))
    return out


def _on_end(state: State, env: Envelope) -> State:
    m: MeshEnd = env.msg
    state = attrs.evolve(state, ended=m.reason, now=max(state.now, m.at))
    return _event(state, m.at, "mesh", "info", env.source, f"run ended at t={m.at:g}s: {m.reason}")


def _on_plan(state: State, env: Envelope) -> State:
    m: NewPlan = env.msg
    p = m.plan
    rows = tuple(p.instances)
    serving = tuple(ServingRow(s.deployment, s.model, s.demand_rps, s.capacity_rps, s.unmet_rps) for s in p.serving)
    diff = tuple(DiffRow(c.deployment, c.template_id, c.region, c.delta) for c in m.diff)
    n = state.plan_count + 1
    view = PlanView(
        n,
        p.seq, p.at, p.policy, p.trigger, p.status, p.gap, p.solve_s, p.cost_per_hour, p.churn_cost,
        m.starts, m.stops, p.demand_rps, p.unmet_rps, rows, serving, diff,
    )  # fmt: skip
    deps = dict(state.deployments)
    cost: dict[str, float] = {}
    used: dict[str, dict[str, int]] = {}
    for r in rows:
        cost[r.deployment] = cost.get(r.deployment, 0.0) + r.cost_per_hour * r.count
        per = used.setdefault(r.deployment, {})
        per[r.template_id] = per.get(r.template_id, 0) + r.count
    for s in serving:
        old = _dep(state, s.deployment)
        deps[s.deployment] = _with_sample(
            attrs.evolve(
                old,
                model=s.model or old.model,
                planned_capacity=s.capacity,
                unmet=s.unmet,
                cost_per_hour=cost.get(s.deployment, 0.0),
                templates=tuple(sorted(used.get(s.deployment, {}).items())),
            ),
            p.at,
        )
    plans = (*state.plans[-(MAX_PLANS - 1) :], view)
    state = attrs.evolve(state, plans=plans, plan_count=n, deployments=deps, now=max(state.now, p.at))
    text = (
        f"plan #{p.seq} ({p.trigger}): ${p.cost_per_hour:,.2f}/h, +{m.starts} -{m.stops}, {p.status}"
        + (f" gap {p.gap:.2%}" if p.gap >= 5e-5 else "")
        + (f", unmet {p.unmet_rps:.2f} req/s" if p.unmet_rps > 1e-9 else "")
    )
    return _event(state, p.at, "plan", "warn" if p.unmet_rps > 1e-9 else "info", env.source, text)


def _live_capacity(instances: Iterable[InstanceView]) -> dict[str, float]:
    agg: dict[str, float] = {}
    pre: dict[str, float] = {}
    dec: dict[str, float] = {}
    for i in instances:
        if i.state not in ROUTABLE_STATES:
            continue
        side = pre if i.mode == "prefill" else dec if i.mode == "decode" else agg
        side[i.deployment] = side.get(i.deployment, 0.0) + i.weight
    out = dict(agg)
    for d in set(pre) | set(dec):
        out[d] = out.get(d, 0.0) + min(pre.get(d, 0.0), dec.get(d, 0.0))
    return out


def _on_fleet(state: State, env: Envelope) -> State:
    m: FleetUpdate = env.msg
    insts = {
        i.id: InstanceView(
            i.id, i.deployment, i.template_id, i.region, i.mode, i.state, tuple(i.node_types), i.weight, i.since
        )
        for i in m.instances
    }
    for iid in m.lost:  # gone from the update: shown as lost for a while
        old = state.instances.get(iid)
        if old is not None and iid not in insts:
            insts[iid] = attrs.evolve(old, state="lost", since=m.at)
    for iid, old in state.instances.items():
        if old.state == "lost" and iid not in insts and m.at - old.since <= LOST_SHOWN_S:
            insts[iid] = old
    cap = _live_capacity(insts.values())
    deps = dict(state.deployments)
    for name in set(cap) | {n for n, d in deps.items() if d.capacity}:
        d = _dep(state, name)
        deps[name] = _with_sample(attrs.evolve(d, capacity=cap.get(name, 0.0)), m.at)
    return attrs.evolve(
        state,
        instances=insts,
        pending_starts=sum(p.count for p in m.pending),
        fleet_cost=m.cost_per_hour,
        spent=m.spent_usd,
        deployments=deps,
        now=max(state.now, m.at),
    )


def _on_action(state: State, env: Envelope) -> State:
    m: FleetAction = env.msg
    sev = "warn" if m.action in ("lost", "refused") else "info"
    text = f"{m.action} {m.instance} ({m.deployment} in {m.region})" + (f": {m.reason}" if m.reason else "")
    return _event(attrs.evolve(state, now=max(state.now, m.at)), m.at, "fleet", sev, env.source, text)


def _on_node_lost(state: State, env: Envelope) -> State:
    m: NodeLost = env.msg
    text = f"node {m.node_id} ({m.node_type} in {m.region}) lost: {m.cause}" + (
        f"; instance {m.instance} lost" if m.instance else ""
    )
    return _event(attrs.evolve(state, now=max(state.now, m.at)), m.at, "fault", "error", env.source, text)


def _on_fault(state: State, env: Envelope) -> State:
    m: FaultInjected = env.msg
    text = f"fault injected: {m.kind} of {m.count} x {m.node} in {m.region}"
    return _event(state, m.at, "fault", "warn", env.source, text)


def _on_demand(state: State, env: Envelope) -> State:
    m: DemandUpdate = env.msg
    deps = dict(state.deployments)
    over = set(m.overrides)
    for name in sorted(set(m.demand) | set(m.estimate)):
        d = _dep(state, name)
        d = attrs.evolve(
            d, demand=float(m.demand.get(name, d.demand)), estimate=float(m.estimate.get(name, d.estimate)),
            override=name in over, demand_seen=True,
        )  # fmt: skip
        deps[name] = _with_sample(d, m.at)
    state = attrs.evolve(state, deployments=deps, now=max(state.now, m.at))
    if m.reason == "operator":
        parts = ", ".join(f"{d}={m.demand[d]:g}" for d in sorted(over) if d in m.demand) or "cleared"
        state = _event(state, m.at, "demand", "info", env.source, f"demand overrides: {parts}")
    return state


def _on_market(state: State, env: Envelope) -> State:
    m: MarketUpdate = env.msg
    over = set(m.overridden)
    changed = {q.key for q in m.changed}
    first = not state.market
    new: dict[tuple[str, str], QuoteView] = {}
    stockouts = []
    for q in m.quotes:
        old = state.market.get(q.key)
        qv = QuoteView(q.region, q.node, state.gpu(q.node), q.price, q.availability, f"{q.region}/{q.node}" in over)
        if old is not None:
            qv = attrs.evolve(
                qv, prev_price=old.prev_price, prev_availability=old.prev_availability, changed_at=old.changed_at
            )
            if q.key in changed and (old.price != q.price or old.availability != q.availability):
                qv = attrs.evolve(qv, prev_price=old.price, prev_availability=old.availability, changed_at=m.at)
                if q.availability <= 0 < old.availability:
                    stockouts.append(q.key)
        elif not first:
            qv = attrs.evolve(qv, changed_at=m.at)
        new[q.key] = qv
    state = attrs.evolve(state, market=new, market_seq=m.seq, now=max(state.now, m.at))
    for region, node in stockouts:
        state = _event(state, m.at, "market", "warn", env.source, f"stockout: {node} in {region}")
    if m.reason != "source" and changed:
        state = _event(state, m.at, "market", "info", env.source, f"market update ({m.reason}): {len(changed)} changed")
    return state


def _on_stats(state: State, env: Envelope) -> State:
    m: RoutingStats = env.msg
    deps = dict(state.deployments)
    met = done = 0
    for t in m.deployments:
        d = _dep(state, t.deployment)
        fin = t.completed + t.failed
        d = attrs.evolve(
            d,
            attainment=t.slo_met / fin if fin else -1.0,
            window_attainment=t.window_attainment,
            completed=t.completed,
            failed=t.failed,
            slo_met=t.slo_met,
            queued=t.queued,
            in_flight=t.in_flight,
            ttft_p99=t.ttft_p99,
            tpot_p99=t.tpot_p99,
        )
        deps[t.deployment] = _with_sample(d, m.at)
        met += t.slo_met
        done += fin
    hist = [h for h in state.stats_hist if h[0] < m.at] + [(m.at, met)]
    while len(hist) > 2 and m.at - hist[1][0] >= GOODPUT_S:
        hist.pop(0)
    t0, met0 = hist[0]
    goodput = max(0.0, (met - met0) / (m.at - t0)) if m.at > t0 else state.goodput
    return attrs.evolve(
        state,
        deployments=deps,
        goodput=goodput,
        attainment=met / done if done else -1.0,
        stats_hist=tuple(hist),
        now=max(state.now, m.at),
    )


def _on_result(state: State, env: Envelope) -> State:
    m: ctl.CommandResult = env.msg
    if m.ok:
        text, sev = f"{m.owner} accepted {m.command}", "info"
    else:
        text, sev = f"{m.owner} refused {m.command}: {m.field}: {m.reason}", "warn"
    return _event(state, m.at, "command", sev, env.source, text)


def _on_slo(state: State, env: Envelope) -> State:
    m: ctl.SloChanged = env.msg
    deps = dict(state.deployments)
    deps[m.deployment] = attrs.evolve(_dep(state, m.deployment), slo=SloView(m.ttft_s, m.tpot_s, m.attainment))
    state = attrs.evolve(state, deployments=deps)
    text = f"SLO of {m.deployment}: TTFT {m.ttft_s:g}s, TPOT {m.tpot_s:g}s, {m.attainment:.0%}"
    return _event(state, m.at, "command", "info", env.source, text)


def _on_actor(state: State, env: Envelope) -> State:
    m = env.msg
    actor, error, count = str(m.actor), str(m.error), int(m.count)
    kind = env.tag.rsplit(".", 1)[-1]
    if kind == "crashed":
        state = attrs.evolve(state, crashes=state.crashes + 1)
        return _event(state, state.now, "crash", "error", actor, f"crashed ({count} in window): {error}")
    if kind == "restarted":
        return _event(state, state.now, "crash", "warn", actor, f"restarted after: {error}")
    if kind == "gave_up":
        state = attrs.evolve(state, down=state.down | {actor})
        return _event(state, state.now, "crash", "error", actor, f"gave up after {count} crashes: {error}")
    return state


def _on_error(state: State, env: Envelope) -> State:
    m = env.msg
    state = attrs.evolve(state, errors=state.errors + 1)
    return _event(state, state.now, "error", "error", str(m.source), f"{m.tag}: {m.reason}")


_REFUSED = {401: "no valid key", 403: "model not allowed", 429: "over its rate"}


def _on_refused(state: State, env: Envelope) -> State:
    """The gateway's API-key refusals (merged per key) and the kernel's refused bus connections."""
    m = env.msg
    if env.tag == "gw.refused":
        why = f"{m.status} ({_REFUSED.get(int(m.status), 'refused')})"
        if m.window_s <= 0:
            text = f"refused a request of API key {m.key}: {why}"
        else:
            text = f"refused {m.count} more requests of API key {m.key} in {float(m.window_s):.1f}s: {why}"
        return _event(state, state.now, "access", "warn", env.source, text)
    text = f"refused a bus connection from {m.address} ({m.mechanism}): {m.reason}"
    return _event(state, state.now, "access", "warn", env.source, text)


def _on_peer(state: State, env: Envelope) -> State:
    m = env.msg
    kind = env.tag.rsplit(".", 1)[-1]
    name = str(m.name)
    if kind == "lost":
        return _event(state, state.now, "peer", "warn", name, f"peer lost (silent {float(m.silent_s):.0f}s)")
    if kind == "left":
        return _event(state, state.now, "peer", "info", name, "peer left" + (f": {m.reason}" if m.reason else ""))
    return _event(state, state.now, "peer", "info", name, "peer joined")


def _on_shutdown(state: State, env: Envelope) -> State:
    m = env.msg
    return _event(state, state.now, "mesh", "warn", str(m.source), f"mesh shutting down: {m.reason}".rstrip(": "))


def _on_alloc_state(state: State, env: Envelope) -> State:
    """The allocator's operator settings, as it applies them (whoever sent the commands)."""
    m: ctl.AllocatorState = env.msg
    pins = dict(m.pins)
    deps = {
        name: attrs.evolve(d, pinned=pins.get(name)) if d.pinned != pins.get(name) else d
        for name, d in state.deployments.items()
    }
    for name in sorted(pins.keys() - deps.keys()):
        deps[name] = attrs.evolve(DeploymentView(name), pinned=pins[name])
    return attrs.evolve(
        state, paused=m.paused, churn=m.churn_factor, forbidden=frozenset(m.forbidden), deployments=deps
    )


_HANDLERS: dict[str, Callable[[State, Envelope], State]] = {
    "ctl.alloc_state": _on_alloc_state,
    "mesh.setup": _on_setup,
    "mesh.end": _on_end,
    "plan.new": _on_plan,
    "fleet.update": _on_fleet,
    "fleet.action": _on_action,
    "fleet.node_lost": _on_node_lost,
    "fleet.fault": _on_fault,
    "dem.update": _on_demand,
    "mkt.update": _on_market,
    "req.stats": _on_stats,
    "ctl.result": _on_result,
    "slo.changed": _on_slo,
    "kernel.actor.crashed": _on_actor,
    "kernel.actor.restarted": _on_actor,
    "kernel.actor.gave_up": _on_actor,
    "kernel.error": _on_error,
    "kernel.peer.joined": _on_peer,
    "kernel.peer.left": _on_peer,
    "kernel.peer.lost": _on_peer,
    "kernel.shutdown": _on_shutdown,
    "kernel.auth.refused": _on_refused,
    "gw.refused": _on_refused,
}


# -- flood merging ----------------------------------------------------------------------------------


def merge_snapshots(older: Envelope, newer: Envelope) -> Envelope:
    """One envelope that stands for two snapshots of the same tag (``newer`` wins).

    A market update also lists what changed; the merged one lists the union, with the newer values.
    """
    if newer.tag == "mkt.update" and isinstance(older.msg, MarketUpdate) and isinstance(newer.msg, MarketUpdate):
        keys = {q.key for q in older.msg.changed} | {q.key for q in newer.msg.changed}
        changed = tuple(q for q in newer.msg.quotes if q.key in keys)
        return attrs.evolve(newer, msg=attrs.evolve(newer.msg, changed=changed))
    return newer


CLOCK_TAG = "tui.clock"
"""A mark the flood merging leaves where it took a snapshot away: it carries only the snapshot's time."""


def clock_mark(env: Envelope) -> Envelope | None:
    """A mark with ``env``'s kernel time (its ``at``), or None if it has none."""
    at = getattr(env.msg, "at", None)
    if isinstance(at, int | float) and not isinstance(at, bool):
        return Envelope("publish", env.source, CLOCK_TAG, float(at))
    return None


def _on_clock(state: State, env: Envelope) -> State:
    return attrs.evolve(state, now=max(state.now, float(env.msg)))


def is_snapshot(env: Envelope) -> bool:
    """Whether ``env`` carries a full snapshot that a later one of the same tag supersedes."""
    return env.tag in SNAPSHOT_TAGS


def wanted(tag: str) -> bool:
    """Whether the TUI shows messages with this tag (the prefixes of ``TOPICS``)."""
    return tag.startswith(TOPICS)


# -- steering ---------------------------------------------------------------------------------------


class FormError(ValueError):
    """Invalid input in a steering form: ``field`` names the form field, the message the reason."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


@attrs.frozen
class FieldSpec:
    """One input of a steering form. ``kind``: name, number, int, choice; ``optional``: blank means clear."""

    name: str
    label: str
    kind: str = "name"
    optional: bool = False
    choices: tuple[str, ...] = ()
    placeholder: str = ""


@attrs.frozen
class ActionSpec:
    """A steering action: its key, title, form fields and a one-line help."""

    name: str
    key: str
    title: str
    help: str
    fields: tuple[FieldSpec, ...] = ()
    confirm: bool = False


ACTIONS: dict[str, ActionSpec] = {
    a.name: a
    for a in (
        ActionSpec(
            "demand", "d", "Override demand", "fix a deployment's demand (req/s); leave blank to clear the override",
            (FieldSpec("deployment", "Deployment"),
             FieldSpec("rps", "Demand (req/s)", "number", True, (), "blank: clear")),
        ),
        ActionSpec(
            "availability", "a", "Set availability", "fix the nodes obtainable of (region, node type); 0 is a stockout",
            (FieldSpec("region", "Region"), FieldSpec("node", "Node type"),
             FieldSpec("count", "Nodes obtainable", "int", True, (), "blank: clear")),
        ),
        ActionSpec(
            "price", "$", "Set price", "fix the price (USD per node-hour) of (region, node type); blank clears",
            (FieldSpec("region", "Region"), FieldSpec("node", "Node type"),
             FieldSpec("price", "Price ($/node-hour)", "number", True, (), "blank: clear")),
        ),
        ActionSpec(
            "slo", "o", "Change SLO", "change a deployment's latency targets and attainment",
            (FieldSpec("deployment", "Deployment"), FieldSpec("ttft_s", "TTFT target (s)", "number"),
             FieldSpec("tpot_s", "TPOT target (s)", "number"),
             FieldSpec("attainment", "Attainment (0-1]", "number", False, (), "0.9")),
        ),
        ActionSpec(
            "forbid", "f", "Forbid template", "forbid a template, or allow it again",
            (FieldSpec("template_id", "Template id (or prefix)"),
             FieldSpec("forbid", "Action", "choice", False, ("forbid", "allow"))),
        ),
        ActionSpec(
            "pin", "n", "Pin template", "serve a deployment only with one aggregated template; blank unpins",
            (FieldSpec("deployment", "Deployment"),
             FieldSpec("template_id", "Template id (or prefix)", "name", True, (), "blank: unpin")),
        ),
        ActionSpec("drain", "x", "Drain instance", "drain and stop one instance", (FieldSpec("instance", "Instance"),)),
        ActionSpec("replan", "r", "Re-plan now", "ask the allocator to re-plan at its next tick", confirm=True),
        ActionSpec("pause", "p", "Pause/resume allocator", "pause the allocator (no new plans), or resume it",
                   confirm=True),
        ActionSpec(
            "churn", "c", "Set churn penalty", "set the churn-penalty factor (0 disables the start-up penalty)",
            (FieldSpec("factor", "Churn-penalty factor", "number"),),
        ),
    )
}  # fmt: skip


def suggestions(state: State, field: str, values: Mapping[str, str] | None = None) -> list[str]:
    """Known names for a form field (for completion), given what the form holds so far."""
    vals = values or {}
    if field == "deployment":
        return sorted(state.deployments)
    if field == "region":
        return list(state.regions)
    if field == "node":
        region = vals.get("region", "").strip()
        return sorted({n for r, n in state.market if not region or r == region})
    if field == "template_id":
        return state.known_templates()
    if field == "instance":
        return sorted((i.id for i in state.instances.values() if i.drainable), key=_natural)
    return []


def defaults(state: State, action: str, context: Mapping[str, str] | None = None) -> dict[str, str]:
    """Initial form values: the selection the form was opened from, and current settings where known."""
    ctx = dict(context or {})
    out = {f.name: ctx.get(f.name, "") for f in ACTIONS[action].fields}
    now: dict[str, str] = {}
    dep = state.deployments.get(out.get("deployment", ""))
    if action == "slo":
        slo = dep.slo if dep is not None else None
        now["attainment"] = "0.9"
        if slo is not None:
            now.update(ttft_s=f"{slo.ttft_s:g}", tpot_s=f"{slo.tpot_s:g}", attainment=f"{slo.attainment:g}")
        elif dep is not None:  # attached after the run's setup: the targets of a template it runs
            tpl = next((state.templates[t] for t, _ in dep.templates if t in state.templates), None)
            if tpl is not None and tpl.ttft_s > 0:
                now.update(ttft_s=f"{tpl.ttft_s:g}", tpot_s=f"{tpl.tpot_s:g}")
    if action == "demand" and dep is not None and dep.override:
        now["rps"] = f"{dep.demand:g}"
    q = state.market.get((out.get("region", ""), out.get("node", "")))
    if action == "availability" and q is not None and q.overridden:
        now["count"] = str(q.availability)
    if action == "price" and q is not None and q.overridden:
        now["price"] = f"{q.price:g}"
    if action == "forbid":
        now["forbid"] = "allow" if out.get("template_id", "") in state.forbidden else "forbid"
    if action == "churn" and state.churn is not None:
        now["factor"] = f"{state.churn:g}"
    return {k: v or now.get(k, "") for k, v in out.items()}


def _number(field: str, text: str, *, integer: bool = False) -> float:
    try:
        v = int(text) if integer else float(text)
    except ValueError:
        raise FormError(field, f"expected {'a whole number' if integer else 'a number'}, got {text!r}") from None
    if not math.isfinite(v):
        raise FormError(field, f"must be finite, got {text!r}")
    if v < 0:
        raise FormError(field, f"must not be negative, got {text}")
    return v


def _known(field: str, text: str, known: Sequence[str], what: str) -> str:
    if not text:
        raise FormError(field, "required")
    if text in known:
        return text
    if not known:
        raise FormError(field, f"no {what} known yet (nothing received from the mesh); cannot check {text!r}")
    shown = ", ".join(known[:8]) + (", ..." if len(known) > 8 else "")
    raise FormError(field, f"unknown {what} {text!r} (known: {shown})")


def build_command(state: State, action: str, values: Mapping[str, str], *, ref: int = 0) -> Any:
    """The control message for a filled-in form; raises FormError (field, reason) on invalid input.

    Names are checked against what the TUI has seen (deployments, market entries, templates, live
    instances), numbers against their range, and the message's own ``problems()`` last.
    """
    if action not in ACTIONS:
        raise FormError("action", f"unknown action {action!r} (known: {', '.join(ACTIONS)})")
    v = {k: str(x).strip() for k, x in values.items()}

    def get(name: str) -> str:
        return v.get(name, "")

    cmd: Any
    if action == "demand":
        dep = _known("deployment", get("deployment"), sorted(state.deployments), "deployment")
        cmd = ctl.SetDemand(dep, _number("rps", get("rps")) if get("rps") else None, ref)
    elif action in ("availability", "price"):
        region = _known("region", get("region"), list(state.regions), "region")
        offered = sorted(n for r, n in state.market if r == region)
        node = _known("node", get("node"), offered, f"node type offered in {region}:")
        if action == "availability":
            count = int(_number("count", get("count"), integer=True)) if get("count") else None
            cmd = ctl.SetAvailability(region, node, count, ref)
        else:
            price = _number("price", get("price")) if get("price") else None
            if price is not None and price <= 0:
                raise FormError("price", f"must be positive, got {get('price')}")
            cmd = ctl.SetPrice(region, node, price, ref)
    elif action == "slo":
        dep = _known("deployment", get("deployment"), sorted(state.deployments), "deployment")
        nums = {}
        for f in ("ttft_s", "tpot_s", "attainment"):
            if not get(f):
                raise FormError(f, "required")
            nums[f] = _number(f, get(f))
            if nums[f] <= 0:
                raise FormError(f, f"must be positive, got {get(f)}")
        if nums["attainment"] > 1:
            raise FormError("attainment", f"must be at most 1, got {get('attainment')}")
        cmd = ctl.SetSlo(dep, nums["ttft_s"], nums["tpot_s"], nums["attainment"], ref)
    elif action == "forbid":
        tid = _template(state, get("template_id"))
        mode = get("forbid") or "forbid"
        if mode not in ("forbid", "allow"):
            raise FormError("forbid", f"expected 'forbid' or 'allow', got {mode!r}")
        cmd = ctl.ForbidTemplate(tid, mode == "forbid", ref)
    elif action == "pin":
        dep = _known("deployment", get("deployment"), sorted(state.deployments), "deployment")
        pin = _template(state, get("template_id")) if get("template_id") else None
        if pin is not None and pin in state.templates:
            t = state.templates[pin]
            dmodel = state.deployments[dep].model
            if dmodel and t.model != dmodel:
                raise FormError("template_id", f"template {pin[:12]} serves {t.model}, not {dep}'s model {dmodel}")
            if t.mode != "aggregated":
                raise FormError("template_id", f"template {pin[:12]} is a {t.mode} template; pin an aggregated one")
        cmd = ctl.PinTemplate(dep, pin, ref)
    elif action == "drain":
        live = sorted((i.id for i in state.instances.values() if i.drainable), key=_natural)
        inst = get("instance")
        if inst in state.instances and inst not in live:
            raise FormError("instance", f"instance {inst} is {state.instances[inst].state}, not running")
        cmd = ctl.DrainInstance(_known("instance", inst, live, "running instance"), ref)
    elif action == "replan":
        cmd = ctl.Replan("operator", ref)
    elif action == "pause":
        cmd = ctl.PauseAllocator(not state.paused, ref)
    else:  # churn
        if not get("factor"):
            raise FormError("factor", "required")
        cmd = ctl.SetChurn(_number("factor", get("factor")), ref)
    bad = cmd.problems()
    if bad is not None:
        raise FormError(*bad)
    return cmd


def _natural(name: str) -> tuple[str, int]:
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return (head, int(tail) if tail else -1)


def _template(state: State, text: str) -> str:
    if not text:
        raise FormError("template_id", "required")
    tid = state.resolve_template(text)
    if tid is not None:
        return tid
    known = state.known_templates()
    if not known:
        raise FormError("template_id", f"no templates known yet (nothing from the mesh); cannot check {text!r}")
    if sum(1 for t in known if t.startswith(text)) > 1:
        raise FormError("template_id", f"prefix {text!r} matches several templates; type more of the id")
    raise FormError("template_id", f"unknown template {text!r} ({len(known)} known)")


def describe_command(cmd: Any) -> str:
    """A short human description of a control message."""
    if isinstance(cmd, ctl.SetDemand):
        return f"demand {cmd.deployment} = " + ("clear" if cmd.rps is None else f"{cmd.rps:g} req/s")
    if isinstance(cmd, ctl.SetAvailability):
        return f"availability {cmd.region}/{cmd.node} = " + ("clear" if cmd.count is None else str(cmd.count))
    if isinstance(cmd, ctl.SetPrice):
        return f"price {cmd.region}/{cmd.node} = " + ("clear" if cmd.price is None else f"${cmd.price:g}/h")
    if isinstance(cmd, ctl.SetSlo):
        return f"SLO {cmd.deployment} = TTFT {cmd.ttft_s:g}s TPOT {cmd.tpot_s:g}s @ {cmd.attainment:g}"
    if isinstance(cmd, ctl.ForbidTemplate):
        return f"{'forbid' if cmd.forbid else 'allow'} template {cmd.template_id[:12]}"
    if isinstance(cmd, ctl.PinTemplate):
        return f"pin {cmd.deployment} to " + ("nothing (unpin)" if cmd.template_id is None else cmd.template_id[:12])
    if isinstance(cmd, ctl.DrainInstance):
        return f"drain {cmd.instance}"
    if isinstance(cmd, ctl.Replan):
        return "re-plan now"
    if isinstance(cmd, ctl.PauseAllocator):
        return "pause allocator" if cmd.paused else "resume allocator"
    if isinstance(cmd, ctl.SetChurn):
        return f"churn factor = {cmd.factor:g}"
    return type(cmd).__name__


def owner_of(cmd: Any) -> str:
    """The actor that owns a command's setting."""
    return ctl.owner_of(cmd)


def note_sent(state: State, action: str, cmd: Any) -> tuple[State, int]:
    """Record a command about to be sent; returns the state and the command's number."""
    n = state.command_count + 1
    cv = CommandView(n, action, describe_command(cmd))
    state = attrs.evolve(state, commands=(*state.commands[-(MAX_COMMANDS - 1) :], cv), command_count=n)
    return _event(state, state.now, "command", "info", "tui", f"sent: {cv.text}"), n


def note_result(state: State, n: int, cmd: Any, result: Any | None, error: str = "") -> State:
    """Record the answer to command ``n``: a ``CommandResult``, or ``error`` when none came back.

    An accepted pause, churn, forbid or pin is reflected in the state at once; the allocator's next
    ``ctl.alloc_state`` confirms it (and tells every other client).
    """
    if result is not None:
        status = "ok" if result.ok else "refused"
        field, reason = str(result.field), str(result.reason)
    else:
        status, field, reason = "failed", "", error
    cmds = tuple(attrs.evolve(c, status=status, field=field, reason=reason) if c.n == n else c for c in state.commands)
    state = attrs.evolve(state, commands=cmds)
    if status == "ok":
        if isinstance(cmd, ctl.PauseAllocator):
            state = attrs.evolve(state, paused=cmd.paused)
        elif isinstance(cmd, ctl.SetChurn):
            state = attrs.evolve(state, churn=float(cmd.factor))
        elif isinstance(cmd, ctl.ForbidTemplate):
            fb = state.forbidden | {cmd.template_id} if cmd.forbid else state.forbidden - {cmd.template_id}
            state = attrs.evolve(state, forbidden=frozenset(fb))
        elif isinstance(cmd, ctl.PinTemplate) and cmd.deployment in state.deployments:
            deps = dict(state.deployments)
            deps[cmd.deployment] = attrs.evolve(deps[cmd.deployment], pinned=cmd.template_id)
            state = attrs.evolve(state, deployments=deps)
    if status == "failed":
        return _event(state, state.now, "command", "error", "tui", f"{describe_command(cmd)}: not confirmed: {reason}")
    return state
