"""A live mesh may run its allocator's solver process at a lower CPU priority (``run_mesh``'s
``solver_nice``), so that its paced clock comes first; by default the solver process runs at the mesh's own
priority."""

from __future__ import annotations

import os

import pytest

from actors.compose import CoralMesh, RunOptions, run_mesh
from coral.kernel import Mesh

from .helpers import World

LIVE = RunOptions(seed=7, deterministic=False)


@pytest.mark.parametrize("nice", [0, 4])
async def test_the_allocators_solver_process_runs_at_the_priority_asked_for(world: World, nice: int) -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)
    if own + nice > 19:
        pytest.skip(f"this process already runs at nice {own}")
    sc = world.scenario("mesh-steady")
    setup = world.setup("mesh-steady", LIVE, sc)
    seen: list[int] = []

    async def on_start(_mesh: Mesh, cm: CoralMesh) -> None:
        assert cm.allocator is not None and cm.allocator.solver is not None and cm.allocator.solver.pid is not None
        seen.append(os.getpriority(os.PRIO_PROCESS, cm.allocator.solver.pid))

    kw = {"solver_nice": nice} if nice else {}
    res = await run_mesh(setup, sc, world.catalog, world.perf, until=30.0, on_start=on_start, **kw)
    assert seen == [own + nice] and res.state.plans >= 1
