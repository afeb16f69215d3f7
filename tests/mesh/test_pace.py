"""A live run under a deadline lands each plan on its answer (``actors.allocator``): paced, the clock does
not stand for a solve that outlasts the deadline's wall time, and the journal replays exactly; at
``--speed max`` each plan still lands at its start + the deadline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

import actors.allocator
from actors.base import next_instant
from actors.compose import CoralMesh, RunOptions, run_mesh
from actors.feed import Input, ListFeed, MergedFeed
from actors.replay import read_recording, replay_journal
from actors.solver_process import Flight, SolverProcess
from coral.kernel import read_journal
from coral.messages.control import ALLOCATOR, OPERATOR, Replan
from coral.messages.plan import SOLVER, PlanAnswer
from solvers.allocation import AllocationResult

from .helpers import SCENARIOS, World, journal_path

LIVE = RunOptions(seed=7, deterministic=False)
SLOW_S = 0.5
"""Wall seconds the slow solver adds to each answer: 25 simulated s at the test's pace, 25 deadlines."""
SPEED = 50.0


class SlowSolverProcess(SolverProcess):
    """A solver process whose answers come ``late_s`` wall seconds late (a solve that outlasts D/speed)."""

    late_s = SLOW_S

    async def collect_async(self, flight: Flight, **kw: Any) -> AllocationResult:
        res = await super().collect_async(flight, **kw)
        await anyio.sleep(self.late_s)
        return res


class StuckSolverProcess(SlowSolverProcess):
    late_s = 3600.0


def _landings(path: Path) -> tuple[list[tuple[int, float, float]], dict[int, float]]:
    """(seq, start, landing) of each plan, and each answer's kernel time by seq, from a journal."""
    plans, answers = [], {}
    for r in read_journal(path):
        if r.tag == "plan.new":
            p = r.decode().plan
            plans.append((p.seq, p.at, r.time))
        elif r.tag == "plan.answer":
            assert (r.kind, r.source, r.dest) == ("send", SOLVER, ALLOCATOR)
            answers[r.decode().seq] = r.time
    return plans, answers


async def test_paced_plans_whose_solves_outlast_the_deadline_land_late_and_replay(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(actors.allocator, "SolverProcess", SlowSolverProcess)
    sc = world.scenario("mesh-steady")
    setup = world.setup("mesh-steady", LIVE, sc)
    d = setup.deadline_s
    journal = tmp_path / "paced.journal"
    feed = MergedFeed(
        CoralMesh(setup, sc, world.catalog, world.perf).feed(), ListFeed([Input(40.0, OPERATOR, ALLOCATOR, Replan())])
    )
    await run_mesh(setup, sc, world.catalog, world.perf, journal=journal, pace=SPEED, until=100.0, feed=feed)
    monkeypatch.undo()
    plans, answers = _landings(journal)
    assert len(plans) >= 2
    for seq, start, landed in plans:
        # the clock ran on past start + d while the answer was late: it did not stand for the solve
        assert answers[seq] > start + d
        assert landed == next_instant(answers[seq])
    assert read_recording(journal).landing() == "answer"
    report = await replay_journal(journal)
    assert report.ok, report.diffs
    assert report.counts["plan.new"] == len(plans)


async def test_at_full_speed_every_plan_lands_at_its_start_plus_the_deadline_and_replays(
    world: World, tmp_path: Path
) -> None:
    journal = tmp_path / "max.journal"
    res = await world.run("mesh-steady", options=LIVE, journal=journal, until=70.0)
    d = world.setup("mesh-steady", LIVE).deadline_s
    plans, answers = _landings(journal)
    assert len(plans) >= 2 and res.state.plans == len(plans)
    for seq, start, landed in plans:
        assert answers[seq] == start  # the clock stood at the plan's start until its answer came
        assert landed == start + d
    assert res.state.landed == plans[-1][2]  # what the status line shows
    report = await replay_journal(journal)
    assert report.ok, report.diffs


def test_a_journal_with_plans_and_no_answers_lands_them_at_the_deadline() -> None:
    for name in SCENARIOS:  # recorded deterministic: a plan lands at its start, and no answer is journaled
        rec = read_recording(journal_path(name))
        assert not any(isinstance(i.msg, PlanAnswer) for i in rec.inputs)
        assert rec.landing() == "deadline"


async def test_a_stop_at_full_speed_ends_the_run_without_waiting_for_the_answer(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(actors.allocator, "SolverProcess", StuckSolverProcess)
    sc = world.scenario("mesh-steady")
    setup = world.setup("mesh-steady", LIVE, sc)
    stop = anyio.Event()
    meshes: list[CoralMesh] = []

    async def on_start(_mesh: Any, cm: CoralMesh) -> None:
        meshes.append(cm)

    async def stopper() -> None:
        while not (meshes and meshes[0].answers is not None and meshes[0].answers.flights):
            await anyio.sleep(0.01)
        stop.set()  # the clock stands at the first plan's start, waiting for an answer that will not come

    async with anyio.create_task_group() as tg:
        tg.start_soon(stopper)
        with anyio.fail_after(60):  # a hang guard, not a speed target
            res = await run_mesh(setup, sc, world.catalog, world.perf, stop=stop, on_start=on_start)
    assert res.reason == "stopped" and res.state.plans == 0
