"""``run_mesh(freeze_heap=True)`` (``coral up``): the start-up heap is out of the garbage collector's scans
for the run, and back in them when the run ends, however it ends."""

from __future__ import annotations

import gc

import pytest

from actors.compose import run_mesh

from .helpers import World


async def test_the_start_up_heap_is_frozen_for_the_run_and_released_after(world: World) -> None:
    sc = world.scenario("mesh-steady")
    setup = world.setup("mesh-steady", scenario=sc)
    before = gc.get_freeze_count()
    seen: list[int] = []

    def on_step(_t: float) -> None:
        seen.append(gc.get_freeze_count())

    res = await run_mesh(setup, sc, world.catalog, world.perf, until=30.0, on_step=on_step, freeze_heap=True)
    assert res.reason == "end of scenario" and seen
    assert min(seen) > before  # the actors, templates and programs alive at start-up
    assert gc.get_freeze_count() == before

    seen.clear()
    await run_mesh(setup, sc, world.catalog, world.perf, until=10.0, on_step=on_step)
    assert seen and set(seen) == {before}  # only when asked


async def test_a_run_that_fails_releases_the_frozen_heap(world: World) -> None:
    sc = world.scenario("mesh-steady")
    setup = world.setup("mesh-steady", scenario=sc)
    before = gc.get_freeze_count()

    def on_step(t: float) -> None:
        if t >= 5.0:
            raise RuntimeError("a step failed")

    with pytest.raises(BaseExceptionGroup) as failed:
        await run_mesh(setup, sc, world.catalog, world.perf, until=30.0, on_step=on_step, freeze_heap=True)
    assert failed.group_contains(RuntimeError, match="a step failed", depth=None)
    assert gc.get_freeze_count() == before
