"""The TUI's view models: frozen attrs classes that the widgets read, and the ``State`` that holds them.

``State`` and its parts are frozen; the reducer (``tui.reducer``) makes new ones and never mutates. Time in
the state is the kernel's time as the messages carry it.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from coral.messages.fleet import LIVE_STATES, ROUTABLE_STATES
from coral.plan import PlannedInstances

HISTORY_S = 15 * 60.0
"""How much kernel time the sparklines keep."""
MAX_PLANS = 500
MAX_EVENTS = 2000
MAX_COMMANDS = 200
LINK_LOST = "the link to the mesh was lost before an answer came; it may or may not have been applied"
"""Why a command in flight when the link was lost has no answer (it is not resent)."""
COMMAND_TIMEOUT_S = 20.0
"""A command with no answer this many seconds after it was sent (the TUI's monotonic clock, not kernel
time: a stalled mesh must not stall the bound) is shown failed. The bus gives up on a request after 15 s
(``LiveSource.request_timeout_s``), so this catches only an answer that was lost on the way."""
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
    "fleet.unmet",
    "fleet.fault",
    "dem.update",
    "mkt.update",
    "req.stats",
    "ctl.",
    "slo.changed",
    "kernel.actor.",
    "kernel.error",
    "kernel.peer.",
    "kernel.auth.",
    "gw.refused",
    "kernel.shutdown",
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
    deployment: str = ""
    capacity_rps: float = 0.0
    """Requests/s of one instance for ``deployment`` (0: not known, the mesh was not asked)."""
    usable: bool = True


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
    sent_at: float = 0.0
    """When it was sent, on the TUI's monotonic clock (seconds)."""


@attrs.frozen
class PreviewRow:
    """One row of a previewed plan: ``count`` instances of a template in a region."""

    deployment: str
    region: str
    count: int
    mode: str
    nodes: tuple[str, ...]


@attrs.frozen
class PreviewView:
    """The allocator's preview of the next plan after a pin, forbid or allow (``ok``), or its refusal
    (``field``, ``reason``), next to the latest plan's figures."""

    ok: bool
    field: str = ""
    reason: str = ""
    status: str = ""
    instances: int = 0
    cost_per_hour: float = 0.0
    unmet: float = 0.0
    now_instances: int = 0
    now_cost_per_hour: float = 0.0
    now_unmet: float = 0.0
    rows: tuple[PreviewRow, ...] = ()


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
    unanswered: tuple[int, ...] = ()
    """Commands that had no answer when the link was lost: reported as dropped (not resent) at reconnect."""
    paused: bool = False
    churn: float | None = None
    forbidden: frozenset[str] = frozenset()
    goodput: float = 0.0
    attainment: float = -1.0
    stats_hist: tuple[tuple[float, int], ...] = ()
    crashes: int = 0
    down: frozenset[str] = frozenset()
    errors: int = 0
    unknown_templates: frozenset[str] = frozenset()
    runs: int = 0
    """Run setups seen (a new run's templates have no capacity until the mesh is asked again)."""
    changed_since_plan: bool = False
    """An input the allocator re-plans on (demand, market, an accepted command) came after the last plan."""
    speed: float = 0.0
    """The run's pace (kernel s per wall s; 0: unknown or as fast as possible), from the gateway."""
    behind_s: float = 0.0
    """How many kernel seconds the mesh is behind the wall clock at its pace, from the gateway."""

    @property
    def cost_per_hour(self) -> float:
        """The live fleet's cost rate, or the latest plan's before the fleet reported."""
        if self.fleet_cost is not None:
            return self.fleet_cost
        return self.plans[-1].cost_per_hour if self.plans else 0.0

    @property
    def waiting_commands(self) -> int:
        """Commands sent and not yet answered."""
        return sum(1 for c in self.commands if c.status == "pending")

    @property
    def plan_pending(self) -> bool:
        """Paused with inputs that would have made a new plan."""
        return self.paused and self.changed_since_plan

    @property
    def planned_cost(self) -> float | None:
        """The latest plan's cost rate (what the allocator asked for), None before any plan."""
        return self.plans[-1].cost_per_hour if self.plans else None

    @property
    def unmet(self) -> float:
        """Demand the latest plan leaves unmet (req/s)."""
        return sum(d.unmet for d in self.deployments.values())

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


def recent_keys(state: State) -> frozenset[tuple[str, str]]:
    """The market entries that changed within ``RECENT_S`` (shown highlighted)."""
    return frozenset(k for k, q in state.market.items() if state.recent(q))


def initial_state(*, gpu_of: Mapping[str, str] | None = None, link: Link | None = None) -> State:
    """An empty state; ``gpu_of`` maps node types to GPU types (from the catalog)."""
    return State(link=link or Link(), gpu_of=dict(gpu_of or {}))
