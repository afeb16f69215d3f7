"""Clocks: the virtual clock wakes sleepers in deadline order; bad durations and time travel are errors."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from coral.kernel import ClockError, RealClock, ScaledClock, VirtualClock
from coral.kernel.clock import let_tasks_run, nothing_ready


async def test_virtual_clock_wakes_in_time_order() -> None:
    clock = VirtualClock(start=100.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, dt: float) -> None:
        await clock.sleep(dt)
        woke.append((name, clock.now()))

    async with anyio.create_task_group() as tg:
        for name, dt in [("c", 3.0), ("a", 1.0), ("b1", 2.0), ("b2", 2.0), ("late", 50.0)]:
            tg.start_soon(sleeper, name, dt)
        await anyio.wait_all_tasks_blocked()
        assert clock.sleepers == 5 and clock.next_deadline() == 101.0
        await clock.advance_to(110.0)
        assert woke == [("a", 101.0), ("b1", 102.0), ("b2", 102.0), ("c", 103.0)]
        assert clock.now() == 110.0 and clock.sleepers == 1
        await clock.advance(40.0)
    assert woke[-1] == ("late", 150.0)


async def test_sleeper_that_sleeps_again_is_woken_in_order() -> None:
    clock = VirtualClock()
    log: list[tuple[str, float]] = []

    async def ticker(name: str, period: float) -> None:
        while True:
            await clock.sleep(period)
            log.append((name, clock.now()))

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker, "fast", 2.0)
        tg.start_soon(ticker, "slow", 3.0)
        await anyio.wait_all_tasks_blocked()
        await clock.advance_to(7.0)
        tg.cancel_scope.cancel()
    # At 6.0 both are due: "slow" went to sleep (at 3.0) before "fast" (at 4.0), so it wakes first.
    assert log == [("fast", 2.0), ("slow", 3.0), ("fast", 4.0), ("slow", 6.0), ("fast", 6.0)]


async def test_cancelled_sleeper_is_forgotten() -> None:
    clock = VirtualClock()
    with anyio.move_on_after(0.01):
        await clock.sleep(5.0)
    assert clock.sleepers == 0 and clock.next_deadline() is None
    await clock.sleep_until(-1.0)  # the past: returns at once
    await clock.sleep(0)


async def test_cancelled_sleepers_below_the_earliest_leave_no_stop_behind() -> None:
    """A sleep cancelled while others sleep (the heap keeps it until it reaches the top): the clock neither
    stops at its deadline nor counts it, and the others still wake in order."""
    clock = VirtualClock()
    stops: list[float] = []
    woke: list[str] = []

    async def sleeper(name: str, t: float) -> None:
        await clock.sleep_until(t)
        woke.append(name)

    async def settle() -> None:
        stops.append(clock.now())
        await anyio.wait_all_tasks_blocked()

    async with anyio.create_task_group() as tg:
        scopes = {}
        for name, t in [("a", 1.0), ("x", 2.0), ("b", 3.0), ("y", 3.0), ("c", 3.0), ("z", 4.0)]:
            scope = anyio.CancelScope()
            scopes[name] = scope

            async def run(scope: anyio.CancelScope = scope, name: str = name, t: float = t) -> None:
                with scope:
                    await sleeper(name, t)

            tg.start_soon(run)
        await anyio.wait_all_tasks_blocked()
        for name in ("x", "y", "z"):
            scopes[name].cancel()
        await anyio.wait_all_tasks_blocked()
        assert clock.sleepers == 3 and clock.next_deadline() == 1.0
        await clock.advance_to(10.0, settle=settle)
    assert woke == ["a", "b", "c"] and stops == [1.0, 3.0]
    assert clock.sleepers == 0 and clock.next_deadline() is None


async def test_virtual_clock_rejects_bad_input() -> None:
    clock = VirtualClock(start=10.0)
    with pytest.raises(ClockError, match="cannot move the clock back"):
        await clock.advance_to(5.0)
    with pytest.raises(ClockError, match="dt"):
        await clock.sleep(-1.0)
    with pytest.raises(ClockError, match="dt"):
        await clock.sleep(float("nan"))
    with pytest.raises(ClockError, match="start"):
        VirtualClock(start=float("nan"))


def test_scaled_and_real_clocks() -> None:
    with pytest.raises(ClockError, match="speed"):
        ScaledClock(0)
    with pytest.raises(ClockError, match="speed"):
        ScaledClock(float("inf"))
    real, fast = RealClock(start=5.0), ScaledClock(100.0, start=5.0)
    a, b = real.now(), fast.now()
    assert a >= 5.0 and b >= 5.0
    assert real.now() >= a and fast.now() >= b


async def test_scaled_clock_sleeps_scaled() -> None:
    clock = ScaledClock(1000.0)
    t0 = clock.now()
    await clock.sleep(1.0)  # one millisecond of real time
    assert clock.now() - t0 >= 1.0
    with pytest.raises(ClockError):
        await clock.sleep(-2)


async def test_let_tasks_run_returns_once_a_chain_of_wakes_has_run_and_not_before() -> None:
    """Each task wakes the next through an event and yields a few times on the way: ``let_tasks_run``
    returns only when the whole chain ran, and does not wait for a task asleep in real time."""
    n = 20
    events = [anyio.Event() for _ in range(n + 1)]
    done: list[int] = []

    async def link(i: int) -> None:
        await events[i].wait()
        for _ in range(i % 4):
            await anyio.lowlevel.checkpoint()
        done.append(i)
        events[i + 1].set()

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(link, i)
        tg.start_soon(anyio.sleep, 3600)  # blocked on a timer: not runnable
        await let_tasks_run()
        assert done == []
        events[0].set()
        with anyio.fail_after(5):
            await let_tasks_run()
        assert done == list(range(n)) and events[n].is_set()
        tg.cancel_scope.cancel()


async def test_nothing_ready_tells_whether_another_task_can_run() -> None:
    assert nothing_ready()
    event = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(event.wait)
        assert not nothing_ready()  # the new task's first step is queued
        await anyio.wait_all_tasks_blocked()
        assert nothing_ready()
        event.set()
        assert not nothing_ready()  # its wake-up is queued
    assert nothing_ready()


def test_nothing_ready_outside_a_loop_is_false() -> None:
    assert not nothing_ready()
