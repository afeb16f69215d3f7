"""The Fleet view redraws only when what it shows changed (issue 24: redraw cost per bus batch)."""

from __future__ import annotations

import attrs
import pytest

from tui.model import Sample, State
from tui.widgets.fleet import FleetView

from .helpers import replay_app, screen_text, until

pytestmark = pytest.mark.slow  # replays the demo journal: 10-25 s on two busy cores


async def test_the_fleet_view_redraws_for_its_instances_not_for_demand_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = replay_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state.link.state == "replay-ended", "the replay to end")
        view = app.query_one("#fleet-view", FleetView)
        shown: list[State] = []
        draw = view.show

        def counted(state: State) -> None:
            shown.append(state)
            draw(state)

        monkeypatch.setattr(view, "show", counted)
        st = app.state
        t = st.now + 5
        deps = {
            n: attrs.evolve(d, demand=d.demand + 1, history=(*d.history, Sample(t, d.demand + 1, d.capacity, -1.0)))
            for n, d in st.deployments.items()
        }
        app.state = attrs.evolve(st, deployments=deps, now=t)  # what a demand or fleet update does
        await pilot.pause(0.1)
        assert shown == [], "a new demand sample is not a reason to redraw the fleet"
        iid = sorted(st.instances)[0]
        insts = {**st.instances, iid: attrs.evolve(st.instances[iid], state="draining")}
        app.state = attrs.evolve(app.state, instances=insts)
        await pilot.pause(0.1)
        assert len(shown) == 1
        assert any(iid in line and "draining" in line for line in screen_text(app)), screen_text(app)
