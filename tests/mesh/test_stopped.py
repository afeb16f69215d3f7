"""A run cut short (``coral up --for``, a signal, the UI quitting) while requests are open: every request
ends completed or failed with a reason (``unfinished``), none is left open, and the journal of the cut run
replays to the same decisions."""

from __future__ import annotations

from pathlib import Path

import anyio

from actors.compose import run_mesh
from actors.replay import replay_journal
from actors.watch import RunState

from .helpers import World


async def test_a_stopped_run_fails_what_is_open_as_unfinished_and_replays(world: World, tmp_path: Path) -> None:
    name = "mesh-steady"
    sc = world.scenario(name)
    setup = world.setup(name)
    stop = anyio.Event()
    state = RunState()
    open_at_stop: list[int] = []

    def stepped(now: float) -> None:
        st = state.stats
        if st is None or stop.is_set() or now < 60.0:
            return
        n = sum(d.in_flight + d.queued for d in st.deployments)
        if n:  # cut while requests are in flight, as --for does
            open_at_stop.append(n)
            stop.set()

    journal = tmp_path / "cut.journal"
    result = await run_mesh(setup, sc, world.catalog, world.perf, journal=journal, stop=stop, state=state,
                            on_step=stepped)  # fmt: skip
    assert result.reason == "stopped" and open_at_stop
    st = result.state.stats
    assert st is not None and st.final
    for d in st.deployments:
        assert d.in_flight == 0 and d.queued == 0, d
        assert d.arrivals == d.completed + d.failed
        assert sum(d.failed_by.values()) == d.failed
    assert sum(d.failed_by.get("unfinished", 0) for d in st.deployments) >= 1
    report = await replay_journal(journal)
    assert report.ok, report.diffs
