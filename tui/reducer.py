"""The reducer: ``apply(state, env)`` folds one bus envelope into a new ``State`` (``tui.model``).

Every dependency of the TUI on published message fields lives here, with ``merge_snapshots`` (how a flood
merges snapshot messages) and the folding of command answers and inspection replies. ``apply`` never
mutates its input (it copies the mappings it changes), so a state can be kept, compared and snapshotted;
it never reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs

from coral.capacity import serving_capacity
from coral.display import gap_text
from coral.kernel import DecodeError, Envelope, ErrorEvent
from coral.kernel.codec import decode
from coral.messages import control as ctl
from coral.messages.demand import DemandUpdate
from coral.messages.fleet import CapacityShort, FaultInjected, FleetAction, FleetUpdate, NodeLost
from coral.messages.inspect import (
    ClockInfo,
    ClockRequest,
    PlanPreview,
    ScenarioInfo,
    ScenarioRequest,
    TemplatesReply,
)
from coral.messages.market import MarketUpdate
from coral.messages.mesh import MeshEnd, MeshSetup
from coral.messages.plan import NewPlan
from coral.messages.requests import RoutingStats
from coral.templates import Template
from tui.model import (
    GOODPUT_S,
    HISTORY_S,
    LINK_LOST,
    LOST_SHOWN_S,
    MAX_COMMANDS,
    MAX_EVENTS,
    MAX_PLANS,
    SNAPSHOT_TAGS,
    TOPICS,
    CommandView,
    DeploymentView,
    DiffRow,
    EventView,
    InstanceView,
    Link,
    PlanView,
    PreviewRow,
    PreviewView,
    QuoteView,
    Sample,
    ServingRow,
    SloView,
    StageView,
    State,
    TemplateView,
)
from tui.steering import describe_command

# -- folding ------------------------------------------------------------------------------------


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


def scenario_request() -> ScenarioRequest:
    """What a client asks the allocator for the run's deployments."""
    return ScenarioRequest()


def clock_request() -> ClockRequest:
    """What a client asks the operator gateway for where the clock stands."""
    return ClockRequest()


def preview_view(reply: object) -> PreviewView | None:
    """A ``PlanPreview`` reply as the confirmation shows it (None for any other reply)."""
    if not isinstance(reply, PlanPreview):
        return None
    rows = tuple(PreviewRow(r.deployment, r.region, r.count, r.mode, tuple(r.nodes)) for r in reply.rows)
    return PreviewView(
        reply.ok, reply.field, reply.reason, reply.status, reply.instances, reply.cost_per_hour, reply.unmet_rps,
        reply.current_instances, reply.current_cost_per_hour, reply.current_unmet_rps, rows,
    )  # fmt: skip


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
    """The state with a new connection status (logged as a mesh event when it changes).

    Losing the link fails every command still waiting for its answer: the answer cannot come on this
    connection, and whether the mesh applied the command is unknown. They are not resent on reconnect
    (a drain or a re-plan sent twice does something twice); reconnecting logs them as dropped, so that
    the operator checks and sends again what is still wanted."""
    if link == state.link:
        return state
    was = state.link.state
    state = attrs.evolve(state, link=link)
    if link.state in ("lost", "connected"):
        sev = "warn" if link.state == "lost" else "info"
        state = _event(state, state.now, "mesh", sev, "tui", f"{link.state}: {link.detail}".rstrip(": "))
    if link.state == "lost" and was != "lost":
        waiting = [c.n for c in state.commands if c.status == "pending"]
        state = _fail_commands(state, waiting, LINK_LOST)
        state = attrs.evolve(state, unanswered=(*state.unanswered, *waiting))
    elif link.state == "connected" and state.unanswered:
        texts = {c.n: c.text for c in state.commands}
        listed = "; ".join(f"#{n} {texts.get(n, '?')}" for n in state.unanswered)
        text = (
            f"{len(state.unanswered)} command(s) unanswered when the link was lost were dropped, not resent: "
            f"{listed}. Check the allocator's state and send again what is still wanted"
        )
        state = _event(attrs.evolve(state, unanswered=()), state.now, "command", "warn", "tui", text)
    return state


def expire_commands(state: State, now: float, timeout_s: float) -> State:
    """Fail the commands sent at least ``timeout_s`` before ``now`` (the TUI's monotonic clock, like
    ``CommandView.sent_at``) that have no answer yet; ``state`` itself when there are none."""
    late = [c.n for c in state.commands if c.status == "pending" and now - c.sent_at >= timeout_s]
    if not late:
        return state
    reason = f"no answer within {timeout_s:g} s; not resent: it may or may not have been applied"
    return _fail_commands(state, late, reason)


def _fail_commands(state: State, numbers: Iterable[int], reason: str) -> State:
    """Mark commands ``numbers`` failed with ``reason``, one error event each."""
    todo = set(numbers)
    if not todo:
        return state
    failed = [c for c in state.commands if c.n in todo]
    cmds = tuple(attrs.evolve(c, status="failed", reason=reason) if c.n in todo else c for c in state.commands)
    state = attrs.evolve(state, commands=cmds)
    for c in failed:
        state = _event(state, state.now, "command", "error", "tui", f"#{c.n} {c.text}: not confirmed: {reason}")
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
    gpu_of = dict(state.gpu_of)
    for t in templates:
        new[t.id] = _template_view(t)
        for st in t.stages:
            gpu_of.setdefault(st.node, st.gpu)
    return attrs.evolve(state, templates=new, gpu_of=gpu_of)


def missing_templates(state: State) -> list[str]:
    """Ids of templates the fleet or the latest plan uses that the state has no stages for (and the mesh
    has not said it does not know)."""
    return [t for t in state.known_templates() if t not in state.templates and t not in state.unknown_templates]


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
        unanswered=state.unanswered,
        plan_count=state.plan_count,
        runs=state.runs + 1,
    )
    state = add_templates(state, m.templates)
    text = f"run set up: scenario {m.scenario_name}, policy {m.policy}, {len(m.templates)} templates, seed {m.seed}"
    return _event(state, state.now, "mesh", "info", env.source, text)


def _on_scenario(state: State, env: Envelope) -> State:
    """The mesh's answer to ``ScenarioRequest``: every deployment with its model and the SLO in force."""
    m: ScenarioInfo = env.msg
    deps = dict(state.deployments)
    for d in m.deployments:
        old = _dep(state, d.name)
        deps[d.name] = attrs.evolve(old, model=d.model, slo=SloView(d.ttft_s, d.tpot_s, d.attainment))
    gpu_of = {**state.gpu_of, **dict(m.node_gpus)}
    return attrs.evolve(state, deployments=deps, scenario=state.scenario or m.name, gpu_of=gpu_of)


def _on_templates(state: State, env: Envelope) -> State:
    """The mesh's answer to ``TemplatesRequest``: templates with the deployment, capacity and usability."""
    m: TemplatesReply = env.msg
    state = add_templates(state, [e.template for e in m.entries])
    new = dict(state.templates)
    for e in m.entries:
        new[e.template.id] = attrs.evolve(
            new[e.template.id], deployment=e.deployment, capacity_rps=e.capacity_rps, usable=e.usable
        )
    return attrs.evolve(state, templates=new, unknown_templates=state.unknown_templates | frozenset(m.unknown))


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
    state = attrs.evolve(
        state, plans=plans, plan_count=n, deployments=deps, now=max(state.now, p.at), changed_since_plan=False
    )
    text = (
        f"plan #{p.seq} ({p.trigger}): ${p.cost_per_hour:,.2f}/h, +{m.starts} -{m.stops}, {p.status}"
        + (f" gap {gap_text(p.gap)}" if p.gap > 0 else "")
        + (f", unmet {p.unmet_rps:.2f} req/s" if p.unmet_rps > 1e-9 else "")
    )
    return _event(state, p.at, "plan", "warn" if p.unmet_rps > 1e-9 else "info", env.source, text)


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
    cap = serving_capacity(insts.values())
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


def _on_unmet(state: State, env: Envelope) -> State:
    m: CapacityShort = env.msg
    planned = (
        next((s.unmet for s in state.plans[-1].serving if s.deployment == m.deployment), 0.0) if state.plans else 0.0
    )
    deps = dict(state.deployments)
    deps[m.deployment] = attrs.evolve(_dep(state, m.deployment), unmet=max(planned, m.unmet_rps))
    state = attrs.evolve(state, deployments=deps, now=max(state.now, m.at))
    have = f"capacity {m.capacity_rps:.2f} req/s"
    if m.short:
        text, sev = f"{m.deployment}: {have} below demand {m.demand_rps:.2f} req/s ({m.cause})", "warn"
    else:
        text, sev = f"{m.deployment}: {have} meets demand {m.demand_rps:.2f} req/s again", "info"
    return _event(state, m.at, "fleet", sev, env.source, text)


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
    state = attrs.evolve(state, deployments=deps, now=max(state.now, m.at), changed_since_plan=True)
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
    state = attrs.evolve(state, market=new, market_seq=m.seq, now=max(state.now, m.at), changed_since_plan=True)
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
        if m.command != "ctl.pause":
            state = attrs.evolve(state, changed_since_plan=True)
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


def _on_peer(state: State, env: Envelope) -> State:
    m = env.msg
    kind = env.tag.rsplit(".", 1)[-1]
    name = str(m.name)
    if kind == "lost":
        return _event(state, state.now, "peer", "warn", name, f"peer lost (silent {float(m.silent_s):.0f}s)")
    if kind == "left":
        return _event(state, state.now, "peer", "info", name, "peer left" + (f": {m.reason}" if m.reason else ""))
    return _event(state, state.now, "peer", "info", name, "peer joined")


_REFUSED = {401: "no valid key", 403: "model not allowed", 429: "over its rate"}


def _on_refused(state: State, env: Envelope) -> State:
    """The gateway's API-key refusals (merged per key) and the kernel's refused bus connections (merged
    per peer)."""
    m = env.msg
    if env.tag == "gw.refused":
        why = f"{m.status} ({_REFUSED.get(int(m.status), 'refused')})"
        if m.window_s <= 0:
            text = f"refused a request of API key {m.key}: {why}"
        else:
            text = f"refused {m.count} more requests of API key {m.key} in {float(m.window_s):.1f}s: {why}"
        return _event(state, state.now, "access", "warn", env.source, text)
    text = f"refused {int(m.count)} bus connection(s) from {m.address} ({m.mechanism}): {m.reason}"
    return _event(state, state.now, "access", "warn", str(m.address), text)


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


def _on_clock_info(state: State, env: Envelope) -> State:
    """The gateway's answer to ``ClockRequest``: how far the mesh is behind the wall clock."""
    m: ClockInfo = env.msg
    return attrs.evolve(state, speed=m.speed, behind_s=m.behind_s, now=max(state.now, m.at))


_HANDLERS: dict[str, Callable[[State, Envelope], State]] = {
    "ctl.alloc_state": _on_alloc_state,
    "inspect.scenario": _on_scenario,
    "inspect.templates": _on_templates,
    "inspect.clock": _on_clock_info,
    "mesh.setup": _on_setup,
    "mesh.end": _on_end,
    "plan.new": _on_plan,
    "fleet.update": _on_fleet,
    "fleet.action": _on_action,
    "fleet.node_lost": _on_node_lost,
    "fleet.unmet": _on_unmet,
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
    "kernel.auth.refused": _on_refused,
    "gw.refused": _on_refused,
    "kernel.shutdown": _on_shutdown,
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


def note_sent(state: State, action: str, cmd: Any, at: float = 0.0) -> tuple[State, int]:
    """Record a command about to be sent at ``at`` (the TUI's monotonic clock); returns the state and the
    command's number."""
    n = state.command_count + 1
    cv = CommandView(n, action, describe_command(cmd), sent_at=at)
    state = attrs.evolve(state, commands=(*state.commands[-(MAX_COMMANDS - 1) :], cv), command_count=n)
    return _event(state, state.now, "command", "info", "tui", f"sent: {cv.text}"), n


def note_result(state: State, n: int, cmd: Any, result: Any | None, error: str = "") -> State:
    """Record the answer to command ``n``: a ``CommandResult``, or ``error`` when none came back.

    An accepted pause, churn, forbid, pin or speed is reflected in the state at once; the allocator's next
    ``ctl.alloc_state`` confirms it (and tells every other client). A failure of a command already
    settled (failed when the link was lost, or timed out) changes nothing; a late answer is recorded.
    """
    if result is None and not any(c.n == n and c.status == "pending" for c in state.commands):
        return state
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
        elif isinstance(cmd, ctl.SetSpeed):  # the lag counts from the change (``actors.compose.drive``)
            state = attrs.evolve(state, speed=float(cmd.speed or 0.0), behind_s=0.0)
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
