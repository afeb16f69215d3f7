"""A fake actor context for unit tests: a clock the test moves, the actor's timers, and every message it
sends, publishes or replies recorded, with no kernel, bus or sockets."""

from __future__ import annotations

import heapq
import math
from collections.abc import Awaitable, Callable
from typing import Any

from coral.kernel import Actor, Envelope


class FakeBus:
    """What an actor may ask of its bus client directly (``stop_receiving``)."""

    def __init__(self) -> None:
        self.receiving = True

    def stop_receiving(self) -> None:
        self.receiving = False


class FakeAlarm:
    """Stands in for ``coral.kernel.Alarm``: fires ``fn(t)`` at the earliest time it was set to."""

    def __init__(self, fn: Callable[[float], Awaitable[None]]) -> None:
        self.fn = fn
        self.at = math.inf

    def set(self, t: float) -> None:
        self.at = min(self.at, t)


class FakeContext:
    """Stands in for ``coral.kernel.ActorContext``; ``attach`` gives it to an actor."""

    def __init__(self, name: str, now: float = 0.0) -> None:
        self.name = name
        self.t = now
        self.bus = FakeBus()
        self.sent: list[tuple[str, object]] = []
        self.published: list[object] = []
        self.replies: list[tuple[Envelope, object]] = []
        self._timers: list[tuple[float, int, float, Callable[[], Awaitable[None]]]] = []
        self._alarms: list[FakeAlarm] = []
        self._n = 0

    def now(self) -> float:
        return self.t

    async def send(self, dest: str, msg: object) -> None:
        self.sent.append((dest, msg))

    async def publish(self, msg: object) -> None:
        self.published.append(msg)

    async def reply(self, env: Envelope, msg: object) -> None:
        self.replies.append((env, msg))

    async def request(self, dest: str, msg: object, *, timeout: float = 10.0) -> Any:
        raise AssertionError(f"unexpected request to {dest}: {msg!r}")

    def every(self, period: float, fn: Callable[[], Awaitable[None]], *, first: float | None = None) -> None:
        self._n += 1
        heapq.heappush(self._timers, (self.t + period if first is None else first, self._n, period, fn))

    def alarm(self, fn: Callable[[float], Awaitable[None]]) -> FakeAlarm:
        alarm = FakeAlarm(fn)
        self._alarms.append(alarm)
        return alarm

    async def run_until(self, t: float) -> None:
        """Move the clock to ``t``, firing every timer and alarm due on the way, in time order."""
        while True:
            at_timer = self._timers[0][0] if self._timers else math.inf
            alarm = min(self._alarms, key=lambda a: a.at, default=None)
            at_alarm = alarm.at if alarm is not None else math.inf
            at = min(at_timer, at_alarm)
            if at > t:
                break
            self.t = at
            if alarm is not None and at_alarm <= at_timer:
                alarm.at = math.inf
                await alarm.fn(at)
                continue
            _, n, period, fn = heapq.heappop(self._timers)
            await fn()
            heapq.heappush(self._timers, (at + period, n, period, fn))
        self.t = t

    def take(self) -> tuple[list[tuple[str, object]], list[object]]:
        """The messages sent and published since the last call."""
        sent, pub = self.sent, self.published
        self.sent, self.published = [], []
        return sent, pub


async def attach(actor: Actor, now: float = 0.0) -> FakeContext:
    """Give ``actor`` a fake context at time ``now`` and run its ``on_start``."""
    ctx = FakeContext(actor.name, now)
    actor._ctx = ctx  # type: ignore[assignment]
    await actor.on_start()
    return ctx


def envelope(msg: object, source: str = "test", kind: str = "send") -> Envelope:
    """A received message as the kernel would hand it to ``handle``."""
    return Envelope(kind, source, type(msg).__name__, msg)
