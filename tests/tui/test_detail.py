"""Pilot test: Enter on an instance in the Fleet view shows that instance in full (issue 24)."""

from __future__ import annotations

from typing import Any

import pytest
from textual.widgets import DataTable

from tui.screens.detail import DetailScreen

from .helpers import replay_app, screen_text, until

pytestmark = pytest.mark.slow  # replays the demo journal: 10-25 s on two busy cores


async def test_enter_on_an_instance_shows_it_whole_at_80x24() -> None:
    app = replay_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state.link.state == "replay-ended", "the replay to end")
        await pilot.press("1")
        table: DataTable[Any] = app.query_one("#fleet-instances", DataTable)
        assert app.focused is table, "the instance table has the focus"
        await until(pilot, lambda: table.row_count > 1, "the instance rows")
        await pilot.press("down")
        await pilot.pause(0.1)
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        inst = app.state.instances[str(key)]
        table_text = "\n".join(screen_text(app))
        assert inst.template_id not in table_text, "the table shows the template id cut (the pane must not)"
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailScreen), "the instance's detail pane")
        await pilot.pause(0.1)
        text = "\n".join(screen_text(app))
        assert f"Instance {inst.id}" in text
        for whole in (inst.template_id, inst.deployment, inst.region, inst.mode, ", ".join(inst.node_types)):
            assert whole in text, (whole, text)
        assert f"{inst.state} since" in text
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, DetailScreen), "Esc to close the pane")
        assert app.focused is table
