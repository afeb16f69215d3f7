"""The Mesh: one kernel (broker, clock, journal, supervisor) and the actors it runs.

::

    async with Mesh(clock=VirtualClock(), journal=tmp_path / "bus.journal") as mesh:
        await mesh.spawn(Allocator("allocator"))
        tui = await mesh.client("tui", subscribe=["kernel."])
        await tui.send("allocator", msg)
        await mesh.quiesce()           # every actor idle, nothing in flight
        await mesh.advance_to(60.0)    # virtual clock: wake timers in order, quiescing after each
        await mesh.inject(msg, dest="allocator", at=90.0)  # one external input, fully handled on return

External inputs that arrive in wall time (an HTTP request at the gateway) ``ring`` the mesh's doorbell;
a driver that paces a virtual clock against the wall clock waits on it (``rung``) as well as on its next
deadline, so that such an input enters the mesh when it arrives, not at the driver's next step.

Everything the mesh starts (broker, actors, clients) runs in the mesh's own task group, so nothing holds a
task group across a caller's ``yield``. Leaving the ``async with`` block shuts down gracefully (see
``request_shutdown``); an exception in the block cancels everything instead.
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType

import anyio
import anyio.abc
import zmq.asyncio

from coral.errors import CoralError
from coral.kernel.actor import Actor, ActorCounters, ActorHandle, ActorRuntime, ActorState, RestartPolicy, Supervisor
from coral.kernel.broker import Broker
from coral.kernel.client import BusClient, LocalBusClient
from coral.kernel.clock import Clock, RealClock, VirtualClock, let_tasks_run, nothing_ready
from coral.kernel.codec import DEFAULT_CODEC, Codec
from coral.kernel.events import ShutdownRequested
from coral.kernel.journal import Fsync, Journal
from coral.kernel.keys import ClientKeys, ServerKeys
from coral.kernel.wire import KERNEL, Endpoints, check_name, check_positive


class MeshError(CoralError):
    """A mesh used out of order (spawning after shutdown, a duplicate name, quiesce that never settles)."""


class MeshState(enum.Enum):
    """The mesh's life: running, draining (shutdown requested), stopped."""

    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


class Mesh:
    """The kernel and its actors, as an async context manager."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        journal: Journal | str | os.PathLike[str] | None = None,
        fsync: Fsync = Fsync.BATCH,
        endpoints: Endpoints | None = None,
        policy: RestartPolicy | None = None,
        hwm: int = 10_000,
        heartbeat_interval: float = 1.0,
        peer_timeout: float = 10.0,
        shutdown_timeout: float = 10.0,
        codec: Codec = DEFAULT_CODEC,
        context: zmq.asyncio.Context | None = None,
        curve: ServerKeys | None = None,
    ) -> None:
        self.clock: Clock = clock if clock is not None else RealClock()
        self._journal_arg = journal
        self._fsync = fsync
        self.journal: Journal | None = None
        self.policy = policy if policy is not None else RestartPolicy()
        self.shutdown_timeout = check_positive(shutdown_timeout, "shutdown_timeout")
        self.codec = codec
        self.state = MeshState.STARTING
        self.shutdown_reason = ""
        self._local_keys: ClientKeys | None = None
        if curve is not None:  # the mesh's own actors and clients connect with an in-memory key pair
            curve, self._local_keys = curve.with_local_client("mesh-local")
        self._broker = Broker(
            endpoints,
            clock=self.clock,
            hwm=hwm,
            heartbeat_interval=heartbeat_interval,
            peer_timeout=peer_timeout,
            codec=codec,
            context=context,
            on_shutdown_request=self._on_shutdown_message,
            curve=curve,
        )
        self._context = context
        self._hwm = hwm
        self.supervisor = Supervisor(self.clock, self._broker.publish, self.policy)
        self._runtimes: dict[str, ActorRuntime] = {}
        self._clients: dict[str, BusClient] = {}
        self._client_stop = anyio.Event()
        self._clients_done: list[anyio.Event] = []
        self._broker_stop = anyio.Event()
        self._shutdown = anyio.Event()
        self._changed = anyio.Event()
        self._unsettled: set[ActorRuntime] = set()  # every actor not in it is idle (see _all_idle)
        self._bell = anyio.Event()
        self._watching = False
        self._tg: anyio.abc.TaskGroup | None = None
        self._stack: contextlib.AsyncExitStack | None = None

    # -- lifecycle -----------------------------------------------------------------------------------

    @property
    def broker(self) -> Broker:
        return self._broker

    @property
    def endpoints(self) -> Endpoints:
        """Where clients connect (resolved, after entering)."""
        return self._broker.endpoints

    @property
    def local_keys(self) -> ClientKeys | None:
        """The in-memory CURVE client keys the mesh's own actors use (None without keys); an in-process
        client the mesh does not own (the TUI of ``coral up --tui``) may use them too."""
        return self._local_keys

    @property
    def actors(self) -> dict[str, ActorHandle]:
        return {name: rt.handle for name, rt in self._runtimes.items()}

    def counters(self) -> dict[str, ActorCounters]:
        """Per actor spawned in this mesh (stopped ones too): what it handled and the time it took."""
        return {name: rt.counters for name, rt in self._runtimes.items()}

    async def __aenter__(self) -> Mesh:
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        try:
            if isinstance(self._journal_arg, Journal):
                self.journal = self._journal_arg
            elif self._journal_arg is not None:
                self.journal = Journal.open(Path(self._journal_arg), fsync=self._fsync)
                stack.callback(self.journal.close)
            self._broker.journal = self.journal
            self._tg = await stack.enter_async_context(anyio.create_task_group())
            await self._tg.start(self._run_broker)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        self.state = MeshState.RUNNING
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        stack, self._stack = self._stack, None
        if stack is None:
            return None
        tg = self._tg
        assert tg is not None
        try:
            if exc_type is None:
                self.request_shutdown("mesh exiting")
                with anyio.move_on_after(self.shutdown_timeout):
                    for rt in list(self._runtimes.values()):
                        await rt.handle.done.wait()
                for rt in self._runtimes.values():
                    rt.scope.cancel()  # only those still running past the timeout
                self._client_stop.set()
                with anyio.move_on_after(self.shutdown_timeout):
                    for done in list(self._clients_done):
                        await done.wait()
                self._broker_stop.set()
            else:
                tg.cancel_scope.cancel()
        finally:
            self.state = MeshState.STOPPED
            # The block's own exception propagates unchanged (not wrapped in the task group's group).
            await stack.aclose()
        return None

    async def _run_broker(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._broker:
            task_status.started()
            await self._broker_stop.wait()

    def _on_shutdown_message(self, msg: ShutdownRequested) -> None:
        self.request_shutdown(msg.reason, source=msg.source)

    def request_shutdown(self, reason: str = "", *, source: str = KERNEL) -> None:
        """Enter the draining state: publish ShutdownRequested, and make every actor stop taking new
        messages, handle its queued ones, stop its timers, run ``on_stop`` and return. Idempotent."""
        if self.state is not MeshState.RUNNING:
            return
        self.state = MeshState.DRAINING
        self.shutdown_reason = reason
        self._broker.publish(ShutdownRequested(source, reason))
        for rt in self._runtimes.values():
            if rt._bus is not None:
                rt._bus.stop_receiving()
        self._shutdown.set()

    async def wait_shutdown(self) -> str:
        """Wait until someone requested shutdown (an actor, a client, the kernel); return the reason."""
        await self._shutdown.wait()
        return self.shutdown_reason

    # -- actors and clients --------------------------------------------------------------------------

    def _require_running(self, what: str) -> anyio.abc.TaskGroup:
        if self.state is not MeshState.RUNNING or self._tg is None:
            raise MeshError(f"{what}: the mesh is {self.state.value}, not running")
        return self._tg

    def _check_free(self, name: str) -> None:
        check_name(name)
        if name in self._runtimes or name in self._clients:
            raise MeshError(f"name {name!r}: already used in this mesh")

    async def spawn(self, actor: Actor | Callable[[], Actor], *, policy: RestartPolicy | None = None) -> ActorHandle:
        """Start an actor (or a factory of fresh ones, used again at each restart); return once it runs."""
        tg = self._require_running("spawn")
        rt = ActorRuntime(
            actor,
            clock=self.clock,
            supervisor=self.supervisor,
            policy=policy,
            make_bus=self._actor_bus,
            on_change=self._poke,
            request_shutdown=self.request_shutdown,
        )
        self._check_free(rt.name)
        self._runtimes[rt.name] = rt
        self._unsettled.add(rt)
        try:
            handle: ActorHandle = await tg.start(rt.run)
        except BaseException:
            if rt.handle.state is not ActorState.GAVE_UP:
                del self._runtimes[rt.name]
            raise
        return handle

    def _actor_bus(self, actor: Actor) -> BusClient:
        return LocalBusClient(
            actor.name,
            self._broker,
            subscribe=actor.subscriptions,
            inbox_size=actor.inbox_size,
            hwm=self._hwm,
            codec=self.codec,
        )

    async def client(self, name: str, *, subscribe: Iterable[str] = (), inbox_size: int = 1024) -> BusClient:
        """A connected in-process bus client owned by the mesh (closed after the actors stop)."""
        tg = self._require_running("client")
        self._check_free(name)
        bus = LocalBusClient(
            name, self._broker, subscribe=subscribe, inbox_size=inbox_size, hwm=self._hwm, codec=self.codec
        )
        self._clients[name] = bus
        try:
            await tg.start(self._run_client, bus)
        except BaseException:
            del self._clients[name]
            raise
        return bus

    async def _run_client(
        self, bus: BusClient, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        done = anyio.Event()
        self._clients_done.append(done)
        try:
            async with bus:
                task_status.started()
                await self._client_stop.wait()
        finally:
            done.set()

    # -- kernel-originated traffic -------------------------------------------------------------------

    def publish(self, msg: object, *, source: str = KERNEL) -> None:
        """Publish a message from the kernel (or on behalf of ``source``)."""
        self._broker.publish(msg, source)

    def send(self, dest: str, msg: object, *, source: str = KERNEL) -> bool:
        """Send a message from the kernel (or on behalf of ``source``) to ``dest``; False if undelivered."""
        return self._broker.send(dest, msg, source)

    async def inject(
        self, msg: object, *, dest: str | None = None, at: float | None = None, source: str = KERNEL
    ) -> None:
        """Deliver one external input deterministically: quiesce, move a virtual clock to ``at`` (if
        given), send it to ``dest`` (or publish it), and quiesce again, so that it is fully handled."""
        if at is not None:
            await self.advance_to(at)
        else:
            await self.quiesce()
        if dest is None:
            self.publish(msg, source=source)
        elif not self.send(dest, msg, source=source):
            raise MeshError(f"inject: {type(msg).__name__} could not be delivered to {dest!r}")
        await self.quiesce()

    def ring(self) -> None:
        """Say that an external input waits to be delivered (see the module docstring)."""
        self._bell.set()

    async def rung(self) -> None:
        """Wait until ``ring`` was called (since the last ``rung`` returned)."""
        await self._bell.wait()
        self._bell = anyio.Event()

    # -- idleness ------------------------------------------------------------------------------------

    def _poke(self, rt: ActorRuntime) -> None:
        self._unsettled.add(rt)
        if self._watching:
            self._watching = False
            self._changed.set()
            self._changed = anyio.Event()

    def _all_idle(self) -> bool:
        """Whether every actor is idle, checking only those that changed since they were last seen idle:
        an actor leaves idleness only by a message in its inbox or by its own busy count rising, and both
        call ``ActorRuntime.changed``, which puts it back in ``_unsettled``."""
        unsettled = self._unsettled
        while unsettled:
            rt = unsettled.pop()
            if not rt.idle:
                unsettled.add(rt)
                return False
        return True

    async def _wait_idle(self) -> None:
        await let_tasks_run()
        while not self._all_idle():
            self._watching = True
            await self._changed.wait()
            await let_tasks_run()

    async def quiesce(self, timeout: float = 30.0) -> None:
        """Wait until every actor is idle with an empty inbox and no message is in flight.

        In flight means sent by an actor or by a client from ``mesh.client`` and not yet handled (these
        are in-process clients: what they send is routed before ``send`` returns). A client the mesh does
        not own must ``await client.sync()`` before this to have its sends counted. The timeout is in real
        seconds.
        """
        if not self._unsettled and nothing_ready():  # every actor seen idle since, and no task can run
            return
        await let_tasks_run()
        if self._all_idle():  # the common case, without the timeout's cancel scope and timer
            return
        with anyio.move_on_after(timeout) as scope:
            await self._wait_idle()
        if scope.cancelled_caught:
            busy = [name for name, rt in self._runtimes.items() if not rt.idle]
            raise MeshError(f"quiesce: not idle after {timeout}s (busy: {', '.join(busy) or 'none'})")

    async def advance_to(self, t: float) -> None:
        """Virtual clock only: quiesce, then move time to ``t``, quiescing after each wake-up."""
        if not isinstance(self.clock, VirtualClock):
            raise MeshError(f"advance_to: needs a VirtualClock, the mesh runs on {type(self.clock).__name__}")
        await self.quiesce()
        await self.clock.advance_to(t, settle=self.quiesce)

    async def advance(self, dt: float) -> None:
        """Virtual clock only: ``advance_to(now + dt)``."""
        await self.advance_to(self.clock.now() + dt)
