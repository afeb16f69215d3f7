"""The actor alarm (``ActorContext.alarm``) on a virtual clock: it fires at the time it is set to, the
earliest wins, setting it earlier interrupts its sleep before the clock moves, and a crash in it is
handled at the instant it happened."""

from __future__ import annotations

import anyio

from coral.kernel import Actor, ActorCrashed, Alarm, Envelope, Mesh, VirtualClock

from .msgs import Tick


class Waker(Actor):
    """Sets its alarm to the time each ``Tick`` names; records when it fires."""

    def __init__(self, crash_at: float | None = None) -> None:
        super().__init__("waker")
        self.fired: list[tuple[float, float]] = []
        self.crash_at = crash_at
        self.alarm: Alarm | None = None

    async def on_start(self) -> None:
        self.alarm = self.ctx.alarm(self.fire)

    async def fire(self, t: float) -> None:
        self.fired.append((t, self.ctx.now()))
        if t == self.crash_at:
            raise RuntimeError("boom")

    async def handle(self, env: Envelope) -> None:
        assert self.alarm is not None
        self.alarm.set(env.msg.time)


async def test_the_earliest_setting_wins_and_fires_once_at_its_time() -> None:
    clock = VirtualClock()
    async with Mesh(clock=clock) as mesh:
        w = Waker()
        await mesh.spawn(w)
        c = await mesh.client("c")
        for t in (5.0, 2.5, 7.0):  # each message sets the alarm; the earliest wins
            await c.send("waker", Tick("c", t))
        await mesh.quiesce()
        assert clock.next_deadline() == 2.5  # the later setting interrupted the sleep towards 5.0 at once
        await mesh.advance_to(10.0)
        assert w.fired == [(2.5, 2.5)]  # fired once, then unarmed until set again
        await c.send("waker", Tick("c", 12.0))
        await mesh.advance_to(20.0)
        assert w.fired == [(2.5, 2.5), (12.0, 12.0)]


async def test_a_crash_in_an_alarm_is_handled_before_the_clock_moves_on() -> None:
    clock = VirtualClock()
    async with Mesh(clock=clock) as mesh:
        watch = await mesh.client("watch", subscribe=["kernel.actor."])
        await mesh.spawn(lambda: Waker(crash_at=1.5))
        c = await mesh.client("c")
        await c.send("waker", Tick("c", 1.5))
        await mesh.quiesce()
        await clock.advance_to(1.5, settle=mesh.quiesce)
        with anyio.fail_after(5):
            env = await watch.receive()
        assert isinstance(env.msg, ActorCrashed) and env.msg.error == "RuntimeError: boom"
        assert clock.now() == 1.5
