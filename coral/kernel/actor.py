"""Actors and their supervision.

An actor is one anyio task with a bus client and a bounded inbox. Subclass ``Actor`` and override
``handle(env)`` (one message at a time), and optionally ``on_start()`` (run before the first message and
after each restart; it is where state is (re)built and timers are set) and ``on_stop()`` (run once, after
the inbox is drained at shutdown)::

    class Echo(Actor):
        async def handle(self, env: Envelope) -> None:
            if env.kind == "request":
                await self.ctx.reply(env, env.msg)

``Mesh.spawn`` starts it with ``task_group.start`` and returns once ``on_start`` has run and the bus
client is usable. An exception out of any hook or timer is a crash: the ``Supervisor`` publishes
``ActorCrashed`` and, within the ``RestartPolicy`` budget (at most ``max_restarts`` crashes within
``window`` seconds of the kernel clock), restarts the actor with ``ActorRestarted``; past the budget it
publishes ``ActorGaveUp`` and the actor stays down. The message being handled at the crash is dropped;
queued messages are kept. A crash in ``on_stop`` is published as ``ActorCrashed`` with count 0 and not
restarted.

Shutdown is a state, not an exception: once the mesh stops, each actor's client stops accepting new
messages, the actor handles what is already in its inbox, its timers stop, ``on_stop`` runs and the task
returns.

Under a virtual clock an actor asleep on the clock (``ctx.sleep``, a timer between ticks) is idle; handlers
must not block on anything else that needs time to pass.
"""

from __future__ import annotations

import collections
import enum
import functools
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio
import anyio.abc
import attrs

from coral.errors import CoralError
from coral.kernel.client import BusClient
from coral.kernel.clock import Clock, VirtualClock
from coral.kernel.events import ActorCrashed, ActorGaveUp, ActorRestarted
from coral.kernel.wire import Envelope, check_name, check_positive


class ActorError(CoralError):
    """A bad actor definition or use (an unspawned actor's context, a duplicate name, ...)."""


class SpawnError(ActorError):
    """The actor crashed more often than its restart budget allows before it ever started."""


@attrs.frozen
class RestartPolicy:
    """Restart a crashed actor unless this crash makes more than ``max_restarts`` within ``window`` s."""

    max_restarts: int = 3
    window: float = 60.0

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ActorError(f"max_restarts: expected an int >= 0, got {self.max_restarts!r}")
        check_positive(self.window, "window")


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, unwrapping single-member exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


class Supervisor:
    """Counts crashes per actor on the kernel clock, decides restart or give-up, and publishes events."""

    def __init__(self, clock: Clock, publish: Callable[[object], None], policy: RestartPolicy) -> None:
        self.clock = clock
        self.publish = publish
        self.policy = policy
        self._crashes: dict[str, collections.deque[float]] = {}

    def crashed(self, actor: str, exc: BaseException, policy: RestartPolicy | None = None) -> bool:
        """Record a crash of ``actor``; publish the events; return True if it should be restarted."""
        pol = self.policy if policy is None else policy
        now = self.clock.now()
        times = self._crashes.setdefault(actor, collections.deque())
        times.append(now)
        while times and times[0] < now - pol.window:
            times.popleft()
        count = len(times)
        error = describe(exc)
        self.publish(ActorCrashed(actor, error, count))
        if count > pol.max_restarts:
            self.publish(ActorGaveUp(actor, error, count))
            return False
        self.publish(ActorRestarted(actor, error, count))
        return True


class ActorState(enum.Enum):
    """Where an actor is in its life."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"
    GAVE_UP = "gave_up"


class Actor:
    """Base class of actors; see the module docstring."""

    def __init__(self, name: str, *, subscribe: Iterable[str] = (), inbox_size: int = 256) -> None:
        self.name = check_name(name)
        self.subscriptions = tuple(subscribe)
        if not isinstance(inbox_size, int) or inbox_size < 1:
            raise ActorError(f"inbox_size: expected an int >= 1, got {inbox_size!r}")
        self.inbox_size = inbox_size
        self._ctx: ActorContext | None = None

    @property
    def ctx(self) -> ActorContext:
        """The actor's view of the kernel (bus, clock, timers); available from ``on_start`` on."""
        if self._ctx is None:
            raise ActorError(f"actor {self.name!r}: not spawned yet, it has no context")
        return self._ctx

    async def on_start(self) -> None:
        """Build state and set timers; runs before the first message and after every restart."""

    async def handle(self, env: Envelope) -> None:
        """Handle one message from the inbox."""

    async def on_stop(self) -> None:
        """Run once at shutdown, after the inbox is drained."""


class ActorContext:
    """What an actor may do: talk on the bus, read and sleep on the kernel clock, set timers."""

    def __init__(self, runtime: ActorRuntime) -> None:
        self._rt = runtime
        self.name = runtime.name
        self.clock = runtime.clock

    @property
    def bus(self) -> BusClient:
        return self._rt.bus

    def now(self) -> float:
        """The kernel clock's time."""
        return self.clock.now()

    async def send(self, dest: str, msg: object) -> None:
        await self._rt.bus.send(dest, msg)

    async def publish(self, msg: object) -> None:
        await self._rt.bus.publish(msg)

    async def request(self, dest: str, msg: object, *, timeout: float = 10.0) -> Any:
        return await self._rt.bus.request(dest, msg, timeout=timeout)

    async def reply(self, env: Envelope, msg: object) -> None:
        await self._rt.bus.reply(env, msg)

    async def sleep(self, dt: float) -> None:
        """Sleep on the kernel clock; the actor counts as idle meanwhile."""
        self._rt.asleep += 1
        self._rt.changed()
        try:
            await self.clock.sleep(dt)
        finally:
            self._rt.asleep -= 1
            self._rt.changed()

    def every(self, period: float, fn: Callable[[], Awaitable[None]], *, first: float | None = None) -> None:
        """Call ``fn`` every ``period`` seconds of kernel time, first at ``first`` (default now + period).

        Timers belong to the current incarnation: a crash or shutdown stops them, ``on_start`` sets them.
        An exception from ``fn`` is a crash of the actor.
        """
        check_positive(period, "period")
        tg = self._rt.timers
        if tg is None:
            raise ActorError(f"actor {self.name!r}: timers can only be set while the actor runs")
        tg.start_soon(self._rt.timer, period, fn, first)

    def alarm(self, fn: Callable[[float], Awaitable[None]]) -> Alarm:
        """A one-shot timer that calls ``fn(t)`` at the time ``t`` it is set to (``Alarm.set``; the earliest
        wins); it belongs to the current incarnation, as ``every``'s timers do."""
        tg = self._rt.timers
        if tg is None:
            raise ActorError(f"actor {self.name!r}: timers can only be set while the actor runs")
        alarm = Alarm(self._rt, fn)
        tg.start_soon(alarm.run)
        return alarm

    def request_shutdown(self, reason: str = "") -> None:
        """Ask the mesh to shut down."""
        self._rt.request_shutdown(reason)


class Alarm:
    """A re-armable one-shot timer on the kernel clock (``ActorContext.alarm``).

    ``set(t)`` arms it for ``t`` unless it is already armed earlier; it fires once, calling ``fn(t)``, and
    is then unarmed until set again (``fn`` may set it). Setting it earlier while it sleeps towards a later
    time interrupts that sleep; the actor counts as busy until the alarm sleeps towards the new time, so
    that a virtual clock (which moves only once every actor is idle) sees the new deadline first.
    """

    def __init__(self, runtime: ActorRuntime, fn: Callable[[float], Awaitable[None]]) -> None:
        self._rt = runtime
        self._fn = fn
        self.at = math.inf
        self._sleeping = False
        self._interrupt: Callable[[], None] = _nothing
        self._rearm = anyio.Event()
        self._pending = False

    def set(self, t: float) -> None:
        """Fire at ``t`` (or earlier, if already armed earlier)."""
        if not t < self.at:
            return
        self.at = t
        if self._sleeping and not self._pending:
            self._pending = True
            self._rt.busy += 1
            self._rt.changed()
            self._interrupt()
        self._rearm.set()

    def _settled(self) -> None:
        if self._pending:
            self._pending = False
            self._rt.busy -= 1
            self._rt.changed()

    async def run(self) -> None:
        try:
            await self._loop()
        finally:
            self._settled()

    async def _loop(self) -> None:
        rt = self._rt
        clock = rt.clock
        virtual = clock if isinstance(clock, VirtualClock) else None
        while True:
            target = self.at
            self._settled()  # before the sleep below registers its deadline (synchronously)
            if target == math.inf:
                self._rearm = anyio.Event()
                self._sleeping = True
                self._interrupt = _nothing  # set() sets _rearm
                try:
                    await self._rearm.wait()
                finally:
                    self._sleeping = False
                continue
            if virtual is not None and target > virtual.now():  # interrupted by dropping the sleep
                sleeper = virtual.sleeper(target)
                self._sleeping = True
                self._interrupt = functools.partial(virtual.drop, sleeper)
                try:
                    await sleeper.wait()
                finally:
                    self._sleeping = False
                    virtual.drop(sleeper)
                if not sleeper.woken:
                    continue
            else:
                with anyio.CancelScope() as scope:
                    self._sleeping = True
                    self._interrupt = scope.cancel
                    try:
                        await clock.sleep_until(target)
                    finally:
                        self._sleeping = False
                if scope.cancelled_caught:
                    continue
            if self.at != target:
                continue
            self.at = math.inf
            await rt.fire(self._fn, target)


def _nothing() -> None:
    pass


@attrs.define
class ActorCounters:
    """What an actor did (all incarnations): messages handled, timer calls, and the wall seconds spent in
    them (including any awaits inside, such as a solver's answer)."""

    handled: int = 0
    timers: int = 0
    busy_s: float = 0.0


@attrs.define(eq=False)
class ActorHandle:
    """The mesh's record of a spawned actor."""

    name: str
    actor: Actor
    state: ActorState = ActorState.STARTING
    restarts: int = 0
    done: anyio.Event = attrs.field(factory=anyio.Event)

    async def wait(self) -> ActorState:
        """Wait until the actor stopped or was given up; return the final state."""
        await self.done.wait()
        return self.state


class ActorRuntime:
    """Runs one actor: its bus client, its incarnations, its timers; tracks busy/idle for quiesce."""

    def __init__(
        self,
        actor: Actor | Callable[[], Actor],
        *,
        clock: Clock,
        supervisor: Supervisor,
        policy: RestartPolicy | None,
        make_bus: Callable[[Actor], BusClient],
        on_change: Callable[[ActorRuntime], None],
        request_shutdown: Callable[[str], None],
    ) -> None:
        self._factory: Callable[[], Actor] | None = None
        if isinstance(actor, Actor):
            first = actor
        elif callable(actor):
            self._factory = actor
            first = actor()
            if not isinstance(first, Actor):
                raise ActorError(f"spawn: the factory returned {type(first).__name__}, not an Actor")
        else:
            raise ActorError(f"spawn: expected an Actor or a factory of Actors, got {type(actor).__name__}")
        self.name = first.name
        self.handle = ActorHandle(first.name, first)
        self.clock = clock
        self.supervisor = supervisor
        self.policy = policy
        self._make_bus = make_bus
        self._on_change = on_change
        self.request_shutdown = request_shutdown
        self.counters = ActorCounters()
        self.busy = 1  # starting counts as busy until the first on_start returns
        self.asleep = 0
        self.held = 0
        self.timers: anyio.abc.TaskGroup | None = None
        self.scope = anyio.CancelScope()
        self._bus: BusClient | None = None

    @property
    def bus(self) -> BusClient:
        if self._bus is None:
            raise ActorError(f"actor {self.name!r}: not connected")
        return self._bus

    @property
    def idle(self) -> bool:
        """Not handling anything (asleep on the clock counts as idle) and nothing queued."""
        if self.handle.state in (ActorState.STOPPED, ActorState.GAVE_UP):
            return True
        if self.busy - self.asleep > 0:
            return False
        return self._bus is None or self._bus.backlog == 0

    def changed(self) -> None:
        """Tell the mesh that this actor's idleness may have changed (every move towards busy must)."""
        self._on_change(self)

    def _enter(self) -> None:
        self.busy += 1
        self.changed()

    def hold(self) -> None:
        """A timer crashed: stay busy until the crash is handled (the actor task learns of it only once
        the timers' task group cancelled it; without this a virtual clock could move on first)."""
        self.held += 1
        self.busy += 1
        self.changed()

    def _exit(self) -> None:
        self.busy -= 1
        self.changed()

    async def timer(self, period: float, fn: Callable[[], Awaitable[None]], first: float | None) -> None:
        t = self.clock.now() + period if first is None else first
        while True:
            await self.clock.sleep_until(t)
            await self.fire(fn)
            t += period

    async def fire(self, fn: Callable[..., Awaitable[None]], *args: object) -> None:
        """Run a timer's ``fn(*args)`` as busy time, shielded (shutdown waits for it to finish); a crash
        holds the actor busy until it is handled (``hold``)."""
        self._enter()
        t0 = time.perf_counter()
        try:
            with anyio.CancelScope(shield=True):
                await fn(*args)
        except Exception:
            self.hold()
            raise
        finally:
            self.counters.timers += 1
            self.counters.busy_s += time.perf_counter() - t0
            self._exit()

    async def run(self, *, task_status: anyio.abc.TaskStatus[ActorHandle] = anyio.TASK_STATUS_IGNORED) -> None:
        """The actor task; ``task_status.started`` fires once the first ``on_start`` returned."""
        handle = self.handle
        try:
            with self.scope:
                actor = handle.actor
                bus = self._make_bus(actor)
                bus.on_arrival = self.changed
                async with bus:
                    self._bus = bus
                    await self._incarnations(actor, task_status)
        finally:
            self.busy = 0
            if handle.state is not ActorState.GAVE_UP:
                handle.state = ActorState.STOPPED
            self._bus = None
            handle.done.set()
            self.changed()

    async def _incarnations(self, actor: Actor, task_status: anyio.abc.TaskStatus[ActorHandle]) -> None:
        handle = self.handle
        bus = self.bus
        started = False
        fresh = False
        while True:
            try:
                async with anyio.create_task_group() as timers:
                    self.timers = timers
                    try:
                        if fresh and self._factory is not None:
                            actor = self._factory()
                            if not isinstance(actor, Actor) or actor.name != self.name:
                                raise ActorError(f"actor {self.name!r}: the factory returned {actor!r}")
                            handle.actor = actor
                        actor._ctx = ActorContext(self)
                        await actor.on_start()
                    finally:
                        self._exit()
                    handle.state = ActorState.RUNNING
                    if not started:
                        started = True
                        task_status.started(handle)
                    counters = self.counters
                    async for env in bus:
                        self._enter()
                        t0 = time.perf_counter()
                        try:
                            await actor.handle(env)
                        finally:
                            counters.handled += 1
                            counters.busy_s += time.perf_counter() - t0
                            self._exit()
                    timers.cancel_scope.cancel()
            except Exception as exc:
                self.timers = None
                self.busy -= self.held
                self.held = 0
                if not self.supervisor.crashed(self.name, exc, self.policy):
                    handle.state = ActorState.GAVE_UP
                    if not started:
                        raise SpawnError(f"actor {self.name!r} crashed on start: {describe(exc)}") from exc
                    return
                handle.restarts += 1
                fresh = True
                self._enter()
                continue
            self.timers = None
            try:
                await actor.on_stop()
            except Exception as exc:  # nothing to restart at shutdown; count 0 marks a crash in on_stop
                self.supervisor.publish(ActorCrashed(self.name, describe(exc), 0))
            return
