"""Fleet protocol: the instance supervisor's view of nodes and instances, and its talk with stage workers.

Published by the supervisor:

- ``fleet.update`` (``FleetUpdate``): every live instance (provisioning, loading, serving, retiring,
  draining) with
  its head worker and routing weight, what was lost or stopped since the previous update, starts waiting
  for capacity, the fleet's cost rate and what it has cost so far;
- ``fleet.action`` (``FleetAction``): one start, stop, drain, release, refusal or loss decision;
- ``fleet.node_lost`` (``NodeLost``): a node found dead (silent past the heartbeat timeout) or preempted;
- ``fleet.unmet`` (``CapacityShort``): a deployment's serving capacity fell below its demand, or recovered.

Between the supervisor and a node's stage worker (directed): ``LoadStage``, ``ServeInstance``,
``DrainOrder``, ``ReleaseNode`` (supervisor -> worker); ``StageLoaded``, ``InstanceDrained``,
``WorkerHeartbeat``, ``EngineFault`` (worker -> supervisor). ``fleet.engine_stats`` (``EngineStats``): a
real engine's server metrics, published by its worker at each heartbeat. ``KillNode`` is the simulated
cloud's physical fault (the node's process dies), not a supervisor decision. ``fleet.fault``
(``FaultInjected``) is an external input: a fault injection (the scenario's events, or a test).
"""

from __future__ import annotations

import attrs

from coral.kernel import message

INSTANCE_STATES = ("provisioning", "loading", "serving", "retiring", "draining", "stopped", "lost")
LIVE_STATES = ("provisioning", "loading", "serving")
"""States of the instances a plan counts as running (a ``retiring`` instance serves until its
replacements do, then drains; the plan no longer counts it)."""
ROUTABLE_STATES = ("serving", "retiring")
FAULT_KINDS = ("node_loss", "preemption", "hang")


@attrs.frozen
class InstanceInfo:
    """One instance as the fleet sees it. ``weight`` is its capacity in requests/s (routing weight);
    ``kv_nic`` the smallest NIC of its nodes in bytes/s (what a KV transfer from it runs at);
    ``endpoint`` the HTTP base URL of its head node's OpenAI-compatible server ("" when its engine has none,
    as the simulated engine); ``kv_min_nic`` (decode instances) its template's ``kv_min_nic``: the slowest
    sender ``kv_nic`` whose KV handoff it takes within its TPOT (0: any)."""

    id: str
    deployment: str
    template_id: str
    region: str
    mode: str
    state: str
    node_types: tuple[str, ...]
    node_ids: tuple[str, ...]
    head: str
    weight: float
    kv_nic: float
    since: float
    endpoint: str = ""
    kv_min_nic: float = 0.0

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.deployment, self.template_id, self.region)


@attrs.frozen
class PendingStart:
    """Instances of a plan key that wait for nodes (the cloud refused them for now)."""

    deployment: str
    template_id: str
    region: str
    count: int


@message("fleet.update")
@attrs.frozen
class FleetUpdate:
    """The live fleet after the supervisor's latest changes."""

    seq: int
    at: float
    instances: tuple[InstanceInfo, ...]
    lost: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    drained_by_operator: tuple[str, ...] = ()
    pending: tuple[PendingStart, ...] = ()
    cost_per_hour: float = 0.0
    spent_usd: float = 0.0
    trigger: str = ""

    def live_counts(self) -> dict[tuple[str, str, str], int]:
        """(deployment, template, region) -> instances provisioning, loading or serving."""
        out: dict[tuple[str, str, str], int] = {}
        for i in self.instances:
            if i.state in LIVE_STATES:
                out[i.key] = out.get(i.key, 0) + 1
        return out


@message("fleet.action")
@attrs.frozen
class FleetAction:
    """One supervisor decision: ``start``, ``serving``, ``retire``, ``drain``, ``stop``, ``release``,
    ``refused``, ``lost``, ``keep`` (a surplus instance still loading kept as a bridge) or ``adopt`` (an
    instance taken over after a crash, ``coral up --resume``)."""

    at: float
    action: str
    instance: str
    deployment: str
    template_id: str
    region: str
    reason: str = ""


@message("fleet.unmet")
@attrs.frozen
class CapacityShort:
    """A deployment's serving capacity fell below its demand (``short``), or rose back to it (not
    ``short``): published when that changes, as a warning the TUI and ``coral up`` show. Capacity is
    ``coral.capacity``'s, demand the latest plan's, both in requests/s; ``cause`` says why it fell:
    ``nodes lost`` (since the latest plan), ``waiting for nodes`` (a start the cloud refused for now),
    ``replacement loading``, or ``plan`` (the plan itself serves less)."""

    at: float
    deployment: str
    demand_rps: float
    capacity_rps: float
    short: bool
    cause: str = ""

    @property
    def unmet_rps(self) -> float:
        return max(0.0, self.demand_rps - self.capacity_rps)


@message("fleet.node_lost")
@attrs.frozen
class NodeLost:
    """A node found dead: ``cause`` is ``heartbeat`` (silent past the timeout), ``preempted``, or
    ``engine: REASON`` (its worker reported an engine fault)."""

    at: float
    node_id: str
    region: str
    node_type: str
    instance: str
    cause: str


@message("fleet.fault")
@attrs.frozen
class FaultInjected:
    """An external fault: ``kind`` (node_loss, preemption, hang) on ``count`` nodes of a type in a region.

    ``hang``: the node's stage worker wedges: it stays connected to the bus (its socket and the kernel's
    transport heartbeats live on) but does nothing more, no heartbeats to the supervisor included."""

    at: float
    kind: str
    region: str
    node: str
    count: int = 1


@message("fleet.heartbeat")
@attrs.frozen
class WorkerHeartbeat:
    """Worker -> supervisor: the node is alive; ``in_flight`` requests held by its engine."""

    node_id: str
    at: float
    state: str
    in_flight: int = 0


@message("fleet.load")
@attrs.frozen
class LoadStage:
    """Supervisor -> worker: load stage ``stage`` of a template for an instance (``warm``: no load time)."""

    instance: str
    deployment: str
    template_id: str
    stage: int
    region: str
    head: bool
    warm: bool = False


@message("fleet.loaded")
@attrs.frozen
class StageLoaded:
    """Worker -> supervisor: the stage is loaded; ``endpoint`` is the engine's HTTP base URL, if it has one."""

    node_id: str
    instance: str
    at: float
    endpoint: str = ""


@message("fleet.engine_fault")
@attrs.frozen
class EngineFault:
    """Worker -> supervisor: the node's engine broke (a real server died); the node is lost."""

    node_id: str
    instance: str
    at: float
    reason: str


@message("fleet.engine_stats")
@attrs.frozen
class EngineStats:
    """Worker -> bus (published at each heartbeat by an engine that runs a real server): what the server
    reports (vLLM's ``/metrics``): requests running and waiting, KV-cache use (0..1), prompt and generated
    token counters and preemptions since it started."""

    node_id: str
    instance: str
    at: float
    running: int
    waiting: int
    kv_cache_usage: float
    prompt_tokens: float
    generation_tokens: float
    preemptions: int


@message("fleet.serve")
@attrs.frozen
class ServeInstance:
    """Supervisor -> head worker: every stage is loaded, take requests."""

    instance: str


@message("fleet.drain")
@attrs.frozen
class DrainOrder:
    """Supervisor -> head worker: stop taking requests, hand back the unstarted ones, finish the rest."""

    instance: str
    reason: str = ""


@message("fleet.drained")
@attrs.frozen
class InstanceDrained:
    """Head worker -> supervisor: the draining instance holds no more requests."""

    instance: str
    node_id: str
    at: float


@message("fleet.release")
@attrs.frozen
class ReleaseNode:
    """Supervisor -> worker: the node is released; stop the engine and exit."""

    node_id: str
    reason: str = ""


@message("fleet.kill")
@attrs.frozen
class KillNode:
    """Simulated cloud -> worker: the node dies now (its process vanishes without a word); with cause
    ``hang`` the worker wedges instead (see ``FaultInjected``); ``terminated``: the provider ended the
    machine of a released node, which ends even a wedged worker."""

    node_id: str
    cause: str = "node_loss"
