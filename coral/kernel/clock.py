"""The kernel clock: the only source of time for decisions.

``now()`` is in seconds (float) since the clock's ``start``; ``sleep(dt)`` and ``sleep_until(t)`` wait on
that time line. Three clocks:

- ``RealClock``: wall time (monotonic), for production;
- ``ScaledClock(speed)``: wall time run ``speed`` times faster, for demos and soak runs;
- ``VirtualClock``: time moves only when told (``advance_to(t)``); sleepers wake in deadline order (ties in
  the order they went to sleep), and between deadlines the clock awaits a *settle* step so that everything
  the woken tasks set off finishes before time moves on. The mesh passes its ``quiesce`` as that step.

Transport liveness (heartbeats, handshake retries) uses real time, never this clock: it is not a decision.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import math
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

import anyio
import anyio.lowlevel

from coral.errors import CoralError


class ClockError(CoralError):
    """A bad sleep duration, speed or time-travel request."""


def _check_dt(dt: float) -> float:
    if not isinstance(dt, (int, float)) or math.isnan(dt) or dt < 0:
        raise ClockError(f"dt: expected a number >= 0 seconds, got {dt!r}")
    return float(dt)


def _check_t(t: float, name: str = "t") -> float:
    if not isinstance(t, (int, float)) or math.isnan(t):
        raise ClockError(f"{name}: expected a number of seconds, got {t!r}")
    return float(t)


@runtime_checkable
class Clock(Protocol):
    """What the kernel and actors read time from."""

    def now(self) -> float:
        """Seconds since the clock's start."""
        ...

    async def sleep(self, dt: float) -> None:
        """Wait ``dt`` seconds of this clock's time."""
        ...

    async def sleep_until(self, t: float) -> None:
        """Wait until ``now() >= t`` (returns at once if that is already so)."""
        ...


class RealClock:
    """Monotonic wall time, offset so that ``now()`` starts at ``start``."""

    def __init__(self, start: float = 0.0) -> None:
        self._start = _check_t(start, "start")
        self._t0 = time.monotonic()

    def now(self) -> float:
        return self._start + (time.monotonic() - self._t0)

    async def sleep(self, dt: float) -> None:
        await anyio.sleep(_check_dt(dt))

    async def sleep_until(self, t: float) -> None:
        await anyio.sleep(max(0.0, _check_t(t) - self.now()))


class ScaledClock:
    """Wall time running ``speed`` times as fast: ``sleep(10)`` at speed 10 takes one real second."""

    def __init__(self, speed: float, start: float = 0.0) -> None:
        if not isinstance(speed, (int, float)) or not math.isfinite(speed) or speed <= 0:
            raise ClockError(f"speed: expected a finite number > 0, got {speed!r}")
        self.speed = float(speed)
        self._start = _check_t(start, "start")
        self._t0 = time.monotonic()

    def now(self) -> float:
        return self._start + (time.monotonic() - self._t0) * self.speed

    async def sleep(self, dt: float) -> None:
        await anyio.sleep(_check_dt(dt) / self.speed)

    async def sleep_until(self, t: float) -> None:
        await anyio.sleep(max(0.0, _check_t(t) - self.now()) / self.speed)


class _Sleeper:
    """One task asleep on a ``VirtualClock``: a bare asyncio future on asyncio (an ``anyio.Event`` costs a
    backend look-up per sleep), an ``anyio.Event`` elsewhere."""

    __slots__ = ("dropped", "event", "future", "woken")

    def __init__(self) -> None:
        self.woken = False
        self.dropped = False
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self.future: asyncio.Future[None] | None = loop.create_future() if loop is not None else None
        self.event: anyio.Event | None = anyio.Event() if loop is None else None

    async def wait(self) -> None:
        if self.future is not None:
            await self.future
        else:
            assert self.event is not None
            await self.event.wait()

    def wake(self) -> None:
        self.woken = True
        self._resolve()

    def _resolve(self) -> None:
        if self.future is not None:
            if not self.future.done():
                self.future.set_result(None)
        else:
            assert self.event is not None
            self.event.set()


async def let_tasks_run(max_rounds: int = 10_000) -> None:
    """Yield to the event loop until every other task is blocked (or ``max_rounds`` loop turns passed).

    Like ``anyio.wait_all_tasks_blocked`` but without its 0.1 s sleeps; asyncio only (pyzmq needs it),
    falling back to the anyio function elsewhere. On asyncio's own loop a turn costs O(1): every other
    task is blocked when the loop's ready queue is empty (a task that can run, and a future that completed,
    always has a callback there); on another loop each turn scans every task.
    """
    try:
        this = asyncio.current_task()
    except RuntimeError:
        this = None
    if this is None:
        await anyio.wait_all_tasks_blocked()
        return
    ready = getattr(this.get_loop(), "_ready", None)
    if isinstance(ready, collections.deque):
        for _ in range(max_rounds):
            await asyncio.sleep(0)
            if not ready:
                return
        return
    for _ in range(max_rounds):
        await asyncio.sleep(0)
        for task in asyncio.all_tasks():
            if task is this:
                continue
            waiter = getattr(task, "_fut_waiter", None)
            if waiter is None or waiter.done():
                break
        else:
            return


def nothing_ready() -> bool:
    """Whether no other task or callback can run now (asyncio's own loop: its ready queue is empty); False
    when that cannot be told (another loop or backend), so that callers yield to find out."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    ready = getattr(loop, "_ready", None)
    return isinstance(ready, collections.deque) and not ready


class VirtualClock:
    """Time that advances only through ``advance_to``/``advance``; for tests, simulation and replay."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = _check_t(start, "start")
        self._heap: list[tuple[float, int, _Sleeper]] = []  # (deadline, seq): ties wake in sleep order
        self._dropped = 0  # cancelled sleepers still in the heap (removed when they reach its top)
        self._seq = 0
        self._advancing = False

    def now(self) -> float:
        return self._now

    async def sleep(self, dt: float) -> None:
        await self.sleep_until(self._now + _check_dt(dt))

    async def sleep_until(self, t: float) -> None:
        t = _check_t(t)
        if t <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        sleeper = self.sleeper(t)
        try:
            await sleeper.wait()
        finally:
            self.drop(sleeper)

    def sleeper(self, t: float) -> _Sleeper:
        """A sleep until ``t`` (> now), registered now: ``await s.wait()`` returns when the clock reaches
        ``t`` (``s.woken``) or when ``drop(s)`` interrupts it (not woken). What ``sleep_until`` does, for a
        waiter that is interrupted without a cancel scope (``actor.Alarm``)."""
        self._seq += 1
        sleeper = _Sleeper()
        heapq.heappush(self._heap, (t, self._seq, sleeper))
        return sleeper

    def drop(self, sleeper: _Sleeper) -> None:
        """Forget a sleep that was not woken (cancelled or interrupted): the clock will not stop at its
        deadline; its waiter, if still waiting, returns. No-op on a woken or dropped one."""
        if sleeper.woken or sleeper.dropped:
            return
        sleeper.dropped = True
        self._dropped += 1
        sleeper._resolve()
        self._trim()

    def _trim(self) -> None:
        """Pop the cancelled sleepers off the heap's top (O(log n) each, instead of a removal's O(n))."""
        heap = self._heap
        while heap and heap[0][2].dropped:
            heapq.heappop(heap)
            self._dropped -= 1

    @property
    def sleepers(self) -> int:
        """How many tasks are asleep on this clock."""
        return len(self._heap) - self._dropped

    def next_deadline(self) -> float | None:
        """The earliest deadline of a sleeper, or None when nobody sleeps."""
        return self._heap[0][0] if self._heap else None

    async def advance_to(self, t: float, settle: Callable[[], Awaitable[None]] | None = None) -> None:
        """Move time to ``t``, waking sleepers deadline by deadline and awaiting ``settle`` after each.

        ``settle`` defaults to ``let_tasks_run`` (until every other task is blocked).
        """
        t = _check_t(t)
        if t < self._now:
            raise ClockError(f"t: cannot move the clock back from {self._now} to {t}")
        if self._advancing:
            raise ClockError("advance_to: already advancing (called from a task it woke?)")
        step = let_tasks_run if settle is None else settle
        self._advancing = True
        try:
            heap = self._heap
            while heap and heap[0][0] <= t:
                deadline = heap[0][0]
                self._now = deadline
                while heap and heap[0][0] == deadline:
                    heapq.heappop(heap)[2].wake()  # never a dropped one: _trim keeps them off the top
                    self._trim()
                await step()
            self._now = t
        finally:
            self._advancing = False

    async def advance(self, dt: float, settle: Callable[[], Awaitable[None]] | None = None) -> None:
        """Move time forward by ``dt``; see ``advance_to``."""
        await self.advance_to(self._now + _check_dt(dt), settle)
