"""The ``operator`` client of a run (``OperatorDesk``): it forwards operator commands to their owners at
the driver's quiet points, relays the results to the commands' senders, and answers ``SnapshotRequest``
with the latest state it has seen published, for clients that attach late (the TUI). Named apart from
``coral.gateway.Gateway``, the HTTP gateway."""

from __future__ import annotations

from collections import deque

import anyio
import attrs

from actors.inspect import clock_info
from coral.kernel import BusClient, Envelope, Mesh
from coral.kernel.codec import encode
from coral.messages.control import (
    OPERATOR,
    CommandResult,
    SetSpeed,
    Snapshot,
    SnapshotRecord,
    SnapshotRequest,
    is_command,
    owner_of,
)
from coral.messages.inspect import ClockRequest

SNAPSHOT_TOPICS = ("mesh.setup", "ctl.alloc_state", "mkt.update", "dem.update", "fleet.update", "req.stats")
"""Tags whose latest message is the run's current state, in the order a ``Snapshot`` gives them."""
SNAPSHOT_PLANS = 20
"""How many of the latest plans a ``Snapshot`` carries."""


class OperatorDesk:
    """The ``operator`` client: forwards commands to their owners at quiet points, relays the results, and
    answers ``SnapshotRequest`` with the latest state it has seen published (for clients attaching late)."""

    TOPICS = ("ctl.result", "plan.new", *SNAPSHOT_TOPICS)
    """What the desk subscribes to."""

    def __init__(self, bus: BusClient) -> None:
        self.bus = bus
        self.pending: dict[int, Envelope] = {}
        self.next_ref = 0
        self.forwarded = 0
        self.latest: dict[str, Envelope] = {}
        self.plans: deque[Envelope] = deque(maxlen=SNAPSHOT_PLANS)
        self.pace: tuple[float | None, float, float] | None = None
        """(speed, wall and kernel time at the start), set by ``drive``, for ``ClockRequest``."""
        self.speeds: list[float | None] = []
        """Speeds asked for by ``SetSpeed`` that ``drive`` has not applied yet, oldest first."""
        self.held: deque[Envelope] = deque()
        """Commands ``relay`` received, for ``pump`` to forward at the driver's next quiet point."""
        self.waiting = anyio.Event()
        """Set by ``relay`` when a command arrives (the driver replaces it after it waited on it)."""

    async def pump(self, mesh: Mesh) -> None:
        """Handle everything queued now (the mesh must be quiet: commands are forwarded)."""
        while self.bus.backlog:
            await self.handle(mesh, self.bus.receive_nowait())
        while self.held:
            await self.handle(mesh, self.held.popleft())

    async def relay(self, mesh: Mesh) -> None:
        """Receive for ever: answer what needs no quiet mesh at once (a result back to its sender, a
        published state, a clock or snapshot request), and hold commands and ``SetSpeed`` for the driver
        (``pump`` at its next quiet point; ``waiting`` is set when one arrives). A result is thus relayed as
        soon as its owner sends it, not after the re-plan it triggered."""
        while True:
            env = await self.bus.receive()
            if env.kind in ("send", "request") and (is_command(env.msg) or isinstance(env.msg, SetSpeed)):
                self.held.append(env)
                self.waiting.set()
            else:
                await self.handle(mesh, env)

    def snapshot(self, at: float) -> Snapshot:
        """The latest state seen: one record per ``SNAPSHOT_TOPICS`` tag, then the recent plans."""
        envs = [*(self.latest[t] for t in SNAPSHOT_TOPICS if t in self.latest), *self.plans]
        return Snapshot(at, tuple(SnapshotRecord(e.source, e.tag, encode(e.msg)[1]) for e in envs))

    async def handle(self, mesh: Mesh, env: Envelope) -> None:
        """Forward a command (the mesh must be quiet), relay a result to the command's sender, keep a
        published state message, or answer a snapshot request."""
        msg = env.msg
        if isinstance(msg, CommandResult):
            orig = self.pending.pop(msg.ref, None)
            if orig is not None:
                await self.bus.reply(orig, msg)
            return
        if env.kind == "publish":
            if env.tag == "plan.new":
                self.plans.append(env)
            elif env.tag in SNAPSHOT_TOPICS:
                self.latest[env.tag] = env  # encoded only when a snapshot is asked for
            return
        if env.kind not in ("send", "request"):
            return
        if isinstance(msg, ClockRequest):
            await self.bus.reply(env, clock_info(mesh.clock.now(), self.pace))
            return
        if isinstance(msg, SnapshotRequest):
            if env.kind == "request":
                await self.bus.reply(env, self.snapshot(mesh.clock.now()))
            return
        if isinstance(msg, SetSpeed):
            await self._set_speed(mesh, env, msg)
            return
        if not is_command(msg):
            if env.kind == "request":
                reason = f"{env.tag} is not a control command"
                await self.bus.reply(env, CommandResult(env.tag, False, OPERATOR, mesh.clock.now(), "command", reason))
            return
        self.next_ref -= 1  # negative refs: never one a direct sender picks
        if env.kind == "request":
            self.pending[self.next_ref] = env
        mesh.send(owner_of(msg), attrs.evolve(msg, ref=self.next_ref), source=OPERATOR)
        self.forwarded += 1

    async def _set_speed(self, mesh: Mesh, env: Envelope, msg: SetSpeed) -> None:
        """Queue a pace change for ``drive`` (checked here: it is no actor's setting), and answer."""
        problem = msg.problems()
        if problem is None and self.pace is None:
            problem = ("speed", "this run has no paced driver to change")
        if problem is None:
            self.speeds.append(msg.speed)
        if env.kind == "request":
            field, reason = problem or ("", "")
            res = CommandResult(env.tag, problem is None, OPERATOR, mesh.clock.now(), field, reason)
            await self.bus.reply(env, res)
