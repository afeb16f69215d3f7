"""The tick discipline every Coral actor follows, which makes a run deterministic under a virtual clock.

A run is bulk-synchronous: all actors tick at the same instants (multiples of ``tick_s`` of the kernel
clock). ``handle`` only buffers: each message is stamped with the kernel time at which it was received.
At a tick at time ``t`` the actor takes the buffered messages stamped before ``t``, in a canonical order
(receipt time, sender, directed before published; each sender's own order kept), applies them, then does
its periodic work and sends what it decided. A message sent during the tick at ``t`` is therefore applied
at the receiver's tick at ``t + tick_s``, however the actors' tasks interleave within the tick; and because
the mesh quiesces before the clock moves, everything sent at ``t`` has been received (stamped ``t``) before
the next tick. Decisions thus depend only on the inputs and their times, never on scheduling.

Operator commands (``coral.messages.control``) are buffered like everything else and answered at the next
tick: validated (static checks, then the owner's ``command``), confirmed with a ``CommandResult``
(published on ``ctl.result``, and as the reply when the command came as a request).

A crash in a tick drops the message being applied (as the kernel does for ``handle``); the rest of that
tick's batch is kept and applied first after the restart.

Prompt delivery (``prompt = True``: the router and the stage workers on the request path, and the
supervisor, allocator, demand monitor and price watcher on the control path, whose periodic work keeps the
tick). Waiting for the next tick costs a message one tick per hop (gateway -> router -> worker -> router ->
gateway: 3-4 s at a 1 s tick). A prompt actor is also woken between ticks: a message received (stamped)
at kernel time ``s`` is applied at ``next_instant(s)``, the first instant of the ``HOP_S`` = 1/1024 s grid
strictly after ``s``. The same rule keeps it deterministic: at an instant ``w`` the actor applies every buffered message
stamped before ``w``, in the canonical order, then runs ``on_wake(w)`` (``on_tick`` at a tick instant, which
is on the grid too, since ``tick_s`` is a multiple of 1/1024 s); the virtual clock stops at every such
instant and moves on only once the mesh is quiet, so every message stamped before ``w`` was received
before ``w``. A message sent at ``w`` is applied at ``w + HOP_S`` at the earliest: each hop costs at most
``HOP_S`` of kernel time, a network hop's order of magnitude. An actor may also ask to be woken at a time
of its own (``wake_at``: a stage worker at its engine's next event while it streams a request's tokens, and a
prefill head inside its engine's handoff window).
One alarm per actor (``ActorContext.alarm``) serves the ticks and the wakes, so a wake that falls on a
tick is one firing, not two racing ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from coral.kernel import Actor, Alarm, Envelope
from coral.messages.control import OWNERS, CommandResult, is_command

HOP_S = 1 / 1024
"""The grid of prompt delivery (see the module docstring): at most this much kernel time per hop."""


def first_tick(now: float, tick_s: float) -> float:
    """The first tick instant strictly after ``now``."""
    return (math.floor(now / tick_s) + 1) * tick_s


def next_instant(now: float) -> float:
    """The first instant of the ``HOP_S`` grid strictly after ``now`` (exact in floating point)."""
    return (math.floor(now * 1024) + 1) / 1024


class TickActor(Actor):
    """An actor that applies its inbox at its ticks (see the module docstring).

    Override ``on_message(env)`` (apply one non-command message), ``command(msg)`` (apply one operator
    command; return ``(field, reason)`` to refuse it), ``on_tick(now)`` (periodic work after the batch)
    and, for a ``prompt`` actor, ``on_wake(now)`` (work after a batch applied between ticks).
    """

    prompt = False
    """Apply each message at the next ``HOP_S`` instant instead of the next tick (see the module docstring)."""

    def __init__(self, name: str, *, tick_s: float, subscribe: Iterable[str] = (), inbox_size: int = 4096) -> None:
        super().__init__(name, subscribe=subscribe, inbox_size=inbox_size)
        self.tick_s = tick_s
        self._pending: list[tuple[float, int, Envelope]] = []
        self._carry: list[Envelope] = []
        self._alarm: Alarm | None = None
        self._next_tick = math.inf

    async def on_start(self) -> None:
        if self._carry:  # the rest of a batch whose tick crashed: older than anything else buffered
            self._pending = [(-math.inf, 0, e) for e in self._carry] + self._pending
            self._carry = []
        now = self.ctx.now()
        self._next_tick = first_tick(now, self.tick_s)
        self._alarm = self.ctx.alarm(self._fire)
        self._alarm.set(self._next_tick)
        if self.prompt and self._pending:
            self._alarm.set(next_instant(now))
        await self.started()

    async def started(self) -> None:
        """Called at the end of every ``on_start`` (also after a restart)."""

    async def handle(self, env: Envelope) -> None:
        now = self.ctx.now()
        self._pending.append((now, 1 if env.kind == "publish" else 0, env))
        if self.prompt and self._alarm is not None:
            self._alarm.set(next_instant(now))

    def wake_at(self, t: float) -> None:
        """Be woken (``on_wake``) at kernel time ``t`` (> now), unless a tick or wake comes first; ask again
        from there if still needed."""
        if self._alarm is not None:
            self._alarm.set(t)

    async def _fire(self, now: float) -> None:
        ready = [p for p in self._pending if p[0] < now]
        if ready:
            self._pending = [p for p in self._pending if p[0] >= now]
            ready.sort(key=lambda p: (p[0], p[2].source, p[1]))
            batch = [p[2] for p in ready]
            for i, env in enumerate(batch):
                self._carry = batch[i + 1 :]
                await self._apply(env, now)
            self._carry = []
        if now >= self._next_tick:
            self._next_tick += self.tick_s
            await self.on_tick(now)
        else:
            await self.on_wake(now)
        assert self._alarm is not None
        self._alarm.set(self._next_tick)
        if self.prompt and self._pending:
            self._alarm.set(next_instant(min(p[0] for p in self._pending)))

    async def _apply(self, env: Envelope, now: float) -> None:
        msg = env.msg
        if not is_command(msg):
            await self.on_message(env)
            return
        owner = OWNERS[type(msg)]
        bad = msg.problems()
        if bad is None and owner != self.name:
            bad = ("command", f"{env.tag} is handled by {owner}, not {self.name}")
        if bad is None:
            bad = await self.command(msg)
        field, reason = bad if bad is not None else ("", "")
        result = CommandResult(env.tag, bad is None, self.name, now, field, reason, msg.ref)
        await self.ctx.publish(result)
        if env.kind == "request":
            await self.ctx.reply(env, result)

    async def on_message(self, env: Envelope) -> None:
        """Apply one buffered message (not a command)."""

    async def command(self, msg: object) -> tuple[str, str] | None:
        """Apply an operator command; return (field, reason) to refuse it."""
        return ("command", f"{type(msg).__name__} is not handled by {self.name}")

    async def on_tick(self, now: float) -> None:
        """Periodic work, after the tick's batch was applied."""

    async def on_wake(self, now: float) -> None:
        """Work after a batch applied between ticks (a ``prompt`` actor), or at a ``wake_at`` time."""
