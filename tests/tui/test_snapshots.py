"""Snapshots of every view, replaying the demo journal (fixtures/journals/tui-demo.jrnl) to its end.

Update them after a deliberate change with ``pytest tests/tui --snapshot-update`` and review the SVGs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.pilot import Pilot
from textual.widgets import Input

from tui.app import CoralTui
from tui.bus import ReplaySource
from tui.screens.form import CommandForm

from .helpers import DEMO, GPU_OF, quiet, replay_app, until

Snap = Callable[..., bool]


async def replayed(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, CoralTui)
    await until(pilot, lambda: app.state.link.state == "replay-ended", "the replay to end")


def test_fleet_80x24(snap_compare: Snap) -> None:
    assert snap_compare(replay_app(), terminal_size=(80, 24), run_before=replayed)


def test_fleet_wide(snap_compare: Snap) -> None:
    assert snap_compare(replay_app(), terminal_size=(170, 40), run_before=replayed)


def test_models(snap_compare: Snap) -> None:
    assert snap_compare(replay_app(), press=["2", "down"], terminal_size=(120, 32), run_before=replayed)


def test_market(snap_compare: Snap) -> None:
    assert snap_compare(replay_app(), press=["3"], terminal_size=(110, 24), run_before=replayed)


def test_plans(snap_compare: Snap) -> None:
    assert snap_compare(replay_app(), press=["4"], terminal_size=(100, 24), run_before=replayed)


def test_plan_detail(snap_compare: Snap) -> None:
    assert snap_compare(replay_app(), press=["4", "enter"], terminal_size=(150, 36), run_before=replayed)


def test_events_filtered(snap_compare: Snap) -> None:
    async def filtered(pilot: Pilot[Any]) -> None:
        await replayed(pilot)
        await pilot.press("5", "slash", *"n51")

    assert snap_compare(replay_app(), terminal_size=(100, 24), run_before=filtered)


class _Steerable(ReplaySource):
    """The demo journal, but not read-only, so that the steering forms open (nothing is sent)."""

    read_only = False


def test_form_refuses_a_negative_demand(snap_compare: Snap) -> None:
    async def filled(pilot: Pilot[Any]) -> None:
        await replayed(pilot)
        await pilot.press("2", "down", "d")
        form = pilot.app.screen
        assert isinstance(form, CommandForm)
        assert form.current() == {"deployment": "chat-8b", "rps": "9"}  # the selected row, its override
        form.query_one("#field-rps", Input).value = "-3"
        await pilot.press("enter")
        assert form.error is not None and form.error.field == "rps"

    app = quiet(CoralTui(_Steerable(DEMO, speed=float("inf")), gpu_of=GPU_OF, store=None, frame_s=0.02))
    assert snap_compare(app, terminal_size=(90, 28), run_before=filled)


def test_steer_menu(snap_compare: Snap) -> None:
    app = quiet(CoralTui(_Steerable(DEMO, speed=float("inf")), gpu_of=GPU_OF, store=None, frame_s=0.02))
    assert snap_compare(app, press=["s"], terminal_size=(110, 24), run_before=replayed)
