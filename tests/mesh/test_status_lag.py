"""`coral up`'s status measures the lag against the pace the driver keeps (``RunState.pace``: its origin and
any change of speed), not against the wall time since the command started, which counts the actors' start."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.console import Console

from actors.compose import run_mesh
from actors.watch import RunState
from coral.cli.up_status import render_status
from coral.messages import MeshTiming
from coral.messages.inspect import ClockInfo

from .helpers import World


def status(st: RunState, wall: float, speed: float | None) -> str:
    setup = SimpleNamespace(scenario_name="s", duration_s=3600.0, timing=MeshTiming())
    con = Console(file=io.StringIO(), width=200)
    con.print(render_status(setup, st, wall, speed, None))
    return con.file.getvalue()  # type: ignore[attr-defined]


def test_the_status_shows_the_drivers_lag_and_speed() -> None:
    st = RunState(now=100.0)
    # 30 wall s at 60x would put the clock 1,800 s ahead of t=100: the start-up is not lag
    st.pace = lambda: ClockInfo(100.0, 60.0, 0.0)
    out = status(st, 30.0, 60.0)
    assert "behind" not in out and "speed 60x" in out
    st.pace = lambda: ClockInfo(100.0, 120.0, 90.0)  # the operator doubled the speed; 90 s behind it
    out = status(st, 30.0, 60.0)
    assert "90 s behind" in out and "speed 120x" in out
    st.pace = lambda: ClockInfo(100.0, 0.0, 0.0)  # as fast as possible
    assert "behind" not in status(st, 30.0, None)


def test_without_the_drivers_pace_the_status_claims_no_lag() -> None:
    # 30 wall s at 60x against t=100 looked 1,700 s behind when the status counted from the command's start
    out = status(RunState(now=100.0), 30.0, 60.0)
    assert "behind" not in out and "speed 60x" in out


async def test_a_paced_run_with_a_desk_gives_its_state_the_drivers_pace(world: World) -> None:
    seen: list[tuple[float, ClockInfo]] = []
    state = RunState()

    def on_step(t: float) -> None:
        assert state.pace is not None
        seen.append((t, state.pace()))

    setup, sc = world.setup("mesh-steady"), world.scenario("mesh-steady")
    await run_mesh(setup, sc, world.catalog, world.perf, until=30.0, pace=600.0, gateway=True, state=state,
                   on_step=on_step)  # fmt: skip
    assert seen and all(i.speed == 600.0 and i.at == t and i.behind_s >= 0.0 for t, i in seen)
