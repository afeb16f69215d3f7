"""A paced run behind the pace takes the wakes between ticks up to the paced time in one step of its driver
(``actors.compose.drive``), as an unpaced run does: the same decisions, in fewer steps; on the pace it still
steps at each wake."""

from __future__ import annotations

import time

from actors.base import TickActor
from actors.compose import drive
from actors.feed import ListFeed
from coral.kernel import Mesh, VirtualClock

STEP_S = 0.1
"""The actor's wake interval: nine wakes between two ticks (1 s)."""
UNTIL = 10.0


class Waker(TickActor):
    """Asks to be woken every ``STEP_S`` and records when it was."""

    prompt = True

    def __init__(self) -> None:
        super().__init__("waker", tick_s=1.0)
        self.woke: list[float] = []

    async def started(self) -> None:
        self.wake_at(self.ctx.now() + STEP_S)

    async def on_wake(self, now: float) -> None:
        self.woke.append(now)
        self.wake_at(now + STEP_S)

    async def on_tick(self, now: float) -> None:
        self.wake_at(now + STEP_S)


async def run(pace: float | None, stall_s: float) -> tuple[list[float], list[float]]:
    """The waker's wake times and the driver's steps, the first step stalled ``stall_s`` wall seconds."""
    steps: list[float] = []

    def on_step(t: float) -> None:
        if not steps:
            time.sleep(stall_s)
        steps.append(t)

    async with Mesh(clock=VirtualClock()) as mesh:
        w = Waker()
        await mesh.spawn(w)
        await drive(mesh, ListFeed([]), tick_s=1.0, until=UNTIL, pace=pace, on_step=on_step)
    return w.woke, steps


async def test_behind_the_pace_the_wakes_go_in_fewer_steps_with_the_same_decisions() -> None:
    unpaced, _ = await run(None, 0.0)
    assert len(unpaced) > 80  # nine or ten wakes a second (a float sum of tenths may fall short of a tick)
    behind, steps = await run(40.0, 0.3)  # 12 simulated s behind after the first step: the rest catches up
    assert behind == unpaced
    assert len(steps) < 30  # about one step per tick, not one per wake and tick (over 90)


async def test_on_the_pace_it_steps_at_each_wake() -> None:
    unpaced, _ = await run(None, 0.0)
    woke, steps = await run(10.0, 0.0)  # 10 ms of wall a wake
    assert woke == unpaced
    assert len(steps) >= 60  # one per wake and tick (over 90), less what a busy machine made it fall behind
