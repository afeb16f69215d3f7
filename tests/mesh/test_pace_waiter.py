"""The paced driver's wait between steps (``actors.compose.PaceWaiter``): a command at the operator desk, the
mesh's doorbell and ``stop`` each end a wait at once, whether they came during it or before it (and count
once); with none of them a wait lasts its timeout."""

from __future__ import annotations

import time
from collections import deque
from typing import Any, cast

import anyio

from actors.compose import PaceWaiter
from actors.operator import OperatorDesk
from coral.kernel import Mesh, VirtualClock

LONG_S = 30.0  # a wait that ends well before this ended on its input, not its timeout


class Desk:
    """The part of ``OperatorDesk`` that the driver waits on: ``held`` commands, the ``waiting`` event."""

    def __init__(self) -> None:
        self.held: deque[Any] = deque()
        self.waiting = anyio.Event()

    def command(self) -> None:
        self.held.append("cmd")
        self.waiting.set()


async def timed(w: PaceWaiter, timeout: float) -> tuple[tuple[bool, bool], float]:
    t0 = time.monotonic()
    got = await w.wait(timeout)
    return got, time.monotonic() - t0


async def test_each_input_ends_a_wait_at_once_and_nothing_lasts_the_timeout() -> None:
    desk, stop = Desk(), anyio.Event()
    async with Mesh(clock=VirtualClock()) as mesh, anyio.create_task_group() as tg:
        w = PaceWaiter(mesh, cast(OperatorDesk, desk), stop)
        w.watch(tg)
        got, took = await timed(w, 0.05)
        assert got == (False, False) and took >= 0.05

        for act, expect in ((mesh.ring, (False, True)), (desk.command, (True, False))):
            tg.start_soon(_later, act)
            got, took = await timed(w, LONG_S)
            assert got == expect and took < LONG_S / 2
            desk.held.clear()  # the driver pumps the desk

        mesh.ring()  # both during a step: the next wait returns at once with both, and then they are spent
        desk.command()
        await anyio.sleep(0.01)
        got, took = await timed(w, LONG_S)
        assert got == (True, True) and took < LONG_S / 2
        desk.held.clear()
        assert (await w.wait(0.01)) == (False, False)

        desk.held.append("cmd")  # held but not announced yet: it counts
        assert (await w.wait(LONG_S)) == (True, False)
        desk.held.clear()

        tg.start_soon(_later, stop.set)
        got, took = await timed(w, LONG_S)
        assert got == (False, False) and took < LONG_S / 2
        got, took = await timed(w, LONG_S)  # a stopped driver never waits
        assert got == (False, False) and took < LONG_S / 2
        tg.cancel_scope.cancel()


async def test_without_a_desk_or_stop_the_doorbell_still_wakes_it() -> None:
    async with Mesh(clock=VirtualClock()) as mesh, anyio.create_task_group() as tg:
        w = PaceWaiter(mesh, None, None)
        w.watch(tg)
        tg.start_soon(_later, mesh.ring)
        got, took = await timed(w, LONG_S)
        assert got == (False, True) and took < LONG_S / 2
        tg.cancel_scope.cancel()


async def _later(act: Any) -> None:
    await anyio.sleep(0.01)
    act()
