"""The allocator's ``answer`` landing on its own (``actors.allocator``): a plan in flight is published at the
later of its start + the deadline and the instant its ``PlanAnswer`` is applied, whatever the solver's wall
time; here the test delivers the answers, as a replay's feed does, and the allocator collects the result."""

from __future__ import annotations

from actors.base import HOP_S, next_instant
from coral.messages.control import Replan
from coral.messages.plan import SOLVER, NewPlan, PlanAnswer

from ..mesh.helpers import World
from .fake import envelope
from .test_allocator import _allocator, start_first_plan


def _plans(published: list[object]) -> list[NewPlan]:
    return [m for m in published if isinstance(m, NewPlan)]


async def test_a_plan_lands_at_its_answer_or_at_its_start_plus_the_deadline_whichever_is_later(world: World) -> None:
    a, ctx, sc = await _allocator(world, deterministic=False, landing="answer")
    try:
        d = a.delay_s
        assert d == sc.planner.deadline_s > 0
        start = await start_first_plan(a, ctx, sc, world)
        assert a.pending is not None and a.pending.seq == 1 and a.pending.due == start + d
        await ctx.run_until(start + 3 * d)  # past its deadline with no answer: the clock ran on, nothing landed
        assert _plans(ctx.published) == [] and a.pending is not None
        await a.handle(envelope(Replan(), source="operator"))  # coalesces into the next plan
        await a.handle(envelope(PlanAnswer(7), source=SOLVER))  # not the plan in flight: ignored
        await ctx.run_until(start + 3 * d + 0.5)
        assert _plans(ctx.published) == []
        answered = ctx.t
        await a.handle(envelope(PlanAnswer(1), source=SOLVER))
        landed = next_instant(answered)
        await ctx.run_until(landed - HOP_S / 4)
        assert _plans(ctx.published) == []
        await ctx.run_until(landed)
        (first,) = _plans(ctx.published)
        assert (first.plan.seq, first.plan.at) == (1, start)  # started at `start`, landed at `landed`
        assert a.pending is not None and a.pending.seq == 2 and a.pending.due == landed + d  # the re-plan
        await ctx.run_until(landed + d / 4)
        await a.handle(envelope(PlanAnswer(2), source=SOLVER))  # before its deadline: it lands at landed + d
        await ctx.run_until(landed + d - HOP_S / 4)
        assert len(_plans(ctx.published)) == 1
        await ctx.run_until(landed + d)
        second = _plans(ctx.published)[-1]
        assert (second.plan.seq, second.plan.at, second.plan.trigger) == (2, landed, "operator")
        assert a.pending is None and [t.seq for t in a.times] == [1, 2]
    finally:
        await a.on_stop()
