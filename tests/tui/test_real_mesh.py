"""The TUI against the real actors: ``coral up``'s mesh (``actors.compose.run_mesh``) on the tiny mesh-steady
scenario, paced, with the ``operator`` gateway. Steering from the keyboard reaches the real owners, is
confirmed, and the next plan shows the change."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from coral.catalog import Catalog
from coral.perf import PerfModel
from tests.conftest import shared_build
from tui import model as M
from tui import reducer as R
from tui.screens.confirm import ConfirmScreen
from tui.screens.form import CommandForm

from .helpers import endpoints, live_app, until


@pytest.fixture(scope="module")
def steady_store(tmp_path_factory: pytest.TempPathFactory, catalog: Catalog, perf: PerfModel) -> Path:
    from coral.cli.build import build_library
    from coral.cli.jobs import scenario_jobs
    from coral.scenario import load_scenario
    from coral.store import TemplateStore

    def build(path: Path) -> None:
        sc = load_scenario("mesh-steady", catalog)
        with TemplateStore(path) as store:
            build_library(perf, store, scenario_jobs(sc), list(sc.node_types), nmax=sc.planner.nmax, rho=sc.planner.rho)

    return shared_build(tmp_path_factory, "steady-templates.sqlite", build)


@pytest.mark.slow
async def test_steering_the_real_mesh(tmp_path: Path, catalog: Catalog, perf: PerfModel, steady_store: Path) -> None:
    from actors.compose import RunOptions, library_for, make_setup, run_mesh
    from coral.scenario import load_scenario
    from coral.store import TemplateStore

    sc = load_scenario("mesh-steady", catalog)
    with TemplateStore(steady_store, readonly=True) as store:
        setup = make_setup(sc, catalog, perf, library_for(store, sc), RunOptions(seed=3, deterministic=True))
    eps = endpoints(tmp_path)
    stop = anyio.Event()

    def new_plan(after: int, trigger: str) -> M.PlanView | None:
        return next((p for p in app.state.plans if p.seq > after and trigger in p.trigger.split("+")), None)

    app = live_app(eps)  # attached after the run's setup: templates and deployments are asked of the mesh
    async with anyio.create_task_group() as tg:

        async def mesh() -> None:
            await run_mesh(setup, sc, catalog, perf, endpoints=eps, pace=10.0, stop=stop, gateway=True, until=1e6)

        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: app.state.link.state == "lost", "no mesh yet")
            tg.start_soon(mesh)
            await until(pilot, lambda: bool(app.state.plans) and app.state.live_instances > 0, "the first plan", 30)
            await until(pilot, lambda: not R.missing_templates(app.state), "the stage bars' templates (from the mesh)")
            await until(pilot, lambda: app.state.deployments["chat-8b"].slo is not None, "the scenario (from the mesh)")
            seq = app.state.plans[-1].seq
            await pilot.press("2", "d")
            await pilot.press(*"5", "enter")  # the form has chat-8b (the selected row) and waits for the rate
            await until(pilot, lambda: bool(app.state.commands) and app.state.commands[-1].status != "pending", "ok")
            assert app.state.commands[-1].status == "ok", app.state.commands[-1]
            await until(pilot, lambda: app.state.deployments["chat-8b"].override, "the demand override", 20)
            await until(pilot, lambda: new_plan(seq, "demand") is not None, "a plan for the new demand", 20)
            assert app.state.deployments["chat-8b"].demand == 5.0
            seq = app.state.plans[-1].seq
            used = sorted({n for i in app.state.instances.values() if i.live for n in i.node_types})
            await pilot.press("3")
            app.action_steer("availability", {"region": "aws-us-east-1", "node": used[0], "count": "0"})
            await pilot.pause()
            await pilot.press("enter")
            await until(pilot, lambda: app.state.commands[-1].status != "pending", "the answer", 20)
            assert app.state.commands[-1].status == "ok", app.state.commands[-1]
            await until(pilot, lambda: app.state.market[("aws-us-east-1", used[0])].stockout, "the stockout", 20)
            await until(pilot, lambda: new_plan(seq, "market") is not None, "a plan around the stockout", 20)
            plan = new_plan(seq, "market")
            assert plan is not None and all(used[0] not in r.nodes for r in plan.instances)
            # pin: the form lists the deployment's templates with their mode, nodes and capacity (asked of
            # the allocator); Enter on one asks the allocator for a preview before anything is sent
            seq = app.state.plans[-1].seq
            await pilot.press("2")
            app.action_steer("pin", {"deployment": "chat-8b"})
            await until(pilot, lambda: isinstance(app.screen, CommandForm), "the pin form")
            form = app.screen
            assert isinstance(form, CommandForm)
            await until(pilot, lambda: bool(form._choices), "the template list", 20)
            assert form._choices is not None
            tid = form._choices[0]
            assert app.state.templates[tid].mode == "aggregated" and app.state.templates[tid].capacity_rps > 0
            form.query_one("#field-template_id").value = tid  # type: ignore[attr-defined]
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the confirmation")
            confirm = app.screen
            assert isinstance(confirm, ConfirmScreen)
            await until(pilot, lambda: confirm.answer is not None, "the allocator's preview", 20)
            assert confirm.answer is not None and confirm.answer.ok, confirm.answer
            assert confirm.answer.rows and all(
                r.deployment != "chat-8b" or r.mode == "aggregated" for r in confirm.answer.rows
            )
            await pilot.press("y")
            await until(pilot, lambda: app.state.commands[-1].status != "pending", "the pin's answer", 20)
            assert app.state.commands[-1].status == "ok", app.state.commands[-1]
            await until(pilot, lambda: new_plan(seq, "templates") is not None, "a plan for the pin", 20)
            plan = new_plan(seq, "templates")
            assert plan is not None
            assert {r.template_id for r in plan.instances if r.deployment == "chat-8b"} == {tid}
            assert app.state.deployments["chat-8b"].pinned == tid
            assert app.state.events and not app.state.errors
            stop.set()
            await until(pilot, lambda: app.state.link.state == "lost", "the TUI to see the mesh go", 20)


@pytest.mark.slow
async def test_attaching_late_shows_the_whole_state(
    tmp_path: Path, catalog: Catalog, perf: PerfModel, steady_store: Path
) -> None:
    """A TUI started after the first plan, with the allocator paused by another client, shows the plan, the
    fleet, the market, the demand and the pause at once: from the gateway's snapshot, since a paused
    allocator publishes neither a plan nor its settings again."""
    from actors.compose import RunOptions, RunState, library_for, make_setup, run_mesh
    from coral.kernel import BusClient
    from coral.messages.control import OPERATOR, CommandResult, PauseAllocator
    from coral.scenario import load_scenario
    from coral.store import TemplateStore

    sc = load_scenario("mesh-steady", catalog)
    with TemplateStore(steady_store, readonly=True) as store:
        setup = make_setup(sc, catalog, perf, library_for(store, sc), RunOptions(seed=3, deterministic=True))
    eps = endpoints(tmp_path)
    stop = anyio.Event()
    run = RunState()
    async with anyio.create_task_group() as tg:

        async def mesh() -> None:
            await run_mesh(setup, sc, catalog, perf, state=run, endpoints=eps, pace=10.0, stop=stop, gateway=True)

        tg.start_soon(mesh)
        with anyio.fail_after(60):
            while run.plan is None or run.fleet is None or not run.fleet.instances:
                await anyio.sleep(0.05)
        async with BusClient("operator-script", eps) as bus:
            res = await bus.request(OPERATOR, PauseAllocator(True), timeout=10)
        assert isinstance(res, CommandResult) and res.ok, res
        plans_before = run.plans
        await anyio.sleep(0.5)  # a few ticks: the pause is applied and published once

        app = live_app(eps)
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: app.state.link.state == "connected", "the connection")
            await until(pilot, lambda: bool(app.state.plans) and app.state.paused, "the snapshot", 5)
            st = app.state
            assert st.scenario == "mesh-steady" and st.live_instances > 0 and st.market
            assert all(d.demand > 0 for d in st.deployments.values())
            assert st.plans[-1].seq == run.plan.plan.seq
            assert run.plans == plans_before  # paused: what the TUI shows did not come from a new plan
            await until(pilot, lambda: not R.missing_templates(app.state), "the templates, from the allocator")
            await until(pilot, lambda: all(d.slo for d in app.state.deployments.values()), "the scenario, asked")
        stop.set()


@pytest.mark.slow
async def test_the_mesh_pace_follows_set_speed_and_the_run_still_replays(
    tmp_path: Path, catalog: Catalog, perf: PerfModel, steady_store: Path
) -> None:
    """``SetSpeed`` at the operator gateway changes the driver's pace from then on: slowed to 2, the clock
    moves at most 2 kernel seconds per wall second (plus one tick); as fast as possible, well past the
    10 it started at. The request is journaled and the run replays exactly."""
    from actors.compose import RunOptions, library_for, make_setup, run_mesh
    from actors.replay import replay_journal
    from coral.kernel import BusClient, read_journal
    from coral.messages import ClockInfo, ClockRequest, CommandResult, SetSpeed
    from coral.messages.control import OPERATOR
    from coral.scenario import load_scenario
    from coral.store import TemplateStore

    sc = load_scenario("mesh-steady", catalog)
    with TemplateStore(steady_store, readonly=True) as store:
        setup = make_setup(sc, catalog, perf, library_for(store, sc), RunOptions(seed=3, deterministic=True))
    eps = endpoints(tmp_path)
    journal = tmp_path / "run.jrnl"
    tick = setup.timing.tick_s
    until_s = 600.0
    ended: list[tuple[float, float]] = []  # (wall time, kernel time) at the run's end
    async with anyio.create_task_group() as tg:

        async def mesh() -> None:
            res = await run_mesh(
                setup, sc, catalog, perf, journal=journal, endpoints=eps, pace=10.0, gateway=True, until=until_s
            )
            ended.append((anyio.current_time(), res.end))

        tg.start_soon(mesh)
        async with BusClient("speed-test", eps) as bus:

            async def clock() -> tuple[float, ClockInfo]:
                info = await bus.request(OPERATOR, ClockRequest(), timeout=10)
                assert isinstance(info, ClockInfo)
                return anyio.current_time(), info

            with anyio.fail_after(60):
                while (await clock())[1].at < 10 * tick:
                    await anyio.sleep(0.1)
            res = await bus.request(OPERATOR, SetSpeed(0.0), timeout=10)
            assert isinstance(res, CommandResult) and not res.ok and res.field == "speed", res
            res = await bus.request(OPERATOR, SetSpeed(2.0), timeout=10)
            assert isinstance(res, CommandResult) and res.ok, res
            w0, c0 = await clock()
            await anyio.sleep(2.0)
            w1, c1 = await clock()
            assert c0.speed == c1.speed == 2.0
            assert c1.at - c0.at <= 2.0 * (w1 - w0) + tick, (c0, c1, w1 - w0)
            res = await bus.request(OPERATOR, SetSpeed(None), timeout=10)
            assert isinstance(res, CommandResult) and res.ok, res
            w2, c2 = await clock()
            assert c2.speed == 0.0
        with anyio.fail_after(60):
            while not ended:  # as fast as it goes, the rest of the run takes about a second
                await anyio.sleep(0.05)
        w3, end = ended[0]
        assert end == until_s and end - c2.at > 10.0 * (w3 - w2) + tick, (c2, end, w3 - w2)
    speeds = [r.decode() for r in read_journal(journal) if r.tag == "ctl.speed"]
    assert speeds == [SetSpeed(0.0), SetSpeed(2.0), SetSpeed(None)]
    report = await replay_journal(journal)
    assert report.ok, report.diffs
