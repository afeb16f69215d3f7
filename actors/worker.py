"""The stage worker: one per node of an instance; it owns the node's engine.

The supervisor tells it which stage to load (``LoadStage``); it reports ``StageLoaded`` at the first tick
the engine is ready, heartbeats every ``heartbeat_s`` (with a real engine, it also publishes its server's metrics as
``EngineStats``) and, on the instance's head node, runs the engine:
takes the router's work (``Dispatch``), polls the engine at every tick and wake and sends the outcomes to
the router. A drain hands the unstarted requests back to the router and reports ``InstanceDrained`` when the
engine is empty; a release stops the engine and ends the worker (through ``on_exit``, so that the mesh
stops it between ticks rather than while it synchronises). ``KillNode`` (the simulated cloud's
fault) ends it at once, without a word: its node is dead (a real engine's server is killed with it); with
cause ``hang`` it wedges instead: connected but silent, until its node is terminated. An engine that
breaks by itself (``engine.fault``: a real server died) is reported to the supervisor as ``EngineFault``
and ends the worker; the supervisor loses the node at once.

Delivery is prompt (``actors.base``): the worker applies its messages within ``HOP_S`` of their arrival,
and then runs its engine up to that instant and sends what finished (``on_wake``); the rest of its work
(load checks, heartbeats) keeps the tick.

Waiting: each report to the router says how many of its requests the engine holds but has not started
(``Completions.waiting``, when the engine says: the simulated one does), and a report goes out when only
that number changed.

Progress: for work items with ``progress`` (the HTTP gateway's streamed requests), the head worker reports the
tokens generated so far whenever they grow (``progress`` outcomes), at the engine's times: while such a
request is in flight it asks to be woken at the engine's next event (``next_event_at``), so each token
leaves at its simulated time. It reads them from the simulated engine's instance model; an engine without
one (vLLM serves the gateway over HTTP itself) reports none. Other requests' outcomes leave at the next
wake or tick: their times are the engine's exact times either way.

Engine time: a decode instance's engine runs ``DECODE_LAG_S`` (two hops) behind the kernel clock, so that a KV
handoff is admitted at its exact time. A handoff at engine time ``t`` is admitted on its decode instance at
``t`` plus the KV transfer, at least ``NET_LATENCY_S`` plus the prompt's KV bytes over the prefill
instance's slowest NIC. So the prefill head need not wake at each of its engine's events: it asks the
engine for its handoff window (``handoff_window``: the earliest time the next handoff can happen, and the
latest time it can be reported at) and wakes once inside it, at the window's coarsest instant
(``shared_instant``), which many heads share, so the virtual clock stops once for all of them. A report
sent at ``w`` is applied by the router at ``next_instant(w)`` and by the decode head a hop later, while
the decode engine's clock is still at or before ``w``, so not after the admission. All the handoffs that
happened since the last report leave in one message. A streamed request's tokens on a decode instance
reach the gateway the lag (about 2 ms) late; a watched request's first token leaves with its handoff,
when the head wakes at each event anyway.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from actors.base import HOP_S, TickActor, next_instant
from coral.engines import Engine, StageAssignment
from coral.kernel import Envelope
from coral.messages.control import ROUTER, SUPERVISOR
from coral.messages.fleet import (
    DrainOrder,
    EngineFault,
    EngineStats,
    InstanceDrained,
    KillNode,
    LoadStage,
    ReleaseNode,
    ServeInstance,
    StageLoaded,
    WorkerHeartbeat,
)
from coral.messages.mesh import MeshTiming
from coral.messages.requests import Completions, Dispatch, Outcome
from coral.scenario import Deployment
from coral.templates import Template

DECODE_LAG_S = 2 * HOP_S
"""How far a decode head's engine runs behind the kernel clock: the two hops of a KV handoff (prefill head ->
router -> decode head; see the module docstring)."""


def shared_instant(lo: float, due: float) -> float:
    """The coarsest instant in ``[lo, due]``: the first multiple of 1 s, else of 1/2 s, ... down to ``HOP_S``
    at or after ``lo`` that is not after ``due`` (else ``lo``). Instants on a coarse grid are shared by
    many actors, and the virtual clock stops once per instant, not once per actor."""
    scale = 1
    while scale * HOP_S <= 1:
        at = math.ceil(lo * scale) / scale
        if at <= due:
            return at
        scale *= 2
    return lo


def worker_name(node_id: str) -> str:
    """The actor name of a node's stage worker."""
    return f"worker-{node_id}"


class StageWorker(TickActor):
    """A node's agent (see the module docstring)."""

    prompt = True

    def __init__(
        self,
        node_id: str,
        *,
        region: str,
        node_type: str,
        timing: MeshTiming,
        engine: Engine,
        templates: Mapping[str, Template],
        deployments: Mapping[str, Deployment],
        router: str = ROUTER,
        supervisor: str = SUPERVISOR,
        on_exit: Callable[[str], None] | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name or worker_name(node_id), tick_s=timing.tick_s)
        self.node_id = node_id
        self.region = region
        self.node_type = node_type
        self.timing = timing
        self.engine = engine
        self.templates = templates
        self.deployments = deployments
        self.router = router
        self.supervisor = supervisor
        self.on_exit = on_exit
        self.exited = False
        self.state = "idle"  # idle | loading | loaded | serving | draining | released | dead | hung
        self.instance = ""
        self.head = False
        self.lag = 0.0
        self.prefill = False  # the head of a prefill instance: wakes in its engine's handoff windows
        self.ready_at: float | None = None
        self.loaded_sent = False
        self.drained_sent = False
        self.hb_every = timing.ticks(timing.heartbeat_s)
        self.ticks = 0
        self.watched: dict[int, int] = {}
        self.waiting = 0 if callable(getattr(engine, "waiting", None)) else -1

    def engine_now(self, now: float) -> float:
        return now - self.lag

    async def on_message(self, env: Envelope) -> None:
        msg = env.msg
        now = self.ctx.now()
        if self.state in ("dead", "released"):
            return
        if isinstance(msg, KillNode):
            if msg.cause != "hang":
                self.state = "dead"
                kill = getattr(self.engine, "kill", None)
                if kill is not None:
                    kill()
            elif self.state != "hung":
                self.state = "hung"
        elif self.state == "hung":
            return  # wedged: takes its messages and does nothing
        elif isinstance(msg, LoadStage):
            tpl = self.templates[msg.template_id]
            self.instance = msg.instance
            self.head = msg.head
            if msg.head and tpl.mode == "decode":
                self.lag = DECODE_LAG_S
            self.prefill = msg.head and tpl.mode == "prefill"
            stage = StageAssignment(
                msg.instance, self.deployments[msg.deployment], tpl, msg.stage, msg.region, msg.head, msg.warm
            )
            self.ready_at = self.engine.load(stage, self.engine_now(now)) + self.lag
            self.state = "loading"
        elif isinstance(msg, ServeInstance) and msg.instance == self.instance:
            self.engine.serve(self.engine_now(now))
            self.state = "serving"
        elif isinstance(msg, Dispatch) and msg.instance == self.instance and self.head:
            self.engine.submit(msg.items, self.engine_now(now))
            for item in msg.items:
                if item.progress:
                    self.watched[item.id] = item.gen
        elif isinstance(msg, DrainOrder) and msg.instance == self.instance:
            back = self.engine.drain(self.engine_now(now))
            self.state = "draining"
            if back:
                await self.ctx.send(self.router, Completions(self.instance, now, tuple(back)))
        elif isinstance(msg, ReleaseNode):
            self.engine.stop(self.engine_now(now))
            self.state = "released"

    async def on_tick(self, now: float) -> None:
        if self.state == "hung":
            return  # no heartbeat, no work; the bus connection lives on
        if self.state in ("dead", "released"):
            if not self.exited:
                self.exited = True
                if self.on_exit is not None:
                    self.on_exit(self.name)  # the mesh ends it between ticks
                else:
                    self.ctx.bus.stop_receiving()  # the actor ends once its inbox is drained
            return
        self.ticks += 1
        if self.state == "loading" and self.engine.loaded(self.engine_now(now)):
            self.state = "loaded"
        fault = self.engine.fault
        if fault and self.state not in ("idle", "dead", "released"):
            self.state = "dead"
            await self.ctx.send(self.supervisor, EngineFault(self.node_id, self.instance, now, fault))
            self.engine.stop(self.engine_now(now))
            return
        if self.state in ("loaded", "serving", "draining") and not self.loaded_sent:
            self.loaded_sent = True
            endpoint = getattr(self.engine, "endpoint", "")
            await self.ctx.send(self.supervisor, StageLoaded(self.node_id, self.instance, now, endpoint))
        await self._serve(now)
        if self.state == "draining" and not self.drained_sent and self.engine.drained:
            self.drained_sent = True
            await self.ctx.send(self.supervisor, InstanceDrained(self.instance, self.node_id, now))
        if self.ticks % self.hb_every == 1 or self.hb_every == 1:
            m = self.engine.metrics()
            await self.ctx.send(self.supervisor, WorkerHeartbeat(self.node_id, now, self.state, m.in_flight))
            stats = getattr(self.engine, "server_stats", None)  # a real engine's server metrics
            got = stats() if callable(stats) else None
            if got:
                await self.ctx.publish(EngineStats(self.node_id, self.instance, now, *got))

    async def on_wake(self, now: float) -> None:
        if self.state not in ("hung", "dead", "released"):
            await self._serve(now)

    async def _serve(self, now: float) -> None:
        """Run the head engine up to ``now`` and send what finished; while a request's tokens are watched, ask
        to be woken at the engine's next event, and on a prefill instance's head inside its next handoff
        window (see the module docstring)."""
        if not (self.head and self.state in ("serving", "draining")):
            return
        out = self.engine.poll(self.engine_now(now))
        if self.watched:
            out = self._progress(now, out)
        held = getattr(self.engine, "waiting", None)  # an engine that says what it has not started
        waiting = held() if callable(held) else -1
        if out or waiting != self.waiting:
            self.waiting = waiting
            await self.ctx.send(self.router, Completions(self.instance, now, tuple(out), waiting))
        nxt = getattr(self.engine, "next_event_at", None)  # an engine that knows when it acts next
        if self.watched and callable(nxt):
            t = nxt()
            if t is not None:
                at = t + self.lag
                self.wake_at(at if at > now else next_instant(now))
        window = getattr(self.engine, "handoff_window", None)  # an engine that knows when it hands off next
        if self.prefill and callable(window):
            w = window()
            if w is not None:
                self.wake_at(shared_instant(*w))

    def _progress(self, now: float, out: list[Outcome]) -> list[Outcome]:
        """``out`` with a ``progress`` outcome (before it) for each watched request whose tokens grew (a
        handed-over request's with its handoff: the decode instance reports only the tokens it makes)."""
        grew = []
        for o in out:
            if o.kind == "progress":
                continue
            seen = self.watched.pop(o.id, None)
            if o.kind == "handoff" and seen is not None and o.tokens > seen:
                grew.append(Outcome(o.id, "progress", now, o.t_first, tokens=o.tokens))
        progress = getattr(self.engine, "progress", None)  # an engine that reports tokens as they come
        if not callable(progress):
            return grew + out
        for rid, (tokens, first_t) in progress().items():
            seen = self.watched.get(rid)
            if seen is not None and tokens > seen:
                self.watched[rid] = tokens
                grew.append(Outcome(rid, "progress", now, first_t, tokens=tokens))
        grew.sort(key=lambda o: o.id)
        return grew + out


EngineFactory = Callable[[str], Engine]
"""Make the engine of a node (given its id)."""
